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

//! # Expected time at that shape (H200, copy ~4.2 TB/s; streaming kernels at ~3.9 TB/s)
//! Forward: `mhc_prep` ~10 us, projection 512 MB ~0.135 ms, coefficients ~10 us, `x_in`
//! 640 MB ~0.165 ms, `x_next` 1152 MB ~0.295 ms: ~0.62 ms for the 1.88 GB the forward must move
//! (3.0 TB/s, ~73% of copy; PyTorch eager measured 3.8 ms). Backward: `dH` and `dy` 1.41 GB
//! ~0.36 ms, coefficients ~15 us, `dx` 1.66 GB ~0.43-0.5 ms, weight gradient 512 MB ~0.135 ms,
//! finalize and prep ~20 us: ~1.0 ms. Forward + backward ~1.6-1.7 ms (eager 12.0 ms,
//! `torch.compile` 5.0 ms). Tensor-core work per forward + backward is ~100 GFLOP (split
//! operands and padding included), ~0.2 ms at `mma.sync` rates, hidden under the memory time.

mod apply;
mod coeff;
mod dh;
mod dx;
mod finalize;
mod prep;
mod proj;
mod wgrad;

use kernel_abi::mhc::*;

/// Declare kernels: the PTX entry point of each (its launch bounds: `threads`, and `min B`
/// resident blocks per SM where given, which caps registers so B blocks fit), and, in host
/// builds, the emulator's table of the same bodies.
macro_rules! kernels {
    ($( $name:ident ($params:ty), $threads:expr $(, min $min_blocks:expr)? => $body:expr; )*) => {
        $(
            /// A PTX entry point; see the module of its body for the kernel's documentation.
            ///
            /// # Safety
            /// The launch contract of its body (grid, block, shared memory, parameters).
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: $params) {
                crate::launch_bounds!($name, $threads, (1 $(* 0 + $min_blocks)?));
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
                threads: $threads,
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
    mhc_prep(PrepParams), PREP_THREADS => prep::run;

    mhc_fwd_proj_n2(ProjParams), PROJ_THREADS => proj::run::<2, 1, 2, { proj_config(2).stage_chunks }, { proj_config(2).stages }, { proj_config(2).stages - 2 }>;
    mhc_fwd_proj_n3(ProjParams), PROJ_THREADS => proj::run::<3, 2, 2, { proj_config(3).stage_chunks }, { proj_config(3).stages }, { proj_config(3).stages - 2 }>;
    mhc_fwd_proj_n4(ProjParams), PROJ_THREADS => proj::run::<4, 3, 2, { proj_config(4).stage_chunks }, { proj_config(4).stages }, { proj_config(4).stages - 2 }>;
    mhc_fwd_proj_n4_c2s3(ProjParams), PROJ_THREADS => proj::run::<4, 3, 2, { PROJ_VARIANTS[0].2.stage_chunks }, { PROJ_VARIANTS[0].2.stages }, { PROJ_VARIANTS[0].2.stages - 2 }>;
    mhc_fwd_proj_n4_c4s3(ProjParams), PROJ_THREADS => proj::run::<4, 3, 2, { PROJ_VARIANTS[1].2.stage_chunks }, { PROJ_VARIANTS[1].2.stages }, { PROJ_VARIANTS[1].2.stages - 2 }>;
    mhc_fwd_proj_n4_c8s2(ProjParams), PROJ_THREADS => proj::run::<4, 3, 2, { PROJ_VARIANTS[2].2.stage_chunks }, { PROJ_VARIANTS[2].2.stages }, { PROJ_VARIANTS[2].2.stages - 2 }>;
    mhc_fwd_proj_n5(ProjParams), PROJ_THREADS => proj::run::<5, 5, 2, { proj_config(5).stage_chunks }, { proj_config(5).stages }, { proj_config(5).stages - 2 }>;
    mhc_fwd_proj_n6(ProjParams), PROJ_THREADS => proj::run::<6, 6, 2, { proj_config(6).stage_chunks }, { proj_config(6).stages }, { proj_config(6).stages - 2 }>;
    mhc_fwd_proj_n7(ProjParams), PROJ_THREADS => proj::run::<7, 8, 2, { proj_config(7).stage_chunks }, { proj_config(7).stages }, { proj_config(7).stages - 2 }>;
    mhc_fwd_proj_n8(ProjParams), PROJ_THREADS => proj::run::<8, 10, 2, { proj_config(8).stage_chunks }, { proj_config(8).stages }, { proj_config(8).stages - 2 }>;

    mhc_fwd_coeff(FwdCoeffParams), COEFF_THREADS => coeff::forward;

    mhc_fwd_pre_n2(PreParams), APPLY_THREADS => apply::pre::<2>;
    mhc_fwd_pre_n3(PreParams), APPLY_THREADS => apply::pre::<3>;
    mhc_fwd_pre_n4(PreParams), APPLY_THREADS => apply::pre::<4>;
    mhc_fwd_pre_n5(PreParams), APPLY_THREADS => apply::pre::<5>;
    mhc_fwd_pre_n6(PreParams), APPLY_THREADS => apply::pre::<6>;
    mhc_fwd_pre_n7(PreParams), APPLY_THREADS => apply::pre::<7>;
    mhc_fwd_pre_n8(PreParams), APPLY_THREADS => apply::pre::<8>;

    mhc_fwd_post_n2(PostParams), APPLY_THREADS, min 3 => apply::post::<2>;
    mhc_fwd_post_n3(PostParams), APPLY_THREADS, min 3 => apply::post::<3>;
    mhc_fwd_post_n4(PostParams), APPLY_THREADS, min 3 => apply::post::<4>;
    mhc_fwd_post_n5(PostParams), APPLY_THREADS => apply::post::<5>;
    mhc_fwd_post_n6(PostParams), APPLY_THREADS => apply::post::<6>;
    mhc_fwd_post_n7(PostParams), APPLY_THREADS => apply::post::<7>;
    mhc_fwd_post_n8(PostParams), APPLY_THREADS => apply::post::<8>;

    mhc_bwd_dh_n2(DhParams), DH_THREADS => dh::run::<2>;
    mhc_bwd_dh_n3(DhParams), DH_THREADS => dh::run::<3>;
    mhc_bwd_dh_n4(DhParams), DH_THREADS => dh::run::<4>;
    mhc_bwd_dh_n5(DhParams), DH_THREADS => dh::run::<5>;
    mhc_bwd_dh_n6(DhParams), DH_THREADS => dh::run::<6>;
    mhc_bwd_dh_n7(DhParams), DH_THREADS => dh::run::<7>;
    mhc_bwd_dh_n8(DhParams), DH_THREADS => dh::run::<8>;

    mhc_bwd_coeff(BwdCoeffParams), COEFF_THREADS => coeff::backward;

    mhc_bwd_dx_n2(DxParams), DX_THREADS => dx::run::<2, 1>;
    mhc_bwd_dx_n3(DxParams), DX_THREADS => dx::run::<3, 1>;
    mhc_bwd_dx_n4(DxParams), DX_THREADS => dx::run::<4, 2>;
    mhc_bwd_dx_n5(DxParams), DX_THREADS => dx::run::<5, 3>;
    mhc_bwd_dx_n6(DxParams), DX_THREADS => dx::run::<6, 3>;
    mhc_bwd_dx_n7(DxParams), DX_THREADS => dx::run::<7, 4>;
    mhc_bwd_dx_n8(DxParams), DX_THREADS => dx::run::<8, 5>;

    mhc_bwd_wgrad_n2(WgradParams), WG_THREADS => wgrad::run::<2, 1, 4>;
    mhc_bwd_wgrad_n3(WgradParams), WG_THREADS => wgrad::run::<3, 2, 4>;
    mhc_bwd_wgrad_n4(WgradParams), WG_THREADS => wgrad::run::<4, 3, 4>;
    mhc_bwd_wgrad_n5(WgradParams), WG_THREADS => wgrad::run::<5, 5, 2>;
    mhc_bwd_wgrad_n6(WgradParams), WG_THREADS => wgrad::run::<6, 6, 2>;
    mhc_bwd_wgrad_n7(WgradParams), WG_THREADS => wgrad::run::<7, 8, 2>;
    mhc_bwd_wgrad_n8(WgradParams), WG_THREADS => wgrad::run::<8, 10, 2>;

    mhc_bwd_finalize_n2(FinalizeParams), FIN_THREADS => finalize::run::<2, 8>;
    mhc_bwd_finalize_n3(FinalizeParams), FIN_THREADS => finalize::run::<3, 15>;
    mhc_bwd_finalize_n4(FinalizeParams), FIN_THREADS => finalize::run::<4, 24>;
    mhc_bwd_finalize_n5(FinalizeParams), FIN_THREADS => finalize::run::<5, 35>;
    mhc_bwd_finalize_n6(FinalizeParams), FIN_THREADS => finalize::run::<6, 48>;
    mhc_bwd_finalize_n7(FinalizeParams), FIN_THREADS => finalize::run::<7, 63>;
    mhc_bwd_finalize_n8(FinalizeParams), FIN_THREADS => finalize::run::<8, 80>;
}

/// `a == b` at compile time.
const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The variant kernels above take their configuration by index: the names must match the table
// the host launches them by.
const _: () = assert!(
    str_eq(PROJ_VARIANTS[0].0, "c2s3")
        && str_eq(PROJ_VARIANTS[1].0, "c4s3")
        && str_eq(PROJ_VARIANTS[2].0, "c8s2")
        && PROJ_VARIANTS[0].1 == 4
        && PROJ_VARIANTS[1].1 == 4
        && PROJ_VARIANTS[2].1 == 4
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
