//! Attention backward on Hopper (sm_90a): a dK/dV kernel and a dQ kernel with TMA, mbarrier
//! rings, `wgmma` and warp specialization. They take the place of the `mma.sync` dK/dV and
//! deterministic dQ kernels in a backward pass; the preprocess (`delta'`) stays the one of
//! [`super::backward`].
//!
//! - dK/dV: one block per [`HOPPER_BWD_BLOCK_N`] keys of one key/value head of one sequence:
//!   one producer warpgroup (TMA loads) and two consumer warpgroups, consumer `c` owning keys
//!   `64 c .. 64 c + 64` of the block with their dK and dV in registers (f32) over every query
//!   head of the group and every [`HopperBwdConfig::block_m`]-row query block that sees the
//!   keys.
//! - dQ: one block per [`HOPPER_DQ_BLOCK_M`] query rows of one query head of one sequence,
//!   consumer `c` owning rows `64 c .. 64 c + 64` with their dQ in registers, over the
//!   [`HOPPER_DQ_BLOCK_N`]-key blocks the rows may see. No atomics: bitwise reproducible.
//!
//! - dK/dV/dQ (the default, non-deterministic mode): the dK/dV kernel that also computes each
//!   step's `dQ = dS K` and adds it into an f32 accumulator with bulk reduce-adds (the tiled
//!   layout of [`dq_accum_tile_base`]), then a conversion to the element type: one kernel
//!   instead of the dQ kernel's recomputation of `S` and `dP`, at the cost of an accumulation
//!   order that varies from run to run.
//! - dK/dV/dQ of a wide head (D 256): one block per [`HOPPER_BWD_WIDE_BLOCK_N`] keys whose two
//!   consumers split the columns of dK, dV and dQ, `P^T` and `dS^T` through shared memory, dQ
//!   added into the same tiled accumulator with vector reductions from registers.
//!
//! - The deterministic mode takes the dK/dV/dQ kernels too, with the order of the additions
//!   fixed ([`AttentionBwdParams::dq_order`] not null): the blocks of a key/value head take its
//!   key blocks in descending order (block `x` the key block `nb - 1 - x` of `nb`), and each
//!   tile of the accumulator receives its key blocks' contributions in that order, each one
//!   waiting for its predecessor's through the tile's counter ([`dq_order_index`]). A block
//!   only waits for blocks launched before it. The grid interleaves the (key/value head,
//!   sequence) pairs in launch order ([`dkdv_block`]) so that the chains of waits of blocks
//!   launched together do not add up wave after wave.
//!
//! The kernels' module documentation (`gpu-kernels/src/attention/hopper_bwd/`) has the
//! products and the barrier protocols.

use super::backward::{AttentionBwdParams, AttentionBwdVarlenParams};
use super::{Dtype, HOPPER_ATOM, HOPPER_CONSUMERS, HOPPER_THREADS};
use crate::{Kernel, KernelDecl, SMEM_ALIGN, TensorMap};

mod dq_accum;
pub use dq_accum::*;

/// Keys per block (64 per consumer warpgroup: the M of its `wgmma`s).
pub const HOPPER_BWD_BLOCK_N: u32 = 128;
/// Keys per block of the wide dK/dV/dQ kernel (D > 128): the M of every consumer's `wgmma`s
/// but dQ's.
pub const HOPPER_BWD_WIDE_BLOCK_N: u32 = 64;
/// Query rows per step (the Q and dO tiles of one ring stage), but for the dK/dV/dQ kernel of
/// a narrow head ([`HOPPER_BWD_NARROW_BLOCK_M`]).
pub const HOPPER_BWD_BLOCK_M: u32 = 64;
/// Query rows per step of the dK/dV/dQ kernel at D = 64: 64-row steps leave its products too
/// short (`m64n64k16` over K = 64) for the tensor cores to stay busy between the step's waits.
/// Each consumer's dQ is then one whole accumulator tile (its 64 of the step's rows, every
/// column) instead of half of one.
pub const HOPPER_BWD_NARROW_BLOCK_M: u32 = 128;
/// Stages of the Q/dO ring (dK/dV) and of the K/V ring (dQ).
pub const HOPPER_BWD_STAGES: u32 = 2;
/// Rows of a tile of the tiled dQ accumulator: the query rows of one step of the dK/dV/dQ
/// kernel.
pub const HOPPER_DQ_TILE_ROWS: u32 = HOPPER_BWD_BLOCK_M;
/// Query rows per block of the dQ kernel (64 per consumer warpgroup).
pub const HOPPER_DQ_BLOCK_M: u32 = 128;
/// Keys per step of the dQ kernel (the K and V tiles of one ring stage).
pub const HOPPER_DQ_BLOCK_N: u32 = 64;

