//! The forward and backward passes on tensors this library does not own ([`crate::raw`]): a
//! framework's tensors on its stream. The problem comes from the tensors' shapes, the plan is
//! the typed API's ([`AttentionProblem::plan`], [`AttentionProblem::plan_backward`]), so the
//! checks are the same; [`forward_raw`] and [`backward_raw`] add the checks of raw memory
//! (device, allocation, outputs and workspace apart from inputs). The same over packed
//! sequences: [`forward_varlen_raw`], [`backward_varlen_raw`]; and the decode step over a paged
//! KV cache: [`decode_raw`] (its splits and workspace: [`decode_workspace_len`]); the FP8
//! forward: [`forward_fp8_raw`] (its workspace: [`fp8_workspace_len_raw`]).

use super::backward::{
    AttentionBackwardPlan, AttentionBackwardTensors, AttentionVarlenBackwardPlan,
    AttentionVarlenBackwardTensors, BackwardOptions, BackwardWorkspace, BackwardWorkspaceLens,
};
use super::plan::{AttentionPlan, AttentionTensors, Target};
use super::problem::{AttentionElem, AttentionProblem, Dtype, Path, View};
use super::varlen::{AttentionVarlenPlan, AttentionVarlenProblem, AttentionVarlenTensors};
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::raw::{ElemType, RawElem, RawStream, RawTensor, check_disjoint};
use half::{bf16, f16};

mod decode;
mod fp8;
pub use decode::{
    AttentionDecodeOptions, RawAttentionDecodeTensors, RawKvAppendTensors, append_kv_raw,
    decode_raw, decode_workspace_len, plan_append_raw, plan_decode_raw,
};
pub use fp8::{RawFp8Tensors, forward_fp8_raw, fp8_workspace_len_raw, plan_fp8_raw};

/// The options of a forward pass (the sizes come from the tensors).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Causal masking (bottom-right aligned).
    pub causal: bool,
    /// Sliding window `(left, right)`; `None` on a side is unbounded.
    pub window: (Option<usize>, Option<usize>),
    /// Which kernel to use.
    pub path: Path,
    /// Softcap (`softcap tanh(l / softcap)` on every logit `l`); `None` for none.
    pub softcap: Option<f32>,
}

/// The tensors of a raw forward pass.
#[derive(Clone, Copy)]
pub struct RawAttentionTensors<'t> {
    /// Q `[batch, seq_q, heads_q, D]`, bf16 or f16.
    pub q: &'t RawTensor,
    /// K `[batch, seq_k, heads_kv, D]`, Q's type.
    pub k: &'t RawTensor,
    /// V `[batch, seq_k, heads_kv, D_v]`, Q's type (`D_v` = D, or a pair of
    /// `kernel_abi::attention::VALUE_DIMS`).
    pub v: &'t RawTensor,
    /// O `[batch, seq_q, heads_q, D_v]`, Q's type (written).
    pub o: &'t RawTensor,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous (written).
    pub lse: &'t RawTensor,
    /// Attention sinks: `[heads_q]` f32 logits, one per query head, or `None`.
    pub sinks: Option<&'t RawTensor>,
    /// A tile counter: `[1]` int32, zero (the kernel leaves it zero), used by no other launch
    /// while this one runs; with one, short causal problems take the dynamic grid
    /// ([`AttentionTensors::tile_counter`]); `None` for one block per query tile.
    pub tile_counter: Option<&'t RawTensor>,
}

impl AttentionProblem {
    /// The problem of Q of shape `q` and K of shape `k` (`[batch, seq, heads, D]` each; the
    /// batch and D are Q's, K's are checked against them with the tensors), with `options`.
    pub fn from_shapes(
        q: &[usize],
        k: &[usize],
        dtype: Dtype,
        options: &AttentionOptions,
    ) -> Result<AttentionProblem> {
        let [batch, seq_q, heads_q, head_dim] =
            <[usize; 4]>::try_from(q).map_err(|_| Error::shape("Q rank", 4, q.len()))?;
        let [_, seq_k, heads_kv, _] =
            <[usize; 4]>::try_from(k).map_err(|_| Error::shape("K rank", 4, k.len()))?;
        Ok(AttentionProblem {
            batch,
            seq_q,
            seq_k,
            heads_q,
            heads_kv,
            head_dim,
            value_dim: None,
            dtype,
            scale: options.scale,
            causal: options.causal,
            window: options.window,
            path: options.path,
            softcap: options.softcap,
            sinks: false,
        })
    }
}

