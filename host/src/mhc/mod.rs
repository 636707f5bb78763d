//! mHC (manifold-constrained hyper-connections, DeepSeek, arXiv 2512.24880): per-token
//! coefficients of `n` residual streams, their applications, and the full backward.
//!
//! # Semantics (the f64 reference in [`reference`] is the specification)
//! Per token, `x~ = x[b, s]` flattened (`K = n C` values, bf16), `M = n^2 + 2 n`:
//! - `r = sqrt(|x~|^2 / K + eps)` (`eps = 0` is the plain `|x~| / sqrt(K)`);
//! - `h~ = x~ phi' / r` with `phi' = diag(gamma) phi` (`phi [K, M]` f32, `gamma [K]` optional);
//! - `H_pre = sigmoid(a_pre h~_pre + b_pre)`, `H_post = 2 sigmoid(a_post h~_post + b_post)`,
//!   `H_res = SinkhornKnopp(exp(a_res h~_res + b_res))` (`t_max` iterations, each a row then a
//!   column normalisation), coefficients in the order pre `[0, n)`, post `[n, 2n)`, res
//!   `[2n, 2n + n^2)` (row-major), for `alpha = (a_pre, a_post, a_res)` and `bias [M]`;
//! - `x_in = H_pre x` (`[B, S, C]`, the layer's input), and, given the layer's output `y`,
//!   `x_next = H_res x + H_post^T y` (`[B, S, n, C]`), both bf16.
//!
//! The backward takes `d_xin`, `d_xnext` (bf16) and produces `dx`, `dy` (bf16), `dphi`,
//! `dgamma`, `dalpha`, `dbias` (f32), through every Sinkhorn iteration.
//!
//! # API
//! The family's three steps: an [`MhcProblem`] (sizes and options, [`MhcProblem::validate`])
//! is planned for the tensors of one pass ([`MhcProblem::plan`] on [`MhcTensors`]: the forward's
//! first half, its second half, or the backward) into an [`MhcPlan`] (pure: typed launches of the
//! kernel handles in `kernel_abi::mhc`, every view checked against the problem), which runs on
//! any [`Exec`] ([`MhcPlan::run`]): a GPU stream, or the CPU emulator of the tests. The splits,
//! grids and scratch sizes the launches share are the problem's [`MhcLayout`]
//! ([`MhcProblem::layout`]).
//!
//! On `cust` buffers: the weights ([`MhcWeights`]), the saved coefficients
//! ([`MhcCoefficients`], written by [`forward_pre`], read by [`forward_post`] and [`backward`]),
//! a scratch [`MhcWorkspace`] and [`MhcGradients`]; every launcher is asynchronous on the given
//! stream.
//!
//! On a framework's tensors (PyTorch's, [`crate::raw`]): [`forward_pre_raw`],
//! [`forward_post_raw`] and [`backward_raw`] take the tensors as described, plan exactly as
//! above and check the memory; the saved coefficients and the scratch are one f32 tensor each
//! ([`MhcProblem::raw_layout`]).
//!
//! Kernels, tiling and the reasons for them: `gpu-kernels/src/mhc/`.

pub mod reference;

mod plan;
mod problem;
mod raw;
mod run;

pub use crate::exec::{DevView, Exec, OnStream};
pub use plan::{
    MhcBackward, MhcForwardPost, MhcForwardPre, MhcLayout, MhcPlan, MhcTensors, RawCoefficients,
    RawGradients, RawScratch, RawWeights,
};
pub use problem::{DEFAULT_EPS, DEFAULT_SINKHORN_ITERS, MhcProblem};
pub use raw::{
    MhcOptions, MhcRawLayout, RawMhcGradients, RawMhcWeights, backward_raw, forward_post_raw,
    forward_pre_raw, plan_backward_raw, plan_forward_post_raw, plan_forward_pre_raw, raw_layout,
};
pub use run::{
    MhcCoefficients, MhcGradients, MhcWeights, MhcWorkspace, backward, forward_post, forward_pre,
};

#[cfg(test)]
mod tests;
