//! Gated linear attention forward, chunkwise, on `mma.sync` tensor cores (sm_80 and newer):
//! `gla_fwd_dk{DK}_dv{DV}` (outputs), `gla_states_dk{DK}_dv{DV}` (segment states) and
//! `gla_combine` (segment initial states). Semantics: `kernel_abi::gla` and the f64 recurrence
//! in `host/src/gla/reference.rs`.
//!
//! # Parameters
//! [`GlaParams`] (and [`CombineParams`]): contiguous q, k, g `[rows, H, DK]`, v, o
//! `[rows, H, DV]` in bf16, f32 states `[seqs, H, DK, DV]`, the segment table and the
//! workspace of the segment passes.
//!
//! # The chunkwise form and its stability
//! A block walks its segment in chunks of 16 tokens with the state `S` (`DK x DV`, f32) in
//! registers. Inside a chunk let `b_t` be the cumulative log-decay from the chunk start,
//! inclusive, in log2 units (`g` clamped below at `G_FLOOR`, times `log2 e`). Then
//! - `o_t = scale [(q_t 2^{b_t}) S + sum_{s <= t} (q_t . k_s 2^{b_t - b_s}) v_s]`,
//! - `S <- 2^{b_15} S + sum_s (k_s 2^{b_15 - b_s})^T v_s`.
//!
//! Values below `2^-126` may be lost: `ex2.approx.ftz` flushes them to 0 (and the tensor cores
//! and the bf16 conversion need not keep subnormals). A lost value is harmless when every product
//! it enters is itself negligible. The intra-chunk score `2^{b_t - b_s}` must be split into a
//! row factor and a column factor for the tensor cores; relative to one reference point per 16
//! tokens, one of them can reach `2^{15 * 28.9}` and overflow. So the 16 x 16 block is split in
//! halves of 8 tokens with midpoints `M_h = (b_{8h} + b_{8h+7}) / 2`:
//! - rows of half h use `q_diag_t = q_t 2^{b_t - M_h}`;
//! - (half 0, half 0) scores pair it with `k_half0_s = k_s 2^{M_0 - b_s}`;
//! - (half 1, any) scores pair it with `k_half1_s = k_s 2^{M_1 - b_s}` (`<= 1` for `s` in half
//!   0, since `M_1 <= b_7 <= b_s`);
//! - (half 0, half 1) is masked (future tokens).
//!
//! Within a half `|b_t - M_h| <= 3.5 * 20 * log2(e) = 101` (log2), so these factors lie in
//! `[2^-101, 2^101]`, inside the normal range of f32 and bf16 (`2^+-126`), except `k_half1` in
//! half 0, which may be tiny; when it is below `2^-126`, its scores (with `q_diag <= 2^101`) are
//! below `2^-25`. Kept scores are products with exponent `<= 0`; masked ones may overflow in the
//! tensor cores and are replaced by 0 with a select (never a multiply), so an infinity or NaN
//! there never propagates. The other operands are derived from these by factors `<= 1`:
//! - `q_inter = q_diag 2^{M_h}` (`= q 2^{b_t}`): the factor is flushed only if `M_h < -126`, and
//!   then `q_inter < 2^{101 - 126}`: the inter-chunk term lost is below `2^-25 |q| |S|`;
//! - `k_state = k_half1 2^{b_15 - M_1}` (`= k 2^{b_15 - b_s}`): likewise, a lost term is below
//!   `2^-25 |k| |v|` (in half 1; in half 0 both factors are `<= 1`, so nothing is lost that is
//!   not itself below `2^-126`);
//! - `k_half1 = k_half0 2^{M_1 - M_0}` in half 0: this factor alone can lie far below `2^-126`
//!   (down to `2^{-8 * 28.9}`) while `k_half1` does not (`k_half0` reaches `2^101`): flushed, it
//!   would drop whole channels of the (half 1, half 0) scores, which are of order 1 at rows 8-9
//!   (this happened on spiky decays: o rel L2 1.1e-2). So it is applied as two equal factors
//!   `r = 2^{(M_1 - M_0) / 2} >= 2^{-4 * 28.9} = 2^-115.4`, normal: `k_half1 = (k_half0 r) r`,
//!   whose intermediate is at least `k_half1`, so nothing is lost unless `k_half1 < 2^-126`.
//!
//! So every term the kernels drop is below `2^-25` times the magnitudes of its factors, for `g`
//! down to `G_FLOOR = -20` (the larger bound, 115.4 < 126, is asserted at compile time).
//! Hence two `ex2` per (token, channel), plus five per channel and chunk.
//!
//! # Tiling
//! One block per (segment, head); `DV / 16` warps, warp `w` owns value columns
//! `16 w .. 16 w + 16` of the state (as `S^T` accumulators: m16 tiles over its 16 value
//! columns, `DK / 8` n8 tiles over the key channels, `DK / 2` f32 per thread) and of the
//! outputs. q, k, g, v stream through a `stages`-deep `cp.async` ring of [`STEP`] = 32 tokens
//! (2 chunks); rows are padded by 16 bytes (conflict-free `ldmatrix`). The bf16 operand tiles
//! of a chunk (`q_inter`, `q_diag`, `k_half0`, `k_half1`, `k_state`) and its decay row are
//! double-buffered.
//!
//! # Thread mapping
//! Element-wise phase: `P = threads / (DK / 2)` consecutive lanes share a pair of key channels
//! (`2 (tid / P)`, `+ 1`) and split the chunk's 16 tokens into runs of `16 / P` (<= 8, so a run
//! lies in one half); the cumulative sum is a local scan plus a shuffle scan over the `P` lanes,
//! and `b_0, b_7, b_8, b_15` come by shuffles from the lanes that own them.
//! Matrix phase, warp `w`, per chunk (every warp the same work, no specialization):
//! 1. scores: `q_diag` x (`k_half0`, `k_half1`) over `DK / 16` k-slices (3 `mma` each), masked,
//!    packed in registers to the A operand of `o += A v` (2 `mma`);
//! 2. per k-slice: `o += q_inter S` with `S` packed from the thread's own `S^T` accumulators
//!    (the accumulator layout of `S^T` is the B-operand layout of `S`), then
//!    `S^T = decay * S^T + v^T k_state` (2 + 2 `mma`);
//! 3. `o * scale` to bf16, stored for the chunk's valid tokens.
//!
//! # Barrier protocol (all `bar.sync 0`, reached uniformly by every thread of the block)
//! - Step `s` (32 tokens): `cp.async.wait_group(stages - 2)` (this thread's copies of step `s`
//!   landed), then barrier A: every thread's copies of step `s` are visible, and every thread
//!   has finished step `s - 1` (its reads of stage `(s - 1) % stages`). Then the copies of step
//!   `s + stages - 1` go into stage `(s - 1) % stages`.
//! - Chunk `c` (global index in the segment): the element-wise phase reads the raw q, k, g rows
//!   of the chunk (published by barrier A of its step) and writes variant buffer `c % 2`; barrier
//!   B publishes it; the matrix phase reads buffer `c % 2` and the raw v rows. Buffer `c % 2` was
//!   last read by the matrix phase of chunk `c - 2`, which every thread finished before it
//!   arrived at barrier B of chunk `c - 1`, before any thread writes the buffer again.
//! - Registers hold the state and the outputs; global memory is written only by its owner (a
//!   block's own rows of o, its own state slices). The block waits for all its copies before
//!   exiting.
//!
//! `gla_combine` shares nothing between threads (no barrier).