/// Plan the forward pass on raw tensors for `target` (pure: no driver call, no memory read):
/// the problem from the shapes, the tensors' element types, ranks and strides, every view
/// inside its storage, the outputs apart from the inputs and each other, then the typed plan's
/// checks.
pub fn plan_raw(
    target: Target,
    options: &AttentionOptions,
    tensors: &RawAttentionTensors<'_>,
) -> Result<(AttentionProblem, AttentionPlan)> {
    let dtype = dtype_of(tensors.q.dtype)?;
    let mut problem =
        AttentionProblem::from_shapes(&tensors.q.shape, &tensors.k.shape, dtype, options)?;
    problem.sinks = tensors.sinks.is_some();
    problem.value_dim = value_dim_of(&problem, tensors.k, tensors.v);
    problem.validate()?;
    let mut inputs = vec![("Q", tensors.q), ("K", tensors.k), ("V", tensors.v)];
    inputs.extend(tensors.sinks.map(|s| ("sinks", s)));
    let mut outputs = vec![("O", tensors.o), ("LSE", tensors.lse)];
    outputs.extend(tensors.tile_counter.map(|c| ("tile counter", c)));
    check_disjoint(&inputs, &outputs)?;
    let plan = match dtype {
        Dtype::Bf16 => plan_typed::<bf16>(&problem, target, tensors),
        Dtype::F16 => plan_typed::<f16>(&problem, target, tensors),
    }?;
    Ok((problem, plan))
}

/// V's head dimension where it is not Q's (`None` where it is, where V is not of rank 4, or
/// where K's is not Q's: their views' checks report those).
fn value_dim_of(problem: &AttentionProblem, k: &RawTensor, v: &RawTensor) -> Option<usize> {
    match (&k.shape[..], &v.shape[..]) {
        ([_, _, _, dk], [_, _, _, dv]) if *dk == problem.head_dim && *dv != problem.head_dim => {
            Some(*dv)
        }
        _ => None,
    }
}

/// [`value_dim_of`] of packed K and V (`[total_k, heads_kv, D]`, `[total_k, heads_kv, D_v]`)
/// against Q's head dimension `d`.
fn packed_value_dim_of(d: usize, k: &RawTensor, v: &RawTensor) -> Option<usize> {
    match (&k.shape[..], &v.shape[..]) {
        ([_, _, dk], [_, _, dv]) if *dk == d && *dv != d => Some(*dv),
        _ => None,
    }
}

/// The problem's element type of Q's element type `q`.
fn dtype_of(q: ElemType) -> Result<Dtype> {
    match q {
        ElemType::Bf16 => Ok(Dtype::Bf16),
        ElemType::F16 => Ok(Dtype::F16),
        other => Err(Error::unsupported(
            format!("Q dtype {other:?}"),
            "attention takes bf16 or f16",
        )),
    }
}

fn plan_typed<T: AttentionElem + RawElem>(
    problem: &AttentionProblem,
    target: Target,
    t: &RawAttentionTensors<'_>,
) -> Result<AttentionPlan> {
    problem.plan::<T>(
        target,
        &AttentionTensors {
            q: view("Q", t.q)?,
            k: view("K", t.k)?,
            v: view("V", t.v)?,
            o: view("O", t.o)?,
            lse: lse_view(problem, "LSE", t.lse)?,
            sinks: t
                .sinks
                .map(|s| sinks_view(problem.heads_q, s))
                .transpose()?,
            tile_counter: t
                .tile_counter
                .map(|c| flat_view("tile counter", c, &[1]))
                .transpose()?,
        },
        None,
    )
}

/// The sink logits as a contiguous `[heads_q]` f32 view, inside their storage.
pub(super) fn sinks_view<'a>(heads_q: usize, sinks: &RawTensor) -> Result<DevView<'a, f32>> {
    flat_view("sinks", sinks, &[heads_q])
}

/// A rank-4 tensor of element type `T` as a [`View`] into its storage (the plan checks the
/// view against the storage, its shape, strides and alignment).
pub(super) fn view<'a, T: RawElem>(what: &str, t: &RawTensor) -> Result<View<'a, T>> {
    t.expect::<T>(what, 4)?;
    let strides = t.strides(what)?;
    // SAFETY: the view only carries addresses into the plan; the plan's `run` (unsafe)
    // requires the memory to be live on its executor.
    let (memory, offset) = unsafe { t.storage::<T>(what) }?;
    View::new(memory, offset, &t.shape, &strides)
}

/// LSE as a contiguous `[batch, heads_q, seq_q]` f32 view, inside its storage.
pub(super) fn lse_view<'a>(
    problem: &AttentionProblem,
    what: &str,
    lse: &RawTensor,
) -> Result<DevView<'a, f32>> {
    flat_view(what, lse, &[problem.batch, problem.heads_q, problem.seq_q])
}

/// A tensor of element type `T` (4 bytes: f32 or i32) of exactly `shape`, contiguous (dimensions of size 1 may have any stride), as
/// a flat view inside its storage.
fn flat_view<'a, T: RawElem>(what: &str, t: &RawTensor, shape: &[usize]) -> Result<DevView<'a, T>> {
    t.contiguous_view(what, shape, 4)
}

