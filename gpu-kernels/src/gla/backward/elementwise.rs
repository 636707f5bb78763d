//! The element-wise phase of the state-gradient pass: per chunk, the cumulative log-decays, the
//! chunk's decay row `2^{b_15}` and the scaled decayed queries `scale q_t 2^{b_t}` (thread
//! mapping: the baseline forward's, `P` lanes per pair of key channels).

use super::super::baseline::tiles::Variants;
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

/// `shfl.sync.idx` of an f32 over the full warp.
///
/// # Safety
/// All 32 lanes execute the call.
#[inline(always)]
unsafe fn shfl_f32(v: f32, src: u32) -> f32 {
    // SAFETY: forwarded to the caller (full warp).
    unsafe { warp::shfl_idx_f32(warp::FULL_MASK, v, src) }
}

/// The element-wise phase of one chunk of the state-gradient pass: reads the raw q and g rows
/// (`q_rows`, `g_rows`: the chunk's first row, padded rows of `DK` elements), writes
/// `scale q_t 2^{b_t}` (bf16) into `var.k_state` and `2^{b_15}` into `var.decay`, where `b_t`
/// is the inclusive cumulative log2-decay from the chunk start (`g` clamped at `G_FLOOR`).
/// Rows past the segment's end are zero-filled by the loads (q = 0, g = 0: no decay, no term).
/// `tid` is the thread's index among the `P DK / 2` threads (`DK / 2` pairs of `P` lanes).
///
/// Range: for `g <= 0` (the model's domain) `b_t <= 0`, so `2^{b_t} <= 1` and nothing
/// overflows; a factor flushed to zero (`b_t < -126`) drops a term below `2^-126 |q| |dO|`.
///
/// # Safety
/// Every thread of the block calls it (uniform control flow; whole warps shuffle); the raw rows
/// were published by a barrier and `var` is not read by any thread until the next barrier.
#[inline(always)]
pub(super) unsafe fn elementwise<const DK: u32, const P: u32, const TPT: usize>(
    tid: u32,
    q_rows: u32,
    g_rows: u32,
    var: &Variants,
    scale: f32,
) {
    const { assert!(P * TPT as u32 == CHUNK && TPT as u32 <= HALF && 32 % P == 0) };
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
    let mut excl = [0.0f32; 2];
    let mut b15 = [0.0f32; 2];
    for c in 0..2 {
        // SAFETY: every lane executes the shuffles; the sources are lanes of this pair.
        unsafe {
            let v = shfl_up_f32(incl[c], 1);
            excl[c] = if part == 0 { 0.0 } else { v };
            b15[c] = shfl_f32(incl[c], base_lane + P - 1);
        }
    }
    if part == P - 1 {
        let d = [math::exp2(b15[0]), math::exp2(b15[1])];
        let bits = (d[0].to_bits() as u64) | ((d[1].to_bits() as u64) << 32);
        // SAFETY: channels 2 pair, +1 < DK of the decay row; 8-byte aligned; this thread is
        // the row's only writer (one part per pair) until the next barrier.
        unsafe { u64::store(var.decay + 8 * pair, bits) };
    }
    for i in 0..TPT {
        let row = first + i as u32;
        // SAFETY: row < 16 of the published raw q rows; 4-byte aligned.
        let qw = unsafe { u32::load(q_rows + row * rb + col) };
        let (q0, q1) = convert::unpack_bf16x2(qw);
        let s0 = scale * q0 * math::exp2(b[i][0] + excl[0]);
        let s1 = scale * q1 * math::exp2(b[i][1] + excl[1]);
        // SAFETY: row < 16 of this buffer's k_state tile, channels 2 pair, +1: one writer
        // per (row, pair); 4-byte aligned; nobody reads the buffer before the next barrier.
        unsafe { u32::store(var.k_state + row * rb + col, convert::pack_bf16x2(s0, s1)) };
    }
}
