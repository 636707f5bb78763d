//! The FP8 forward's entries: `attention_fwd_hopper_fp8_d{128,256}` (the Hopper forward's body,
//! [`super::forward`], with e4m3 Q, K and `V^T`, `wgmma` k32 products and bf16 output) and
//! `attention_fwd_hopper_fp8_vt`, the transpose of V into the key-permuted `V^T` those kernels
//! read ([`kernel_abi::attention::fp8`] documents the layout and why).

use super::super::elem::Bf16;
use crate::arch::{global, index, wgmma};
use crate::tensor_map_ptr;
use kernel_abi::attention::fp8::{
    FP8_KERNELS, FP8_VT_COLUMNS, FP8_VT_GROUP, FP8_VT_THREADS, Fp8VtParams, fp8_vt_chunk_blocks,
    fp8_vt_key,
};
use kernel_abi::attention::{HopperConfig, HopperParams};

/// An FP8 forward entry of configuration `$cfg` (head dimension D): S = Q K^T with
/// `m64n128k32` (steps of 128 keys), O += P V with `$o_mma` (`m64n{D}k32`, P from registers)
/// and its accumulators' fence.
macro_rules! fp8_kernel {
    ($name:expr, $cfg:expr, $o_mma:ident, $o_fence:ident) => {
        const _: () = {
            /// See the module documentation.
            ///
            /// # Safety
            /// As the 16-bit Hopper entries (grid of any `blocks >= 1`, `HOPPER_THREADS`
            /// threads, the configuration's shared memory), with Q and K maps of e4m3 `[D,
            /// heads, seq, batch]` (box `[128, 1, rows, 1]`) and V's map of `V^T` `[seq_pad,
            /// D, heads_kv, batch]` (box `[128, D, 1, 1]`), all 128-byte swizzled; O bf16;
            /// parameters validated by the host.
            #[unsafe(export_name = $name)]
            pub unsafe extern "ptx-kernel" fn kernel(p: HopperParams) {
                const CFG: HopperConfig = $cfg;
                crate::launch_bounds!(name = $name, kernel_abi::attention::KERNELS);
                let tmaps = [
                    tensor_map_ptr!(name = $name, 0, HopperParams, tmap_q),
                    tensor_map_ptr!(name = $name, 0, HopperParams, tmap_k),
                    tensor_map_ptr!(name = $name, 0, HopperParams, tmap_v),
                ];
                // SAFETY: forwarded to the caller; the closures are the FP8 `wgmma` shapes of
                // this configuration, called by whole warpgroups in uniform control flow.
                unsafe {
                    super::forward::<
                        Bf16,
                        { CFG.head_dim },
                        { CFG.value_dim },
                        { CFG.block_n },
                        { CFG.stages },
                        { (CFG.block_n / 2) as usize },
                        { (CFG.head_dim / 2) as usize },
                        { (CFG.block_n / 8) as usize },
                        { (CFG.block_n / 32) as usize },
                        { (CFG.head_dim / 32) as usize },
                        { CFG.overlap },
                        { CFG.pingpong },
                        { CFG.softmax.code() },
                        false,
                        false,
                        true,
                        { CFG.grid.scheduled() },
                    >(
                        &p,
                        &CFG,
                        tmaps,
                        |acc, a, b| wgmma::m64n128k32_e4m3_ss_zero(acc, a, b),
                        |acc, a, b| wgmma::m64n128k32_e4m3_ss::<true>(acc, a, b),
                        |acc, a, b| wgmma::$o_mma::<true>(acc, a, b),
                        wgmma::fence_operands_64,
                        wgmma::$o_fence,
                    )
                }
            }
        };
    };
}

