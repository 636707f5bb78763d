//! Device buffers of a problem, the launchers over them (problem -> plan -> run on a stream),
//! and the synchronous conveniences.

use super::plan::{
    GradientViews, InputViews, SemiCrfPlan, SemiCrfTensors, StateViews, ViterbiViews,
};
use super::{Segment, SemiCrfInputs, SemiCrfProblem};
use crate::error::{Error, Result};
use crate::exec::{DevView, OnStream};
use crate::gpu::Gpu;
use crate::memory::{download, poisoned, upload};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;

/// Validated inputs on the device (built only by [`DeviceInputs::upload`], so the kernels can
/// trust the lengths).
pub struct DeviceInputs {
    problem: SemiCrfProblem,
    cumsum: DeviceBuffer<f32>,
    dur: DeviceBuffer<f32>,
    trans: DeviceBuffer<f32>,
    lengths: DeviceBuffer<u32>,
}

impl DeviceInputs {
    /// Validate `inputs` for `problem` and copy them to the device.
    pub fn upload(problem: &SemiCrfProblem, inputs: &SemiCrfInputs) -> Result<DeviceInputs> {
        inputs.validate(problem)?;
        Ok(DeviceInputs {
            problem: *problem,
            cumsum: upload(inputs.cumsum)?,
            dur: upload(inputs.dur)?,
            trans: upload(inputs.trans)?,
            lengths: upload(inputs.lengths)?,
        })
    }

    /// The cumulative scores on the device.
    pub fn cumsum(&self) -> &DeviceBuffer<f32> {
        &self.cumsum
    }

    /// The buffers as a plan takes them.
    pub fn views(&self) -> InputViews<'_> {
        InputViews {
            cumsum: (&self.cumsum).into(),
            dur: (&self.dur).into(),
            trans: (&self.trans).into(),
            lengths: (&self.lengths).into(),
        }
    }
}

/// What the forward keeps for the backward: log Z and the checkpoints (device buffers, made
/// for one problem).
pub struct ForwardState {
    problem: SemiCrfProblem,
    log_z: DeviceBuffer<f32>,
    log_z64: DeviceBuffer<f64>,
    alpha_ckpt: DeviceBuffer<f64>,
    alpha_norm: DeviceBuffer<f64>,
    beta_ckpt: DeviceBuffer<f64>,
    beta_norm: DeviceBuffer<f64>,
    partials: DeviceBuffer<f64>,
}

impl ForwardState {
    /// Buffers for `problem`, poisoned (NaN) so that a read of an unwritten element shows.
    pub fn new(problem: &SemiCrfProblem) -> Result<ForwardState> {
        problem.validate()?;
        let n = problem.buffer_lens();
        Ok(ForwardState {
            problem: *problem,
            log_z: poisoned(n.log_z)?,
            log_z64: poisoned(n.log_z64)?,
            alpha_ckpt: poisoned(n.alpha_ckpt)?,
            alpha_norm: poisoned(n.alpha_norm)?,
            beta_ckpt: poisoned(n.beta_ckpt)?,
            beta_norm: poisoned(n.beta_norm)?,
            partials: poisoned(n.partials)?,
        })
    }

    /// The buffers as a plan takes them.
    pub fn views(&self) -> StateViews<'_> {
        StateViews {
            log_z: (&self.log_z).into(),
            log_z64: (&self.log_z64).into(),
            alpha_ckpt: (&self.alpha_ckpt).into(),
            alpha_norm: (&self.alpha_norm).into(),
            beta_ckpt: (&self.beta_ckpt).into(),
            beta_norm: (&self.beta_norm).into(),
            partials: (&self.partials).into(),
        }
    }

    /// log Z per sequence (f32, written by the forward).
    pub fn log_z(&self) -> &DeviceBuffer<f32> {
        &self.log_z
    }

    /// log Z per sequence from the forward and from the reverse scan (f64; the reverse one is
    /// written by a backward or fused launch and is a consistency check).
    pub fn log_z_both(&self) -> Result<(Vec<f64>, Vec<f64>)> {
        let v = download(&self.log_z64)?;
        let b = self.problem.batch;
        Ok((v[..b].to_vec(), v[b..].to_vec()))
    }
}

/// Outputs of the backward (device buffers for one problem, poisoned at creation).
pub struct Gradients {
    problem: SemiCrfProblem,
    /// `[B, T + 1, C]` d log Z_b / d S.
    pub grad_cumsum: DeviceBuffer<f32>,
    /// `[K, C]` d (sum_b log Z_b) / d dur.
    pub grad_dur: DeviceBuffer<f32>,
    /// `[C, C]` d (sum_b log Z_b) / d trans.
    pub grad_trans: DeviceBuffer<f32>,
    /// `[B, T, K, C]` segment marginals, when asked for.
    pub marginals: Option<DeviceBuffer<f32>>,
}