#[cfg(target_feature = "sm_90a")]
pub mod pingpong;

use crate::arch::{convert, cp_async, index, ldmatrix, math, mma, smem, sync, warp};
use kernel_abi::gla::{
    CHUNK, CHUNKS_PER_STEP, CombineEntry, CombineParams, G_FLOOR, GlaConfig, GlaLayout, GlaParams,
    HALF, SEG_FIRST, SEG_LAST, STEP, Segment, config_of,
};
use smem::SmemValue;

/// `d += a b` (bf16 `mma.sync.m16n8k16`).
///
/// # Safety
/// Whole warp, uniform control flow.
#[inline(always)]
unsafe fn mma_bf16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    // SAFETY: forwarded to the caller.
    unsafe { mma::m16n8k16_bf16(d, a, b) }
}

/// Issue the `cp.async` copies of a `[ROWS, D]` tile into rows of
/// `GlaConfig::row_bytes(D)` bytes ([`crate::tiles::load_rows`]; contiguous tensors, D a
/// multiple of 8, so every row starts 16-byte aligned).
#[inline(always)]
fn load_tile<const D: u32, const ROWS: u32, const THREADS: u32>(
    dst: u32,
    base: *const u16,
    first_row_offset: u64,
    stride: u64,
    valid: u32,
) {
    crate::tiles::load_rows::<D, ROWS, THREADS>(
        dst,
        |r, chunk| r * const { GlaConfig::row_bytes(D) } + (chunk << 4),
        base,
        first_row_offset,
        stride,
        valid,
    )
}

/// Shared-memory addresses of one variant buffer.
#[derive(Clone, Copy)]
struct Variants {
    q_inter: u32,
    q_diag: u32,
    k_half0: u32,
    k_half1: u32,
    k_state: u32,
    decay: u32,
}

impl Variants {
    #[inline(always)]
    fn new(base: u32, lay: &GlaLayout, b: u32) -> Variants {
        let base = base + b * lay.variant_bytes;
        Variants {
            q_inter: base + lay.q_inter,
            q_diag: base + lay.q_diag,
            k_half0: base + lay.k_half0,
            k_half1: base + lay.k_half1,
            k_state: base + lay.k_state,
            decay: base + lay.decay,
        }
    }
}

/// `shfl.sync.up` of an f32 over the full warp.
///
/// # Safety
/// All 32 lanes execute the call.
#[inline(always)]
unsafe fn shfl_up_f32(v: f32, delta: u32) -> f32 {
    // SAFETY: forwarded to the caller (full warp).
    f32::from_bits(unsafe { warp::shfl_up_u32(warp::FULL_MASK, v.to_bits(), delta) })
}

/// `shfl.sync.idx` of an f32 over the full warp.
///
/// # Safety
/// All 32 lanes execute the call.
#[inline(always)]
unsafe fn shfl_f32(v: f32, src: u32) -> f32 {
    // SAFETY: forwarded to the caller (full warp).
    unsafe { warp::shfl_idx_f32(warp::FULL_MASK, v, src) }
}

/// The raw input tiles the element-wise phase reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Raw {
    Q,
    K,
    G,
}

impl Raw {
    /// The one of the three tile addresses this names.
    #[inline(always)]
    pub(crate) fn pick(self, q: u32, k: u32, g: u32) -> u32 {
        match self {
            Raw::Q => q,
            Raw::K => k,
            Raw::G => g,
        }
    }
}

/// The operand tiles the element-wise phase writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Var {
    QInter,
    QDiag,
    KHalf0,
    KHalf1,
    KState,
}

