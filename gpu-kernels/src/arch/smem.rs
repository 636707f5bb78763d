//! Dynamic shared memory and typed views over it.
//!
//! The module declares one `extern .shared` array (`.extern .shared .align 1024 .b8 DYN_SMEM[]`),
//! whose size is the dynamic shared memory given at launch. Kernels place their buffers at
//! offsets computed by `const fn`s of `kernel_abi` (the host sizes the launch with the same
//! functions), starting from [`aligned_base`].

use core::arch::{asm, global_asm};
use core::marker::PhantomData;

global_asm!(".extern .shared .align 1024 .b8 DYN_SMEM[];");

/// Shared-window address of the first byte of dynamic shared memory.
#[inline(always)]
pub fn dynamic_base() -> u32 {
    let addr: u32;
    // SAFETY: takes the address of the module's shared array; no memory is accessed.
    unsafe { asm!("mov.u32 {0}, DYN_SMEM;", out(reg32) addr, options(pure, nomem, nostack)) };
    addr
}

/// [`dynamic_base`] rounded up to [`kernel_abi::SMEM_ALIGN`] (the host adds that much slack to
/// every launch, so layouts measured from here fit).
#[inline(always)]
pub fn aligned_base() -> u32 {
    let align = kernel_abi::SMEM_ALIGN as u32;
    (dynamic_base() + align - 1) & !(align - 1)
}

/// Generic-address-space pointer to a shared-window address (`cvta.shared.u64`), for code that
/// wants plain Rust loads and stores.
#[inline(always)]
pub fn generic_ptr<T>(addr: u32) -> *mut T {
    let ptr: u64;
    // SAFETY: pure address arithmetic; no memory is accessed.
    unsafe {
        asm!("cvta.shared.u64 {0}, {1};", out(reg64) ptr, in(reg64) addr as u64,
             options(pure, nomem, nostack))
    };
    ptr as *mut T
}

/// A value that can be loaded from and stored to shared memory with one instruction.
pub trait SmemValue: Copy {
    /// `ld.shared` of one value.
    ///
    /// # Safety
    /// `addr` is a shared-window address of a live, suitably aligned value of this type.
    unsafe fn load(addr: u32) -> Self;
    /// `st.shared` of one value.
    ///
    /// # Safety
    /// As for [`SmemValue::load`]; no other thread accesses the value concurrently without a
    /// barrier in between.
    unsafe fn store(addr: u32, value: Self);
}

macro_rules! smem_scalar {
    ($ty:ty, $class:ident, $ptx:literal) => {
        impl SmemValue for $ty {
            #[inline(always)]
            unsafe fn load(addr: u32) -> Self {
                let v: $ty;
                // SAFETY: the caller guarantees `addr` holds a valid value (trait contract).
                unsafe {
                    asm!(concat!("ld.shared.", $ptx, " {0}, [{1}];"), out($class) v, in(reg32) addr,
                         options(readonly, nostack))
                };
                v
            }
            #[inline(always)]
            unsafe fn store(addr: u32, value: Self) {
                // SAFETY: the caller guarantees `addr` is valid and not raced (trait contract).
                unsafe {
                    asm!(concat!("st.shared.", $ptx, " [{0}], {1};"), in(reg32) addr, in($class) value,
                         options(nostack))
                };
            }
        }
    };
}

smem_scalar!(u16, reg16, "b16");
smem_scalar!(u32, reg32, "b32");
smem_scalar!(f32, reg32, "f32");
smem_scalar!(u64, reg64, "b64");
smem_scalar!(f64, reg64, "f64");

impl SmemValue for [f32; 2] {
    #[inline(always)]
    unsafe fn load(addr: u32) -> Self {
        let (a, b): (f32, f32);
        // SAFETY: the caller guarantees `addr` is 8-byte aligned and holds 8 valid bytes.
        unsafe {
            asm!("ld.shared.v2.f32 {{{0}, {1}}}, [{2}];",
                 out(reg32) a, out(reg32) b, in(reg32) addr, options(readonly, nostack))
        };
        [a, b]
    }
    #[inline(always)]
    unsafe fn store(addr: u32, value: Self) {
        // SAFETY: the caller guarantees `addr` is 8-byte aligned, valid and not raced.
        unsafe {
            asm!("st.shared.v2.f32 [{0}], {{{1}, {2}}};",
                 in(reg32) addr, in(reg32) value[0], in(reg32) value[1], options(nostack))
        };
    }
}

