//! Gated linear attention backward, chunkwise, on `mma.sync` tensor cores (sm_80 and newer; also
//! run on the CPU by the `kernel-emulator` crate). Semantics: `kernel_abi::gla::backward` and
//! the f64 reverse sweep in `host/src/gla/reference/backward.rs`; design: bench/NOTES.md ("GLA
//! backward: plan").
//!
//! The reverse pass: `gla_bwd_dhdv_dk{DK}_dv{DV}` computes dv, and the gradient
//! `G = dL/dS` of the state at the end of every
//! [`G_BLOCK`](kernel_abi::gla::backward::G_BLOCK)-token block of a segment and of the
//! segment's initial state. A segment starts from the gradient of its end state: `dL/dS_final`
//! (or zero) at a sequence's end, else `seg_end`. For split sequences, as the forward's state
//! pass and combination mirrored: `gla_bwd_states_dk{DK}_dv{DV}` (the same walk from a zero
//! gradient, without dv or stored gradients: the gradient each segment but the first adds at
//! its start, and its total decay) and `gla_bwd_combine` (`combine.rs`: `seg_end` of every
//! segment but the last, chained from the sequence's end). Then `gla_bwd_dqkg_tc_dk{DK}_dv{DV}`
//! (`dqkg_tc.rs`, its own algorithm, tiling and barrier protocol there) computes dq, dk and dg
//! chunkwise on tensor cores from the segment's initial state (the forward's state pass and
//! combination) and the stored block gradients; `gla_bwd_dqkg_dk{DK}_dv{DV}` (`dqkg.rs`)
//! computes the same token by token from the segment's initial state and its end gradient
//! (the reference implementation on the device).
//!
//! # Parameters
//! [`DhdvParams`]: contiguous q, k, g `[rows, H, DK]`, dO, dv `[rows, H, DV]` in bf16, f32
//! state gradients `[seqs, H, DK, DV]`, the segment table, and the stored gradients
//! `[slots, H, DK, DV]`.
//!
//! # Algorithm
//! The forward's chunkwise form (`super::chunk`) run backward in time, with the roles of q and
//! k exchanged. Per chunk of 16 tokens (last first), with `b_t` the inclusive cumulative
//! log2-decay from the chunk start, `b_15` its last and `G` the gradient at the chunk's end
//! (from everything after it):
//! - `dv_s = sum_{t >= s} A[t][s] dO_t + (k_s 2^{b_15 - b_s}) G` with the chunk's scores
//!   `A[t][s] = scale q_t . k_s 2^{b_t - b_s}` (`dv.rs`): the forward's `o = P v + q_inter S`
//!   with `P` replaced by `A^T` (upper triangular; its factors split at the halves' midpoints
//!   as the forward's, mirrored: `elementwise.rs`), `v` by dO, `q_inter` by `k 2^{b_15 - b}`
//!   and `S` by `G`;
//! - `G <- 2^{b_15} G + dO^T (scale q 2^b)` (as `G^T`): the forward's state update with dO in
//!   place of v and `scale q 2^b` in place of `k_state` (`baseline::matrix` without outputs).
//!
//! `dhdv.rs` walks the segment: per chunk the element-wise phase makes the bf16 operand tiles
//! and the decay row, then each warp computes its dv columns from the pre-update `G` and
//! updates `G`.
//!
//! # Tiling and thread mapping
//! The baseline forward's (its module documentation): one block per (segment, head), `DV / 16`
//! warps each owning 16 columns of `G` (as `G^T` accumulators) and of dv; q, k, g, dO stream
//! through the ring's q, k, g, v tiles; the operand tiles take the variant buffers' slots
//! (`q_diag`: `k 2^{M_h - b}`, `k_half1`: `scale q 2^{b - M_0}`, `k_half0`: `scale q 2^{b -
//! M_1}` of half 1, `q_inter`: `k 2^{b_15 - b}`, `k_state`: `scale q 2^b`, and the decay row).
//!
//! # Barrier protocol (all `bar.sync 0`, reached uniformly by every thread of the block)
//! - Walk step `i` (segment step `steps - 1 - i`, 32 tokens): `cp.async.wait_group(stages - 2)`,
//!   then barrier A: every thread's copies of the step are visible and every thread finished
//!   walk step `i - 1` (its reads of stage `(i - 1) % stages`); then the copies of walk step
//!   `i + stages - 1` go into that stage.
//! - Chunk `c` (walked from the segment's last): the element-wise phase reads the raw q, k, g
//!   rows (published by barrier A) and writes variant buffer `c % 2`; barrier B publishes it;
//!   dv and the gradient update read buffer `c % 2` and the raw dO rows. Buffer `c % 2` was last read by the
//!   matrix phase of chunk `c + 2`, which every thread finished before barrier B of chunk
//!   `c + 1`.
//! - Registers hold `G`; global memory is written only by its owner (this block's rows of dv,
//!   its gradient slots, its sequence's initial-state gradient). The block waits for all its copies before
//!   exiting.
//!
//! `gla_bwd_combine` shares nothing between threads (no barrier).

