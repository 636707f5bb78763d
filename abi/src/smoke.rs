//! Smoke kernels: each proves one group of device-layer primitives on a GPU against a CPU
//! reference (see `gpu-kernels/src/smoke/`).

use crate::{Kernel, KernelDecl, TensorMap, align_up};

// ---------------------------------------------------------------------------------------------
// Block reduction: shared memory, `bar.sync`, warp shuffles.

/// Threads per block of `smoke_block_reduce`.
pub const REDUCE_THREADS: u32 = 256;

/// Parameters of `smoke_block_reduce`: block `b` sums `input[i]` for every `i < n` with
/// `i % (grid * REDUCE_THREADS)` in `[b * REDUCE_THREADS, (b + 1) * REDUCE_THREADS)` (a grid-stride
/// loop) and writes the sum to `partial[b]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReduceParams {
    /// `[n]` f32.
    pub input: *const f32,
    /// `[grid]` f32, one sum per block.
    pub partial: *mut f32,
    /// Number of inputs.
    pub n: u32,
}

/// Dynamic shared memory of `smoke_block_reduce`: one f32 per warp.
pub const fn reduce_smem_bytes() -> usize {
    (REDUCE_THREADS / crate::WARP_SIZE) as usize * 4 + crate::SMEM_ALIGN
}

// ---------------------------------------------------------------------------------------------
// 64x64x64 tile GEMM: cp.async, ldmatrix, mma.sync (bf16 -> f32).

/// Side of the square tiles of `smoke_mma_tile`.
pub const MMA_TILE: u32 = 64;
/// Threads per block of `smoke_mma_tile` (4 warps, 16 rows each).
pub const MMA_THREADS: u32 = 128;
/// Row stride, in elements, of the tiles in shared memory: 64 + 8 padding, so the 8 row
/// addresses of an `ldmatrix` fall into distinct bank groups.
pub const MMA_SMEM_STRIDE: u32 = MMA_TILE + 8;

/// Parameters of `smoke_mma_tile`: `c = a b^T` for one 64x64x64 tile.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MmaTileParams {
    /// `[64 (m), 64 (k)]` bf16 bits, row-major.
    pub a: *const u16,
    /// `[64 (n), 64 (k)]` bf16 bits, row-major (so `c = a b^T`).
    pub b: *const u16,
    /// `[64, 64]` f32, row-major.
    pub c: *mut f32,
}

/// Byte offset of the B tile in `smoke_mma_tile`'s shared memory (A is at 0).
pub const MMA_SMEM_B_OFFSET: usize = (MMA_TILE * MMA_SMEM_STRIDE * 2) as usize;

/// Dynamic shared memory of `smoke_mma_tile`.
pub const fn mma_smem_bytes() -> usize {
    2 * MMA_SMEM_B_OFFSET + crate::SMEM_ALIGN
}

// ---------------------------------------------------------------------------------------------
// TMA: one 2D box into shared memory, completing on an mbarrier.

/// Box of `smoke_tma_load`: columns (innermost, 64 bf16 = 128 bytes, the widest a 128B
/// swizzle allows) and rows.
pub const TMA_BOX_COLS: u32 = 64;
/// Rows of the box of `smoke_tma_load`.
pub const TMA_BOX_ROWS: u32 = 32;
/// Bytes of the box.
pub const TMA_BOX_BYTES: u32 = TMA_BOX_COLS * TMA_BOX_ROWS * 2;
/// Threads per block of `smoke_tma_load`.
pub const TMA_THREADS: u32 = 128;

/// Parameters of `smoke_tma_load`: load the box at `(x, y)` of the tensor of `tmap` into shared
/// memory, then copy the shared-memory bytes, as they lie there, to `out`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TmaLoadParams {
    /// 2D bf16 tensor map with box `[TMA_BOX_ROWS, TMA_BOX_COLS]`.
    pub tmap: TensorMap,
    /// `[TMA_BOX_BYTES / 2]` u16: the raw shared-memory image of the box.
    pub out: *mut u16,
    /// Column coordinate of the box (may be negative or past the end).
    pub x: i32,
    /// Row coordinate of the box.
    pub y: i32,
}

