//! The forward over packed sequences of different lengths (`cu_seqlens`, FlashAttention's
//! `flash_attn_varlen_func`): its parameters and the kernel handles of both paths.

use super::kernels::hopper;
use super::{
    AttentionParams, Dtype, HEAD_DIMS, HopperKernel, TileConfig, hopper_varlen_config_of, mma_smem,
    tile_config_of,
};
use crate::Kernel;

/// Parameters of `attention_fwd_varlen_{bf16,f16}_d{D}` (D of [`super::HEAD_DIMS`]): attention over a batch of
/// packed sequences of different lengths (FlashAttention's `flash_attn_varlen_func`). Sequence
/// `b` owns query rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` of Q and O and key rows
/// `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]` of K and V; the mask of [`AttentionParams`] applies
/// per sequence with that sequence's lengths (causal aligned to its bottom-right corner).
///
/// The fields of `base` keep their meaning with these changes: Q and O are `[total_q, heads_q,
/// D]` and K, V `[total_k, heads_kv, D]` (the batch strides are not used; the sequence strides
/// step between packed rows), `seq_q` and `seq_k` are the maximum lengths (the grid's
/// `num_m_blocks` is `ceil(seq_q / block_m)`), `batch` the number of sequences, and LSE is
/// `[heads_q, total_q]` f32, contiguous (FlashAttention's varlen layout).
///
/// The kernel clamps every offset it reads from `cu_seqlens_*` into `0 ..= total_*` (and each
/// end to at least its start), so no contents can make it access memory outside the tensors;
/// query rows of a sequence past `seq_q` (contents longer than the stated maximum) are not
/// written.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionVarlenParams {
    /// The dense parameters, read as above.
    pub base: AttentionParams,
    /// `[batch + 1]` i32: the first query row of each sequence, then `total_q`.
    pub cu_seqlens_q: *const i32,
    /// `[batch + 1]` i32: the first key row of each sequence, then `total_k`.
    pub cu_seqlens_k: *const i32,
    /// Query rows of Q and O (and the row stride of LSE).
    pub total_q: u32,
    /// Key rows of K and V.
    pub total_k: u32,
}

/// An `mma.sync` kernel over packed sequences ([`AttentionVarlenParams`]): its handle and what it
/// was compiled for (the default tiles of its head dimension).
pub struct MmaVarlenKernel {
    /// The handle; launch it with shape [`MmaVarlenKernel::tiles`].
    pub kernel: Kernel<AttentionVarlenParams, TileConfig>,
    /// Element type.
    pub dtype: Dtype,
    /// Tile configuration ([`tile_config`] of its head dimension).
    pub tiles: TileConfig,
    /// Whether it applies the softcap and sinks of [`super::LogitOptions`].
    pub capsink: bool,
}

const fn mma_varlen(name: &'static str, dtype: Dtype, head_dim: u32) -> MmaVarlenKernel {
    let tiles = tile_config_of(head_dim);
    MmaVarlenKernel {
        kernel: Kernel::new(name, tiles.threads(), tiles.blocks_per_sm, mma_smem),
        dtype,
        tiles,
        capsink: false,
    }
}

const fn mma_varlen_capsink(name: &'static str, dtype: Dtype, head_dim: u32) -> MmaVarlenKernel {
    MmaVarlenKernel {
        capsink: true,
        ..mma_varlen(name, dtype, head_dim)
    }
}

/// [`MMA_VARLEN_KERNELS`] from the head dimensions' tokens.
macro_rules! mma_varlen_table {
    ($($d:literal),*) => {
        [
            $(mma_varlen(concat!("attention_fwd_varlen_bf16_d", $d), Dtype::Bf16, $d),)*
            $(mma_varlen(concat!("attention_fwd_varlen_f16_d", $d), Dtype::F16, $d),)*
            $(mma_varlen_capsink(
                concat!("attention_fwd_varlen_capsink_bf16_d", $d),
                Dtype::Bf16,
                $d,
            ),)*
            $(mma_varlen_capsink(
                concat!("attention_fwd_varlen_capsink_f16_d", $d),
                Dtype::F16,
                $d,
            ),)*
        ]
    };
}

/// The `mma.sync` kernels over packed sequences: the default tiles for each dtype and head
/// dimension, then the `capsink` kernels.
pub const MMA_VARLEN_KERNELS: [MmaVarlenKernel; 4 * HEAD_DIMS.len()] =
    crate::with_attention_head_dims!(mma_varlen_table!());

/// The `mma.sync` kernel over packed sequences for `dtype` and head dimension `head_dim`, the
/// `capsink` one (softcap and sinks) if `capsink`.
pub fn mma_varlen_kernel(
    dtype: Dtype,
    head_dim: u32,
    capsink: bool,
) -> Option<&'static MmaVarlenKernel> {
    const ALL: &[MmaVarlenKernel] = &MMA_VARLEN_KERNELS;
    ALL.iter()
        .find(|k| k.dtype == dtype && k.tiles.head_dim == head_dim && k.capsink == capsink)
}

