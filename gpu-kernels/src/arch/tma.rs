//! TMA: the bulk tensor copy engine (`cp.async.bulk.tensor`, sm_90), driven by a tensor map
//! (`CUtensorMap`, encoded on the host by `cuTensorMapEncodeTiled`).
//!
//! Loads complete on an mbarrier (`complete_tx::bytes`); out-of-bounds box elements are filled
//! with zeros. Coordinates are element indices, innermost dimension first, and may be negative
//! or past the end, but the innermost coordinate times the element size must be a multiple of
//! 16 bytes (otherwise the copy raises an illegal-instruction error). The destination of a load
//! is 128-byte aligned (1024 for 128B swizzle).
//!
//! Tensor maps are passed by value inside a kernel's parameter struct; [`tensor_map_ptr!`]
//! yields the generic address of one (in the `.param` space) for these functions.

use super::mbarrier::Mbarrier;
use core::arch::asm;

/// The generic address of the tensor map `$field` of the parameter struct `$ty` that kernel
/// `$kernel` (an identifier, or `name = "entry"` for a string expression) takes as parameter
/// number `$index`: `mov` of the `.param` symbol, `cvta.param`,
/// plus the field offset. Also writes the marker that makes the PTX builder declare that
/// parameter `.align 64` (the TMA requirement rustc's kernel ABI cannot express).
///
/// Must be expanded in the kernel function itself (the `.param` symbol is local to it). The
/// kernel must not take a reference to that parameter (LLVM would copy it to local memory,
/// which TMA cannot read); read other fields by value.
#[macro_export]
macro_rules! tensor_map_ptr {
    ($kernel:ident, $index:literal, $ty:ty, $field:ident) => {
        $crate::tensor_map_ptr!(name = stringify!($kernel), $index, $ty, $field)
    };
    (name = $kernel:expr, $index:literal, $ty:ty, $field:ident) => {{
        const OFFSET: usize = core::mem::offset_of!($ty, $field);
        const _: () = assert!(OFFSET % 64 == 0, "tensor maps must sit at 64-byte offsets");
        let base: u64;
        // SAFETY: takes the address of this kernel's own parameter; no memory is accessed.
        unsafe {
            core::arch::asm!(
                concat!("// @tensormap-param ", $kernel, "_param_", stringify!($index)),
                concat!("mov.b64 {0}, ", $kernel, "_param_", stringify!($index), ";"),
                "cvta.param.u64 {0}, {0};",
                out(reg64) base,
                options(pure, nomem, nostack)
            )
        };
        $crate::arch::tma::TensorMapPtr::new(base + OFFSET as u64)
    }};
}

/// Generic address of a tensor map in the kernel parameter space (see [`tensor_map_ptr!`]).
#[derive(Clone, Copy, Debug)]
pub struct TensorMapPtr(u64);

impl TensorMapPtr {
    /// Wrap an address produced by [`tensor_map_ptr!`].
    #[inline(always)]
    pub const fn new(addr: u64) -> Self {
        TensorMapPtr(addr)
    }

    /// `prefetch.tensormap`: fetch the descriptor into the cache ahead of the first copy.
    #[inline(always)]
    pub fn prefetch(self) {
        // SAFETY: a prefetch of a valid parameter address has no effect on program state.
        unsafe { asm!("prefetch.tensormap [{0}];", in(reg64) self.0, options(nostack)) };
    }

    /// `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`:
    /// load the box at `(x, y)` into `dst`, signalling `bar` with the box's bytes.
    ///
    /// # Safety
    /// `x` times the element size is a multiple of 16 bytes;
    /// `dst` is aligned as the map's swizzle requires and holds the box; `bar` is initialized and
    /// expects these bytes (`arrive_expect_tx`) in its current phase; nothing reads or writes
    /// `dst` until that phase completes.
    #[inline(always)]
    pub unsafe fn load_2d(self, dst: u32, x: i32, y: i32, bar: Mbarrier) {
        // SAFETY: forwarded to the caller (destination, barrier and phase contract).
        unsafe {
            asm!(
                "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{0}], [{1}, {{{2}, {3}}}], [{4}];",
                in(reg32) dst, in(reg64) self.0, in(reg32) x, in(reg32) y, in(reg32) bar.addr(),
                options(nostack)
            )
        };
    }

