//! Emulated dynamic shared memory (one bounds-checked buffer per block, see `crate::emu`).

use crate::emu::{DYN_BASE, smem_ptr, track_smem};
use core::marker::PhantomData;

/// Shared-window address of the first byte of dynamic shared memory.
#[inline(always)]
pub fn dynamic_base() -> u32 {
    DYN_BASE
}

/// [`dynamic_base`] rounded up to [`kernel_abi::SMEM_ALIGN`].
#[inline(always)]
pub fn aligned_base() -> u32 {
    let align = kernel_abi::SMEM_ALIGN as u32;
    (dynamic_base() + align - 1) & !(align - 1)
}

/// Host pointer of shared-window address `addr` (bounds-checked for one byte).
#[inline(always)]
pub fn generic_ptr<T>(addr: u32) -> *mut T {
    smem_ptr(addr, 1, 1) as *mut T
}

/// A value that can be loaded from and stored to shared memory with one instruction.
pub trait SmemValue: Copy {
    /// Load one value.
    ///
    /// # Safety
    /// As on the device.
    unsafe fn load(addr: u32) -> Self;
    /// Store one value.
    ///
    /// # Safety
    /// As on the device.
    unsafe fn store(addr: u32, value: Self);
}

macro_rules! smem_value {
    ($($ty:ty),*) => {$(
        impl SmemValue for $ty {
            unsafe fn load(addr: u32) -> Self {
                let size = core::mem::size_of::<$ty>() as u32;
                let ptr = smem_ptr(addr, size, size.min(16)) as *const $ty;
                track_smem(addr, size, false);
                // SAFETY: bounds and alignment checked by `smem_ptr`.
                unsafe { ptr.read() }
            }
            unsafe fn store(addr: u32, value: Self) {
                let size = core::mem::size_of::<$ty>() as u32;
                let ptr = smem_ptr(addr, size, size.min(16)) as *mut $ty;
                track_smem(addr, size, true);
                // SAFETY: bounds and alignment checked by `smem_ptr`.
                unsafe { ptr.write(value) }
            }
        }
    )*};
}

smem_value!(u16, u32, f32, u64, [u32; 4]);

/// A typed array in shared memory (as on the device).
#[derive(Clone, Copy)]
pub struct SmemArray<T> {
    addr: u32,
    len: u32,
    _ty: PhantomData<T>,
}

impl<T: SmemValue> SmemArray<T> {
    /// A view of `len` values at `addr`.
    #[inline(always)]
    pub const fn new(addr: u32, len: u32) -> Self {
        SmemArray {
            addr,
            len,
            _ty: PhantomData,
        }
    }

    /// Address of element `i`.
    #[inline(always)]
    pub const fn addr_of(&self, i: u32) -> u32 {
        self.addr + i * core::mem::size_of::<T>() as u32
    }

    /// Address of element 0.
    #[inline(always)]
    pub const fn addr(&self) -> u32 {
        self.addr
    }

    /// Number of elements.
    #[inline(always)]
    pub const fn len(&self) -> u32 {
        self.len
    }

    /// Whether the view is empty.
    #[inline(always)]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Load element `i` (the index is checked against the view, too).
    ///
    /// # Safety
    /// As on the device.
    #[inline(always)]
    pub unsafe fn load(&self, i: u32) -> T {
        assert!(i < self.len, "SmemArray index {i} out of {}", self.len);
        // SAFETY: forwarded.
        unsafe { T::load(self.addr_of(i)) }
    }

    /// Store element `i` (the index is checked against the view, too).
    ///
    /// # Safety
    /// As on the device.
    #[inline(always)]
    pub unsafe fn store(&self, i: u32, value: T) {
        assert!(i < self.len, "SmemArray index {i} out of {}", self.len);
        // SAFETY: forwarded.
        unsafe { T::store(self.addr_of(i), value) }
    }
}
