//! Gated linear attention backward, chunkwise, on `mma.sync` tensor cores (sm_80 and newer; also
//! run on the CPU by the `kernel-emulator` crate). Semantics: `kernel_abi::gla::backward` and
//! the f64 reverse sweep in `host/src/gla/reference/backward.rs`; design: bench/NOTES.md ("GLA
//! backward: plan").
//!
//! So far the state-gradient pass, `gla_bwd_dh_dk{DK}_dv{DV}`: the gradient `G = dL/dS` of the
//! state at the end of every [`G_BLOCK`](kernel_abi::gla::backward::G_BLOCK)-token block of a
//! segment and of the segment's initial state. A segment starts from the gradient of its end
//! state only at a sequence's end (`dL/dS_final`, or zero); the host plans one segment per
//! sequence.
//!
//! # Parameters
//! [`DhParams`]: contiguous q, g `[rows, H, DK]`, dO `[rows, H, DV]` in bf16, f32 state
//! gradients `[seqs, H, DK, DV]`, the segment table, and the stored gradients
//! `[slots, H, DK, DV]`.
//!
//! # Algorithm
//! The reverse of the forward's state pass: per chunk of 16 tokens (last first), with `b_t` the
//! inclusive cumulative log2-decay from the chunk start and `b_15` its last, the gradient from
//! after the chunk's end reaches the chunk's start decayed by `2^{b_15}`, and each token's
//! output adds `scale q_t^T dO_t` decayed by `2^{b_t}`: `G <- 2^{b_15} G + dO^T (scale q
//! 2^b)` (as `G^T`). Every factor is `<= 1`. An element-wise phase makes the bf16 tile
//! `scale q 2^b` and the decay row (`elementwise.rs`); the forward's matrix phase without
//! outputs (`baseline::matrix`) applies the update with dO in place of v; `dh.rs` walks the
//! segment.
//!
//! # Tiling and thread mapping
//! The baseline forward's (its module documentation), with q, g, dO in the ring's q, g, v
//! tiles, `scale q 2^b` in the `k_state` tile of variant buffer `c % 2` and the decay row in
//! its decay row: one block per (segment, head), `DV / 16` warps each owning 16 columns of `G`.
//!
//! # Barrier protocol (all `bar.sync 0`, reached uniformly by every thread of the block)
//! - Walk step `i` (segment step `steps - 1 - i`, 32 tokens): `cp.async.wait_group(stages - 2)`,
//!   then barrier A: every thread's copies of the step are visible and every thread finished
//!   walk step `i - 1` (its reads of stage `(i - 1) % stages`); then the copies of walk step
//!   `i + stages - 1` go into that stage.
//! - Chunk `c` (walked from the segment's last): the element-wise phase reads the raw q, g rows
//!   (published by barrier A) and writes variant buffer `c % 2`; barrier B publishes it; the
//!   matrix phase reads buffer `c % 2` and the raw dO rows. Buffer `c % 2` was last read by the
//!   matrix phase of chunk `c + 2`, which every thread finished before barrier B of chunk
//!   `c + 1`.
//! - Registers hold `G`; global memory is written only by its owner (this block's gradient
//!   slots, its sequence's initial-state gradient). The block waits for all its copies before
//!   exiting.

mod dh;
mod elementwise;

use dh::walk_dh;
use kernel_abi::gla::backward::DhParams;
use kernel_abi::gla::{GlaConfig, GlaLayout, config_of};

/// The body of `gla_bwd_dh` for one head-dimension pair: [`walk_dh`] with the configuration's
/// constants.
macro_rules! dh_body {
    ($p:expr, $dk:literal, $dv:literal) => {{
        const CFG: GlaConfig = config_of($dk, $dv);
        const LAYOUT: GlaLayout = CFG.layout();
        walk_dh::<
            { CFG.dk },
            { CFG.dv },
            { CFG.threads() },
            { CFG.stages },
            { CFG.stages - 2 },
            { CFG.threads_per_pair() },
            { CFG.tokens_per_thread() as usize },
            { (CFG.dk / 16) as usize },
            { (CFG.dk / 8) as usize },
        >(&$p, &LAYOUT)
    }};
}

/// Declare the kernels of each head-dimension pair: the PTX entry points (with their launch
/// bounds) and, in host builds, the emulator's table of the same bodies.
macro_rules! bwd_kernels {
    ($( $dh:ident, $dk:literal, $dv:literal; )*) => {
        $(
            /// `gla_bwd_dh` for this pair of head dimensions; see the module documentation.
            ///
            /// # Safety
            /// Grid `(segments, heads)`, the configuration's threads and shared memory,
            /// parameters satisfying [`DhParams`]'s contract (validated by the host).
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $dh(p: DhParams) {
                crate::launch_bounds!($dh in kernel_abi::gla::KERNELS);
                // SAFETY: forwarded to the caller.
                unsafe { dh_body!(p, $dk, $dv) }
            }
        )*

        /// The backward kernels, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const EMU_KERNELS: &[crate::emu::EmuKernel] = &[
            $(
                crate::emu::EmuKernel {
                    name: stringify!($dh),
                    params: core::mem::size_of::<DhParams>(),
                    threads: config_of($dk, $dv).threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: the emulator passes a parameter struct of this kernel's
                            // type (it checks the size), whose contract the caller upholds.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const DhParams);
                                dh_body!(p, $dk, $dv)
                            }
                        }
                        run
                    },
                },
            )*
        ];
    };
}

bwd_kernels! {
    gla_bwd_dh_dk64_dv64, 64, 64;
    gla_bwd_dh_dk64_dv128, 64, 128;
    gla_bwd_dh_dk128_dv64, 128, 64;
    gla_bwd_dh_dk128_dv128, 128, 128;
}
