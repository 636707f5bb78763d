//! Gated linear attention (GLA) forward, chunkwise: what the kernels (`gpu-kernels/src/gla`) and
//! the host (`host/src/gla`) share. The semantics are specified by the f64 recurrence in
//! `host/src/gla/reference.rs`:
//! `S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t`, `o_t = scale q_t S_t`, per sequence and head.
//!
//! # Kernels
//! - `gla_fwd_dk{DK}_dv{DV}`: one block per (segment, head). A segment is a run of tokens of one
//!   sequence; the block starts from the segment's initial state and walks its chunks of
//!   [`CHUNK`] tokens in order, writing the outputs (and, for the last segment of a sequence,
//!   the final state).
//! - `gla_states_dk{DK}_dv{DV}`: the same walk without outputs, from a zero state: the state a
//!   segment adds (`delta`) and its total log2-decay per key channel. Run for every segment that
//!   is not the last of its sequence, only when a sequence is split into several segments.
//! - `gla_combine`: per (sequence, head) and state element, the initial state of each later
//!   segment: `S_{i+1} = exp2(D_i) S_i + delta_i` in f32.
//!
//! Splitting sequences into segments is what gives the GPU enough blocks when `batch * heads`
//! is small (long sequences); with one segment per sequence only `gla_fwd` runs.
//!
//! The backward's kernels (`gla_bwd_*`) are declared in [`backward`] and listed in [`KERNELS`].

use crate::{Kernel, KernelDecl, SMEM_ALIGN, WARP_SIZE, align_up};

pub mod backward;

/// Tokens per chunk: the rows of one `mma.sync` m16 tile. The intra-chunk part is this one
/// 16 x 16 block; everything before the chunk reaches it through the state.
pub const CHUNK: u32 = 16;
/// Tokens per half chunk: the diagonal blocks of the intra-chunk product are computed per half,
/// each relative to its own reference point (see the kernel documentation).
pub const HALF: u32 = 8;
/// Tokens per pipeline step (one `cp.async` stage holds this many rows of q, k, g, v).
pub const STEP: u32 = 32;
/// Chunks per pipeline step.
pub const CHUNKS_PER_STEP: u32 = STEP / CHUNK;
/// Head dimensions (of keys and of values) with kernels.
pub const HEAD_DIMS: [u32; 2] = [64, 128];
/// Value columns per warp (the state columns a warp owns).
pub const DV_PER_WARP: u32 = 16;
/// The kernels clamp every log-decay below at this value (natural log): `g_eff = max(g, G_FLOOR)`.
/// `exp(-20) = 2.1e-9`, so a token with `g < -20` forgets its past to within that factor
/// instead of exactly as much as asked; in exchange every factor the kernels form stays within
/// `exp(+-70)` (f32 and bf16 range; see the kernel documentation). `g` in `[-20, 0]` is used as
/// given.
pub const G_FLOOR: f32 = -20.0;
/// Threads per block of `gla_combine`.
pub const COMBINE_THREADS: u32 = 256;

/// Segment flag: the first segment of its sequence (it starts from the user's initial state, or
/// zero).
pub const SEG_FIRST: u32 = 1;
/// Segment flag: the last segment of its sequence (it writes the final state, if asked for).
pub const SEG_LAST: u32 = 2;

/// One segment of work: `len` tokens of one sequence starting at token row `start` of the
/// flattened token axis (`batch * seq_len` rows, or the packed rows of `cu_seqlens`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    /// First token row.
    pub start: u32,
    /// Tokens (>= 1).
    pub len: u32,
    /// Sequence index (indexes the initial and final states).
    pub seq: u32,
    /// [`SEG_FIRST`] | [`SEG_LAST`].
    pub flags: u32,
}

/// A sequence split into several segments, for `gla_combine`: segments `first .. first + count`
/// (consecutive in the segment table, in token order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CombineEntry {
    /// Sequence index.
    pub seq: u32,
    /// Its first segment.
    pub first: u32,
    /// Its number of segments (>= 2).
    pub count: u32,
    /// Unused (keeps the entry 16 bytes).
    pub pad: u32,
}

/// The tile configuration of one (DK, DV) pair: the single table kernels and host share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlaConfig {
    /// Key head dimension.
    pub dk: u32,
    /// Value head dimension.
    pub dv: u32,
    /// Stages of the `cp.async` ring (each [`STEP`] tokens of q, k, g and v).
    pub stages: u32,
    /// Resident blocks per SM the launch bounds ask for.
    pub blocks_per_sm: u32,
}

