//! The forward pass on a GPU over `cust` buffers: a [`GlaSession`] keeps a problem's segment
//! tables and workspace on the device, and each of its runs plans the launches on the given
//! buffers ([`GlaPlan`]) and runs them on a stream.

use super::plan::{GlaPlan, GlaSplitWorkspace, GlaTensors, GlaWorkspace};
use super::problem::{GlaKernel, GlaProblem, SegmentPlan, check_kernel};
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

/// A problem made ready to run on one GPU: its kernels (for the GPU's PTX target), its segments
/// (for those kernels on the GPU's multiprocessors), their tables on the device and the
/// workspace of the segment passes. Build once, run many times
/// (one run at a time: the workspace is the session's); each run ([`GlaSession::forward`],
/// [`GlaSession::backward`]) plans its launches on the given buffers ([`GlaProblem::plan`]'s
/// [`GlaPlan`], on the session's segments, or [`GlaProblem::plan_backward`]'s) and runs them.
/// The backward's workspace is allocated by its first run and kept.
pub struct GlaSession {
    problem: GlaProblem,
    /// The kernels that run ([`GlaProblem::kernel_for`] the GPU's target).
    kernel: GlaKernel,
    segments: SegmentPlan,
    /// The segment table as words (`[start, len, seq, flags]` per entry).
    segment_table: DeviceBuffer<u32>,
    /// `(combine table, seg_init, delta, decay_log2)` when some sequence has several segments.
    split: Option<SplitWorkspace>,
    /// The backward's tables and workspace, allocated by the first backward run.
    pub(super) backward: Option<super::backward::BackwardWorkspace>,
}

struct SplitWorkspace {
    /// `[seq, first, count, 0]` per entry.
    combine: DeviceBuffer<u32>,
    seg_init: DeviceBuffer<f32>,
    delta: DeviceBuffer<f32>,
    decay_log2: DeviceBuffer<f32>,
}

impl GlaSession {
    /// Validate `problem`, decide the kernels and the segments for `gpu`, upload the tables and
    /// allocate the workspace (`(2 dk dv + dk) * 4` bytes per segment and head, only when a
    /// sequence is split).
    pub fn new(gpu: &Gpu, problem: &GlaProblem) -> Result<GlaSession> {
        problem.validate()?;
        let kernel = problem.kernel_for(gpu.arch())?;
        let segments = problem.segments_of(kernel, gpu.info().multiprocessors as usize)?;
        gpu.bind()?;
        let (segment_words, combine_words) = segments.table_words();
        let segment_table = upload(&segment_words)?;
        let split = match problem.workspace_len(&segments) {
            None => None,
            Some((state, decay)) => Some(SplitWorkspace {
                combine: upload(&combine_words)?,
                seg_init: poisoned(state)?,
                delta: poisoned(state)?,
                decay_log2: poisoned(decay)?,
            }),
        };
        Ok(GlaSession {
            problem: problem.clone(),
            kernel,
            segments,
            segment_table,
            split,
            backward: None,
        })
    }

    /// The problem.
    pub fn problem(&self) -> &GlaProblem {
        &self.problem
    }

    /// The kernels that run: [`GlaKernel::Baseline`] or [`GlaKernel::Pingpong`] (the problem's
    /// choice, `Auto` resolved for the GPU).
    pub fn kernel(&self) -> GlaKernel {
        self.kernel
    }

    /// The segment decomposition.
    pub fn segments(&self) -> &SegmentPlan {
        &self.segments
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
        check_kernel(self.kernel, gpu.arch())?;
        let plan =
            GlaPlan::for_segments(&self.problem, self.kernel, self.segments.clone(), &tensors)?;
        let workspace = GlaWorkspace {
            segments: (&self.segment_table).into(),
            split: self.split.as_mut().map(|w| GlaSplitWorkspace {
                combine: (&w.combine).into(),
                seg_init: (&mut w.seg_init).into(),
                delta: (&mut w.delta).into(),
                decay_log2: (&mut w.decay_log2).into(),
            }),
        };
        // SAFETY: every view is a live allocation of this GPU's context (device buffers,
        // borrowed for the call, the outputs mutably), the tables hold the words of the plan's
        // segments (the session's, uploaded by `new`) and the workspace its sizes.
        unsafe { plan.run(&OnStream { gpu, stream }, &workspace) }
    }
}

/// Convenience: make a [`GlaSession`] for `problem`, run it on `stream`, then wait for it
/// (tests, examples).
pub fn forward_sync(
    gpu: &Gpu,
    stream: &Stream,
    problem: &GlaProblem,
    inputs: &GlaInputs,
    outputs: &mut GlaOutputs,
) -> Result<()> {
    let mut session = GlaSession::new(gpu, problem)?;
    session.forward(gpu, stream, inputs, outputs)?;
    gpu.sync(stream, "GLA forward")
}
