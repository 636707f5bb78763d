//! Semi-Markov CRF (`gpu-kernels/src/semicrf`): forward (log Z), Viterbi, and backward
//! (segment marginals and gradients) with checkpointing; the f64 reference in [`reference`] is
//! the specification (model, conventions and formulas are documented there).
//!
//! The family's three steps: a [`SemiCrfProblem`] (validated sizes and checkpoint interval) is
//! planned for a pass on the tensors' device addresses ([`SemiCrfTensors`]: forward, backward,
//! both, or Viterbi) into a [`SemiCrfPlan`] (pure: every launch with its grid, shared memory
//! and parameters; no GPU needed), which runs on a stream or any executor
//! ([`SemiCrfPlan::run`]). The launchers ([`forward_launch`], [`backward_launch`],
//! [`forward_backward_launch`], [`viterbi_launch`]) do the three on this module's device
//! buffers. On a framework's tensors ([`crate::raw`]): [`forward_raw`], [`backward_raw`] and
//! [`viterbi_raw`], the lengths given on the host and checked before any kernel reads them, the
//! forward's state one f64 tensor ([`state_layout`]).
//!
//! # Use
//! ```text
//! let problem = SemiCrfProblem::new(batch, t, k, c);      // default checkpoint interval
//! let inputs = SemiCrfInputs { cumsum, dur, trans, lengths };
//! let dev = DeviceInputs::upload(&problem, &inputs)?;     // validated here, once
//! let mut state = ForwardState::new(&problem)?;
//! forward_launch(&gpu, &stream, &problem, &dev, &mut state)?;            // log Z
//! let mut grads = Gradients::new(&problem, false)?;
//! backward_launch(&gpu, &stream, &problem, &dev, &mut state, &mut grads)?; // gradients
//! ```
//! or the synchronous [`log_partition`], [`posterior`] and [`viterbi`]; or the steps themselves,
//! on the buffers' views (or any memory of an executor):
//! ```text
//! let plan = problem.plan(&SemiCrfTensors::Forward { inputs: dev.views(), state: state.views() })?;
//! unsafe { plan.run(&OnStream { gpu: &gpu, stream: &stream })? };      // log Z
//! ```
//!
//! # Checkpointing and memory
//! The forward scan keeps the alpha state (the ring of the last K rows and the current alpha
//! row) every `S` positions; the backward runs the reverse scan (beta checkpoints at the same
//! boundaries), then one block per (segment, sequence) recomputes alpha and beta inside its
//! segment, in its own shared memory, and combines them. Device memory:
//!
//! | what | size |
//! |---|---|
//! | inputs | `B (T + 1) C` f32 + `K C + C C` f32 + `B` u32 |
//! | forward state | `B nseg ((2K + 1) C + 2) f64 + B nseg (K C + C C) f64 + 3 B` f64/f32 |
//! | gradients | `B (T + 1) C + K C + C C` f32 (+ `B T K C` f32 marginals if asked for) |
//!
//! with `nseg = T / S + 1`: O(B (T / S) K C) beyond the inputs and outputs, and O(S C + K C +
//! C^2) shared memory per resident block (at most [`kernel_abi::semicrf::SMEM_BUDGET`]). For
//! B = 4, T = 100 000, K = 32, C = 16 the default `S` is 291 (the budget caps `sqrt(T K)` =
//! 1789): 344 segments, 11.5 MB of (f64) checkpoints and 8.5 MB of partial counts (19.9 MB of
//! state), against 25.6 MB for the cumulative scores and 25.6 MB for their gradient
//! ([`SemiCrfProblem::memory`]); 71.1 MB in all for a forward+backward.
//!
//! # Precision
//! The scans run in f64 (state and log-sum-exp), the combination into marginals and gradients
//! in f32 from f64 exponents (see `kernel_abi::semicrf`): log Z is accurate to ~1e-9 relative
//! and every marginal to ~1e-6 relative at any length (T = 100 000 included), so the gradient's
//! identities (`sum_c dlogZ/dS[t, c]` is -1 at 0, +1 at L, 0 between) hold to ~1e-6.

pub mod reference;

mod plan;
mod problem;
mod raw;
mod run;

pub use plan::{GradientViews, InputViews, SemiCrfPlan, SemiCrfTensors, StateViews, ViterbiViews};
pub use problem::{BufferLens, MemoryUse, SemiCrfInputs, SemiCrfProblem, cumulative_scores};
pub use raw::{
    RawSemiCrfGradients, RawSemiCrfInputs, RawViterbiOutputs, SemiCrfStateLayout, backward_raw,
    forward_raw, plan_backward_raw, plan_forward_raw, plan_viterbi_raw, state_layout, viterbi_raw,
};
pub use reference::Segment;
#[cfg(feature = "negative-controls")]
pub(crate) use run::forward_backward_plan;
pub use run::{
    DeviceInputs, ForwardState, Gradients, Posterior, Segmentation, ViterbiOutput, backward_launch,
    forward_backward_launch, forward_launch, log_partition, posterior, viterbi, viterbi_launch,
};