impl GlaConfig {
    /// Warps per block: each owns [`DV_PER_WARP`] value columns of the state and the output.
    pub const fn warps(&self) -> u32 {
        self.dv / DV_PER_WARP
    }

    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        self.warps() * WARP_SIZE
    }

    /// Threads that share one pair of key channels in the element-wise phase (`P`): thread `tid`
    /// works on channels `2 (tid / P)`, `2 (tid / P) + 1` and tokens
    /// `(tid % P) * tokens_per_thread ..` of the chunk.
    pub const fn threads_per_pair(&self) -> u32 {
        self.threads() / (self.dk / 2)
    }

    /// Tokens of a chunk each thread handles in the element-wise phase (`CHUNK / P`, at most
    /// [`HALF`], so a thread's tokens lie in one half).
    pub const fn tokens_per_thread(&self) -> u32 {
        CHUNK / self.threads_per_pair()
    }

    /// Bytes of a shared-memory row of `d` 16-bit elements: 16 bytes of padding put consecutive
    /// rows 16 bytes apart modulo 128, so the 8 rows of an `ldmatrix` phase hit distinct banks.
    pub const fn row_bytes(d: u32) -> u32 {
        d * 2 + 16
    }

    /// Bytes of one raw stage: q, k, g (`[STEP, dk]`) and v (`[STEP, dv]`).
    pub const fn stage_bytes(&self) -> usize {
        (STEP * (3 * Self::row_bytes(self.dk) + Self::row_bytes(self.dv))) as usize
    }

    /// Offset of stage `s`'s q tile.
    pub const fn q_offset(&self, s: u32) -> usize {
        s as usize * self.stage_bytes()
    }

    /// Offset of stage `s`'s k tile.
    pub const fn k_offset(&self, s: u32) -> usize {
        self.q_offset(s) + (STEP * Self::row_bytes(self.dk)) as usize
    }

    /// Offset of stage `s`'s g tile.
    pub const fn g_offset(&self, s: u32) -> usize {
        self.k_offset(s) + (STEP * Self::row_bytes(self.dk)) as usize
    }

    /// Offset of stage `s`'s v tile.
    pub const fn v_offset(&self, s: u32) -> usize {
        self.g_offset(s) + (STEP * Self::row_bytes(self.dk)) as usize
    }

    /// Rows (of `dk` elements) of one variant buffer: `q_inter` 16, `q_diag` 16, `k_half0` 8,
    /// `k_half1` 16, `k_state` 16.
    pub const VARIANT_ROWS: u32 = 72;

    /// Bytes of one variant buffer (the bf16 tiles and the f32 decay row).
    pub const fn variant_bytes(&self) -> usize {
        align_up(
            (Self::VARIANT_ROWS * Self::row_bytes(self.dk) + 4 * self.dk) as usize,
            128,
        )
    }

    /// Offset of variant buffer `b` (0 or 1).
    pub const fn variant_offset(&self, b: u32) -> usize {
        self.stages as usize * self.stage_bytes() + b as usize * self.variant_bytes()
    }

    /// Offset of `q_inter` (`[16, dk]`: `q_t exp(b_t)`) in buffer `b`.
    pub const fn q_inter_offset(&self, b: u32) -> usize {
        self.variant_offset(b)
    }

    /// Offset of `q_diag` (`[16, dk]`: `q_t exp(b_t - M_half(t))`) in buffer `b`.
    pub const fn q_diag_offset(&self, b: u32) -> usize {
        self.q_inter_offset(b) + (CHUNK * Self::row_bytes(self.dk)) as usize
    }

    /// Offset of `k_half0` (`[8, dk]`: `k_s exp(M_0 - b_s)`, first half) in buffer `b`.
    pub const fn k_half0_offset(&self, b: u32) -> usize {
        self.q_diag_offset(b) + (CHUNK * Self::row_bytes(self.dk)) as usize
    }

    /// Offset of `k_half1` (`[16, dk]`: `k_s exp(M_1 - b_s)`) in buffer `b`.
    pub const fn k_half1_offset(&self, b: u32) -> usize {
        self.k_half0_offset(b) + (HALF * Self::row_bytes(self.dk)) as usize
    }

    /// Offset of `k_state` (`[16, dk]`: `k_s exp(b_15 - b_s)`) in buffer `b`.
    pub const fn k_state_offset(&self, b: u32) -> usize {
        self.k_half1_offset(b) + (CHUNK * Self::row_bytes(self.dk)) as usize
    }

    /// Offset of `decay` (`[dk]` f32: `exp(b_15)`, the chunk's decay of the state) in buffer `b`.
    pub const fn decay_offset(&self, b: u32) -> usize {
        self.k_state_offset(b) + (CHUNK * Self::row_bytes(self.dk)) as usize
    }

    /// Dynamic shared memory of `gla_fwd` and `gla_states`.
    pub const fn smem_bytes(&self) -> usize {
        self.variant_offset(2) + SMEM_ALIGN
    }
}