/// Parameters of the Hopper dK/dV kernel: the tensor maps of Q, dO, K and V (4-D, dims `[D,
/// heads, seq, batch]`, box `[64, 1, rows, 1]` with rows [`HopperBwdConfig::block_m`] for Q
/// and dO and [`HopperBwdConfig::block_n`] for K and V, 128-byte swizzle; rows past the
/// sequence and columns past `D` read as zeros),
/// then the `mma.sync` backward's parameters, of which the kernel reads LSE, `delta'`, dK, dV
/// with their strides, the sizes, the scales, the window and the tensors' head dimension.
///
/// The tensors' head dimension (`base.head_dim`) may be below the kernel's (a padded plan,
/// [`hopper_bwd_padded_kernel`]): the maps' zero columns make the products those of the
/// tensors, and the kernels store the gradients' first `head_dim` columns only.
///
/// Packed sequences (the `_varlen_` kernels): the maps describe the packed tensors as `[D,
/// heads, total, 1]`, `cu_seqlens_q` and `cu_seqlens_k` mark the sequences as for
/// [`AttentionBwdVarlenParams`](super::backward::AttentionBwdVarlenParams) (whose meaning
/// `base` then has: `seq_q`, `seq_k` the longest lengths, LSE and `delta'` `[heads_q,
/// total_q]`), and the tiled accumulator is the packed one of [`dq_accum_varlen_row0`]. The
/// kernels clamp the offsets into `0 ..= total_*` and each length to the longest, so no
/// contents make them access memory outside the tensors. The dense kernels ignore these
/// fields (null and 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HopperBwdParams {
    /// Q map.
    pub tmap_q: TensorMap,
    /// dO map.
    pub tmap_do: TensorMap,
    /// K map.
    pub tmap_k: TensorMap,
    /// V map.
    pub tmap_v: TensorMap,
    /// Everything else, as for the `mma.sync` kernels.
    pub base: AttentionBwdParams,
    /// Packed sequences: `[batch + 1]` i32, the first query row of each sequence, then
    /// `total_q`; null for a dense batch.
    pub cu_seqlens_q: *const i32,
    /// Packed sequences: `[batch + 1]` i32, the first key row of each sequence, then
    /// `total_k`; null for a dense batch.
    pub cu_seqlens_k: *const i32,
    /// Packed sequences: query rows of Q, O, dO, dQ (and the row stride of LSE, `delta'`).
    pub total_q: u32,
    /// Packed sequences: key rows of K, V, dK, dV.
    pub total_k: u32,
    /// The (key/value head, sequence) pairs whose blocks the dK/dV grid interleaves in its
    /// launch order ([`dkdv_block`]); 1: the grid's own indices. The deterministic mode's
    /// ([`dq_order_group`]); the dQ kernel ignores it.
    pub order_group: u32,
}

/// The shared-memory layout of the Hopper dK/dV kernel for one head dimension. Tiles are stored
/// as `D / 64` column blocks of 128-byte swizzled rows (one TMA box each), as in the forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperBwdConfig {
    /// Head dimension D.
    pub head_dim: u32,
    /// Whether the kernel also computes dQ (the dK/dV/dQ kernel): two `dS^T` buffers and the
    /// consumers' dQ parts follow the tiles.
    pub fused_dq: bool,
    /// Query rows per step: [`HOPPER_BWD_BLOCK_M`], or [`HOPPER_BWD_NARROW_BLOCK_M`] in the
    /// dK/dV/dQ kernel at D = 64 ([`hopper_dkdvq_config`]).
    pub block_m: u32,
}

impl HopperBwdConfig {
    /// 128-byte column blocks along D (D = 96: the second half filled with zeros by TMA).
    #[inline]
    pub const fn column_blocks(&self) -> u32 {
        self.head_dim.div_ceil(HOPPER_ATOM)
    }

    /// Bytes of one column block of `rows` rows.
    #[inline]
    pub const fn block_bytes(&self, rows: u32) -> u32 {
        rows * 128
    }

    /// Bytes of a `[rows, D]` tile.
    #[inline]
    pub const fn tile_bytes(&self, rows: u32) -> u32 {
        self.column_blocks() * self.block_bytes(rows)
    }

    /// Keys per block: [`HOPPER_BWD_BLOCK_N`], or [`HOPPER_BWD_WIDE_BLOCK_N`] for a wide head
    /// ([`HopperBwdConfig::wide`]).
    #[inline]
    pub const fn block_n(&self) -> u32 {
        if self.wide() {
            HOPPER_BWD_WIDE_BLOCK_N
        } else {
            HOPPER_BWD_BLOCK_N
        }
    }

    /// Whether the head is wide (D > 128): the dK/dV/dQ kernel whose consumers split the
    /// columns of dK, dV and dQ, with 64 keys per block (dK and dV of 128 keys in registers
    /// would need D f32 registers per thread each).
    #[inline]
    pub const fn wide(&self) -> bool {
        self.head_dim > 128
    }

