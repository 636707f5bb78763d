//! The forward pass on tensors this library does not own ([`crate::raw`]): a framework's
//! tensors on its stream. The problem comes from the tensors' shapes, the plan is the typed
//! API's ([`AttentionProblem::plan`]), so the checks are the same; [`forward_raw`] adds the
//! checks of raw memory (device, allocation, outputs apart from inputs).

use super::plan::{AttentionPlan, AttentionTensors, Target};
use super::problem::{AttentionElem, AttentionProblem, Dtype, Path, View};
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::raw::{ElemType, RawElem, RawStream, RawTensor, check_disjoint};
use half::{bf16, f16};

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
}

/// The tensors of a raw forward pass.
#[derive(Clone, Copy)]
pub struct RawAttentionTensors<'t> {
    /// Q `[batch, seq_q, heads_q, D]`, bf16 or f16.
    pub q: &'t RawTensor,
    /// K `[batch, seq_k, heads_kv, D]`, Q's type.
    pub k: &'t RawTensor,
    /// V, as K.
    pub v: &'t RawTensor,
    /// O, as Q (written).
    pub o: &'t RawTensor,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous (written).
    pub lse: &'t RawTensor,
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
            dtype,
            scale: options.scale,
            causal: options.causal,
            window: options.window,
            path: options.path,
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
    let dtype = match tensors.q.dtype {
        ElemType::Bf16 => Dtype::Bf16,
        ElemType::F16 => Dtype::F16,
        other => {
            return Err(Error::unsupported(
                format!("Q dtype {other:?}"),
                "attention takes bf16 or f16",
            ));
        }
    };
    let problem =
        AttentionProblem::from_shapes(&tensors.q.shape, &tensors.k.shape, dtype, options)?;
    problem.validate()?;
    check_disjoint(
        &[("Q", tensors.q), ("K", tensors.k), ("V", tensors.v)],
        &[("O", tensors.o), ("LSE", tensors.lse)],
    )?;
    let plan = match dtype {
        Dtype::Bf16 => plan_typed::<bf16>(&problem, target, tensors),
        Dtype::F16 => plan_typed::<f16>(&problem, target, tensors),
    }?;
    Ok((problem, plan))
}

fn plan_typed<T: AttentionElem + RawElem>(
    problem: &AttentionProblem,
    target: Target,
    t: &RawAttentionTensors<'_>,
) -> Result<AttentionPlan> {
    let view = |what: &str, t: &RawTensor| -> Result<View<'_, T>> {
        t.expect::<T>(what, 4)?;
        let strides = t.strides(what)?;
        // SAFETY: the view only carries addresses into the plan; the plan's `run` (unsafe)
        // requires the memory to be live on its executor.
        let (memory, offset) = unsafe { t.storage::<T>(what) }?;
        View::new(memory, offset, &t.shape, &strides)
    };
    problem.plan(
        target,
        &AttentionTensors {
            q: view("Q", t.q)?,
            k: view("K", t.k)?,
            v: view("V", t.v)?,
            o: view("O", t.o)?,
            lse: lse_view(problem, t.lse)?,
        },
        None,
    )
}

/// LSE as a contiguous `[batch, heads_q, seq_q]` f32 view (dimensions of size 1 may have any
/// stride), inside its storage.
fn lse_view<'a>(problem: &AttentionProblem, lse: &RawTensor) -> Result<DevView<'a, f32>> {
    lse.expect::<f32>("LSE", 3)?;
    let shape = [problem.batch, problem.heads_q, problem.seq_q];
    if lse.shape != shape {
        return Err(Error::shape(
            "LSE shape",
            format!("{shape:?}"),
            format!("{:?}", lse.shape),
        ));
    }
    let strides = lse.strides("LSE")?;
    let want = [problem.heads_q * problem.seq_q, problem.seq_q, 1];
    if (0..3).any(|i| shape[i] > 1 && strides[i] != want[i]) {
        return Err(Error::unsupported(
            format!("LSE strides {strides:?}"),
            "LSE must be contiguous",
        ));
    }
    if !lse.ptr.is_multiple_of(4) {
        return Err(Error::Misaligned {
            what: "LSE start".into(),
            required: 4,
            actual: lse.ptr % 4,
        });
    }
    // SAFETY: as for the views of `plan_typed`: addresses for the plan only.
    let (memory, offset) = unsafe { lse.storage::<f32>("LSE") }?;
    let len = problem.lse_len();
    if offset as u128 + len as u128 > memory.len() as u128 {
        return Err(Error::shape(
            "LSE storage",
            format!("at least {} elements", offset as u128 + len as u128),
            memory.len(),
        ));
    }
    // SAFETY: inside the storage (checked above); addresses for the plan only, as above.
    Ok(unsafe { DevView::from_raw(lse.ptr, len) })
}

/// Launch the forward pass on `stream` (asynchronous): O and LSE written from Q, K, V, with
/// the problem taken from the shapes and `options`. Checks as [`plan_raw`], and that every
/// tensor's storage is device memory of the stream's device inside one allocation.
///
/// # Safety
/// Each tensor's storage (`storage_ptr`, `storage_bytes`) is memory the caller owns, live
/// until the launch has completed on `stream`; nothing else writes Q, K, V or accesses O and
/// LSE until then.
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
    // SAFETY: the plan checked every view against its storage, the storage is device memory
    // of the stream's device inside one allocation (checked above), live and not accessed by
    // others until the launch completes (the caller's contract), and the outputs overlap
    // neither the inputs nor each other (checked by the plan).
    unsafe { plan.run(stream) }
}