/// Launch the forward pass on `stream` (asynchronous): O and LSE written from Q, K, V, with
/// the problem taken from the shapes and `options`. Checks as [`plan_raw`], and that every
/// tensor's storage is device memory of the stream's device inside one allocation.
///
/// # Safety
/// Each tensor's storage (`storage_ptr`, `storage_bytes`) is memory the caller owns, live
/// until the launch has completed on `stream`; nothing else writes Q, K, V or accesses O, LSE
/// and the tile counter until then; the tile counter, if any, is zero.
pub unsafe fn forward_raw(
    stream: &RawStream,
    options: &AttentionOptions,
    tensors: &RawAttentionTensors<'_>,
) -> Result<()> {
    let gpu = stream.gpu();
    let (_, plan) = plan_raw(Target::of(gpu), options, tensors)?;
    for (what, t) in [
        ("Q", tensors.q),
        ("K", tensors.k),
        ("V", tensors.v),
        ("O", tensors.o),
        ("LSE", tensors.lse),
    ] {
        t.check_memory(what, gpu)?;
    }
    if let Some(sinks) = tensors.sinks {
        sinks.check_memory("sinks", gpu)?;
    }
    if let Some(counter) = tensors.tile_counter {
        counter.check_memory("tile counter", gpu)?;
    }
    // SAFETY: the plan checked every view against its storage, the storage is device memory
    // of the stream's device inside one allocation (checked above), live and not accessed by
    // others until the launch completes, the tile counter zero (the caller's contract), and the
    // outputs overlap neither the inputs nor each other (checked by the plan).
    unsafe { plan.run(stream) }
}

/// The tensors of a raw backward pass.
#[derive(Clone, Copy)]
pub struct RawAttentionBackwardTensors<'t> {
    /// Q `[batch, seq_q, heads_q, D]`, bf16 or f16.
    pub q: &'t RawTensor,
    /// K `[batch, seq_k, heads_kv, D]`, Q's type.
    pub k: &'t RawTensor,
    /// V, as K.
    pub v: &'t RawTensor,
    /// O of the forward, as Q.
    pub o: &'t RawTensor,
    /// LSE of the forward `[batch, heads_q, seq_q]` f32, contiguous.
    pub lse: &'t RawTensor,
    /// dO, the loss's gradient with respect to O, as Q.
    pub d_o: &'t RawTensor,
    /// dLSE, as LSE; `None` when the loss does not depend on LSE.
    pub d_lse: Option<&'t RawTensor>,
    /// dQ, as Q (written).
    pub dq: &'t RawTensor,
    /// dK, as K (written; with grouped-query attention the sum over the group's query heads).
    pub dk: &'t RawTensor,
    /// dV, as K (written, as dK).
    pub dv: &'t RawTensor,
    /// The forward's sinks `[heads_q]` f32, or `None` (a problem without sinks).
    pub sinks: Option<&'t RawTensor>,
    /// The sinks' gradient `[heads_q]` f32 (written), exactly when `sinks` is given.
    pub d_sinks: Option<&'t RawTensor>,
}

/// The workspace of a raw backward pass: contiguous rank-1 f32 tensors of the lengths
/// [`AttentionProblem::backward_workspace_lens`] (and the plan) report.
#[derive(Clone, Copy)]
pub struct RawBackwardWorkspace<'t> {
    /// `delta'`, `delta` elements.
    pub delta: &'t RawTensor,
    /// The dQ accumulator (in deterministic mode with its order's counters), `dq_accum`
    /// elements, 16-byte aligned; `None` when that length is 0.
    pub dq_accum: Option<&'t RawTensor>,
}

/// Plan the backward pass on raw tensors for `target` (pure: no driver call, no memory read):
/// the problem from Q's and K's shapes and `options` (its `path` is the forward's and not used
/// here), the tensors' element types, ranks, strides, every view inside its storage, then the
/// typed plan's checks (shapes, alignment, outputs overlapping no tensor).
pub fn plan_backward_raw(
    target: Target,
    options: &AttentionOptions,
    backward: BackwardOptions,
    tensors: &RawAttentionBackwardTensors<'_>,
) -> Result<(AttentionProblem, AttentionBackwardPlan)> {
    let dtype = dtype_of(tensors.q.dtype)?;
    let mut problem =
        AttentionProblem::from_shapes(&tensors.q.shape, &tensors.k.shape, dtype, options)?;
    problem.sinks = tensors.sinks.is_some();
    problem.value_dim = value_dim_of(&problem, tensors.k, tensors.v);
    problem.validate()?;
    let plan = match dtype {
        Dtype::Bf16 => plan_backward_typed::<bf16>(&problem, target, backward, tensors),
        Dtype::F16 => plan_backward_typed::<f16>(&problem, target, backward, tensors),
    }?;
    Ok((problem, plan))
}