/// The shared-memory layout of [`GlaConfig`] as plain offsets (for kernels: evaluated at
/// compile time, so no layout function is called at run time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlaLayout {
    /// Bytes between consecutive raw stages.
    pub stage_bytes: u32,
    /// Offsets of the q, k, g, v tiles of stage 0.
    pub q: u32,
    /// See `q`.
    pub k: u32,
    /// See `q`.
    pub g: u32,
    /// See `q`.
    pub v: u32,
    /// Bytes between the two variant buffers.
    pub variant_bytes: u32,
    /// Offsets of the tiles of variant buffer 0.
    pub q_inter: u32,
    /// See `q_inter`.
    pub q_diag: u32,
    /// See `q_inter`.
    pub k_half0: u32,
    /// See `q_inter`.
    pub k_half1: u32,
    /// See `q_inter`.
    pub k_state: u32,
    /// See `q_inter`.
    pub decay: u32,
}

impl GlaConfig {
    /// [`GlaLayout`] of this configuration.
    pub const fn layout(&self) -> GlaLayout {
        GlaLayout {
            stage_bytes: self.stage_bytes() as u32,
            q: self.q_offset(0) as u32,
            k: self.k_offset(0) as u32,
            g: self.g_offset(0) as u32,
            v: self.v_offset(0) as u32,
            variant_bytes: self.variant_bytes() as u32,
            q_inter: self.q_inter_offset(0) as u32,
            q_diag: self.q_diag_offset(0) as u32,
            k_half0: self.k_half0_offset(0) as u32,
            k_half1: self.k_half1_offset(0) as u32,
            k_state: self.k_state_offset(0) as u32,
            decay: self.decay_offset(0) as u32,
        }
    }
}

/// The configuration for head dimensions `(dk, dv)`, if supported.
pub const fn config(dk: u32, dv: u32) -> Option<GlaConfig> {
    match (dk, dv) {
        (64, 64) => Some(GlaConfig {
            dk,
            dv,
            stages: 2,
            blocks_per_sm: 3,
        }),
        (128, 64) => Some(GlaConfig {
            dk,
            dv,
            stages: 2,
            blocks_per_sm: 2,
        }),
        // 256 threads: 128 registers per thread would spill the state (64 f32 at dk = 128), so
        // one block per SM, with a deeper ring instead.
        (64, 128) | (128, 128) => Some(GlaConfig {
            dk,
            dv,
            stages: 3,
            blocks_per_sm: 1,
        }),
        _ => None,
    }
}

/// [`config`] for a supported pair (compile-time use in kernels).
pub const fn config_of(dk: u32, dv: u32) -> GlaConfig {
    match config(dk, dv) {
        Some(c) => c,
        None => panic!("unsupported head dimensions"),
    }
}

/// Parameters of `gla_fwd_dk{DK}_dv{DV}` and `gla_states_dk{DK}_dv{DV}` (grid
/// `(segments, heads)`, [`GlaConfig::threads`] threads, [`GlaConfig::smem_bytes`]).
///
/// Tensors are contiguous: q, k, g `[rows, heads, dk]`, v and o `[rows, heads, dv]` (bf16
/// bits), where `rows` is the flattened token axis; states are `[seqs, heads, dk, dv]` f32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GlaParams {
    /// Queries (unused by `gla_states`).
    pub q: *const u16,
    /// Keys.
    pub k: *const u16,
    /// Values.
    pub v: *const u16,
    /// Log-decays (natural log, clamped below at [`G_FLOOR`] by the kernels).
    pub g: *const u16,
    /// Outputs (unused by `gla_states`).
    pub o: *mut u16,
    /// The segment table (`gridDim.x` entries).
    pub segments: *const Segment,
    /// Initial states `[seqs, heads, dk, dv]`, read by first segments when `has_init != 0`.
    pub init_state: *const f32,
    /// Final states `[seqs, heads, dk, dv]`, written by last segments when `has_final != 0`
    /// (`gla_fwd` only).
    pub final_state: *mut f32,
    /// Initial states of segments that are not first, `[segments, heads, dk, dv]` (written by
    /// `gla_combine`, read by `gla_fwd`).
    pub seg_init: *const f32,
    /// State added by each segment from a zero state, `[segments, heads, dk, dv]` (written by
    /// `gla_states`).
    pub delta: *mut f32,
    /// Total log2-decay of each segment per key channel, `[segments, heads, dk]` (written by
    /// `gla_states`).
    pub decay_log2: *mut f32,
    /// Heads.
    pub heads: u32,
    /// Output scale (usually `dk^-0.5`).
    pub scale: f32,
    /// Whether `init_state` is given.
    pub has_init: u32,
    /// Whether `final_state` is wanted.
    pub has_final: u32,
}

