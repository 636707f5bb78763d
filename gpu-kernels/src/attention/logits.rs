//! The logit options of the `capsink` kernels ([`LogitOptions`]): the softcap on raw products,
//! and the sink joined to a row's softmax when the row is finished. Shared by the forward
//! paths, the decode kernels and (the softcap and its derivative) the backward's.

use crate::arch::math;
use kernel_abi::attention::LogitOptions;

/// `tanh(x) = 1 - 2 / (2^(2 x log2 e) + 1)` from `ex2.approx` and `rcp.approx`: an absolute
/// error near 1e-7 (`tanh.approx.f32` has a relative error of 2^-11, which a softcap of 50
/// would turn into logit errors of 0.02); +-1 for large `|x|` (the exponential saturates to 0
/// or +inf), NaN for NaN.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 * math::rcp(math::exp2(x * (2.0 * math::LOG2_E)) + 1.0)
}

/// Soft-cap raw products in place on `mma.sync` accumulator tiles: `s = tanh(s
/// softcap_scale)` (the caller's `scale_log2` is `softcap log2 e`); nothing when
/// `softcap_scale` is 0. Applied before masking, so masked logits stay -inf. Constant trip
/// counts over the arrays (an iterator over them left a loop rolled and the tiles in local
/// memory).
#[inline(always)]
pub(crate) fn softcap<const MT: usize, const NT: usize>(
    s: &mut [[[f32; 4]; NT]; MT],
    opts: &LogitOptions,
) {
    let k = opts.softcap_scale;
    if k != 0.0 {
        for mt in 0..MT {
            for j in 0..NT {
                for e in 0..4 {
                    s[mt][j][e] = tanh(s[mt][j][e] * k);
                }
            }
        }
    }
}

/// The backward's logit of raw product `s` and the factor of its gradient: `(tanh(s k), 1 -
/// tanh^2(s k))` with `SOFTCAP` (`k = softcap_scale`; the caller's `scale_log2` is `softcap
/// log2 e`), `(s, 1)` without. `dS` of the raw product is the logit's gradient times the
/// factor (the softcap's derivative; the softmax scale is applied to dQ and dK at the end).
#[inline(always)]
pub(crate) fn backward_logit<const SOFTCAP: bool>(s: f32, softcap_scale: f32) -> (f32, f32) {
    if SOFTCAP {
        let t = tanh(s * softcap_scale);
        (t, math::fma(-t, t, 1.0))
    } else {
        (s, 1.0)
    }
}

/// The sink of query head `head` in base-2 units (`sink log2 e`), -inf without sinks.
///
/// # Safety
/// `opts.sinks` is null or points to at least `head + 1` f32 values.
#[inline(always)]
pub(crate) unsafe fn sink_log2(opts: &LogitOptions, head: u32) -> f32 {
    if opts.sinks.is_null() {
        f32::NEG_INFINITY
    } else {
        // SAFETY: the caller's contract.
        unsafe { *opts.sinks.add(head as usize) * math::LOG2_E }
    }
}

/// A finished row with a sink: its reference `reference` (base 2, finite when `sum > 0`), its
/// sum `sum` relative to the reference, and the sink `sink2` (base 2, -inf for none). Returns
/// the factor of the row's accumulator (`O = acc * factor`) and the natural-log LSE over the
/// keys and the sink: `LSE2 = log2(2^reference sum + 2^sink2)`, computed from the larger term
/// so that neither overflows; `factor = 2^(reference - LSE2)` (at most `1 / sum`). A row
/// with neither keys nor a finite sink gets `(0, -inf)`.
#[inline(always)]
pub(crate) fn finish_row(reference: f32, sum: f32, sink2: f32) -> (f32, f32) {
    let keys = if sum > 0.0 {
        reference + math::log2(sum)
    } else {
        f32::NEG_INFINITY
    };
    let (hi, lo) = (keys.max(sink2), keys.min(sink2));
    if hi == f32::NEG_INFINITY {
        return (0.0, f32::NEG_INFINITY);
    }
    let total = hi + math::log2(1.0 + math::exp2(lo - hi));
    let factor = if sum > 0.0 {
        math::exp2(reference - total)
    } else {
        0.0
    };
    (factor, total * math::LN_2)
}
