//! The FP8 forward on Hopper (sm_90a): Q, K, V in e4m3 with per-tensor descales, O in bf16,
//! LSE in f32. The Hopper forward's body ([`HopperParams`], [`HopperConfig`] with
//! `elem_bytes = 1`) with `wgmma.m64nNk32.f32.e4m3.e4m3`: S = Q K^T on K-major Q and K as the
//! 16-bit kernels, O += P V with P packed to e4m3 in registers and V read K-major from a
//! transposed copy `V^T` that [`FP8_VT_KERNEL`] writes first (FP8 `wgmma` takes no transposed
//! operand).
//!
//! # The transposed V
//! `V^T` is `[batch, heads_kv, D, seq_pad]` e4m3, contiguous, `seq_pad` = `seq_k` rounded up to
//! [`FP8_VT_GROUP`] (row strides of 16 bytes for TMA; the padding is zeros). Within each group
//! of 16 keys the keys are permuted ([`fp8_vt_key`]): the FP8 A fragment of a k32 slice holds,
//! per thread, k positions `4t .. 4t + 4` and `16 + 4t .. 16 + 4t + 4` (`t` = lane % 4), while
//! the f32 accumulator of S holds columns `2t, 2t + 1, 8 + 2t, 9 + 2t` of each 16; P is packed
//! as it lies, and V's rows follow, so the product sums the same pairs.

use super::{HopperConfig, HopperGrid, HopperParams, Softmax};
use crate::{Kernel, KernelDecl};

/// Head dimensions of the FP8 kernels.
pub const FP8_HEAD_DIMS: [u32; 2] = [128, 256];

/// Keys per permuted group of a `V^T` row, and the multiple `seq_pad` is rounded to.
pub const FP8_VT_GROUP: u32 = 16;

/// Threads per block of [`FP8_VT_KERNEL`].
pub const FP8_VT_THREADS: u32 = 256;

/// The key (within its group of [`FP8_VT_GROUP`]) at position `p` of a `V^T` row: position
/// `4t + i` holds key `2t + (i & 1) + 8 (i >> 1)` (the accumulator's column of the A
/// fragment's k position; module documentation).
#[inline(always)]
pub const fn fp8_vt_key(p: u32) -> u32 {
    let (t, i) = (p / 4, p % 4);
    2 * t + (i & 1) + 8 * (i >> 1)
}

/// The FP8 kernels' configuration for head dimension `d`, if supported: steps of 128 keys (one
/// 128-byte row of `V^T` per head-dimension row), two stages, the intra-warpgroup overlap, the
/// folded softmax rescaling O at every step ([`Softmax::Folded`]: a row's largest P is 1 up to
/// the reference's rounding, exact in e4m3, so a row dominated by one key keeps its accuracy;
/// the lazy rescale, variant "hlazy", is 2.5-6% faster but rounds that P to 3 mantissa bits
/// and doubled the largest error on peaked rows: bench/NOTES.md), the grid of
/// [`HopperGrid::Auto`].
pub const fn fp8_config(d: u32) -> Option<HopperConfig> {
    match d {
        128 | 256 => Some(HopperConfig {
            head_dim: d,
            value_dim: d,
            block_n: 128,
            stages: 2,
            overlap: true,
            pingpong: false,
            softmax: Softmax::Folded,
            grid: HopperGrid::Auto,
            elem_bytes: 1,
        }),
        _ => None,
    }
}

/// [`fp8_config`] of a supported head dimension.
pub const fn fp8_config_of(d: u32) -> HopperConfig {
    match fp8_config(d) {
        Some(c) => c,
        None => panic!("no FP8 kernel for this head dimension"),
    }
}

/// Parameters of [`FP8_VT_KERNEL`]: `V^T` from V (module documentation).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Fp8VtParams {
    /// V `[batch, seq_k, heads_kv, D]` e4m3, D contiguous, strides `v_strides`.
    pub v: *const u8,
    /// `V^T` `[batch, heads_kv, D, seq_pad]` e4m3, contiguous (written).
    pub vt: *mut u8,
    /// Element (byte) strides of V for batch, sequence, head (multiples of 16).
    pub v_strides: [u64; 3],
    /// Keys.
    pub seq_k: u32,
    /// `seq_k` rounded up to [`FP8_VT_GROUP`].
    pub seq_pad: u32,
    /// Key/value heads.
    pub heads_kv: u32,
    /// Head dimension (one of [`FP8_HEAD_DIMS`]).
    pub head_dim: u32,
}

/// Columns (bytes of a row of V) one warp of [`FP8_VT_KERNEL`] transposes: each lane takes
/// 16 columns of its group of 16 keys (a 16 x 16 byte block: 16-byte loads and stores).
pub const FP8_VT_COLUMNS: u32 = 16;

/// The grid of [`FP8_VT_KERNEL`] for `batch`, `heads_kv`, head dimension `d` (one of
/// [`FP8_HEAD_DIMS`]) and `seq_pad` keys: `x` blocks of 32 key groups (one per lane; the
/// lanes of a warp store 512 consecutive bytes of each `V^T` row), `y` the heads, `z` the
/// batch times the blocks of column chunks (each warp of a block one chunk of 16 columns).
#[inline(always)]
pub const fn fp8_vt_grid(batch: u32, heads_kv: u32, d: u32, seq_pad: u32) -> (u32, u32, u32) {
    let groups = seq_pad / FP8_VT_GROUP;
    (
        groups.div_ceil(32),
        heads_kv,
        batch * fp8_vt_chunk_blocks(d),
    )
}

