//! The online softmax ([`super::super::softmax`]) on a consumer's `wgmma` accumulators: one step
//! (mask, maxima, exponentials, sums), the O rescale, and P packed into the A fragments of
//! O += P V.

use super::super::elem::Elem;
use super::super::softmax::{reference, softmax_folded_max, softmax_folded_p};
use super::mask::{Rows, mask_step};
use crate::arch::{convert, math, warp};
use kernel_abi::attention::{FP8_RESCALE_THRESHOLD, RESCALE_THRESHOLD, Softmax};

/// One online-softmax step on the accumulators `s` of keys `n0 .. n0 + BN` in the softmax mode
/// `MODE` ([`Softmax::code`](kernel_abi::attention::Softmax::code)): masks, updates the
/// running maximum (reference) and sum of the thread's two rows, turns `s` into P (in f32, in
/// place), and returns the factors by which O must be rescaled, if any (applied by the caller
/// once O is not in use by a product). The folded modes are the `mma.sync` path's
/// ([`softmax_folded_max`], [`softmax_folded_p`]): the accumulator layout of a
/// `wgmma` m64 tile is, per warp, that of `NT = BN / 8` m16n8 tiles. With `CAPSINK` the raw
/// products are soft-capped first ([`super::super::logits::softcap`]).
#[inline(always)]
pub(super) fn softmax_step<
    const SR: usize,
    const NT: usize,
    const BN: u32,
    const MODE: u32,
    const CAPSINK: bool,
>(
    r: &Rows,
    s: &mut [f32; SR],
    n0: u32,
    row_max: &mut [f32; 2],
    row_sum: &mut [f32; 2],
) -> Option<[f32; 2]> {
    const { assert!(SR == 4 * NT) };
    if CAPSINK && r.softcap_scale != 0.0 {
        for x in s.iter_mut() {
            *x = super::super::logits::tanh(*x * r.softcap_scale);
        }
    }
    if MODE == Softmax::Scaled.code() {
        mask_step::<SR, BN, true>(r, s, n0);
        return Some(softmax_scaled::<SR>(s, row_max, row_sum));
    }
    mask_step::<SR, BN, false>(r, s, n0);
    // SAFETY: `[f32; SR]` and `[[[f32; 4]; NT]; 1]` have the same size (asserted above), the
    // same alignment and no padding; the borrow is exclusive.
    let tiles = unsafe { &mut *(s as *mut [f32; SR]).cast::<[[[f32; 4]; NT]; 1]>() };
    let (m, l) = (
        core::array::from_mut(row_max),
        core::array::from_mut(row_sum),
    );
    let lazy = MODE == Softmax::FoldedLazy.code() || MODE == Softmax::FoldedLazyE4m3.code();
    let threshold = if MODE == Softmax::FoldedLazyE4m3.code() {
        FP8_RESCALE_THRESHOLD
    } else {
        RESCALE_THRESHOLD
    };
    let mut correction = [[1.0f32; 2]; 1];
    let (huge, rescale) =
        softmax_folded_max::<1, NT>(tiles, m, l, r.scale_log2, lazy, threshold, &mut correction);
    if huge {
        softmax_folded_p::<1, NT, true>(tiles, m, l, r.scale_log2);
    } else {
        softmax_folded_p::<1, NT, false>(tiles, m, l, r.scale_log2);
    }
    rescale.then_some(correction[0])
}

/// The scaled softmax ([`Softmax::Scaled`]) on base-2 logits: update the running maximum and
/// sum of the thread's two rows, turn `s` into P (in f32, in place), and return the factor by
/// which O must be rescaled. A row whose maximum is still -inf uses 0 as its reference, so no
/// `-inf - -inf` is formed.
#[inline(always)]
fn softmax_scaled<const SR: usize>(
    s: &mut [f32; SR],
    row_max: &mut [f32; 2],
    row_sum: &mut [f32; 2],
) -> [f32; 2] {
    let mut correction = [1.0f32; 2];
    for h in 0..2 {
        let mut mx = f32::NEG_INFINITY;
        for j in 0..SR / 4 {
            mx = mx.max(s[4 * j + 2 * h]).max(s[4 * j + 2 * h + 1]);
        }
        // SAFETY: all 32 lanes execute these shuffles (the callers' control flow is uniform).
        unsafe {
            mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 1));
            mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 2));
        }
        let new_max = row_max[h].max(mx);
        let reference = reference(new_max);
        correction[h] = math::exp2(row_max[h] - reference);
        row_max[h] = new_max;
        row_sum[h] *= correction[h];
        for j in 0..SR / 4 {
            let p0 = math::exp2(s[4 * j + 2 * h] - reference);
            let p1 = math::exp2(s[4 * j + 2 * h + 1] - reference);
            row_sum[h] += p0 + p1;
            s[4 * j + 2 * h] = p0;
            s[4 * j + 2 * h + 1] = p1;
        }
    }
    correction
}

