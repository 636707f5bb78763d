//! Attention forward (FlashAttention-2 style, `ldmatrix` + `mma.sync`, `cp.async` pipeline):
//! `O = softmax(scale Q K^T + mask) V` and the row log-sum-exp; the backward's handles in
//! [`backward`].

use crate::kernel::str_eq;
use crate::{Kernel, KernelDecl, SMEM_ALIGN, WARP_SIZE};

pub mod backward;
pub mod decode;
pub mod fp8;
mod hopper;
pub mod hopper_bwd;
mod kernels;
mod varlen;

pub use hopper::*;
pub(crate) use kernels::mma_smem;
pub use kernels::{
    HOPPER_F16_VARIANTS, HOPPER_KERNELS, HOPPER_VALUE_DIM_KERNELS, HopperKernel, KERNELS,
    MMA_KERNELS, MMA_VALUE_DIM_KERNELS, MmaKernel, hopper_capsink_kernel, hopper_dynamic_kernel,
    hopper_kernel, hopper_value_dim_kernel, mma_capsink_kernel, mma_kernel, mma_value_dim_kernel,
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
// V and O of their own head dimension.

/// Pairs `(D, D_v)` of a query/key head dimension and a different value head dimension with
/// forward kernels on both paths (DeepSeek's 192 / 128): Hopper
/// `attention_fwd_hopper{,_varlen}_{bf16,f16}_d{D}_v{D_v}` ([`hopper_value_config`]) and
/// `mma.sync` `attention_fwd{,_varlen}_{bf16,f16}_d{D}_v{D_v}` ([`mma_value_config`]).
pub const VALUE_DIMS: [(u32, u32); 1] = [(192, 128)];

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
