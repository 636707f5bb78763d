//! Fast transcendental approximations (`ex2.approx`, `lg2.approx`) and helpers.
//!
//! `ex2.approx.ftz.f32` has a maximum relative error of 2^-22 over its range, returns +0 for
//! -inf and +inf for +inf; `lg2.approx.ftz.f32` returns -inf for 0.

use core::arch::asm;

/// log2(e), to turn `exp(x)` into `exp2(x * LOG2_E)`.
pub const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// ln(2), to turn `log2(x)` into `ln(x)`.
pub const LN_2: f32 = core::f32::consts::LN_2;

/// 2^x (`ex2.approx.ftz.f32`).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("ex2.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// log2(x) (`lg2.approx.ftz.f32`).
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("lg2.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// e^x through [`exp2`].
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2(x * LOG2_E)
}

/// ln(x) through [`log2`].
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    log2(x) * LN_2
}

/// 1/x (`rcp.approx.ftz.f32`, max relative error 2^-23).
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("rcp.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// `a * b + c` with one rounding (`fma.rn.f32`).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("fma.rn.f32 {0}, {1}, {2}, {3};", out(reg32) r, in(reg32) a, in(reg32) b, in(reg32) c,
             options(pure, nomem, nostack))
    };
    r
}

/// sqrt(x), correctly rounded (`sqrt.rn.f32`).
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("sqrt.rn.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// `a * b + c` in f64 with one rounding (`fma.rn.f64`).
#[inline(always)]
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    let r: f64;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("fma.rn.f64 {0}, {1}, {2}, {3};", out(reg64) r, in(reg64) a, in(reg64) b, in(reg64) c,
             options(pure, nomem, nostack))
    };
    r
}