fn plan_backward_typed<T: AttentionElem + RawElem>(
    problem: &AttentionProblem,
    target: Target,
    backward: BackwardOptions,
    t: &RawAttentionBackwardTensors<'_>,
) -> Result<AttentionBackwardPlan> {
    problem.plan_backward::<T>(
        target,
        &AttentionBackwardTensors {
            q: view("Q", t.q)?,
            k: view("K", t.k)?,
            v: view("V", t.v)?,
            o: view("O", t.o)?,
            d_o: view("dO", t.d_o)?,
            lse: lse_view(problem, "LSE", t.lse)?,
            d_lse: t.d_lse.map(|d| lse_view(problem, "dLSE", d)).transpose()?,
            dq: view("dQ", t.dq)?,
            dk: view("dK", t.dk)?,
            dv: view("dV", t.dv)?,
            sinks: t
                .sinks
                .map(|s| sinks_view(problem.heads_q, s))
                .transpose()?,
            d_sinks: t
                .d_sinks
                .map(|s| flat_view("dsinks", s, &[problem.heads_q]))
                .transpose()?,
        },
        backward,
    )
}

/// The workspace a backward pass with `backward` needs on Q of shape `q` and K of shape `k`
/// (`[batch, seq, heads, D]` each) of element type `dtype`: the lengths its plan reports, for
/// a caller that allocates the workspace before launching ([`backward_raw`]). The problem is
/// validated as the plan validates it.
pub fn backward_workspace_lens(
    q: &[usize],
    k: &[usize],
    dtype: ElemType,
    backward: BackwardOptions,
) -> Result<BackwardWorkspaceLens> {
    let problem = AttentionProblem::from_shapes(q, k, dtype_of(dtype)?, &Default::default())?;
    problem.validate()?;
    Ok(problem.backward_workspace_lens(backward))
}

/// Launch the backward pass on `stream` (asynchronous): dQ, dK and dV written from Q, K, V,
/// the forward's O and LSE, dO and optionally dLSE, with the problem taken from the shapes and
/// `options` (the forward's), using the caller's `workspace`. Checks as [`plan_backward_raw`],
/// the workspace's lengths, contiguity and alignment, that it overlaps no tensor, and that
/// every tensor's and the workspace's storage is device memory of the stream's device inside
/// one allocation.
///
/// # Safety
/// Each tensor's and the workspace's storage is memory the caller owns, live until the launches
/// have completed on `stream`; nothing else writes the inputs or accesses the outputs and the
/// workspace until then.
pub unsafe fn backward_raw(
    stream: &RawStream,
    options: &AttentionOptions,
    backward: BackwardOptions,
    tensors: &RawAttentionBackwardTensors<'_>,
    workspace: &RawBackwardWorkspace<'_>,
) -> Result<()> {
    let gpu = stream.gpu();
    let (_, plan) = plan_backward_raw(Target::of(gpu), options, backward, tensors)?;
    let ws = workspace_views(&plan, tensors, workspace)?;
    for (what, t) in all_tensors(tensors).iter().chain(&scratch(workspace)) {
        t.check_memory(what, gpu)?;
    }
    // SAFETY: the plan checked every view against its storage and that the outputs overlap no
    // tensor; the workspace is inside its storage, of the plan's sizes and alignment, and
    // overlaps no tensor nor itself (`workspace_views`); every storage is
    // device memory of the stream's device inside one allocation (checked above), live and not
    // accessed by others until the launches complete (the caller's contract).
    unsafe { plan.run(stream, &ws) }
}

/// The tensors of a backward pass, named.
fn all_tensors<'t>(t: &RawAttentionBackwardTensors<'t>) -> Vec<(&'static str, &'t RawTensor)> {
    let mut all = vec![
        ("Q", t.q),
        ("K", t.k),
        ("V", t.v),
        ("O", t.o),
        ("LSE", t.lse),
        ("dO", t.d_o),
        ("dQ", t.dq),
        ("dK", t.dk),
        ("dV", t.dv),
    ];
    all.extend(t.d_lse.map(|d| ("dLSE", d)));
    all.extend(t.sinks.map(|s| ("sinks", s)));
    all.extend(t.d_sinks.map(|s| ("dsinks", s)));
    all
}

/// The workspace's tensors, named.
fn scratch<'t>(w: &RawBackwardWorkspace<'t>) -> Vec<(&'static str, &'t RawTensor)> {
    let mut scratch = vec![("backward workspace delta", w.delta)];
    scratch.extend(w.dq_accum.map(|a| ("backward workspace dQ accumulator", a)));
    scratch
}