/// Where the element-wise phase of one chunk reads and writes: shared-memory byte addresses of
/// (chunk row `0..16`, byte column) in each tile, and of the chunk's decay row. The baseline
/// kernels use padded rows ([`Variants`]); the pingpong kernels swizzled TMA tiles.
pub(crate) trait ChunkTiles {
    /// Address of `(row, col)` of raw tile `t`.
    fn raw(&self, t: Raw, row: u32, col: u32) -> u32;
    /// Address of `(row, col)` of operand tile `t`.
    fn var(&self, t: Var, row: u32, col: u32) -> u32;
    /// Address of the chunk's decay row (`DK` f32).
    fn decay(&self) -> u32;
}

/// The baseline's tiles: raw rows of the chunk in a stage and one variant buffer, all in
/// padded rows.
struct PaddedChunk<const DK: u32> {
    q: u32,
    k: u32,
    g: u32,
    var: Variants,
}

impl<const DK: u32> ChunkTiles for PaddedChunk<DK> {
    #[inline(always)]
    fn raw(&self, t: Raw, row: u32, col: u32) -> u32 {
        t.pick(self.q, self.k, self.g) + row * const { GlaConfig::row_bytes(DK) } + col
    }

    #[inline(always)]
    fn var(&self, t: Var, row: u32, col: u32) -> u32 {
        let base = match t {
            Var::QInter => self.var.q_inter,
            Var::QDiag => self.var.q_diag,
            Var::KHalf0 => self.var.k_half0,
            Var::KHalf1 => self.var.k_half1,
            Var::KState => self.var.k_state,
        };
        base + row * const { GlaConfig::row_bytes(DK) } + col
    }

    #[inline(always)]
    fn decay(&self) -> u32 {
        self.var.decay
    }
}

/// The element-wise phase of one chunk (see the module documentation): reads the raw q, k, g
/// rows of the chunk, writes the operand tiles and the decay row. With `OUT = false`
/// (`gla_states`) only `k_state` (directly, `k 2^{b_15 - b}`) and the decay are made. `tid`
/// is the thread's index among the `P DK / 2` threads doing the chunk (`DK / 2` pairs of `P`
/// consecutive lanes). With `MASK`, rows `>= valid` are treated
/// as zero (q, k, g); without it the caller guarantees they are (zero-filled loads). Returns
/// `b_15` of the thread's two channels (log2).
///
/// # Safety
/// Every thread of the group calls it (uniform control flow; whole warps shuffle); the raw rows
/// were published by a barrier and the operand tiles are not read by any thread until the next
/// barrier.
#[inline(always)]
pub(crate) unsafe fn elementwise<
    const DK: u32,
    const P: u32,
    const TPT: usize,
    const OUT: bool,
    const MASK: bool,
