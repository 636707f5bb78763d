//! The online softmax of the attention kernels, in base 2, on the accumulator layout of
//! `mma.sync` m16n8 tiles: per m-tile, a thread holds rows `g` and `g + 8` of its warp's 16
//! (elements `2 h`, `2 h + 1` of each n8 tile are row half `h`), and the 4 lanes of a quad hold
//! one row. A `wgmma` m64 tile has, per warp, the layout of `NT = BN / 8` such n8 tiles, so the
//! Hopper kernel runs the same functions on its accumulators (`MT = 1`).
//!
//! - [`softmax_update`]: the scaled mode ([`Softmax::Scaled`]): logits scaled to base 2 before
//!   the maximum, `p = exp2(s - max)`.
//! - [`softmax_folded_max`] / [`softmax_folded_rescale`] and [`softmax_folded_p`]: the folded
//!   modes ([`Softmax::Folded`], [`Softmax::FoldedLazy`]): the scale folded into the FFMA of the
//!   exponent, optionally with lazy rescaling.
//!
//! NaN safety: masked logits are -inf; a row whose running maximum is still -inf uses 0 as its
//! reference ([`reference`]), so `exp2(-inf - ref) = 0` and no `-inf - -inf` is ever formed.
//! The folded modes keep these rules, subtract in the exponent's FFMA only while the rounding
//! residual of the reference is at most 1 (else they scale first, as the scaled mode does), and
//! bound every `p` by `2^(RESCALE_THRESHOLD + 1)` when they rescale lazily.
//!
//! [`Softmax::Scaled`]: kernel_abi::attention::Softmax::Scaled
//! [`Softmax::Folded`]: kernel_abi::attention::Softmax::Folded
//! [`Softmax::FoldedLazy`]: kernel_abi::attention::Softmax::FoldedLazy

use crate::arch::{math, warp};
use kernel_abi::attention::{HUGE_LOGIT, RESCALE_THRESHOLD};

/// The online-softmax update in base 2 for each m-tile and row half `h` (rows `g`, `g + 8`):
/// new running maximum (a row whose maximum is still -inf uses 0 as its reference, so no
/// `-inf - -inf` is formed), rescale of `o` and the running sum, and `s` turned into P.
#[inline(always)]
pub(super) fn softmax_update<const MT: usize, const NT: usize, const DT: usize>(
    s: &mut [[[f32; 4]; NT]; MT],
    o: &mut [[[f32; 4]; DT]; MT],
    row_max: &mut [[f32; 2]; MT],
    row_sum: &mut [[f32; 2]; MT],
) {
    for mt in 0..MT {
        for h in 0..2 {
            let mut mx = f32::NEG_INFINITY;
            for j in 0..NT {
                mx = mx.max(s[mt][j][2 * h]).max(s[mt][j][2 * h + 1]);
            }
            // SAFETY: all 32 lanes execute these shuffles (the callers' control flow is uniform).
            unsafe {
                mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 1));
                mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 2));
            }
            let new_max = row_max[mt][h].max(mx);
            let reference = if new_max == f32::NEG_INFINITY {
                0.0
            } else {
                new_max
            };
            let correction = math::exp2(row_max[mt][h] - reference);
            row_max[mt][h] = new_max;
            row_sum[mt][h] *= correction;
            for d in 0..DT {
                o[mt][d][2 * h] *= correction;
                o[mt][d][2 * h + 1] *= correction;
            }
            for j in 0..NT {
                let p0 = math::exp2(s[mt][j][2 * h] - reference);
                let p1 = math::exp2(s[mt][j][2 * h + 1] - reference);
                row_sum[mt][h] += p0 + p1;
                s[mt][j][2 * h] = p0;
                s[mt][j][2 * h + 1] = p1;
            }
        }
    }
}

/// The reference of a row whose running maximum is `m`: `m`, or 0 while `m` is -inf (so no
/// `-inf - -inf` is formed).
#[inline(always)]
pub(super) fn reference(m: f32) -> f32 {
    if m == f32::NEG_INFINITY { 0.0 } else { m }
}