/// The workspace of `plan` as flat views (pure): each tensor f32, contiguous, of the plan's
/// length, inside its storage, overlapping no tensor of the pass nor the other. An accumulator
/// given to a plan whose length is 0 is not used.
pub(super) fn workspace_views<'a>(
    plan: &AttentionBackwardPlan,
    tensors: &RawAttentionBackwardTensors<'_>,
    workspace: &RawBackwardWorkspace<'_>,
) -> Result<BackwardWorkspace<'a>> {
    let ws = BackwardWorkspace {
        delta: flat_view(
            "backward workspace delta",
            workspace.delta,
            &[plan.delta_len()],
        )?,
        dq_accum: match workspace.dq_accum {
            Some(a) if plan.dq_accum_len() > 0 => Some(flat_view(
                "backward workspace dQ accumulator",
                a,
                &[plan.dq_accum_len()],
            )?),
            _ => None,
        },
    };
    check_disjoint(&all_tensors(tensors), &scratch(workspace))?;
    // The plan's launches check the accumulator's presence and alignment.
    plan.launches(&ws)?;
    Ok(ws)
}

/// The tensors of a raw forward pass over packed sequences.
#[derive(Clone, Copy)]
pub struct RawAttentionVarlenTensors<'t> {
    /// Q `[total_q, heads_q, D]`, bf16 or f16.
    pub q: &'t RawTensor,
    /// K `[total_k, heads_kv, D]`, Q's type.
    pub k: &'t RawTensor,
    /// V, as K.
    pub v: &'t RawTensor,
    /// O, as Q (written).
    pub o: &'t RawTensor,
    /// LSE `[heads_q, total_q]` f32, contiguous (written).
    pub lse: &'t RawTensor,
    /// `[batch + 1]` i32, contiguous: the first query row of each sequence, then `total_q`.
    pub cu_seqlens_q: &'t RawTensor,
    /// `[batch + 1]` i32, contiguous: the first key row of each sequence, then `total_k`.
    pub cu_seqlens_k: &'t RawTensor,
    /// Attention sinks: `[heads_q]` f32 logits, one per query head, or `None`.
    pub sinks: Option<&'t RawTensor>,
    /// The tile counter of the Hopper path's persistent grid: `[1]` int32, zero (the kernel
    /// leaves it zero), used by no other launch while this one runs; `None` for one block per
    /// query tile ([`AttentionVarlenTensors::tile_counter`]).
    pub tile_counter: Option<&'t RawTensor>,
}

impl AttentionVarlenProblem {
    /// The problem of packed Q of shape `q` and K of shape `k` (`[total, heads, D]` each; D is
    /// Q's, K's is checked against it with the tensors) in `batch` sequences, the longest
    /// `max_seqlen = (q, k)` rows (FlashAttention's `max_seqlen_q`, `max_seqlen_k`), with
    /// `options`.
    pub fn from_shapes(
        q: &[usize],
        k: &[usize],
        batch: usize,
        max_seqlen: (usize, usize),
        dtype: Dtype,
        options: &AttentionOptions,
    ) -> Result<AttentionVarlenProblem> {
        let [total_q, heads_q, head_dim] =
            <[usize; 3]>::try_from(q).map_err(|_| Error::shape("Q rank", 3, q.len()))?;
        let [total_k, heads_kv, _] =
            <[usize; 3]>::try_from(k).map_err(|_| Error::shape("K rank", 3, k.len()))?;
        Ok(AttentionVarlenProblem {
            batch,
            total_q,
            total_k,
            max_seqlen_q: max_seqlen.0,
            max_seqlen_k: max_seqlen.1,
            heads_q,
            heads_kv,
            head_dim,
            value_dim: None,
            dtype,
            scale: options.scale,
            causal: options.causal,
            window: options.window,
            path: options.path,
            softcap: options.softcap,
            sinks: false,
        })
    }
}

/// The workspace a backward pass over packed sequences with `backward` needs on Q of shape `q`
/// and K of shape `k` (`[total, heads, D]` each) of element type `dtype`, in `batch` sequences
/// of at most `max_seqlen_q` query and `max_seqlen_k` key rows: the lengths its plan reports
/// ([`plan_backward_varlen_raw`]), for a caller that allocates the workspace before launching
/// ([`backward_varlen_raw`]). The problem is validated as the plan validates it.
pub fn backward_varlen_workspace_lens(
    q: &[usize],
    k: &[usize],
    batch: usize,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    dtype: ElemType,
    backward: BackwardOptions,
) -> Result<BackwardWorkspaceLens> {
    let problem = AttentionVarlenProblem::from_shapes(
        q,
        k,
        batch,
        (max_seqlen_q, max_seqlen_k),
        dtype_of(dtype)?,
        &Default::default(),
    )?;
    problem.validate()?;
    Ok(problem.backward_workspace_lens(backward))
}

