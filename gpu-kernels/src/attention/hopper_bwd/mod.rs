//! The attention backward on Hopper (sm_90a): TMA, mbarrier rings, `wgmma` and warp
//! specialization, kernels per element type and head dimension (64, 96, 128; the dK/dV/dQ
//! kernel at 64, 128 and 256), launched after the `mma.sync` path's preprocess (`delta'`, and the
//! zeroed accumulator). D = 96 is one and a half column blocks, the second half zero-filled by
//! TMA as in the forward. A head dimension without kernels of its own runs those of the next
//! one above it (a padded plan): below 128 (32, 48, 80, 112) the dK/dV and dQ kernels, from 144
//! to 240 the D 256 dK/dV/dQ kernel (its accumulator rows 256 wide). The tensor maps describe
//! the tensors' columns, TMA fills the rest of the tiles with zeros (the products are the
//! tensors'), and the stores and the conversion skip the columns past the tensors' head
//! dimension:
//!
//! - [`dkdv`]: `attention_bwd_hopper_dkdv_*`, one block per 128 keys, dK and dV in registers
//!   over the query blocks that see the keys;
//! - [`dq`]: `attention_bwd_hopper_dq_*`, one block per 128 query rows, dQ in registers over
//!   the key blocks the rows see (no atomics: with the dK/dV kernel, the deterministic mode);
//! - `attention_bwd_hopper_dkdvq_*` ([`dkdv`] with `FUSED`): dK, dV and each step's dQ, added
//!   into the tiled f32 accumulator by bulk reduce-adds, then [`convert`]
//!   (`attention_bwd_hopper_dq_convert_*`) scales it into dQ (both modes; in deterministic
//!   mode the additions ordered).
//! - `attention_bwd_hopper_dkdvq_varlen_*` and `attention_bwd_hopper_dq_convert_varlen_*`: the
//!   same over packed sequences (`cu_seqlens`), at D 64, 128 and 256 (with [`wide`]'s body).
//!
//! The `*_softcap_*` kernels are the same bodies with the softcap's logit and derivative
//! (`super::logits::backward_logit`).
//!
//! Both have one producer warpgroup (thread 0 issues the TMA loads) and two consumer
//! warpgroups of 64 rows each (keys for dK/dV, queries for dQ); each file documents its
//! products, thread mapping and barrier protocol. Parameters:
//! [`HopperBwdParams`](kernel_abi::attention::hopper_bwd::HopperBwdParams) (tensor maps of Q,
//! dO, K, V with the box rows of the kernel's tiles, then the `mma.sync` backward's parameters
//! and the tensors' head dimension).

mod convert;
mod dkdv;
mod dq;
mod producer;
mod wide;

use super::backward::layout::{Dense, Packed};
use super::elem::{Bf16, F16};
use crate::arch::{math, wgmma};
use crate::tensor_map_ptr;
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::attention::HOPPER_CONSUMERS;
use kernel_abi::attention::backward::{AttentionBwdParams, AttentionBwdVarlenParams};
use kernel_abi::attention::hopper_bwd::{
    HopperBwdConfig, HopperBwdParams, HopperDqConfig, hopper_bwd_config_of, hopper_dkdvq_config,
};

/// Consumer warps arriving on an `empty` barrier per phase (dQ: lane 0 of each).
const CONSUMER_WARPS: u32 = HOPPER_CONSUMERS * WARPGROUP_SIZE / 32;
/// Consumer threads arriving on an `empty` barrier per phase (dK/dV: every lane, each one
/// releasing its own reads of the stage's row values).
const CONSUMER_THREADS: u32 = HOPPER_CONSUMERS * WARPGROUP_SIZE;
/// Named barrier of the two consumers' `dS^T` (and `P^T`) stores (dK/dV/dQ kernels).
const DS_BARRIER: u32 = 1;
/// Accumulator registers of the dQ kernel's 64 x 64 products (`S`, `dP`).
const SR: usize = 32;