>(
    tid: u32,
    tiles: &impl ChunkTiles,
    valid: u32,
) -> [f32; 2] {
    const { assert!(P * TPT as u32 == CHUNK && TPT as u32 <= HALF && 32 % P == 0) };
    // The exponent bounds of the module documentation: |b_t - M_h| <= 3.5 decays and
    // |M_1 - M_0| / 2 <= 4 decays of at most -G_FLOOR log2(e) each, below 126 (normal range).
    const { assert!(4.0 * -G_FLOOR * math::LOG2_E < 126.0) };
    let (pair, part) = (tid / P, tid % P);
    let base_lane = index::lane_id() - part;
    let col = 4 * pair;
    let first = part * TPT as u32;
    let floor2 = G_FLOOR * math::LOG2_E;

    // Local inclusive cumulative sums of the thread's run, both channels.
    let mut b = [[0.0f32; 2]; TPT];
    let mut acc = [0.0f32; 2];
    for i in 0..TPT {
        let row = first + i as u32;
        // SAFETY: row < 16 of the published raw g rows; 4-byte aligned.
        let gw = unsafe { u32::load(tiles.raw(Raw::G, row, col)) };
        let gw = if MASK && row >= valid { 0 } else { gw };
        let (g0, g1) = convert::unpack_bf16x2(gw);
        acc[0] += (g0 * math::LOG2_E).max(floor2);
        acc[1] += (g1 * math::LOG2_E).max(floor2);
        b[i] = acc;
    }
    // Scan of the run totals over the P lanes of the pair: exclusive prefix of this run.
    let mut incl = acc;
    let mut off = 1;
    while off < P {
        for c in 0..2 {
            // SAFETY: every lane executes the shuffle (uniform loop bounds).
            let v = unsafe { shfl_up_f32(incl[c], off) };
            if part >= off {
                incl[c] += v;
            }
        }
        off *= 2;
    }
    let mut excl = [0.0f32; 2];
    for c in 0..2 {
        // SAFETY: every lane executes the shuffle.
        let v = unsafe { shfl_up_f32(incl[c], 1) };
        excl[c] = if part == 0 { 0.0 } else { v };
    }
    for i in 0..TPT {
        for c in 0..2 {
            b[i][c] += excl[c];
        }
    }
    // SAFETY: every lane executes the shuffles; the sources are lanes of this pair.
    let edge = unsafe { chunk_edges::<2, TPT, P>(&b, base_lane) };
    let b15 = edge[3];
    if part == P - 1 {
        let d = [math::exp2(b15[0]), math::exp2(b15[1])];
        let bits = (d[0].to_bits() as u64) | ((d[1].to_bits() as u64) << 32);
        // SAFETY: channels 2 pair, +1 < DK of the decay row; 8-byte aligned; this thread is
        // the row's only writer (one part per pair) until the next barrier.
        unsafe { u64::store(tiles.decay() + 8 * pair, bits) };
    }
    if OUT {
        let half = first / HALF;
        let mut m = [[0.0f32; 2]; 2];
        for c in 0..2 {
            m[0][c] = 0.5 * (edge[0][c] + edge[1][c]);
            m[1][c] = 0.5 * (edge[2][c] + edge[3][c]);
        }
        let mh = if half == 0 { m[0] } else { m[1] };
        let mut f_inter = [0.0f32; 2];
        let mut f_10_root = [0.0f32; 2];
        let mut f_state = [0.0f32; 2];
        for c in 0..2 {
            f_inter[c] = math::exp2(mh[c]);
            // The square root of 2^{M_1 - M_0}: at least 2^-115.4, never flushed (see the module
            // documentation: the factor itself may lie below 2^-126 while k_half1 does not).
            f_10_root[c] = if half == 0 {
                math::exp2(0.5 * (m[1][c] - m[0][c]))
            } else {
                1.0
            };
            f_state[c] = math::exp2(b15[c] - m[1][c]);
        }
        for i in 0..TPT {
            let row = first + i as u32;
            // SAFETY: row < 16 of the published raw q, k rows; 4-byte aligned.
            let (qw, kw) = unsafe {
                (
                    u32::load(tiles.raw(Raw::Q, row, col)),
                    u32::load(tiles.raw(Raw::K, row, col)),
                )
            };
            let (qw, kw) = if MASK && row >= valid {
                (0, 0)
            } else {
                (qw, kw)
            };
            let (q0, q1) = convert::unpack_bf16x2(qw);
            let (k0, k1) = convert::unpack_bf16x2(kw);
            let (q, k) = ([q0, q1], [k0, k1]);
            let mut qd = [0.0f32; 2];
            let mut kd = [0.0f32; 2];
            let mut kh1 = [0.0f32; 2];
            let mut ks = [0.0f32; 2];
            let mut qi = [0.0f32; 2];
            for c in 0..2 {
                [qd[c], kd[c], qi[c], kh1[c], ks[c]] = chunk_operands(
                    q[c],
                    k[c],
                    b[i][c] - mh[c],
                    [f_inter[c], f_10_root[c], f_state[c]],
                );
            }
            // SAFETY: rows < 16 (8 for k_half0, written only by half-0 threads) of this
            // buffer's tiles, channels 2 pair, +1: each (row, pair) has one writer; 4-byte
            // aligned; nobody reads the buffer before the next barrier.
            unsafe {
                let at = |t: Var| tiles.var(t, row, col);
                u32::store(at(Var::QDiag), convert::pack_bf16x2(qd[0], qd[1]));
                u32::store(at(Var::QInter), convert::pack_bf16x2(qi[0], qi[1]));
                if half == 0 {
                    u32::store(at(Var::KHalf0), convert::pack_bf16x2(kd[0], kd[1]));
                }
                u32::store(at(Var::KHalf1), convert::pack_bf16x2(kh1[0], kh1[1]));
                u32::store(at(Var::KState), convert::pack_bf16x2(ks[0], ks[1]));
            }
        }
    } else {
        for i in 0..TPT {
            let row = first + i as u32;
            // SAFETY: as above (raw k row < 16).
            let kw = unsafe { u32::load(tiles.raw(Raw::K, row, col)) };
            let kw = if MASK && row >= valid { 0 } else { kw };
            let (k0, k1) = convert::unpack_bf16x2(kw);
            let ks0 = k0 * math::exp2(b15[0] - b[i][0]);
            let ks1 = k1 * math::exp2(b15[1] - b[i][1]);
            // SAFETY: as above (k_state row < 16, one writer).
            unsafe {
                u32::store(
                    tiles.var(Var::KState, row, col),
                    convert::pack_bf16x2(ks0, ks1),
                )
            };
        }
    }
    b15
}

/// `b_0, b_7, b_8, b_15` of each of the thread's `C` channels: the chunk's `P` lanes from
/// `base_lane` hold runs of `TPT` tokens of the cumulative sums `b`, in token order.
///
/// # Safety
/// All 32 lanes execute the call (uniform control flow).
#[inline(always)]
pub(crate) unsafe fn chunk_edges<const C: usize, const TPT: usize, const P: u32>(
    b: &[[f32; C]; TPT],
    base_lane: u32,
) -> [[f32; C]; 4] {
    let mut edge = [[0.0f32; C]; 4];
    for c in 0..C {
        // SAFETY: every lane executes the shuffles (the caller's contract).
        unsafe {
            edge[0][c] = shfl_f32(b[0][c], base_lane);
            edge[1][c] = shfl_f32(b[TPT - 1][c], base_lane + P / 2 - 1);
            edge[2][c] = shfl_f32(b[0][c], base_lane + P / 2);
            edge[3][c] = shfl_f32(b[TPT - 1][c], base_lane + P - 1);
        }
    }
    edge
}

/// The operand values of one (token, channel) of a chunk (see the module documentation), from
/// `q`, `k`, `x = b_t - M_h` and the channel's factors `f = [2^{M_h}, r, 2^{b_15 - M_1}]` with
/// `r = 2^{(M_1 - M_0) / 2}` in half 0 and 1 in half 1: `[q_diag, k_half0, q_inter, k_half1,
/// k_state]` (`k_half1` through `r` twice, never through the possibly flushed
/// `2^{M_1 - M_0}`).
#[inline(always)]
pub(crate) fn chunk_operands(q: f32, k: f32, x: f32, f: [f32; 3]) -> [f32; 5] {
    let [f_inter, f_10_root, f_state] = f;
    let qd = q * math::exp2(x);
    let kd = k * math::exp2(-x);
    let kh1 = kd * f_10_root * f_10_root;
    [qd, kd, qd * f_inter, kh1, kh1 * f_state]
}

