//! The portable kernels of `gpu-kernels`, compiled for the CPU over an emulated device layer, so
//! that tests without a GPU execute the kernels' own code.
//!
//! The kernel sources are included by path from `gpu-kernels/src/` (only the families listed
//! here, written against `arch` alone); [`arch`] implements the device layer's functions on the
//! CPU, with the same names and contracts, and [`emu::launch`] runs a grid with one OS thread per
//! GPU thread (see [`emu`] for what is and is not emulated). The GPU build of the kernels is
//! unaffected: `gpu-kernels` is only ever compiled for `nvptx64-nvidia-cuda`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
// As in gpu-kernels: register arrays are indexed in plain constant-trip loops on purpose.
#![allow(clippy::needless_range_loop)]

pub mod emu;

/// The device layer of `gpu-kernels/src/arch`, emulated: the functions the portable kernels
/// use, with the same signatures and safety contracts.
pub mod arch {
    pub mod atomic;
    pub mod convert;
    pub mod cp_async;
    pub mod global;
    pub mod index;
    pub mod ldmatrix;
    pub mod math;
    pub mod mma;
    pub mod smem;
    pub mod sync;
    pub mod warp;

    /// Abort the kernel: the emulated thread panics and the launch fails.
    pub fn trap() -> ! {
        panic!("trap")
    }
}

/// The mHC kernels (`gpu-kernels/src/mhc`), with their emulator table `mhc::EMU_KERNELS`.
#[path = "../../gpu-kernels/src/mhc/mod.rs"]
pub mod mhc;

/// The shared tile loaders (`gpu-kernels/src/tiles.rs`), used by the GLA kernels.
#[path = "../../gpu-kernels/src/tiles.rs"]
pub mod tiles;

/// The GLA forward kernels (`gpu-kernels/src/gla`), with their emulator table
/// `gla::EMU_KERNELS`.
#[path = "../../gpu-kernels/src/gla/mod.rs"]
pub mod gla;

/// The attention forward kernels of the `mma.sync` path (`gpu-kernels/src/attention`), with
/// their emulator table `attention::EMU_KERNELS`.
#[path = "../../gpu-kernels/src/attention/mod.rs"]
pub mod attention;

/// The block reduction of the smoke kernels (`gpu-kernels/src/smoke/reduce.rs`) and its
/// negative control without the barrier, with their emulator table `smoke_reduce::EMU_KERNELS`.
#[path = "../../gpu-kernels/src/smoke/reduce.rs"]
pub mod smoke_reduce;
