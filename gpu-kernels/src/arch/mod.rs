//! The device layer: what `cuda_std` would give, written for rustc's NVPTX backend.
//!
//! This is the only module with inline PTX (`asm!`). Kernels call these functions.
//!
//! Conventions:
//! - Shared memory is addressed by 32-bit *shared-window* addresses (`u32`), the form that
//!   `ld.shared`, `cp.async`, `ldmatrix`, `mbarrier`, TMA and wgmma descriptors take.
//! - Everything is `#[inline(always)]`: the PTX of the kernel crate must be self-contained.
//! - Collective operations (barriers, warp shuffles and votes) use LLVM's NVVM intrinsics, which
//!   LLVM knows to be `convergent`, so the optimizer never duplicates them into divergent paths
//!   (inline asm carries no such attribute in rustc). Warp-synchronous `.aligned` instructions
//!   written as asm (`ldmatrix`, `mma.sync`, `wgmma`) must be reached by the whole warp or
//!   warpgroup in uniform control flow: their `# Safety` sections say so.
//! - Functions whose misuse is undefined behaviour (memory access, collective operations) are
//!   `unsafe` and document their contract; the rest are safe.

pub mod atomic;
pub mod convert;
pub mod cp_async;
pub mod fence;
pub mod global;
pub mod index;
pub mod ldmatrix;
pub mod math;
pub mod math64;
pub mod mma;
pub mod smem;
pub mod sync;
pub mod warp;

#[cfg(target_feature = "sm_90")]
pub mod griddep;
#[cfg(target_feature = "sm_90a")]
pub mod mbarrier;
#[cfg(target_feature = "sm_90a")]
pub mod regs;
#[cfg(target_feature = "sm_90a")]
pub mod tma;
#[cfg(target_feature = "sm_90a")]
pub mod wgmma;

/// Abort the kernel (`trap`): the launch fails and the host sees an error.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` has no preconditions; it ends the thread's execution with an error.
    unsafe { core::arch::nvptx::trap() }
}

/// Declare a kernel's launch bounds from its family's table of kernel handles in `kernel_abi`
/// (`launch_bounds!(name in kernel_abi::<family>::KERNELS)`): at most `threads` threads per
/// block, and at least `min_blocks` resident blocks per SM, as the handle named `name` declares.
/// A kernel without a handle does not compile. The PTX builder turns the marker this writes into
/// the entry's `.maxntid`/`.minnctapersm` directives (CUDA's `__launch_bounds__`), which cap the
/// registers at entry (needed by `setmaxnreg`), and checks that the marker names an entry of the
/// module; the host reads them back and refuses launches that disagree. `name` must be the
/// entry's own name (`launch_bounds!(name = "entry", table)` for an entry named by a string
/// expression, `#[unsafe(export_name = ..)]`). Expand it once, in the kernel function itself.
#[macro_export]
macro_rules! launch_bounds {
    ($kernel:ident in $table:expr) => {
        $crate::launch_bounds!(name = stringify!($kernel), $table)
    };
    (name = $kernel:expr, $table:expr) => {{
        const DECL: kernel_abi::KernelDecl = kernel_abi::kernel::find($table, $kernel);
        $crate::launch_bounds!(@marker $kernel, DECL.threads, DECL.min_blocks);
    }};
    (@marker $kernel:expr, $max_threads:expr, $min_blocks:expr) => {{
        // SAFETY: an assembler comment; no instruction is emitted.
        unsafe {
            core::arch::asm!(
                concat!("// @launch-bounds ", $kernel, " {0} {1}"),
                const $max_threads,
                const $min_blocks,
                options(nomem, nostack)
            )
        };
    }};
}
