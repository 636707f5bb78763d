//! Emulated `cp.async`: the copy happens at once (an order the hardware may choose); the group
//! operations are no-ops.

use crate::emu::{check_global, smem_ptr};

/// Copy 16 bytes from global `src` to shared `dst`.
///
/// # Safety
/// As on the device: `src` holds 16 readable bytes, both 16-byte aligned.
pub unsafe fn copy_16(dst: u32, src: *const u8) {
    // SAFETY: forwarded.
    unsafe { copy_16_zfill(dst, src, 16) }
}

/// Copy the first `src_bytes` of `src` to `dst` and zero the rest of the 16 bytes.
///
/// # Safety
/// As on the device.
pub unsafe fn copy_16_zfill(dst: u32, src: *const u8, src_bytes: u32) {
    assert!(src_bytes <= 16);
    let d = smem_ptr(dst, 16, 16);
    let mut buf = [0u8; 16];
    if src_bytes > 0 {
        check_global(src, 16);
        // SAFETY: the caller guarantees `src_bytes` readable bytes at `src`.
        unsafe { core::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), src_bytes as usize) };
    }
    // SAFETY: `d` is 16 in-bounds bytes of shared memory (checked).
    unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), d, 16) };
}

/// No-op.
pub fn commit_group() {}

/// No-op (copies are complete when issued).
pub fn wait_group<const N: u32>() {}

/// No-op.
pub fn wait_all() {}
