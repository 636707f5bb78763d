//! mHC (manifold-constrained hyper-connections, DeepSeek, arXiv 2512.24880): the coefficients
//! `H_pre`, `H_post`, `H_res` of each token from its `n` residual streams, their applications,
//! and the backward through all of it (Sinkhorn iterations included).
//!
//! Shapes, the coefficient order and the packings are in `kernel_abi::mhc`; the f64 reference
//! (the specification) is `host/src/mhc/reference.rs`.
//!
//! # Pipeline
//! Forward (`x~` is a token's `[n C] = [K]` streams; `phi' = diag(gamma) phi`):
//! 1. [`prep`] `mhc_prep`: `phi'` as bf16 `hi + lo` tensor-core fragments (two packings).
//! 2. [`proj`] `mhc_fwd_proj_n{N}`: `x~ phi'` and `|x~|^2`, split over K (partials).
//! 3. [`coeff`] `mhc_fwd_coeff`: sum of the partials, the norm, sigmoids and Sinkhorn.
//! 4. [`apply`] `mhc_fwd_pre_n{N}`: `x_in = H_pre x`.
//! 5. [`apply`] `mhc_fwd_post_n{N}` (after the layer produced `y`): `x_next = H_res x + H_post y`.
//!
//! Backward (given `d_xin`, `d_xnext`):
//! 1. [`dh`] `mhc_bwd_dh_n{N}`: `dH_pre`, `dH_post`, `dH_res` (reductions over C) and `dy`.
//! 2. [`coeff`] `mhc_bwd_coeff`: through the sigmoids, every Sinkhorn iteration, `exp`, the
//!    gains and the norm: `u = dL/d(x~ phi')`, the norm's coefficient of `x`, and per-block
//!    partials of `dbias` and `dalpha`.
//! 3. [`dx`] `mhc_bwd_dx_n{N}`: `dx` (the applications' terms, the norm's, and `u phi'^T` on
//!    tensor cores).
//! 4. [`wgrad`] `mhc_bwd_wgrad_n{N}`: `W = x~^T u` on tensor cores, partial over token splits.
//! 5. [`finalize`] `mhc_bwd_finalize_n{N}`: second pass of every reduction, in a fixed order:
//!    `dphi = diag(gamma) W`, `dgamma = rowsum(phi * W)`, `dbias`, `dalpha`.
//!
//! No float atomics anywhere: every reduction over tokens or K is written as per-block partials
//! (each block's slice computed from its own indices, so slices are disjoint) and summed in a
//! fixed order by a later kernel, so results are bitwise identical run to run (and across GPUs:
//! the splits depend only on the problem).
//!
//! # Why this split (bytes and FLOPs, at B = 4, S = 4096, n = 4, C = 4096)
//! `x` is 512 MB (bf16). The projection is `2 K M = 786k` FLOP per token for 32 KB of `x`:
//! 24 FLOP/byte, 48 with the `hi + lo` split that keeps f32 accuracy. CUDA-core FMA peaks near
//! 67 TFLOP/s on an H200 (16 FLOP/byte at 4.1 TB/s), so FMA would be compute-bound; `mma.sync`
//! (bf16, f32 accumulation) keeps it memory-bound. The same holds for `u phi'^T` in `dx` and for
//! `x~^T u` (the weight gradient): both use `mma.sync` with split operands. The streaming kernels
//! (applications, `dH`) do 1 to `n` FMA per byte and use CUDA cores.
//!
//! A token's applications need its coefficients, which need all of its `x~` (32 KB here), and
//! `x_next` needs `y`, which the layer computes from `x_in`: so `x` is read by the projection,
//! by `x_in` and by `x_next` (the projection's token tiles are far too large to keep on chip,
//! and `phi'` must be reused over many tokens to stay out of the way).
//!
//! Measured times at that shape, beside PyTorch's, are in `bench/NOTES.md`.

mod apply;
mod coeff;
mod dh;
mod dx;
mod finalize;
mod prep;
mod proj;
mod wgrad;

use kernel_abi::mhc::*;

