//! Gated linear attention forward, chunkwise, on `mma.sync` tensor cores (sm_80 and newer):
//! `gla_fwd_dk{DK}_dv{DV}` (outputs), `gla_states_dk{DK}_dv{DV}` (segment states) and
//! `gla_combine` (segment initial states). Semantics: `kernel_abi::gla` and the f64 recurrence
//! in `host/src/gla/reference.rs`.
//!
//! # Parameters
//! [`GlaParams`] (and [`CombineParams`](kernel_abi::gla::CombineParams)): contiguous q, k, g
//! `[rows, H, DK]`, v, o `[rows, H, DV]` in bf16, f32 states `[seqs, H, DK, DV]`, the segment
//! table and the workspace of the segment passes.
//!
//! # Algorithm
//! The chunkwise form of [`super::chunk`] (its module documentation derives the operand tiles
//! and why they stay in range): per chunk of 16 tokens, an element-wise phase turns the raw q,
//! k, g rows into the bf16 operand tiles and the decay row (`elementwise`), then a matrix
//! phase on `mma.sync` updates the outputs and the state (`matrix`); `walk` streams a segment
//! through both, and `gla_combine` (`combine.rs`) chains the segments' states.
//!
//! # Tiling
//! One block per (segment, head); `DV / 16` warps, warp `w` owns value columns
//! `16 w .. 16 w + 16` of the state (as `S^T` accumulators: m16 tiles over its 16 value
//! columns, `DK / 8` n8 tiles over the key channels, `DK / 2` f32 per thread) and of the
//! outputs. q, k, g, v stream through a `stages`-deep `cp.async` ring of
//! [`STEP`](kernel_abi::gla::STEP) = 32 tokens (2 chunks); rows are padded by 16 bytes
//! (conflict-free `ldmatrix`). The bf16 operand tiles of a chunk (`q_inter`, `q_diag`,
//! `k_half0`, `k_half1`, `k_state`) and its decay row are double-buffered.
//!
//! # Thread mapping
//! Element-wise phase: `P = threads / (DK / 2)` consecutive lanes share a pair of key channels
//! (`2 (tid / P)`, `+ 1`) and split the chunk's 16 tokens into runs of `16 / P` (<= 8, so a run
//! lies in one half); the cumulative sum is a local scan plus a shuffle scan over the `P` lanes,
//! and `b_0, b_7, b_8, b_15` come by shuffles from the lanes that own them.
//! Matrix phase, warp `w`, per chunk (every warp the same work, no specialization):
//! 1. scores: `q_diag` x (`k_half0`, `k_half1`) over `DK / 16` k-slices (3 `mma` each), masked,
//!    packed in registers to the A operand of `o += A v` (2 `mma`);
//! 2. per k-slice: `o += q_inter S` with `S` packed from the thread's own `S^T` accumulators
//!    (the accumulator layout of `S^T` is the B-operand layout of `S`), then
//!    `S^T = decay * S^T + v^T k_state` (2 + 2 `mma`);
//! 3. `o * scale` to bf16, stored for the chunk's valid tokens.
//!
//! # Barrier protocol (all `bar.sync 0`, reached uniformly by every thread of the block)
//! - Step `s` (32 tokens): `cp.async.wait_group(stages - 2)` (this thread's copies of step `s`
//!   landed), then barrier A: every thread's copies of step `s` are visible, and every thread
//!   has finished step `s - 1` (its reads of stage `(s - 1) % stages`). Then the copies of step
//!   `s + stages - 1` go into stage `(s - 1) % stages`.
//! - Chunk `c` (global index in the segment): the element-wise phase reads the raw q, k, g rows
//!   of the chunk (published by barrier A of its step) and writes variant buffer `c % 2`; barrier
//!   B publishes it; the matrix phase reads buffer `c % 2` and the raw v rows. Buffer `c % 2` was
//!   last read by the matrix phase of chunk `c - 2`, which every thread finished before it
//!   arrived at barrier B of chunk `c - 1`, before any thread writes the buffer again.
//! - Registers hold the state and the outputs; global memory is written only by its owner (a
//!   block's own rows of o, its own state slices). The block waits for all its copies before
//!   exiting.
//!
//! `gla_combine` shares nothing between threads (no barrier).