fp8_kernel!(
    "attention_fwd_hopper_fp8_d128",
    FP8_KERNELS[0].cfg,
    m64n128k32_e4m3_rs,
    fence_operands_64
);
fp8_kernel!(
    "attention_fwd_hopper_fp8_d256",
    FP8_KERNELS[1].cfg,
    m64n256k32_e4m3_rs,
    fence_operands_128
);
fp8_kernel!(
    "attention_fwd_hopper_fp8_d128_hpp",
    FP8_KERNELS[2].cfg,
    m64n128k32_e4m3_rs,
    fence_operands_64
);
fp8_kernel!(
    "attention_fwd_hopper_fp8_d128_hlazy",
    FP8_KERNELS[3].cfg,
    m64n128k32_e4m3_rs,
    fence_operands_64
);
fp8_kernel!(
    "attention_fwd_hopper_fp8_d256_hlazy",
    FP8_KERNELS[4].cfg,
    m64n256k32_e4m3_rs,
    fence_operands_128
);

/// V `[batch, seq_k, heads_kv, D]` to `V^T` `[batch, heads_kv, D, seq_pad]`, keys permuted within
/// each group of 16 (`fp8_vt_key`) and zeros past `seq_k`. Block `(x, h, z)`: batch
/// `z / chunk_blocks`, warp `w` the chunk of 16 columns `(z % chunk_blocks) 8 + w`, lane `l` the
/// key group `32 x + l`: 16 loads of 16 bytes (its keys' columns of the chunk), a 16 x 16 byte
/// transpose in registers, 16 stores of 16 bytes (the lanes of a warp store 512 consecutive
/// bytes of each row).
///
/// # Safety
/// Grid `fp8_vt_grid`, `FP8_VT_THREADS` threads; `Fp8VtParams` as documented (V's rows in
/// bounds and 16-byte aligned, `vt` 16-byte aligned with `batch * heads_kv * D * seq_pad`
/// bytes, `seq_pad` a multiple of 16, D one of `FP8_HEAD_DIMS`), V and `V^T` disjoint.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_fwd_hopper_fp8_vt(p: Fp8VtParams) {
    crate::launch_bounds!(attention_fwd_hopper_fp8_vt in kernel_abi::attention::KERNELS);
    let d = p.head_dim;
    let chunk_blocks = fp8_vt_chunk_blocks(d);
    let z = index::block_idx_z();
    let (b, h) = (z / chunk_blocks, index::block_idx_y());
    let chunk = (z % chunk_blocks) * (FP8_VT_THREADS / 32) + index::warp_id();
    let group = index::block_idx_x() * 32 + index::lane_id();
    let col0 = chunk * FP8_VT_COLUMNS;
    if group * FP8_VT_GROUP >= p.seq_pad || col0 >= d {
        return;
    }
    let row0 =
        p.v.wrapping_add((b as u64 * p.v_strides[0] + h as u64 * p.v_strides[2]) as usize)
            .wrapping_add(col0 as usize);
    let mut w = [[0u32; 4]; FP8_VT_GROUP as usize];
    for (k, words) in w.iter_mut().enumerate() {
        let key = group * FP8_VT_GROUP + k as u32;
        if key < p.seq_k {
            // SAFETY: key < seq_k, columns col0 ..+ 16 <= D: inside V; 16-byte aligned (V's
            // rows and strides are, col0 is a multiple of 16); V is not written.
            *words = unsafe {
                global::load_cg_v4(
                    row0.wrapping_add((key as u64 * p.v_strides[1]) as usize) as *const u32
                )
            };
        }
    }
    let out_base = p.vt.wrapping_add(
        (((b * p.heads_kv + h) as u64 * d as u64 + col0 as u64) * p.seq_pad as u64
            + (group * FP8_VT_GROUP) as u64) as usize,
    );
    for j in 0..FP8_VT_COLUMNS {
        let mut out = [0u32; 4];
        for pos in 0..FP8_VT_GROUP {
            let word = w[fp8_vt_key(pos) as usize][(j / 4) as usize];
            let byte = (word >> (8 * (j % 4))) & 0xff;
            out[(pos / 4) as usize] |= byte << (8 * (pos % 4));
        }
        let dst = out_base.wrapping_add((j as u64 * p.seq_pad as u64) as usize);
        // SAFETY: row `col0 + j < D` of (b, h), keys `16 group ..+ 16 <= seq_pad`: inside
        // `V^T`; 16-byte aligned (aligned base, `seq_pad` a multiple of 16); each lane writes
        // its own 16 bytes.
        unsafe { global::store_v4(dst as *mut u32, out) };
    }
}