/// The softcap's derivative `1 - t^2` at the logit `t` of the probability `p = 2^(t scale_log2
/// - lse2)` (`inv_scale_log2 = 1 / scale_log2`): `t = (log2 p + lse2) / scale_log2`, clamped
/// to `[-1, 1]`; 0 where `p` is 0 (a masked key, or a row without keys whose `lse2` is +inf),
/// so that no infinity or NaN reaches `dS`. For a kernel that keeps P but not `t` across its
/// products (the dK/dV kernel's `P^T`).
#[inline(always)]
fn softcap_grad_of_p(p: f32, lse2: f32, inv_scale_log2: f32) -> f32 {
    if p > 0.0 {
        let t = ((math::log2(p) + lse2) * inv_scale_log2).clamp(-1.0, 1.0);
        math::fma(-t, t, 1.0)
    } else {
        0.0
    }
}

/// The tensor maps of Q, dO, K and V in kernel `$kernel`'s parameters.
macro_rules! bwd_tmaps {
    (name = $kernel:expr) => {
        [
            tensor_map_ptr!(name = $kernel, 0, HopperBwdParams, tmap_q),
            tensor_map_ptr!(name = $kernel, 0, HopperBwdParams, tmap_do),
            tensor_map_ptr!(name = $kernel, 0, HopperBwdParams, tmap_k),
            tensor_map_ptr!(name = $kernel, 0, HopperBwdParams, tmap_v),
        ]
    };
}