    /// Offset of the K tile (`[block_n, D]`).
    #[inline]
    pub const fn k_offset(&self) -> u32 {
        0
    }

    /// Offset of the V tile.
    #[inline]
    pub const fn v_offset(&self) -> u32 {
        self.tile_bytes(self.block_n())
    }

    /// Offset of stage `s`'s Q tile (`[block_m, D]`).
    #[inline]
    pub const fn q_offset(&self, s: u32) -> u32 {
        2 * self.tile_bytes(self.block_n()) + 2 * s * self.tile_bytes(self.block_m)
    }

    /// Offset of stage `s`'s dO tile.
    #[inline]
    pub const fn do_offset(&self, s: u32) -> u32 {
        self.q_offset(s) + self.tile_bytes(self.block_m)
    }

    /// Bytes the K and V loads deliver together.
    #[inline]
    pub const fn kv_bytes(&self) -> u32 {
        2 * self.tile_bytes(self.block_n())
    }

    /// Bytes one step's Q and dO loads deliver together.
    #[inline]
    pub const fn step_bytes(&self) -> u32 {
        2 * self.tile_bytes(self.block_m)
    }

    /// Bytes of one `dS^T` (or `P^T`) buffer: `[block_n, block_m]` 16-bit.
    #[inline]
    pub const fn ds_bytes(&self) -> u32 {
        self.block_n() * self.block_m * 2
    }

    /// Offset of `dS^T` buffer `s` (of 2; dK/dV/dQ kernel), after the tiles: keys as rows of
    /// 128 bytes of 64 queries, 128-byte swizzled (the layout TMA gives a Q tile), one such
    /// column block per 64 queries of a step: the K-major A operand of `dK += dS^T Q` (wide
    /// heads) and the M-major A operand of `dQ = dS K`.
    #[inline]
    pub const fn ds_offset(&self, s: u32) -> u32 {
        self.q_offset(HOPPER_BWD_STAGES) + s * self.ds_bytes()
    }

    /// Offset of `P^T` buffer `s` (of 2; wide heads), laid out as the `dS^T` buffers: the A
    /// operand of `dV += P^T dO`.
    #[inline]
    pub const fn pt_offset(&self, s: u32) -> u32 {
        self.ds_offset(2) + s * self.ds_bytes()
    }

    /// Offset of consumer `c`'s dQ part (dK/dV/dQ kernel of D <= 128): its share of the
    /// step's dQ ([`HopperBwdConfig::dq_part`]) as f32 in the order of [`dq_tile_vector`], the
    /// source of its bulk reduce.
    #[inline]
    pub const fn dq_offset(&self, c: u32) -> u32 {
        self.ds_offset(2) + c * self.dq_part_bytes()
    }

    /// Bytes of one consumer's dQ part (`block_m D / 2` f32), the size of its bulk reduce.
    #[inline]
    pub const fn dq_part_bytes(&self) -> u32 {
        self.block_m * self.head_dim / 2 * 4
    }

    /// Where consumer `c`'s dQ part goes in the tiled accumulator (dK/dV/dQ kernel of D <=
    /// 128), as (first row past the step's first, element offset in that row's tile): with
    /// 64-row steps, half `c` of the step's tile (`m64n{D/2}` products over columns `c D / 2
    /// ..`); with [`HOPPER_BWD_NARROW_BLOCK_M`], the whole tile of the step's rows `64 c ..`
    /// (`m64n{D}` products).
    #[inline]
    pub const fn dq_part(&self, c: u32) -> (u32, u32) {
        if self.block_m == HOPPER_DQ_TILE_ROWS {
            (0, dq_tile_vector(self.head_dim, c, 0, 0))
        } else {
            (c * HOPPER_DQ_TILE_ROWS, 0)
        }
    }

    /// End of the tiles and buffers.
    #[inline]
    const fn buffers_end(&self) -> u32 {
        if !self.fused_dq {
            self.q_offset(HOPPER_BWD_STAGES)
        } else if self.wide() {
            self.pt_offset(2)
        } else {
            self.dq_offset(HOPPER_CONSUMERS)
        }
    }

    /// Offset of stage `s`'s row values: `block_m` f32 LSE values in base 2 (+inf where P
    /// must be 0), then as many `delta'` values (0 past the sequence), written by the producer
    /// for the step's query rows.
    #[inline]
    pub const fn rows_offset(&self, s: u32) -> u32 {
        self.buffers_end() + s * 2 * self.block_m * 4
    }

    /// Offset of the mbarriers: `kv_full`, then `full[s]` and `empty[s]` of the ring.
    #[inline]
    pub const fn barriers_offset(&self) -> u32 {
        self.rows_offset(HOPPER_BWD_STAGES)
    }