    /// As [`TensorMapPtr::load_2d`] for a 3-dimensional map, box at `(x, y, z)`.
    ///
    /// # Safety
    /// As for [`TensorMapPtr::load_2d`].
    #[inline(always)]
    pub unsafe fn load_3d(self, dst: u32, x: i32, y: i32, z: i32, bar: Mbarrier) {
        // SAFETY: forwarded to the caller (destination, barrier and phase contract).
        unsafe {
            asm!(
                "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{0}], [{1}, {{{2}, {3}, {4}}}], [{5}];",
                in(reg32) dst, in(reg64) self.0, in(reg32) x, in(reg32) y, in(reg32) z,
                in(reg32) bar.addr(), options(nostack)
            )
        };
    }

    /// As [`TensorMapPtr::load_2d`] for a 4-dimensional map, box at `(x, y, z, w)`.
    ///
    /// # Safety
    /// As for [`TensorMapPtr::load_2d`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn load_4d(self, dst: u32, x: i32, y: i32, z: i32, w: i32, bar: Mbarrier) {
        // SAFETY: forwarded to the caller (destination, barrier and phase contract).
        unsafe {
            asm!(
                "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{0}], [{1}, {{{2}, {3}, {4}, {5}}}], [{6}];",
                in(reg32) dst, in(reg64) self.0, in(reg32) x, in(reg32) y, in(reg32) z,
                in(reg32) w, in(reg32) bar.addr(), options(nostack)
            )
        };
    }

    /// `cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group`: store the box at `src` to
    /// `(x, y)`; out-of-bounds elements are not written. Complete with [`bulk_commit_group`] and
    /// [`bulk_wait_group_read`].
    ///
    /// # Safety
    /// `src` holds the box, written by this block's threads and published to the async proxy
    /// (`fence_proxy_async_shared` by each writer, then a barrier) before this call; it is not
    /// overwritten until the wait.
    #[inline(always)]
    pub unsafe fn store_2d(self, src: u32, x: i32, y: i32) {
        // SAFETY: forwarded to the caller (source published, kept until the wait).
        unsafe {
            asm!(
                "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [{0}, {{{1}, {2}}}], [{3}];",
                in(reg64) self.0, in(reg32) x, in(reg32) y, in(reg32) src, options(nostack)
            )
        };
    }
}

/// `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32`: add `bytes` of f32 values
/// from shared memory at `src` element-wise into global memory at `dst` (each element's
/// addition atomic; no order between this and other blocks' additions). Complete with
/// [`bulk_commit_group`] and [`bulk_wait_group_read`] (the source may be reused) or
/// [`bulk_wait_group`] (the additions performed).
///
/// # Safety
/// `dst .. dst + bytes` is global memory of f32 values that nothing but such reductions
/// accesses until the kernel ends; `src` holds `bytes` of f32 values, written by this block's
/// threads and published to the async proxy (`fence_proxy_async_shared` by each writer, then a
/// barrier) before this call, and not overwritten until the wait; both 16-byte aligned,
/// `bytes` a multiple of 16.
#[inline(always)]
pub unsafe fn bulk_reduce_add_f32(dst: *mut f32, src: u32, bytes: u32) {
    // SAFETY: forwarded to the caller (ranges valid, aligned, source published).
    unsafe {
        asm!(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [{0}], [{1}], {2};",
            in(reg64) dst, in(reg32) src, in(reg32) bytes, options(nostack)
        )
    };
}

/// `cp.async.bulk.commit_group`: close this thread's group of bulk stores.
#[inline(always)]
pub fn bulk_commit_group() {
    // SAFETY: has no preconditions.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) };
}

/// `cp.async.bulk.wait_group.read N`: wait until at most `N` of this thread's bulk groups still
/// read their shared-memory source.
#[inline(always)]
pub fn bulk_wait_group_read<const N: u32>() {
    // SAFETY: has no preconditions.
    unsafe { asm!("cp.async.bulk.wait_group.read {n};", n = const N, options(nostack)) };
}

/// `cp.async.bulk.wait_group N`: wait until at most `N` of this thread's bulk groups are
/// incomplete (their writes to global memory performed).
#[inline(always)]
pub fn bulk_wait_group<const N: u32>() {
    // SAFETY: has no preconditions.
    unsafe { asm!("cp.async.bulk.wait_group {n};", n = const N, options(nostack)) };
}