/// Byte offset of the mbarrier in `smoke_tma_load`'s shared memory (the box is at 0).
pub const TMA_SMEM_BAR_OFFSET: usize = TMA_BOX_BYTES as usize;

/// Dynamic shared memory of `smoke_tma_load`.
pub const fn tma_smem_bytes() -> usize {
    TMA_SMEM_BAR_OFFSET + 8 + crate::SMEM_ALIGN
}

// ---------------------------------------------------------------------------------------------
// wgmma: one 64 x N x 64 tile from 128B-swizzled TMA tiles.

/// K extent of `smoke_wgmma_n*` (one 128-byte swizzle row: four k16 steps).
pub const WGMMA_K: u32 = 64;
/// Rows of A (one warpgroup's m64).
pub const WGMMA_M: u32 = 64;
/// Threads per block of `smoke_wgmma_n*` (one warpgroup).
pub const WGMMA_THREADS: u32 = 128;

/// Parameters of `smoke_wgmma_n{64,128,256}`: `c = a b^T` with `a [64, 64]`, `b [N, 64]` (both
/// K-major bf16, loaded by TMA with 128-byte swizzle), `c [64, N]` f32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WgmmaTileParams {
    /// A, box `[64 rows, 64 cols]`, 128B swizzle.
    pub tmap_a: TensorMap,
    /// B, box `[N rows, 64 cols]`, 128B swizzle.
    pub tmap_b: TensorMap,
    /// `[64, N]` f32, row-major.
    pub c: *mut f32,
}

/// Byte offset of the B tile in `smoke_wgmma_n*`'s shared memory (A, 8 KiB, is at 0).
pub const WGMMA_SMEM_B_OFFSET: usize = (WGMMA_M * WGMMA_K * 2) as usize;

/// Byte offset of the mbarrier in `smoke_wgmma_n*`'s shared memory, for a given N.
pub const fn wgmma_smem_bar_offset(n: u32) -> usize {
    WGMMA_SMEM_B_OFFSET + (n * WGMMA_K * 2) as usize
}

/// Dynamic shared memory of `smoke_wgmma_n*`, for a given N.
pub const fn wgmma_smem_bytes(n: u32) -> usize {
    wgmma_smem_bar_offset(n) + 8 + crate::SMEM_ALIGN
}

/// N of `smoke_wgmma_mn`: two 64-column swizzle atoms of B along N.
pub const WGMMA_MN_N: u32 = 128;

/// Parameters of `smoke_wgmma_mn`: `c = a b` with `a [64, 64]` K-major (as above) and
/// `b [64 (k), 128 (n)]` row-major, i.e. **MN-major** (N contiguous), loaded by TMA as two
/// column blocks `[64 k-rows, 64 n]` with 128-byte swizzle and read with `trans-b = 1`. This is
/// the layout of V in attention's `P V`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WgmmaMnParams {
    /// A, box `[64 rows, 64 cols]`, 128B swizzle.
    pub tmap_a: TensorMap,
    /// B `[64, 128]`, box `[64 rows, 64 cols]`, 128B swizzle (loaded at columns 0 and 64).
    pub tmap_b: TensorMap,
    /// `[64, 128]` f32, row-major.
    pub c: *mut f32,
}

/// Bytes of one column block of B in `smoke_wgmma_mn` (64 k-rows of 128 bytes): the
/// descriptor's leading byte offset (distance between swizzle atoms along N).
pub const WGMMA_MN_BLOCK_BYTES: u32 = WGMMA_K * 128;

/// Byte offset of the mbarrier in `smoke_wgmma_mn`'s shared memory.
pub const WGMMA_MN_BAR_OFFSET: usize = WGMMA_SMEM_B_OFFSET + 2 * WGMMA_MN_BLOCK_BYTES as usize;

/// Dynamic shared memory of `smoke_wgmma_mn`.
pub const fn wgmma_mn_smem_bytes() -> usize {
    WGMMA_MN_BAR_OFFSET + 8 + crate::SMEM_ALIGN
}

// ---------------------------------------------------------------------------------------------
// Producer/consumer ping-pong over a 3-stage mbarrier ring.

