//! The 16-bit element types of the attention kernels: the `mma.sync` product (portable path)
//! and the f32 packing of P and O (both paths), the unpacking the backward reads dO and O with.

use crate::arch::{convert, mma};

/// The 16-bit input format: its tensor-core product and f32 packing.
pub trait Elem {
    /// `d += a b` on `mma.sync.m16n8k16` fragments.
    ///
    /// # Safety
    /// Whole warp, uniform control flow.
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]);
    /// Two f32 to a packed pair (low first), rounding to nearest even.
    fn pack(lo: f32, hi: f32) -> u32;
    /// A packed pair (low first) to two f32 (exact).
    fn unpack(x: u32) -> (f32, f32);
}

/// bf16 inputs and output.
pub struct Bf16;
/// f16 inputs and output.
pub struct F16;

impl Elem for Bf16 {
    #[inline(always)]
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        // SAFETY: forwarded to the caller (whole warp, uniform control flow).
        unsafe { mma::m16n8k16_bf16(d, a, b) }
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        convert::pack_bf16x2(lo, hi)
    }
    #[inline(always)]
    fn unpack(x: u32) -> (f32, f32) {
        convert::unpack_bf16x2(x)
    }
}

impl Elem for F16 {
    #[inline(always)]
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        // SAFETY: forwarded to the caller (whole warp, uniform control flow).
        unsafe { mma::m16n8k16_f16(d, a, b) }
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        convert::pack_f16x2(lo, hi)
    }
    #[inline(always)]
    fn unpack(x: u32) -> (f32, f32) {
        (
            convert::f16_to_f32(x as u16),
            convert::f16_to_f32((x >> 16) as u16),
        )
    }
}