/// O's two rows of this thread times their factors.
#[inline(always)]
pub(super) fn rescale<const OR: usize>(o: &mut [f32; OR], correction: [f32; 2]) {
    for j in 0..OR / 4 {
        for h in 0..2 {
            o[4 * j + 2 * h] *= correction[h];
            o[4 * j + 2 * h + 1] *= correction[h];
        }
    }
}

/// P (the exponentiated scores in `s`) as register A fragments of the P V product: the
/// accumulator layout of two n8 tiles is the A fragment of a k16 slice. Call it only when no
/// `wgmma` that reads the previous fragments is in flight (defining `wgmma` input registers
/// while one runs makes ptxas serialize the pipeline).
#[inline(always)]
pub(in crate::attention) fn pack_p<E: Elem, const SR: usize, const NK: usize>(
    s: &[f32; SR],
) -> [[u32; 4]; NK] {
    let mut pa = [[0u32; 4]; NK];
    for kk in 0..NK {
        pa[kk] = [
            E::pack(s[8 * kk], s[8 * kk + 1]),
            E::pack(s[8 * kk + 2], s[8 * kk + 3]),
            E::pack(s[8 * kk + 4], s[8 * kk + 5]),
            E::pack(s[8 * kk + 6], s[8 * kk + 7]),
        ];
    }
    pa
}

/// P as the A fragments of O += P V: [`pack_p`], or with `FP8` [`pack_p_fp8`] (`NK` k-slices
/// of 16 or 32 keys).
#[inline(always)]
pub(in crate::attention) fn pack<E: Elem, const SR: usize, const NK: usize, const FP8: bool>(
    s: &[f32; SR],
) -> [[u32; 4]; NK] {
    if FP8 {
        pack_p_fp8::<SR, NK>(s)
    } else {
        pack_p::<E, SR, NK>(s)
    }
}

/// P as e4m3 A fragments of k32 slices (`wgmma` m64nNk32): slice `kk` covers the accumulator's
/// n8 tiles `4 kk .. 4 kk + 4`; register 0 takes row `g`'s pairs of tiles `4 kk` and
/// `4 kk + 1`, register 1 row `g + 8`'s, registers 2 and 3 those of tiles `4 kk + 2`, `4 kk + 3`.
/// So k position `4t + i` of the fragment is the tile-relative key `2t + (i & 1) + 8 (i >> 1)`
/// of its 16: `kernel_abi::attention::fp8::fp8_vt_key`, the order `V^T` is written in.
#[inline(always)]
pub(in crate::attention) fn pack_p_fp8<const SR: usize, const NK: usize>(
    s: &[f32; SR],
) -> [[u32; 4]; NK] {
    let mut pa = [[0u32; 4]; NK];
    if SR != 16 * NK {
        // Not an FP8 shape: only instantiated in the 16-bit kernels' dead branch of `pack`.
        return pa;
    }
    for kk in 0..NK {
        let b = 16 * kk;
        pa[kk] = [
            convert::pack_e4m3x4([s[b], s[b + 1], s[b + 4], s[b + 5]]),
            convert::pack_e4m3x4([s[b + 2], s[b + 3], s[b + 6], s[b + 7]]),
            convert::pack_e4m3x4([s[b + 8], s[b + 9], s[b + 12], s[b + 13]]),
            convert::pack_e4m3x4([s[b + 10], s[b + 11], s[b + 14], s[b + 15]]),
        ];
    }
    pa
}