    /// Number of mbarriers.
    #[inline]
    pub const fn barriers(&self) -> u32 {
        1 + 2 * HOPPER_BWD_STAGES
    }

    /// Offset of the block's sequence and position, after the mbarriers (8 u32, 16-byte
    /// aligned): the sequence's query rows, key rows, first query row and first key row (the
    /// kernels over packed sequences), then the block's key/value head and sequence (its
    /// position in the grid, [`dkdv_block`]) and two unused words.
    #[inline]
    pub const fn seq_offset(&self) -> u32 {
        crate::align_up((self.barriers_offset() + 8 * self.barriers()) as usize, 16) as u32
    }

    /// Dynamic shared memory of the kernel.
    #[inline]
    pub const fn smem_bytes(&self) -> usize {
        crate::align_up((self.seq_offset() + 32) as usize, 16) + SMEM_ALIGN
    }

    /// The configuration of the dK/dV/dQ kernel.
    #[inline]
    pub const fn with_fused_dq(self) -> Self {
        HopperBwdConfig {
            fused_dq: true,
            ..self
        }
    }
}

/// The shared-memory layout of the Hopper dQ kernel: Q and dO tiles (`[HOPPER_DQ_BLOCK_M, D]`,
/// loaded once), then the K/V ring (`[HOPPER_DQ_BLOCK_N, D]` each), then the mbarriers; tiles
/// as [`HopperBwdConfig`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperDqConfig {
    /// Head dimension D.
    pub head_dim: u32,
}

impl HopperDqConfig {
    const fn tiles(&self) -> HopperBwdConfig {
        HopperBwdConfig {
            head_dim: self.head_dim,
            fused_dq: false,
            block_m: HOPPER_BWD_BLOCK_M,
        }
    }

    /// 128-byte column blocks along D.
    #[inline]
    pub const fn column_blocks(&self) -> u32 {
        self.tiles().column_blocks()
    }

    /// Bytes of one column block of `rows` rows.
    #[inline]
    pub const fn block_bytes(&self, rows: u32) -> u32 {
        self.tiles().block_bytes(rows)
    }

    /// Offset of the Q tile.
    #[inline]
    pub const fn q_offset(&self) -> u32 {
        0
    }

    /// Offset of the dO tile.
    #[inline]
    pub const fn do_offset(&self) -> u32 {
        self.tiles().tile_bytes(HOPPER_DQ_BLOCK_M)
    }

    /// Offset of stage `s`'s K tile.
    #[inline]
    pub const fn k_offset(&self, s: u32) -> u32 {
        2 * self.tiles().tile_bytes(HOPPER_DQ_BLOCK_M)
            + 2 * s * self.tiles().tile_bytes(HOPPER_DQ_BLOCK_N)
    }

    /// Offset of stage `s`'s V tile.
    #[inline]
    pub const fn v_offset(&self, s: u32) -> u32 {
        self.k_offset(s) + self.tiles().tile_bytes(HOPPER_DQ_BLOCK_N)
    }

    /// Bytes the Q and dO loads deliver together.
    #[inline]
    pub const fn qdo_bytes(&self) -> u32 {
        2 * self.tiles().tile_bytes(HOPPER_DQ_BLOCK_M)
    }

    /// Bytes one step's K and V loads deliver together.
    #[inline]
    pub const fn step_bytes(&self) -> u32 {
        2 * self.tiles().tile_bytes(HOPPER_DQ_BLOCK_N)
    }

    /// Offset of the mbarriers: `qdo_full`, then `full[s]` and `empty[s]` of the ring.
    #[inline]
    pub const fn barriers_offset(&self) -> u32 {
        self.k_offset(HOPPER_BWD_STAGES)
    }

    /// Number of mbarriers.
    #[inline]
    pub const fn barriers(&self) -> u32 {
        1 + 2 * HOPPER_BWD_STAGES
    }

    /// Dynamic shared memory of the kernel.
    #[inline]
    pub const fn smem_bytes(&self) -> usize {
        crate::align_up(
            self.barriers_offset() as usize + 8 * self.barriers() as usize,
            16,
        ) + SMEM_ALIGN
    }
}

/// The Hopper backward configuration for head dimension `d` (the dK/dV and dQ kernels at D 64,
/// 96 and 128, the dK/dV/dQ kernel at 64, 128 and 256; the other head dimensions run these on
/// zero-padded columns), if a kernel exists for it.
#[inline]
pub const fn hopper_bwd_config(d: u32) -> Option<HopperBwdConfig> {
    match d {
        64 | 96 | 128 | 256 => Some(HopperBwdConfig {
            head_dim: d,
            fused_dq: false,
            block_m: HOPPER_BWD_BLOCK_M,
        }),
        _ => None,
    }
}

