//! Running a plan: on any executor ([`AttentionPlan::run`]), or from `cust` buffers on a stream
//! ([`forward`], [`forward_with_counter`], [`forward_variant`]).

use super::plan::{AttentionPlan, AttentionTensors, Target};
use super::problem::{AttentionElem, AttentionProblem, View};
use crate::error::Result;
use crate::exec::{Exec, OnStream};
use crate::gpu::Gpu;
use cust::memory::DeviceBuffer;
use cust::stream::Stream;

impl AttentionPlan {
    /// Run the plan (asynchronous on a stream: synchronize before reading O and LSE).
    ///
    /// # Safety
    /// The tensors the plan was made for are live memory of `exec` for the whole run, and O and
    /// LSE overlap neither each other nor the inputs; so is the tile counter
    /// ([`AttentionTensors::tile_counter`]), if given: zero, and used by no other launch
    /// meanwhile.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        match self {
            AttentionPlan::MmaSync { launch, .. } => {
                // SAFETY: the plan checked every view (shape, contiguous head dimension, 16-byte
                // aligned start and strides, in bounds of its memory) and LSE's length
                // (batch * heads_q * seq_q), validated the sizes and window, and the grid is
                // (num_m_blocks, heads_q, batch) as the kernel expects; the memory is live and
                // the outputs alias nothing (the caller's contract).
                unsafe { exec.launch(launch) }
            }
            AttentionPlan::Hopper { .. } => {
                let launch = self.hopper_launch()?.expect("a Hopper plan");
                // SAFETY: the tensor maps describe the checked views of Q, K, V (shape, 16-byte
                // aligned rows and strides, in bounds), O and LSE were checked by the plan, the
                // sizes and window validated, `num_tiles` matches the problem, and any grid of
                // at least one block covers every tile (block b walks b, b + grid, ...); the
                // memory is live and the outputs alias nothing (the caller's contract).
                unsafe { exec.launch(&launch) }
            }
        }
    }
}

/// Launch the forward pass on `stream` (asynchronous): O into `o`, LSE into `lse`.
///
/// `o` is a view like Q's (it may have its own strides). The output must not overlap the
/// inputs. One block per query tile on short causal problems: [`forward_with_counter`] runs
/// them on the faster dynamic grid.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
) -> Result<()> {
    forward_variant(gpu, stream, problem, q, k, v, o, lse, None)
}

/// [`forward`] given a tile counter (one u32, zero; every launch leaves it zero), from which
/// short causal problems draw their tiles ([`AttentionTensors::tile_counter`]). Launches that
/// use one counter must not overlap: one counter per stream.
#[allow(clippy::too_many_arguments)]
pub fn forward_with_counter<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
    counter: &mut DeviceBuffer<u32>,
) -> Result<()> {
    let tensors = AttentionTensors {
        tile_counter: Some((&*counter).into()),
        ..tensors(q, k, v, o, lse, None)
    };
    let plan = problem.plan(Target::of(gpu), &tensors, None)?;
    // SAFETY: as in `launch_forward`; the counter is borrowed mutably for the call, zero
    // between the launches on its stream (the caller's contract, kept by every launch).
    unsafe { plan.run(&OnStream { gpu, stream }) }
}

/// [`forward`] with one of the tuning variants (`kernel_abi::attention::TUNING_VARIANTS` or
/// `HOPPER_VARIANTS`, bf16 only), for benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn forward_variant<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
    variant: Option<&str>,
) -> Result<()> {
    launch_forward(gpu, stream, problem, q, k, v, o, lse, None, variant)
}

/// [`forward`] of a problem with attention sinks ([`AttentionProblem::sinks`]): their logits
/// `[heads_q]` f32 in `sinks`.
#[allow(clippy::too_many_arguments)]
pub fn forward_with_sinks<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
    sinks: &DeviceBuffer<f32>,
) -> Result<()> {
    launch_forward(gpu, stream, problem, q, k, v, o, lse, Some(sinks), None)
}

#[allow(clippy::too_many_arguments)]
fn launch_forward<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
    sinks: Option<&DeviceBuffer<f32>>,
    variant: Option<&str>,
) -> Result<()> {
    let tensors = tensors(q, k, v, o, lse, sinks);
    let plan = problem.plan(Target::of(gpu), &tensors, variant)?;
    // SAFETY: the views and `lse` are borrowed for the whole call, which enqueues the launch;
    // `o` and `lse` are borrowed mutably (the caller keeps O apart from the inputs, as
    // documented).
    unsafe { plan.run(&OnStream { gpu, stream }) }
}

/// The tensors of a forward pass from `cust` buffers, without a tile counter.
fn tensors<'a, T>(
    q: &View<'a, T>,
    k: &View<'a, T>,
    v: &View<'a, T>,
    o: &View<'a, T>,
    lse: &'a DeviceBuffer<f32>,
    sinks: Option<&'a DeviceBuffer<f32>>,
) -> AttentionTensors<'a, T> {
    AttentionTensors {
        q: *q,
        k: *k,
        v: *v,
        o: *o,
        lse: lse.into(),
        sinks: sinks.map(Into::into),
        tile_counter: None,
    }
}
