//! The mask ([`super::super::mask`]) on a consumer's `wgmma` accumulators: each thread holds two
//! rows, whose allowed keys are computed once per tile as inclusive ranges ([`Rows`]), so that
//! masking a step is two compares and a select per element.

use super::super::mask;
use kernel_abi::attention::HOPPER_BLOCK_M;

/// Where a thread's accumulator rows are, and the masking parameters.
#[derive(Clone, Copy)]
pub(super) struct Rows {
    pub(super) m0: u32,
    pub(super) t: u32,
    pub(super) window_left: i32,
    pub(super) window_right: i32,
    pub(super) seq_k: i32,
    pub(super) offset: i32,
    /// The allowed keys of the thread's two rows (`g`, `g + 8` of its warp): `key_lo ..=
    /// key_hi` (empty when `key_lo > key_hi`).
    pub(super) key_lo: [i32; 2],
    pub(super) key_hi: [i32; 2],
    pub(super) scale_log2: f32,
    /// `LogitOptions::softcap_scale` (read by the `capsink` kernels only).
    pub(super) softcap_scale: f32,
}

/// Mask the logits of keys `n0 .. n0 + BN` (-inf outside each row's allowed range, only
/// where the step crosses a window edge or `seq_k`), then scale them to base-2 logits when
/// `SCALE`. Branch-free per element: two compares against the row's range (relative to the
/// thread's first column) and a select.
#[inline(always)]
pub(super) fn mask_step<const SR: usize, const BN: u32, const SCALE: bool>(
    r: &Rows,
    s: &mut [f32; SR],
    n0: u32,
) {
    let (wl, wr, sk, off) = (r.window_left, r.window_right, r.seq_k, r.offset);
    let row_lo = r.m0 as i32;
    let row_hi = (r.m0 + HOPPER_BLOCK_M - 1) as i32;
    let (key_lo, key_hi) = (n0 as i32, (n0 + BN - 1) as i32);
    // i32 is exact: the host keeps lengths and windows below 2^30.
    let needs_mask = key_hi >= sk
        || (wr >= 0 && key_hi > row_lo + off + wr)
        || (wl >= 0 && key_lo < row_hi + off - wl);
    if needs_mask {
        // Column of element (j, e): n0 + 2 t + 8 j + e % 2.
        let base = (n0 + 2 * r.t) as i32;
        let lo = [r.key_lo[0] - base, r.key_lo[1] - base];
        let hi = [r.key_hi[0] - base, r.key_hi[1] - base];
        mask::fill_outside(s, lo, hi, f32::NEG_INFINITY);
    }
    if SCALE {
        for x in s.iter_mut() {
            *x *= r.scale_log2;
        }
    }
}