/// Stages of the ring.
pub const PINGPONG_STAGES: u32 = 3;
/// Rows of one tile (box rows).
pub const PINGPONG_TILE_ROWS: u32 = 64;
/// Columns of one tile (bf16; 128 bytes per row).
pub const PINGPONG_TILE_COLS: u32 = 64;
/// Elements of one tile.
pub const PINGPONG_TILE_ELEMS: u32 = PINGPONG_TILE_ROWS * PINGPONG_TILE_COLS;
/// Bytes of one tile.
pub const PINGPONG_TILE_BYTES: u32 = PINGPONG_TILE_ELEMS * 2;
/// Threads per block: warpgroup 0 produces, warpgroups 1 and 2 consume.
pub const PINGPONG_THREADS: u32 = 3 * crate::WARPGROUP_SIZE;
/// Named barrier of consumer warpgroup `c` (ids 1 and 2); 0 is `sync_threads`'.
pub const PINGPONG_ORDER_BARRIER: u32 = 1;
/// Registers per thread of the producer warpgroup after `setmaxnreg`.
pub const PINGPONG_PRODUCER_REGS: u32 = 40;
/// Registers per thread of the consumer warpgroups after `setmaxnreg`.
pub const PINGPONG_CONSUMER_REGS: u32 = 232;

/// Parameters of `smoke_pingpong`: stream `num_tiles` tiles of `[64, 64]` bf16 (tile `t` is rows
/// `64 t .. 64 t + 64` of the input) through the ring; consumer warpgroup `1 + t % 2` writes
/// `out[t * 4096 + i] = 2 x_i + t` (f32) and `order[t]` = how many tiles entered the ordered
/// section before tile `t`, which must equal `t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PingpongParams {
    /// Input `[num_tiles * 64, 64]` bf16, box `[64, 64]`, no swizzle.
    pub tmap: TensorMap,
    /// `[num_tiles * 4096]` f32.
    pub out: *mut f32,
    /// `[num_tiles]` u32.
    pub order: *mut u32,
    /// One u32, zero before the launch.
    pub counter: *mut u32,
    /// Tiles to stream.
    pub num_tiles: u32,
}

/// Byte offset of the full barriers (then the empty ones) in `smoke_pingpong`'s shared memory;
/// the tiles of the ring are at `s * PINGPONG_TILE_BYTES`.
pub const PINGPONG_SMEM_BARS_OFFSET: usize = (PINGPONG_STAGES * PINGPONG_TILE_BYTES) as usize;

/// Dynamic shared memory of `smoke_pingpong`.
pub const fn pingpong_smem_bytes() -> usize {
    align_up(
        PINGPONG_SMEM_BARS_OFFSET + 2 * 8 * PINGPONG_STAGES as usize,
        16,
    ) + crate::SMEM_ALIGN
}

// ---------------------------------------------------------------------------------------------
// Numerics probes: `ex2.approx.ftz.f32`, `cvt.rn.bf16x2.f32` and `mma.sync` bf16 on chosen
// values (subnormals, operands far apart in magnitude, overflowing rows).

/// Threads (one warp) of `smoke_numerics`.
pub const NUMERICS_THREADS: u32 = 32;

/// Parameters of `smoke_numerics`: for every `i < scalars`, `ex2[i] = ex2.approx.ftz(x[i])` and
/// `bf16[i] = cvt.rn.bf16(x[i])`; for every `m < tiles`, `d_m = c_m + a_m b_m` by one
/// `mma.sync.m16n8k16` bf16 (f32 accumulators).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NumericsParams {
    /// `[scalars]` f32 inputs.
    pub x: *const f32,
    /// `[scalars]` f32 results of `ex2.approx.ftz.f32`.
    pub ex2: *mut f32,
    /// `[scalars]` bf16 bits, results of `cvt.rn.bf16x2.f32` (low half).
    pub bf16: *mut u16,
    /// Number of scalar inputs.
    pub scalars: u32,
    /// Number of mma tiles.
    pub tiles: u32,
    /// `[tiles, 16 (m), 16 (k)]` bf16 bits, row-major.
    pub a: *const u16,
    /// `[tiles, 8 (n), 16 (k)]` bf16 bits (B transposed, as the `.col` operand).
    pub b: *const u16,
    /// `[tiles, 16, 8]` f32 accumulators in, row-major.
    pub c: *const f32,
    /// `[tiles, 16, 8]` f32 results, row-major.
    pub d: *mut f32,
}