/// The `mma.sync` kernels over packed sequences of the pairs of [`super::VALUE_DIMS`] (V and O
/// of their own head dimension): bf16, f16.
pub const MMA_VARLEN_VALUE_DIM_KERNELS: [MmaVarlenKernel; 2 * super::VALUE_DIMS.len()] = [
    mma_varlen_value("attention_fwd_varlen_bf16_d192_v128", Dtype::Bf16, 192, 128),
    mma_varlen_value("attention_fwd_varlen_f16_d192_v128", Dtype::F16, 192, 128),
];

const fn mma_varlen_value(name: &'static str, dtype: Dtype, d: u32, dv: u32) -> MmaVarlenKernel {
    let tiles = super::mma_value_config_of(d, dv);
    MmaVarlenKernel {
        kernel: Kernel::new(name, tiles.threads(), tiles.blocks_per_sm, mma_smem),
        dtype,
        tiles,
        capsink: false,
    }
}

/// The `mma.sync` kernel over packed sequences of the pair `(head_dim, value_dim)` for `dtype`.
pub fn mma_varlen_value_dim_kernel(
    dtype: Dtype,
    head_dim: u32,
    value_dim: u32,
) -> Option<&'static MmaVarlenKernel> {
    const ALL: &[MmaVarlenKernel] = &MMA_VARLEN_VALUE_DIM_KERNELS;
    ALL.iter().find(|k| {
        k.dtype == dtype && k.tiles.head_dim == head_dim && k.tiles.value_dim == value_dim
    })
}

/// A Hopper kernel over packed sequences (the packed configuration of its head dimension,
/// [`hopper_varlen_config`](super::hopper_varlen_config)).
const fn hopper_varlen(name: &'static str, dtype: Dtype, d: u32) -> HopperKernel {
    HopperKernel {
        varlen: true,
        ..hopper(name, dtype, hopper_varlen_config_of(d), None)
    }
}

/// A Hopper `capsink` kernel over packed sequences.
const fn hopper_varlen_capsink(name: &'static str, dtype: Dtype, d: u32) -> HopperKernel {
    HopperKernel {
        capsink: true,
        ..hopper_varlen(name, dtype, d)
    }
}

/// [`HOPPER_VARLEN_KERNELS`] from the head dimensions' tokens.
macro_rules! hopper_varlen_table {
    ($($d:literal),*) => {
        [
            $(hopper_varlen(concat!("attention_fwd_hopper_varlen_bf16_d", $d), Dtype::Bf16, $d),)*
            $(hopper_varlen(concat!("attention_fwd_hopper_varlen_f16_d", $d), Dtype::F16, $d),)*
            $(hopper_varlen_capsink(
                concat!("attention_fwd_hopper_varlen_capsink_bf16_d", $d),
                Dtype::Bf16,
                $d,
            ),)*
            $(hopper_varlen_capsink(
                concat!("attention_fwd_hopper_varlen_capsink_f16_d", $d),
                Dtype::F16,
                $d,
            ),)*
        ]
    };
}

/// The Hopper kernels over packed sequences ([`super::HopperParams`] with `cu_seqlens_*`): the
/// default configuration for each dtype and head dimension, then the `capsink` kernels.
pub const HOPPER_VARLEN_KERNELS: [HopperKernel; 4 * HEAD_DIMS.len()] =
    crate::with_attention_head_dims!(hopper_varlen_table!());

/// The Hopper kernel over packed sequences for `dtype` and head dimension `head_dim`, the
/// `capsink` one (softcap and sinks) if `capsink`.
pub fn hopper_varlen_kernel(
    dtype: Dtype,
    head_dim: u32,
    capsink: bool,
) -> Option<&'static HopperKernel> {
    const ALL: &[HopperKernel] = &HOPPER_VARLEN_KERNELS;
    ALL.iter()
        .find(|k| k.dtype == dtype && k.cfg.head_dim == head_dim && k.capsink == capsink)
}

/// The first query slot of packed sequence `b` starting at query row `start` in the Hopper
/// kernels over packed sequences: `floor(start / block_m) + b`. Non-decreasing in `b` for
/// non-decreasing starts, it leaves each sequence enough slots for its query blocks
/// (`ceil(len / block_m)`) wherever it starts, and at most one more.
pub const fn hopper_varlen_first_slot(start: u32, b: u32) -> u32 {
    start / super::HOPPER_BLOCK_M + b
}

/// Query slots per head of the Hopper kernels over packed sequences
/// ([`super::HopperParams::num_m_blocks`]): the first slot past the last sequence,
/// `floor(total_q / block_m) + batch` ([`hopper_varlen_first_slot`]).
pub const fn hopper_varlen_slots(total_q: u32, batch: u32) -> u32 {
    hopper_varlen_first_slot(total_q, batch)
}
