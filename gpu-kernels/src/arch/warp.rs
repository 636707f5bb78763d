//! Warp shuffles and votes (`shfl.sync`, `vote.sync`), through LLVM's convergent NVVM
//! intrinsics. `mask` names the participating lanes; every lane in it must execute the same
//! call. [`FULL_MASK`] is all 32 lanes.

/// All 32 lanes.
pub const FULL_MASK: u32 = 0xffff_ffff;

// The `c` operand of shfl: clamp lane 31 with a segment of 32 lanes (idx, bfly, down), or
// 0 (up).
const CLAMP_FULL: u32 = 0x1f;
const CLAMP_UP: u32 = 0;

unsafe extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn nvvm_shfl_idx_i32(mask: u32, v: u32, lane: u32, c: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn nvvm_shfl_bfly_i32(mask: u32, v: u32, lane_mask: u32, c: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.down.i32"]
    fn nvvm_shfl_down_i32(mask: u32, v: u32, delta: u32, c: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.up.i32"]
    fn nvvm_shfl_up_i32(mask: u32, v: u32, delta: u32, c: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.f32"]
    fn nvvm_shfl_idx_f32(mask: u32, v: f32, lane: u32, c: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn nvvm_shfl_bfly_f32(mask: u32, v: f32, lane_mask: u32, c: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.down.f32"]
    fn nvvm_shfl_down_f32(mask: u32, v: f32, delta: u32, c: u32) -> f32;
    #[link_name = "llvm.nvvm.vote.ballot.sync"]
    fn nvvm_vote_ballot(mask: u32, pred: bool) -> u32;
    #[link_name = "llvm.nvvm.vote.all.sync"]
    fn nvvm_vote_all(mask: u32, pred: bool) -> bool;
    #[link_name = "llvm.nvvm.vote.any.sync"]
    fn nvvm_vote_any(mask: u32, pred: bool) -> bool;
}

/// `shfl.sync.idx`: the value of `v` held by lane `src`.
///
/// # Safety
/// Every lane of `mask` executes this call (with the same `mask`).
#[inline(always)]
pub unsafe fn shfl_idx_u32(mask: u32, v: u32, src: u32) -> u32 {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_shfl_idx_i32(mask, v, src, CLAMP_FULL) }
}

/// `shfl.sync.bfly`: the value of `v` held by lane `lane ^ lane_mask`.
///
/// # Safety
/// As for [`shfl_idx_u32`].
#[inline(always)]
pub unsafe fn shfl_xor_u32(mask: u32, v: u32, lane_mask: u32) -> u32 {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_shfl_bfly_i32(mask, v, lane_mask, CLAMP_FULL) }
}

/// `shfl.sync.down`: the value of `v` held by lane `lane + delta` (own value past lane 31).
///
/// # Safety
/// As for [`shfl_idx_u32`].
#[inline(always)]
pub unsafe fn shfl_down_u32(mask: u32, v: u32, delta: u32) -> u32 {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_shfl_down_i32(mask, v, delta, CLAMP_FULL) }
}

/// `shfl.sync.up`: the value of `v` held by lane `lane - delta` (own value below lane 0).
///
/// # Safety
/// As for [`shfl_idx_u32`].
#[inline(always)]
pub unsafe fn shfl_up_u32(mask: u32, v: u32, delta: u32) -> u32 {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_shfl_up_i32(mask, v, delta, CLAMP_UP) }
}

/// `shfl.sync.idx` of an `f32`.
///
/// # Safety
/// As for [`shfl_idx_u32`].
#[inline(always)]
pub unsafe fn shfl_idx_f32(mask: u32, v: f32, src: u32) -> f32 {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_shfl_idx_f32(mask, v, src, CLAMP_FULL) }
}

/// `shfl.sync.bfly` of an `f32`: the value held by lane `lane ^ lane_mask`.
///
/// # Safety
/// As for [`shfl_idx_u32`].
#[inline(always)]
pub unsafe fn shfl_xor_f32(mask: u32, v: f32, lane_mask: u32) -> f32 {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_shfl_bfly_f32(mask, v, lane_mask, CLAMP_FULL) }
}

/// `shfl.sync.bfly` of an `f64` (two 32-bit shuffles of its halves): the value held by lane
/// `lane ^ lane_mask`.
///
/// # Safety
/// As for [`shfl_idx_u32`].
#[inline(always)]
pub unsafe fn shfl_xor_f64(mask: u32, v: f64, lane_mask: u32) -> f64 {
    let bits = v.to_bits();
    // SAFETY: forwarded to the caller (all lanes of mask participate in both shuffles).
    let (lo, hi) = unsafe {
        (
            shfl_xor_u32(mask, bits as u32, lane_mask),
            shfl_xor_u32(mask, (bits >> 32) as u32, lane_mask),
        )
    };
    f64::from_bits(((hi as u64) << 32) | lo as u64)
}

/// `shfl.sync.down` of an `f32`.
///
/// # Safety
/// As for [`shfl_idx_u32`].
#[inline(always)]
pub unsafe fn shfl_down_f32(mask: u32, v: f32, delta: u32) -> f32 {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_shfl_down_f32(mask, v, delta, CLAMP_FULL) }
}

/// `vote.sync.ballot`: bit `i` set iff lane `i` of `mask` passed `pred = true`.
///
/// # Safety
/// Every lane of `mask` executes this call.
#[inline(always)]
pub unsafe fn ballot(mask: u32, pred: bool) -> u32 {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_vote_ballot(mask, pred) }
}

/// `vote.sync.all`: whether every lane of `mask` passed `pred = true`.
///
/// # Safety
/// Every lane of `mask` executes this call.
#[inline(always)]
pub unsafe fn all(mask: u32, pred: bool) -> bool {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_vote_all(mask, pred) }
}

/// `vote.sync.any`: whether some lane of `mask` passed `pred = true`.
///
/// # Safety
/// Every lane of `mask` executes this call.
#[inline(always)]
pub unsafe fn any(mask: u32, pred: bool) -> bool {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { nvvm_vote_any(mask, pred) }
}

/// Sum of `v` over the 32 lanes of a full warp (butterfly), returned to every lane.
///
/// # Safety
/// All 32 lanes execute this call.
#[inline(always)]
pub unsafe fn sum_f32(mut v: f32) -> f32 {
    let mut offset = 16;
    while offset > 0 {
        // SAFETY: forwarded to the caller (full warp participates).
        v += unsafe { shfl_xor_f32(FULL_MASK, v, offset) };
        offset /= 2;
    }
    v
}

/// Maximum of `v` over the 32 lanes of a full warp (butterfly), returned to every lane.
///
/// # Safety
/// All 32 lanes execute this call.
#[inline(always)]
pub unsafe fn max_f32(mut v: f32) -> f32 {
    let mut offset = 16;
    while offset > 0 {
        // SAFETY: forwarded to the caller (full warp participates).
        v = v.max(unsafe { shfl_xor_f32(FULL_MASK, v, offset) });
        offset /= 2;
    }
    v
}
