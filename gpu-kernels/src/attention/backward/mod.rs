//! Attention backward on `mma.sync` tensor cores (any GPU of compute capability >= 8.0; also
//! compiled for the CPU by the emulator), FlashAttention-2's structure: dQ, dK, dV of
//! `O = softmax(scale Q K^T + mask) V` given dO, the forward's O and LSE, and optionally dLSE.
//!
//! # Parameters
//! [`AttentionBwdParams`] (one struct for the five roles): the tensors with arbitrary batch,
//! sequence and head strides (head dimension contiguous, rows 16-byte aligned), LSE, dLSE and
//! the workspaces (`delta'`, the dQ accumulator), sizes, scale, window.
//! [`AttentionBwdVarlenParams`]: the same around packed `[total, heads, D]` tensors whose
//! sequences `cu_seqlens` marks; the `_varlen_` kernels run the same bodies on that layout
//! ([`layout`]).
//!
//! # Kernels (launched in this order by the host's plan)
//! - [`rows`]: `attention_bwd_pre_*`, `delta' = rowsum(dO O) - dLSE` and the accumulator
//!   zeroed;
//! - [`dkdv`]: `attention_bwd_*` (dK, dV and dQ by `red.global.add.f32`) and
//!   `attention_bwd_dkdv_*` (dK, dV; deterministic mode), one block per key block;
//! - [`rows`]: `attention_bwd_dq_convert_*`, dQ from the accumulator; or [`dq`]:
//!   `attention_bwd_dq_*`, dQ recomputed per query block (deterministic mode);
//! - with sinks, [`rows`]: `attention_bwd_dsinks` (`_varlen`), the sinks' gradient.
//!
//! Under a softcap, `attention_bwd_softcap_*`, `attention_bwd_dkdv_softcap_*` and
//! `attention_bwd_dq_softcap_*` replace the dK/dV and dQ kernels (the same bodies with the
//! softcap's logit and derivative, `super::logits::backward_logit`).
//!
//! Each file documents its kernels' tiling, thread mapping and barrier protocol; [`frag`] holds
//! the fragment products they share. The mask is the forward's ([`super::mask`]); a row whose
//! LSE is -inf (no allowed key) has P = 0 and contributes nothing, never NaN.

mod dkdv;
mod dq;
mod frag;
pub(super) mod layout;
mod rows;

use super::elem::{Bf16, F16};
use kernel_abi::attention::backward::{
    AttentionBwdParams, AttentionBwdVarlenParams, BwdTileConfig, DqTileConfig, bwd_tile_config_of,
    dq_tile_config_of,
};
use layout::{Dense, Packed};

/// The body of a dK/dV kernel in layout `$layout` for element type `$elem`, head dimension
/// `$d`, with (`true`) or without the dQ atomics, soft-capped logits if `$softcap`;
/// `$ds_barrier = false` only in the negative control.
macro_rules! dkdv_body {
    ($layout:ty, $p:expr, $elem:ty, $d:expr, $with_dq:expr, $softcap:expr) => {
        dkdv_body!($layout, $p, $elem, $d, $with_dq, true, $softcap)
    };
    ($layout:ty, $p:expr, $elem:ty, $d:expr, $with_dq:expr, $ds_barrier:expr, $softcap:expr) => {{
        const CFG: BwdTileConfig = bwd_tile_config_of($d);
        dkdv::dkdv::<
            $layout,
            $elem,
            { CFG.head_dim },
            { CFG.row_bytes() },
            { CFG.ds_row_bytes() },
            { CFG.block_n },
            { CFG.block_m },
            { (CFG.head_dim / 16) as usize },
            { (CFG.block_m / 8) as usize },
            { (CFG.block_m / 16) as usize },
            { (CFG.block_n / 16) as usize },
            { (CFG.warp_cols() / 8) as usize },
            { CFG.dq_tiles() as usize },
            { CFG.dq_tiles_rem() as usize },
            { CFG.threads() },
            $with_dq,
            $ds_barrier,
            $softcap,
        >(&$p, &CFG)
    }};
}

