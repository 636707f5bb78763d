//! Vector loads and stores of global memory with an explicit cache policy.
//!
//! - `.cg` ("cache global"): cached in L2 only, not in L1. For data a block streams through
//!   once (activations), so that L1 keeps what is reused.
//! - `.nc` (non-coherent, read-only path, cached in L1): for data many warps of an SM read
//!   (packed weights, per-token coefficients). Only for memory no thread writes during the kernel.
//!
//! # Safety (all functions)
//! The pointer is a valid global address of the accessed bytes, aligned to the access size
//! (16 bytes for `v4` of u32, 8 bytes for `v2`, 4 for scalars), and for `.nc` loads no thread of
//! the grid writes those bytes during the kernel.

use core::arch::asm;

/// `ld.global.cg.v4.u32`: 16 bytes, L2 only.
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn load_cg_v4(ptr: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded to the caller (valid, 16-byte aligned global address).
    unsafe {
        asm!("ld.global.cg.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) ptr,
             options(readonly, nostack))
    };
    [a, b, c, d]
}

/// `ld.global.cg.v2.u32`: 8 bytes, L2 only.
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn load_cg_v2(ptr: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: forwarded to the caller (valid, 8-byte aligned global address).
    unsafe {
        asm!("ld.global.cg.v2.u32 {{{0}, {1}}}, [{2}];",
             out(reg32) a, out(reg32) b, in(reg64) ptr, options(readonly, nostack))
    };
    [a, b]
}

/// `ld.global.nc.v4.u32`: 16 bytes through the read-only path (L1).
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn load_nc_v4(ptr: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded to the caller (valid, aligned, read-only during the kernel).
    unsafe {
        asm!("ld.global.nc.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) ptr,
             options(pure, readonly, nostack))
    };
    [a, b, c, d]
}

/// `ld.global.nc.v2.f32`: two f32 through the read-only path (L1).
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn load_nc_v2_f32(ptr: *const f32) -> [f32; 2] {
    let (a, b): (f32, f32);
    // SAFETY: forwarded to the caller (valid, 8-byte aligned, read-only during the kernel).
    unsafe {
        asm!("ld.global.nc.v2.f32 {{{0}, {1}}}, [{2}];",
             out(reg32) a, out(reg32) b, in(reg64) ptr, options(pure, readonly, nostack))
    };
    [a, b]
}

/// `ld.global.nc.f32`: one f32 through the read-only path (L1).
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn load_nc_f32(ptr: *const f32) -> f32 {
    let a: f32;
    // SAFETY: forwarded to the caller (valid, 4-byte aligned, read-only during the kernel).
    unsafe {
        asm!("ld.global.nc.f32 {0}, [{1}];", out(reg32) a, in(reg64) ptr,
             options(pure, readonly, nostack))
    };
    a
}

/// `st.global.v4.u32`: store 16 bytes.
///
/// # Safety
/// See the module documentation; no other thread accesses the bytes during the kernel.
#[inline(always)]
pub unsafe fn store_v4(ptr: *mut u32, v: [u32; 4]) {
    // SAFETY: forwarded to the caller (valid, 16-byte aligned, not raced).
    unsafe {
        asm!("st.global.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}};",
             in(reg64) ptr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
             options(nostack))
    };
}

/// `st.global.v2.u32`: store 8 bytes.
///
/// # Safety
/// See the module documentation; no other thread accesses the bytes during the kernel.
#[inline(always)]
pub unsafe fn store_v2(ptr: *mut u32, v: [u32; 2]) {
    // SAFETY: forwarded to the caller (valid, 8-byte aligned, not raced).
    unsafe {
        asm!("st.global.v2.u32 [{0}], {{{1}, {2}}};", in(reg64) ptr, in(reg32) v[0],
             in(reg32) v[1], options(nostack))
    };
}
