//! The baseline's matrix phase of a chunk, one warp on its 16 value columns: intra-chunk scores,
//! `o += q_inter S` and the state update on `mma.sync` (steps 1 to 3 of the "Thread mapping"
//! section of the baseline's module documentation).

use super::super::chunk::{intra_scores, mma_bf16};
use super::tiles::Variants;
use crate::arch::smem::SmemValue;
use crate::arch::{convert, ldmatrix};
use kernel_abi::gla::GlaConfig;

/// A warp's place: lane decomposition and its value columns.
#[derive(Clone, Copy)]
pub(in crate::gla) struct Lane {
    pub(in crate::gla) lane: u32,
    /// `lane / 4`: accumulator row (and `+ 8`).
    pub(in crate::gla) g: u32,
    /// `lane % 4`: accumulator column pair.
    pub(in crate::gla) t: u32,
    /// First value column of the warp.
    pub(in crate::gla) dv0: u32,
}

/// The `[f32; 4]` accumulator tiles of `S^T` (m16 over the warp's value columns, n8 tile `j`
/// over key channels `8 j ..`): element `e` is `S[8 j + 2 t + e % 2][dv0 + g + 8 (e / 2)]`.
/// Offset (in elements) of that element in a `[DK, DV]` state.
#[inline(always)]
pub(in crate::gla) fn state_index<const DV: u32>(l: &Lane, j: usize, e: usize) -> usize {
    let dk = 8 * j as u32 + 2 * l.t + (e as u32 % 2);
    let dv = l.dv0 + l.g + 8 * (e as u32 / 2);
    (dk * DV + dv) as usize
}

/// The matrix phase of one chunk for one warp (see the baseline's module documentation).
/// `OUT = false`: only the state update.
///
/// # Safety
/// Whole warp, uniform control flow; `var` and the raw v rows `v_rows ..+ 16` were published by
/// a barrier and are not overwritten before the next one; with `OUT`, `o_rows` points at
/// element `dv0` (the warp's first value column, already added by the caller) of head `head` in
/// the chunk's first output row, and the chunk has `valid` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(in crate::gla) unsafe fn matrix<
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
                    // `dv0` (adding `dv0` again would write past the row, into the next head
                    // or token).
                    let col = 8 * n as u32 + 2 * l.t;
                    // SAFETY: row < valid rows of the chunk, dv0 + col + 1 < DV: inside o;
                    // 4-byte aligned (even column, contiguous rows).
                    unsafe { *(dst.wrapping_add(col as usize) as *mut u32) = w };
                }
            }
        }
    }
}