/// Parameters of `gla_combine` (grid `(entries, heads, ceil(dk dv / COMBINE_THREADS))`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CombineParams {
    /// The sequences with several segments.
    pub entries: *const CombineEntry,
    /// Initial states `[seqs, heads, dk, dv]` when `has_init != 0`.
    pub init_state: *const f32,
    /// Written: initial states of later segments, `[segments, heads, dk, dv]`.
    pub seg_init: *mut f32,
    /// Read: per-segment state from zero, `[segments, heads, dk, dv]`.
    pub delta: *const f32,
    /// Read: per-segment log2-decay, `[segments, heads, dk]`.
    pub decay_log2: *const f32,
    /// Heads.
    pub heads: u32,
    /// Key head dimension.
    pub dk: u32,
    /// Value head dimension.
    pub dv: u32,
    /// Whether `init_state` is given.
    pub has_init: u32,
}

// ---------------------------------------------------------------------------------------------
// The warp-specialized pingpong kernels (sm_90a): `gla_fwd_pp_dk{DK}_dv{DV}` and
// `gla_states_pp_dk{DK}_dv{DV}`, same segments, same math, same outputs as the baseline.

/// Most consumer warpgroups per block of a pingpong kernel (each owns one (segment, head)
/// item); [`PingpongConfig::consumers`] says how many a configuration has.
pub const PP_MAX_CONSUMERS: u32 = 3;
/// Registers the producer warpgroup keeps (`setmaxnreg.dec`).
pub const PP_PRODUCER_REGS: u32 = 24;
/// Named barrier ids: `PP_ORDER_BARRIER + c` orders consumer `c`'s GEMM phase after the
/// previous consumer's in the turn order (256 threads: consumer `c` syncs, its predecessor
/// arrives); `PP_LOCAL_BARRIER + c` is consumer `c`'s own barrier (128 threads). Id 0 is the
/// block barrier.
pub const PP_ORDER_BARRIER: u32 = 1;
/// See [`PP_ORDER_BARRIER`].
pub const PP_LOCAL_BARRIER: u32 = PP_ORDER_BARRIER + PP_MAX_CONSUMERS;
/// Warpgroups of a `gla_states_pp_*` block (one (segment, head) item): warpgroup `w` walks the
/// `w`-th part of the segment's steps, issuing its own TMA loads.
pub const PP_STATE_GROUPS: u32 = 2;
/// Ring stages of each warpgroup of the pingpong state pass (its loads run
/// `PP_STATE_STAGES - 1` steps ahead).
pub const PP_STATE_STAGES: u32 = 3;
/// Threads of a `gla_states_pp_*` block.
pub const PP_STATE_THREADS: u32 = PP_STATE_GROUPS * crate::WARPGROUP_SIZE;
/// Named barrier id of the shared-item mode ([`PingpongConfig::shares_item`]): both consumers
/// (256 threads) sync on it twice per step, after the element-wise phase and after the scores.
pub const PP_PAIR_BARRIER: u32 = PP_LOCAL_BARRIER + PP_MAX_CONSUMERS;
/// Elements of a 128-byte swizzled row: every TMA box and `wgmma` tile is stored as column
/// blocks of this many 16-bit elements.
pub const PP_ATOM: u32 = 64;

/// The shared-memory layout of a pingpong kernel for one `(dk, dv)` pair. Every offset is from
/// the 1024-byte aligned dynamic shared-memory base; consumer `c`'s region starts at
/// `c * consumer_bytes()`, the mbarriers after both regions.
///
/// Per consumer: a ring of `stages` raw stages (q, k, g `[step, dk]`, v `[step, dv]` as TMA
/// writes them: `d / 64` column blocks of `step` rows of 128 bytes, 128-byte swizzle), then the
/// operand tiles of one step: `q_inter` and `k_state` (`[step, dk]`, same swizzled layout, read
/// by `wgmma`), `p` (16 rows of 128 bytes, swizzled: the intra-chunk scores of chunk `j` of the
/// step at bytes `32 j ..`, the K-major B operand of `o^T += v^T P^T`), `q_diag`, `k_half0`,
/// `k_half1` (`[step, dk]` in padded rows of [`GlaConfig::row_bytes`], read by `ldmatrix`) and
/// the decay rows (`[step / 16, dk]` f32). In the shared-item mode
/// ([`PingpongConfig::shares_item`]) the block has one ring (v with all value columns) and two
/// operand sets after it ([`PingpongConfig::shared_region`]). The state pass has a layout of
/// its own (`state_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingpongConfig {
    /// Key head dimension.
    pub dk: u32,
    /// Value columns of one item (of one consumer's state): the value head dimension divided
    /// by [`PingpongConfig::dv_parts`].
    pub dv: u32,
    /// Items per (segment, head): the value columns are split into this many parts of `dv`
    /// columns, each an independent GLA problem with the same q, k, g (the recurrence never
    /// mixes value columns), each one item.
    pub dv_parts: u32,
    /// Tokens per ring stage (a multiple of [`STEP`], at most 64 = four chunks).
    pub step: u32,
    /// Ring stages per consumer (per block in the shared-item mode).
    pub stages: u32,
    /// Consumer warpgroups per block (2 ..= [`PP_MAX_CONSUMERS`]), taking their GEMM phases in
    /// turns.
    pub consumers: u32,
}

