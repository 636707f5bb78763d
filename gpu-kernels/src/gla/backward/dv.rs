//! The reverse pass's dv of one chunk, one warp on its 16 value columns: the transposed
//! intra-chunk scores and `dv = A^T dO + k_state G` on `mma.sync` (the forward's output
//! phase with the roles of q and k exchanged and time reversed).

use super::super::baseline::matrix::Lane;
use super::super::baseline::tiles::Variants;
use super::super::chunk::mma_bf16;
use crate::arch::{convert, ldmatrix};
use kernel_abi::gla::GlaConfig;

/// The transposed intra-chunk scores `A^T[s][t] = scale q_t . k_s 2^{b_t - b_s}` for `t >= s`
/// (rows `s`, columns `t`), as the A fragment of `dv += A^T dO` (rows `s`, k = `t`):
/// rows of half 0 pair `q_diag` (`k 2^{M_0 - b}`) with `k_half1` (`scale q 2^{b - M_0}`, all 16
/// columns); rows of half 1 pair it (`k 2^{M_1 - b}`) with `k_half0` (`scale q 2^{b - M_1}`,
/// columns of half 1); (half 1, half 0) is zero (past tokens). Masked entries are replaced
/// by 0 with selects, so an overflow there never propagates.
///
/// # Safety
/// Whole warp, uniform control flow; the tiles were published by a barrier.
#[inline(always)]
unsafe fn scores_t<const DK: u32, const NKK: usize>(lane: u32, var: &Variants) -> [u32; 4] {
    let rb = const { GlaConfig::row_bytes(DK) };
    let mut x = [0.0f32; 4];
    let mut y = [0.0f32; 4];
    let mut z = [0.0f32; 4];
    for kk in 0..NKK {
        let kc = 2 * kk as u32;
        // SAFETY: published tiles (the caller's contract), rows < 16 (8 for k_half0).
        unsafe {
            let ka = ldmatrix::x4(var.q_diag + (lane % 16) * rb + (kc + lane / 16) * 16);
            let b0 = ldmatrix::x4(
                var.k_half1 + (lane % 8 + (lane / 16) * 8) * rb + (kc + (lane / 8) % 2) * 16,
            );
            let b1 = ldmatrix::x2(var.k_half0 + (lane % 8) * rb + (kc + (lane / 8) % 2) * 16);
            mma_bf16(&mut x, ka, [b0[0], b0[1]]);
            mma_bf16(&mut y, ka, [b0[2], b0[3]]);
            mma_bf16(&mut z, ka, b1);
        }
    }
    let (g, t) = (lane / 4, lane % 4);
    // Keep t >= s within each half: column 2t + e against row g (half 0, x) or row g + 8
    // (half 1, z, columns 8 + 2t + e).
    let keep0 = 2 * t >= g;
    let keep1 = 2 * t + 1 >= g;
    let sel = |keep: bool, v: f32| if keep { v } else { 0.0 };
    [
        convert::pack_bf16x2(sel(keep0, x[0]), sel(keep1, x[1])),
        convert::pack_bf16x2(0.0, 0.0),
        convert::pack_bf16x2(y[0], y[1]),
        convert::pack_bf16x2(sel(keep0, z[2]), sel(keep1, z[3])),
    ]
}

/// dv of one chunk for one warp: `A^T dO` plus `q_inter G` (`q_inter` holding
/// `k 2^{b_15 - b}`, `G` the gradient at the chunk's end in the `S^T` accumulator layout of
/// the forward's state), stored in bf16 for the chunk's `valid` tokens.
///
/// # Safety
/// Whole warp, uniform control flow; `var` and the raw dO rows `do_rows ..+ 16` were published
/// by a barrier and are not overwritten before the next one; `dv_rows` points at element `dv0`
/// (the warp's first value column) of this head in the chunk's first row of dv, rows `row_stride`
/// elements apart, and the chunk has `valid` rows.
#[inline(always)]
pub(super) unsafe fn dv_chunk<const DK: u32, const DV: u32, const NKK: usize, const NJ: usize>(
    l: &Lane,
    var: &Variants,
    do_rows: u32,
    st: &[[f32; 4]; NJ],
    dv_rows: *mut u16,
    row_stride: usize,
    valid: u32,
) {
    const { assert!(NKK as u32 * 16 == DK && NJ == 2 * NKK) };
    let rb = const { GlaConfig::row_bytes(DK) };
    let rbv = const { GlaConfig::row_bytes(DV) };
    let lane = l.lane;
    let wchunk = l.dv0 / 8;
    let mut d = [[0.0f32; 4]; 2];
    // SAFETY: whole warp, uniform; published tiles and dO rows < 16 (the caller's contract).
    unsafe {
        let pa = scores_t::<DK, NKK>(lane, var);
        let ob = ldmatrix::x4_trans(do_rows + (lane % 16) * rbv + (wchunk + lane / 16) * 16);
        mma_bf16(&mut d[0], pa, [ob[0], ob[1]]);
        mma_bf16(&mut d[1], pa, [ob[2], ob[3]]);
    }
    for kk in 0..NKK {
        let kc = 2 * kk as u32;
        let (j0, j1) = (2 * kk, 2 * kk + 1);
        // G as the B operand (k = key channels, n = the warp's value columns), from the
        // thread's own accumulators (as the forward packs S).
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
            let ka = ldmatrix::x4(var.q_inter + (lane % 16) * rb + (kc + lane / 16) * 16);
            mma_bf16(&mut d[0], ka, b_lo);
            mma_bf16(&mut d[1], ka, b_hi);
        }
    }
    for h in 0..2 {
        let row = l.g + 8 * h as u32;
        if row < valid {
            let dst = dv_rows.wrapping_add(row as usize * row_stride);
            for n in 0..2 {
                let w = convert::pack_bf16x2(d[n][2 * h], d[n][2 * h + 1]);
                let col = 8 * n as u32 + 2 * l.t;
                // SAFETY: row < valid rows of the chunk, dv0 + col + 1 < DV: inside dv;
                // 4-byte aligned (even column, contiguous rows).
                unsafe { *(dst.wrapping_add(col as usize) as *mut u32) = w };
            }
        }
    }
}
