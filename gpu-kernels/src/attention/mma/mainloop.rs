//! The main loop's pieces of the `mma.sync` kernel: the shared-memory tile layout and its
//! `cp.async` loads, the warp's place in the problem ([`Warp`]), S = Q K^T ([`qk`]), the masks
//! on the S fragments, and O += P V ([`pv`]).

use super::super::elem::Elem;
use super::super::mask;
use crate::arch::ldmatrix;

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of `D`-element rows padded by
/// 16 bytes (`TileConfig::row_bytes`). Along a row the offset is linear, so the k-slices of an
/// `ldmatrix` sequence are compile-time offsets from one per-thread base address.
#[inline(always)]
pub(in crate::attention) fn tile_offset<const D: u32>(row: u32, chunk: u32) -> u32 {
    row * (D * 2 + 16) + (chunk << 4)
}

/// Issue the `cp.async` copies of a `[ROWS, D]` tile into the swizzled layout of
/// [`tile_offset`] ([`crate::tiles::load_rows`]; strides and base host-checked 16-byte aligned).
#[inline(always)]
pub(super) fn load_tile<const D: u32, const ROWS: u32, const THREADS: u32>(
    dst: u32,
    base: *const u16,
    first_row_offset: u64,
    stride: u64,
    valid: u32,
) {
    crate::tiles::load_rows::<D, ROWS, THREADS>(
        dst,
        tile_offset::<D>,
        base,
        first_row_offset,
        stride,
        valid,
    )
}

/// A warp's place in the problem: everything the step functions need besides the tiles.
#[derive(Clone, Copy)]
pub(in crate::attention) struct Warp {
    pub(in crate::attention) lane: u32,
    /// `lane / 4`: the row within an m16 half-tile a thread holds accumulators for.
    pub(in crate::attention) g: u32,
    /// `lane % 4`: which column pair of each n8 tile a thread holds.
    pub(in crate::attention) t: u32,
    /// First row of this warp within the block.
    pub(in crate::attention) warp_row: u32,
    /// First query row of the block.
    pub(in crate::attention) m0: u32,
    /// Query rows of the block that exist (`<= block_m`).
    pub(in crate::attention) rows_valid: u32,
    /// `seq_k - seq_q` (the diagonal offset of the bottom-right alignment).
    pub(in crate::attention) offset: i32,
    pub(in crate::attention) window_left: i32,
    pub(in crate::attention) window_right: i32,
    pub(in crate::attention) seq_k: i32,
    /// Softmax scale times log2(e).
    pub(in crate::attention) scale_log2: f32,
}

/// The A fragment of m-tile `mt`, k-slice `kk` of the Q tile at `q_s`.
#[inline(always)]
pub(in crate::attention) fn q_fragment<const D: u32>(
    w: &Warp,
    q_s: u32,
    mt: usize,
    kk: usize,
) -> [u32; 4] {
    let addr = q_s
        + tile_offset::<D>(
            w.warp_row + 16 * mt as u32 + w.lane % 16,
            2 * kk as u32 + w.lane / 16,
        );
    // SAFETY: whole warp, uniform control flow (callers); Q was published by the first barrier
    // of the block and is never written again.
    unsafe { ldmatrix::x4(addr) }
}

/// S = Q K^T for the warp's `MT` m-tiles and the `BN` keys of the K tile at `k_s`; each K
/// fragment feeds `MT` products.
///
/// # Safety
/// Whole warp, uniform control flow; the K tile (and Q) were published by a barrier and are not
/// overwritten before the caller's next barrier.
#[inline(always)]
pub(in crate::attention) unsafe fn qk<
    E: Elem,
    const D: u32,
    const MT: usize,
    const DK: usize,
    const NT: usize,
    const NK: usize,
    const Q_REGS: bool,
    const PF: bool,
