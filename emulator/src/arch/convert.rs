//! Emulated conversions (round to nearest even, as `cvt.rn`).

fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    if x.is_nan() {
        return sign | 0x7e00;
    }
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    if a < 6.103_515_6e-5 {
        // Subnormal (or zero): units of 2^-24, rounded to nearest even.
        let q = a * 16_777_216.0;
        let r = q.round();
        let r = if (r - q).abs() == 0.5 && r % 2.0 != 0.0 {
            r - 1.0
        } else {
            r
        };
        return sign | r as u16;
    }
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let mant = b & 0x7f_ffff;
    let round = mant + 0xfff + ((mant >> 13) & 1);
    let v = ((exp as u32) << 10) + (round >> 13);
    sign | v as u16
}

fn from_f16(x: u16) -> f32 {
    let sign = if x & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((x >> 10) & 0x1f) as i32;
    let mant = (x & 0x3ff) as f32;
    match exp {
        0 => sign * mant * 2f32.powi(-24),
        31 if mant == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        e => sign * (1.0 + mant / 1024.0) * 2f32.powi(e - 15),
    }
}

/// Two f32 to packed bf16x2, `lo` in bits 0..16.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    to_bf16(lo) as u32 | (to_bf16(hi) as u32) << 16
}

/// Two f32 to packed f16x2, `lo` in bits 0..16.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    to_f16(lo) as u32 | (to_f16(hi) as u32) << 16
}

/// f32 to bf16 bits.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    to_bf16(x)
}

/// f32 to f16 bits.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    to_f16(x)
}

/// bf16 bits to f32.
#[inline(always)]
pub fn bf16_to_f32(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// f16 bits to f32.
#[inline(always)]
pub fn f16_to_f32(x: u16) -> f32 {
    from_f16(x)
}

/// The two bf16 of a packed pair as f32, low half first.
#[inline(always)]
pub fn unpack_bf16x2(x: u32) -> (f32, f32) {
    (f32::from_bits(x << 16), f32::from_bits(x & 0xffff_0000))
}