macro_rules! hopper_bwd_kernels {
    // The dK/dV and dQ kernels, and with `fused: [..]` the dK/dV/dQ kernel.
    (
        $elem:ident, $d:literal, [$dkdv:literal, $dq:literal], $softcap:literal,
        $s_zero:ident, $s_mma:ident, $g_mma:ident, $g_fence:ident
        $(, fused: [
            $fused:literal, $fused_varlen:literal, $fs_zero:ident, $fs_mma:ident,
            $fs_fence:ident, $q_zero:ident, $q_mma:ident, $q_fence:ident
        ])?
    ) => {
        const _: () = {
            /// Accumulator registers of a consumer's dQ in the dK/dV/dQ kernel (`D BM / 256`).
            const QR: usize =
                ($d * hopper_dkdvq_config($d, $softcap).block_m / 256) as usize;
            hopper_bwd_kernels!(@products $d $(, $q_zero, $q_mma, $q_fence)?);
            $(hopper_bwd_kernels!(@dkdv $fused, true, false, $elem, $d, $softcap,
                $fs_zero, $fs_mma, $fs_fence, $g_mma, $g_fence);
            hopper_bwd_kernels!(@dkdv $fused_varlen, true, true, $elem, $d, $softcap,
                $fs_zero, $fs_mma, $fs_fence, $g_mma, $g_fence);)?
            hopper_bwd_kernels!(@dkdv $dkdv, false, false, $elem, $d, $softcap,
                $s_zero, $s_mma, fence_operands_32, $g_mma, $g_fence);
            hopper_bwd_kernels!(@dq $dq, $elem, $d, $softcap, $s_zero, $s_mma, $g_mma, $g_fence);
        };
    };
    (@products $d:literal, $q_zero:ident, $q_mma:ident, $q_fence:ident) => {
        hopper_bwd_kernels!(@products_fn $d,
            |acc: &mut [f32; QR], a, b| {
                // SAFETY: called by the kernel body under the `wgmma` contract (whole
                // warpgroup, uniform control flow, operands published).
                unsafe { wgmma::$q_zero::<1, 1>(acc, a, b) }
            },
            |acc: &mut [f32; QR], a, b| {
                // SAFETY: as for the first product.
                unsafe { wgmma::$q_mma::<1, 1, true>(acc, a, b) }
            },
            wgmma::$q_fence
        );
    };
    // No dK/dV/dQ kernel: the dK/dV kernel never calls the products.
    (@products $d:literal) => {
        hopper_bwd_kernels!(@products_fn $d,
            |_: &mut [f32; QR], _, _| {},
            |_: &mut [f32; QR], _, _| {},
            |_: &mut [f32; QR]| {}
        );
    };
    (@products_fn $d:literal, $first:expr, $rest:expr, $fence:expr) => {
        /// The dQ products of the dK/dV/dQ kernel (the dK/dV kernel never calls them).
        fn dq_products() -> dkdv::DqProducts<
            impl Fn(&mut [f32; QR], wgmma::Descriptor, wgmma::Descriptor),
            impl Fn(&mut [f32; QR], wgmma::Descriptor, wgmma::Descriptor),
            impl Fn(&mut [f32; QR]),
        > {
            dkdv::DqProducts {
                first: $first,
                rest: $rest,
                fence: $fence,
            }
        }
    };
    (@dkdv $name:literal, $fused:literal, $varlen:literal, $elem:ident, $d:literal,
        $softcap:literal, $s_zero:ident, $s_mma:ident, $s_fence:ident, $g_mma:ident,
        $g_fence:ident) => {
        const _: () = {
            /// The dK/dV kernel ([`dkdv`]; element type and head dimension in the name), or
            /// with `FUSED` the dK/dV/dQ kernel (dQ by bulk reduce-adds), dense or over packed
            /// sequences (`_varlen_`).
            ///
            /// # Safety
            /// Grid `(ceil(seq_k / 128), heads_kv, batch)`, `HOPPER_THREADS` threads, the
            /// configuration's shared memory, parameters as documented on [`HopperBwdParams`]
            /// (validated by the host), after the backward's preprocess; with `FUSED`, the
            /// tiled dQ accumulator (`dq_accum_len` elements, zeroed by the preprocess).
            #[unsafe(export_name = $name)]
            pub unsafe extern "ptx-kernel" fn kernel(p: HopperBwdParams) {
                const CFG: HopperBwdConfig = if $fused {
                    hopper_dkdvq_config($d, $softcap)
                } else {
                    hopper_bwd_config_of($d)
                };
                crate::launch_bounds!(name = $name, kernel_abi::attention::KERNELS);
                let tmaps = bwd_tmaps!(name = $name);
                const BM: u32 = CFG.block_m;
                // SAFETY: forwarded to the caller; the closures are the `wgmma` shapes of this
                // configuration, called by whole warpgroups in uniform control flow.
                unsafe {
                    dkdv::dkdv::<
                        $elem,
                        $d,
                        { $d / 2 },
                        { $d / 16 },
                        $softcap,
                        $fused,
                        BM,
                        { BM as usize / 2 },
                        { BM as usize / 16 },
                        QR,
                        $varlen,
                    >(
                        &p,
                        &CFG,
                        tmaps,
                        |acc, a, b| wgmma::$s_zero::<0, 0>(acc, a, b),
                        |acc, a, b| wgmma::$s_mma::<0, 0, true>(acc, a, b),
                        wgmma::$s_fence,
                        |acc, a, b| wgmma::$g_mma::<1, true>(acc, a, b),
                        wgmma::$g_fence,
                        dq_products(),
                    )
                }
            }
        };
    };
    (@dq $name:literal, $elem:ident, $d:literal, $softcap:literal,
        $s_zero:ident, $s_mma:ident, $g_mma:ident, $g_fence:ident) => {
        const _: () = {
            /// The dQ kernel ([`dq`]; element type and head dimension in the name).
            ///
            /// # Safety
            /// Grid `(ceil(seq_q / 128), heads_q, batch)`, `HOPPER_THREADS` threads, the
            /// configuration's shared memory, parameters as documented on [`HopperBwdParams`]
            /// (validated by the host), after the backward's preprocess.
            #[unsafe(export_name = $name)]
            pub unsafe extern "ptx-kernel" fn kernel(p: HopperBwdParams) {
                const CFG: HopperDqConfig = HopperDqConfig { head_dim: $d };
                crate::launch_bounds!(name = $name, kernel_abi::attention::KERNELS);
                let tmaps = bwd_tmaps!(name = $name);
                // SAFETY: as for the dK/dV kernel.
                unsafe {
                    dq::dq::<$elem, $d, { $d / 2 }, { $d / 16 }, $softcap>(
                        &p,
                        &CFG,
                        tmaps,
                        |acc, a, b| wgmma::$s_zero::<0, 0>(acc, a, b),
                        |acc, a, b| wgmma::$s_mma::<0, 0, true>(acc, a, b),
                        wgmma::fence_operands_32,
                        |acc, a, b| wgmma::$g_mma::<1, true>(acc, a, b),
                        wgmma::$g_fence,
                    )
                }
            }
        };
    };
}

