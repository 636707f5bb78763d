//! The pingpong kernels' element-wise phases, vectorized (4 or 8 consecutive key channels per
//! thread, 8- or 16-byte shared accesses): the forward's (the operand tiles and decay rows of
//! `gla::chunk`, per chunk) and the state pass's (`k_state` relative to the segment's end).

use super::super::chunk::{ChunkTiles, Raw, Var, chunk_edges, chunk_operands, shfl_f32};
use super::tiles::{PingpongChunk, load_words, pack, store_f32, store_words, unpack};
use crate::arch::{index, math, warp};
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gla::{CHUNK, G_FLOOR, HALF};

/// Inclusive prefix sums, over the `P` consecutive lanes from `base_lane` (this lane is
/// `part`), of each lane's run totals `acc`: returns the exclusive prefix of this lane's run.
///
/// # Safety
/// All 32 lanes execute the call (uniform loop bounds).
#[inline(always)]
unsafe fn run_prefix<const CPT: usize, const P: u32>(acc: [f32; CPT], part: u32) -> [f32; CPT] {
    let mut incl = acc;
    let mut off = 1;
    while off < P {
        for c in 0..CPT {
            // SAFETY: every lane executes the shuffle.
            let v = f32::from_bits(unsafe {
                warp::shfl_up_u32(warp::FULL_MASK, incl[c].to_bits(), off)
            });
            if part >= off {
                incl[c] += v;
            }
        }
        off *= 2;
    }
    let mut excl = [0.0f32; CPT];
    for c in 0..CPT {
        // SAFETY: every lane executes the shuffle.
        let v = f32::from_bits(unsafe { warp::shfl_up_u32(warp::FULL_MASK, incl[c].to_bits(), 1) });
        excl[c] = if part == 0 { 0.0 } else { v };
    }
    excl
}

/// Local inclusive cumulative log2-decays of the thread's `TPT` rows `first ..` of a tile
/// (`g` clamped below at `G_FLOOR`; rows `>= valid` count as zero), for its `CPT` channels at
/// byte column `col`; returns them and the run total.
///
/// # Safety
/// The rows were published (the stage's full phase completed); whole warps call it.
#[inline(always)]
unsafe fn local_cumsum<const CPT: usize, const TPT: usize>(
    g_at: impl Fn(u32) -> u32,
    first: u32,
    valid: u32,
) -> ([[f32; CPT]; TPT], [f32; CPT]) {
    let mut b = [[0.0f32; CPT]; TPT];
    let mut acc = [0.0f32; CPT];
    for (i, bi) in b.iter_mut().enumerate() {
        let row = first + i as u32;
        // SAFETY: a published row of the stage (the caller's contract), aligned.
        let w = unsafe { load_words::<CPT>(g_at(row)) };
        let w = if row >= valid { [0; 4] } else { w };
        let g = unpack::<CPT>(w);
        for c in 0..CPT {
            // (`max` returns its non-NaN operand: a NaN log-decay reads as the floor.)
            acc[c] = math::fma(g[c].max(G_FLOOR), math::LOG2_E, acc[c]);
        }
        *bi = acc;
    }
    (b, acc)
}

/// The element-wise phase of a whole step for the forward kernel, vectorized: the parent
/// module's baseline element-wise phase (same formulas, same operand tiles, same decay rows), with
/// thread `ctid` of the consumer taking `CPT` consecutive key channels (one 16- or 8-byte piece
/// of a row) of `TPT` consecutive tokens of one chunk: `ctid = (chunk' NG + group) P + part`
/// with `NG = DK / CPT` channel groups and `P = 16 / TPT` lanes per (chunk, group), so a
/// warp's stores cover whole rows; `chunk'` counts the chunks done at once (`128 / (P NG)`),
/// and the step's `NCH` chunks take `NCH / (128 / (P NG))` passes. Chunks past `valid` are
/// skipped (warp-uniform).
///
/// # Safety
/// The consumer's 128 threads call it (whole warps; chunks are warp-uniform); the stage was
/// published by its full phase; the operand tiles are not read before the next barrier.
#[inline(always)]
pub(super) unsafe fn elementwise_step<
    const DK: u32,
    const CPT: usize,
    const P: u32,
    const TPT: usize,
    const NCH: u32,