impl Gradients {
    /// Buffers for `problem`, with the `[B, T, K, C]` marginals if `marginals`.
    pub fn new(problem: &SemiCrfProblem, marginals: bool) -> Result<Gradients> {
        problem.validate()?;
        let n = problem.buffer_lens();
        Ok(Gradients {
            problem: *problem,
            grad_cumsum: poisoned(n.grad_cumsum)?,
            grad_dur: poisoned(n.grad_dur)?,
            grad_trans: poisoned(n.grad_trans)?,
            marginals: if marginals {
                Some(poisoned(n.marginals)?)
            } else {
                None
            },
        })
    }

    /// The buffers as a plan takes them.
    pub fn views(&self) -> GradientViews<'_> {
        GradientViews {
            grad_cumsum: (&self.grad_cumsum).into(),
            grad_dur: (&self.grad_dur).into(),
            grad_trans: (&self.grad_trans).into(),
            marginals: self.marginals.as_ref().map(DevView::from),
        }
    }
}

/// Check that the buffers were made for `problem` (the problem validated first).
fn same_problems(
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    other: &[(&str, &SemiCrfProblem)],
) -> Result<()> {
    problem.validate()?;
    same_problem("device inputs", problem, &inputs.problem)?;
    for (what, got) in other {
        same_problem(what, problem, got)?;
    }
    Ok(())
}

/// Run `plan` on `stream`.
///
/// # Safety
/// As [`SemiCrfPlan::run`].
unsafe fn run_on(gpu: &Gpu, stream: &Stream, plan: &SemiCrfPlan) -> Result<()> {
    // SAFETY: forwarded to the caller.
    unsafe { plan.run(&OnStream { gpu, stream }) }
}

/// Forward (asynchronous): log Z into `state.log_z()` and the alpha checkpoints.
pub fn forward_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
) -> Result<()> {
    same_problems(problem, inputs, &[("forward state", &state.problem)])?;
    let plan = problem.plan(&SemiCrfTensors::Forward {
        inputs: inputs.views(),
        state: state.views(),
    })?;
    // SAFETY: the buffers were made for this validated problem and are borrowed for the call,
    // the state mutably; the inputs were validated at upload.
    unsafe { run_on(gpu, stream, &plan) }
}

/// Backward after [`forward_launch`] with the same `state` (asynchronous): the reverse scan,
/// then the segment kernel and the reduction into `grads`.
pub fn backward_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    grads: &mut Gradients,
) -> Result<()> {
    same_problem("gradients", problem, &grads.problem)?;
    same_problems(problem, inputs, &[("forward state", &state.problem)])?;
    let plan = problem.plan(&SemiCrfTensors::Backward {
        inputs: inputs.views(),
        state: state.views(),
        grads: grads.views(),
    })?;
    // SAFETY: as in `forward_launch`; the forward was enqueued before on this state (the
    // caller's order: its results are only wrong otherwise, every read is in bounds).
    unsafe { run_on(gpu, stream, &plan) }
}

/// The plan of [`forward_backward_launch`] on these buffers (checked for `problem`).
pub(crate) fn forward_backward_plan(
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &ForwardState,
    grads: &Gradients,
) -> Result<SemiCrfPlan> {
    same_problem("gradients", problem, &grads.problem)?;
    same_problems(problem, inputs, &[("forward state", &state.problem)])?;
    problem.plan(&SemiCrfTensors::ForwardBackward {
        inputs: inputs.views(),
        state: state.views(),
        grads: grads.views(),
    })
}

/// Forward and backward in one go (asynchronous): both scans in one launch (they are
/// independent), then the segment kernel and the reduction. Same results as
/// [`forward_launch`] then [`backward_launch`].
pub fn forward_backward_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    grads: &mut Gradients,
) -> Result<()> {
    let plan = forward_backward_plan(problem, inputs, state, grads)?;
    // SAFETY: as in `forward_launch`, the gradients borrowed mutably too.
    unsafe { run_on(gpu, stream, &plan) }
}

/// Device outputs of the Viterbi kernel.
pub struct ViterbiOutput {
    problem: SemiCrfProblem,
    /// `[B]` best scores.
    pub score: DeviceBuffer<f32>,
    /// `[B, T + 1, C]` backpointers (see `kernel_abi::semicrf::ViterbiParams`).
    pub backptr: DeviceBuffer<u32>,
    /// `[B, T]` segment starts (first `count[b]` entries).
    pub seg_start: DeviceBuffer<u32>,
    /// `[B, T]` segment durations.
    pub seg_dur: DeviceBuffer<u32>,
    /// `[B, T]` segment labels.
    pub seg_label: DeviceBuffer<u32>,
    /// `[B]` segment counts.
    pub seg_count: DeviceBuffer<u32>,
}

