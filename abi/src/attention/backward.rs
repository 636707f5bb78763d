//! Attention backward on the `mma.sync` path (FlashAttention-2's structure): the parameter
//! struct of its kernels, their tile shapes and shared-memory layouts, and the handles.
//!
//! Five kernels per element type and head dimension (and three more, `*_softcap_*`, for a
//! softcap), launched in this order:
//!
//! 1. `attention_bwd_pre_*`: `delta'[b, h, i] = sum_d dO O - dLSE` (0 for a row whose LSE is
//!    -inf), and the dQ accumulator zeroed (when there is one);
//! 2. `attention_bwd_*` (dQ by atomics) or `attention_bwd_dkdv_*` (deterministic mode): one block
//!    per [`BwdTileConfig::block_n`] keys of one key/value head, dK and dV in registers over every
//!    query head of the group and every query block that sees the keys; the first also adds
//!    its share of dQ into the f32 accumulator with `red.global.add.f32`;
//! 3. `attention_bwd_dq_convert_*` (after the atomics: the accumulator times the scale to dQ) or
//!    `attention_bwd_dq_*` (deterministic mode: one block per query block recomputes P and dS
//!    over the keys its rows see and writes dQ; no atomics, bitwise reproducible);
//! 4. with sinks, `attention_bwd_dsinks` (or `_varlen`): the sinks' gradient, one block per
//!    query head summing over every row of the batch in a fixed order (reproducible).
//!
//! The `attention_bwd_softcap_*`, `attention_bwd_dkdv_softcap_*` and `attention_bwd_dq_softcap_*`
//! kernels are steps 2 and 3 under a softcap ([`AttentionBwdParams::logits`]).

use super::{Dtype, HEAD_DIMS, LogitOptions, tile_config_of};
use crate::{Kernel, KernelDecl, SMEM_ALIGN, WARP_SIZE};