/// Blocks of [`FP8_VT_KERNEL`] along the columns of one head: `D / 16` chunks, one per warp.
#[inline(always)]
pub const fn fp8_vt_chunk_blocks(d: u32) -> u32 {
    (d / FP8_VT_COLUMNS).div_ceil(FP8_VT_THREADS / 32)
}

/// `attention_fwd_hopper_fp8_vt`: V to `V^T` (module documentation). Grid [`fp8_vt_grid`],
/// [`FP8_VT_THREADS`] threads.
pub const FP8_VT_KERNEL: Kernel<Fp8VtParams> =
    Kernel::new("attention_fwd_hopper_fp8_vt", FP8_VT_THREADS, 1, no_smem);

const fn no_smem(_: ()) -> usize {
    0
}

fn fp8_smem(cfg: HopperConfig) -> usize {
    cfg.smem_bytes()
}

/// An FP8 forward kernel: its handle, configuration and tuning variant.
pub struct Fp8Kernel {
    /// The handle; launch it with shape [`Fp8Kernel::cfg`].
    pub kernel: Kernel<HopperParams, HopperConfig>,
    /// Configuration (its head dimension is the kernel's).
    pub cfg: HopperConfig,
    /// `None` for the default configuration ([`fp8_config`]), else the variant's name (the
    /// last part of the entry's name), timed beside it by the benchmark.
    pub variant: Option<&'static str>,
}

const fn fp8(name: &'static str, cfg: HopperConfig, variant: Option<&'static str>) -> Fp8Kernel {
    Fp8Kernel {
        kernel: Kernel::new(name, super::HOPPER_THREADS, 1, fp8_smem),
        cfg,
        variant,
    }
}

/// The FP8 forward kernels: the default of each head dimension of [`FP8_HEAD_DIMS`], then the
/// tuning variants ("hpp", D 128 only: pingpong turns between the consumer warpgroups, so that
/// one's softmax runs under the other's products; at D 256 it spills; "hlazy": the lazy rescale below e4m3's range,
/// [`Softmax::FoldedLazyE4m3`]).
pub const FP8_KERNELS: [Fp8Kernel; 5] = [
    fp8("attention_fwd_hopper_fp8_d128", fp8_config_of(128), None),
    fp8("attention_fwd_hopper_fp8_d256", fp8_config_of(256), None),
    fp8(
        "attention_fwd_hopper_fp8_d128_hpp",
        HopperConfig {
            pingpong: true,
            ..fp8_config_of(128)
        },
        Some("hpp"),
    ),
    fp8(
        "attention_fwd_hopper_fp8_d128_hlazy",
        HopperConfig {
            softmax: Softmax::FoldedLazyE4m3,
            ..fp8_config_of(128)
        },
        Some("hlazy"),
    ),
    fp8(
        "attention_fwd_hopper_fp8_d256_hlazy",
        HopperConfig {
            softmax: Softmax::FoldedLazyE4m3,
            ..fp8_config_of(256)
        },
        Some("hlazy"),
    ),
];

/// The FP8 forward kernel of head dimension `d`: the default (`variant` `None`) or the tuning
/// variant of that name.
pub fn fp8_kernel(d: u32, variant: Option<&str>) -> Option<&'static Fp8Kernel> {
    FP8_KERNELS
        .iter()
        .find(|k| k.cfg.head_dim == d && k.variant == variant)
}

/// Kernels of this module in the family's table.
pub const FP8_KERNEL_COUNT: usize = FP8_KERNELS.len() + 1;

/// The declarations of this module's kernels, for the family's table.
pub(crate) const fn fp8_kernel_decls() -> [KernelDecl; FP8_KERNEL_COUNT] {
    [
        FP8_KERNELS[0].kernel.info(),
        FP8_KERNELS[1].kernel.info(),
        FP8_KERNELS[2].kernel.info(),
        FP8_KERNELS[3].kernel.info(),
        FP8_KERNELS[4].kernel.info(),
        FP8_VT_KERNEL.info(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vt_key_is_a_permutation_matching_the_fragments() {
        let mut seen = [false; 16];
        for p in 0..16 {
            let k = fp8_vt_key(p);
            assert!(k < 16 && !seen[k as usize], "position {p} -> key {k}");
            seen[k as usize] = true;
        }
        // Thread t's A fragment byte i of register 0 (k position 4t + i) is the accumulator
        // element of n8 block i / 2, column 2t + i % 2.
        for t in 0..4 {
            for i in 0..4 {
                assert_eq!(fp8_vt_key(4 * t + i), 8 * (i / 2) + 2 * t + i % 2);
            }
        }
    }

    #[test]
    fn configs_fit_shared_memory_and_the_transpose_grid() {
        for d in FP8_HEAD_DIMS {
            let cfg = fp8_config_of(d);
            assert!(
                cfg.smem_bytes() <= 227 * 1024,
                "D {d}: {} bytes",
                cfg.smem_bytes()
            );
            assert_eq!(cfg.column_blocks() * cfg.atom(), d);
            assert_eq!(cfg.block_n, 128, "one 128-byte V^T row per step");
            // Every warp of a block has a chunk of columns.
            assert_eq!(
                fp8_vt_chunk_blocks(d) * FP8_VT_THREADS / 32 * FP8_VT_COLUMNS,
                d
            );
        }
        assert!(fp8_config(64).is_none() && fp8_kernel(192, None).is_none());
        assert!(fp8_kernel(128, Some("hpp")).is_some_and(|k| k.cfg.pingpong));
    }
}