/// Plan the forward pass over packed sequences on raw tensors for `target` (pure: no driver call, no memory
/// read): the problem from the shapes (totals from Q and K, the batch from `cu_seqlens_q`),
/// `max_seqlen_q` and `max_seqlen_k` (FlashAttention's arguments; checked possible for the
/// totals and the batch) and `options`; the tensors' element types, ranks, strides, every view
/// inside its storage, the outputs apart from the inputs and each other, then the typed plan's
/// checks. The boundaries' contents are device data: the kernel clamps them to the totals.
pub fn plan_varlen_raw(
    target: Target,
    options: &AttentionOptions,
    tensors: &RawAttentionVarlenTensors<'_>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
) -> Result<(AttentionVarlenProblem, AttentionVarlenPlan)> {
    let dtype = dtype_of(tensors.q.dtype)?;
    let [entries] = <[usize; 1]>::try_from(&tensors.cu_seqlens_q.shape[..])
        .map_err(|_| Error::shape("cu_seqlens_q rank", 1, tensors.cu_seqlens_q.shape.len()))?;
    let mut problem = AttentionVarlenProblem::from_shapes(
        &tensors.q.shape,
        &tensors.k.shape,
        entries.saturating_sub(1),
        (max_seqlen_q, max_seqlen_k),
        dtype,
        options,
    )?;
    problem.sinks = tensors.sinks.is_some();
    problem.value_dim = packed_value_dim_of(problem.head_dim, tensors.k, tensors.v);
    problem.validate()?;
    let mut inputs = vec![
        ("Q", tensors.q),
        ("K", tensors.k),
        ("V", tensors.v),
        ("cu_seqlens_q", tensors.cu_seqlens_q),
        ("cu_seqlens_k", tensors.cu_seqlens_k),
    ];
    inputs.extend(tensors.sinks.map(|s| ("sinks", s)));
    let mut outputs = vec![("O", tensors.o), ("LSE", tensors.lse)];
    outputs.extend(tensors.tile_counter.map(|c| ("tile counter", c)));
    check_disjoint(&inputs, &outputs)?;
    let plan = match dtype {
        Dtype::Bf16 => plan_varlen_typed::<bf16>(&problem, target, tensors),
        Dtype::F16 => plan_varlen_typed::<f16>(&problem, target, tensors),
    }?;
    Ok((problem, plan))
}

fn plan_varlen_typed<T: AttentionElem + RawElem>(
    problem: &AttentionVarlenProblem,
    target: Target,
    t: &RawAttentionVarlenTensors<'_>,
) -> Result<AttentionVarlenPlan> {
    let cu_len = problem.batch + 1;
    problem.plan::<T>(
        target,
        &AttentionVarlenTensors {
            q: packed_view("Q", t.q)?,
            k: packed_view("K", t.k)?,
            v: packed_view("V", t.v)?,
            o: packed_view("O", t.o)?,
            lse: flat_view("LSE", t.lse, &[problem.heads_q, problem.total_q])?,
            cu_seqlens_q: flat_view("cu_seqlens_q", t.cu_seqlens_q, &[cu_len])?,
            cu_seqlens_k: flat_view("cu_seqlens_k", t.cu_seqlens_k, &[cu_len])?,
            sinks: t
                .sinks
                .map(|s| sinks_view(problem.heads_q, s))
                .transpose()?,
            tile_counter: t
                .tile_counter
                .map(|c| flat_view("tile counter", c, &[1]))
                .transpose()?,
        },
    )
}

/// A rank-3 packed tensor of element type `T` as a [`View::packed`] into its storage.
fn packed_view<'a, T: RawElem>(what: &str, t: &RawTensor) -> Result<View<'a, T>> {
    t.expect::<T>(what, 3)?;
    let strides = t.strides(what)?;
    // SAFETY: as in `view`: addresses for the plan only.
    let (memory, offset) = unsafe { t.storage::<T>(what) }?;
    View::packed(memory, offset, &t.shape, &strides)
}

/// Launch the forward pass over packed sequences on `stream` (asynchronous), FlashAttention's
/// `flash_attn_varlen_func`: O and LSE written from Q, K, V and the boundaries. Checks as
/// [`plan_varlen_raw`], and that every non-empty tensor's storage is device memory of the
/// stream's device inside one allocation.
///
/// # Safety
/// Each tensor's storage is memory the caller owns, live until the launch has completed on
/// `stream`; nothing else writes Q, K, V or the boundaries or accesses O, LSE and the tile
/// counter until then; the tile counter, if any, is zero.
/// The boundaries should hold what FlashAttention requires (from 0, non-decreasing, ending at
/// the totals, no sequence longer than the maximum lengths): other contents cannot make the
/// kernel access memory outside the tensors, but leave O and LSE meaningless (rows of a
/// sequence longer than `max_seqlen_q` unwritten).
pub unsafe fn forward_varlen_raw(
    stream: &RawStream,
    options: &AttentionOptions,
    tensors: &RawAttentionVarlenTensors<'_>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
) -> Result<()> {
    let gpu = stream.gpu();
    let (_, plan) = plan_varlen_raw(
        Target::of(gpu),
        options,
        tensors,
        max_seqlen_q,
        max_seqlen_k,
    )?;
    for (what, t) in [
        ("Q", tensors.q),
        ("K", tensors.k),
        ("V", tensors.v),
        ("O", tensors.o),
        ("LSE", tensors.lse),
        ("cu_seqlens_q", tensors.cu_seqlens_q),
        ("cu_seqlens_k", tensors.cu_seqlens_k),
    ]
    .into_iter()
    .chain(tensors.sinks.map(|s| ("sinks", s)))
    .chain(tensors.tile_counter.map(|c| ("tile counter", c)))
    {
        // An empty tensor (no rows: a framework may give it any address) is never accessed.
        if t.shape.iter().product::<usize>() > 0 {
            t.check_memory(what, gpu)?;
        }
    }
    // SAFETY: the plan checked every view against its storage, the non-empty storage is device
    // memory of the stream's device inside one allocation (checked above; empty tensors are
    // never accessed: no query row means no launch, no key row means no key is loaded), live
    // and not accessed by others until the launch completes, the tile counter zero (the
    // caller's contract), the outputs overlap neither the inputs nor each other (checked), and
    // the kernel clamps the boundaries' contents to the totals.
    unsafe { plan.run(stream) }
}