/// Parameters of every backward kernel (each reads the fields its role needs; the others may
/// be null). Masking is the forward's ([`super::AttentionParams`]); the logits are
/// `s = scale q . k`, `P = exp(s - LSE)`, `dS = P (dP - delta')`, and
/// `dQ = scale dS K`, `dK = scale dS^T Q`, `dV = P^T dO`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionBwdParams {
    /// Q `[batch, seq_q, heads_q, D]` (16-bit elements), strides `q_strides`.
    pub q: *const u16,
    /// K `[batch, seq_k, heads_kv, D]`.
    pub k: *const u16,
    /// V `[batch, seq_k, heads_kv, D]`.
    pub v: *const u16,
    /// O of the forward `[batch, seq_q, heads_q, D]` (read by the preprocess only).
    pub o: *const u16,
    /// dO `[batch, seq_q, heads_q, D]`.
    pub d_o: *const u16,
    /// dQ `[batch, seq_q, heads_q, D]` (written by the dQ kernel or the conversion).
    pub dq: *mut u16,
    /// dK `[batch, seq_k, heads_kv, D]`.
    pub dk: *mut u16,
    /// dV `[batch, seq_k, heads_kv, D]`.
    pub dv: *mut u16,
    /// LSE of the forward `[batch, heads_q, seq_q]` f32, contiguous (natural log).
    pub lse: *const f32,
    /// dLSE `[batch, heads_q, seq_q]` f32, contiguous; null when the loss does not use LSE.
    pub d_lse: *const f32,
    /// `delta'` `[batch, heads_q, seq_q]` f32, contiguous (workspace, written by the preprocess).
    pub delta: *mut f32,
    /// dQ accumulator f32, contiguous (workspace; null in deterministic mode): `[batch,
    /// heads_q, seq_q, D]`, or with `dq_accum_tiled` the Hopper layout of
    /// [`super::hopper_bwd::dq_accum_tile_base`].
    pub dq_accum: *mut f32,
    /// The order of the dQ additions in deterministic mode (the Hopper dK/dV/dQ kernel of D <=
    /// 128): one u32 counter per tile of the tiled accumulator
    /// ([`super::hopper_bwd::dq_order_index`]), zeroed by the preprocess; while it is not
    /// null the kernel adds each tile's contributions in a fixed order of its key blocks
    /// ([`super::hopper_bwd`]). Null otherwise.
    pub dq_order: *mut u32,
    /// Element strides of Q for batch, sequence, head (the head dimension is contiguous).
    pub q_strides: [u64; 3],
    /// Element strides of K.
    pub k_strides: [u64; 3],
    /// Element strides of V.
    pub v_strides: [u64; 3],
    /// Element strides of O.
    pub o_strides: [u64; 3],
    /// Element strides of dO.
    pub do_strides: [u64; 3],
    /// Element strides of dQ.
    pub dq_strides: [u64; 3],
    /// Element strides of dK.
    pub dk_strides: [u64; 3],
    /// Element strides of dV.
    pub dv_strides: [u64; 3],
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
    /// Softmax scale.
    pub scale: f32,
    /// Softmax scale times log2(e) (the kernels exponentiate in base 2).
    pub scale_log2: f32,
    /// Left window size, or [`super::UNBOUNDED`].
    pub window_left: i32,
    /// Right window size (0 for causal), or [`super::UNBOUNDED`].
    pub window_right: i32,
    /// The row width of the dQ accumulator's tiled layout, that of the Hopper dK/dV/dQ kernel
    /// ([`super::hopper_bwd::dq_accum_tile_base`] with the kernel's head dimension, at least
    /// `head_dim`: the preprocess zeroes whole rows, and the padded rows too); 0 for `[batch,
    /// heads_q, seq_q, D]` (and the packed layouts).
    pub dq_accum_tiled: u32,
    /// The tensors' head dimension D: the kernels' own, except under a padded Hopper plan
    /// ([`super::hopper_bwd::hopper_bwd_padded_kernel`]), whose kernels compute on columns
    /// zero-padded to theirs and store only these.
    pub head_dim: u32,
    /// The head dimension of V, O, dO and dV: `head_dim`, or under a pair of
    /// [`super::VALUE_DIMS`] (`D_v` below D: the Hopper dK/dV/dQ kernel of a wider head, on
    /// zero-padded columns) the pair's `D_v`, the columns of dV stored.
    pub value_dim: u32,
    /// The forward's softcap and sinks ([`LogitOptions`]). Under a softcap the `softcap`
    /// kernels recompute `t = tanh(q.k softcap_scale)` as the logit (times `scale_log2 =
    /// softcap log2 e`) and scale `dS` by `1 - t^2`, the softcap's derivative; the other
    /// kernels ignore `softcap_scale`. The sinks are read by the dsinks kernel only: the
    /// forward's LSE already includes them.
    pub logits: LogitOptions,
    /// `[heads_q]` f32, the sinks' gradient `d sink_h = -sum_rows exp(sink_h - LSE) delta'`
    /// (written by `attention_bwd_dsinks*`); null without sinks.
    pub d_sinks: *mut f32,
}

/// Parameters of the backward kernels over packed sequences (`attention_bwd_*_varlen_*`), the
/// backward of `attention_fwd_varlen_*` ([`super::AttentionVarlenParams`]): sequence `b` owns
/// query rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` of Q, O, dO, dQ and key rows
/// `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]` of K, V, dK, dV; the mask applies per sequence
/// with that sequence's lengths.
///
/// The fields of `base` keep their meaning with these changes: Q, O, dO, dQ are `[total_q,
/// heads_q, D]` and K, V, dK, dV `[total_k, heads_kv, D]` (the batch strides are not used; the
/// sequence strides step between packed rows), `seq_q` and `seq_k` are the maximum lengths
/// (they size the grids), `batch` the number of sequences; LSE, dLSE and `delta'` are
/// `[heads_q, total_q]` f32 and the dQ accumulator `[heads_q, total_q, D]` f32, contiguous.
///
/// The kernels clamp every offset they read from `cu_seqlens_*` into `0 ..= total_*` (and each
/// end to at least its start), so no contents can make them access memory outside the tensors;
/// rows of a sequence past the maximum lengths (contents longer than stated) are not written.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionBwdVarlenParams {
    /// The dense parameters, read as above.
    pub base: AttentionBwdParams,
    /// `[batch + 1]` i32: the first query row of each sequence, then `total_q`.
    pub cu_seqlens_q: *const i32,
    /// `[batch + 1]` i32: the first key row of each sequence, then `total_k`.
    pub cu_seqlens_k: *const i32,
    /// Query rows of Q, O, dO, dQ (and the row stride of LSE, dLSE, `delta'`).
    pub total_q: u32,
    /// Key rows of K, V, dK, dV.
    pub total_k: u32,
}