/// The body of the deterministic dQ kernel in layout `$layout` for element type `$elem`, head
/// dimension `$d`, soft-capped logits if `$softcap`.
macro_rules! dq_body {
    ($layout:ty, $p:expr, $elem:ty, $d:expr, $softcap:expr) => {{
        const CFG: DqTileConfig = dq_tile_config_of($d);
        dq::dq::<
            $layout,
            $elem,
            { CFG.head_dim },
            { kernel_abi::attention::tile_config_of($d).row_bytes() },
            { CFG.block_m },
            { CFG.block_n },
            { (CFG.head_dim / 16) as usize },
            { (CFG.head_dim / 8) as usize },
            { (CFG.block_n / 8) as usize },
            { (CFG.block_n / 16) as usize },
            { CFG.threads() },
            $softcap,
        >(&$p, &CFG)
    }};
}

/// Declare the kernels on parameters `$params`: the PTX entry points (with their launch bounds)
/// and, in host builds, the emulator's table `$table` of the same bodies. Each line: entry
/// name, threads, body on `$p`.
macro_rules! backward_kernels {
    ($table:ident, $params:ty; $( $name:expr, $threads:expr, |$p:ident| $body:expr; )*) => {
        $(
            #[cfg(target_arch = "nvptx64")]
            const _: () = {
                /// See the module documentation (the role and configuration named in the macro
                /// call).
                ///
                /// # Safety
                /// Launched with the grid, threads and shared memory of its handle in
                /// `kernel_abi::attention::backward::BWD_KERNELS` (or `BWD_VARLEN_KERNELS`), in
                /// the order of the host's plan, on parameters satisfying their type's contract
                /// (validated by the host).
                #[unsafe(export_name = $name)]
                pub unsafe extern "ptx-kernel" fn kernel($p: $params) {
                    crate::launch_bounds!(name = $name, kernel_abi::attention::KERNELS);
                    // SAFETY: forwarded to the caller.
                    unsafe { $body }
                }
            };
        )*

        /// Backward kernels, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: &[crate::emu::EmuKernel] = &[
            $(
                crate::emu::EmuKernel {
                    name: $name,
                    params: core::mem::size_of::<$params>(),
                    threads: $threads,
                    run: {
                        unsafe fn run(ptr: *const u8) {
                            // SAFETY: the emulator passes a parameter struct of this kernel's
                            // type (it checks the size), whose contract the caller upholds.
                            unsafe {
                                let $p = core::ptr::read_unaligned(ptr as *const $params);
                                $body
                            }
                        }
                        run
                    },
                },
            )*
        ];
    };
}

/// Threads of the preprocess and conversion kernels, and of the sinks gradient's (used by the
/// emulator's tables only).
#[cfg(not(target_arch = "nvptx64"))]
use kernel_abi::attention::backward::{DSINKS_THREADS, ROW_THREADS};

