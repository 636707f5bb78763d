//! Attention forward (FlashAttention-2 style, `ldmatrix` + `mma.sync`, `cp.async` pipeline):
//! `O = softmax(scale Q K^T + mask) V` and the row log-sum-exp; the backward's handles in
//! [`backward`].

use crate::kernel::str_eq;
use crate::{Kernel, KernelDecl, SMEM_ALIGN, WARP_SIZE};

pub mod backward;
pub mod decode;
pub mod fp8;
pub mod hopper_bwd;
mod kernels;
mod varlen;

pub(crate) use kernels::mma_smem;
pub use kernels::{
    HOPPER_KERNELS, HOPPER_VALUE_DIM_KERNELS, HopperKernel, KERNELS, MMA_KERNELS,
    MMA_VALUE_DIM_KERNELS, MmaKernel, hopper_capsink_kernel, hopper_kernel,
    hopper_value_dim_kernel, mma_capsink_kernel, mma_kernel, mma_value_dim_kernel,
};
pub use varlen::{
    AttentionVarlenParams, HOPPER_VARLEN_KERNELS, MMA_VARLEN_KERNELS, MMA_VARLEN_VALUE_DIM_KERNELS,
    MmaVarlenKernel, hopper_varlen_first_slot, hopper_varlen_kernel, hopper_varlen_slots,
    mma_varlen_kernel, mma_varlen_value_dim_kernel,
};

/// `$callback!($($args)* 32, 48, .., 256)`: the head dimensions with forward and decode kernels
/// (every multiple of 16 from 32 to 256) as literal tokens, for the macros that declare each
/// dimension's kernels and their handles (the tables here and the kernel crate's entry points),
/// so that the list is written once.
#[macro_export]
macro_rules! with_attention_head_dims {
    ($callback:ident ! ($($args:tt)*)) => {
        $callback! { $($args)* 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256 }
    };
}

macro_rules! dims_array {
    ($($d:literal),*) => {
        [$($d),*]
    };
}

/// Head dimensions with forward and decode kernels ([`with_attention_head_dims!`]).
pub const HEAD_DIMS: [u32; 15] = with_attention_head_dims!(dims_array!());

/// Query rows of one `mma.sync` m16 tile; a warp owns `warp_m_tiles` of them.
pub const M_TILE: u32 = 16;

/// The tile shape for one head dimension: the single table kernel and host share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// Head dimension D of Q and K.
    pub head_dim: u32,
    /// Head dimension of V and O: `head_dim` but in the kernels of the pairs of [`VALUE_DIMS`]
    /// ([`mma_value_config`]).
    pub value_dim: u32,
    /// Query rows per block.
    pub block_m: u32,
    /// Keys per pipeline step.
    pub block_n: u32,
    /// K/V stages of the `cp.async` pipeline.
    pub stages: u32,
    /// m16 tiles of query rows per warp: each K/V fragment a warp loads feeds this many
    /// products, so shared-memory traffic per product falls as it grows (registers permitting).
    pub warp_m_tiles: u32,
    /// Resident blocks per SM the launch bounds ask for (the register cap is 64K / (threads x
    /// this)); shared memory must allow it too.
    pub blocks_per_sm: u32,
    /// Whether each warp keeps its Q fragments in registers for the whole kernel (else it
    /// reloads them from shared memory with `ldmatrix` every step: at D = 256 the registers are
    /// needed for the output accumulator).
    pub q_in_registers: bool,
    /// Whether the products of each k-slice run on fragments loaded one slice ahead (Q and K
    /// fragments of slice `kk + 1`, V fragments of the next column pair, issued before the
    /// `mma`s of the current ones), so `ldmatrix` latency overlaps the tensor cores (costs
    /// registers).
    pub prefetch: bool,
    /// How the online softmax is computed ([`Softmax`]).
    pub softmax: Softmax,
}

/// The online softmax of the `mma.sync` kernels (all exact up to f32 rounding; they differ in
/// instruction count and in the order the dependent work is issued).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Softmax {
    /// The logits are scaled (`s * scale_log2`) before the row maximum, and `p = exp2(s - m)`
    /// row by row: maximum, shuffles, rescale of O, exponentials.
    Scaled,
    /// The scale folded into one FFMA per logit, `p = exp2(fma(s, scale_log2, -m))` with `m` the
    /// rounded `max * scale_log2` (the maximum taken on the raw logits), issued a tile at a
    /// time: the maxima of all the warp's rows (their shuffles interleaved), then every
    /// rescale, then every exponential, then the row sums. The residual of the rounding of `m`
    /// (at most half an ulp) cancels between O, the sums and the LSE; a step where some row's
    /// `|m|` reaches [`HUGE_LOGIT`] (where the residual could overflow `exp2`) takes the
    /// scaled computation instead (a warp vote: the branch is uniform).
    Folded,
    /// [`Softmax::Folded`] with lazy rescaling: the warp keeps its rows' references (and skips
    /// the rescale of O) unless some row's maximum exceeds its reference by more than
    /// [`RESCALE_THRESHOLD`] (`p <= 2^(threshold + 1)` stays far from f32 overflow; the
    /// reference cancels in O and is exact in the LSE).
    FoldedLazy,
    /// [`Softmax::FoldedLazy`] past [`FP8_RESCALE_THRESHOLD`] (a tuning variant of the Hopper
    /// FP8 kernels): every `p <= 2^8`, inside e4m3's range (448), where P is rounded to e4m3 for
    /// O += P V.
    FoldedLazyE4m3,
}