/// Threads per block of the preprocess and of the dQ conversion.
pub const ROW_THREADS: u32 = 128;
/// Query rows per block of the preprocess and of the dQ conversion.
pub const ROW_BLOCK: u32 = 64;

/// Tiles of the dK/dV kernels (`attention_bwd_*`, `attention_bwd_dkdv_*`) for one head
/// dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BwdTileConfig {
    /// Head dimension D.
    pub head_dim: u32,
    /// Keys per block (16 per warp row).
    pub block_n: u32,
    /// Query rows per step (Q and dO tiles in a 2-stage `cp.async` ring).
    pub block_m: u32,
    /// Warps sharing 16 keys: each recomputes their `S^T` and `dP^T` and owns `D / d_split`
    /// columns of their dK and dV (at D = 256 the accumulators of all D columns would not fit
    /// in one warp's registers).
    pub d_split: u32,
    /// Resident blocks per SM the launch bounds ask for.
    pub blocks_per_sm: u32,
}

impl BwdTileConfig {
    /// Warps per block.
    #[inline]
    pub const fn warps(&self) -> u32 {
        self.block_n / 16 * self.d_split
    }

    /// Threads per block.
    #[inline]
    pub const fn threads(&self) -> u32 {
        self.warps() * WARP_SIZE
    }

    /// dK/dV columns of one warp.
    #[inline]
    pub const fn warp_cols(&self) -> u32 {
        self.head_dim / self.d_split
    }

    /// Column groups of the block's dQ product `dS K` (`[block_m, D]`): warp `w` computes m16
    /// tile `w % (block_m / 16)` over columns group `w / (block_m / 16)`.
    #[inline]
    pub const fn dq_col_groups(&self) -> u32 {
        self.warps() / (self.block_m / 16)
    }

    /// dQ n8 tiles of one warp: the column groups split the `D / 8` tiles as evenly as whole
    /// tiles allow, the first [`dq_tiles_rem`](Self::dq_tiles_rem) groups taking one more.
    #[inline]
    pub const fn dq_tiles(&self) -> u32 {
        self.head_dim / 8 / self.dq_col_groups()
    }

    /// Column groups of the dQ product with one n8 tile more than [`dq_tiles`](Self::dq_tiles).
    #[inline]
    pub const fn dq_tiles_rem(&self) -> u32 {
        self.head_dim / 8 % self.dq_col_groups()
    }

    /// Bytes of one padded row of a `[rows, D]` tile (as in the forward:
    /// [`super::TileConfig::row_bytes`]).
    #[inline]
    pub const fn row_bytes(&self) -> u32 {
        tile_config_of(self.head_dim).row_bytes()
    }

    /// Bytes of one padded row of the `dS^T` tile (`[block_n, block_m]` 16-bit).
    #[inline]
    pub const fn ds_row_bytes(&self) -> u32 {
        self.block_m * 2 + 16
    }

    /// Bytes of a `[rows, D]` tile.
    #[inline]
    pub const fn tile_bytes(&self, rows: u32) -> usize {
        (rows * self.row_bytes()) as usize
    }

    /// Offset of the K tile (`[block_n, D]`).
    #[inline]
    pub const fn k_offset(&self) -> usize {
        0
    }

    /// Offset of the V tile (`[block_n, D]`).
    #[inline]
    pub const fn v_offset(&self) -> usize {
        self.tile_bytes(self.block_n)
    }

    /// Offset of stage `s`'s Q tile (`[block_m, D]`).
    #[inline]
    pub const fn q_offset(&self, s: u32) -> usize {
        2 * self.tile_bytes(self.block_n) + 2 * s as usize * self.tile_bytes(self.block_m)
    }