/// The intra-chunk scores of one chunk (one warp; see the module documentation): `q_diag`
/// against `k_half0` (rows of half 0) and `k_half1` (rows of half 1), masked to `s <= t` with
/// selects (so masked infinities vanish), as the A fragment of `o += P v` (rows `t`, k = `s`):
/// `[P[g][2t..], P[g+8][2t..], P[g][8+2t..] = 0, P[g+8][8+2t..]]`, bf16 pairs. The tile
/// addresses are those of the chunk's first row, in padded rows.
///
/// # Safety
/// Whole warp, uniform control flow; the tiles were published by a barrier.
#[inline(always)]
pub(crate) unsafe fn intra_scores<const DK: u32, const NKK: usize>(
    lane: u32,
    q_diag: u32,
    k_half0: u32,
    k_half1: u32,
) -> [u32; 4] {
    let rb = const { GlaConfig::row_bytes(DK) };
    let mut x = [0.0f32; 4];
    let mut y = [0.0f32; 4];
    let mut z = [0.0f32; 4];
    for kk in 0..NKK {
        let kc = 2 * kk as u32;
        // SAFETY: published tiles (the caller's contract), rows < 16 (8 for k_half0).
        unsafe {
            let qa = ldmatrix::x4(q_diag + (lane % 16) * rb + (kc + lane / 16) * 16);
            let b0 = ldmatrix::x2(k_half0 + (lane % 8) * rb + (kc + (lane / 8) % 2) * 16);
            let b1 = ldmatrix::x4(
                k_half1 + (lane % 8 + (lane / 16) * 8) * rb + (kc + (lane / 8) % 2) * 16,
            );
            mma_bf16(&mut x, qa, b0);
            mma_bf16(&mut y, qa, [b1[0], b1[1]]);
            mma_bf16(&mut z, qa, [b1[2], b1[3]]);
        }
    }
    let (g, t) = (lane / 4, lane % 4);
    // Keep s <= t within each half (select, so masked infinities vanish); (half 1, half 0)
    // from y; (half 0, half 1) is zero.
    let keep0 = 2 * t <= g;
    let keep1 = 2 * t < g;
    let sel = |keep: bool, v: f32| if keep { v } else { 0.0 };
    [
        convert::pack_bf16x2(sel(keep0, x[0]), sel(keep1, x[1])),
        convert::pack_bf16x2(y[2], y[3]),
        convert::pack_bf16x2(0.0, 0.0),
        convert::pack_bf16x2(sel(keep0, z[2]), sel(keep1, z[3])),
    ]
}

/// A warp's place: lane decomposition and its value columns.
#[derive(Clone, Copy)]
struct Lane {
    lane: u32,
    /// `lane / 4`: accumulator row (and `+ 8`).
    g: u32,
    /// `lane % 4`: accumulator column pair.
    t: u32,
    /// First value column of the warp.
    dv0: u32,
}

/// The `[f32; 4]` accumulator tiles of `S^T` (m16 over the warp's value columns, n8 tile `j`
/// over key channels `8 j ..`): element `e` is `S[8 j + 2 t + e % 2][dv0 + g + 8 (e / 2)]`.
/// Offset (in elements) of that element in a `[DK, DV]` state.
#[inline(always)]
fn state_index<const DV: u32>(l: &Lane, j: usize, e: usize) -> usize {
    let dk = 8 * j as u32 + 2 * l.t + (e as u32 % 2);
    let dv = l.dv0 + l.g + 8 * (e as u32 / 2);
    (dk * DV + dv) as usize
}

/// The matrix phase of one chunk for one warp (see the module documentation). `OUT = false`:
/// only the state update.
///
/// # Safety
/// Whole warp, uniform control flow; `var` and the raw v rows `v_rows ..+ 16` were published by
/// a barrier and are not overwritten before the next one; with `OUT`, `o_rows` points at
/// element `dv0` (the warp's first value column, already added by the caller) of head `head` in
/// the chunk's first output row, and the chunk has `valid` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matrix<
    const DK: u32,
    const DV: u32,
    const NKK: usize,
    const NJ: usize,
    const OUT: bool,
