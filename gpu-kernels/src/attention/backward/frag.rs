//! Warp-level products of the backward kernels on padded row-major tiles in shared memory (the
//! forward's layout: rows of `RB` bytes, 16 bytes of padding, so the 8 rows of an `ldmatrix`
//! phase fall in distinct bank groups), and the conversion of accumulators to A fragments.
//!
//! Fragment layouts are those of [`crate::arch::mma`]: an m16n8 accumulator `[f32; 4]` holds
//! `C[g][2t..2t+2]` and `C[g+8][2t..2t+2]` (`g = lane / 4`, `t = lane % 4`).
//!
//! # Safety (every `unsafe` function)
//! Whole warp, uniform control flow; the tiles read were published by a barrier and are not
//! overwritten before the caller's next barrier.

use super::super::elem::Elem;
use crate::arch::ldmatrix;

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of `RB`-byte rows.
#[inline(always)]
pub(super) fn at<const RB: u32>(row: u32, chunk: u32) -> u32 {
    row * RB + (chunk << 4)
}

/// The A fragment (m16 x k16) of rows `row0 .. row0 + 16`, k-slice `kk`, of a row-major tile.
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub(super) unsafe fn a_rows<const RB: u32>(lane: u32, tile: u32, row0: u32, kk: usize) -> [u32; 4] {
    let addr = tile + at::<RB>(row0 + lane % 16, 2 * kk as u32 + lane / 16);
    // SAFETY: forwarded to the caller.
    unsafe { ldmatrix::x4(addr) }
}

/// The A fragment (m16 x k16) of `A = T^T` for a tile `T` stored row-major `[k][m]`: k rows
/// `k0 .. k0 + 16`, m columns from 16-byte chunk `m_chunk` (8 columns a chunk).
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub(super) unsafe fn a_trans<const RB: u32>(
    lane: u32,
    tile: u32,
    k0: u32,
    m_chunk: u32,
) -> [u32; 4] {
    let addr = tile + at::<RB>(k0 + lane % 8 + 8 * (lane / 16), m_chunk + (lane / 8) % 2);
    // SAFETY: forwarded to the caller.
    unsafe { ldmatrix::x4_trans(addr) }
}

/// The A fragment of k-slice `kk` of a 16 x `8 NT` product held in accumulators (rounded to
/// the element type): P or dS as the left operand of the next product.
#[inline(always)]
pub(super) fn pack_a<E: Elem, const NT: usize>(s: &[[f32; 4]; NT], kk: usize) -> [u32; 4] {
    [
        E::pack(s[2 * kk][0], s[2 * kk][1]),
        E::pack(s[2 * kk][2], s[2 * kk][3]),
        E::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
        E::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]),
    ]
}

/// `acc += A B^T`: A is 16 x `16 KK` (`a(kk)` gives k-slice `kk`), B the `8 NT` rows from `n0` of
/// the row-major tile `b` (`[n][k]`: rows are the output's columns), as `S = Q K^T`.
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub(super) unsafe fn mma_abt<E: Elem, const RB: u32, const KK: usize, const NT: usize>(
    lane: u32,
    acc: &mut [[f32; 4]; NT],
    a: impl Fn(usize) -> [u32; 4],
    b: u32,
    n0: u32,
) {
    for kk in 0..KK {
        let af = a(kk);
        for jj in 0..NT / 2 {
            let row = n0 + 16 * jj as u32 + lane % 8 + (lane / 16) * 8;
            let addr = b + at::<RB>(row, 2 * kk as u32 + (lane / 8) % 2);
            // SAFETY: forwarded to the caller.
            unsafe {
                let bf = ldmatrix::x4(addr);
                E::mma(&mut acc[2 * jj], af, [bf[0], bf[1]]);
                E::mma(&mut acc[2 * jj + 1], af, [bf[2], bf[3]]);
            }
        }
    }
}

/// `acc += A B`: A is 16 x `16 KK` (`a(kk)` gives k-slice `kk`), B the rows `0 .. 16 KK` of the
/// row-major tile `b` (`[k][n]`), columns `8 chunk0 .. 8 (chunk0 + NT)`, as `O += P V`. The
/// n8 tiles are loaded in pairs (`ldmatrix.x4.trans`); an odd last one alone (`.x2.trans`).
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub(super) unsafe fn mma_ab<E: Elem, const RB: u32, const KK: usize, const NT: usize>(
    lane: u32,
    acc: &mut [[f32; 4]; NT],
    a: impl Fn(usize) -> [u32; 4],
    b: u32,
    chunk0: u32,
) {
    for kk in 0..KK {
        let af = a(kk);
        for jj in 0..NT / 2 {
            let addr = b + at::<RB>(
                16 * kk as u32 + lane % 16,
                chunk0 + 2 * jj as u32 + lane / 16,
            );
            // SAFETY: forwarded to the caller.
            unsafe {
                let bf = ldmatrix::x4_trans(addr);
                E::mma(&mut acc[2 * jj], af, [bf[0], bf[1]]);
                E::mma(&mut acc[2 * jj + 1], af, [bf[2], bf[3]]);
            }
        }
        if NT % 2 == 1 {
            // Lanes 0..16 give the rows of the two 8 x 8 matrices (k rows 0..8, 8..16).
            let addr = b + at::<RB>(16 * kk as u32 + lane % 16, chunk0 + NT as u32 - 1);
            // SAFETY: forwarded to the caller.
            unsafe {
                let bf = ldmatrix::x2_trans(addr);
                E::mma(&mut acc[NT - 1], af, bf);
            }
        }
    }
}