    /// Offset of stage `s`'s dO tile (`[block_m, D]`).
    #[inline]
    pub const fn do_offset(&self, s: u32) -> usize {
        self.q_offset(s) + self.tile_bytes(self.block_m)
    }

    /// Offset of the `dS^T` tile (`[block_n, block_m]`, keys major; dQ kernels only).
    #[inline]
    pub const fn ds_offset(&self) -> usize {
        self.q_offset(BWD_STAGES)
    }

    /// Dynamic shared memory of the kernel with (`with_dq`) or without the `dS^T` tile.
    #[inline]
    pub const fn smem_bytes(&self, with_dq: bool) -> usize {
        let ds = if with_dq {
            (self.block_n * self.ds_row_bytes()) as usize
        } else {
            0
        };
        self.ds_offset() + ds + SMEM_ALIGN
    }
}

/// Stages of the Q/dO ring of the dK/dV kernels.
pub const BWD_STAGES: u32 = 2;

/// The dK/dV tiles for head dimension `d`, if supported.
pub const fn bwd_tile_config(d: u32) -> Option<BwdTileConfig> {
    if !d.is_multiple_of(16) {
        return None;
    }
    match d {
        // Up to D = 128 the tiles of 64 and 128 (measured); above, those of 256, whose warps
        // split D in halves.
        32..=128 => Some(BwdTileConfig {
            head_dim: d,
            block_n: 64,
            block_m: 32,
            d_split: 1,
            blocks_per_sm: 2,
        }),
        160..=256 if d.is_multiple_of(32) => Some(BwdTileConfig {
            head_dim: d,
            block_n: 64,
            block_m: 32,
            d_split: 2,
            blocks_per_sm: 1,
        }),
        // 144, 176, 208, 240 too: the warps' halves of D are an odd number of n8 tiles, and
        // the dQ product's four column groups split the D / 8 tiles unevenly.
        144..=240 => Some(BwdTileConfig {
            head_dim: d,
            block_n: 64,
            block_m: 32,
            d_split: 2,
            blocks_per_sm: 1,
        }),
        _ => None,
    }
}

/// [`bwd_tile_config`] for a supported head dimension (compile-time use in kernels).
pub const fn bwd_tile_config_of(d: u32) -> BwdTileConfig {
    match bwd_tile_config(d) {
        Some(c) => c,
        None => panic!("unsupported head dimension"),
    }
}

/// Tiles of the deterministic dQ kernel (`attention_bwd_dq_*`) for one head dimension: the
/// forward's structure (a block owns query rows, walks the keys in steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DqTileConfig {
    /// Head dimension D.
    pub head_dim: u32,
    /// Query rows per block (16 per warp).
    pub block_m: u32,
    /// Keys per step (K and V tiles in a 2-stage `cp.async` ring).
    pub block_n: u32,
    /// Resident blocks per SM the launch bounds ask for.
    pub blocks_per_sm: u32,
}

/// Stages of the K/V ring of the dQ kernel.
pub const DQ_STAGES: u32 = 2;

impl DqTileConfig {
    /// Warps per block.
    #[inline]
    pub const fn warps(&self) -> u32 {
        self.block_m / 16
    }

    /// Threads per block.
    #[inline]
    pub const fn threads(&self) -> u32 {
        self.warps() * WARP_SIZE
    }

    /// Bytes of a `[rows, D]` tile.
    #[inline]
    pub const fn tile_bytes(&self, rows: u32) -> usize {
        (rows * tile_config_of(self.head_dim).row_bytes()) as usize
    }

    /// Offset of the Q tile (`[block_m, D]`).
    #[inline]
    pub const fn q_offset(&self) -> usize {
        0
    }

    /// Offset of the dO tile (`[block_m, D]`).
    #[inline]
    pub const fn do_offset(&self) -> usize {
        self.tile_bytes(self.block_m)
    }

    /// Offset of stage `s`'s K tile (`[block_n, D]`).
    #[inline]
    pub const fn k_offset(&self, s: u32) -> usize {
        2 * self.tile_bytes(self.block_m) + 2 * s as usize * self.tile_bytes(self.block_n)
    }