/// The dK/dV/dQ kernel of a wide head ([`wide`]); with `negative: $table` the negative control
/// of that table (`EARLY_EMPTY`, see [`wide::wide`]).
macro_rules! hopper_bwd_wide {
    (
        [$name:literal, $varlen_name:literal], $elem:ident, $d:literal, $softcap:literal,
        $s_zero:ident, $s_mma:ident, $h_mma:ident, $h_zero:ident
    ) => {
        hopper_bwd_wide!(@kernel $name, $elem, $d, $softcap, false, false,
            kernel_abi::attention::KERNELS, $s_zero, $s_mma, $h_mma, $h_zero);
        hopper_bwd_wide!(@kernel $varlen_name, $elem, $d, $softcap, false, true,
            kernel_abi::attention::KERNELS, $s_zero, $s_mma, $h_mma, $h_zero);
    };
    (
        negative: $table:expr, $name:literal, $elem:ident, $d:literal, $softcap:literal,
        $s_zero:ident, $s_mma:ident, $h_mma:ident, $h_zero:ident
    ) => {
        hopper_bwd_wide!(@kernel $name, $elem, $d, $softcap, true, false, $table,
            $s_zero, $s_mma, $h_mma, $h_zero);
    };
    (
        @kernel $name:literal, $elem:ident, $d:literal, $softcap:literal, $early:literal,
        $varlen:literal, $table:expr, $s_zero:ident, $s_mma:ident, $h_mma:ident,
        $h_zero:ident
    ) => {
        const _: () = {
            /// The dK/dV/dQ kernel of a wide head ([`wide`]; element type and head dimension
            /// in the name), dense or over packed sequences (`_varlen_`).
            ///
            /// # Safety
            /// Grid `(ceil(seq_k / HOPPER_BWD_WIDE_BLOCK_N), heads_kv, batch)`,
            /// `HOPPER_THREADS` threads, the configuration's shared memory, parameters as
            /// documented on [`HopperBwdParams`] (validated by the host), after the backward's
            /// preprocess (which zeroes the tiled dQ accumulator).
            #[unsafe(export_name = $name)]
            pub unsafe extern "ptx-kernel" fn kernel(p: HopperBwdParams) {
                const CFG: HopperBwdConfig = hopper_dkdvq_config($d, $softcap);
                crate::launch_bounds!(name = $name, $table);
                let tmaps = bwd_tmaps!(name = $name);
                // SAFETY: forwarded to the caller; the closures are the `wgmma` shapes of this
                // configuration, called by whole warpgroups in uniform control flow.
                unsafe {
                    wide::wide::<$elem, $d, { $d / 4 }, { $d / 16 }, $softcap, $early, $varlen>(
                        &p,
                        &CFG,
                        tmaps,
                        |acc, a, b| wgmma::$s_zero::<0, 0>(acc, a, b),
                        |acc, a, b| wgmma::$s_mma::<0, 0, true>(acc, a, b),
                        wgmma::fence_operands_16,
                        |acc, a, b| wgmma::$h_mma::<0, 1, true>(acc, a, b),
                        |acc, a, b| wgmma::$h_zero::<1, 1>(acc, a, b),
                        |acc, a, b| wgmma::$h_mma::<1, 1, true>(acc, a, b),
                        wgmma::fence_operands_64,
                    )
                }
            }
        };
    };
}

