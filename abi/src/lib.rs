//! The contract between the kernel crate (compiled to PTX) and the host crate.
//!
//! Everything that both sides must agree on lives here exactly once: the `#[repr(C)]` parameter
//! struct of every kernel (one struct per kernel, passed by value), tile shapes, thread counts,
//! and the shared-memory layout sizes (as `const fn`s). The host additionally checks at launch
//! that `size_of` of the struct it passes equals the parameter size declared in the PTX.
#![no_std]

pub mod attention;
pub mod gemm;
pub mod gla;
pub mod kernel;
pub mod mhc;
pub mod semicrf;
pub mod smoke;

pub use kernel::{Kernel, KernelDecl};

/// Threads in a warp.
pub const WARP_SIZE: u32 = 32;
/// Threads in a warpgroup (4 consecutive warps), the unit that issues `wgmma`.
pub const WARPGROUP_SIZE: u32 = 128;

/// Dynamic shared memory is aligned up to this many bytes by the kernel before use (128B-swizzled
/// TMA/wgmma tiles need 1024-byte alignment); the host adds this much slack to every request.
pub const SMEM_ALIGN: usize = 1024;

/// Round `x` up to a multiple of `align` (a power of two).
pub const fn align_up(x: usize, align: usize) -> usize {
    (x + align - 1) & !(align - 1)
}

/// An opaque CUDA tensor map (`CUtensorMap`, 128 bytes), encoded on the host by
/// `cuTensorMapEncodeTiled` and passed to kernels by value inside their parameter struct.
///
/// Alignment is 16 on both sides so that parameter structs have one layout: rustc's PTX kernel
/// ABI cannot express more than 16 today, so the PTX builder raises the `.param` alignment of
/// every parameter whose tensor maps the kernel uses to 64 (what the hardware requires, and what
/// nvcc emits for `__grid_constant__`). Tensor-map fields must come first in a parameter struct,
/// at offsets that are multiples of 64 (checked at compile time by the device layer).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMap {
    pub opaque: [u64; 16],
}

impl TensorMap {
    /// Size in bytes of a `CUtensorMap`.
    pub const SIZE: usize = 128;
    /// A map of all zero bits, for parameter structs of kernels that take no map in that slot.
    pub const ZEROED: TensorMap = TensorMap { opaque: [0; 16] };
}

const _: () = assert!(core::mem::size_of::<TensorMap>() == TensorMap::SIZE);