    /// Offset of stage `s`'s V tile (`[block_n, D]`).
    #[inline]
    pub const fn v_offset(&self, s: u32) -> usize {
        self.k_offset(s) + self.tile_bytes(self.block_n)
    }

    /// Dynamic shared memory of the kernel.
    #[inline]
    pub const fn smem_bytes(&self) -> usize {
        self.k_offset(DQ_STAGES) + SMEM_ALIGN
    }
}

/// The dQ tiles for head dimension `d`, if supported.
pub const fn dq_tile_config(d: u32) -> Option<DqTileConfig> {
    if bwd_tile_config(d).is_none() {
        return None;
    }
    match d {
        32..=128 => Some(DqTileConfig {
            head_dim: d,
            block_m: 64,
            block_n: 64,
            blocks_per_sm: 2,
        }),
        // At D = 240 (15 k-slices) steps of 32 keys spill 88 bytes on packed sequences
        // (sm_90a): steps of 16.
        240 => Some(DqTileConfig {
            head_dim: d,
            block_m: 64,
            block_n: 16,
            blocks_per_sm: 1,
        }),
        // The dQ accumulator takes 128 registers per thread at D = 256 (96 at 192): keys in
        // steps of 32.
        144..=256 => Some(DqTileConfig {
            head_dim: d,
            block_m: 64,
            block_n: 32,
            blocks_per_sm: 1,
        }),
        _ => None,
    }
}

/// [`dq_tile_config`] for a supported head dimension (compile-time use in kernels).
pub const fn dq_tile_config_of(d: u32) -> DqTileConfig {
    match dq_tile_config(d) {
        Some(c) => c,
        None => panic!("unsupported head dimension"),
    }
}

/// The backward kernels of one element type and head dimension, on parameters `P`
/// ([`AttentionBwdParams`] for dense batches, [`AttentionBwdVarlenParams`] for packed
/// sequences; the grids' `seq_q`, `seq_k` are then the longest sequence's).
pub struct BwdKernels<P = AttentionBwdParams> {
    /// Element type.
    pub dtype: Dtype,
    /// Head dimension.
    pub head_dim: u32,
    /// `delta'` and the zeroed dQ accumulator; grid `(ceil(seq_q / ROW_BLOCK), heads_q, batch)`.
    pub pre: Kernel<P>,
    /// dK, dV, and dQ by atomics; grid `(ceil(seq_k / block_n), heads_kv, batch)`.
    pub dkdv_dq: Kernel<P, BwdTileConfig>,
    /// dK and dV only (deterministic mode); grid as for `dkdv_dq`.
    pub dkdv: Kernel<P, BwdTileConfig>,
    /// dQ of the accumulator times the scale; grid as for `pre`.
    pub dq_convert: Kernel<P>,
    /// dQ recomputed per query block (deterministic mode); grid
    /// `(ceil(seq_q / block_m), heads_q, batch)`.
    pub dq: Kernel<P, DqTileConfig>,
    /// `dkdv_dq` under a softcap.
    pub dkdv_dq_softcap: Kernel<P, BwdTileConfig>,
    /// `dkdv` under a softcap.
    pub dkdv_softcap: Kernel<P, BwdTileConfig>,
    /// `dq` under a softcap.
    pub dq_softcap: Kernel<P, DqTileConfig>,
    /// Tiles of `dkdv_dq` and `dkdv`.
    pub tiles: BwdTileConfig,
    /// Tiles of `dq`.
    pub dq_tiles: DqTileConfig,
}

fn no_smem(_: ()) -> usize {
    0
}

fn smem_with_dq(t: BwdTileConfig) -> usize {
    t.smem_bytes(true)
}

fn smem_without_dq(t: BwdTileConfig) -> usize {
    t.smem_bytes(false)
}

fn dq_smem(t: DqTileConfig) -> usize {
    t.smem_bytes()
}