>(
    l: &Lane,
    var: &Variants,
    v_rows: u32,
    st: &mut [[f32; 4]; NJ],
    o_rows: *mut u16,
    row_stride: usize,
    valid: u32,
    scale: f32,
) {
    const { assert!(NKK as u32 * 16 == DK && NJ == 2 * NKK) };
    let rb = const { GlaConfig::row_bytes(DK) };
    let rbv = const { GlaConfig::row_bytes(DV) };
    let lane = l.lane;
    let wchunk = l.dv0 / 8;
    // A operand v^T (m16 = the warp's value columns, k16 = the chunk's tokens).
    // SAFETY: rows < 16 of the published v rows, 16-byte chunks of the warp's columns.
    let va = unsafe {
        ldmatrix::x4_trans(
            v_rows + ((lane / 16) * 8 + lane % 8) * rbv + (wchunk + (lane / 8) % 2) * 16,
        )
    };
    let mut o = [[0.0f32; 4]; 2];
    if OUT {
        // Intra-chunk scores.
        // SAFETY: whole warp, uniform; the tiles were published (module contract).
        let pa = unsafe { intra_scores::<DK, NKK>(lane, var.q_diag, var.k_half0, var.k_half1) };
        // B operand v (k16 = tokens, n = the warp's 16 value columns as two n8 tiles).
        // SAFETY: published v rows < 16, the warp's column chunks.
        unsafe {
            let vb = ldmatrix::x4_trans(v_rows + (lane % 16) * rbv + (wchunk + lane / 16) * 16);
            mma_bf16(&mut o[0], pa, [vb[0], vb[1]]);
            mma_bf16(&mut o[1], pa, [vb[2], vb[3]]);
        }
    }
    for kk in 0..NKK {
        let kc = 2 * kk as u32;
        let (j0, j1) = (2 * kk, 2 * kk + 1);
        if OUT {
            // o += q_inter S, S from the (pre-update) accumulators.
            let b_lo = [
                convert::pack_bf16x2(st[j0][0], st[j0][1]),
                convert::pack_bf16x2(st[j1][0], st[j1][1]),
            ];
            let b_hi = [
                convert::pack_bf16x2(st[j0][2], st[j0][3]),
                convert::pack_bf16x2(st[j1][2], st[j1][3]),
            ];
            // SAFETY: published q_inter rows < 16.
            unsafe {
                let qa = ldmatrix::x4(var.q_inter + (lane % 16) * rb + (kc + lane / 16) * 16);
                mma_bf16(&mut o[0], qa, b_lo);
                mma_bf16(&mut o[1], qa, b_hi);
            }
        }
        // S^T = decay S^T + v^T k_state for key channels 16 kk .. 16 kk + 16.
        // SAFETY: published decay row, channels < DK, 8-byte aligned.
        let (d_lo, d_hi) = unsafe {
            (
                u64::load(var.decay + 4 * (16 * kk as u32 + 2 * l.t)),
                u64::load(var.decay + 4 * (16 * kk as u32 + 8 + 2 * l.t)),
            )
        };
        let dl = [
            f32::from_bits(d_lo as u32),
            f32::from_bits((d_lo >> 32) as u32),
        ];
        let dh = [
            f32::from_bits(d_hi as u32),
            f32::from_bits((d_hi >> 32) as u32),
        ];
        for e in 0..4 {
            st[j0][e] *= dl[e % 2];
            st[j1][e] *= dh[e % 2];
        }
        // SAFETY: published k_state rows < 16.
        unsafe {
            let kb = ldmatrix::x4_trans(var.k_state + (lane % 16) * rb + (kc + lane / 16) * 16);
            mma_bf16(&mut st[j0], va, [kb[0], kb[1]]);
            mma_bf16(&mut st[j1], va, [kb[2], kb[3]]);
        }
    }
    if OUT {
        for h in 0..2 {
            let row = l.g + 8 * h as u32;
            if row < valid {
                let dst = o_rows.wrapping_add(row as usize * row_stride);
                for n in 0..2 {
                    let w = convert::pack_bf16x2(o[n][2 * h] * scale, o[n][2 * h + 1] * scale);
                    // Relative to `o_rows`, which already points at the warp's first column
                    // `dv0` (adding `dv0` again wrote past the row, into the next head or token).
                    let col = 8 * n as u32 + 2 * l.t;
                    // SAFETY: row < valid rows of the chunk, dv0 + col + 1 < DV: inside o;
                    // 4-byte aligned (even column, contiguous rows).
                    unsafe { *(dst.wrapping_add(col as usize) as *mut u32) = w };
                }
            }
        }
    }
}

/// The walk of one segment (see the module documentation). `OUT`: `gla_fwd` (outputs, from the
/// segment's initial state, final state at the end of a sequence); else `gla_states` (from
/// zero, writes `delta` and `decay_log2`; blocks of last segments exit at once).
///
/// # Safety
/// Launched as documented on [`GlaParams`] with the configuration whose layout is `lay` and whose
/// fields the const parameters repeat.
#[inline(always)]
unsafe fn walk<
    const DK: u32,
    const DV: u32,
    const THREADS: u32,
    const STAGES: u32,
    const WAIT: u32,
    const P: u32,
    const TPT: usize,
    const NKK: usize,
    const NJ: usize,
    const OUT: bool,