/// [`hopper_bwd_config`] for a supported head dimension (compile-time use in kernels).
#[inline]
pub const fn hopper_bwd_config_of(d: u32) -> HopperBwdConfig {
    match hopper_bwd_config(d) {
        Some(c) => c,
        None => panic!("no Hopper backward for this head dimension"),
    }
}

/// The configuration of the dK/dV/dQ kernel for head dimension `d` (a supported one), with a
/// softcap or not: [`HOPPER_BWD_NARROW_BLOCK_M`]-row steps at D = 64 without a softcap (with
/// one, the registers of 128-row steps spill), else those of [`hopper_bwd_config_of`].
#[inline]
pub const fn hopper_dkdvq_config(d: u32, softcap: bool) -> HopperBwdConfig {
    let cfg = hopper_bwd_config_of(d).with_fused_dq();
    if d == 64 && !softcap {
        HopperBwdConfig {
            block_m: HOPPER_BWD_NARROW_BLOCK_M,
            ..cfg
        }
    } else {
        cfg
    }
}

/// The Hopper backward kernels of one element type and head dimension: their handles and what
/// they were compiled for.
pub struct HopperBwdKernel {
    /// The dK/dV and dQ kernels (no atomics: the deterministic mode, and the default where
    /// there is no dK/dV/dQ kernel), where the head fits them (D 64, 96, 128).
    pub split: Option<HopperBwdSplit>,
    /// The dK/dV/dQ kernel and its conversion (the default mode), where the head dimension
    /// splits into two halves of whole 32-column groups (D 64, 128) or is wide (D 256).
    pub fused: Option<HopperDkdvq>,
    /// Element type.
    pub dtype: Dtype,
    /// Head dimension.
    pub head_dim: u32,
    /// Whether the kernels apply the softcap of
    /// [`AttentionBwdParams::logits`](super::backward::AttentionBwdParams::logits).
    pub softcap: bool,
}

impl HopperBwdKernel {
    /// Whether a padded plan on these kernels ([`hopper_bwd_padded_kernel`]) takes the
    /// dK/dV/dQ kernel (there are no dK/dV and dQ kernels), with its tiled accumulator rows
    /// as wide as this head dimension.
    pub fn padded_takes_fused(&self) -> bool {
        self.split.is_none() && self.fused.is_some()
    }
}

/// The dK/dV and dQ kernels of a [`HopperBwdKernel`].
pub struct HopperBwdSplit {
    /// The dK/dV kernel; launch it with shape [`HopperBwdSplit::cfg`].
    pub dkdv: Kernel<HopperBwdParams, HopperBwdConfig>,
    /// The dQ kernel; launch it with shape [`HopperBwdSplit::dq_cfg`].
    pub dq: Kernel<HopperBwdParams, HopperDqConfig>,
    /// The dK/dV configuration.
    pub cfg: HopperBwdConfig,
    /// The dQ configuration.
    pub dq_cfg: HopperDqConfig,
}

fn smem(cfg: HopperBwdConfig) -> usize {
    cfg.smem_bytes()
}

fn smem_dq(cfg: HopperDqConfig) -> usize {
    cfg.smem_bytes()
}

fn no_smem(_: ()) -> usize {
    0
}

/// Threads per block of the dQ conversion.
pub const HOPPER_DQ_CONVERT_THREADS: u32 = 128;

/// `negative_attention_bwd_hopper_early_empty`: `attention_bwd_hopper_dkdvq_bf16_d256` whose
/// consumers release each stage of the Q/dO ring before reading it, a negative control for the
/// test suites (`gpu-kernels/src/negative.rs`); the launch shape, parameters and shared memory
/// of `attention_bwd_hopper_dkdvq_bf16_d256` (configuration `hopper_dkdvq_config(256,
/// false)`).
pub const NEGATIVE_ATTENTION_BWD_HOPPER_EARLY_EMPTY: Kernel<HopperBwdParams, HopperBwdConfig> =
    Kernel::new(
        "negative_attention_bwd_hopper_early_empty",
        HOPPER_THREADS,
        1,
        smem,
    );