/// The first half of the folded online softmax ([`Softmax::Folded`], with `lazy`
/// [`Softmax::FoldedLazy`]) on the raw logits `s` (masked ones -inf), a tile at a time: the
/// maxima of all `2 MT` rows of the thread (the shuffles of the rows interleaved, so their
/// latencies overlap), the votes, the rescales. Returns whether the step has huge maxima (the
/// same on every lane), which [`softmax_folded_p`] (the exponentials) needs.
///
/// The running maximum `row_max` is in base-2 units: `t = max * scale_log2` rounded (the scale
/// is positive, so the maximum of the raw logits is the maximum of the scaled ones), and
/// `p = exp2(fma(s, scale_log2, -t))`. The exact exponent of the row's maximal key is then the
/// rounding residual of `t` rather than 0: at most 1 while `|t| < HUGE_LOGIT`, and it cancels,
/// since O and the sum are built from the same `p` and the LSE adds `t` back. A step where some
/// row of the warp has `|t| >= HUGE_LOGIT` (the residual could overflow or underflow `exp2`)
/// scales first and subtracts after, as [`softmax_update`] does (`p = 1` exactly for the
/// maximal key); the vote makes the branch uniform.
///
/// With `lazy` the warp rescales only when some row's maximum exceeds its reference by more
/// than [`RESCALE_THRESHOLD`] (a second vote); otherwise every row keeps its reference, so
/// `p <= 2^(threshold + 1)`, and O and the sums are not touched.
///
/// [`Softmax::Folded`]: kernel_abi::attention::Softmax::Folded
/// [`Softmax::FoldedLazy`]: kernel_abi::attention::Softmax::FoldedLazy
#[inline(always)]
pub(super) fn softmax_folded_rescale<const MT: usize, const NT: usize, const DT: usize>(
    s: &[[[f32; 4]; NT]; MT],
    o: &mut [[[f32; 4]; DT]; MT],
    row_max: &mut [[f32; 2]; MT],
    row_sum: &mut [[f32; 2]; MT],
    scale_log2: f32,
    lazy: bool,
) -> bool {
    let mut correction = [[1.0f32; 2]; MT];
    let (huge, rescale) = softmax_folded_max::<MT, NT>(
        s,
        row_max,
        row_sum,
        scale_log2,
        lazy,
        RESCALE_THRESHOLD,
        &mut correction,
    );
    if rescale {
        rescale_o(o, &correction);
    }
    huge
}

/// [`softmax_folded_rescale`] without touching O, with a lazy rescale past `threshold` (the
/// `mma.sync` kernels' [`RESCALE_THRESHOLD`]; the FP8 kernels' lower one keeps P inside
/// e4m3): updates the maxima (references) and the sums, and returns whether the step has huge
/// maxima and whether the warp rescales; if it does, `correction` holds each row's factor (the
/// caller multiplies O by it, with [`rescale_o`], once O is not in use).
#[inline(always)]
pub(super) fn softmax_folded_max<const MT: usize, const NT: usize>(
    s: &[[[f32; 4]; NT]; MT],
    row_max: &mut [[f32; 2]; MT],
    row_sum: &mut [[f32; 2]; MT],
    scale_log2: f32,
    lazy: bool,
    threshold: f32,
    correction: &mut [[f32; 2]; MT],
) -> (bool, bool) {
    let mut mx = [[f32::NEG_INFINITY; 2]; MT];
    for mt in 0..MT {
        for h in 0..2 {
            if NT > 8 {
                // Wide tiles (the Hopper path's 64x128 steps): a tree, not a chain of `2 NT`
                // dependent maxima.
                let mut m = [f32::NEG_INFINITY; NT];
                for j in 0..NT {
                    m[j] = s[mt][j][2 * h].max(s[mt][j][2 * h + 1]);
                }
                for level in 0..TREE_LEVELS {
                    let stride = 1usize << level;
                    for j in 0..NT {
                        if j % (2 * stride) == 0 && j + stride < NT {
                            m[j] = m[j].max(m[j + stride]);
                        }
                    }
                }
                mx[mt][h] = m[0];
            } else {
                for j in 0..NT {
                    mx[mt][h] = mx[mt][h].max(s[mt][j][2 * h]).max(s[mt][j][2 * h + 1]);
                }
            }
        }
    }
    for k in 0..2 {
        let lane_mask = 1 << k;
        for mt in 0..MT {
            for h in 0..2 {
                // SAFETY: all 32 lanes execute these shuffles (uniform control flow).
                let other = unsafe { warp::shfl_xor_f32(warp::FULL_MASK, mx[mt][h], lane_mask) };
                mx[mt][h] = mx[mt][h].max(other);
            }
        }
    }
    let mut t = [[0.0f32; 2]; MT];
    let (mut huge, mut grow) = (false, false);
    for mt in 0..MT {
        for h in 0..2 {
            t[mt][h] = mx[mt][h] * scale_log2;
            // -inf is a row with no allowed key in this tile (handled by `reference`).
            huge |= t[mt][h].abs() >= HUGE_LOGIT && t[mt][h] != f32::NEG_INFINITY;
            // False for -inf - -inf (NaN) and for a NaN maximum.
            grow |= t[mt][h] - row_max[mt][h] > threshold;
        }
    }
    // SAFETY: all 32 lanes execute the votes (uniform control flow).
    let (huge, rescale) = unsafe {
        (
            warp::any(warp::FULL_MASK, huge),
            !lazy || warp::any(warp::FULL_MASK, grow),
        )
    };
    if rescale {
        for mt in 0..MT {
            for h in 0..2 {
                let new_max = row_max[mt][h].max(t[mt][h]);
                correction[mt][h] = math::exp2(row_max[mt][h] - reference(new_max));
                row_max[mt][h] = new_max;
                row_sum[mt][h] *= correction[mt][h];
            }
        }
    }
    (huge, rescale)
}

