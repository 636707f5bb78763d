//! Emulated barriers (see `crate::emu`). Named barriers are not emulated (they panic).

/// The highest named-barrier id.
pub const MAX_BARRIER_ID: u32 = 15;

/// `bar.sync 0` over the block's threads.
///
/// # Safety
/// As on the device: every thread of the block reaches it the same number of times.
#[inline(always)]
pub unsafe fn sync_threads() {
    crate::emu::sync_block()
}

/// Named barriers are not emulated.
///
/// # Safety
/// Never returns.
pub unsafe fn named_sync(_id: u32, _threads: u32) {
    panic!("named barriers are not emulated")
}

/// Named barriers are not emulated.
///
/// # Safety
/// Never returns.
pub unsafe fn named_arrive(_id: u32, _threads: u32) {
    panic!("named barriers are not emulated")
}

/// `bar.warp.sync` of the full warp.
///
/// # Safety
/// As on the device: every lane of `mask` (which must be the full warp here) calls it.
#[inline(always)]
pub unsafe fn sync_warp(mask: u32) {
    assert_eq!(mask, u32::MAX, "only full-warp masks are emulated");
    crate::emu::sync_warp()
}
