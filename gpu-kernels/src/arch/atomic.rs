//! Atomic read-modify-write on global memory.

use core::arch::asm;

/// `atom.global.add.u32`: add `v` to `*ptr` atomically, returning the old value.
///
/// # Safety
/// `ptr` is a valid, 4-byte aligned pointer to global memory.
#[inline(always)]
pub unsafe fn add_u32(ptr: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr` is a valid global address.
    unsafe {
        asm!("atom.global.add.u32 {0}, [{1}], {2};", out(reg32) old, in(reg64) ptr, in(reg32) v,
             options(nostack))
    };
    old
}

/// `red.global.add.f32`: add `v` to `*ptr` atomically, without returning the old value (a
/// reduction: the thread does not wait for it). The order in which several threads' additions
/// land is unspecified, so a sum of more than two terms is not bitwise reproducible.
///
/// # Safety
/// `ptr` is a valid, 4-byte aligned pointer to global memory.
#[inline(always)]
pub unsafe fn red_add_f32(ptr: *mut f32, v: f32) {
    // SAFETY: the caller guarantees `ptr` is a valid global address.
    unsafe { asm!("red.global.add.f32 [{0}], {1};", in(reg64) ptr, in(reg32) v, options(nostack)) };
}

/// `red.global.add.v4.f32` (sm_90): add the four values `v` to `ptr[0..4]` atomically (each
/// element on its own), without returning the old values. Unordered as [`red_add_f32`].
///
/// # Safety
/// `ptr` is a valid, 16-byte aligned pointer to four f32 in global memory.
#[inline(always)]
pub unsafe fn red_add_v4_f32(ptr: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller guarantees `ptr` is a valid, aligned global address.
    unsafe {
        asm!(
            "red.global.add.v4.f32 [{0}], {{{1}, {2}, {3}, {4}}};",
            in(reg64) ptr,
            in(reg32) v[0],
            in(reg32) v[1],
            in(reg32) v[2],
            in(reg32) v[3],
            options(nostack)
        )
    };
}

/// `ld.acquire.gpu.global.u32`: read `*ptr`; the writes that a release by another thread of
/// the device published with the value read are visible to this thread's later accesses.
///
/// # Safety
/// `ptr` is a valid, 4-byte aligned pointer to global memory.
#[inline(always)]
pub unsafe fn load_acquire_u32(ptr: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees `ptr` is a valid global address.
    unsafe {
        asm!("ld.acquire.gpu.global.u32 {0}, [{1}];", out(reg32) v, in(reg64) ptr,
             options(nostack))
    };
    v
}

/// `st.release.gpu.global.u32`: write `v` to `*ptr` after every earlier memory access of this
/// thread (and those it observed) is visible device-wide, for a thread that reads `v` with
/// [`load_acquire_u32`].
///
/// # Safety
/// `ptr` is a valid, 4-byte aligned pointer to global memory.
#[inline(always)]
pub unsafe fn store_release_u32(ptr: *mut u32, v: u32) {
    // SAFETY: the caller guarantees `ptr` is a valid global address.
    unsafe {
        asm!("st.release.gpu.global.u32 [{0}], {1};", in(reg64) ptr, in(reg32) v,
             options(nostack))
    };
}