impl Softmax {
    /// The kernels' const-generic code of this mode.
    pub const fn code(self) -> u32 {
        match self {
            Softmax::Scaled => 0,
            Softmax::Folded => 1,
            Softmax::FoldedLazy => 2,
            Softmax::FoldedLazyE4m3 => 3,
        }
    }
}

/// Row maxima (base-2 logits, `|max * scale_log2|`) from which [`Softmax::Folded`] scales the
/// logits before subtracting: below it the rounding residual of the reference is at most 1
/// (so `p <= 2`), above it the residual (up to 2^103 near f32's limit) could overflow or
/// underflow `exp2`.
pub const HUGE_LOGIT: f32 = (1u32 << 24) as f32;

/// Growth of a row maximum (base-2 logits) past its reference that makes
/// [`Softmax::FoldedLazy`] rescale (FlashAttention-4 uses 8).
pub const RESCALE_THRESHOLD: f32 = 8.0;

/// [`RESCALE_THRESHOLD`] of [`Softmax::FoldedLazyE4m3`]: `p <= 2^(7 + 1) = 256 < 448`.
pub const FP8_RESCALE_THRESHOLD: f32 = 7.0;

impl TileConfig {
    /// Warps per block (each owns `warp_m_tiles * 16` query rows).
    pub const fn warps(&self) -> u32 {
        self.block_m / (M_TILE * self.warp_m_tiles)
    }

    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        self.warps() * WARP_SIZE
    }

    /// Bytes of one row of a Q or K tile in shared memory: `D` 16-bit elements plus 16 bytes of
    /// padding, so consecutive rows start 16 bytes apart modulo 128 (distinct bank groups for
    /// the 8 rows of an `ldmatrix` phase and for the 16-byte `cp.async` writes).
    pub const fn row_bytes(&self) -> u32 {
        self.head_dim * 2 + 16
    }

    /// Bytes of one `[rows, D]` tile in shared memory (padded rows).
    pub const fn tile_bytes(&self, rows: u32) -> usize {
        (rows * self.row_bytes()) as usize
    }

    /// Bytes of one row of a V tile (`value_dim` elements, padded as [`TileConfig::row_bytes`]).
    pub const fn v_row_bytes(&self) -> u32 {
        self.value_dim * 2 + 16
    }

    /// Bytes of one `[rows, D_v]` V tile in shared memory (padded rows).
    pub const fn v_tile_bytes(&self, rows: u32) -> usize {
        (rows * self.v_row_bytes()) as usize
    }

    /// Offset of the Q tile (`[block_m, D]`).
    pub const fn q_offset(&self) -> usize {
        0
    }

    /// Offset of stage `s`'s K tile (`[block_n, D]`) where V is as wide as K (`value_dim ==
    /// head_dim`; the pairs of [`VALUE_DIMS`] take [`TileConfig::pair_k_offset`]). Kept apart
    /// so that the kernels' address arithmetic, and their PTX, stays as it was.
    pub const fn k_offset(&self, s: u32) -> usize {
        self.tile_bytes(self.block_m) + 2 * s as usize * self.tile_bytes(self.block_n)
    }

    /// Offset of stage `s`'s V tile (`[block_n, D]`), as [`TileConfig::k_offset`].
    pub const fn v_offset(&self, s: u32) -> usize {
        self.k_offset(s) + self.tile_bytes(self.block_n)
    }

    /// Offset of stage `s`'s K tile for any `value_dim`: each stage a K tile then a V tile of
    /// its own width.
    #[inline(always)]
    pub const fn pair_k_offset(&self, s: u32) -> usize {
        self.tile_bytes(self.block_m)
            + s as usize * (self.tile_bytes(self.block_n) + self.v_tile_bytes(self.block_n))
    }

    /// Offset of stage `s`'s V tile (`[block_n, D_v]`) for any `value_dim`.
    #[inline(always)]
    pub const fn pair_v_offset(&self, s: u32) -> usize {
        self.pair_k_offset(s) + self.tile_bytes(self.block_n)
    }

    /// Dynamic shared memory of the kernel.
    pub const fn smem_bytes(&self) -> usize {
        self.pair_k_offset(self.stages) + SMEM_ALIGN
    }
}