impl PingpongConfig {
    /// Threads per block: a producer warpgroup and the consumers.
    #[inline]
    pub const fn threads(&self) -> u32 {
        (1 + self.consumers) * crate::WARPGROUP_SIZE
    }

    /// Registers each consumer warpgroup gets (`setmaxnreg.inc`, a multiple of 8, at most
    /// 240): what the 64K register file leaves after the producer's [`PP_PRODUCER_REGS`].
    #[inline]
    pub const fn consumer_regs(&self) -> u32 {
        let per = (65536 / crate::WARPGROUP_SIZE - PP_PRODUCER_REGS) / self.consumers / 8 * 8;
        if per > 240 { 240 } else { per }
    }

    /// Bytes of one `[rows, d]` swizzled tile (`d / 64` column blocks).
    #[inline]
    pub const fn tile_bytes(&self, d: u32) -> u32 {
        (d / PP_ATOM) * self.block_bytes()
    }

    /// Bytes between the column blocks of a swizzled `[step, d]` tile.
    #[inline]
    pub const fn block_bytes(&self) -> u32 {
        self.step * 128
    }

    /// Whether the block's consumers are the `dv_parts` value parts of one (segment, head)
    /// (`consumers == dv_parts`): then they share one ring (v with all value columns) and the
    /// element-wise phase and scores of each step are computed once, consumer `c` taking
    /// chunk `c` of the step, into one of two operand sets (set `step % 2`).
    #[inline]
    pub const fn shares_item(&self) -> bool {
        self.dv_parts > 1
    }

    /// Value columns of a ring stage: all of the head's when the item is shared, else the
    /// item's.
    #[inline]
    pub const fn ring_dv(&self) -> u32 {
        if self.shares_item() {
            self.dv * self.dv_parts
        } else {
            self.dv
        }
    }

    /// Bytes of one raw stage (q, k, g, v).
    #[inline]
    pub const fn stage_bytes(&self) -> u32 {
        3 * self.tile_bytes(self.dk) + self.tile_bytes(self.ring_dv())
    }

    /// Transaction bytes of a stage's loads (without q in the state pass).
    #[inline]
    pub const fn load_bytes(&self, with_q: bool) -> u32 {
        self.stage_bytes() - if with_q { 0 } else { self.tile_bytes(self.dk) }
    }

    /// Offset of stage `s`'s q tile within a consumer region (k, g, v follow).
    #[inline]
    pub const fn q_offset(&self, s: u32) -> u32 {
        s * self.stage_bytes()
    }

    /// Offset of stage `s`'s k tile.
    #[inline]
    pub const fn k_offset(&self, s: u32) -> u32 {
        self.q_offset(s) + self.tile_bytes(self.dk)
    }

    /// Offset of stage `s`'s g tile.
    #[inline]
    pub const fn g_offset(&self, s: u32) -> u32 {
        self.k_offset(s) + self.tile_bytes(self.dk)
    }

    /// Offset of stage `s`'s v tile.
    #[inline]
    pub const fn v_offset(&self, s: u32) -> u32 {
        self.g_offset(s) + self.tile_bytes(self.dk)
    }

    /// Offset of the swizzled `q_inter` tile.
    #[inline]
    pub const fn q_inter_offset(&self) -> u32 {
        self.q_offset(self.stages)
    }

    /// Offset of the swizzled `k_state` tile.
    #[inline]
    pub const fn k_state_offset(&self) -> u32 {
        self.q_inter_offset() + self.tile_bytes(self.dk)
    }

    /// Offset of the swizzled score tile `p` (16 rows of 128 bytes).
    #[inline]
    pub const fn p_offset(&self) -> u32 {
        self.k_state_offset() + self.tile_bytes(self.dk)
    }

    /// Offset of the padded `q_diag` tile.
    #[inline]
    pub const fn q_diag_offset(&self) -> u32 {
        self.p_offset() + 16 * 128
    }

