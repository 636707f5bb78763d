//! The kernels, compiled to PTX by rustc's NVPTX backend.
//!
//! - [`arch`]: the device layer (our `cuda_std`): the only place with inline PTX.
//! - one module per kernel family, written against `arch` and the parameter structs of
//!   `kernel_abi` (shared with the host).
//!
//! Hopper-only kernels (TMA, wgmma, setmaxnreg) are compiled only when the target CPU is
//! `sm_90a` (`cfg(target_feature = "sm_90a")`); the `sm_80` PTX holds the portable kernels.
//!
//! Compiled for the host instead (as a dependency of the test crate), the crate holds the
//! portable `mhc` kernels over an emulated device layer ([`emu`]), so CPU tests execute the
//! kernels' own code.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, link_llvm_intrinsics)
)]
#![allow(internal_features)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
// Per-thread register arrays are indexed in plain `for i in 0..N` loops on purpose: those unroll
// into constant indices, which is what keeps the arrays in registers (CONTRIBUTING.md).
#![allow(clippy::needless_range_loop)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod arch;
#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
#[cfg(target_feature = "sm_90a")]
pub mod gemm;
pub mod mhc;
#[cfg(target_arch = "nvptx64")]
pub mod smoke;

/// A panic in a kernel (an index out of bounds, an overflow in a checked operation) traps: the
/// launch fails with `CUDA_ERROR_LAUNCH_FAILED`/`ILLEGAL_INSTRUCTION`, which the host reports.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