/// O's rows times their factors `correction` (rows `g` and `g + 8` of each m-tile).
#[inline(always)]
fn rescale_o<const MT: usize, const DT: usize>(
    o: &mut [[[f32; 4]; DT]; MT],
    correction: &[[f32; 2]; MT],
) {
    for mt in 0..MT {
        for h in 0..2 {
            for d in 0..DT {
                o[mt][d][2 * h] *= correction[mt][h];
                o[mt][d][2 * h + 1] *= correction[mt][h];
            }
        }
    }
}

/// Levels of the row-sum tree of [`softmax_folded_p`]: up to 32 n8 tiles per step.
const TREE_LEVELS: u32 = 5;

/// The second half of the folded softmax: `s` (raw logits) turned into
/// `p = exp2(s scale_log2 - reference)` in one FFMA, or (`SCALED_FIRST`, a step with huge
/// maxima, see [`softmax_folded_rescale`]) with the product rounded first; then the row sums
/// (pairwise).
#[inline(always)]
pub(super) fn softmax_folded_p<const MT: usize, const NT: usize, const SCALED_FIRST: bool>(
    s: &mut [[[f32; 4]; NT]; MT],
    row_max: &[[f32; 2]; MT],
    row_sum: &mut [[f32; 2]; MT],
    scale_log2: f32,
) {
    for mt in 0..MT {
        for h in 0..2 {
            let r = reference(row_max[mt][h]);
            for j in 0..NT {
                for e in 2 * h..2 * h + 2 {
                    let x = if SCALED_FIRST {
                        s[mt][j][e] * scale_log2 - r
                    } else {
                        math::fma(s[mt][j][e], scale_log2, -r)
                    };
                    s[mt][j][e] = math::exp2(x);
                }
            }
        }
    }
    for mt in 0..MT {
        for h in 0..2 {
            let mut pairs = [0.0f32; NT];
            for j in 0..NT {
                pairs[j] = s[mt][j][2 * h] + s[mt][j][2 * h + 1];
            }
            // A tree over the pairs (constant trip counts: unrolled, the array in registers;
            // `TREE_LEVELS` levels cover `NT <= 2^TREE_LEVELS`, and a bound much above that
            // leaves the loop rolled and the array in local memory).
            const { assert!(NT <= 1 << TREE_LEVELS) };
            for level in 0..TREE_LEVELS {
                let stride = 1usize << level;
                for j in 0..NT {
                    if stride < NT && j % (2 * stride) == 0 && j + stride < NT {
                        pairs[j] += pairs[j + stride];
                    }
                }
            }
            row_sum[mt][h] += pairs[0];
        }
    }
}