/// The tile configuration for head dimension `d`, if supported: each of [`HEAD_DIMS`] takes the
/// tiles of the next of 64, 128 and 256 (measured there).
#[inline(always)]
pub const fn tile_config(d: u32) -> Option<TileConfig> {
    if !d.is_multiple_of(16) {
        return None;
    }
    match d {
        32..=64 => Some(TileConfig {
            head_dim: d,
            value_dim: d,
            block_m: 128,
            block_n: 64,
            stages: 3,
            warp_m_tiles: 2,
            blocks_per_sm: 2,
            q_in_registers: false,
            prefetch: false,
            softmax: Softmax::Scaled,
        }),
        // Keys in steps of 32: faster than steps of 64 (variant "n64"), which leave ptxas no
        // registers to spare; the folded softmax with lazy rescaling, faster than the scaled
        // softmax (variant "scaled"). Measurements in bench/NOTES.md.
        80..=128 => Some(TileConfig {
            head_dim: d,
            value_dim: d,
            block_m: 128,
            block_n: 32,
            stages: 2,
            warp_m_tiles: 2,
            blocks_per_sm: 2,
            q_in_registers: false,
            prefetch: false,
            softmax: Softmax::FoldedLazy,
        }),
        144..=256 => Some(TileConfig {
            head_dim: d,
            value_dim: d,
            block_m: 128,
            block_n: 64,
            stages: 2,
            warp_m_tiles: 1,
            blocks_per_sm: 1,
            q_in_registers: false,
            prefetch: false,
            softmax: Softmax::Scaled,
        }),
        _ => None,
    }
}

/// Alternative tile configurations, compiled for bf16 as `attention_fwd_bf16_d{D}_{name}` and
/// timed beside the defaults by the benchmark (`impl` = `ours-{name}`), so that the table of
/// [`tile_config`] is chosen from measurements.
pub const TUNING_VARIANTS: [(&str, TileConfig); 7] = [
    // The first design: one m16 tile per warp, 8 warps, Q in registers, one block per SM.
    (
        "mt1",
        TileConfig {
            head_dim: 128,
            value_dim: 128,
            block_m: 128,
            block_n: 64,
            stages: 3,
            warp_m_tiles: 1,
            blocks_per_sm: 1,
            q_in_registers: true,
            prefetch: false,
            softmax: Softmax::Scaled,
        },
    ),
    // The previous default: keys in steps of 64 (255 registers and a spill).
    ("n64", TUNING_VARIANTS_N64),
    // Steps of 64 with fragments loaded one k-slice ahead (faster than "n64"; with steps of 32
    // the prefetch is slower than without).
    (
        "n64pf",
        TileConfig {
            head_dim: 128,
            value_dim: 128,
            block_m: 128,
            block_n: 64,
            stages: 2,
            warp_m_tiles: 2,
            blocks_per_sm: 2,
            q_in_registers: false,
            prefetch: true,
            softmax: Softmax::Scaled,
        },
    ),
    (
        "n32",
        TileConfig {
            head_dim: 256,
            value_dim: 256,
            block_m: 128,
            block_n: 32,
            stages: 2,
            warp_m_tiles: 1,
            blocks_per_sm: 1,
            q_in_registers: false,
            prefetch: false,
            softmax: Softmax::Scaled,
        },
    ),
    // The D = 128 default tiles with the other softmax modes of [`Softmax`] (`FoldedLazy`, the
    // default, is the fastest of the three).
    ("ffma", with_softmax(tile_config_of(128), Softmax::Folded)),
    ("scaled", with_softmax(tile_config_of(128), Softmax::Scaled)),
    // Steps of 64 with lazy rescaling: half the steps' fixed costs (barrier, Q fragments, maxima
    // and votes), where the rescale of O no longer doubles the softmax work per step.
    (
        "n64lazy",
        with_softmax(TUNING_VARIANTS_N64, Softmax::FoldedLazy),
    ),
];

/// Variant "n64": the D = 128 default with keys in steps of 64.
const TUNING_VARIANTS_N64: TileConfig = TileConfig {
    block_n: 64,
    softmax: Softmax::Scaled,
    ..tile_config_of(128)
};

/// `cfg` with another softmax mode.
const fn with_softmax(cfg: TileConfig, softmax: Softmax) -> TileConfig {
    TileConfig { softmax, ..cfg }
}

/// The tuning variant `name` for head dimension `d`.
pub fn tuning_variant(d: u32, name: &str) -> Option<TileConfig> {
    TUNING_VARIANTS
        .iter()
        .find(|(n, c)| *n == name && c.head_dim == d)
        .map(|(_, c)| *c)
}

