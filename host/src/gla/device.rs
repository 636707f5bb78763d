//! The forward pass on a GPU over `cust` buffers: [`GlaPlan`] keeps a problem's segment tables
//! and workspace on the device and plans and runs each launch ([`GlaLaunchPlan`]) on a stream.

use super::plan::{
    GlaLaunchPlan, GlaSplitWorkspace, GlaTensors, GlaWorkspace, check_arch, table_words,
    workspace_len,
};
use super::problem::{GlaProblem, SegmentPlan};
use crate::error::Result;
use crate::exec::OnStream;
use crate::gpu::Gpu;
use crate::memory::{poisoned, upload};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use half::bf16;

/// The device tensors of one launch (contiguous).
pub struct GlaInputs<'a> {
    /// Queries `[B, T, H, dk]`.
    pub q: &'a DeviceBuffer<bf16>,
    /// Keys `[B, T, H, dk]`.
    pub k: &'a DeviceBuffer<bf16>,
    /// Values `[B, T, H, dv]`.
    pub v: &'a DeviceBuffer<bf16>,
    /// Log-decays `[B, T, H, dk]` (natural log).
    pub g: &'a DeviceBuffer<bf16>,
    /// Initial states `[N, H, dk, dv]`, or zero states.
    pub init_state: Option<&'a DeviceBuffer<f32>>,
}

/// The device outputs of one launch.
pub struct GlaOutputs<'a> {
    /// Outputs `[B, T, H, dv]`.
    pub o: &'a mut DeviceBuffer<bf16>,
    /// Final states `[N, H, dk, dv]`, if wanted.
    pub final_state: Option<&'a mut DeviceBuffer<f32>>,
}

/// A problem made ready to run on one GPU: its segments (for the GPU's multiprocessors), their
/// tables on the device and the workspace of the segment passes. Build once, run many times
/// (one run at a time: the workspace is the plan's); each run plans its launches on the given
/// tensors ([`GlaLaunchPlan`]) and runs them.
pub struct GlaPlan {
    problem: GlaProblem,
    plan: SegmentPlan,
    /// The segment table as words (`[start, len, seq, flags]` per entry).
    segments: DeviceBuffer<u32>,
    /// `(combine table, seg_init, delta, decay_log2)` when some sequence has several segments.
    split: Option<SplitWorkspace>,
}

struct SplitWorkspace {
    /// `[seq, first, count, 0]` per entry.
    combine: DeviceBuffer<u32>,
    seg_init: DeviceBuffer<f32>,
    delta: DeviceBuffer<f32>,
    decay_log2: DeviceBuffer<f32>,
}

impl GlaPlan {
    /// Validate `problem`, decide the segments for `gpu`, upload the tables and allocate the
    /// workspace (`(2 dk dv + dk) * 4` bytes per segment and head, only when a sequence is
    /// split).
    pub fn new(gpu: &Gpu, problem: &GlaProblem) -> Result<GlaPlan> {
        problem.validate()?;
        let plan = problem.plan(gpu.info().multiprocessors as usize)?;
        gpu.bind()?;
        let (segment_words, combine_words) = table_words(&plan);
        let segments = upload(&segment_words)?;
        let split = match workspace_len(problem, &plan) {
            None => None,
            Some((state, decay)) => Some(SplitWorkspace {
                combine: upload(&combine_words)?,
                seg_init: poisoned(state)?,
                delta: poisoned(state)?,
                decay_log2: poisoned(decay)?,
            }),
        };
        Ok(GlaPlan {
            problem: problem.clone(),
            plan,
            segments,
            split,
        })
    }

    /// The problem.
    pub fn problem(&self) -> &GlaProblem {
        &self.problem
    }

    /// The segment decomposition.
    pub fn segments(&self) -> &SegmentPlan {
        &self.plan
    }

    /// Launch the forward pass on `stream` (asynchronous; up to three kernels).
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        stream: &Stream,
        inputs: &GlaInputs,
        outputs: &mut GlaOutputs,
    ) -> Result<()> {
        let tensors = GlaTensors {
            q: inputs.q.into(),
            k: inputs.k.into(),
            v: inputs.v.into(),
            g: inputs.g.into(),
            init_state: inputs.init_state.map(|b| b.into()),
            o: (&mut *outputs.o).into(),
            final_state: outputs.final_state.as_mut().map(|b| (&mut **b).into()),
        };
        check_arch(&self.problem, gpu.arch())?;
        let plan = GlaLaunchPlan::for_segments(&self.problem, self.plan.clone(), &tensors)?;
        let workspace = GlaWorkspace {
            segments: (&self.segments).into(),
            split: self.split.as_mut().map(|w| GlaSplitWorkspace {
                combine: (&w.combine).into(),
                seg_init: (&mut w.seg_init).into(),
                delta: (&mut w.delta).into(),
                decay_log2: (&mut w.decay_log2).into(),
            }),
        };
        // SAFETY: every view is a live allocation of this GPU's context (device buffers,
        // borrowed for the call, the outputs mutably), the tables hold this plan's words
        // (uploaded by `new`) and the workspace its sizes.
        unsafe { plan.run(&OnStream { gpu, stream }, &workspace) }
    }
}

/// Convenience: plan and launch `problem` on `stream`, then wait for it (tests, examples).
pub fn forward_sync(
    gpu: &Gpu,
    stream: &Stream,
    problem: &GlaProblem,
    inputs: &GlaInputs,
    outputs: &mut GlaOutputs,
) -> Result<()> {
    let mut plan = GlaPlan::new(gpu, problem)?;
    plan.forward(gpu, stream, inputs, outputs)?;
    gpu.sync(stream, "GLA forward")
}
