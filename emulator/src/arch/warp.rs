//! Emulated warp shuffles and votes (see `crate::emu`); full-warp masks only.

use crate::emu::{ctx, warp_exchange};

/// All 32 lanes.
pub const FULL_MASK: u32 = 0xffff_ffff;

fn lane() -> u32 {
    ctx().tid % 32
}

fn shuffle(mask: u32, v: u32, src: impl Fn(u32) -> u32) -> u32 {
    assert_eq!(mask, FULL_MASK, "only full-warp masks are emulated");
    let me = lane();
    warp_exchange(&[v], |get| get(src(me), 0))
}

/// `shfl.sync.idx`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn shfl_idx_u32(mask: u32, v: u32, src: u32) -> u32 {
    shuffle(mask, v, |_| src % 32)
}

/// `shfl.sync.bfly`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn shfl_xor_u32(mask: u32, v: u32, lane_mask: u32) -> u32 {
    shuffle(mask, v, |l| (l ^ lane_mask) % 32)
}

/// `shfl.sync.down`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn shfl_down_u32(mask: u32, v: u32, delta: u32) -> u32 {
    shuffle(mask, v, |l| if l + delta < 32 { l + delta } else { l })
}

/// `shfl.sync.up`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn shfl_up_u32(mask: u32, v: u32, delta: u32) -> u32 {
    shuffle(mask, v, |l| if l >= delta { l - delta } else { l })
}

/// `shfl.sync.idx` of an `f32`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn shfl_idx_f32(mask: u32, v: f32, src: u32) -> f32 {
    // SAFETY: forwarded.
    f32::from_bits(unsafe { shfl_idx_u32(mask, v.to_bits(), src) })
}

/// `shfl.sync.bfly` of an `f32`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn shfl_xor_f32(mask: u32, v: f32, lane_mask: u32) -> f32 {
    // SAFETY: forwarded.
    f32::from_bits(unsafe { shfl_xor_u32(mask, v.to_bits(), lane_mask) })
}

/// `shfl.sync.down` of an `f32`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn shfl_down_f32(mask: u32, v: f32, delta: u32) -> f32 {
    // SAFETY: forwarded.
    f32::from_bits(unsafe { shfl_down_u32(mask, v.to_bits(), delta) })
}

/// `vote.sync.ballot`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn ballot(mask: u32, pred: bool) -> u32 {
    assert_eq!(mask, FULL_MASK, "only full-warp masks are emulated");
    warp_exchange(&[pred as u32], |get| {
        (0..32).fold(0u32, |acc, l| acc | (get(l, 0) << l))
    })
}

/// `vote.sync.all`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn all(mask: u32, pred: bool) -> bool {
    // SAFETY: forwarded.
    unsafe { ballot(mask, pred) == FULL_MASK }
}

/// `vote.sync.any`.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn any(mask: u32, pred: bool) -> bool {
    // SAFETY: forwarded.
    unsafe { ballot(mask, pred) != 0 }
}

/// Butterfly sum over the warp (same order as on the device).
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn sum_f32(mut v: f32) -> f32 {
    let mut offset = 16;
    while offset > 0 {
        // SAFETY: forwarded.
        v += unsafe { shfl_xor_f32(FULL_MASK, v, offset) };
        offset /= 2;
    }
    v
}

/// Butterfly maximum over the warp.
///
/// # Safety
/// Every lane executes this call.
pub unsafe fn max_f32(mut v: f32) -> f32 {
    let mut offset = 16;
    while offset > 0 {
        // SAFETY: forwarded.
        v = v.max(unsafe { shfl_xor_f32(FULL_MASK, v, offset) });
        offset /= 2;
    }
    v
}