/// The `mma.sync` tile configuration of the pair `(d, dv)` of [`VALUE_DIMS`], if it is one: the
/// tiles of D_v's head dimension (its O accumulators and V tiles) with Q and K of `d`.
#[inline(always)]
pub const fn mma_value_config(d: u32, dv: u32) -> Option<TileConfig> {
    if !is_value_pair(d, dv) {
        return None;
    }
    Some(TileConfig {
        head_dim: d,
        value_dim: dv,
        ..tile_config_of(dv)
    })
}

/// [`mma_value_config`] of a supported pair (compile-time use in kernels).
#[inline(always)]
pub const fn mma_value_config_of(d: u32, dv: u32) -> TileConfig {
    match mma_value_config(d, dv) {
        Some(c) => c,
        None => panic!("unsupported pair of head dimensions"),
    }
}

/// [`tile_config`] for a head dimension known to be supported (compile-time use in kernels).
#[inline(always)]
pub const fn tile_config_of(d: u32) -> TileConfig {
    match tile_config(d) {
        Some(c) => c,
        None => panic!("unsupported head dimension"),
    }
}

/// A window bound that does not restrict (`window_left`/`window_right`).
pub const UNBOUNDED: i32 = -1;

/// The logit options of the `capsink` kernels (`attention_fwd_capsink_*`,
/// `attention_fwd_varlen_capsink_*`, `attention_fwd_hopper_capsink_*`,
/// `attention_decode_capsink_*`); the other kernels ignore them.
///
/// - **Softcap** (Gemma 2): the logit `l = scale q.k` becomes `softcap tanh(l / softcap)`. The
///   kernel computes `tanh(q.k softcap_scale)` with `softcap_scale = scale / softcap`, and the
///   parameters' `scale_log2` is then `softcap log2(e)`, so the softmax that follows is
///   unchanged. 0 turns it off.
/// - **Sinks** (gpt-oss): one logit per query head that joins every row's softmax (in the units
///   of the final logits, natural log) and contributes no value: `O_i = sum_j e^{l_ij} v_j /
///   (e^{sink_h} + sum_j e^{l_ij})` and `LSE_i = log(e^{sink_h} + sum_j e^{l_ij})`. A row with
///   no allowed key gets `O = 0` and `LSE = sink_h`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LogitOptions {
    /// `scale / softcap`, or 0 for no softcap.
    pub softcap_scale: f32,
    /// `[heads_q]` f32 sink logits, or null for none.
    pub sinks: *const f32,
}

impl LogitOptions {
    /// No softcap, no sinks.
    pub const NONE: LogitOptions = LogitOptions {
        softcap_scale: 0.0,
        sinks: core::ptr::null(),
    };
}

/// Parameters of `attention_fwd_{bf16,f16}_d{D}` (D of [`HEAD_DIMS`]).
///
/// Masking (FlashAttention >= 2.1 convention, aligned to the bottom-right when
/// `seq_q != seq_k`): query `i` may attend key `j` iff `j < seq_k`,
/// `j >= i + (seq_k - seq_q) - window_left` (when `window_left >= 0`) and
/// `j <= i + (seq_k - seq_q) + window_right` (when `window_right >= 0`). Causal masking is
/// `window_right = 0`. A row with no allowed key gets `O = 0` and `LSE = -inf`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionParams {
    /// Q `[batch, seq_q, heads_q, D]` (16-bit elements), strides `q_strides`.
    pub q: *const u16,
    /// K `[batch, seq_k, heads_kv, D]`.
    pub k: *const u16,
    /// V `[batch, seq_k, heads_kv, D]`.
    pub v: *const u16,
    /// O `[batch, seq_q, heads_q, D]`.
    pub o: *mut u16,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous (natural log).
    pub lse: *mut f32,
    /// Element strides of Q for batch, sequence, head (the head dimension is contiguous).
    pub q_strides: [u64; 3],
    /// Element strides of K.
    pub k_strides: [u64; 3],
    /// Element strides of V.
    pub v_strides: [u64; 3],
    /// Element strides of O.
    pub o_strides: [u64; 3],
    /// Batch size.
    pub batch: u32,
    /// Query length.
    pub seq_q: u32,
    /// Key/value length.
    pub seq_k: u32,
    /// Query heads (a multiple of `heads_kv`).
    pub heads_q: u32,
    /// Key/value heads.
    pub heads_kv: u32,
    /// Softmax scale times log2(e) (the kernel works in base 2).
    pub scale_log2: f32,
    /// Left window size, or [`UNBOUNDED`].
    pub window_left: i32,
    /// Right window size (0 for causal), or [`UNBOUNDED`].
    pub window_right: i32,
    /// Query blocks per (batch, head): `ceil(seq_q / block_m)`.
    pub num_m_blocks: u32,
    /// 1 to walk query blocks from the last (under causal masking the last rows see the most
    /// keys, so the longest blocks start first), 0 otherwise.
    pub reverse_m: u32,
    /// Softcap and sinks (read by the `capsink` kernels only).
    pub logits: LogitOptions,
}