>(
    ctid: u32,
    base: &PingpongChunk<DK>,
    valid: u32,
) {
    const {
        assert!(
            P * TPT as u32 == CHUNK
                && TPT as u32 <= HALF
                && P >= 2
                && 32 % P == 0
                && (CPT == 8 || CPT == 4)
        )
    };
    const { assert!(4.0 * -G_FLOOR * math::LOG2_E < 126.0) };
    let ng = DK / CPT as u32;
    let part = ctid % P;
    let group = (ctid / P) % ng;
    // Chunks done at once by the 128 threads; the step's chunks take `NCH / per_pass` passes.
    let per_pass = WARPGROUP_SIZE / (P * ng);
    for pass in 0..NCH / per_pass {
        let chunk = pass * per_pass + ctid / (P * ng);
        // SAFETY: forwarded to the caller (the chunk is warp-uniform).
        unsafe { elementwise_chunk::<DK, CPT, P, TPT>(chunk, part, group, base, valid) };
    }
}

/// One chunk of [`elementwise_step`]: channel group `group`, lane `part` of its `P`.
///
/// # Safety
/// As for [`elementwise_step`]; whole warps call it with the same chunk.
#[inline(always)]
pub(super) unsafe fn elementwise_chunk<
    const DK: u32,
    const CPT: usize,
    const P: u32,
    const TPT: usize,
>(
    chunk: u32,
    part: u32,
    group: u32,
    base: &PingpongChunk<DK>,
    valid: u32,
) {
    let r0 = chunk * CHUNK;
    if r0 >= valid {
        return;
    }
    let t = PingpongChunk::<DK> { r0, ..*base };
    let base_lane = index::lane_id() - part;
    let col = group * 2 * CPT as u32;
    let first = part * TPT as u32;
    let cvalid = valid - r0;
    // SAFETY: published raw g rows < 16 of the chunk (the caller's contract); aligned pieces.
    let (mut b, acc) =
        unsafe { local_cumsum::<CPT, TPT>(|row| t.raw(Raw::G, row, col), first, cvalid) };
    // SAFETY: whole warps (chunks are warp-uniform), uniform loop bounds.
    let excl = unsafe { run_prefix::<CPT, P>(acc, part) };
    for bi in b.iter_mut() {
        for c in 0..CPT {
            bi[c] += excl[c];
        }
    }
    // b_0, b_7, b_8, b_15 of the thread's channels, from the lanes whose runs hold them.
    // SAFETY: every lane executes the shuffles (whole warps); the sources are this group's.
    let edge = unsafe { chunk_edges::<CPT, TPT, P>(&b, base_lane) };
    let b15 = edge[3];
    if part == P - 1 {
        let mut d = [0.0f32; CPT];
        for c in 0..CPT {
            d[c] = math::exp2(b15[c]);
        }
        // SAFETY: channels `CPT group ..` of the chunk's decay row (16-byte aligned); this
        // thread is their only writer until the next barrier.
        unsafe { store_f32::<CPT>(t.decay + r0 / CHUNK * DK * 4 + 4 * CPT as u32 * group, &d) };
    }
    let half = first / HALF;
    let mut m = [[0.0f32; CPT]; 2];
    let mut mh = [0.0f32; CPT];
    let mut f_inter = [0.0f32; CPT];
    let mut f_10_root = [0.0f32; CPT];
    let mut f_state = [0.0f32; CPT];
    for c in 0..CPT {
        m[0][c] = 0.5 * (edge[0][c] + edge[1][c]);
        m[1][c] = 0.5 * (edge[2][c] + edge[3][c]);
        mh[c] = if half == 0 { m[0][c] } else { m[1][c] };
        f_inter[c] = math::exp2(mh[c]);
        // The square root of 2^{M_1 - M_0}: see `gla::chunk` (never flushed).
        f_10_root[c] = if half == 0 {
            math::exp2(0.5 * (m[1][c] - m[0][c]))
        } else {
            1.0
        };
        f_state[c] = math::exp2(b15[c] - m[1][c]);
    }
    for (i, bi) in b.iter().enumerate() {
        let row = first + i as u32;
        // SAFETY: published raw q, k rows < 16 of the chunk; aligned pieces.
        let (qw, kw) = unsafe {
            (
                load_words::<CPT>(t.raw(Raw::Q, row, col)),
                load_words::<CPT>(t.raw(Raw::K, row, col)),
            )
        };
        let (qw, kw) = if row >= cvalid {
            ([0; 4], [0; 4])
        } else {
            (qw, kw)
        };
        let (q, k) = (unpack::<CPT>(qw), unpack::<CPT>(kw));
        let mut qd = [0.0f32; CPT];
        let mut kd = [0.0f32; CPT];
        let mut qi = [0.0f32; CPT];
        let mut kh1 = [0.0f32; CPT];
        let mut ks = [0.0f32; CPT];
        for c in 0..CPT {
            [qd[c], kd[c], qi[c], kh1[c], ks[c]] = chunk_operands(
                q[c],
                k[c],
                bi[c] - mh[c],
                [f_inter[c], f_10_root[c], f_state[c]],
            );
        }
        // SAFETY: rows < 16 of the chunk (k_half0: half 0 only), this thread's channels: one
        // writer per piece; aligned; nobody reads the tiles before the next barrier.
        unsafe {
            let at = |v: Var| t.var(v, row, col);
            store_words::<CPT>(at(Var::QDiag), pack::<CPT>(&qd));
            store_words::<CPT>(at(Var::QInter), pack::<CPT>(&qi));
            if half == 0 {
                store_words::<CPT>(at(Var::KHalf0), pack::<CPT>(&kd));
            }
            store_words::<CPT>(at(Var::KHalf1), pack::<CPT>(&kh1));
            store_words::<CPT>(at(Var::KState), pack::<CPT>(&ks));
        }
    }
}