impl SmemValue for [u32; 4] {
    #[inline(always)]
    unsafe fn load(addr: u32) -> Self {
        let v: [u32; 4];
        // SAFETY: the caller guarantees `addr` is 16-byte aligned and holds 16 valid bytes.
        unsafe {
            let (a, b, c, d): (u32, u32, u32, u32);
            asm!("ld.shared.v4.b32 {{{0}, {1}, {2}, {3}}}, [{4}];",
                 out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr,
                 options(readonly, nostack));
            v = [a, b, c, d];
        }
        v
    }
    #[inline(always)]
    unsafe fn store(addr: u32, value: Self) {
        // SAFETY: the caller guarantees `addr` is 16-byte aligned, valid and not raced.
        unsafe {
            asm!("st.shared.v4.b32 [{0}], {{{1}, {2}, {3}, {4}}};",
                 in(reg32) addr, in(reg32) value[0], in(reg32) value[1], in(reg32) value[2],
                 in(reg32) value[3], options(nostack))
        };
    }
}

/// `ld.volatile.shared.u32`: the word at shared-window address `addr`, loaded at this point
/// of the program, every time (never merged with another load nor moved out of a loop), so
/// that the value is held in a register only from here to its last use.
///
/// # Safety
/// `addr` is 4-byte aligned and holds a word no thread writes concurrently.
#[inline(always)]
pub unsafe fn load_volatile_u32(addr: u32) -> u32 {
    let a: u32;
    // SAFETY: forwarded to the caller (aligned, valid, not raced).
    unsafe {
        asm!("ld.volatile.shared.u32 {0}, [{1}];", out(reg32) a, in(reg32) addr,
             options(nostack))
    };
    a
}

/// `ld.volatile.shared.v2.b32`: 8 bytes at shared-window address `addr`, as
/// [`load_volatile_u32`].
///
/// # Safety
/// `addr` is 8-byte aligned and holds 8 bytes no thread writes concurrently.
#[inline(always)]
pub unsafe fn load_volatile_v2(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: forwarded to the caller (aligned, valid, not raced).
    unsafe {
        asm!("ld.volatile.shared.v2.b32 {{{0}, {1}}}, [{2}];",
             out(reg32) a, out(reg32) b, in(reg32) addr, options(nostack))
    };
    [a, b]
}

/// A typed array in shared memory: `len` values of `T` from shared-window address `addr`.
///
/// Indexing is not bounds-checked on the device (compute-sanitizer memcheck catches an access
/// outside the launch's shared memory); layouts come from `kernel_abi` so that they fit.
#[derive(Clone, Copy)]
pub struct SmemArray<T> {
    addr: u32,
    len: u32,
    _ty: PhantomData<T>,
}

impl<T: SmemValue> SmemArray<T> {
    /// A view of `len` values at `addr`, which must be aligned for `T`.
    #[inline(always)]
    pub const fn new(addr: u32, len: u32) -> Self {
        SmemArray {
            addr,
            len,
            _ty: PhantomData,
        }
    }

    /// Shared-window address of element `i`.
    #[inline(always)]
    pub const fn addr_of(&self, i: u32) -> u32 {
        self.addr + i * core::mem::size_of::<T>() as u32
    }

    /// Shared-window address of element 0.
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

    /// Load element `i`.
    ///
    /// # Safety
    /// `i < len`, and every write to element `i` by another thread is ordered before this load
    /// by a barrier (or the writer is this thread).
    #[inline(always)]
    pub unsafe fn load(&self, i: u32) -> T {
        // SAFETY: forwarded to the caller (index in bounds, writes ordered).
        unsafe { T::load(self.addr_of(i)) }
    }

    /// Store element `i`.
    ///
    /// # Safety
    /// `i < len`, and no other thread accesses element `i` between the barriers around this store.
    #[inline(always)]
    pub unsafe fn store(&self, i: u32, value: T) {
        // SAFETY: forwarded to the caller (index in bounds, no concurrent access).
        unsafe { T::store(self.addr_of(i), value) }
    }
}
