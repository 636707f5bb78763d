//! The Hopper path's configurations (sm_90a: TMA, mbarrier rings, `wgmma`, warp
//! specialization): the tile shape of each head dimension and value pair, the tuning variants,
//! and the kernels' parameters.

use super::{HEAD_DIMS, LogitOptions, Softmax, VALUE_DIMS, is_value_pair};
use crate::SMEM_ALIGN;

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
/// Slots of the tile handoff of the packed kernels' persistent grid (the scheduler warp
/// publishes up to this many tiles ahead of the producer and the consumers).
pub const HOPPER_HANDOFF_SLOTS: u32 = 2;
/// Threads that take each tile of the handoff: every consumer thread and the producer's.
pub const HOPPER_HANDOFF_TAKERS: u32 = HOPPER_CONSUMERS * crate::WARPGROUP_SIZE + 1;

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
    /// One block per multiprocessor (at most one per tile), whose blocks draw their tiles at
    /// run time from [`HopperParams::tile_counter`] in the order of the tile index (a scheduler
    /// warp and a handoff in shared memory, as the packed kernels): a block takes its next
    /// tile when it is done with one, whatever the mask. Without a counter, the static
    /// round-robin of [`HopperGrid::PerSm`].
    Dynamic,
}

impl HopperGrid {
    /// Whether the kernel's blocks take their tiles from a scheduler warp.
    #[inline(always)]
    pub const fn scheduled(self) -> bool {
        matches!(self, HopperGrid::Dynamic)
    }
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
    /// `stages` barriers), then `q_empty`, then the handoff's `full` and `empty` barriers (each
    /// [`HOPPER_HANDOFF_SLOTS`]).
    #[inline(always)]
    pub const fn barriers_offset(&self) -> usize {
        self.k_offset(self.stages)
    }

    /// Number of mbarriers.
    #[inline(always)]
    pub const fn barriers(&self) -> u32 {
        2 + 4 * self.stages + 2 * HOPPER_HANDOFF_SLOTS
    }

    /// Offset of the handoff's slots (after the mbarriers): [`HOPPER_HANDOFF_SLOTS`] pairs of
    /// u32, a tile index and its packed sequence.
    #[inline(always)]
    pub const fn handoff_offset(&self) -> usize {
        self.barriers_offset() + 8 * self.barriers() as usize
    }

    /// Dynamic shared memory of the kernel.
    #[inline(always)]
    pub const fn smem_bytes(&self) -> usize {
        crate::align_up(
            self.handoff_offset() + 8 * HOPPER_HANDOFF_SLOTS as usize,
            16,
        ) + SMEM_ALIGN
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
pub const HOPPER_VARIANTS: [(&str, HopperConfig); 15] = [
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
    // Tiles drawn at run time by a persistent grid, whatever the mask.
    ("hdyn", dynamic(64)),
    ("hdyn", dynamic(128)),
    // D = 64 in key steps of 192 (FlashAttention-3's step there): a third fewer steps, each
    // with its fixed costs (row maxima and sums across the quad, the rescale, the waits); the
    // plan's choice on long keys.
    (
        HOPPER_LONG_KEYS_VARIANT,
        HopperConfig {
            block_n: 192,
            ..hopper_config_of(64)
        },
    ),
];

/// The variant of [`HOPPER_VARIANTS`] in longer key steps that the plan takes on long keys
/// (built in both dtypes, D = 64).
pub const HOPPER_LONG_KEYS_VARIANT: &str = "hn192";

/// The default configuration of head dimension `d` on the grid of [`HopperGrid::Dynamic`].
const fn dynamic(d: u32) -> HopperConfig {
    HopperConfig {
        grid: HopperGrid::Dynamic,
        ..hopper_config_of(d)
    }
}

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
    /// tiles `b`, `b + grid`, `b + 2 grid`, ... (with a `tile_counter`: the tiles it draws);
    /// the grid is at most `num_tiles` blocks.
    pub num_tiles: u32,
    /// Softcap and sinks (read by the `capsink` kernels only).
    pub logits: LogitOptions,
    /// Packed sequences (the `varlen` kernels only; null for the others): `[batch + 1]` i32, the
    /// first query row of each sequence, then `total_q`. The `varlen` kernels read the maps as
    /// packed tensors `[D, heads, total, 1]`, O as `[total_q, heads_q, D]` (its batch stride
    /// unused), LSE as `[heads_q, total_q]`, `batch` as the number of sequences,
    /// `num_m_blocks` as the query slots per head ([`hopper_varlen_slots`]; `num_tiles` is
    /// `heads_q` times it) and take one block per tile (grid `num_tiles`) or, with a
    /// `tile_counter`, a persistent grid whose blocks draw their tiles; the mask applies per
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
    /// The tile counter of the dynamic persistent grid (the `varlen` kernels and the dense
    /// kernels of [`HopperGrid::Dynamic`]; null for one block per tile, for the other dense
    /// kernels, or for a static order): a u32 in global memory, zero when the
    /// launch starts and used by no other launch while it runs. Block `b` computes tile `b`
    /// first, then tiles `grid + r` for the values `r` it draws from the counter
    /// (`atom.add`), until one reaches `num_tiles`; the block that draws `num_tiles - 1` (the
    /// launch's last draw: there are `num_tiles` of them) stores 0, so the counter is zero
    /// again for the next launch in stream order. Null: block `b` computes tiles `b`,
    /// `b + grid`, ... as the dense kernels.
    pub tile_counter: *mut u32,
}