mod combine;
mod elementwise;
pub(super) mod matrix;
pub(super) mod tiles;
mod walk;

use kernel_abi::gla::{GlaConfig, GlaLayout, GlaParams, config_of};
use walk::walk;

/// The body of `gla_fwd` (`$out = true`) or `gla_states` (`false`) for one head-dimension pair:
/// [`walk`] with the configuration's constants.
macro_rules! gla_body {
    ($p:expr, $dk:literal, $dv:literal, $out:literal) => {{
        const CFG: GlaConfig = config_of($dk, $dv);
        const LAYOUT: GlaLayout = CFG.layout();
        walk::<
            { CFG.dk },
            { CFG.dv },
            { CFG.threads() },
            { CFG.stages },
            { CFG.stages - 2 },
            { CFG.threads_per_pair() },
            { CFG.tokens_per_thread() as usize },
            { (CFG.dk / 16) as usize },
            { (CFG.dk / 8) as usize },
            $out,
        >(&$p, &LAYOUT)
    }};
}

/// Declare the kernels of each head-dimension pair: the PTX entry points (with their launch
/// bounds) and, in host builds, the emulator's table of the same bodies (`gla_combine`
/// included).
macro_rules! gla_kernels {
    ($( $fwd:ident, $states:ident, $dk:literal, $dv:literal; )*) => {
        $(
            /// `gla_fwd` for this pair of head dimensions; see the module documentation.
            ///
            /// # Safety
            /// Grid `(segments, heads)`, the configuration's threads and shared memory,
            /// parameters satisfying [`GlaParams`]'s contract (validated by the host); for
            /// segments that are not first, `seg_init` written by `gla_combine`.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $fwd(p: GlaParams) {
                crate::launch_bounds!($fwd in kernel_abi::gla::KERNELS);
                // SAFETY: forwarded to the caller.
                unsafe { gla_body!(p, $dk, $dv, true) }
            }

            /// `gla_states` for this pair of head dimensions; see the module documentation.
            ///
            /// # Safety
            /// As for the `gla_fwd` kernel of the pair; `delta` and `decay_log2` hold a slice
            /// per (segment, head).
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $states(p: GlaParams) {
                crate::launch_bounds!($states in kernel_abi::gla::KERNELS);
                // SAFETY: forwarded to the caller.
                unsafe { gla_body!(p, $dk, $dv, false) }
            }
        )*

        /// The kernels of this family, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const EMU_KERNELS: &[crate::emu::EmuKernel] = &[
            $(
                crate::emu::EmuKernel {
                    name: stringify!($fwd),
                    params: core::mem::size_of::<GlaParams>(),
                    threads: config_of($dk, $dv).threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: the emulator passes a parameter struct of this kernel's
                            // type (it checks the size), whose contract the caller upholds.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const GlaParams);
                                gla_body!(p, $dk, $dv, true)
                            }
                        }
                        run
                    },
                },
                crate::emu::EmuKernel {
                    name: stringify!($states),
                    params: core::mem::size_of::<GlaParams>(),
                    threads: config_of($dk, $dv).threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: as for the `gla_fwd` entry.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const GlaParams);
                                gla_body!(p, $dk, $dv, false)
                            }
                        }
                        run
                    },
                },
            )*
            crate::emu::EmuKernel {
                name: "gla_combine",
                params: core::mem::size_of::<kernel_abi::gla::CombineParams>(),
                threads: kernel_abi::gla::COMBINE_THREADS,
                run: {
                    unsafe fn run(p: *const u8) {
                        // SAFETY: as for the `gla_fwd` entries.
                        unsafe {
                            combine::combine(core::ptr::read_unaligned(
                                p as *const kernel_abi::gla::CombineParams,
                            ))
                        }
                    }
                    run
                },
            },
        ];
    };
}

gla_kernels! {
    gla_fwd_dk64_dv64, gla_states_dk64_dv64, 64, 64;
    gla_fwd_dk64_dv128, gla_states_dk64_dv128, 64, 128;
    gla_fwd_dk128_dv64, gla_states_dk128_dv64, 128, 64;
    gla_fwd_dk128_dv128, gla_states_dk128_dv128, 128, 128;
}
