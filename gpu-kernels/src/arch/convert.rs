//! Conversions between f32 and the 16-bit float formats (`cvt`), and from f32 to e4m3 (FP8).
//! Round-to-nearest-even, as `half`'s `from_f32` on the host, so host references and kernels
//! round alike.

use core::arch::asm;

/// Two f32 to packed bf16x2 (`cvt.rn.bf16x2.f32`): `lo` in bits 0..16, `hi` in bits 16..32
/// (so `lo` is the element at the lower address when stored).
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {0}, {1}, {2};", out(reg32) r, in(reg32) hi, in(reg32) lo,
             options(pure, nomem, nostack))
    };
    r
}

/// Two f32 to packed f16x2 (`cvt.rn.f16x2.f32`), `lo` in the low half.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16x2.f32 {0}, {1}, {2};", out(reg32) r, in(reg32) hi, in(reg32) lo,
             options(pure, nomem, nostack))
    };
    r
}

/// f32 to bf16 bits (`cvt.rn.bf16.f32`).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let r: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.bf16.f32 {0}, {1};", out(reg16) r, in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// f32 to f16 bits (`cvt.rn.f16.f32`).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let r: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16.f32 {0}, {1};", out(reg16) r, in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// bf16 bits to f32 (exact: a bf16 is the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// f16 bits to f32 (`cvt.f32.f16`, exact).
#[inline(always)]
pub fn f16_to_f32(x: u16) -> f32 {
    let r: f32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.f32.f16 {0}, {1};", out(reg32) r, in(reg16) x, options(pure, nomem, nostack))
    };
    r
}

/// The two bf16 of a packed pair as f32, low half first.
#[inline(always)]
pub fn unpack_bf16x2(x: u32) -> (f32, f32) {
    (f32::from_bits(x << 16), f32::from_bits(x & 0xffff_0000))
}

/// Four f32 to four e4m3 in one register (`cvt.rn.satfinite.e4m3x2.f32`, twice): `x[0]` in
/// bits 0..8 up to `x[3]` in bits 24..32. Finite values beyond e4m3's range saturate to +-448;
/// NaN stays NaN.
#[inline(always)]
pub fn pack_e4m3x4(x: [f32; 4]) -> u32 {
    let r: u32;
    // SAFETY: register-only conversions.
    unsafe {
        asm!(
            "{{",
            ".reg .b16 lo, hi;",
            "cvt.rn.satfinite.e4m3x2.f32 lo, {1}, {0};",
            "cvt.rn.satfinite.e4m3x2.f32 hi, {3}, {2};",
            "mov.b32 {4}, {{lo, hi}};",
            "}}",
            in(reg32) x[0], in(reg32) x[1], in(reg32) x[2], in(reg32) x[3], out(reg32) r,
            options(pure, nomem, nostack)
        )
    };
    r
}
