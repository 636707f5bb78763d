//! The baseline's element-wise phase of a chunk: cumulative log-decays, the chunk's edges and
//! midpoints, and the operand tiles of [`super::super::chunk`] (thread mapping: the "Thread
//! mapping" section of the baseline's module documentation).

use super::super::chunk::{ChunkTiles, Raw, Var, chunk_edges, chunk_operands};
use crate::arch::smem::SmemValue;
use crate::arch::{convert, index, math, warp};
use kernel_abi::gla::{CHUNK, G_FLOOR, HALF};

/// `shfl.sync.up` of an f32 over the full warp.
///
/// # Safety
/// All 32 lanes execute the call.
#[inline(always)]
unsafe fn shfl_up_f32(v: f32, delta: u32) -> f32 {
    // SAFETY: forwarded to the caller (full warp).
    f32::from_bits(unsafe { warp::shfl_up_u32(warp::FULL_MASK, v.to_bits(), delta) })
}

/// The element-wise phase of one chunk (formulas: [`super::super::chunk`]): reads the raw q, k, g
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
pub(super) unsafe fn elementwise<
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
    // The exponent bounds of `chunk`'s module documentation: |b_t - M_h| <= 3.5 decays and
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
            // The square root of 2^{M_1 - M_0}: at least 2^-115.4, never flushed (see `chunk`'s
            // module documentation: the factor itself may lie below 2^-126 while k_half1 does
            // not).
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