>(
    w: &Warp,
    q_s: u32,
    q_frag: &[[[u32; 4]; DK]; MT],
    k_s: u32,
) -> [[[f32; 4]; NT]; MT] {
    let mut s = [[[0.0f32; 4]; NT]; MT];
    if PF {
        // Fragments of slice `kk + 1` are loaded before the products of slice `kk`.
        let load_a = |kk: usize| {
            let mut a = [[0u32; 4]; MT];
            for mt in 0..MT {
                a[mt] = if Q_REGS {
                    q_frag[mt][kk]
                } else {
                    q_fragment::<D>(w, q_s, mt, kk)
                };
            }
            a
        };
        let load_b = |kk: usize| {
            let mut b = [[0u32; 4]; NK];
            for jj in 0..NK {
                let key = 16 * jj as u32 + w.lane % 8 + (w.lane / 16) * 8;
                let addr = k_s + tile_offset::<D>(key, 2 * kk as u32 + (w.lane / 8) % 2);
                // SAFETY: forwarded to the caller (tile published, whole warp).
                b[jj] = unsafe { ldmatrix::x4(addr) };
            }
            b
        };
        let (mut a, mut b) = (load_a(0), load_b(0));
        for kk in 0..DK {
            let (na, nb) = if kk + 1 < DK {
                (load_a(kk + 1), load_b(kk + 1))
            } else {
                (a, b)
            };
            for jj in 0..NK {
                for mt in 0..MT {
                    // SAFETY: whole warp, uniform control flow.
                    unsafe {
                        E::mma(&mut s[mt][2 * jj], a[mt], [b[jj][0], b[jj][1]]);
                        E::mma(&mut s[mt][2 * jj + 1], a[mt], [b[jj][2], b[jj][3]]);
                    }
                }
            }
            (a, b) = (na, nb);
        }
        return s;
    }
    for kk in 0..DK {
        let mut a = [[0u32; 4]; MT];
        for mt in 0..MT {
            a[mt] = if Q_REGS {
                q_frag[mt][kk]
            } else {
                q_fragment::<D>(w, q_s, mt, kk)
            };
        }
        for jj in 0..NK {
            let key = 16 * jj as u32 + w.lane % 8 + (w.lane / 16) * 8;
            let addr = k_s + tile_offset::<D>(key, 2 * kk as u32 + (w.lane / 8) % 2);
            // SAFETY: forwarded to the caller (tile published, whole warp).
            let b = unsafe { ldmatrix::x4(addr) };
            for mt in 0..MT {
                // SAFETY: whole warp, uniform control flow.
                unsafe {
                    E::mma(&mut s[mt][2 * jj], a[mt], [b[0], b[1]]);
                    E::mma(&mut s[mt][2 * jj + 1], a[mt], [b[2], b[3]]);
                }
            }
        }
    }
    s
}

