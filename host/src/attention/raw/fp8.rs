//! The FP8 forward on tensors this library does not own ([`crate::raw`]): e4m3 Q, K, V, bf16 O,
//! f32 LSE and the `V^T` workspace of a framework, on its stream. The problem comes from the
//! shapes, the plan is the typed API's ([`AttentionProblem::plan_fp8`]), so the checks are the
//! same; [`forward_fp8_raw`] adds those of raw memory.

use super::{AttentionOptions, lse_view, view};
use crate::attention::fp8::{E4m3, Fp8Plan, Fp8Scales, Fp8Tensors};
use crate::attention::plan::Target;
use crate::attention::problem::{AttentionProblem, Dtype};
use crate::error::{Error, Result};
use crate::raw::{ElemType, RawStream, RawTensor, check_disjoint};

/// The tensors of a raw FP8 forward pass.
#[derive(Clone, Copy)]
pub struct RawFp8Tensors<'t> {
    /// Q `[batch, seq_q, heads_q, D]`, e4m3.
    pub q: &'t RawTensor,
    /// K `[batch, seq_k, heads_kv, D]`, e4m3.
    pub k: &'t RawTensor,
    /// V, as K.
    pub v: &'t RawTensor,
    /// O `[batch, seq_q, heads_q, D]` bf16 (written).
    pub o: &'t RawTensor,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous (written).
    pub lse: &'t RawTensor,
    /// The workspace `V^T`: a contiguous rank-1 e4m3 (byte) tensor of
    /// [`AttentionProblem::fp8_workspace_len`] elements, 16-byte aligned (written).
    pub workspace: &'t RawTensor,
}

/// The e4m3 elements (bytes) of the FP8 forward's workspace for Q of shape `q` and K of shape
/// `k` (`[batch, seq, heads, D]` each).
pub fn fp8_workspace_len_raw(q: &[usize], k: &[usize]) -> Result<usize> {
    // The problem's dtype is the output's: bf16.
    let problem = AttentionProblem::from_shapes(q, k, Dtype::Bf16, &AttentionOptions::default())?;
    problem.validate()?;
    Ok(problem.fp8_workspace_len())
}

/// Plan the FP8 forward on raw tensors for `target` (pure: no driver call, no memory read): the
/// problem from the shapes, the tensors' element types (e4m3 Q, K, V; bf16 O; f32 LSE; an e4m3
/// workspace), ranks and strides, every view inside its storage, the outputs apart from the
/// inputs and each other, then the typed plan's checks.
pub fn plan_fp8_raw(
    target: Target,
    options: &AttentionOptions,
    scales: Fp8Scales,
    tensors: &RawFp8Tensors<'_>,
) -> Result<(AttentionProblem, Fp8Plan)> {
    if tensors.q.dtype != ElemType::E4m3 {
        return Err(Error::unsupported(
            format!("FP8 forward with Q dtype {:?}", tensors.q.dtype),
            "the FP8 forward takes e4m3 (float8_e4m3fn) Q, K and V",
        ));
    }
    let (q, k) = (&tensors.q.shape, &tensors.k.shape);
    let problem = AttentionProblem::from_shapes(q, k, Dtype::Bf16, options)?;
    problem.validate()?;
    check_disjoint(
        &[("Q", tensors.q), ("K", tensors.k), ("V", tensors.v)],
        &[
            ("O", tensors.o),
            ("LSE", tensors.lse),
            ("workspace", tensors.workspace),
        ],
    )?;
    let workspace = tensors.workspace.contiguous_view::<E4m3>(
        "workspace",
        &[problem.fp8_workspace_len()],
        16,
    )?;
    let typed = Fp8Tensors {
        q: view("Q", tensors.q)?,
        k: view("K", tensors.k)?,
        v: view("V", tensors.v)?,
        o: view("O", tensors.o)?,
        lse: lse_view(&problem, "LSE", tensors.lse)?,
        workspace,
    };
    let plan = problem.plan_fp8(target, &typed, scales)?;
    Ok((problem, plan))
}

/// Launch the FP8 forward on `stream` (asynchronous): O and LSE written from Q, K, V and their
/// descales `scales`, `V^T` into the workspace. Checks as [`plan_fp8_raw`], and that every
/// tensor is device memory of the stream's device inside one allocation.
///
/// # Safety
/// Each tensor's storage (`storage_ptr`, `storage_bytes`) is memory the caller owns, live
/// until the launches have completed on `stream`; nothing else writes Q, K, V or accesses O,
/// LSE and the workspace until then.
pub unsafe fn forward_fp8_raw(
    stream: &RawStream,
    options: &AttentionOptions,
    scales: Fp8Scales,
    tensors: &RawFp8Tensors<'_>,
) -> Result<()> {
    let gpu = stream.gpu();
    let (_, plan) = plan_fp8_raw(Target::of(gpu), options, scales, tensors)?;
    for (what, t) in [
        ("Q", tensors.q),
        ("K", tensors.k),
        ("V", tensors.v),
        ("O", tensors.o),
        ("LSE", tensors.lse),
        ("workspace", tensors.workspace),
    ] {
        t.check_memory(what, gpu)?;
    }
    // SAFETY: the plan checked every view against its storage, the storage is device memory of
    // the stream's device inside one allocation (checked above), live and not accessed by
    // others until the launches complete (the caller's contract), and the outputs overlap
    // neither the inputs nor each other (checked by `plan_fp8_raw`).
    unsafe { plan.run(stream) }
}