// ---------------------------------------------------------------------------------------------
// Handles.

/// `smoke_block_reduce`: grid of one block per partial sum.
pub const SMOKE_BLOCK_REDUCE: Kernel<ReduceParams> =
    Kernel::new("smoke_block_reduce", REDUCE_THREADS, 1, |()| {
        reduce_smem_bytes()
    });
/// `smoke_mma_tile`: one block.
pub const SMOKE_MMA_TILE: Kernel<MmaTileParams> =
    Kernel::new("smoke_mma_tile", MMA_THREADS, 1, |()| mma_smem_bytes());
/// `smoke_tma_load`: one block (sm_90a).
pub const SMOKE_TMA_LOAD: Kernel<TmaLoadParams> =
    Kernel::new("smoke_tma_load", TMA_THREADS, 1, |()| tma_smem_bytes());
/// `smoke_wgmma_n64`: one block (sm_90a).
pub const SMOKE_WGMMA_N64: Kernel<WgmmaTileParams> =
    Kernel::new("smoke_wgmma_n64", WGMMA_THREADS, 1, |()| {
        wgmma_smem_bytes(64)
    });
/// `smoke_wgmma_n128`: one block (sm_90a).
pub const SMOKE_WGMMA_N128: Kernel<WgmmaTileParams> =
    Kernel::new("smoke_wgmma_n128", WGMMA_THREADS, 1, |()| {
        wgmma_smem_bytes(128)
    });
/// `smoke_wgmma_n256`: one block (sm_90a).
pub const SMOKE_WGMMA_N256: Kernel<WgmmaTileParams> =
    Kernel::new("smoke_wgmma_n256", WGMMA_THREADS, 1, |()| {
        wgmma_smem_bytes(256)
    });
/// `smoke_wgmma_mn`: one block (sm_90a).
pub const SMOKE_WGMMA_MN: Kernel<WgmmaMnParams> =
    Kernel::new("smoke_wgmma_mn", WGMMA_THREADS, 1, |()| {
        wgmma_mn_smem_bytes()
    });
/// `smoke_pingpong`: one block (sm_90a).
pub const SMOKE_PINGPONG: Kernel<PingpongParams> =
    Kernel::new("smoke_pingpong", PINGPONG_THREADS, 1, |()| {
        pingpong_smem_bytes()
    });
/// `smoke_numerics`: one block (one warp).
pub const SMOKE_NUMERICS: Kernel<NumericsParams> =
    Kernel::new("smoke_numerics", NUMERICS_THREADS, 1, |()| 0);

/// `negative_block_reduce_no_barrier`: `smoke_block_reduce` without the barrier between the
/// warps' shared-memory stores and warp 0's loads, a negative control of the reliability tests
/// (`gpu-kernels/src/negative.rs`).
pub const NEGATIVE_BLOCK_REDUCE_NO_BARRIER: Kernel<ReduceParams> = Kernel::new(
    "negative_block_reduce_no_barrier",
    REDUCE_THREADS,
    1,
    |()| reduce_smem_bytes(),
);

/// The `smoke_wgmma_n{n}` kernel for `n` in 64, 128, 256.
pub const fn wgmma_tile_kernel(n: u32) -> Option<&'static Kernel<WgmmaTileParams>> {
    match n {
        64 => Some(&SMOKE_WGMMA_N64),
        128 => Some(&SMOKE_WGMMA_N128),
        256 => Some(&SMOKE_WGMMA_N256),
        _ => None,
    }
}

/// The family's kernels.
pub const KERNELS: &[KernelDecl] = &[
    SMOKE_BLOCK_REDUCE.info(),
    SMOKE_MMA_TILE.info(),
    SMOKE_TMA_LOAD.info(),
    SMOKE_WGMMA_N64.info(),
    SMOKE_WGMMA_N128.info(),
    SMOKE_WGMMA_N256.info(),
    SMOKE_WGMMA_MN.info(),
    SMOKE_PINGPONG.info(),
    SMOKE_NUMERICS.info(),
    NEGATIVE_BLOCK_REDUCE_NO_BARRIER.info(),
];