mod combine;
mod dhdv;
mod dqkg;
mod dqkg_tc;
mod dv;
mod elementwise;

use dhdv::walk_dhdv;
use dqkg::dqkg;
use dqkg_tc::dqkg_tc;
use kernel_abi::gla::backward::{
    CHUNKS_PER_G_BLOCK, DQKG_LANES, DhdvParams, DqkgParams, DqkgTcParams, dqkg_threads, tc_threads,
};
use kernel_abi::gla::{GlaConfig, GlaLayout, config_of};

/// The body of `gla_bwd_dhdv` (`$full = true`) or `gla_bwd_states` (`false`) for one
/// head-dimension pair: [`walk_dhdv`] with the configuration's constants.
macro_rules! dhdv_body {
    ($p:expr, $dk:literal, $dv:literal, $full:literal) => {{
        const CFG: GlaConfig = config_of($dk, $dv);
        const LAYOUT: GlaLayout = CFG.layout();
        walk_dhdv::<
            { CFG.dk },
            { CFG.dv },
            { CFG.threads() },
            { CFG.stages },
            { CFG.stages - 2 },
            { CFG.threads_per_pair() },
            { CFG.tokens_per_thread() as usize },
            { (CFG.dk / 16) as usize },
            { (CFG.dk / 8) as usize },
            $full,
        >(&$p, &LAYOUT)
    }};
}

/// Declare the kernels of each head-dimension pair: the PTX entry points (with their launch
/// bounds) and, in host builds, the emulator's table of the same bodies (`gla_bwd_combine`
/// included).
/// The body of `gla_bwd_dqkg` for one head-dimension pair: [`dqkg`] with its constants.
macro_rules! dqkg_body {
    ($p:expr, $dk:literal, $dv:literal) => {
        dqkg::<$dk, $dv, { dqkg_threads($dk) }, { ($dv / DQKG_LANES) as usize }>(&$p)
    };
}

/// The body of `gla_bwd_dqkg_tc` for one head-dimension pair: [`dqkg_tc`] with its constants
/// (and without barrier F of its protocol when `$carry_barrier` is false: the negative control).
macro_rules! dqkg_tc_body {
    ($p:expr, $dk:literal, $dv:literal) => {
        dqkg_tc_body!($p, $dk, $dv, true)
    };
    ($p:expr, $dk:literal, $dv:literal, $carry_barrier:literal) => {
        dqkg_tc::<
            $dk,
            $dv,
            { tc_threads($dk) },
            { ($dv / 8) as usize },
            { CHUNKS_PER_G_BLOCK * $dk / tc_threads($dk) },
            $carry_barrier,
        >(&$p)
    };
}