impl ViterbiOutput {
    /// Poisoned buffers for `problem`.
    pub fn new(problem: &SemiCrfProblem) -> Result<ViterbiOutput> {
        problem.validate()?;
        let n = problem.buffer_lens();
        Ok(ViterbiOutput {
            problem: *problem,
            score: poisoned(n.viterbi_score)?,
            backptr: poisoned(n.viterbi_backptr)?,
            seg_start: poisoned(n.viterbi_segments)?,
            seg_dur: poisoned(n.viterbi_segments)?,
            seg_label: poisoned(n.viterbi_segments)?,
            seg_count: poisoned(n.viterbi_count)?,
        })
    }

    /// The buffers as a plan takes them.
    pub fn views(&self) -> ViterbiViews<'_> {
        ViterbiViews {
            score: (&self.score).into(),
            backptr: (&self.backptr).into(),
            seg_start: (&self.seg_start).into(),
            seg_dur: (&self.seg_dur).into(),
            seg_label: (&self.seg_label).into(),
            seg_count: (&self.seg_count).into(),
        }
    }

    /// Download the best segmentations (after a synchronize).
    pub fn segmentations(&self) -> Result<Vec<Segmentation>> {
        let (b, t) = (self.problem.batch, self.problem.t);
        let score = download(&self.score)?;
        let (start, dur, label) = (
            download(&self.seg_start)?,
            download(&self.seg_dur)?,
            download(&self.seg_label)?,
        );
        let count = download(&self.seg_count)?;
        (0..b)
            .map(|i| {
                let n = count[i] as usize;
                if n > t {
                    return Err(Error::invalid(
                        "Viterbi output",
                        format!("sequence {i}: {n} segments for {t} positions"),
                    ));
                }
                Ok(Segmentation {
                    score: score[i],
                    segments: (0..n)
                        .map(|j| Segment {
                            start: start[i * t + j] as usize,
                            dur: dur[i * t + j] as usize,
                            label: label[i * t + j] as usize,
                        })
                        .collect(),
                })
            })
            .collect()
    }
}

/// A best segmentation and its score.
#[derive(Clone, Debug, PartialEq)]
pub struct Segmentation {
    /// Score (f32, as computed on the device).
    pub score: f32,
    /// Segments in order of position.
    pub segments: Vec<Segment>,
}

/// Viterbi (asynchronous).
pub fn viterbi_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    out: &mut ViterbiOutput,
) -> Result<()> {
    same_problems(problem, inputs, &[("Viterbi output", &out.problem)])?;
    let plan = problem.plan(&SemiCrfTensors::Viterbi {
        inputs: inputs.views(),
        out: out.views(),
    })?;
    // SAFETY: as in `forward_launch`, the outputs borrowed mutably.
    unsafe { run_on(gpu, stream, &plan) }
}

/// log Z of every sequence (synchronous convenience).
pub fn log_partition(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &SemiCrfInputs,
) -> Result<Vec<f32>> {
    let dev = DeviceInputs::upload(problem, inputs)?;
    let mut state = ForwardState::new(problem)?;
    forward_launch(gpu, stream, problem, &dev, &mut state)?;
    gpu.sync(stream, "semicrf forward")?;
    download(&state.log_z)
}

/// Host copies of everything the backward computes.
#[derive(Clone, Debug)]
pub struct Posterior {
    /// `[B]`.
    pub log_z: Vec<f32>,
    /// `[B, T + 1, C]`.
    pub grad_cumsum: Vec<f32>,
    /// `[K, C]`.
    pub grad_dur: Vec<f32>,
    /// `[C, C]`.
    pub grad_trans: Vec<f32>,
    /// `[B, T, K, C]`, when asked for.
    pub marginals: Option<Vec<f32>>,
}

/// Forward then backward (synchronous convenience).
pub fn posterior(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &SemiCrfInputs,
    marginals: bool,
) -> Result<Posterior> {
    let dev = DeviceInputs::upload(problem, inputs)?;
    let mut state = ForwardState::new(problem)?;
    let mut grads = Gradients::new(problem, marginals)?;
    forward_launch(gpu, stream, problem, &dev, &mut state)?;
    backward_launch(gpu, stream, problem, &dev, &mut state, &mut grads)?;
    gpu.sync(stream, "semicrf forward+backward")?;
    Ok(Posterior {
        log_z: download(&state.log_z)?,
        grad_cumsum: download(&grads.grad_cumsum)?,
        grad_dur: download(&grads.grad_dur)?,
        grad_trans: download(&grads.grad_trans)?,
        marginals: grads.marginals.as_ref().map(download).transpose()?,
    })
}

/// The best segmentation of every sequence (synchronous convenience).
pub fn viterbi(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &SemiCrfInputs,
) -> Result<Vec<Segmentation>> {
    let dev = DeviceInputs::upload(problem, inputs)?;
    let mut out = ViterbiOutput::new(problem)?;
    viterbi_launch(gpu, stream, problem, &dev, &mut out)?;
    gpu.sync(stream, "semicrf viterbi")?;
    out.segmentations()
}

fn same_problem(what: &str, expected: &SemiCrfProblem, got: &SemiCrfProblem) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::shape(
            what,
            format!("{expected:?}"),
            format!("{got:?}"),
        ))
    }
}