/// The conversion of the tiled dQ accumulator ([`convert::convert`]) of one element type and
/// head dimension.
macro_rules! hopper_dq_convert {
    ($name:literal, $varlen_name:literal, $elem:ident, $d:literal) => {
        hopper_dq_convert!(@kernel $name, AttentionBwdParams, Dense, $elem, $d);
        hopper_dq_convert!(@kernel $varlen_name, AttentionBwdVarlenParams, Packed, $elem, $d);
    };
    (@kernel $name:literal, $params:ident, $layout:ident, $elem:ident, $d:literal) => {
        const _: () = {
            /// `dQ = scale accumulator` from the tiled layout (dense, or over packed
            /// sequences: `_varlen_`).
            ///
            /// # Safety
            /// Grid `(ceil(seq_q / HOPPER_DQ_TILE_ROWS), heads_q, batch)`,
            /// `HOPPER_DQ_CONVERT_THREADS` threads, after the dK/dV/dQ kernel, on parameters
            /// validated by the host (the tiled accumulator and dQ).
            #[unsafe(export_name = $name)]
            pub unsafe extern "ptx-kernel" fn convert_kernel(p: $params) {
                crate::launch_bounds!(name = $name, kernel_abi::attention::KERNELS);
                // SAFETY: forwarded to the caller.
                unsafe { convert::convert::<$layout, $elem, $d>(&p) }
            }
        };
    };
}

