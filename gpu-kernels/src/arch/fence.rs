//! Memory fences.

use core::arch::asm;

/// `membar.cta`: order this thread's earlier memory accesses before its later ones, as observed
/// by threads of the same block.
#[inline(always)]
pub fn membar_cta() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("membar.cta;", options(nostack)) };
}

/// `membar.gl`: as [`membar_cta`], observed by every thread on the device.
#[inline(always)]
pub fn membar_gl() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("membar.gl;", options(nostack)) };
}

/// `membar.sys`: as [`membar_cta`], observed by the device and the host.
#[inline(always)]
pub fn membar_sys() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("membar.sys;", options(nostack)) };
}

/// `fence.proxy.async.shared::cta`: order this thread's earlier generic-proxy accesses to shared
/// memory (ordinary `st.shared`, `stmatrix`) before later async-proxy accesses (TMA, wgmma
/// operand reads) and vice versa. Each writing thread issues it before the barrier that hands the
/// data to the async proxy.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// `fence.proxy.async`: as [`fence_proxy_async_shared`], for all state spaces (e.g. global
/// memory written by ordinary stores and read next by a TMA load).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn fence_proxy_async() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("fence.proxy.async;", options(nostack)) };
}

/// `fence.mbarrier_init.release.cluster`: make this thread's `mbarrier.init`s visible to the
/// async proxy (TMA `complete_tx`) and other threads; issue after initializing, before the
/// barrier that publishes the mbarriers.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}