/// The kernels of one element type and head dimension (`names`: pre, main, dkdv, convert,
/// dq, then the softcap forms of main, dkdv, dq).
const fn bwd<P>(dtype: Dtype, d: u32, names: [&'static str; 8]) -> BwdKernels<P> {
    let tiles = bwd_tile_config_of(d);
    let dq_tiles = dq_tile_config_of(d);
    let (threads, blocks) = (tiles.threads(), tiles.blocks_per_sm);
    let (dq_threads, dq_blocks) = (dq_tiles.threads(), dq_tiles.blocks_per_sm);
    BwdKernels {
        dtype,
        head_dim: d,
        pre: Kernel::new(names[0], ROW_THREADS, 1, no_smem),
        dkdv_dq: Kernel::new(names[1], threads, blocks, smem_with_dq),
        dkdv: Kernel::new(names[2], threads, blocks, smem_without_dq),
        dq_convert: Kernel::new(names[3], ROW_THREADS, 1, no_smem),
        dq: Kernel::new(names[4], dq_threads, dq_blocks, dq_smem),
        dkdv_dq_softcap: Kernel::new(names[5], threads, blocks, smem_with_dq),
        dkdv_softcap: Kernel::new(names[6], threads, blocks, smem_without_dq),
        dq_softcap: Kernel::new(names[7], dq_threads, dq_blocks, dq_smem),
        tiles,
        dq_tiles,
    }
}

/// The eight names of one entry: `attention_bwd_{role}{layout}_{dtype}_d{d}`, the softcap
/// forms with `_softcap` after the role.
macro_rules! bwd_entry {
    ($dtype:ident, $t:literal, $d:literal, $layout:literal) => {
        bwd(
            Dtype::$dtype,
            $d,
            [
                concat!("attention_bwd_pre", $layout, "_", $t, "_d", $d),
                concat!("attention_bwd", $layout, "_", $t, "_d", $d),
                concat!("attention_bwd_dkdv", $layout, "_", $t, "_d", $d),
                concat!("attention_bwd_dq_convert", $layout, "_", $t, "_d", $d),
                concat!("attention_bwd_dq", $layout, "_", $t, "_d", $d),
                concat!("attention_bwd_softcap", $layout, "_", $t, "_d", $d),
                concat!("attention_bwd_dkdv_softcap", $layout, "_", $t, "_d", $d),
                concat!("attention_bwd_dq_softcap", $layout, "_", $t, "_d", $d),
            ],
        )
    };
}

/// The backward kernels for each element type and head dimension, and over packed sequences
/// (with the same tiles), for every head dimension of the forward
/// ([`crate::with_attention_head_dims!`]).
macro_rules! bwd_tables {
    ($($d:literal),*) => {
        /// The backward kernels for each element type and head dimension.
        pub const BWD_KERNELS: [BwdKernels; 2 * HEAD_DIMS.len()] = [
            $(bwd_entry!(Bf16, "bf16", $d, ""),)*
            $(bwd_entry!(F16, "f16", $d, ""),)*
        ];

        /// The backward kernels over packed sequences for each element type and head dimension
        /// (the tiles of [`BWD_KERNELS`]).
        pub const BWD_VARLEN_KERNELS: [BwdKernels<AttentionBwdVarlenParams>;
            2 * HEAD_DIMS.len()] = [
            $(bwd_entry!(Bf16, "bf16", $d, "_varlen"),)*
            $(bwd_entry!(F16, "f16", $d, "_varlen"),)*
        ];
    };
}

crate::with_attention_head_dims!(bwd_tables!());

/// Threads per block of the dsinks kernels.
pub const DSINKS_THREADS: u32 = 256;

/// Shared memory of the dsinks kernels: one f32 partial sum per warp.
fn dsinks_smem(_: ()) -> usize {
    (DSINKS_THREADS / WARP_SIZE) as usize * 4
}

/// `attention_bwd_dsinks`: the sinks' gradient on a dense batch, grid `(heads_q, 1, 1)`,
/// after the preprocess (it reads LSE, `delta'` and the sinks, writes `d_sinks`).
pub const ATTENTION_BWD_DSINKS: Kernel<AttentionBwdParams> =
    Kernel::new("attention_bwd_dsinks", DSINKS_THREADS, 1, dsinks_smem);

/// `attention_bwd_dsinks_varlen`: [`ATTENTION_BWD_DSINKS`] over packed sequences.
pub const ATTENTION_BWD_DSINKS_VARLEN: Kernel<AttentionBwdVarlenParams> = Kernel::new(
    "attention_bwd_dsinks_varlen",
    DSINKS_THREADS,
    1,
    dsinks_smem,
);

/// `negative_attention_bwd_no_ds_barrier`: `attention_bwd_bf16_d64` without the barrier between
/// the warps' `dS^T` stores and their reads for the dQ product, a negative control for the test
/// suites (`gpu-kernels/src/negative.rs`); the launch shape, parameters and shared memory of
/// `attention_bwd_bf16_d64`.
pub const NEGATIVE_ATTENTION_BWD_NO_DS_BARRIER: Kernel<AttentionBwdParams, BwdTileConfig> =
    Kernel::new(
        "negative_attention_bwd_no_ds_barrier",
        bwd_tile_config_of(64).threads(),
        bwd_tile_config_of(64).blocks_per_sm,
        smem_with_dq,
    );

/// The backward's negative controls (never launched by the library).
pub const NEGATIVE: &[KernelDecl] = &[
    NEGATIVE_ATTENTION_BWD_NO_DS_BARRIER.info(),
    super::hopper_bwd::NEGATIVE_ATTENTION_BWD_HOPPER_EARLY_EMPTY.info(),
];

/// Kernels per entry of [`BWD_KERNELS`] and [`BWD_VARLEN_KERNELS`].
const PER_ENTRY: usize = 8;

/// Backward kernels: [`PER_ENTRY`] per entry of [`BWD_KERNELS`] and [`BWD_VARLEN_KERNELS`],
/// then the two dsinks kernels.
pub const BWD_KERNEL_COUNT: usize = PER_ENTRY * (BWD_KERNELS.len() + BWD_VARLEN_KERNELS.len()) + 2;

/// The handles of `k`, in launch-table order.
const fn decls_of<P>(k: &BwdKernels<P>) -> [KernelDecl; PER_ENTRY] {
    [
        k.pre.info(),
        k.dkdv_dq.info(),
        k.dkdv.info(),
        k.dq_convert.info(),
        k.dq.info(),
        k.dkdv_dq_softcap.info(),
        k.dkdv_softcap.info(),
        k.dq_softcap.info(),
    ]
}

/// Every backward handle (dense, then packed), for the family's table.
pub const fn bwd_kernel_decls() -> [KernelDecl; BWD_KERNEL_COUNT] {
    let mut out = [BWD_KERNELS[0].pre.info(); BWD_KERNEL_COUNT];
    let mut i = 0;
    while i < BWD_KERNELS.len() + BWD_VARLEN_KERNELS.len() {
        let decls = if i < BWD_KERNELS.len() {
            decls_of(&BWD_KERNELS[i])
        } else {
            decls_of(&BWD_VARLEN_KERNELS[i - BWD_KERNELS.len()])
        };
        let mut j = 0;
        while j < PER_ENTRY {
            out[PER_ENTRY * i + j] = decls[j];
            j += 1;
        }
        i += 1;
    }
    out[BWD_KERNEL_COUNT - 2] = ATTENTION_BWD_DSINKS.info();
    out[BWD_KERNEL_COUNT - 1] = ATTENTION_BWD_DSINKS_VARLEN.info();
    out
}

/// The backward kernels for `dtype` and head dimension `head_dim`, if built.
pub fn bwd_kernels(dtype: Dtype, head_dim: u32) -> Option<&'static BwdKernels> {
    const ALL: &[BwdKernels] = &BWD_KERNELS;
    ALL.iter()
        .find(|k| k.dtype == dtype && k.head_dim == head_dim)
}

/// The backward kernels over packed sequences for `dtype` and head dimension `head_dim`, if
/// built.
pub fn bwd_varlen_kernels(
    dtype: Dtype,
    head_dim: u32,
) -> Option<&'static BwdKernels<AttentionBwdVarlenParams>> {
    const ALL: &[BwdKernels<AttentionBwdVarlenParams>] = &BWD_VARLEN_KERNELS;
    ALL.iter()
        .find(|k| k.dtype == dtype && k.head_dim == head_dim)
}