    /// Offset of the padded `k_half0` tile.
    #[inline]
    pub const fn k_half0_offset(&self) -> u32 {
        self.q_diag_offset() + self.step * GlaConfig::row_bytes(self.dk)
    }

    /// Offset of the padded `k_half1` tile.
    #[inline]
    pub const fn k_half1_offset(&self) -> u32 {
        self.k_half0_offset() + self.step * GlaConfig::row_bytes(self.dk)
    }

    /// Offset of the decay rows (`[step / 16, dk]` f32).
    #[inline]
    pub const fn decay_offset(&self) -> u32 {
        self.k_half1_offset() + self.step * GlaConfig::row_bytes(self.dk)
    }

    /// Bytes of one consumer's region (a multiple of 1024, so both regions' swizzled tiles
    /// stay 1024-byte aligned).
    #[inline]
    pub const fn consumer_bytes(&self) -> u32 {
        align_up(
            (self.decay_offset() + (self.step / CHUNK) * self.dk * 4) as usize,
            1024,
        ) as u32
    }

    /// Bytes of one operand set (`q_inter` .. the decay rows; a multiple of 1024).
    #[inline]
    pub const fn tile_set_bytes(&self) -> u32 {
        self.consumer_bytes() - self.q_inter_offset()
    }

    /// Base of the region whose operand set is set `b` in the shared-item mode: the block's one
    /// ring, then the sets (so `region + q_inter_offset()` is set `b`'s `q_inter`).
    #[inline]
    pub const fn shared_region(&self, b: u32) -> u32 {
        b * self.tile_set_bytes()
    }

    /// Offset of the mbarriers: `full[c][s]` at `+ 8 (c stages + s)`, `empty[c][s]` after all
    /// `full` (one ring, `c = 0`, in the shared-item mode).
    #[inline]
    pub const fn barriers_offset(&self) -> u32 {
        if self.shares_item() {
            self.q_inter_offset() + 2 * self.tile_set_bytes()
        } else {
            self.consumers * self.consumer_bytes()
        }
    }

    /// Dynamic shared memory of the pingpong kernels (with the alignment slack).
    #[inline]
    pub const fn smem_bytes(&self) -> usize {
        self.barriers_offset() as usize + 16 * (self.consumers * self.stages) as usize + SMEM_ALIGN
    }

    // The state pass (`gla_states_pp_*`): one block per (segment, head) with all `dv *
    // dv_parts` value columns, [`PP_STATE_GROUPS`] warpgroups each walking a part of the
    // segment; warpgroup `w`'s region (at `w * state_region_bytes()`) is a ring of
    // [`PP_STATE_STAGES`] stages (k, g `[step, dk]`, v `[step, dv dv_parts]`, swizzled as
    // above) and two `k_state` tiles (`[step, dk]`); the `full` mbarriers follow the regions.

    /// Value columns of a state-pass item (the whole value head dimension).
    #[inline]
    pub const fn state_dv(&self) -> u32 {
        self.dv * self.dv_parts
    }

    /// Bytes of one stage of the state pass (k, g, v).
    #[inline]
    pub const fn state_stage_bytes(&self) -> u32 {
        2 * self.tile_bytes(self.dk) + self.tile_bytes(self.state_dv())
    }

    /// Offset of state-pass stage `s`'s k tile within a warpgroup's region (g, v follow).
    #[inline]
    pub const fn state_k_offset(&self, s: u32) -> u32 {
        s * self.state_stage_bytes()
    }

    /// Offset of state-pass stage `s`'s g tile.
    #[inline]
    pub const fn state_g_offset(&self, s: u32) -> u32 {
        self.state_k_offset(s) + self.tile_bytes(self.dk)
    }

    /// Offset of state-pass stage `s`'s v tile.
    #[inline]
    pub const fn state_v_offset(&self, s: u32) -> u32 {
        self.state_g_offset(s) + self.tile_bytes(self.dk)
    }

    /// Offset of the state pass's `k_state` tile `b` (0 or 1) within a warpgroup's region.
    #[inline]
    pub const fn state_k_state_offset(&self, b: u32) -> u32 {
        self.state_k_offset(PP_STATE_STAGES) + b * self.tile_bytes(self.dk)
    }

    /// Bytes of one warpgroup's region in the state pass (a multiple of 1024).
    #[inline]
    pub const fn state_region_bytes(&self) -> u32 {
        align_up(self.state_k_state_offset(2) as usize, 1024) as u32
    }

    /// Offset of the state pass's mbarriers (`full[w][s]` at `+ 8 (w PP_STATE_STAGES + s)`).
    #[inline]
    pub const fn state_barriers_offset(&self) -> u32 {
        PP_STATE_GROUPS * self.state_region_bytes()
    }

