//! Attention backward: dQ, dK and dV of `O = softmax(scale Q K^T + mask) V` (and of the LSE),
//! as [`super::reference::backward`] specifies them, on the `mma.sync` kernels
//! (`gpu-kernels/src/attention/backward/`; every target, Hopper included, for now: the plan's
//! [`BackwardPath`] names the choice so that a Hopper path can be added).
//!
//! The family's three steps: [`AttentionProblem::plan_backward`](super::AttentionProblem) on
//! [`AttentionBackwardTensors`] and [`BackwardOptions`] gives an [`AttentionBackwardPlan`] (pure:
//! kernels, grids, parameters, workspace sizes), which runs on any executor with a
//! [`BackwardWorkspace`] ([`AttentionBackwardPlan::run`]); [`backward`] does it all on `cust`
//! buffers. Three launches: the preprocess (`delta' = rowsum(dO O) - dLSE`, the dQ accumulator
//! zeroed), the dK/dV kernel over key blocks (dQ added into the f32 accumulator by atomics),
//! the dQ conversion; or, with `deterministic`, the dK/dV kernel without dQ and a dQ kernel
//! over query blocks (bitwise reproducible, no accumulator).
//!
//! Over packed sequences (`cu_seqlens`): [`AttentionVarlenProblem::plan_backward`](
//! super::AttentionVarlenProblem) and [`backward_varlen`], the same kernels' bodies on the
//! packed layout (module `varlen`).

pub(in crate::attention) mod plan;
mod run;
mod varlen;

pub use plan::{
    AttentionBackwardPlan, AttentionBackwardTensors, BackwardLaunches, BackwardOptions,
    BackwardPath, BackwardWorkspace, BackwardWorkspaceLens, BwdLaunch,
};
pub use run::{backward, backward_with_sinks};
pub use varlen::{
    AttentionVarlenBackwardPlan, AttentionVarlenBackwardTensors, VarlenBackwardLaunches,
    VarlenBwdLaunch, backward_varlen, backward_varlen_with_sinks,
};

#[cfg(test)]
mod tests;
