//! Gated linear attention (GLA) forward, chunkwise, after flash-linear-attention's `chunk_gla`:
//!
//! `S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t`, `o_t = scale q_t S_t`
//!
//! per sequence and head, with q, k, g `[B, T, H, Dk]`, v `[B, T, H, Dv]` in bf16, the output o
//! `[B, T, H, Dv]` in bf16, optional initial states `[N, H, Dk, Dv]` f32 and optional final
//! states of the same shape (`N` sequences). [`reference::recurrence`] (f64) is the
//! specification.
//!
//! - `Dk`, `Dv` in {64, 128}, independently; any `T >= 1`.
//! - Variable lengths: with `cu_seqlens = [0, l_0, l_0 + l_1, ..., total]` (fla's convention:
//!   `B = 1`, `T = total`) the sequences are packed along the token axis and each starts from
//!   its own initial state; no padding is needed. Every sequence must have at least one token.
//! - `scale` defaults to `Dk^-0.5`.
//! - Log-decays: `g <= 0` is the model's domain (`exp(g)` is a forget gate). The kernels clamp
//!   `g` below at [`G_FLOOR`] = -20 (`exp(-20) = 2.1e-9`; a token with a stronger decay keeps
//!   2e-9 of its past instead of less): every `g` in `[-20, 0]`, `g = 0` and `g = -20` included,
//!   is used exactly as given and gives finite outputs. **Positive `g`** (growth) is accepted
//!   and computed with the same formulas, but without guarantees: the state grows as
//!   `exp(sum g)` and the kernels' intermediate factors reach `exp(16 max g)`, so large
//!   positive values overflow f32 (the tests cover `0 <= g <= 0.1`).
//!
//! # Algorithm
//! Chunks of 16 tokens (one tensor-core tile). Within a chunk, with `b_t` the cumulative
//! log-decay from the chunk start (inclusive):
//! `o_t = scale (q_t exp(b_t)) S_0 + scale sum_{s <= t} (q_t . k_s exp(b_t - b_s)) v_s`, and the
//! state after the chunk is `exp(b_15) S_0 + sum_s (k_s exp(b_15 - b_s))^T v_s`. The
//! intra-chunk products are split in halves of 8 tokens so that every factor stays within
//! `exp(+-70)` (see the kernel documentation in `gpu-kernels/src/gla`).
//!
//! Long sequences are split into **segments** so that the GPU has enough blocks: the state each
//! segment adds from a zero state is computed first (in parallel), then combined along each
//! sequence (a launch of its own for the baseline; inside each forward item for the pingpong),
//! then every segment computes its outputs from its own initial state. [`reference::chunked`]
//! runs exactly this algorithm on the CPU (same chunking, same bf16 roundings, same segments),
//! to check the algorithm itself against the recurrence.
//!
//! # Problem, plan, run
//! A [`GlaProblem`] (sizes and options, [`GlaProblem::validate`]) is planned on its tensors
//! ([`GlaTensors`]) for a [`Target`] (PTX target and multiprocessor count) into a [`GlaPlan`]
//! ([`GlaProblem::plan`]; pure: the kernels ([`GlaProblem::kernel_for`]: by default the
//! warp-specialized pingpong on sm_90a and the portable baseline elsewhere, or the one
//! [`GlaKernel`] forces), the segments ([`GlaProblem::segments`]), every launch's grid and
//! parameters, the workspace sizes and the pingpong's tensor maps, decided without a GPU), which
//! runs on any executor with its workspace ([`GlaPlan::run`]: a stream, or the CPU emulator of
//! the tests; the workspace's tables hold [`SegmentPlan::table_words`]).
//!
//! On a GPU over `cust` buffers, a [`GlaSession`] is a problem made ready on one GPU: its
//! kernels ([`GlaSession::kernel`]), its segments, their tables uploaded and the workspace
//! allocated once; each [`GlaSession::forward`] plans on the given buffers and runs on a
//! stream. [`forward_sync`] makes a session, runs it and waits.
//!
//! On a framework's tensors ([`crate::raw`]): [`forward_raw`] plans the same way on raw tensors
//! ([`RawGlaTensors`]) with a workspace the caller allocates ([`workspace_lens`]:
//! [`RawGlaWorkspace`]), into which it writes the segment tables itself; [`backward_raw`]
//! likewise for the backward ([`backward_workspace_lens`]).
//!
//! # Backward
//! The gradients are specified by [`reference::backward`] (f64). [`GlaProblem::plan_backward`]
//! plans every gradient on its tensors ([`GlaBackwardTensors`]: the forward's inputs q, k, v, g
//! and initial state, dO, the final states' gradient if any; written dq, dk, dv, dg (f32) and
//! the initial states' gradient) into a [`GlaBackwardPlan`] that runs on any executor with its
//! workspace ([`GlaBackwardWorkspace`]); [`GlaSession::backward`] does it on `cust` buffers
//! with a workspace the session allocates on its first backward and keeps (a training loop's
//! way), [`backward`] through a fresh session, waiting for it. Nothing of the forward is kept beyond its inputs. The launches: the reverse
//! pass (dv, the initial states' gradients, the gradient at every segment's end and every
//! [`G_BLOCK`]-token block end, [`grad_slot`]; [`GlaProblem::plan_reverse_pass`] plans it
//! alone), for split sequences the forward's state pass and combination (the state at every
//! segment's start), then `gla_bwd_dqkg_tc` (dq, dk, dg chunkwise on tensor cores, reading the
//! block gradients; [`DqkgKernel`] and [`GlaProblem::plan_backward_with`] or [`backward_with`]
//! pick the token-by-token `gla_bwd_dqkg` instead), all on the forward baseline's segments.
//! Workspace: the segment table, `grad_slots * heads * dk * dv` f32 of block gradients, and
//! for split sequences `(4 dk dv + dk) * 4` bytes per segment and head.

mod backward;
mod device;
mod plan;
mod problem;
mod raw;
pub mod reference;

pub use crate::attention::Target;
pub use backward::{
    DqkgKernel, GlaBackwardLaunch, GlaBackwardPlan, GlaBackwardSplit, GlaBackwardStep,
    GlaBackwardTensors, GlaBackwardWorkspace, GlaGradients, GlaOutputGrads, GlaReverseTensors,
    backward, backward_with,
};
pub use device::{GlaInputs, GlaOutputs, GlaSession, forward_sync};
pub use kernel_abi::gla::G_FLOOR;
pub use kernel_abi::gla::backward::{G_BLOCK, grad_slot, grad_slots};
pub use plan::{GlaLaunch, GlaPlan, GlaSplitWorkspace, GlaStep, GlaTensors, GlaWorkspace};
pub use problem::{
    GlaKernel, GlaProblem, MIN_AUTO_SEGMENT, PINGPONG_MIN_PAIRS, SegmentPlan, plan_auto,
    plan_segments,
};
pub use raw::{
    GlaOptions, GlaWorkspaceLens, RawGlaBackwardTensors, RawGlaTensors, RawGlaWorkspace,
    backward_raw, backward_workspace_lens, forward_raw, plan_backward_raw, plan_raw,
    workspace_lens,
};
