//! Emulated global vector loads and stores (alignment-checked host accesses).

use crate::emu::check_global;

/// 16 bytes.
///
/// # Safety
/// As on the device.
pub unsafe fn load_cg_v4(ptr: *const u32) -> [u32; 4] {
    check_global(ptr, 16, 16);
    // SAFETY: forwarded (valid, aligned).
    unsafe { (ptr as *const [u32; 4]).read() }
}

/// 8 bytes.
///
/// # Safety
/// As on the device.
pub unsafe fn load_cg_v2(ptr: *const u32) -> [u32; 2] {
    check_global(ptr, 8, 8);
    // SAFETY: forwarded (valid, aligned).
    unsafe { (ptr as *const [u32; 2]).read() }
}

/// 16 bytes (read-only path).
///
/// # Safety
/// As on the device.
pub unsafe fn load_nc_v4(ptr: *const u32) -> [u32; 4] {
    check_global(ptr, 16, 16);
    // SAFETY: forwarded (valid, aligned).
    unsafe { (ptr as *const [u32; 4]).read() }
}

/// Two f32 (read-only path).
///
/// # Safety
/// As on the device.
pub unsafe fn load_nc_v2_f32(ptr: *const f32) -> [f32; 2] {
    check_global(ptr, 8, 8);
    // SAFETY: forwarded (valid, aligned).
    unsafe { (ptr as *const [f32; 2]).read() }
}

/// One f32 (read-only path).
///
/// # Safety
/// As on the device.
pub unsafe fn load_nc_f32(ptr: *const f32) -> f32 {
    check_global(ptr, 4, 4);
    // SAFETY: forwarded (valid, aligned).
    unsafe { ptr.read() }
}

/// Store 16 bytes.
///
/// # Safety
/// As on the device.
pub unsafe fn store_v4(ptr: *mut u32, v: [u32; 4]) {
    check_global(ptr, 16, 16);
    // SAFETY: forwarded (valid, aligned, not raced).
    unsafe { (ptr as *mut [u32; 4]).write(v) }
}

/// Store 8 bytes.
///
/// # Safety
/// As on the device.
pub unsafe fn store_v2(ptr: *mut u32, v: [u32; 2]) {
    check_global(ptr, 8, 8);
    // SAFETY: forwarded (valid, aligned, not raced).
    unsafe { (ptr as *mut [u32; 2]).write(v) }
}