>(
    p: &GlaParams,
    lay: &GlaLayout,
) {
    const { assert!(STAGES >= 2 && WAIT == STAGES - 2 && THREADS == DV * 2) };
    let (slot, head) = (index::block_idx_x(), index::block_idx_y());
    // SAFETY: slot < gridDim.x = entries of the segment table.
    let seg: Segment = unsafe { *p.segments.add(slot as usize) };
    if !OUT && seg.flags & SEG_LAST != 0 {
        return;
    }
    let lane = index::lane_id();
    let l = Lane {
        lane,
        g: lane / 4,
        t: lane % 4,
        dv0: index::warp_id() * 16,
    };
    let heads = p.heads as u64;
    let state_len = (DK * DV) as usize;
    let pair_head = (seg.seq as u64 * heads + head as u64) as usize * state_len;
    let slot_head = (slot as u64 * heads + head as u64) as usize;

    // Initial state.
    let mut st = [[0.0f32; 4]; NJ];
    let init: *const f32 = if !OUT {
        core::ptr::null()
    } else if seg.flags & SEG_FIRST != 0 {
        if p.has_init != 0 {
            p.init_state.wrapping_add(pair_head)
        } else {
            core::ptr::null()
        }
    } else {
        p.seg_init.wrapping_add(slot_head * state_len)
    };
    if !init.is_null() {
        for j in 0..NJ {
            for e in 0..4 {
                // SAFETY: the state slice of (seq, head) or (slot, head) has DK * DV elements
                // (host-checked sizes); state_index < DK * DV.
                st[j][e] = unsafe { *init.add(state_index::<DV>(&l, j, e)) };
            }
        }
    }

    let smem = smem::aligned_base();
    let raw = |s: u32| {
        let at = smem + s * lay.stage_bytes;
        (at + lay.q, at + lay.k, at + lay.g, at + lay.v)
    };
    let len = seg.len;
    let steps = len.div_ceil(STEP);
    let chunks = len.div_ceil(CHUNK);
    let (sk, sv) = (heads * DK as u64, heads * DV as u64);
    let off = head as usize;
    let load = |step: u32, stage: u32| {
        let first = seg.start as u64 + (step * STEP) as u64;
        let valid = (len - step * STEP).min(STEP);
        let (q_s, k_s, g_s, v_s) = raw(stage);
        if OUT {
            load_tile::<DK, STEP, THREADS>(
                q_s,
                p.q.wrapping_add(off * DK as usize),
                first * sk,
                sk,
                valid,
            );
        }
        load_tile::<DK, STEP, THREADS>(
            k_s,
            p.k.wrapping_add(off * DK as usize),
            first * sk,
            sk,
            valid,
        );
        load_tile::<DK, STEP, THREADS>(
            g_s,
            p.g.wrapping_add(off * DK as usize),
            first * sk,
            sk,
            valid,
        );
        load_tile::<DV, STEP, THREADS>(
            v_s,
            p.v.wrapping_add(off * DV as usize),
            first * sv,
            sv,
            valid,
        );
    };
    for s in 0..STAGES - 1 {
        if s < steps {
            load(s, s);
        }
        cp_async::commit_group();
    }
    let mut total = [0.0f32; 2];
    let rb = const { GlaConfig::row_bytes(DK) };
    let rbv = const { GlaConfig::row_bytes(DV) };
    for step in 0..steps {
        cp_async::wait_group::<WAIT>();
        // SAFETY: barrier A of the protocol; every thread reaches it `steps` times.
        unsafe { sync::sync_threads() };
        let issue = step + STAGES - 1;
        if issue < steps {
            load(issue, issue % STAGES);
        }
        cp_async::commit_group();
        let (q_s, k_s, g_s, v_s) = raw(step % STAGES);
        for cc in 0..CHUNKS_PER_STEP {
            let chunk = step * CHUNKS_PER_STEP + cc;
            if chunk >= chunks {
                break;
            }
            let var = Variants::new(smem, lay, chunk % 2);
            let r0 = cc * CHUNK;
            let tiles = PaddedChunk::<DK> {
                q: q_s + r0 * rb,
                k: k_s + r0 * rb,
                g: g_s + r0 * rb,
                var,
            };
            // SAFETY: all threads (uniform: chunk < chunks is block-uniform); raw rows
            // published by barrier A (zero-filled past the segment's end); the buffer's last
            // readers finished before barrier B of the previous chunk.
            let b15 = unsafe {
                elementwise::<DK, P, TPT, OUT, false>(index::thread_idx_x(), &tiles, CHUNK)
            };
            total[0] += b15[0];
            total[1] += b15[1];
            // SAFETY: barrier B of the protocol (uniform).
            unsafe { sync::sync_threads() };
            let token = seg.start as u64 + (chunk * CHUNK) as u64;
            let o_rows = p
                .o
                .wrapping_add(((token * heads + head as u64) * DV as u64 + l.dv0 as u64) as usize);
            let valid = (len - chunk * CHUNK).min(CHUNK);
            // SAFETY: whole warps, uniform; tiles published by barrier B; o_rows is column dv0 of
            // this head in the chunk's first output row (used only with OUT), rows < valid exist.
            unsafe {
                matrix::<DK, DV, NKK, NJ, OUT>(
                    &l,
                    &var,
                    v_s + r0 * rbv,
                    &mut st,
                    o_rows,
                    (heads * DV as u64) as usize,
                    valid,
                    p.scale,
                )
            };
        }
    }
    cp_async::wait_all();

    let out: *mut f32 = if OUT {
        if seg.flags & SEG_LAST != 0 && p.has_final != 0 {
            p.final_state.wrapping_add(pair_head)
        } else {
            core::ptr::null_mut()
        }
    } else {
        p.delta.wrapping_add(slot_head * state_len)
    };
    if !out.is_null() {
        for j in 0..NJ {
            for e in 0..4 {
                // SAFETY: this block's own state slice (final state of its sequence, or its
                // segment's delta), DK * DV elements; state_index < DK * DV.
                unsafe { *out.add(state_index::<DV>(&l, j, e)) = st[j][e] };
            }
        }
    }
    if !OUT {
        let tid = index::thread_idx_x();
        if tid % P == P - 1 {
            let dst = p
                .decay_log2
                .wrapping_add(slot_head * DK as usize + 2 * (tid / P) as usize);
            // SAFETY: channels 2 (tid / P), +1 < DK of this segment's decay row; one writer.
            unsafe {
                *dst = total[0];
                *dst.add(1) = total[1];
            }
        }
    }
}

/// The body of `gla_fwd` (`$out = true`) or `gla_states` (`false`) for one head-dimension pair:
/// [`walk`] with the configuration's constants.
macro_rules! gla_body {
    ($p:expr, $dk:literal, $dv:literal, $out:literal) => {{
        const CFG: GlaConfig = config_of($dk, $dv);
        const LAYOUT: GlaLayout = CFG.layout();
        walk::<
            { CFG.dk },
            { CFG.dv },
            { CFG.threads() },
            { CFG.stages },
            { CFG.stages - 2 },
            { CFG.threads_per_pair() },
            { CFG.tokens_per_thread() as usize },
            { (CFG.dk / 16) as usize },
            { (CFG.dk / 8) as usize },
            $out,
        >(&$p, &LAYOUT)
    }};
}