// ---------------------------------------------------------------------------------------------
// Hopper path (sm_90a): TMA, mbarrier ring, wgmma, warp specialization.

/// Query rows per consumer warpgroup (one `wgmma` m64 tile).
pub const HOPPER_WG_ROWS: u32 = 64;
/// Consumer warpgroups per block.
pub const HOPPER_CONSUMERS: u32 = 2;
/// Query rows per block.
pub const HOPPER_BLOCK_M: u32 = HOPPER_WG_ROWS * HOPPER_CONSUMERS;
/// Threads per block: one producer warpgroup and the consumers.
pub const HOPPER_THREADS: u32 = (1 + HOPPER_CONSUMERS) * crate::WARPGROUP_SIZE;
/// Registers per thread of the producer warpgroup after `setmaxnreg`.
pub const HOPPER_PRODUCER_REGS: u32 = 24;
/// Registers per thread of the consumer warpgroups after `setmaxnreg`.
pub const HOPPER_CONSUMER_REGS: u32 = 240;
/// Elements along D of one TMA box / 128-byte swizzle atom.
pub const HOPPER_ATOM: u32 = 64;
/// [`HOPPER_ATOM`] of the FP8 kernels' one-byte elements.
pub const HOPPER_FP8_ATOM: u32 = 128;
/// First of the [`HOPPER_CONSUMERS`] named barriers of the pingpong schedule (id 0 is the
/// block barrier).
pub const HOPPER_SCHED_BARRIER: u32 = 1;

/// The Hopper path's tile shape for one head dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperConfig {
    /// Head dimension D of Q and K (the contraction of `S = Q K^T`).
    pub head_dim: u32,
    /// Head dimension of V and O (the N of `O += P V`): `head_dim` but in the kernels of
    /// [`VALUE_DIMS`].
    pub value_dim: u32,
    /// Keys per pipeline step (the N of `S = Q K^T`).
    pub block_n: u32,
    /// Stages of the K/V ring.
    pub stages: u32,
    /// Intra-warpgroup overlap (FlashAttention-3): issue S of step `i` with P V of step `i - 1`
    /// and run the softmax while P V is in flight. Faster at every head dimension once the key
    /// steps leave the registers for it (at D = 256 steps of 80, not 64: bench/NOTES.md).
    pub overlap: bool,
    /// Pingpong between the consumer warpgroups (FlashAttention-3): named barriers
    /// `HOPPER_SCHED_BARRIER + c` make the two issue their `wgmma` batches in turns, so that
    /// one's softmax runs while the other's products occupy the tensor cores.
    pub pingpong: bool,
    /// The softmax mode ([`Softmax`]; the folded modes as in the `mma.sync` path).
    pub softmax: Softmax,
    /// The grid ([`HopperGrid`]).
    pub grid: HopperGrid,
    /// Bytes per element of Q, K and V: 2 (bf16, f16) or 1 (e4m3, the FP8 kernels of
    /// [`fp8`]).
    pub elem_bytes: u32,
}

/// How many blocks a Hopper launch has; every block walks the tiles `b, b + grid, ...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HopperGrid {
    /// One block per multiprocessor (persistent) when every tile has the same steps (no
    /// causal mask, no window); else one block per tile, where the hardware's block scheduler
    /// balances tiles of unequal length (the static round-robin of a persistent grid is much
    /// slower on long causal problems; bench/NOTES.md).
    Auto,
    /// One block per multiprocessor (at most one per tile), whatever the mask.
    PerSm,
    /// One block per tile (no persistence).
    PerTile,
    /// This many blocks at most (tests: many tiles per block).
    Blocks(u32),
}

impl HopperConfig {
    /// 128-byte column blocks along D (`D / 64` of 16-bit elements, `D / 128` of FP8 ones):
    /// tiles are stored as this many `[rows, 128 bytes]` blocks, each a stack of 128-byte
    /// swizzled rows (what TMA writes with a 128-byte-wide box).
    #[inline(always)]
    pub const fn column_blocks(&self) -> u32 {
        self.head_dim.div_ceil(self.atom())
    }

    /// Elements along D of one column block (one TMA box, one 128-byte swizzle atom).
    #[inline(always)]
    pub const fn atom(&self) -> u32 {
        if self.elem_bytes == 1 {
            HOPPER_FP8_ATOM
        } else {
            HOPPER_ATOM
        }
    }

    /// Bytes of one column block of `rows` rows.
    #[inline(always)]
    pub const fn block_bytes(&self, rows: u32) -> u32 {
        rows * 128
    }

    /// Offset of the Q tile (`column_blocks` blocks of `HOPPER_BLOCK_M` rows).
    #[inline(always)]
    pub const fn q_offset(&self) -> usize {
        0
    }