/// The dK/dV/dQ kernel of a [`HopperBwdKernel`] and the conversion of its accumulator.
pub struct HopperDkdvq {
    /// The dK/dV/dQ kernel; launch it with shape [`HopperDkdvq::cfg`] (grid `(ceil(seq_k /
    /// cfg.block_n()), heads_kv, batch)`), then [`HopperDkdvq::convert`].
    pub kernel: Kernel<HopperBwdParams, HopperBwdConfig>,
    /// The conversion of the tiled accumulator to dQ (times the scale); grid `(ceil(seq_q /
    /// HOPPER_DQ_TILE_ROWS), heads_q, batch)`, [`HOPPER_DQ_CONVERT_THREADS`] threads. The same
    /// kernel with and without softcap.
    pub convert: Kernel<AttentionBwdParams>,
    /// The dK/dV/dQ configuration. The kernel orders its dQ additions when
    /// [`AttentionBwdParams::dq_order`] is set (the deterministic mode).
    pub cfg: HopperBwdConfig,
    /// The same kernel over packed sequences (`cu_seqlens_*` of [`HopperBwdParams`]; grid
    /// `(ceil(max_seqlen_k / cfg.block_n()), heads_kv, batch)`, blocks past their sequence's
    /// keys return at once), then [`HopperDkdvq::convert_varlen`].
    pub varlen: Kernel<HopperBwdParams, HopperBwdConfig>,
    /// The conversion of the packed tiled accumulator ([`dq_accum_varlen_row0`]) to dQ; grid
    /// `(ceil(max_seqlen_q / HOPPER_DQ_TILE_ROWS), heads_q, batch)`,
    /// [`HOPPER_DQ_CONVERT_THREADS`] threads.
    pub convert_varlen: Kernel<AttentionBwdVarlenParams>,
}