macro_rules! bwd_kernels {
    ($( $dhdv:ident, $states:ident, $dqkg:ident, $tc:ident, $dk:literal, $dv:literal; )*) => {
        $(
            /// `gla_bwd_dqkg_tc` for this pair of head dimensions; see `dqkg_tc.rs`.
            ///
            /// # Safety
            /// Grid `(segments, heads)`, `tc_threads(DK)` threads and `tc_smem_bytes`,
            /// parameters satisfying [`DqkgTcParams`]'s contract (validated by the host);
            /// `seg_init` written by the forward's combination for split sequences, `grad` by
            /// `gla_bwd_dhdv`.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $tc(p: DqkgTcParams) {
                crate::launch_bounds!($tc in kernel_abi::gla::KERNELS);
                // SAFETY: forwarded to the caller.
                unsafe { dqkg_tc_body!(p, $dk, $dv) }
            }
        )*
        $(
            /// `gla_bwd_dqkg` for this pair of head dimensions; see `dqkg.rs`.
            ///
            /// # Safety
            /// Grid `(segments, heads)`, `dqkg_threads(DK)` threads and `dqkg_smem_bytes`,
            /// parameters satisfying [`DqkgParams`]'s contract (validated by the host);
            /// `seg_init` and `seg_end` written by the forward's and the backward's
            /// combinations for split sequences.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $dqkg(p: DqkgParams) {
                crate::launch_bounds!($dqkg in kernel_abi::gla::KERNELS);
                // SAFETY: forwarded to the caller.
                unsafe { dqkg_body!(p, $dk, $dv) }
            }
        )*
        $(
            /// `gla_bwd_dhdv` for this pair of head dimensions; see the module documentation.
            ///
            /// # Safety
            /// Grid `(segments, heads)`, the configuration's threads and shared memory,
            /// parameters satisfying [`DhdvParams`]'s contract (validated by the host); for
            /// segments that are not last, `seg_end` written by `gla_bwd_combine`.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $dhdv(p: DhdvParams) {
                crate::launch_bounds!($dhdv in kernel_abi::gla::KERNELS);
                // SAFETY: forwarded to the caller.
                unsafe { dhdv_body!(p, $dk, $dv, true) }
            }

            /// `gla_bwd_states` for this pair of head dimensions; see the module
            /// documentation.
            ///
            /// # Safety
            /// As for the `gla_bwd_dhdv` kernel of the pair; `delta` and `decay_log2` hold a
            /// slice per (segment, head).
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $states(p: DhdvParams) {
                crate::launch_bounds!($states in kernel_abi::gla::KERNELS);
                // SAFETY: forwarded to the caller.
                unsafe { dhdv_body!(p, $dk, $dv, false) }
            }
        )*

        /// The backward kernels, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const EMU_KERNELS: &[crate::emu::EmuKernel] = &[
            $(
                crate::emu::EmuKernel {
                    name: stringify!($dhdv),
                    params: core::mem::size_of::<DhdvParams>(),
                    threads: config_of($dk, $dv).threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: the emulator passes a parameter struct of this kernel's
                            // type (it checks the size), whose contract the caller upholds.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const DhdvParams);
                                dhdv_body!(p, $dk, $dv, true)
                            }
                        }
                        run
                    },
                },
                crate::emu::EmuKernel {
                    name: stringify!($states),
                    params: core::mem::size_of::<DhdvParams>(),
                    threads: config_of($dk, $dv).threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: as for the `gla_bwd_dhdv` entries.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const DhdvParams);
                                dhdv_body!(p, $dk, $dv, false)
                            }
                        }
                        run
                    },
                },
                crate::emu::EmuKernel {
                    name: stringify!($dqkg),
                    params: core::mem::size_of::<DqkgParams>(),
                    threads: dqkg_threads($dk),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: as for the `gla_bwd_dhdv` entries.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const DqkgParams);
                                dqkg_body!(p, $dk, $dv)
                            }
                        }
                        run
                    },
                },
                crate::emu::EmuKernel {
                    name: stringify!($tc),
                    params: core::mem::size_of::<DqkgTcParams>(),
                    threads: tc_threads($dk),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: as for the `gla_bwd_dhdv` entries.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const DqkgTcParams);
                                dqkg_tc_body!(p, $dk, $dv)
                            }
                        }
                        run
                    },
                },
            )*
            crate::emu::EmuKernel {
                name: "gla_bwd_combine",
                params: core::mem::size_of::<kernel_abi::gla::CombineParams>(),
                threads: kernel_abi::gla::COMBINE_THREADS,
                run: {
                    unsafe fn run(p: *const u8) {
                        // SAFETY: as for the `gla_bwd_dhdv` entries.
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

bwd_kernels! {
    gla_bwd_dhdv_dk64_dv64, gla_bwd_states_dk64_dv64, gla_bwd_dqkg_dk64_dv64,
        gla_bwd_dqkg_tc_dk64_dv64, 64, 64;
    gla_bwd_dhdv_dk64_dv128, gla_bwd_states_dk64_dv128, gla_bwd_dqkg_dk64_dv128,
        gla_bwd_dqkg_tc_dk64_dv128, 64, 128;
    gla_bwd_dhdv_dk128_dv64, gla_bwd_states_dk128_dv64, gla_bwd_dqkg_dk128_dv64,
        gla_bwd_dqkg_tc_dk128_dv64, 128, 64;
    gla_bwd_dhdv_dk128_dv128, gla_bwd_states_dk128_dv128, gla_bwd_dqkg_dk128_dv128,
        gla_bwd_dqkg_tc_dk128_dv128, 128, 128;
}

/// The body of the negative control `negative_gla_bwd_no_carry_barrier` (`crate::negative`):
/// `gla_bwd_dqkg_tc_dk64_dv64` without barrier F of `dqkg_tc`'s protocol.
///
/// # Safety
/// As for `gla_bwd_dqkg_tc_dk64_dv64`; its dg is undefined (a data race on shared memory).
#[inline(always)]
pub(crate) unsafe fn dqkg_tc_without_carry_barrier(p: &DqkgTcParams) {
    // SAFETY: forwarded to the caller.
    unsafe { dqkg_tc_body!(*p, 64, 64, false) }
}

/// The negative control of the backward, for the CPU emulator (`crate::emu`).
#[cfg(not(target_arch = "nvptx64"))]
pub const NEGATIVE_EMU_KERNELS: &[crate::emu::EmuKernel] = &[crate::emu::EmuKernel {
    name: kernel_abi::gla::backward::NEGATIVE_GLA_BWD_NO_CARRY_BARRIER.name,
    params: core::mem::size_of::<DqkgTcParams>(),
    threads: kernel_abi::gla::backward::NEGATIVE_GLA_BWD_NO_CARRY_BARRIER.threads,
    run: {
        unsafe fn run(ptr: *const u8) {
            // SAFETY: the emulator passes a parameter struct of this kernel's type (it checks
            // the size), whose contract the caller upholds.
            unsafe {
                dqkg_tc_without_carry_barrier(&core::ptr::read_unaligned(
                    ptr as *const DqkgTcParams,
                ))
            }
        }
        run
    },
}];