/// Mask the logits of keys `n0 .. n0 + BN` on the S fragments where this step crosses a window
/// edge or `seq_k` (-inf = masked; the predicates of [`mask::step_needs_mask`] and
/// [`mask::allowed`]), then scale to base-2 logits. Scaling
/// before the maximum keeps the maximum's own exponent exactly 0; the folded softmax modes call
/// [`mask()`] alone and scale in the FFMA of the exponent instead
/// ([`softmax_folded_p`](super::super::softmax::softmax_folded_p)). The predicates are
/// written out here rather than called (through [`mask()`] or [`super::super::mask`]): the calls
/// change LLVM's block layout, and this text keeps the PTX of the default kernels unchanged.
#[inline(always)]
pub(super) fn mask_and_scale<const MT: usize, const NT: usize, const BM: u32, const BN: u32>(
    w: &Warp,
    s: &mut [[[f32; 4]; NT]; MT],
    n0: u32,
) {
    // i32 is exact here: the host keeps sequence lengths and windows below 2^30.
    let (off, wl, wr, sk) = (w.offset, w.window_left, w.window_right, w.seq_k);
    let row_lo = w.m0 as i32;
    let row_hi = (w.m0 + BM - 1) as i32;
    let (key_lo, key_hi) = (n0 as i32, (n0 + BN - 1) as i32);
    let needs_mask = key_hi >= sk
        || (wr >= 0 && key_hi > row_lo + off + wr)
        || (wl >= 0 && key_lo < row_hi + off - wl);
    if needs_mask {
        for mt in 0..MT {
            for j in 0..NT {
                for e in 0..4 {
                    let row =
                        (w.m0 + w.warp_row + 16 * mt as u32 + w.g + 8 * (e as u32 / 2)) as i32;
                    let key = (n0 + 8 * j as u32 + 2 * w.t + (e as u32 % 2)) as i32;
                    let allowed = key < sk
                        && (wl < 0 || key >= row + off - wl)
                        && (wr < 0 || key <= row + off + wr);
                    if !allowed {
                        s[mt][j][e] = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
    for mt in 0..MT {
        for j in 0..NT {
            for e in 0..4 {
                s[mt][j][e] *= w.scale_log2;
            }
        }
    }
}

/// Mask the logits of keys `n0 .. n0 + BN` on the S fragments where this step crosses a window
/// edge or `seq_k` (-inf = masked; [`mask::allowed`]).
#[inline(always)]
pub(super) fn mask<const MT: usize, const NT: usize, const BM: u32, const BN: u32>(
    w: &Warp,
    s: &mut [[[f32; 4]; NT]; MT],
    n0: u32,
) {
    let (off, wl, wr, sk) = (w.offset, w.window_left, w.window_right, w.seq_k);
    if mask::step_needs_mask::<BM, BN>(w.m0, n0, off, wl, wr, sk) {
        for mt in 0..MT {
            for j in 0..NT {
                for e in 0..4 {
                    let row =
                        (w.m0 + w.warp_row + 16 * mt as u32 + w.g + 8 * (e as u32 / 2)) as i32;
                    let key = (n0 + 8 * j as u32 + 2 * w.t + (e as u32 % 2)) as i32;
                    if !mask::allowed(row, key, off, wl, wr, sk) {
                        s[mt][j][e] = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

/// O += P V for the `BN` keys of the V tile at `v_s`: P from the S accumulators (converted in
/// registers to A fragments), V through `ldmatrix.trans`; each V fragment feeds `MT` products.
///
/// # Safety
/// As for [`qk`], for the V tile.
#[inline(always)]
pub(in crate::attention) unsafe fn pv<
    E: Elem,
    const D: u32,
    const MT: usize,
    const DT: usize,
    const DK: usize,
    const NT: usize,
    const NK: usize,
    const PF: bool,
>(
    w: &Warp,
    s: &[[[f32; 4]; NT]; MT],
    o: &mut [[[f32; 4]; DT]; MT],
    v_s: u32,
) {
    if PF {
        // All of P packed first (S dies), and each V fragment loaded one product group ahead.
        let mut p = [[[0u32; 4]; NK]; MT];
        for kk in 0..NK {
            for mt in 0..MT {
                p[mt][kk] = [
                    E::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]),
                    E::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]),
                    E::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]),
                    E::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]),
                ];
            }
        }
        let load_v = |kk: usize, dj: usize| {
            let addr =
                v_s + tile_offset::<D>(16 * kk as u32 + w.lane % 16, 2 * dj as u32 + w.lane / 16);
            // SAFETY: forwarded to the caller (tile published, whole warp).
            unsafe { ldmatrix::x4_trans(addr) }
        };
        let mut b = load_v(0, 0);
        for kk in 0..NK {
            for dj in 0..DK {
                let nb = if dj + 1 < DK {
                    load_v(kk, dj + 1)
                } else if kk + 1 < NK {
                    load_v(kk + 1, 0)
                } else {
                    b
                };
                for mt in 0..MT {
                    // SAFETY: whole warp, uniform control flow.
                    unsafe {
                        E::mma(&mut o[mt][2 * dj], p[mt][kk], [b[0], b[1]]);
                        E::mma(&mut o[mt][2 * dj + 1], p[mt][kk], [b[2], b[3]]);
                    }
                }
                b = nb;
            }
        }
        return;
    }
    for kk in 0..NK {
        let mut a = [[0u32; 4]; MT];
        for mt in 0..MT {
            a[mt] = [
                E::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]),
                E::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]),
                E::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]),
                E::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]),
            ];
        }
        for dj in 0..DK {
            let addr =
                v_s + tile_offset::<D>(16 * kk as u32 + w.lane % 16, 2 * dj as u32 + w.lane / 16);
            // SAFETY: forwarded to the caller (tile published, whole warp).
            let b = unsafe { ldmatrix::x4_trans(addr) };
            for mt in 0..MT {
                // SAFETY: whole warp, uniform control flow.
                unsafe {
                    E::mma(&mut o[mt][2 * dj], a[mt], [b[0], b[1]]);
                    E::mma(&mut o[mt][2 * dj + 1], a[mt], [b[2], b[3]]);
                }
            }
        }
    }
}