/// The kernels of one entry: `split` names `[dkdv, dq]`, `fused` names `[dkdvq, dq_convert,
/// dkdvq_varlen, dq_convert_varlen]` (a softcap entry's conversions are the plain entry's).
const fn hopper_bwd(
    split: Option<[&'static str; 2]>,
    fused: Option<[&'static str; 4]>,
    dtype: Dtype,
    d: u32,
    softcap: bool,
) -> HopperBwdKernel {
    HopperBwdKernel {
        split: match split {
            Some([dkdv, dq]) => Some(HopperBwdSplit {
                dkdv: Kernel::new(dkdv, HOPPER_THREADS, 1, smem),
                dq: Kernel::new(dq, HOPPER_THREADS, 1, smem_dq),
                cfg: hopper_bwd_config_of(d),
                dq_cfg: HopperDqConfig { head_dim: d },
            }),
            None => None,
        },
        fused: match fused {
            Some([fused, convert, varlen, convert_varlen]) => Some(HopperDkdvq {
                kernel: Kernel::new(fused, HOPPER_THREADS, 1, smem),
                convert: Kernel::new(convert, HOPPER_DQ_CONVERT_THREADS, 1, no_smem),
                cfg: hopper_dkdvq_config(d, softcap),
                varlen: Kernel::new(varlen, HOPPER_THREADS, 1, smem),
                convert_varlen: Kernel::new(convert_varlen, HOPPER_DQ_CONVERT_THREADS, 1, no_smem),
            }),
            None => None,
        },
        dtype,
        head_dim: d,
        softcap,
    }
}

/// One entry of [`HOPPER_BWD_KERNELS`]: softcap or not, names, and which of the dK/dV and dQ
/// kernels (`split`) and the dK/dV/dQ kernel (`fused`) it has.
macro_rules! entry {
    ($softcap:literal, $sc:literal, $elem:ident, $dtype:ident, $d:literal, $($has:ident)+) => {
        hopper_bwd(
            entry!(@split [$($has)+] $sc, $elem, $d),
            entry!(@fused [$($has)+] $sc, $elem, $d),
            Dtype::$dtype,
            $d,
            $softcap,
        )
    };
    (@split [split $($rest:ident)*] $sc:literal, $elem:ident, $d:literal) => {
        Some([
            concat!("attention_bwd_hopper_dkdv_", $sc, stringify!($elem), "_d", $d),
            concat!("attention_bwd_hopper_dq_", $sc, stringify!($elem), "_d", $d),
        ])
    };
    (@split [fused] $sc:literal, $elem:ident, $d:literal) => {
        None
    };
    (@fused [split fused] $sc:literal, $elem:ident, $d:literal) => {
        entry!(@fused [fused] $sc, $elem, $d)
    };
    (@fused [fused] $sc:literal, $elem:ident, $d:literal) => {
        Some([
            concat!("attention_bwd_hopper_dkdvq_", $sc, stringify!($elem), "_d", $d),
            concat!("attention_bwd_hopper_dq_convert_", stringify!($elem), "_d", $d),
            concat!("attention_bwd_hopper_dkdvq_varlen_", $sc, stringify!($elem), "_d", $d),
            concat!("attention_bwd_hopper_dq_convert_varlen_", stringify!($elem), "_d", $d),
        ])
    };
    (@fused [split] $sc:literal, $elem:ident, $d:literal) => {
        None
    };
}

/// The Hopper backward kernels (sm_90a only): the [`HOPPER_BWD_PLAIN`] plain entries, then
/// their softcap forms in the same order.
pub const HOPPER_BWD_KERNELS: [HopperBwdKernel; 16] = [
    entry!(false, "", bf16, Bf16, 64, split fused),
    entry!(false, "", bf16, Bf16, 96, split),
    entry!(false, "", bf16, Bf16, 128, split fused),
    entry!(false, "", bf16, Bf16, 256, fused),
    entry!(false, "", f16, F16, 64, split fused),
    entry!(false, "", f16, F16, 96, split),
    entry!(false, "", f16, F16, 128, split fused),
    entry!(false, "", f16, F16, 256, fused),
    entry!(true, "softcap_", bf16, Bf16, 64, split fused),
    entry!(true, "softcap_", bf16, Bf16, 96, split),
    entry!(true, "softcap_", bf16, Bf16, 128, split fused),
    entry!(true, "softcap_", bf16, Bf16, 256, fused),
    entry!(true, "softcap_", f16, F16, 64, split fused),
    entry!(true, "softcap_", f16, F16, 96, split),
    entry!(true, "softcap_", f16, F16, 128, split fused),
    entry!(true, "softcap_", f16, F16, 256, fused),
];

/// Entries of [`HOPPER_BWD_KERNELS`] without softcap (the first ones).
pub const HOPPER_BWD_PLAIN: usize = HOPPER_BWD_KERNELS.len() / 2;

/// Entries of [`HOPPER_BWD_KERNELS`] with the dK/dV and dQ kernels, and with the dK/dV/dQ
/// kernel.
const HOPPER_BWD_COUNTS: (usize, usize) = {
    let (mut split, mut fused) = (0, 0);
    let mut i = 0;
    while i < HOPPER_BWD_KERNELS.len() {
        split += HOPPER_BWD_KERNELS[i].split.is_some() as usize;
        fused += HOPPER_BWD_KERNELS[i].fused.is_some() as usize;
        i += 1;
    }
    (split, fused)
};

/// Handles in [`HOPPER_BWD_KERNELS`]: the dK/dV and dQ kernels of each entry that has them,
/// the dK/dV/dQ kernel and its packed form of each entry that has one, and the conversions
/// (dense and packed) of each such plain entry (the softcap entries share them).
pub const HOPPER_BWD_KERNEL_COUNT: usize =
    2 * HOPPER_BWD_COUNTS.0 + 2 * HOPPER_BWD_COUNTS.1 + HOPPER_BWD_COUNTS.1;

/// The handles of [`HOPPER_BWD_KERNELS`], for the family's table.
#[inline]
pub const fn hopper_bwd_kernel_decls() -> [KernelDecl; HOPPER_BWD_KERNEL_COUNT] {
    let first = match &HOPPER_BWD_KERNELS[0].split {
        Some(s) => s.dkdv.info(),
        None => panic!("the first entry has the dK/dV kernel"),
    };
    let mut out = [first; HOPPER_BWD_KERNEL_COUNT];
    let mut n = 0;
    let mut i = 0;
    while i < HOPPER_BWD_KERNELS.len() {
        let k = &HOPPER_BWD_KERNELS[i];
        if let Some(s) = &k.split {
            out[n] = s.dkdv.info();
            out[n + 1] = s.dq.info();
            n += 2;
        }
        if let Some(f) = &k.fused {
            out[n] = f.kernel.info();
            out[n + 1] = f.varlen.info();
            n += 2;
            if i < HOPPER_BWD_PLAIN {
                out[n] = f.convert.info();
                out[n + 1] = f.convert_varlen.info();
                n += 2;
            }
        }
        i += 1;
    }
    assert!(n == HOPPER_BWD_KERNEL_COUNT);
    out
}

/// The Hopper backward kernels for `dtype` and head dimension `head_dim` (their softcap forms
/// if `softcap`), if built.
pub fn hopper_bwd_kernel(
    dtype: Dtype,
    head_dim: u32,
    softcap: bool,
) -> Option<&'static HopperBwdKernel> {
    hopper_bwd_entries(dtype, softcap).find(|k| k.head_dim == head_dim)
}

/// The Hopper backward entries of `dtype` (their softcap forms if `softcap`).
fn hopper_bwd_entries(
    dtype: Dtype,
    softcap: bool,
) -> impl Iterator<Item = &'static HopperBwdKernel> {
    const ALL: &[HopperBwdKernel] = &HOPPER_BWD_KERNELS;
    ALL.iter()
        .filter(move |k| k.dtype == dtype && k.softcap == softcap)
}

/// The Hopper backward kernels over packed sequences for `dtype` and head dimension
/// `head_dim` (their softcap forms if `softcap`): the packed dK/dV/dQ kernel
/// ([`HopperDkdvq::varlen`]) of the smallest head dimension at least `head_dim` that has one
/// (64, 128, 256), on zero-padded columns where it is wider.
pub fn hopper_bwd_varlen_kernel(
    dtype: Dtype,
    head_dim: u32,
    softcap: bool,
) -> Option<&'static HopperBwdKernel> {
    hopper_bwd_entries(dtype, softcap)
        .filter(|k| k.head_dim >= head_dim && k.fused.is_some())
        .min_by_key(|k| k.head_dim)
}