/// Declare kernels: the PTX entry point of each, with the launch bounds of its handle in
/// `kernel_abi::mhc::KERNELS` (threads, and resident blocks per SM, which cap the registers), and,
/// in host builds, the emulator's table of the same bodies.
macro_rules! kernels {
    ($( $name:ident ($params:ty) => $body:expr; )*) => {
        $(
            /// A PTX entry point; see the module of its body for the kernel's documentation.
            ///
            /// # Safety
            /// The launch contract of its body (grid, block, shared memory, parameters).
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: $params) {
                crate::launch_bounds!($name in kernel_abi::mhc::KERNELS);
                // SAFETY: forwarded to the launcher (the body's contract).
                unsafe { $body(p) }
            }
        )*

        /// The kernels of this family, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const EMU_KERNELS: &[crate::emu::EmuKernel] = &[$(
            crate::emu::EmuKernel {
                name: stringify!($name),
                params: core::mem::size_of::<$params>(),
                threads: kernel_abi::kernel::find(kernel_abi::mhc::KERNELS, stringify!($name))
                    .threads,
                run: {
                    unsafe fn run(p: *const u8) {
                        // SAFETY: the emulator passes a parameter struct of this kernel's type
                        // (it checks the size), whose contract the caller upholds.
                        unsafe { $body(core::ptr::read_unaligned(p as *const $params)) }
                    }
                    run
                },
            },
        )*];
    };
}

kernels! {
    mhc_prep(PrepParams) => prep::run;

    mhc_fwd_proj_n2(ProjParams) => proj::run::<2, 1, 2, { proj_config(2).stage_chunks }, { proj_config(2).stages }, { proj_config(2).stages - 2 }>;
    mhc_fwd_proj_n3(ProjParams) => proj::run::<3, 2, 2, { proj_config(3).stage_chunks }, { proj_config(3).stages }, { proj_config(3).stages - 2 }>;
    mhc_fwd_proj_n4(ProjParams) => proj::run::<4, 3, 2, { proj_config(4).stage_chunks }, { proj_config(4).stages }, { proj_config(4).stages - 2 }>;
    mhc_fwd_proj_n4_c2s3(ProjParams) => proj::run::<4, 3, 2, { PROJ_VARIANTS[0].config.stage_chunks }, { PROJ_VARIANTS[0].config.stages }, { PROJ_VARIANTS[0].config.stages - 2 }>;
    mhc_fwd_proj_n4_c4s3(ProjParams) => proj::run::<4, 3, 2, { PROJ_VARIANTS[1].config.stage_chunks }, { PROJ_VARIANTS[1].config.stages }, { PROJ_VARIANTS[1].config.stages - 2 }>;
    mhc_fwd_proj_n4_c8s2(ProjParams) => proj::run::<4, 3, 2, { PROJ_VARIANTS[2].config.stage_chunks }, { PROJ_VARIANTS[2].config.stages }, { PROJ_VARIANTS[2].config.stages - 2 }>;
    mhc_fwd_proj_n5(ProjParams) => proj::run::<5, 5, 2, { proj_config(5).stage_chunks }, { proj_config(5).stages }, { proj_config(5).stages - 2 }>;
    mhc_fwd_proj_n6(ProjParams) => proj::run::<6, 6, 2, { proj_config(6).stage_chunks }, { proj_config(6).stages }, { proj_config(6).stages - 2 }>;
    mhc_fwd_proj_n7(ProjParams) => proj::run::<7, 8, 2, { proj_config(7).stage_chunks }, { proj_config(7).stages }, { proj_config(7).stages - 2 }>;
    mhc_fwd_proj_n8(ProjParams) => proj::run::<8, 10, 2, { proj_config(8).stage_chunks }, { proj_config(8).stages }, { proj_config(8).stages - 2 }>;

    mhc_fwd_coeff(FwdCoeffParams) => coeff::forward;

    mhc_fwd_pre_n2(PreParams) => apply::pre::<2>;
    mhc_fwd_pre_n3(PreParams) => apply::pre::<3>;
    mhc_fwd_pre_n4(PreParams) => apply::pre::<4>;
    mhc_fwd_pre_n5(PreParams) => apply::pre::<5>;
    mhc_fwd_pre_n6(PreParams) => apply::pre::<6>;
    mhc_fwd_pre_n7(PreParams) => apply::pre::<7>;
    mhc_fwd_pre_n8(PreParams) => apply::pre::<8>;

    mhc_fwd_post_n2(PostParams) => apply::post::<2>;
    mhc_fwd_post_n3(PostParams) => apply::post::<3>;
    mhc_fwd_post_n4(PostParams) => apply::post::<4>;
    mhc_fwd_post_n5(PostParams) => apply::post::<5>;
    mhc_fwd_post_n6(PostParams) => apply::post::<6>;
    mhc_fwd_post_n7(PostParams) => apply::post::<7>;
    mhc_fwd_post_n8(PostParams) => apply::post::<8>;

    mhc_bwd_dh_n2(DhdvParams) => dh::run::<2>;
    mhc_bwd_dh_n3(DhdvParams) => dh::run::<3>;
    mhc_bwd_dh_n4(DhdvParams) => dh::run::<4>;
    mhc_bwd_dh_n5(DhdvParams) => dh::run::<5>;
    mhc_bwd_dh_n6(DhdvParams) => dh::run::<6>;
    mhc_bwd_dh_n7(DhdvParams) => dh::run::<7>;
    mhc_bwd_dh_n8(DhdvParams) => dh::run::<8>;

    mhc_bwd_coeff(BwdCoeffParams) => coeff::backward;

    mhc_bwd_dx_n2(DxParams) => dx::run::<2, 1>;
    mhc_bwd_dx_n3(DxParams) => dx::run::<3, 1>;
    mhc_bwd_dx_n4(DxParams) => dx::run::<4, 2>;
    mhc_bwd_dx_n5(DxParams) => dx::run::<5, 3>;
    mhc_bwd_dx_n6(DxParams) => dx::run::<6, 3>;
    mhc_bwd_dx_n7(DxParams) => dx::run::<7, 4>;
    mhc_bwd_dx_n8(DxParams) => dx::run::<8, 5>;

    mhc_bwd_wgrad_n2(WgradParams) => wgrad::run::<2, 1, 4>;
    mhc_bwd_wgrad_n3(WgradParams) => wgrad::run::<3, 2, 4>;
    mhc_bwd_wgrad_n4(WgradParams) => wgrad::run::<4, 3, 4>;
    mhc_bwd_wgrad_n5(WgradParams) => wgrad::run::<5, 5, 2>;
    mhc_bwd_wgrad_n6(WgradParams) => wgrad::run::<6, 6, 2>;
    mhc_bwd_wgrad_n7(WgradParams) => wgrad::run::<7, 8, 2>;
    mhc_bwd_wgrad_n8(WgradParams) => wgrad::run::<8, 10, 2>;

    mhc_bwd_finalize_n2(FinalizeParams) => finalize::run::<2, 8>;
    mhc_bwd_finalize_n3(FinalizeParams) => finalize::run::<3, 15>;
    mhc_bwd_finalize_n4(FinalizeParams) => finalize::run::<4, 24>;
    mhc_bwd_finalize_n5(FinalizeParams) => finalize::run::<5, 35>;
    mhc_bwd_finalize_n6(FinalizeParams) => finalize::run::<6, 48>;
    mhc_bwd_finalize_n7(FinalizeParams) => finalize::run::<7, 63>;
    mhc_bwd_finalize_n8(FinalizeParams) => finalize::run::<8, 80>;
}