hopper_bwd_kernels!(
    Bf16,
    64,
    [
        "attention_bwd_hopper_dkdv_bf16_d64",
        "attention_bwd_hopper_dq_bf16_d64"
    ],
    false,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    m64n64k16_bf16_rs,
    fence_operands_32,
    fused: [
        "attention_bwd_hopper_dkdvq_bf16_d64",
        "attention_bwd_hopper_dkdvq_varlen_bf16_d64",
        m64n128k16_bf16_ss_zero,
        m64n128k16_bf16_ss,
        fence_operands_64,
        m64n64k16_bf16_ss_zero,
        m64n64k16_bf16_ss,
        fence_operands_32
    ]
);
hopper_bwd_kernels!(
    Bf16,
    96,
    [
        "attention_bwd_hopper_dkdv_bf16_d96",
        "attention_bwd_hopper_dq_bf16_d96"
    ],
    false,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    m64n96k16_bf16_rs,
    fence_operands_48
);
hopper_bwd_kernels!(
    Bf16,
    128,
    [
        "attention_bwd_hopper_dkdv_bf16_d128",
        "attention_bwd_hopper_dq_bf16_d128"
    ],
    false,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    m64n128k16_bf16_rs,
    fence_operands_64,
    fused: [
        "attention_bwd_hopper_dkdvq_bf16_d128",
        "attention_bwd_hopper_dkdvq_varlen_bf16_d128",
        m64n64k16_bf16_ss_zero,
        m64n64k16_bf16_ss,
        fence_operands_32,
        m64n64k16_bf16_ss_zero,
        m64n64k16_bf16_ss,
        fence_operands_32
    ]
);
hopper_bwd_kernels!(
    F16,
    64,
    [
        "attention_bwd_hopper_dkdv_f16_d64",
        "attention_bwd_hopper_dq_f16_d64"
    ],
    false,
    m64n64k16_f16_ss_zero,
    m64n64k16_f16_ss,
    m64n64k16_f16_rs,
    fence_operands_32,
    fused: [
        "attention_bwd_hopper_dkdvq_f16_d64",
        "attention_bwd_hopper_dkdvq_varlen_f16_d64",
        m64n128k16_f16_ss_zero,
        m64n128k16_f16_ss,
        fence_operands_64,
        m64n64k16_f16_ss_zero,
        m64n64k16_f16_ss,
        fence_operands_32
    ]
);
hopper_bwd_kernels!(
    F16,
    96,
    [
        "attention_bwd_hopper_dkdv_f16_d96",
        "attention_bwd_hopper_dq_f16_d96"
    ],
    false,
    m64n64k16_f16_ss_zero,
    m64n64k16_f16_ss,
    m64n96k16_f16_rs,
    fence_operands_48
);
hopper_bwd_kernels!(
    F16,
    128,
    [
        "attention_bwd_hopper_dkdv_f16_d128",
        "attention_bwd_hopper_dq_f16_d128"
    ],
    false,
    m64n64k16_f16_ss_zero,
    m64n64k16_f16_ss,
    m64n128k16_f16_rs,
    fence_operands_64,
    fused: [
        "attention_bwd_hopper_dkdvq_f16_d128",
        "attention_bwd_hopper_dkdvq_varlen_f16_d128",
        m64n64k16_f16_ss_zero,
        m64n64k16_f16_ss,
        fence_operands_32,
        m64n64k16_f16_ss_zero,
        m64n64k16_f16_ss,
        fence_operands_32
    ]
);
hopper_bwd_kernels!(
    Bf16,
    64,
    [
        "attention_bwd_hopper_dkdv_softcap_bf16_d64",
        "attention_bwd_hopper_dq_softcap_bf16_d64"
    ],
    true,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    m64n64k16_bf16_rs,
    fence_operands_32,
    fused: [
        "attention_bwd_hopper_dkdvq_softcap_bf16_d64",
        "attention_bwd_hopper_dkdvq_varlen_softcap_bf16_d64",
        m64n64k16_bf16_ss_zero,
        m64n64k16_bf16_ss,
        fence_operands_32,
        m64n32k16_bf16_ss_zero,
        m64n32k16_bf16_ss,
        fence_operands_16
    ]
);
hopper_bwd_kernels!(
    Bf16,
    96,
    [
        "attention_bwd_hopper_dkdv_softcap_bf16_d96",
        "attention_bwd_hopper_dq_softcap_bf16_d96"
    ],
    true,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    m64n96k16_bf16_rs,
    fence_operands_48
);
hopper_bwd_kernels!(
    Bf16,
    128,
    [
        "attention_bwd_hopper_dkdv_softcap_bf16_d128",
        "attention_bwd_hopper_dq_softcap_bf16_d128"
    ],
    true,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    m64n128k16_bf16_rs,
    fence_operands_64,
    fused: [
        "attention_bwd_hopper_dkdvq_softcap_bf16_d128",
        "attention_bwd_hopper_dkdvq_varlen_softcap_bf16_d128",
        m64n64k16_bf16_ss_zero,
        m64n64k16_bf16_ss,
        fence_operands_32,
        m64n64k16_bf16_ss_zero,
        m64n64k16_bf16_ss,
        fence_operands_32
    ]
);
hopper_bwd_kernels!(
    F16,
    64,
    [
        "attention_bwd_hopper_dkdv_softcap_f16_d64",
        "attention_bwd_hopper_dq_softcap_f16_d64"
    ],
    true,
    m64n64k16_f16_ss_zero,
    m64n64k16_f16_ss,
    m64n64k16_f16_rs,
    fence_operands_32,
    fused: [
        "attention_bwd_hopper_dkdvq_softcap_f16_d64",
        "attention_bwd_hopper_dkdvq_varlen_softcap_f16_d64",
        m64n64k16_f16_ss_zero,
        m64n64k16_f16_ss,
        fence_operands_32,
        m64n32k16_f16_ss_zero,
        m64n32k16_f16_ss,
        fence_operands_16
    ]
);
hopper_bwd_kernels!(
    F16,
    96,
    [
        "attention_bwd_hopper_dkdv_softcap_f16_d96",
        "attention_bwd_hopper_dq_softcap_f16_d96"
    ],
    true,
    m64n64k16_f16_ss_zero,
    m64n64k16_f16_ss,
    m64n96k16_f16_rs,
    fence_operands_48
);
hopper_bwd_kernels!(
    F16,
    128,
    [
        "attention_bwd_hopper_dkdv_softcap_f16_d128",
        "attention_bwd_hopper_dq_softcap_f16_d128"
    ],
    true,
    m64n64k16_f16_ss_zero,
    m64n64k16_f16_ss,
    m64n128k16_f16_rs,
    fence_operands_64,
    fused: [
        "attention_bwd_hopper_dkdvq_softcap_f16_d128",
        "attention_bwd_hopper_dkdvq_varlen_softcap_f16_d128",
        m64n64k16_f16_ss_zero,
        m64n64k16_f16_ss,
        fence_operands_32,
        m64n64k16_f16_ss_zero,
        m64n64k16_f16_ss,
        fence_operands_32
    ]
);
hopper_bwd_wide!(
    [
        "attention_bwd_hopper_dkdvq_bf16_d256",
        "attention_bwd_hopper_dkdvq_varlen_bf16_d256"
    ],
    Bf16,
    256,
    false,
    m64n32k16_bf16_ss_zero,
    m64n32k16_bf16_ss,
    m64n128k16_bf16_ss,
    m64n128k16_bf16_ss_zero
);
hopper_bwd_wide!(
    [
        "attention_bwd_hopper_dkdvq_f16_d256",
        "attention_bwd_hopper_dkdvq_varlen_f16_d256"
    ],
    F16,
    256,
    false,
    m64n32k16_f16_ss_zero,
    m64n32k16_f16_ss,
    m64n128k16_f16_ss,
    m64n128k16_f16_ss_zero
);
hopper_bwd_wide!(
    [
        "attention_bwd_hopper_dkdvq_softcap_bf16_d256",
        "attention_bwd_hopper_dkdvq_varlen_softcap_bf16_d256"
    ],
    Bf16,
    256,
    true,
    m64n32k16_bf16_ss_zero,
    m64n32k16_bf16_ss,
    m64n128k16_bf16_ss,
    m64n128k16_bf16_ss_zero
);
hopper_bwd_wide!(
    [
        "attention_bwd_hopper_dkdvq_softcap_f16_d256",
        "attention_bwd_hopper_dkdvq_varlen_softcap_f16_d256"
    ],
    F16,
    256,
    true,
    m64n32k16_f16_ss_zero,
    m64n32k16_f16_ss,
    m64n128k16_f16_ss,
    m64n128k16_f16_ss_zero
);
hopper_bwd_wide!(
    negative: kernel_abi::attention::backward::NEGATIVE,
    "negative_attention_bwd_hopper_early_empty",
    Bf16,
    256,
    false,
    m64n32k16_bf16_ss_zero,
    m64n32k16_bf16_ss,
    m64n128k16_bf16_ss,
    m64n128k16_bf16_ss_zero
);
hopper_dq_convert!(
    "attention_bwd_hopper_dq_convert_bf16_d64",
    "attention_bwd_hopper_dq_convert_varlen_bf16_d64",
    Bf16,
    64
);
hopper_dq_convert!(
    "attention_bwd_hopper_dq_convert_bf16_d128",
    "attention_bwd_hopper_dq_convert_varlen_bf16_d128",
    Bf16,
    128
);
hopper_dq_convert!(
    "attention_bwd_hopper_dq_convert_f16_d64",
    "attention_bwd_hopper_dq_convert_varlen_f16_d64",
    F16,
    64
);
hopper_dq_convert!(
    "attention_bwd_hopper_dq_convert_f16_d128",
    "attention_bwd_hopper_dq_convert_varlen_f16_d128",
    F16,
    128
);
hopper_dq_convert!(
    "attention_bwd_hopper_dq_convert_bf16_d256",
    "attention_bwd_hopper_dq_convert_varlen_bf16_d256",
    Bf16,
    256
);
hopper_dq_convert!(
    "attention_bwd_hopper_dq_convert_f16_d256",
    "attention_bwd_hopper_dq_convert_varlen_f16_d256",
    F16,
    256
);