/// The Hopper kernels of the smallest head dimension above `head_dim`, for a head dimension
/// without kernels of its own: they run on zero-padded columns (the tensor maps' fill) and
/// store `head_dim` columns, at the cost of the padded dimension's products. A padded plan
/// takes their dK/dV and dQ kernels ([`HopperBwdKernel::split`], up to D 128), else their
/// dK/dV/dQ kernel (D 256, whose accumulator rows are 256 wide).
pub fn hopper_bwd_padded_kernel(
    dtype: Dtype,
    head_dim: u32,
    softcap: bool,
) -> Option<&'static HopperBwdKernel> {
    if hopper_bwd_kernel(dtype, head_dim, softcap).is_some() {
        return None;
    }
    hopper_bwd_entries(dtype, softcap)
        .filter(|k| k.head_dim > head_dim)
        .min_by_key(|k| k.head_dim)
}

const _: () = {
    // Two consumer warpgroups of 64 keys each; Q/dO tiles of one swizzle atom's K slices.
    assert!(HOPPER_BWD_BLOCK_N == 2 * 64 && HOPPER_BWD_BLOCK_M.is_multiple_of(16));
    // Wide heads: both consumers over the block's 64 keys, each with half of the queries of a
    // step in `S^T` and `dP^T` and half of the columns of dK, dV and dQ.
    assert!(HOPPER_BWD_WIDE_BLOCK_N == 64 && HOPPER_BWD_BLOCK_M == 64);
    // Tensor maps at 64-byte offsets (TMA).
    assert!(core::mem::offset_of!(HopperBwdParams, tmap_do) % 64 == 0);
    assert!(core::mem::offset_of!(HopperBwdParams, tmap_k) % 64 == 0);
    assert!(core::mem::offset_of!(HopperBwdParams, tmap_v) % 64 == 0);
    // The largest configurations fit the 227 KiB a block may have.
    assert!(hopper_bwd_config_of(128).smem_bytes() <= 227 * 1024);
    assert!(hopper_bwd_config_of(128).with_fused_dq().smem_bytes() <= 227 * 1024);
    assert!(hopper_dkdvq_config(64, false).smem_bytes() <= 227 * 1024);
    // A narrow step is two accumulator tiles, one per consumer.
    assert!(HOPPER_BWD_NARROW_BLOCK_M == HOPPER_CONSUMERS * HOPPER_DQ_TILE_ROWS);
    assert!(hopper_bwd_config_of(256).with_fused_dq().smem_bytes() <= 227 * 1024);
    // Swizzled buffers start on 1024-byte boundaries.
    assert!(
        hopper_bwd_config_of(256)
            .with_fused_dq()
            .ds_offset(0)
            .is_multiple_of(1024)
    );
    assert!(
        hopper_bwd_config_of(128)
            .with_fused_dq()
            .ds_offset(0)
            .is_multiple_of(1024)
    );
    assert!(
        hopper_dkdvq_config(64, false)
            .ds_offset(0)
            .is_multiple_of(1024)
    );
    assert!(
        hopper_dkdvq_config(64, true)
            .ds_offset(0)
            .is_multiple_of(1024)
    );
    // The preprocess zeroes the tiled accumulator's padding rows by its blocks of rows.
    assert!(super::backward::ROW_BLOCK == HOPPER_DQ_TILE_ROWS);
    // The plain entries first, their softcap forms after in the same order (the conversion
    // of entry `i + HOPPER_BWD_PLAIN` is entry `i`'s); a wide head only in a dK/dV/dQ kernel.
    let mut i = 0;
    while i < HOPPER_BWD_PLAIN {
        let (a, b) = (
            &HOPPER_BWD_KERNELS[i],
            &HOPPER_BWD_KERNELS[i + HOPPER_BWD_PLAIN],
        );
        assert!(!a.softcap && b.softcap && a.head_dim == b.head_dim);
        assert!(a.fused.is_some() == b.fused.is_some());
        assert!(a.split.is_some() == b.split.is_some());
        assert!(a.split.is_some() || a.fused.is_some());
        assert!(!(hopper_bwd_config_of(a.head_dim).wide() && a.split.is_some()));
        assert!(matches!(
            (a.dtype, b.dtype),
            (Dtype::Bf16, Dtype::Bf16) | (Dtype::F16, Dtype::F16)
        ));
        i += 1;
    }
    assert!(HopperDqConfig { head_dim: 128 }.smem_bytes() <= 227 * 1024);
    assert!(HOPPER_DQ_BLOCK_M == 2 * 64 && HOPPER_DQ_BLOCK_N == 64);
};
