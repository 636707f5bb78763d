//! Running a backward plan: on any executor ([`AttentionBackwardPlan::run`]), or from `cust`
//! buffers on a stream ([`backward`]).

use super::super::plan::Target;
use super::super::problem::{AttentionElem, AttentionProblem, View};
use super::plan::{
    AttentionBackwardPlan, AttentionBackwardTensors, BackwardOptions, BackwardWorkspace, BwdLaunch,
};
use crate::error::Result;
use crate::exec::{Exec, OnStream};
use crate::gpu::Gpu;
use crate::memory::zeroed;
use cust::memory::DeviceBuffer;
use cust::stream::Stream;

impl AttentionBackwardPlan {
    /// Run the plan's three launches with the workspace `ws` (asynchronous on a stream:
    /// synchronize before reading the gradients or releasing the workspace).
    ///
    /// # Safety
    /// The tensors the plan was made for and the workspace are live memory of `exec` for the
    /// whole run; the workspace overlaps none of the tensors.
    pub unsafe fn run(&self, exec: &impl Exec, ws: &BackwardWorkspace<'_>) -> Result<()> {
        let launches = self.launches(ws)?;
        // SAFETY: (the three launches) the plan checked every view (shape, contiguous head
        // dimension, 16-byte aligned start and strides, in bounds of its memory), LSE's and
        // dLSE's lengths, that the outputs alias nothing, and validated the sizes and window;
        // `launches` checked the workspace's sizes and alignment; the grids are the ones the
        // kernels document; on one executor the launches run in order, so the dK/dV kernel
        // reads the preprocess's delta and zeroed accumulator, and the dQ kernel reads delta or
        // the complete accumulator, and the dsinks kernel reads delta and the checked sinks and
        // writes the checked `heads_q` values of dsinks; the Hopper kernel's tensor maps
        // describe the views the plan checked (Q, dO, K, V); the memory is live and the
        // workspace aliases nothing (the caller's contract).
        unsafe {
            exec.launch(&launches.pre)?;
            if let Some(l) = &launches.dsinks {
                exec.launch(l)?;
            }
            for l in [&launches.dkdv, &launches.dq] {
                match l {
                    BwdLaunch::MmaSync(l) => exec.launch(l)?,
                    BwdLaunch::Hopper(l) => exec.launch(&self.encode_maps(l)?)?,
                }
            }
            Ok(())
        }
    }
}

/// The backward pass on `stream`: dQ into `dq` (a view like Q's), dK and dV into `dk` and `dv`
/// (views like K's), given the forward's inputs, its O and LSE, the loss's gradient `d_o` and,
/// when the loss uses LSE, `d_lse`. The workspace (`delta'`, and the dQ accumulator unless
/// `options.deterministic`) is allocated here; the call returns once the kernels finished, so
/// that it can be freed. The outputs must overlap neither each other nor the inputs (checked).
/// For a problem with sinks, [`backward_with_sinks`].
#[allow(clippy::too_many_arguments)]
pub fn backward<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &View<T>,
    lse: &DeviceBuffer<f32>,
    d_o: &View<T>,
    d_lse: Option<&DeviceBuffer<f32>>,
    dq: &mut View<T>,
    dk: &mut View<T>,
    dv: &mut View<T>,
    options: BackwardOptions,
) -> Result<()> {
    launch_backward(
        gpu,
        stream,
        problem,
        (q, k, v, o, lse),
        (d_o, d_lse),
        (dq, dk, dv),
        None,
        options,
    )
}

/// [`backward`] of a problem with sinks ([`AttentionProblem::sinks`]): `sinks` holds their
/// logits `[heads_q]` (the forward's); their gradient `[heads_q]` (summed over the batch and
/// the rows) is written into `d_sinks`.
#[allow(clippy::too_many_arguments)]
pub fn backward_with_sinks<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &View<T>,
    lse: &DeviceBuffer<f32>,
    d_o: &View<T>,
    d_lse: Option<&DeviceBuffer<f32>>,
    dq: &mut View<T>,
    dk: &mut View<T>,
    dv: &mut View<T>,
    sinks: &DeviceBuffer<f32>,
    d_sinks: &mut DeviceBuffer<f32>,
    options: BackwardOptions,
) -> Result<()> {
    launch_backward(
        gpu,
        stream,
        problem,
        (q, k, v, o, lse),
        (d_o, d_lse),
        (dq, dk, dv),
        Some((sinks, d_sinks)),
        options,
    )
}

/// The plan of `problem` on these tensors, run on `stream` with a fresh workspace.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn launch_backward<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    (q, k, v, o, lse): (&View<T>, &View<T>, &View<T>, &View<T>, &DeviceBuffer<f32>),
    (d_o, d_lse): (&View<T>, Option<&DeviceBuffer<f32>>),
    (dq, dk, dv): (&mut View<T>, &mut View<T>, &mut View<T>),
    sinks: Option<(&DeviceBuffer<f32>, &mut DeviceBuffer<f32>)>,
    options: BackwardOptions,
) -> Result<()> {
    let tensors = AttentionBackwardTensors {
        q: *q,
        k: *k,
        v: *v,
        o: *o,
        d_o: *d_o,
        lse: lse.into(),
        d_lse: d_lse.map(|d| d.into()),
        dq: *dq,
        dk: *dk,
        dv: *dv,
        sinks: sinks.as_ref().map(|(s, _)| (*s).into()),
        d_sinks: sinks.as_ref().map(|(_, d)| (&**d).into()),
    };
    let plan = problem.plan_backward(Target::of(gpu), &tensors, options)?;
    let delta = zeroed::<f32>(plan.delta_len())?;
    let accum = if plan.dq_accum_len() > 0 {
        Some(zeroed::<f32>(plan.dq_accum_len())?)
    } else {
        None
    };
    let ws = BackwardWorkspace {
        delta: (&delta).into(),
        dq_accum: accum.as_ref().map(|a| a.into()),
    };
    // SAFETY: the views, LSE, dLSE and the sinks are borrowed for the whole call (the
    // gradients mutably), which waits for the kernels before returning (so the workspace
    // outlives them); the workspace is fresh memory that aliases nothing; the plan checked
    // that the outputs alias no tensor.
    unsafe { plan.run(&OnStream { gpu, stream }, &ws) }?;
    gpu.sync(stream, "attention backward")
}