/// The tensors of a raw backward pass over packed sequences.
#[derive(Clone, Copy)]
pub struct RawAttentionVarlenBackwardTensors<'t> {
    /// Q `[total_q, heads_q, D]`, bf16 or f16.
    pub q: &'t RawTensor,
    /// K `[total_k, heads_kv, D]`, Q's type.
    pub k: &'t RawTensor,
    /// V, as K.
    pub v: &'t RawTensor,
    /// O of the forward, as Q.
    pub o: &'t RawTensor,
    /// LSE of the forward `[heads_q, total_q]` f32, contiguous.
    pub lse: &'t RawTensor,
    /// dO, as Q.
    pub d_o: &'t RawTensor,
    /// dLSE, as LSE; `None` when the loss does not depend on LSE.
    pub d_lse: Option<&'t RawTensor>,
    /// dQ, as Q (written).
    pub dq: &'t RawTensor,
    /// dK, as K (written; with grouped-query attention the sum over the group's query heads).
    pub dk: &'t RawTensor,
    /// dV, as K (written, as dK).
    pub dv: &'t RawTensor,
    /// `[batch + 1]` i32, contiguous: the first query row of each sequence, then `total_q`.
    pub cu_seqlens_q: &'t RawTensor,
    /// `[batch + 1]` i32, contiguous: the first key row of each sequence, then `total_k`.
    pub cu_seqlens_k: &'t RawTensor,
    /// The forward's sinks `[heads_q]` f32, or `None` (a problem without sinks).
    pub sinks: Option<&'t RawTensor>,
    /// The sinks' gradient `[heads_q]` f32 (written), exactly when `sinks` is given.
    pub d_sinks: Option<&'t RawTensor>,
}

impl<'t> RawAttentionVarlenBackwardTensors<'t> {
    /// The tensors, named.
    fn all(&self) -> Vec<(&'static str, &'t RawTensor)> {
        let mut all = vec![
            ("Q", self.q),
            ("K", self.k),
            ("V", self.v),
            ("O", self.o),
            ("LSE", self.lse),
            ("dO", self.d_o),
            ("dQ", self.dq),
            ("dK", self.dk),
            ("dV", self.dv),
            ("cu_seqlens_q", self.cu_seqlens_q),
            ("cu_seqlens_k", self.cu_seqlens_k),
        ];
        all.extend(self.d_lse.map(|d| ("dLSE", d)));
        all.extend(self.sinks.map(|s| ("sinks", s)));
        all.extend(self.d_sinks.map(|s| ("dsinks", s)));
        all
    }
}

/// Plan the backward pass over packed sequences on raw tensors for `target` (pure: no driver
/// call, no memory read): the problem as [`plan_varlen_raw`] takes it (totals from Q and K,
/// the batch from `cu_seqlens_q`, `max_seqlen_q`, `max_seqlen_k`, `options`: the forward's),
/// the tensors' element types, ranks, strides, every view inside its storage, then the typed
/// plan's checks ([`AttentionVarlenProblem::plan_backward`]). The workspace's lengths are the
/// plan's ([`backward_varlen_workspace_lens`]).
pub fn plan_backward_varlen_raw(
    target: Target,
    options: &AttentionOptions,
    backward: BackwardOptions,
    tensors: &RawAttentionVarlenBackwardTensors<'_>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
) -> Result<(AttentionVarlenProblem, AttentionVarlenBackwardPlan)> {
    let dtype = dtype_of(tensors.q.dtype)?;
    let [entries] = <[usize; 1]>::try_from(&tensors.cu_seqlens_q.shape[..])
        .map_err(|_| Error::shape("cu_seqlens_q rank", 1, tensors.cu_seqlens_q.shape.len()))?;
    let mut problem = AttentionVarlenProblem::from_shapes(
        &tensors.q.shape,
        &tensors.k.shape,
        entries.saturating_sub(1),
        (max_seqlen_q, max_seqlen_k),
        dtype,
        options,
    )?;
    problem.sinks = tensors.sinks.is_some();
    problem.value_dim = packed_value_dim_of(problem.head_dim, tensors.k, tensors.v);
    problem.validate()?;
    let plan = match dtype {
        Dtype::Bf16 => plan_backward_varlen_typed::<bf16>(target, &problem, backward, tensors),
        Dtype::F16 => plan_backward_varlen_typed::<f16>(target, &problem, backward, tensors),
    }?;
    Ok((problem, plan))
}

