//! Emulated transcendental functions (libm's, more accurate than `ex2.approx`/`lg2.approx`,
//! with their `.ftz` behaviour: subnormal inputs and results are zero).

/// Flush a subnormal to (signed) zero, as `.ftz` does.
#[inline(always)]
fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// log2(e).
pub const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// ln(2).
pub const LN_2: f32 = core::f32::consts::LN_2;

/// 2^x.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    ftz(ftz(x).exp2())
}

/// log2(x).
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    ftz(x).log2()
}

/// e^x through [`exp2`], as on the device.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2(x * LOG2_E)
}

/// ln(x) through [`log2`].
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    log2(x) * LN_2
}

/// 1/x.
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    1.0 / x
}

/// sqrt(x), correctly rounded.
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    x.sqrt()
}

/// `a * b + c` with one rounding (`fma.rn.f32`).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
