//! Emulated thread, block and grid indices (see `crate::emu`).

use crate::emu::ctx;

/// `%tid.x`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    ctx().tid
}
/// `%tid.y` (one-dimensional blocks only).
#[inline(always)]
pub fn thread_idx_y() -> u32 {
    0
}
/// `%tid.z`.
#[inline(always)]
pub fn thread_idx_z() -> u32 {
    0
}
/// `%ctaid.x`.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    ctx().block.0
}
/// `%ctaid.y`.
#[inline(always)]
pub fn block_idx_y() -> u32 {
    ctx().block.1
}
/// `%ctaid.z`.
#[inline(always)]
pub fn block_idx_z() -> u32 {
    ctx().block.2
}
/// `%ntid.x`.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    ctx().block_dim
}
/// `%ntid.y`.
#[inline(always)]
pub fn block_dim_y() -> u32 {
    1
}
/// `%ntid.z`.
#[inline(always)]
pub fn block_dim_z() -> u32 {
    1
}
/// `%nctaid.x`.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    ctx().grid.0
}
/// `%nctaid.y`.
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    ctx().grid.1
}
/// `%nctaid.z`.
#[inline(always)]
pub fn grid_dim_z() -> u32 {
    ctx().grid.2
}
/// `%laneid`.
#[inline(always)]
pub fn lane_id() -> u32 {
    ctx().tid % kernel_abi::WARP_SIZE
}
/// Warp index within the block.
#[inline(always)]
pub fn warp_id() -> u32 {
    ctx().tid / kernel_abi::WARP_SIZE
}
/// Warpgroup index within the block.
#[inline(always)]
pub fn warpgroup_id() -> u32 {
    ctx().tid / kernel_abi::WARPGROUP_SIZE
}
