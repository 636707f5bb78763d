//! Accurate f64 `exp` and `ln` (there are no f64 transcendental instructions), for sums that a
//! kernel carries over very many steps, where the f32 approximations' errors would accumulate
//! (the semi-CRF scans). Plain Rust over [`fma`]: no PTX here, so the host test suite compiles
//! this same file and checks its accuracy against the standard library.
//!
//! Both are within a few ulp (relative error below 1e-15) on the ranges used: `exp` for any
//! finite `x` (0 below -708, +inf above 709, NaN propagates), `ln` for positive finite `x`
//! (-inf for 0, NaN for negative or NaN input).

#[cfg(target_arch = "nvptx64")]
use super::math::fma_f64 as fma;

/// `a * b + c` with one rounding (the host's `mul_add`).
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
fn fma(a: f64, b: f64, c: f64) -> f64 {
    a.mul_add(b, c)
}

/// ln 2 split for Cody-Waite reduction (fdlibm's `ln2_hi`, `ln2_lo`): `LN2_HI` has its low 21
/// bits zero, so `n * LN2_HI` is exact for `|n| < 2^21`; `LN2_HI + LN2_LO` is ln 2 to about
/// 1e-26.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1.5 * 2^52: adding it to `|y| < 2^51` rounds `y` to an integer held in the low mantissa bits.
const SHIFTER: f64 = 6_755_399_441_055_744.0;

/// e^x: `x = n ln 2 + r` with `n = round(x / ln 2)` and `|r| <= ln 2 / 2`, `e^r` by its Taylor
/// polynomial of degree 12 (truncation below 1.8e-16 relative), then `2^n` added to the
/// exponent field.
#[inline(always)]
pub fn exp(x: f64) -> f64 {
    if x < -708.0 {
        // Also -inf; e^-708 is about 3.3e-308, just above the smallest normal f64.
        return 0.0;
    }
    if x > 709.0 {
        return f64::INFINITY;
    }
    let t = fma(x, core::f64::consts::LOG2_E, SHIFTER);
    let n = t - SHIFTER;
    let r = fma(-n, LN2_HI, x);
    let r = fma(-n, LN2_LO, r);
    let mut p = 1.0 / 479_001_600.0; // 1/12!
    p = fma(p, r, 1.0 / 39_916_800.0);
    p = fma(p, r, 1.0 / 3_628_800.0);
    p = fma(p, r, 1.0 / 362_880.0);
    p = fma(p, r, 1.0 / 40_320.0);
    p = fma(p, r, 1.0 / 5_040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    // n as an integer (|n| <= 1023), from the low bits of t; p * 2^n through the exponent (p is
    // in [0.7, 1.42] and -1021 <= n <= 1023, so the result is a normal number). A NaN x gives a
    // NaN p, which stays NaN.
    let n = (t.to_bits() as i64).wrapping_sub(SHIFTER.to_bits() as i64);
    f64::from_bits((p.to_bits() as i64).wrapping_add(n << 52) as u64)
}

/// ln x: `x = 2^k m` with `m` in `[sqrt(2)/2, sqrt(2)]`, `ln m = 2 atanh(s)` with
/// `s = (m - 1) / (m + 1)`, evaluated as in Sun's fdlibm (`e_log.c`: minimax coefficients of
/// the odd series, `ln m = f - (f^2/2 - s (f^2/2 + R))` with `f = m - 1`), then `k ln 2` added
/// in two parts.
#[inline(always)]
pub fn ln(x: f64) -> f64 {
    // fdlibm's Lg1..Lg7 (bit patterns, so no decimal rounding is involved).
    const LG1: f64 = f64::from_bits(0x3fe5_5555_5555_5593);
    const LG2: f64 = f64::from_bits(0x3fd9_9999_9997_fa04);
    const LG3: f64 = f64::from_bits(0x3fd2_4924_9422_9359);
    const LG4: f64 = f64::from_bits(0x3fcc_71c5_1d8e_78af);
    const LG5: f64 = f64::from_bits(0x3fc7_4664_96cb_03de);
    const LG6: f64 = f64::from_bits(0x3fc3_9a09_d078_c69f);
    const LG7: f64 = f64::from_bits(0x3fc2_f112_df3e_5244);
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    if x == f64::INFINITY {
        return x;
    }
    let (mut x, mut k) = (x, 0i64);
    if x < f64::MIN_POSITIVE {
        // Subnormal: scale into the normal range.
        x *= 18_014_398_509_481_984.0; // 2^54
        k = -54;
    }
    let bits = x.to_bits();
    k += ((bits >> 52) as i64) - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > core::f64::consts::SQRT_2 {
        m *= 0.5;
        k += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * fma(w, fma(w, LG6, LG4), LG2);
    let t2 = z * fma(w, fma(w, fma(w, LG7, LG5), LG3), LG1);
    let r = t2 + t1;
    let hfsq = 0.5 * f * f;
    let kf = k as f64;
    kf * LN2_HI - ((hfsq - fma(s, hfsq + r, kf * LN2_LO)) - f)
}
