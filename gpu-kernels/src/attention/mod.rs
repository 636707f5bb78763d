//! Fused attention forward: O = softmax(Q K^T scale, masked) V and the LSE of every row, for
//! bf16/f16 inputs, with grouped-query heads and a bottom-right-aligned window (causal
//! included). Two kernels, one semantics ([`kernel_abi::attention::AttentionParams`] documents
//! the masking and the outputs):
//!
//! - [`mma`]: the portable kernel, FlashAttention-2 style on `mma.sync` tensor cores (any GPU of
//!   compute capability >= 8.0; also compiled for the CPU by the emulator);
//! - `hopper` (sm_90a only): TMA, mbarrier rings, `wgmma` and warp specialization (the role
//!   split with its barrier protocol; the producer, the consumers' main loops, the epilogue,
//!   the named barriers, the tile scheduler, and the mask and softmax on `wgmma` accumulators,
//!   in files of their own).
//!
//! Shared by both: [`elem`] (the bf16/f16 element types), [`mask`] (which keys a row may
//! attend), [`softmax`] (the online softmax in base 2, its folded and lazy modes, NaN safety),
//! [`logits`] (the softcap and sinks of the `capsink` kernels).
//!
//! [`backward`]: the gradients on the `mma.sync` path (preprocess, dK/dV with dQ by atomics or
//! a deterministic dQ kernel, dQ conversion), with the forward's mask and element types, on
//! dense batches and on packed sequences (the same bodies on either layout); `hopper_bwd`
//! (sm_90a only): the dK/dV and dQ kernels on TMA and `wgmma`, which take the `mma.sync` ones'
//! place on Hopper GPUs.
//!
//! [`decode`]: one decode step over a paged KV cache, its context split over blocks and the
//! splits merged (flash-decoding), on `mma.sync`.

pub mod backward;
pub mod decode;
pub mod elem;
#[cfg(target_feature = "sm_90a")]
pub mod hopper;
#[cfg(target_feature = "sm_90a")]
pub mod hopper_bwd;
pub mod logits;
pub mod mask;
pub mod mma;
pub mod seq;
pub mod softmax;

/// The kernels of this family, for the CPU emulator (`crate::emu`).
#[cfg(not(target_arch = "nvptx64"))]
pub use mma::{EMU_KERNELS, VARLEN_EMU_KERNELS};
