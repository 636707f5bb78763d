//! Emulated atomic read-modify-write on global memory (a compare-and-swap loop on the host).

use crate::emu::check_global;
use core::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// `atom.global.add.u32`.
///
/// # Safety
/// As on the device.
pub unsafe fn add_u32(ptr: *mut u32, v: u32) -> u32 {
    check_global(ptr, 4, 4);
    // SAFETY: valid and aligned (checked); every concurrent access goes through atomics.
    let a = unsafe { AtomicU32::from_ptr(ptr) };
    a.fetch_add(v, Relaxed)
}

/// `red.global.add.f32`.
///
/// # Safety
/// As on the device.
pub unsafe fn red_add_f32(ptr: *mut f32, v: f32) {
    check_global(ptr, 4, 4);
    // SAFETY: valid and aligned (checked); every concurrent access goes through atomics.
    let a = unsafe { AtomicU32::from_ptr(ptr as *mut u32) };
    let _ = a.fetch_update(Relaxed, Relaxed, |old| {
        Some((f32::from_bits(old) + v).to_bits())
    });
}