    /// 128-byte column blocks of a V tile (as [`HopperConfig::column_blocks`], along
    /// `value_dim`).
    #[inline(always)]
    pub const fn value_column_blocks(&self) -> u32 {
        self.value_dim.div_ceil(self.atom())
    }

    /// Offset of stage `s`'s K tile (`column_blocks` blocks of `block_n` rows).
    #[inline(always)]
    pub const fn k_offset(&self, s: u32) -> usize {
        (self.column_blocks() * self.block_bytes(HOPPER_BLOCK_M)
            + s * (self.tile_bytes() + self.v_tile_bytes())) as usize
    }

    /// Offset of stage `s`'s V tile (`value_column_blocks` blocks of `block_n` rows).
    #[inline(always)]
    pub const fn v_offset(&self, s: u32) -> usize {
        self.k_offset(s) + self.tile_bytes() as usize
    }

    /// Bytes one K tile's TMA loads deliver.
    #[inline(always)]
    pub const fn tile_bytes(&self) -> u32 {
        self.column_blocks() * self.block_bytes(self.block_n)
    }

    /// Bytes one V tile's TMA loads deliver.
    #[inline(always)]
    pub const fn v_tile_bytes(&self) -> u32 {
        self.value_column_blocks() * self.block_bytes(self.block_n)
    }

    /// Bytes the Q loads deliver.
    #[inline(always)]
    pub const fn q_bytes(&self) -> u32 {
        self.column_blocks() * self.block_bytes(HOPPER_BLOCK_M)
    }

    /// Offset of the mbarriers: `q_full`, then `full_k`, `full_v`, `empty_k`, `empty_v` (each
    /// `stages` barriers), then `q_empty`.
    #[inline(always)]
    pub const fn barriers_offset(&self) -> usize {
        self.k_offset(self.stages)
    }

    /// Number of mbarriers.
    #[inline(always)]
    pub const fn barriers(&self) -> u32 {
        2 + 4 * self.stages
    }

    /// Dynamic shared memory of the kernel.
    #[inline(always)]
    pub const fn smem_bytes(&self) -> usize {
        crate::align_up(self.barriers_offset() + 8 * self.barriers() as usize, 16) + SMEM_ALIGN
    }
}

/// The Hopper tile configuration for head dimension `d`, if supported. Chosen from
/// measurements (bench/NOTES.md, "Hopper path" and "Every multiple of 16"): the folded lazy
/// softmax at every head dimension; no pingpong turns (slower at D = 64 and 128, no faster at
/// D = 256); the intra-warpgroup overlap everywhere, with keys in steps of 128 up to D = 128, of
/// 112 up to 192 and of 80 above (FlashAttention-3's tiles: the most the shared memory of three
/// and four column blocks allows with two stages; faster than steps of 64 without the overlap,
/// variant "h64"); the grid of [`HopperGrid::Auto`]. A head dimension that is not a multiple of 64 fills its
/// last column block with zeros (TMA's boxes reach past D): S = Q K^T runs over the `D / 16`
/// k-slices of D, O += P V with N = D.
#[inline(always)]
pub const fn hopper_config(d: u32) -> Option<HopperConfig> {
    let base = HopperConfig {
        head_dim: d,
        value_dim: d,
        block_n: 128,
        stages: 2,
        overlap: true,
        pingpong: false,
        softmax: Softmax::FoldedLazy,
        grid: HopperGrid::Auto,
        elem_bytes: 2,
    };
    if !d.is_multiple_of(16) {
        return None;
    }
    match d {
        32..=128 => Some(base),
        144..=192 => Some(HopperConfig {
            block_n: 112,
            ..base
        }),
        208..=256 => Some(HopperConfig {
            block_n: 80,
            ..base
        }),
        _ => None,
    }
}

/// Pairs `(D, D_v)` of a query/key head dimension and a different value head dimension with
/// forward kernels on both paths (DeepSeek's 192 / 128): Hopper
/// `attention_fwd_hopper{,_varlen}_{bf16,f16}_d{D}_v{D_v}` ([`hopper_value_config`]) and
/// `mma.sync` `attention_fwd{,_varlen}_{bf16,f16}_d{D}_v{D_v}` ([`mma_value_config`]).
pub const VALUE_DIMS: [(u32, u32); 1] = [(192, 128)];

/// The Hopper configuration of the pair `(d, dv)` of [`VALUE_DIMS`], if it is one (dense
/// batches and packed sequences alike): keys in steps of 128 with the overlap, as at D = 128.
/// S = Q K^T runs over the `d / 16` k-slices of D, O += P V with N = `dv`, so the registers are
/// those of D = 128 (64 of S, 64 of O per thread) and the shared memory holds Q and K of D = 192
/// beside V of 128: 48 + 2 (48 + 32) KiB.
#[inline(always)]
pub const fn hopper_value_config(d: u32, dv: u32) -> Option<HopperConfig> {
    if !is_value_pair(d, dv) {
        return None;
    }
    Some(HopperConfig {
        head_dim: d,
        value_dim: dv,
        ..hopper_config_of(128)
    })
}