// The variant kernels above take their configuration by index in `PROJ_VARIANTS`, whose
// entries name their kernels.
const _: () = assert!(
    kernel_abi::kernel::str_eq(PROJ_VARIANTS[0].kernel.name, "mhc_fwd_proj_n4_c2s3")
        && kernel_abi::kernel::str_eq(PROJ_VARIANTS[1].kernel.name, "mhc_fwd_proj_n4_c4s3")
        && kernel_abi::kernel::str_eq(PROJ_VARIANTS[2].kernel.name, "mhc_fwd_proj_n4_c8s2")
);

/// Unpack a bf16 pair (low half first) to f32.
#[inline(always)]
fn unpack(w: u32) -> [f32; 2] {
    let (lo, hi) = crate::arch::convert::unpack_bf16x2(w);
    [lo, hi]
}

/// Split two f32 into bf16 `hi` pairs and `lo = bf16(v - hi)` pairs (packed low first): `v` is
/// `hi + lo` to within `2^-17 |v|`, so two bf16 products carry f32-like precision.
#[inline(always)]
fn split_pair(a: f32, b: f32) -> (u32, u32) {
    use crate::arch::convert::{pack_bf16x2, unpack_bf16x2};
    let hi = pack_bf16x2(a, b);
    let (ha, hb) = unpack_bf16x2(hi);
    (hi, pack_bf16x2(a - ha, b - hb))
}