/// The eight kernels of each element type and head dimension in layout `$layout` (entry names
/// `attention_bwd_{role}{$infix}_{dtype}_d{D}`, the handles of
/// `kernel_abi::attention::backward::BWD_KERNELS` or `BWD_VARLEN_KERNELS`): preprocess,
/// conversion, dK/dV with dQ atomics, dK/dV, dQ, and the softcap forms of the last three; then
/// the layout's sinks gradient (`attention_bwd_dsinks{$infix}`).
macro_rules! backward_entries {
    ($table:ident, $params:ty, $layout:ty, $infix:literal; $($d:literal),*) => {
        backward_kernels! {
            $table, $params;
            $(
                concat!("attention_bwd_pre", $infix, "_bf16_d", $d), ROW_THREADS,
                    |p| rows::preprocess::<$layout, Bf16, $d>(&p);
                concat!("attention_bwd_pre", $infix, "_f16_d", $d), ROW_THREADS,
                    |p| rows::preprocess::<$layout, F16, $d>(&p);
                concat!("attention_bwd_dq_convert", $infix, "_bf16_d", $d), ROW_THREADS,
                    |p| rows::convert::<$layout, Bf16, $d>(&p);
                concat!("attention_bwd_dq_convert", $infix, "_f16_d", $d), ROW_THREADS,
                    |p| rows::convert::<$layout, F16, $d>(&p);
                concat!("attention_bwd", $infix, "_bf16_d", $d), bwd_tile_config_of($d).threads(),
                    |p| dkdv_body!($layout, p, Bf16, $d, true, false);
                concat!("attention_bwd", $infix, "_f16_d", $d), bwd_tile_config_of($d).threads(),
                    |p| dkdv_body!($layout, p, F16, $d, true, false);
                concat!("attention_bwd_dkdv", $infix, "_bf16_d", $d),
                    bwd_tile_config_of($d).threads(),
                    |p| dkdv_body!($layout, p, Bf16, $d, false, false);
                concat!("attention_bwd_dkdv", $infix, "_f16_d", $d),
                    bwd_tile_config_of($d).threads(),
                    |p| dkdv_body!($layout, p, F16, $d, false, false);
                concat!("attention_bwd_dq", $infix, "_bf16_d", $d), dq_tile_config_of($d).threads(),
                    |p| dq_body!($layout, p, Bf16, $d, false);
                concat!("attention_bwd_dq", $infix, "_f16_d", $d), dq_tile_config_of($d).threads(),
                    |p| dq_body!($layout, p, F16, $d, false);
                concat!("attention_bwd_softcap", $infix, "_bf16_d", $d),
                    bwd_tile_config_of($d).threads(),
                    |p| dkdv_body!($layout, p, Bf16, $d, true, true);
                concat!("attention_bwd_softcap", $infix, "_f16_d", $d),
                    bwd_tile_config_of($d).threads(),
                    |p| dkdv_body!($layout, p, F16, $d, true, true);
                concat!("attention_bwd_dkdv_softcap", $infix, "_bf16_d", $d),
                    bwd_tile_config_of($d).threads(),
                    |p| dkdv_body!($layout, p, Bf16, $d, false, true);
                concat!("attention_bwd_dkdv_softcap", $infix, "_f16_d", $d),
                    bwd_tile_config_of($d).threads(),
                    |p| dkdv_body!($layout, p, F16, $d, false, true);
                concat!("attention_bwd_dq_softcap", $infix, "_bf16_d", $d),
                    dq_tile_config_of($d).threads(),
                    |p| dq_body!($layout, p, Bf16, $d, true);
                concat!("attention_bwd_dq_softcap", $infix, "_f16_d", $d),
                    dq_tile_config_of($d).threads(),
                    |p| dq_body!($layout, p, F16, $d, true);
            )*
            concat!("attention_bwd_dsinks", $infix), DSINKS_THREADS,
                |p| rows::dsinks::<$layout>(&p);
        }
    };
}

/// The dense batches' kernels for every head dimension
/// ([`kernel_abi::with_attention_head_dims!`]).
macro_rules! dense_entries {
    ($($d:literal),*) => {
        backward_entries!(EMU_KERNELS, AttentionBwdParams, Dense, ""; $($d),*);
    };
}

/// The same over packed sequences (`kernel_abi::attention::backward::BWD_VARLEN_KERNELS`).
macro_rules! packed_entries {
    ($($d:literal),*) => {
        backward_entries!(
            VARLEN_EMU_KERNELS, AttentionBwdVarlenParams, Packed, "_varlen"; $($d),*
        );
    };
}

kernel_abi::with_attention_head_dims!(dense_entries!());
kernel_abi::with_attention_head_dims!(packed_entries!());

/// The body of the negative control `negative_attention_bwd_no_ds_barrier`
/// (`crate::negative`): `attention_bwd_bf16_d64` without barrier (B) of [`dkdv`]'s protocol.
///
/// # Safety
/// As for `attention_bwd_bf16_d64`; its dQ is undefined (a data race on shared memory).
#[inline(always)]
pub(crate) unsafe fn dkdv_dq_without_ds_barrier(p: &AttentionBwdParams) {
    // SAFETY: forwarded to the caller.
    unsafe { dkdv_body!(Dense, p, Bf16, 64, true, false, false) }
}

/// The negative control of the backward, for the CPU emulator (`crate::emu`).
#[cfg(not(target_arch = "nvptx64"))]
pub const NEGATIVE_EMU_KERNELS: &[crate::emu::EmuKernel] = &[crate::emu::EmuKernel {
    name: kernel_abi::attention::backward::NEGATIVE_ATTENTION_BWD_NO_DS_BARRIER.name,
    params: core::mem::size_of::<AttentionBwdParams>(),
    threads: kernel_abi::attention::backward::NEGATIVE_ATTENTION_BWD_NO_DS_BARRIER.threads,
    run: {
        unsafe fn run(ptr: *const u8) {
            // SAFETY: the emulator passes a parameter struct of this kernel's type (it checks
            // the size), whose contract the caller upholds.
            unsafe {
                dkdv_dq_without_ds_barrier(&core::ptr::read_unaligned(
                    ptr as *const AttentionBwdParams,
                ))
            }
        }
        run
    },
}];