/// Whether `(d, dv)` is one of [`VALUE_DIMS`].
#[inline(always)]
pub const fn is_value_pair(d: u32, dv: u32) -> bool {
    let mut i = 0;
    while i < VALUE_DIMS.len() {
        if VALUE_DIMS[i].0 == d && VALUE_DIMS[i].1 == dv {
            return true;
        }
        i += 1;
    }
    false
}

/// [`hopper_value_config`] of a supported pair (compile-time use in kernels).
#[inline(always)]
pub const fn hopper_value_config_of(d: u32, dv: u32) -> HopperConfig {
    match hopper_value_config(d, dv) {
        Some(c) => c,
        None => panic!("unsupported pair of head dimensions"),
    }
}

/// Alternative Hopper configurations, compiled for bf16 as
/// `attention_fwd_hopper_bf16_d{D}_{name}` and timed beside the default by the benchmark
/// (`impl` = `ours-{name}`), so that [`hopper_config`] is chosen from measurements; "hgrid3"
/// exists for the tests (many tiles per block).
pub const HOPPER_VARIANTS: [(&str, HopperConfig); 12] = [
    // The scaled softmax (scale first, maximum, exponentials; O rescaled every step).
    (
        "hscaled",
        HopperConfig {
            softmax: Softmax::Scaled,
            ..hopper_config_of(128)
        },
    ),
    // Pingpong turns between the consumer warpgroups.
    (
        "hpp",
        HopperConfig {
            pingpong: true,
            ..hopper_config_of(128)
        },
    ),
    // Steps of 176 keys (FlashAttention-3's non-causal tile at D = 128).
    (
        "h176",
        HopperConfig {
            block_n: 176,
            ..hopper_config_of(128)
        },
    ),
    // A 3-stage ring.
    (
        "h3",
        HopperConfig {
            stages: 3,
            ..hopper_config_of(128)
        },
    ),
    // One block per tile, whatever the mask.
    (
        "hnp",
        HopperConfig {
            grid: HopperGrid::PerTile,
            ..hopper_config_of(128)
        },
    ),
    // One block per SM, whatever the mask (static round-robin under causal masking too).
    (
        "hstatic",
        HopperConfig {
            grid: HopperGrid::PerSm,
            ..hopper_config_of(128)
        },
    ),
    // Three blocks in all: many tiles per block (tests).
    (
        "hgrid3",
        HopperConfig {
            grid: HopperGrid::Blocks(3),
            ..hopper_config_of(128)
        },
    ),
    // Pingpong at D = 64 and 256.
    (
        "hpp64",
        HopperConfig {
            pingpong: true,
            ..hopper_config_of(64)
        },
    ),
    // (on the configuration without the overlap: with it the turns spill)
    (
        "hpp256",
        HopperConfig {
            pingpong: true,
            ..without_overlap(256)
        },
    ),
    // D = 256 with the scaled softmax.
    (
        "hscaled256",
        HopperConfig {
            softmax: Softmax::Scaled,
            ..hopper_config_of(256)
        },
    ),
    // The configuration above D = 128 before the overlap: keys in steps of 64, one step after
    // the other.
    ("h64", without_overlap(192)),
    ("h64", without_overlap(256)),
];

/// The default configuration of head dimension `d` with keys in steps of 64 and no overlap.
const fn without_overlap(d: u32) -> HopperConfig {
    HopperConfig {
        block_n: 64,
        overlap: false,
        ..hopper_config_of(d)
    }
}

/// The Hopper tile configuration of the packed-sequence kernels for head dimension `d`: the
/// default ([`hopper_config`]) up to D = 128; above, keys in steps of 64 without the overlap.
/// With the overlap the packed tile's extra live values (its sequence's rows and offsets) made
/// ptxas spill from D = 144 to 208 (up to a 72-byte stack frame) and serialize the `wgmma`s from
/// 224 to 256 (`./x check-ptx`).
#[inline(always)]
pub const fn hopper_varlen_config(d: u32) -> Option<HopperConfig> {
    match hopper_config(d) {
        Some(_) if d > 128 => Some(without_overlap(d)),
        c => c,
    }
}

/// [`hopper_varlen_config`] for a supported head dimension (compile-time use in kernels).
#[inline(always)]
pub const fn hopper_varlen_config_of(d: u32) -> HopperConfig {
    match hopper_varlen_config(d) {
        Some(c) => c,
        None => panic!("unsupported head dimension"),
    }
}

/// The Hopper variant `name` for head dimension `d`.
pub fn hopper_variant(d: u32, name: &str) -> Option<HopperConfig> {
    HOPPER_VARIANTS
        .iter()
        .find(|(n, c)| *n == name && c.head_dim == d)
        .map(|(_, c)| *c)
}