    /// Dynamic shared memory of `gla_states_pp_*` (with the alignment slack).
    #[inline]
    pub const fn state_smem_bytes(&self) -> usize {
        self.state_barriers_offset() as usize
            + 8 * (PP_STATE_GROUPS * PP_STATE_STAGES) as usize
            + SMEM_ALIGN
    }
}

/// The pingpong configuration for `(dk, dv)`: two consumers, stages of 64 tokens at
/// `dk = dv = 64` and of 32 tokens otherwise, two per consumer's ring. At `dk = dv = 128` an
/// item is half of the value columns (`dv_parts = 2`): a whole `128 x 128` state (128 f32
/// registers per consumer thread) with the fragments and the element-wise phase exceeded the
/// 168 registers ptxas allocates at 384 threads (a 520-byte spill, slower than the baseline);
/// the two halves of one (segment, head) share the block's one ring of three stages
/// ([`PingpongConfig::shares_item`]).
/// (Three consumers of 32-token stages at `dk = dv = 64`, whose code fits the 128 registers
/// ptxas allocates at 512 threads, are slower than two: bench/NOTES.md.)
pub const fn pingpong_config(dk: u32, dv: u32) -> Option<PingpongConfig> {
    match (dk, dv) {
        (64, 64) => Some(PingpongConfig {
            dk,
            dv,
            dv_parts: 1,
            step: 64,
            stages: 2,
            consumers: 2,
        }),
        (128, 64) | (64, 128) => Some(PingpongConfig {
            dk,
            dv,
            dv_parts: 1,
            step: 32,
            stages: 2,
            consumers: 2,
        }),
        (128, 128) => Some(PingpongConfig {
            dk,
            dv: 64,
            dv_parts: 2,
            step: 32,
            stages: 3,
            consumers: 2,
        }),
        _ => None,
    }
}

/// [`pingpong_config`] for a supported pair (compile-time use in kernels).
pub const fn pingpong_config_of(dk: u32, dv: u32) -> PingpongConfig {
    match pingpong_config(dk, dv) {
        Some(c) => c,
        None => panic!("unsupported head dimensions"),
    }
}

/// Parameters of `gla_fwd_pp_dk{DK}_dv{DV}` (grid `items / consumers` rounded up,
/// [`PingpongConfig::threads`] threads, [`PingpongConfig::smem_bytes`]) and
/// `gla_states_pp_dk{DK}_dv{DV}` (grid `segments * heads`, [`PP_STATE_THREADS`] threads,
/// [`PingpongConfig::state_smem_bytes`]; block `x` is segment `x / heads`, head `x % heads`, all
/// value columns). The forward reads `delta` and `decay_log2` of the earlier segments of its
/// sequence (not `seg_init`: no `gla_combine` runs before it). Forward item
/// `i = consumers * blockIdx.x + c` (consumer `c`) is segment `i / (heads dv_parts)`, head
/// `i / dv_parts % heads`, value columns `dv (i % dv_parts) ..` of that head. The tensor maps are 3-D over `[rows, heads, d]`
/// (dims `[d, heads, rows]` innermost first, box `[64, 1, step]`, 128-byte swizzle); the other
/// fields mean what they mean in [`GlaParams`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GlaPingpongParams {
    /// Queries map (ignored by the state pass).
    pub tmap_q: crate::TensorMap,
    /// Keys map.
    pub tmap_k: crate::TensorMap,
    /// Log-decays map.
    pub tmap_g: crate::TensorMap,
    /// Values map.
    pub tmap_v: crate::TensorMap,
    /// Everything else, as for the baseline kernels (`q`, `k`, `v`, `g` unused).
    pub base: GlaParams,
    /// Items: `segments * heads * dv_parts`.
    pub items: u32,
}