/// Declare the kernels of each head-dimension pair: the PTX entry points (with their launch
/// bounds) and, in host builds, the emulator's table of the same bodies (`gla_combine`
/// included).
macro_rules! gla_kernels {
    ($( $fwd:ident, $states:ident, $dk:literal, $dv:literal; )*) => {
        $(
            /// `gla_fwd` for this pair of head dimensions; see the module documentation.
            ///
            /// # Safety
            /// Grid `(segments, heads)`, the configuration's threads and shared memory,
            /// parameters satisfying [`GlaParams`]'s contract (validated by the host); for
            /// segments that are not first, `seg_init` written by `gla_combine`.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $fwd(p: GlaParams) {
                crate::launch_bounds!($fwd, config_of($dk, $dv).threads(),
                                      config_of($dk, $dv).blocks_per_sm);
                // SAFETY: forwarded to the caller.
                unsafe { gla_body!(p, $dk, $dv, true) }
            }

            /// `gla_states` for this pair of head dimensions; see the module documentation.
            ///
            /// # Safety
            /// As for the `gla_fwd` kernel of the pair; `delta` and `decay_log2` hold a slice
            /// per (segment, head).
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $states(p: GlaParams) {
                crate::launch_bounds!($states, config_of($dk, $dv).threads(),
                                      config_of($dk, $dv).blocks_per_sm);
                // SAFETY: forwarded to the caller.
                unsafe { gla_body!(p, $dk, $dv, false) }
            }
        )*

        /// The kernels of this family, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const EMU_KERNELS: &[crate::emu::EmuKernel] = &[
            $(
                crate::emu::EmuKernel {
                    name: stringify!($fwd),
                    params: core::mem::size_of::<GlaParams>(),
                    threads: config_of($dk, $dv).threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: the emulator passes a parameter struct of this kernel's
                            // type (it checks the size), whose contract the caller upholds.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const GlaParams);
                                gla_body!(p, $dk, $dv, true)
                            }
                        }
                        run
                    },
                },
                crate::emu::EmuKernel {
                    name: stringify!($states),
                    params: core::mem::size_of::<GlaParams>(),
                    threads: config_of($dk, $dv).threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: as for the `gla_fwd` entry.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const GlaParams);
                                gla_body!(p, $dk, $dv, false)
                            }
                        }
                        run
                    },
                },
            )*
            crate::emu::EmuKernel {
                name: "gla_combine",
                params: core::mem::size_of::<CombineParams>(),
                threads: kernel_abi::gla::COMBINE_THREADS,
                run: {
                    unsafe fn run(p: *const u8) {
                        // SAFETY: as for the `gla_fwd` entries.
                        unsafe { combine(core::ptr::read_unaligned(p as *const CombineParams)) }
                    }
                    run
                },
            },
        ];
    };
}

gla_kernels! {
    gla_fwd_dk64_dv64, gla_states_dk64_dv64, 64, 64;
    gla_fwd_dk64_dv128, gla_states_dk64_dv128, 64, 128;
    gla_fwd_dk128_dv64, gla_states_dk128_dv64, 128, 64;
    gla_fwd_dk128_dv128, gla_states_dk128_dv128, 128, 128;
}

/// `gla_combine`: the initial state of every later segment of a split sequence,
/// `S_{i+1} = 2^{D_i} S_i + delta_i` from `S_0` = the initial state (or 0), in f32.
///
/// # Thread mapping
/// Block `(entry, head, z)`, thread `tid`: state element `e = z * COMBINE_THREADS + tid` of
/// `[dk, dv]`, walked through the sequence's segments in order. No barrier: threads share
/// nothing.
///
/// # Safety
/// Grid `(entries, heads, ceil(dk dv / COMBINE_THREADS))`, `COMBINE_THREADS` threads,
/// parameters satisfying [`CombineParams`]'s contract, `delta` and `decay_log2` written by
/// `gla_states` for every segment that is not last.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gla_combine(p: CombineParams) {
    crate::launch_bounds!(gla_combine, kernel_abi::gla::COMBINE_THREADS, 1);
    // SAFETY: forwarded to the caller.
    unsafe { combine(p) }
}

/// The body of [`gla_combine`].
///
/// # Safety
/// As for [`gla_combine`].
#[inline(always)]
unsafe fn combine(p: CombineParams) {
    let head = index::block_idx_y() as u64;
    let e = index::block_idx_z() * kernel_abi::gla::COMBINE_THREADS + index::thread_idx_x();
    let state_len = p.dk * p.dv;
    if e >= state_len {
        return;
    }
    // SAFETY: blockIdx.x < gridDim.x = entries.
    let entry: CombineEntry = unsafe { *p.entries.add(index::block_idx_x() as usize) };
    let heads = p.heads as u64;
    let elem = |slot: u64| ((slot * heads + head) * state_len as u64 + e as u64) as usize;
    let mut s = if p.has_init != 0 {
        // SAFETY: (seq, head, e) inside the initial states (host-checked size).
        unsafe { *p.init_state.add(elem(entry.seq as u64)) }
    } else {
        0.0
    };
    let channel = (e / p.dv) as u64;
    for i in 0..entry.count - 1 {
        let slot = (entry.first + i) as u64;
        // SAFETY: slot and slot + 1 < segments (the entry's consecutive segments); element and
        // channel inside the workspace slices.
        unsafe {
            let d = *p
                .decay_log2
                .add(((slot * heads + head) * p.dk as u64 + channel) as usize);
            s = math::fma(math::exp2(d), s, *p.delta.add(elem(slot)));
            *p.seg_init.add(elem(slot + 1)) = s;
        }
    }
}