const _: () = {
    // Every Hopper configuration fits the 227 KiB a block may have.
    let mut i = 0;
    while i < HEAD_DIMS.len() {
        assert!(hopper_config_of(HEAD_DIMS[i]).smem_bytes() <= 227 * 1024);
        i += 1;
    }
    let mut k = 0;
    while k < HEAD_DIMS.len() {
        assert!(hopper_varlen_config_of(HEAD_DIMS[k]).smem_bytes() <= 227 * 1024);
        k += 1;
    }
    let mut v = 0;
    while v < HOPPER_VARIANTS.len() {
        assert!(HOPPER_VARIANTS[v].1.smem_bytes() <= 227 * 1024);
        v += 1;
    }
    let mut p = 0;
    while p < VALUE_DIMS.len() {
        let (d, dv) = VALUE_DIMS[p];
        assert!(hopper_value_config_of(d, dv).smem_bytes() <= 227 * 1024);
        p += 1;
    }
};

/// [`hopper_config`] for a supported head dimension (compile-time use in kernels).
#[inline(always)]
pub const fn hopper_config_of(d: u32) -> HopperConfig {
    match hopper_config(d) {
        Some(c) => c,
        None => panic!("unsupported head dimension"),
    }
}

/// Parameters of `attention_fwd_hopper_{bf16,f16}_d{D}` (D of [`HEAD_DIMS`]): the tensor maps of Q, K, V
/// (4-D, dims `[D, heads, seq, batch]` innermost first, box `[64, 1, rows, 1]`, 128-byte
/// swizzle) and everything of [`AttentionParams`] the kernel still needs. Masking and outputs
/// are as documented there.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HopperParams {
    /// Q map, box rows `HOPPER_BLOCK_M`.
    pub tmap_q: crate::TensorMap,
    /// K map, box rows `block_n`.
    pub tmap_k: crate::TensorMap,
    /// V map, box rows `block_n`.
    pub tmap_v: crate::TensorMap,
    /// O `[batch, seq_q, heads_q, D_v]` (16-bit elements; `D_v` the configuration's
    /// `value_dim`), strides `o_strides`.
    pub o: *mut u16,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous.
    pub lse: *mut f32,
    /// Element strides of O for batch, sequence, head.
    pub o_strides: [u64; 3],
    /// Query length.
    pub seq_q: u32,
    /// Key/value length.
    pub seq_k: u32,
    /// Query heads.
    pub heads_q: u32,
    /// Key/value heads.
    pub heads_kv: u32,
    /// Softmax scale times log2(e).
    pub scale_log2: f32,
    /// Left window size, or [`UNBOUNDED`].
    pub window_left: i32,
    /// Right window size (0 for causal), or [`UNBOUNDED`].
    pub window_right: i32,
    /// Query blocks per (batch, head).
    pub num_m_blocks: u32,
    /// 1 to walk query blocks from the last (causal), 0 otherwise.
    pub reverse_m: u32,
    /// Batch size.
    pub batch: u32,
    /// Tiles (`num_m_blocks * heads_q * batch`, below 2^31); block `b` of the grid computes
    /// tiles `b`, `b + grid`, `b + 2 grid`, ...
    pub num_tiles: u32,
    /// Softcap and sinks (read by the `capsink` kernels only).
    pub logits: LogitOptions,
    /// Packed sequences (the `varlen` kernels only; null for the others): `[batch + 1]` i32, the
    /// first query row of each sequence, then `total_q`. The `varlen` kernels read the maps as
    /// packed tensors `[D, heads, total, 1]`, O as `[total_q, heads_q, D]` (its batch stride
    /// unused), LSE as `[heads_q, total_q]`, `batch` as the number of sequences,
    /// `num_m_blocks` as the query slots per head ([`hopper_varlen_slots`]; `num_tiles` is
    /// `heads_q` times it) and take one block per tile (grid `num_tiles`); the mask applies per
    /// sequence, as in [`AttentionVarlenParams`]. They clamp every offset read into
    /// `0 ..= total_*` (each end at least its start), so contents that contradict the sizes
    /// cannot make them access memory outside the tensors.
    pub cu_seqlens_q: *const i32,
    /// `[batch + 1]` i32: the first key row of each sequence, then `total_k` (`varlen` only).
    pub cu_seqlens_k: *const i32,
    /// Query rows of Q and O (the row stride of LSE; `varlen` only).
    pub total_q: u32,
    /// Key rows of K and V (`varlen` only).
    pub total_k: u32,
    /// Factor of O before it is stored: V's descale in the FP8 kernels ([`fp8`]), unused by
    /// the others (1).
    pub o_scale: f32,
}

// ---------------------------------------------------------------------------------------------
// Kernel handles: every entry of the family, what it was compiled for, and its lookup.

/// Element type of Q, K, V and O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}