/// The element-wise phase of one step of the state pass: `k_state = k 2^{(E - B_s) + C}`
/// relative to the end of the segment (`B` cumulative from the step's start, `E` the step's
/// total, `C` = `carry` the total of the segment's later steps, all log2: every factor is the
/// token's true weight in the segment's state, `<= 1` for `g <= 0`, so a flushed one only drops
/// a term below `2^-126 |k|`). Thread `ctid` takes `CPT = 8` channels (group `ctid / P`) of
/// `TPT` consecutive tokens (`P` lanes per group). Returns `E` of its channels.
///
/// # Safety
/// The warpgroup's 128 threads call it (whole warps); the stage was published by its full
/// phase; the `k_state` tile is not read before the next barrier.
#[inline(always)]
pub(super) unsafe fn elementwise_states<const DK: u32, const P: u32, const TPT: usize>(
    ctid: u32,
    t: &PingpongChunk<DK>,
    valid: u32,
    carry: &[f32; 8],
) -> [f32; 8] {
    const CPT: usize = 8;
    const { assert!(P * (DK / CPT as u32) == WARPGROUP_SIZE && 32 % P == 0 && P >= 2) };
    let part = ctid % P;
    let group = ctid / P;
    let base_lane = index::lane_id() - part;
    let col = group * 2 * CPT as u32;
    let first = part * TPT as u32;
    // SAFETY: published raw g rows of the step (the caller's contract); aligned pieces.
    let (b, acc) = unsafe { local_cumsum::<CPT, TPT>(|row| t.raw(Raw::G, row, col), first, valid) };
    // SAFETY: whole warps, uniform loop bounds.
    let excl = unsafe { run_prefix::<CPT, P>(acc, part) };
    let mut e = [0.0f32; CPT];
    for c in 0..CPT {
        // SAFETY: every lane executes the shuffle; the source is the group's last lane, whose
        // inclusive run total is the step's total.
        e[c] = unsafe { shfl_f32(acc[c] + excl[c], base_lane + P - 1) };
    }
    // Per channel, `E - excl + C`: the token's exponent is this minus its local cumsum.
    let mut off = [0.0f32; CPT];
    for c in 0..CPT {
        off[c] = (e[c] - excl[c]) + carry[c];
    }
    for (i, bi) in b.iter().enumerate() {
        let row = first + i as u32;
        // SAFETY: a published raw k row of the step; aligned piece.
        let kw = unsafe { load_words::<CPT>(t.raw(Raw::K, row, col)) };
        let kw = if row >= valid { [0; 4] } else { kw };
        let k = unpack::<CPT>(kw);
        let mut ks = [0.0f32; CPT];
        for c in 0..CPT {
            ks[c] = k[c] * math::exp2(off[c] - bi[c]);
        }
        // SAFETY: row < step of the swizzled k_state tile, this thread's piece: one writer;
        // nobody reads it before the next barrier.
        unsafe { store_words::<CPT>(t.var(Var::KState, row, col), pack::<CPT>(&ks)) };
    }
    e
}
