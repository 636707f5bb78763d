//! The kernels, compiled to PTX by rustc's NVPTX backend.
//!
//! - [`arch`]: the device layer (our `cuda_std`): the only place with inline PTX.
//! - one module per kernel family, written against `arch` and the parameter structs of
//!   `kernel_abi` (shared with the host).
//!
//! Hopper-only kernels (TMA, wgmma, setmaxnreg) are compiled only when the target CPU is
//! `sm_90a` (`cfg(target_feature = "sm_90a")`); the `sm_80` PTX holds the portable kernels.
//!
//! The portable `mhc` and `gla` kernels are also compiled for the host, over an emulated device
//! layer, by the `kernel-emulator` crate (`emulator/`), which includes those source files by
//! path; this crate itself is only ever built for `nvptx64-nvidia-cuda`.
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, link_llvm_intrinsics)]
#![allow(internal_features)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
// Loops over per-thread register arrays are written as `for i in 0..N` on purpose: constant
// ranges are what LLVM fully unrolls, which keeps the arrays in registers (see CONTRIBUTING.md).
#![allow(clippy::needless_range_loop)]

pub mod arch;
pub mod attention;
#[cfg(target_feature = "sm_90a")]
pub mod gemm;
pub mod gla;
pub mod mhc;
pub mod negative;
pub mod semicrf;
pub mod smoke;
pub mod tiles;

/// A panic in a kernel (an index out of bounds, an overflow in a checked operation) traps: the
/// launch fails with `CUDA_ERROR_LAUNCH_FAILED`/`ILLEGAL_INSTRUCTION`, which the host reports.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
