//! Attention forward: `O = softmax(scale Q K^T + mask) V`, plus the row log-sum-exp.
//!
//! - Q `[batch, seq_q, heads_q, D]`, K and V `[batch, seq_k, heads_kv, D]` in bf16 or f16, any
//!   strides with the head dimension contiguous (so views into a packed QKV tensor work); O
//!   `[batch, seq_q, heads_q, D]` in the input type, LSE `[batch, heads_q, seq_q]` f32
//!   (natural log).
//! - D any multiple of 16 from 32 to 256 ([`HEAD_DIMS`], the backward too); V and O may have a
//!   head dimension of their own where the pair has kernels ([`VALUE_DIMS`]: 192 / 128,
//!   [`AttentionProblem::value_dim`]; the backward on the Hopper kernels only);
//!   grouped-query attention with `heads_q` a multiple of `heads_kv`.
//! - `scale` defaults to `1 / sqrt(D)`.
//! - Masking follows FlashAttention >= 2.1: with `seq_q != seq_k` the causal diagonal is
//!   aligned to the **bottom-right** corner, i.e. query `i` may attend key `j` iff
//!   `j <= i + seq_k - seq_q`. A sliding window `(left, right)` allows
//!   `i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right`; causal is `right = 0`.
//!   A row with no allowed key (possible when `seq_q > seq_k` under causal masking, or with a
//!   window) gets `O = 0` and `LSE = -inf`, never NaN.
//! - Softmax and accumulation in f32.
//!
//! The family's three steps: an [`AttentionProblem`] (validated sizes and options) is planned
//! for its tensors and a [`Target`] into an [`AttentionPlan`] (pure: the path, the kernel, its
//! grid and parameters, the tensor maps as descriptions; no GPU needed), which runs on any
//! executor ([`AttentionPlan::run`]). [`forward`] does the three on `cust` buffers;
//! [`forward_raw`] on tensors the library does not own (a framework's, by address, shape and
//! strides, on its stream: [`crate::raw`]), and [`backward_raw`] the backward on them.
//!
//! Packed sequences of different lengths (FlashAttention's varlen interface, `cu_seqlens`):
//! [`AttentionVarlenProblem`], [`forward_varlen`], [`forward_varlen_raw`] (the `mma.sync` path
//! on every GPU; the module `varlen` documents the layouts), and their backward
//! ([`AttentionVarlenProblem::plan_backward`], [`backward_varlen`], [`backward_varlen_raw`]
//! with a workspace of [`backward_varlen_workspace_lens`]).
//!
//! Decoding over a paged KV cache (FlashAttention's `flash_attn_with_kvcache` with a block
//! table; split-KV): [`AttentionDecodeProblem`], [`DecodeTables`], [`decode()`] (the module
//! `decode` documents the layouts); on a framework's tensors [`decode_raw`] (its splits and
//! workspace: [`decode_workspace_len`]). New keys and values are written into the cache first
//! by [`append_kv`] ([`KvAppendProblem`]; [`append_kv_raw`]), as `flash_attn_with_kvcache`'s
//! `k`, `v` do.
//!
//! [`reference`] is the f64 specification; [`naive_same_precision`] computes the same function
//! the way a straightforward implementation in the input precision would (for the tolerance
//! rule of the tests). [`reference::backward`] is the f64 specification of the gradients dQ,
//! dK and dV, computed on the GPU by [`backward()`] ([`backward`] module: the plan and its
//! launches).

mod append;
pub mod backward;
pub mod decode;
mod fp8;
mod plan;
mod problem;
mod raw;
pub mod reference;
mod run;
mod varlen;

pub use append::{KvAppendPlan, KvAppendProblem, KvAppendTensors, append_kv, reference_append};
pub use backward::{
    AttentionBackwardPlan, AttentionBackwardTensors, AttentionVarlenBackwardPlan,
    AttentionVarlenBackwardTensors, BackwardOptions, BackwardPath, BackwardWorkspace,
    BackwardWorkspaceLens, BwdLaunch, VarlenBackwardLaunches, VarlenBwdLaunch, backward,
    backward_varlen, backward_varlen_with_sinks, backward_with_sinks,
};
pub use decode::{
    AttentionDecodePlan, AttentionDecodeProblem, AttentionDecodeTensors, DecodeTables, decode,
    decode_with_sinks, reference_decode, reference_decode_sinks,
};
pub use fp8::{
    E4m3, Fp8Plan, Fp8Scales, Fp8Tensors, dequantize, forward_fp8, naive_fp8, quantize_e4m3,
    reference_fp8,
};
/// The head dimensions the forward (and decoding) accept, and those the backward accepts.
pub use kernel_abi::attention::{HEAD_DIMS, VALUE_DIMS};
pub use plan::{
    AttentionPlan, AttentionTensors, DYNAMIC_GRID_KEY_ELEMS, LONG_KEY_STEPS_KEYS, Target,
};
pub use problem::{
    AttentionElem, AttentionProblem, Dtype, Path, View, contiguous_strides, last_element,
};
pub use raw::{
    AttentionDecodeOptions, AttentionOptions, RawAttentionBackwardTensors,
    RawAttentionDecodeTensors, RawAttentionTensors, RawAttentionVarlenBackwardTensors,
    RawAttentionVarlenTensors, RawBackwardWorkspace, RawFp8Tensors, RawKvAppendTensors,
    append_kv_raw, backward_raw, backward_varlen_raw, backward_varlen_workspace_lens,
    backward_workspace_lens, decode_raw, decode_workspace_len, forward_fp8_raw, forward_raw,
    forward_varlen_raw, fp8_workspace_len_raw, plan_append_raw, plan_backward_raw,
    plan_backward_varlen_raw, plan_decode_raw, plan_fp8_raw, plan_raw, plan_varlen_raw,
};
pub use reference::{
    naive_backward_same_precision, naive_backward_same_precision_sinks,
    naive_backward_varlen_same_precision, naive_backward_varlen_same_precision_sinks,
    naive_same_precision, naive_same_precision_sinks, naive_varlen_same_precision,
    naive_varlen_same_precision_sinks, reference, reference_rows, reference_varlen,
    reference_varlen_with_sinks, reference_with_sinks,
};
pub use run::{forward, forward_variant, forward_with_counter, forward_with_sinks};
pub use varlen::{
    AttentionVarlenPlan, AttentionVarlenProblem, AttentionVarlenTensors, CuSeqlens,
    DeviceCuSeqlens, forward_varlen, forward_varlen_with_sinks,
};

#[cfg(test)]
mod tests;
