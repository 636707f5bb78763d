//! The FP8 forward's entries: `attention_fwd_hopper_fp8_d{128,256}` (the Hopper forward's body,
//! [`super::forward`], with e4m3 Q, K and `V^T`, `wgmma` k32 products and bf16 output) and
//! `attention_fwd_hopper_fp8_vt`, the transpose of V into the key-permuted `V^T` those kernels
//! read ([`kernel_abi::attention::fp8`] documents the layout and why).

use super::super::elem::Bf16;
use crate::arch::{global, index, wgmma};
use crate::tensor_map_ptr;
use kernel_abi::attention::fp8::{
    FP8_VT_GROUP, Fp8VtParams, fp8_config_of, fp8_vt_groups_per_block, fp8_vt_key,
};
use kernel_abi::attention::{HopperConfig, HopperParams};

/// An FP8 forward entry of head dimension `$d`: S = Q K^T with `m64n128k32` (steps of 128 keys),
/// O += P V with `$o_mma` (`m64n{D}k32`, P from registers) and its accumulators' fence.
macro_rules! fp8_kernel {
    ($name:expr, $d:literal, $o_mma:ident, $o_fence:ident) => {
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
                const CFG: HopperConfig = fp8_config_of($d);
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
    128,
    m64n128k32_e4m3_rs,
    fence_operands_64
);
fp8_kernel!(
    "attention_fwd_hopper_fp8_d256",
    256,
    m64n256k32_e4m3_rs,
    fence_operands_128
);

/// V `[batch, seq_k, heads_kv, D]` to `V^T` `[batch, heads_kv, D, seq_pad]`, keys permuted within
/// each group of 16 (`fp8_vt_key`) and zeros past `seq_k`. Thread `tid` of block `(x, h, b)`
/// takes columns `4 (tid % (D / 4)) ..+ 4` of key group `x * groups_per_block + tid / (D / 4)`:
/// 16 loads of 4 bytes (consecutive threads read consecutive bytes of a row), 4 stores of 16.
///
/// # Safety
/// Grid and block as documented on `FP8_VT_KERNEL`; `Fp8VtParams` as documented (V's rows in
/// bounds and 4-byte aligned, `vt` 16-byte aligned with `batch * heads_kv * D * seq_pad` bytes,
/// `seq_pad` a multiple of 16, D one of `FP8_HEAD_DIMS`), V and `V^T` disjoint.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_fwd_hopper_fp8_vt(p: Fp8VtParams) {
    crate::launch_bounds!(attention_fwd_hopper_fp8_vt in kernel_abi::attention::KERNELS);
    let d = p.head_dim;
    let quads = d / 4;
    let tid = index::thread_idx_x();
    let group = index::block_idx_x() * fp8_vt_groups_per_block(d) + tid / quads;
    let quad = tid % quads;
    let (h, b) = (index::block_idx_y(), index::block_idx_z());
    if group * FP8_VT_GROUP >= p.seq_pad {
        return;
    }
    let row0 =
        p.v.wrapping_add((b as u64 * p.v_strides[0] + h as u64 * p.v_strides[2]) as usize)
            .wrapping_add(4 * quad as usize);
    let mut w = [0u32; FP8_VT_GROUP as usize];
    for (k, word) in w.iter_mut().enumerate() {
        let key = group * FP8_VT_GROUP + k as u32;
        if key < p.seq_k {
            // SAFETY: key < seq_k, column 4 quad + 3 < D: inside V; 4-byte aligned (the
            // host's contract).
            *word = unsafe {
                *(row0.wrapping_add((key as u64 * p.v_strides[1]) as usize) as *const u32)
            };
        }
    }
    let out_base =
        p.vt.wrapping_add(((b * p.heads_kv + h) as u64 * d as u64 * p.seq_pad as u64) as usize);
    for j in 0..4u32 {
        let mut out = [0u32; 4];
        for pos in 0..FP8_VT_GROUP {
            let byte = (w[fp8_vt_key(pos) as usize] >> (8 * j)) & 0xff;
            out[(pos / 4) as usize] |= byte << (8 * (pos % 4));
        }
        let col = 4 * quad + j;
        let dst = out_base
            .wrapping_add((col as u64 * p.seq_pad as u64 + (group * FP8_VT_GROUP) as u64) as usize);
        // SAFETY: row `col < D` of (b, h), keys `16 group ..+ 16 <= seq_pad`: inside `V^T`;
        // 16-byte aligned (aligned base, `seq_pad` a multiple of 16); each thread writes its
        // own 16 bytes.
        unsafe { global::store_v4(dst as *mut u32, out) };
    }
}