fn plan_backward_varlen_typed<T: AttentionElem + RawElem>(
    target: Target,
    problem: &AttentionVarlenProblem,
    backward: BackwardOptions,
    t: &RawAttentionVarlenBackwardTensors<'_>,
) -> Result<AttentionVarlenBackwardPlan> {
    let cu_len = problem.batch + 1;
    let lse_shape = [problem.heads_q, problem.total_q];
    problem.plan_backward::<T>(
        target,
        &AttentionVarlenBackwardTensors {
            q: packed_view("Q", t.q)?,
            k: packed_view("K", t.k)?,
            v: packed_view("V", t.v)?,
            o: packed_view("O", t.o)?,
            d_o: packed_view("dO", t.d_o)?,
            lse: flat_view("LSE", t.lse, &lse_shape)?,
            d_lse: t
                .d_lse
                .map(|d| flat_view("dLSE", d, &lse_shape))
                .transpose()?,
            dq: packed_view("dQ", t.dq)?,
            dk: packed_view("dK", t.dk)?,
            dv: packed_view("dV", t.dv)?,
            cu_seqlens_q: flat_view("cu_seqlens_q", t.cu_seqlens_q, &[cu_len])?,
            cu_seqlens_k: flat_view("cu_seqlens_k", t.cu_seqlens_k, &[cu_len])?,
            sinks: t
                .sinks
                .map(|s| sinks_view(problem.heads_q, s))
                .transpose()?,
            d_sinks: t
                .d_sinks
                .map(|s| flat_view("dsinks", s, &[problem.heads_q]))
                .transpose()?,
        },
        backward,
    )
}

/// Launch the backward pass over packed sequences on `stream` (asynchronous), the backward of
/// [`forward_varlen_raw`]: dQ, dK and dV written from Q, K, V, the forward's O and LSE, dO and
/// optionally dLSE, using the caller's `workspace` (rank-1 f32 tensors of the plan's lengths:
/// [`plan_backward_varlen_raw`]). Checks as [`plan_backward_varlen_raw`], the workspace's
/// lengths, contiguity and alignment, that it overlaps no tensor, and that every non-empty
/// tensor's and the workspace's storage is device memory of the stream's device inside one
/// allocation.
///
/// # Safety
/// Each tensor's and the workspace's storage is memory the caller owns, live until the launches
/// have completed on `stream`; nothing else writes the inputs or accesses the outputs and the
/// workspace until then. The boundaries should hold what FlashAttention requires (as for
/// [`forward_varlen_raw`]): other contents cannot make the kernels access memory outside the
/// tensors, but leave the gradients meaningless.
pub unsafe fn backward_varlen_raw(
    stream: &RawStream,
    options: &AttentionOptions,
    backward: BackwardOptions,
    tensors: &RawAttentionVarlenBackwardTensors<'_>,
    workspace: &RawBackwardWorkspace<'_>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
) -> Result<()> {
    let gpu = stream.gpu();
    let (_, plan) = plan_backward_varlen_raw(
        Target::of(gpu),
        options,
        backward,
        tensors,
        max_seqlen_q,
        max_seqlen_k,
    )?;
    let ws = BackwardWorkspace {
        delta: flat_view(
            "backward workspace delta",
            workspace.delta,
            &[plan.delta_len()],
        )?,
        dq_accum: match workspace.dq_accum {
            Some(a) if plan.dq_accum_len() > 0 => Some(flat_view(
                "backward workspace dQ accumulator",
                a,
                &[plan.dq_accum_len()],
            )?),
            _ => None,
        },
    };
    check_disjoint(&tensors.all(), &scratch(workspace))?;
    // The plan's launches check the accumulator's presence and alignment.
    plan.launches(&ws)?;
    for (what, t) in tensors.all().iter().chain(&scratch(workspace)) {
        // An empty tensor (no rows: a framework may give it any address) is never accessed.
        if t.shape.iter().product::<usize>() > 0 {
            t.check_memory(what, gpu)?;
        }
    }
    // SAFETY: the plan checked every view against its storage and that the outputs overlap no
    // tensor; the workspace is inside its storage, of the plan's sizes and alignment, and
    // overlaps no tensor nor itself (checked above); every non-empty storage is device memory
    // of the stream's device inside one allocation (checked above; empty tensors are never
    // accessed), live and not accessed by others until the launches complete (the caller's
    // contract); the kernels clamp the boundaries' contents to the totals.
    unsafe { plan.run(stream, &ws) }
}
