//! bf16 GEMM on Hopper: `C [M, N] = A [M, K] B [N, K]^T` (both operands K-major), f32
//! accumulation, bf16 output. TMA loads into a multi-stage mbarrier ring, `wgmma`, one producer
//! and two consumer warpgroups.

use crate::{Kernel, KernelDecl, SMEM_ALIGN, TensorMap, WARPGROUP_SIZE, align_up};

/// Rows of C per block (two consumer warpgroups of 64 rows).
pub const BM: u32 = 128;
/// Columns of C per block (one `wgmma.m64n256` per k16 step and warpgroup).
pub const BN: u32 = 256;
/// K extent of one pipeline stage (one 128-byte swizzle row of bf16).
pub const BK: u32 = 64;
/// Pipeline stages.
pub const STAGES: u32 = 4;
/// Consumer warpgroups.
pub const CONSUMERS: u32 = 2;
/// Threads per block: one producer warpgroup and the consumers.
pub const THREADS: u32 = (1 + CONSUMERS) * WARPGROUP_SIZE;
/// Registers per thread of the producer warpgroup after `setmaxnreg`.
pub const PRODUCER_REGS: u32 = 40;
/// Registers per thread of the consumer warpgroups after `setmaxnreg`.
pub const CONSUMER_REGS: u32 = 232;
/// Tiles of M per group in the block order (blocks of one group share B panels in L2).
pub const GROUP_M: u32 = 8;
/// K, N must be multiples of this (16-byte TMA strides and paired bf16 stores).
pub const DIM_MULTIPLE: u32 = 8;

/// Bytes of the A tile of one stage.
pub const A_STAGE_BYTES: u32 = BM * BK * 2;
/// Bytes of the B tile of one stage.
pub const B_STAGE_BYTES: u32 = BN * BK * 2;
/// Bytes one stage's TMA loads deliver.
pub const STAGE_BYTES: u32 = A_STAGE_BYTES + B_STAGE_BYTES;

/// Offset of stage `s`'s A tile in shared memory (each 1024-aligned).
pub const fn a_offset(s: u32) -> usize {
    (s * STAGE_BYTES) as usize
}

/// Offset of stage `s`'s B tile.
pub const fn b_offset(s: u32) -> usize {
    (s * STAGE_BYTES + A_STAGE_BYTES) as usize
}

/// Offset of the `full` mbarriers (then the `empty` ones), 8 bytes each.
pub const BARRIERS_OFFSET: usize = (STAGES * STAGE_BYTES) as usize;

/// Dynamic shared memory of `gemm_bf16_tn`.
pub const fn smem_bytes() -> usize {
    align_up(BARRIERS_OFFSET + 2 * 8 * STAGES as usize, 16) + SMEM_ALIGN
}

/// `gemm_bf16_tn`: one producer and [`CONSUMERS`] consumer warpgroups, [`smem_bytes`] of
/// dynamic shared memory, on a grid of [`grid_blocks`] blocks.
pub const GEMM_BF16_TN: Kernel<GemmParams> =
    Kernel::new("gemm_bf16_tn", THREADS, 1, |()| smem_bytes());

/// The family's kernels.
pub const KERNELS: &[KernelDecl] = &[GEMM_BF16_TN.info()];

/// Parameters of `gemm_bf16_tn`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GemmParams {
    /// A `[M, K]` bf16, box `[BM rows, BK cols]`, 128-byte swizzle.
    pub tmap_a: TensorMap,
    /// B `[N, K]` bf16, box `[BN rows, BK cols]`, 128-byte swizzle.
    pub tmap_b: TensorMap,
    /// C `[M, N]` bf16, row-major with row stride `ldc` elements.
    pub c: *mut u16,
    /// Rows of A and C.
    pub m: u32,
    /// Rows of B, columns of C (a multiple of 8).
    pub n: u32,
    /// Columns of A and B (a multiple of 8).
    pub k: u32,
    /// Row stride of C in elements.
    pub ldc: u32,
}

/// Number of blocks for an `m x n` output.
pub const fn grid_blocks(m: u32, n: u32) -> u32 {
    m.div_ceil(BM) * n.div_ceil(BN)
}

/// The output tile `(tile_m, tile_n)` of block `pid`, in grouped order: `GROUP_M` consecutive
/// M tiles are walked for each N tile before moving on, so concurrently running blocks share
/// their B panels (and A panels within the group) in L2.
pub const fn tile_of_block(pid: u32, m: u32, n: u32) -> (u32, u32) {
    let tiles_m = m.div_ceil(BM);
    let tiles_n = n.div_ceil(BN);
    let in_group = GROUP_M * tiles_n;
    let group = pid / in_group;
    let first_m = group * GROUP_M;
    let rows = if tiles_m - first_m < GROUP_M {
        tiles_m - first_m
    } else {
        GROUP_M
    };
    let local = pid % in_group;
    (first_m + local % rows, local / rows)
}
