//! Thread, block and grid indices (PTX special registers `%tid`, `%ctaid`, `%ntid`, `%nctaid`,
//! `%laneid`). Reading a special register has no preconditions, so these are safe.

use core::arch::{asm, nvptx};

macro_rules! special_register {
    ($(#[$doc:meta] $name:ident => $intrinsic:ident;)*) => {$(
        #[$doc]
        #[inline(always)]
        pub fn $name() -> u32 {
            // SAFETY: reading a special register has no preconditions.
            unsafe { nvptx::$intrinsic() as u32 }
        }
    )*};
}

special_register! {
    /// `%tid.x`: thread index within the block, x dimension.
    thread_idx_x => _thread_idx_x;
    /// `%tid.y`.
    thread_idx_y => _thread_idx_y;
    /// `%tid.z`.
    thread_idx_z => _thread_idx_z;
    /// `%ctaid.x`: block index within the grid, x dimension.
    block_idx_x => _block_idx_x;
    /// `%ctaid.y`.
    block_idx_y => _block_idx_y;
    /// `%ctaid.z`.
    block_idx_z => _block_idx_z;
    /// `%ntid.x`: threads per block, x dimension.
    block_dim_x => _block_dim_x;
    /// `%ntid.y`.
    block_dim_y => _block_dim_y;
    /// `%ntid.z`.
    block_dim_z => _block_dim_z;
    /// `%nctaid.x`: blocks in the grid, x dimension.
    grid_dim_x => _grid_dim_x;
    /// `%nctaid.y`.
    grid_dim_y => _grid_dim_y;
    /// `%nctaid.z`.
    grid_dim_z => _grid_dim_z;
}

/// `%laneid`: this thread's lane within its warp (0..32).
#[inline(always)]
pub fn lane_id() -> u32 {
    let lane: u32;
    // SAFETY: reads a special register; no memory is touched.
    unsafe { asm!("mov.u32 {0}, %laneid;", out(reg32) lane, options(pure, nomem, nostack)) };
    lane
}

/// Warp index within a one-dimensional block (`%tid.x / 32`).
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx_x() / kernel_abi::WARP_SIZE
}

/// Warpgroup index within a one-dimensional block (`%tid.x / 128`).
#[inline(always)]
pub fn warpgroup_id() -> u32 {
    thread_idx_x() / kernel_abi::WARPGROUP_SIZE
}