/// Declare the handles of each head-dimension pair's four kernels (the baseline's forward and
/// state pass, the pingpong's forward and state pass), the family's table, and the lookups by
/// head dimensions.
macro_rules! gla_kernels {
    ($( ($dk:literal, $dv:literal): $fwd:ident, $states:ident, $fwd_pp:ident, $states_pp:ident; )*) => {
        $(
            #[doc = concat!("`gla_fwd_dk", stringify!($dk), "_dv", stringify!($dv), "`: grid ",
                "`(segments, heads)`, [`GlaConfig::threads`] threads, [`GlaConfig::smem_bytes`].")]
            pub const $fwd: Kernel<GlaParams> = Kernel::new(
                concat!("gla_fwd_dk", stringify!($dk), "_dv", stringify!($dv)),
                config_of($dk, $dv).threads(),
                config_of($dk, $dv).blocks_per_sm,
                |()| config_of($dk, $dv).smem_bytes(),
            );
            #[doc = concat!("`gla_states_dk", stringify!($dk), "_dv", stringify!($dv), "`: ",
                "launched as the forward kernel of the pair.")]
            pub const $states: Kernel<GlaParams> = Kernel::new(
                concat!("gla_states_dk", stringify!($dk), "_dv", stringify!($dv)),
                config_of($dk, $dv).threads(),
                config_of($dk, $dv).blocks_per_sm,
                |()| config_of($dk, $dv).smem_bytes(),
            );
            #[doc = concat!("`gla_fwd_pp_dk", stringify!($dk), "_dv", stringify!($dv), "` ",
                "(sm_90a): grid `ceil(items / consumers)`, [`PingpongConfig::threads`] threads, ",
                "[`PingpongConfig::smem_bytes`].")]
            pub const $fwd_pp: Kernel<GlaPingpongParams> = Kernel::new(
                concat!("gla_fwd_pp_dk", stringify!($dk), "_dv", stringify!($dv)),
                pingpong_config_of($dk, $dv).threads(),
                1,
                |()| pingpong_config_of($dk, $dv).smem_bytes(),
            );
            #[doc = concat!("`gla_states_pp_dk", stringify!($dk), "_dv", stringify!($dv), "` ",
                "(sm_90a): grid `segments * heads`, [`PP_STATE_THREADS`] threads, ",
                "[`PingpongConfig::state_smem_bytes`].")]
            pub const $states_pp: Kernel<GlaPingpongParams> = Kernel::new(
                concat!("gla_states_pp_dk", stringify!($dk), "_dv", stringify!($dv)),
                PP_STATE_THREADS,
                1,
                |()| pingpong_config_of($dk, $dv).state_smem_bytes(),
            );
        )*

        /// The family's kernels.
        pub const KERNELS: &[KernelDecl] = &[
            $( $fwd.info(), $states.info(), $fwd_pp.info(), $states_pp.info(), )*
            GLA_COMBINE.info(),
            backward::KERNELS[0],
            backward::KERNELS[1],
            backward::KERNELS[2],
            backward::KERNELS[3],
            backward::KERNELS[4],
            backward::KERNELS[5],
            backward::KERNELS[6],
            backward::KERNELS[7],
            backward::KERNELS[8],
            backward::KERNELS[9],
            backward::KERNELS[10],
            backward::KERNELS[11],
            backward::KERNELS[12],
            backward::KERNELS[13],
            backward::KERNELS[14],
            backward::KERNELS[15],
            backward::KERNELS[16],
        ];

        /// The baseline kernels `(gla_fwd, gla_states)` of head dimensions `(dk, dv)`, if any.
        pub const fn baseline_kernels(
            dk: u32,
            dv: u32,
        ) -> Option<(&'static Kernel<GlaParams>, &'static Kernel<GlaParams>)> {
            match (dk, dv) {
                $( ($dk, $dv) => Some((&$fwd, &$states)), )*
                _ => None,
            }
        }

        /// The pingpong kernels `(gla_fwd_pp, gla_states_pp)` of head dimensions `(dk, dv)`,
        /// if any.
        pub const fn pingpong_kernels(
            dk: u32,
            dv: u32,
        ) -> Option<(
            &'static Kernel<GlaPingpongParams>,
            &'static Kernel<GlaPingpongParams>,
        )> {
            match (dk, dv) {
                $( ($dk, $dv) => Some((&$fwd_pp, &$states_pp)), )*
                _ => None,
            }
        }
    };
}

gla_kernels! {
    (64, 64): GLA_FWD_DK64_DV64, GLA_STATES_DK64_DV64, GLA_FWD_PP_DK64_DV64, GLA_STATES_PP_DK64_DV64;
    (64, 128): GLA_FWD_DK64_DV128, GLA_STATES_DK64_DV128, GLA_FWD_PP_DK64_DV128, GLA_STATES_PP_DK64_DV128;
    (128, 64): GLA_FWD_DK128_DV64, GLA_STATES_DK128_DV64, GLA_FWD_PP_DK128_DV64, GLA_STATES_PP_DK128_DV64;
    (128, 128): GLA_FWD_DK128_DV128, GLA_STATES_DK128_DV128, GLA_FWD_PP_DK128_DV128, GLA_STATES_PP_DK128_DV128;
}

/// `gla_combine`: grid `(split sequences, heads, ceil(dk dv / COMBINE_THREADS))`,
/// [`COMBINE_THREADS`] threads, no dynamic shared memory.
pub const GLA_COMBINE: Kernel<CombineParams> =
    Kernel::new("gla_combine", COMBINE_THREADS, 1, |()| 0);
