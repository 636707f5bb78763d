//! The element-wise phase of the reverse pass: per chunk, the cumulative log-decays and the
//! operand tiles of the transposed intra-chunk scores, of dv's inter-chunk term and of the
//! gradient update (thread mapping: the baseline forward's, `P` lanes per pair of key
//! channels).

use super::super::baseline::tiles::Variants;
use super::super::chunk::chunk_edges;
use crate::arch::smem::SmemValue;
use crate::arch::{convert, math, warp};
use kernel_abi::gla::{CHUNK, G_FLOOR, GlaConfig, HALF};

/// `shfl.sync.up` of an f32 over the full warp.
///
/// # Safety
/// All 32 lanes execute the call.
#[inline(always)]
unsafe fn shfl_up_f32(v: f32, delta: u32) -> f32 {
    // SAFETY: forwarded to the caller (full warp).
    f32::from_bits(unsafe { warp::shfl_up_u32(warp::FULL_MASK, v.to_bits(), delta) })
}

/// The element-wise phase of one chunk of the reverse pass: reads the raw q, k, g rows (the
/// chunk's first rows `q_rows`, `k_rows`, `g_rows`, padded rows of `DK` elements) and writes
/// the chunk's bf16 operands into variant buffer `var` (tile names are the forward's slots),
/// with `b_t` the inclusive cumulative log2-decay from the chunk start (`g` clamped at
/// `G_FLOOR`), `M_h` the midpoint of half `h` (`(b_{8h} + b_{8h+7}) / 2`) and `h(t)` the half of
/// token `t`:
/// - `q_diag`: `k_t 2^{M_h(t) - b_t}` (rows of the transposed scores);
/// - `k_half1`: `scale q_t 2^{b_t - M_0}` for all 16 tokens (columns against rows of half 0),
///   in half 1 as `(scale q_t 2^{b_t - M_1}) r r` with `r = 2^{(M_1 - M_0) / 2}`;
/// - `k_half0` (8 rows): `scale q_t 2^{b_t - M_1}` for the tokens of half 1 (columns against
///   rows of half 1);
/// - `q_inter`: `k_t 2^{b_15 - b_t}` (the inter-chunk term of dv);
/// - `k_state`: `scale q_t 2^{b_t}` (the gradient update);
/// - the decay row `2^{b_15}`.
///
/// Range (for `g <= 0`, the model's domain; the forward's argument, mirrored): within a half
/// `|b_t - M_h| <= 3.5 * 20 * log2(e) = 101`, so the first factors are normal; `r >=
/// 2^-115.4` is normal, and `scale q_t 2^{b_t - M_0}` in half 1 is made through it so that it
/// is lost only when itself below `2^-126` (the factor `2^{M_1 - M_0}` alone may be); the
/// factors `2^{b_15 - b_t}`, `2^{b_t}` are `<= 1`, and a flushed one drops a term below `2^-126`
/// times its operands. Rows past the segment's end are zero-filled by the loads (q = k = g = 0:
/// no decay, no term).
/// `tid` is the thread's index among the `P DK / 2` threads (`DK / 2` pairs of `P` lanes).
/// Returns `b_15` of the thread's two channels (log2).
///
/// # Safety
/// Every thread of the block calls it (uniform control flow; whole warps shuffle); the raw rows
/// were published by a barrier and `var` is not read by any thread until the next barrier.
#[inline(always)]
pub(super) unsafe fn elementwise<const DK: u32, const P: u32, const TPT: usize>(
    tid: u32,
    raw: [u32; 3],
    var: &Variants,
    scale: f32,
) -> [f32; 2] {
    const { assert!(P * TPT as u32 == CHUNK && TPT as u32 <= HALF && 32 % P == 0) };
    const { assert!(4.0 * -G_FLOOR * math::LOG2_E < 126.0) };
    let [q_rows, k_rows, g_rows] = raw;
    let rb = const { GlaConfig::row_bytes(DK) };
    let (pair, part) = (tid / P, tid % P);
    let base_lane = crate::arch::index::lane_id() - part;
    let col = 4 * pair;
    let first = part * TPT as u32;
    let floor2 = G_FLOOR * math::LOG2_E;

    // Local inclusive cumulative sums of the thread's run, both channels.
    let mut b = [[0.0f32; 2]; TPT];
    let mut acc = [0.0f32; 2];
    for i in 0..TPT {
        let row = first + i as u32;
        // SAFETY: row < 16 of the published raw g rows; 4-byte aligned.
        let gw = unsafe { u32::load(g_rows + row * rb + col) };
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
    for c in 0..2 {
        // SAFETY: every lane executes the shuffle.
        let v = unsafe { shfl_up_f32(incl[c], 1) };
        let excl = if part == 0 { 0.0 } else { v };
        for i in 0..TPT {
            b[i][c] += excl;
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
        unsafe { u64::store(var.decay + 8 * pair, bits) };
    }
    let half = first / HALF;
    let mut mh = [0.0f32; 2];
    let mut r = [1.0f32; 2];
    for c in 0..2 {
        let m0 = 0.5 * (edge[0][c] + edge[1][c]);
        let m1 = 0.5 * (edge[2][c] + edge[3][c]);
        mh[c] = if half == 0 { m0 } else { m1 };
        if half == 1 {
            r[c] = math::exp2(0.5 * (m1 - m0));
        }
    }
    for i in 0..TPT {
        let row = first + i as u32;
        // SAFETY: row < 16 of the published raw q, k rows; 4-byte aligned.
        let (qw, kw) = unsafe {
            (
                u32::load(q_rows + row * rb + col),
                u32::load(k_rows + row * rb + col),
            )
        };
        let (q0, q1) = convert::unpack_bf16x2(qw);
        let (k0, k1) = convert::unpack_bf16x2(kw);
        let (q, k) = ([scale * q0, scale * q1], [k0, k1]);
        let mut kd = [0.0f32; 2];
        let mut qh = [0.0f32; 2];
        let mut q0r = [0.0f32; 2];
        let mut ks = [0.0f32; 2];
        let mut qs = [0.0f32; 2];
        for c in 0..2 {
            let x = b[i][c] - mh[c];
            kd[c] = k[c] * math::exp2(-x);
            qh[c] = q[c] * math::exp2(x);
            q0r[c] = qh[c] * r[c] * r[c];
            ks[c] = k[c] * math::exp2(b15[c] - b[i][c]);
            qs[c] = q[c] * math::exp2(b[i][c]);
        }
        // SAFETY: rows < 16 (k_half0: row - 8 < 8, written only by half-1 threads) of this
        // buffer's tiles, channels 2 pair, +1: one writer per (row, pair); 4-byte aligned;
        // nobody reads the buffer before the next barrier.
        unsafe {
            let at = |tile: u32, row: u32| tile + row * rb + col;
            let pack = |v: [f32; 2]| convert::pack_bf16x2(v[0], v[1]);
            u32::store(at(var.q_diag, row), pack(kd));
            u32::store(at(var.k_half1, row), pack(q0r));
            if half == 1 {
                u32::store(at(var.k_half0, row - HALF), pack(qh));
            }
            u32::store(at(var.q_inter, row), pack(ks));
            u32::store(at(var.k_state, row), pack(qs));
        }
    }
    b15
}
