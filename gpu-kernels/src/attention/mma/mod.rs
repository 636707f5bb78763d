//! `attention_fwd_{bf16,f16}_d{D}`: fused attention forward, FlashAttention-2 style,
//! on `mma.sync` tensor cores (runs on any GPU of compute capability >= 8.0), and
//! `attention_fwd_varlen_{bf16,f16}_d{D}`, the same body over packed sequences (D every multiple
//! of 16 from 32 to 256, `kernel_abi::attention::HEAD_DIMS`); `..._d{D}_v{D_v}` for the pairs of
//! `kernel_abi::attention::VALUE_DIMS`, whose V and O have a head dimension `D_v` of their own
//! (their V tiles are `[block_n, D_v]`, O `D_v / 8` accumulators per m-tile).
//!
//! # Parameters
//! [`AttentionParams`]: Q, K, V, O with arbitrary batch/sequence/head strides (head dimension
//! contiguous, every row 16-byte aligned), LSE `[batch, heads_q, seq_q]` f32, sizes, the softmax
//! scale (times log2 e), the bottom-right-aligned window (`window_right = 0` is causal).
//! [`AttentionVarlenParams`]: the same around packed `[total, heads, D]` tensors whose sequences
//! `cu_seqlens_q`/`cu_seqlens_k` mark, LSE `[heads_q, total_q]`; the body reaches its rows
//! through a [`Layout`] ([`Dense`] or [`Packed`], `super::seq`), and under [`Packed`] a block
//! whose query block starts past its sequence's end returns before its first barrier (the grid
//! is sized for the longest sequence; the exit is uniform across the block).
//!
//! # Tiling
//! One block computes `block_m` = 128 query rows of one (batch or sequence, head), walking the keys its rows
//! may attend in steps of `block_n` through a `stages`-deep ring of K/V tiles in shared memory
//! ([`kernel_abi::attention::tile_config`] is the table, per head dimension). Blocks whose keys
//! all lie outside every row's window are skipped entirely (causal: the upper triangle). Rows
//! in shared memory are `D * 2 + 16` bytes: the padding puts consecutive rows 16 bytes apart
//! modulo 128, so the 8 rows an `ldmatrix` phase reads, and the 16-byte `cp.async` writes, hit
//! distinct bank groups, while offsets along a row stay compile-time constants (an XOR swizzle
//! would make them per-thread values, costing registers).
//!
//! # Thread mapping
//! `block_m / (16 warp_m_tiles)` warps; warp `w` owns `warp_m_tiles` m16 tiles of query rows
//! (rows `16 MT w .. 16 MT (w + 1)`): S = Q K^T in `block_n / 8` f32 accumulators per m-tile, the
//! online softmax on its rows (each row is held by the 4 lanes of a quad: max and sum reduce with
//! 2 shuffles), P converted in registers to the A fragments of O += P V (`D_v / 8` accumulators
//! per m-tile). Every K or V fragment a warp loads with `ldmatrix` feeds `warp_m_tiles` products,
//! which sets the shared-memory traffic per product (the bound of this design). Loads: every
//! thread issues an equal share of the 16-byte `cp.async` copies of each tile (every warp does
//! the same work; no warp specialization in this path).
//!
//! # Barrier protocol
//! Group accounting: the Q tile and K/V step 0 form `cp.async` group 0, steps `1 .. stages - 1`
//! one group each (a thread commits an empty group where there is no step), then one group per
//! loop iteration. At iteration `i`:
//! 1. `cp.async.wait_group(stages - 2)`: this thread's copies of step `i` (and Q) are complete.
//! 2. `sync_threads`: every thread's copies of step `i` are complete and visible to all; and
//!    every thread has finished iteration `i - 1`, i.e. its reads of stage `(i - 1) % stages`.
//! 3. Copies of step `i + stages - 1` are issued into stage `(i + stages - 1) % stages`, which
//!    is `(i - 1) % stages`: free by step 2.
//! 4. Compute from stage `i % stages` (and Q), reads only.
//!
//! Q's shared tile is written only by group 0 and never again. Registers hold everything else,
//! so no other barrier is needed. The block waits for all its copies before exiting.
//!
//! NaN safety: the rules of [`super::softmax`] (masked logits -inf, a row whose maximum is -inf
//! uses 0 as its reference); the output divides by the row sum only when it is positive (else
//! O = 0, LSE = -inf).
//!
//! # Files
//! - this file: the kernel body ([`forward`]: prologue, main loop, barriers) and the entry
//!   points (`attention_kernels!`), with the emulator's table of the same bodies;
//! - [`mainloop`]: the shared-memory tile layout and loads, S = Q K^T, the masks on the S
//!   fragments, O += P V;
//! - [`epilogue`]: O normalized and stored, LSE.
//!
//! The online softmax and the mask predicates are the family's ([`super::softmax`],
//! [`super::mask`]).

mod epilogue;
pub(super) mod mainloop;

use super::elem::{Bf16, Elem, F16};
use super::logits;
use super::seq::{Dense, Layout, Packed};
use super::softmax::{softmax_folded_p, softmax_folded_rescale, softmax_update};
use crate::arch::{cp_async, index, smem, sync};
use epilogue::store_output;
use kernel_abi::attention::{
    AttentionParams, AttentionVarlenParams, TUNING_VARIANTS, TileConfig, mma_value_config_of,
    tile_config_of,
};
use mainloop::{Warp, load_tile, mask, mask_and_scale, pv, q_fragment, qk};

/// The forward pass; see the module documentation. `MT` m16 tiles per warp, `DK = D / 16`
/// (the k-slices of S = Q K^T); `DV` the head dimension of V and O (D but for the pairs of
/// `kernel_abi::attention::VALUE_DIMS`), `DT = DV / 8` (O's n8 tiles), `DVK = DV / 16` (V's
/// column pairs of P V); `NT = BN / 8`, `NK = BN / 16`, `WAIT = STAGES - 2` (the `cp.async` groups
/// that may stay in flight), `SM` the softmax mode's code (`Softmax::code`).
///
/// # Safety
/// Launched as documented on [`AttentionParams`], with the tile configuration `cfg`, whose
/// fields the const parameters repeat.
#[inline(always)]
unsafe fn forward<
    L: Layout,
    E: Elem,
    const D: u32,
    const DV: u32,
    const MT: usize,
    const DT: usize,
    const DK: usize,
    const DVK: usize,
    const BM: u32,
    const BN: u32,
    const NT: usize,
    const NK: usize,
    const STAGES: u32,
    const WAIT: u32,
    const Q_REGS: bool,
    const PF: bool,
    const SM: u32,
    const THREADS: u32,
    const CAPSINK: bool,
>(
    pp: &L::Params,
    cfg: &TileConfig,
) {
    const { assert!(DT as u32 * 8 == DV && DK as u32 * 16 == D && DVK as u32 * 16 == DV) };
    const {
        assert!(
            NT as u32 * 8 == BN && NK as u32 * 16 == BN && BM / (16 * MT as u32) * 32 == THREADS
        )
    };
    const { assert!(STAGES >= 2 && WAIT == STAGES - 2) };
    let p = L::base(pp);
    let lane = index::lane_id();
    let m_block = if p.reverse_m != 0 {
        p.num_m_blocks - 1 - index::block_idx_x()
    } else {
        index::block_idx_x()
    };
    let (head, batch) = (index::block_idx_y(), index::block_idx_z());
    let head_kv = head / (p.heads_q / p.heads_kv);
    // SAFETY: the grid is (num_m_blocks, heads_q, batch) (the caller's contract).
    let seq = unsafe { L::locate(pp, batch, head, head_kv) };
    let m0 = m_block * BM;
    // Uniform across the block: every thread leaves before any barrier.
    if L::MAY_BE_PAST_END && m0 >= seq.seq_q(pp) {
        return;
    }
    let w = Warp {
        lane,
        g: lane / 4,
        t: lane % 4,
        warp_row: index::warp_id() * 16 * MT as u32,
        m0,
        rows_valid: (seq.seq_q(pp) - m0).min(BM),
        offset: seq.seq_k(pp) as i32 - seq.seq_q(pp) as i32,
        window_left: p.window_left,
        window_right: p.window_right,
        seq_k: seq.seq_k(pp) as i32,
        scale_log2: p.scale_log2,
    };

    // Keys any row of this block may attend: [n_lo, n_hi).
    let first_row = m0 as i64;
    let last_row = (m0 + w.rows_valid - 1) as i64;
    let offset = w.offset as i64;
    let n_lo = if p.window_left >= 0 {
        (first_row + offset - p.window_left as i64).max(0)
    } else {
        0
    };
    let n_hi = if p.window_right >= 0 {
        (last_row + offset + p.window_right as i64 + 1).min(seq.seq_k(pp) as i64)
    } else {
        seq.seq_k(pp) as i64
    };

    let mut o = [[[0.0f32; 4]; DT]; MT];
    let mut row_max = [[f32::NEG_INFINITY; 2]; MT];
    let mut row_sum = [[0.0f32; 2]; MT];

    if n_hi > n_lo {
        let q_base = p.q.wrapping_add(seq.q_offset(pp) as usize);
        let k_base = p.k.wrapping_add(seq.k_offset(pp) as usize);
        let v_base = p.v.wrapping_add(seq.v_offset(pp) as usize);
        let smem = smem::aligned_base();
        let q_s = smem + cfg.q_offset() as u32;
        // V as wide as K: the offsets of every kernel before the pairs (their PTX unchanged);
        // the pairs' V tiles have a width of their own.
        let k_s = |stage: u32| {
            smem + if DV == D {
                cfg.k_offset(stage)
            } else {
                cfg.pair_k_offset(stage)
            } as u32
        };
        let v_s = |stage: u32| {
            smem + if DV == D {
                cfg.v_offset(stage)
            } else {
                cfg.pair_v_offset(stage)
            } as u32
        };
        let nb_lo = (n_lo as u32) / BN;
        let steps = (n_hi as u32).div_ceil(BN) - nb_lo;
        let n0 = |step: u32| (nb_lo + step) * BN;
        let (ks, vs) = (p.k_strides[1], p.v_strides[1]);
        let load_kv = |step: u32, stage: u32| {
            let first = n0(step);
            let valid = (seq.seq_k(pp) - first).min(BN);
            load_tile::<D, BN, THREADS>(k_s(stage), k_base, first as u64 * ks, ks, valid);
            load_tile::<DV, BN, THREADS>(v_s(stage), v_base, first as u64 * vs, vs, valid);
        };

        // Prologue: Q and steps 0 .. STAGES - 2, one cp.async group each (empty past the end).
        let qs = p.q_strides[1];
        load_tile::<D, BM, THREADS>(q_s, q_base, m0 as u64 * qs, qs, w.rows_valid);
        for s in 0..STAGES - 1 {
            if s < steps {
                load_kv(s, s);
            }
            cp_async::commit_group();
        }
        let mut q_frag = [[[0u32; 4]; DK]; MT];

        {
            for step in 0..steps {
                cp_async::wait_group::<WAIT>();
                // SAFETY: barrier protocol step 2; every thread reaches it `steps` times.
                unsafe { sync::sync_threads() };
                let issue = step + STAGES - 1;
                if issue < steps {
                    load_kv(issue, issue % STAGES);
                }
                cp_async::commit_group();
                if Q_REGS && step == 0 {
                    for mt in 0..MT {
                        for kk in 0..DK {
                            q_frag[mt][kk] = q_fragment::<D>(&w, q_s, mt, kk);
                        }
                    }
                }
                let stage = step % STAGES;
                // SAFETY: the stage was published by the barrier of this iteration and is not
                // overwritten before the next one.
                let mut s =
                    unsafe { qk::<E, D, MT, DK, NT, NK, Q_REGS, PF>(&w, q_s, &q_frag, k_s(stage)) };
                if CAPSINK {
                    logits::softcap::<MT, NT>(&mut s, &p.logits);
                }
                if SM == 0 {
                    mask_and_scale::<MT, NT, BM, BN>(&w, &mut s, n0(step));
                    softmax_update::<MT, NT, DT>(&mut s, &mut o, &mut row_max, &mut row_sum);
                    // SAFETY: as for K above.
                    unsafe { pv::<E, DV, MT, DT, DVK, NT, NK, PF>(&w, &s, &mut o, v_s(stage)) };
                } else {
                    mask::<MT, NT, BM, BN>(&w, &mut s, n0(step));
                    let (m, l, c) = (&mut row_max, &mut row_sum, w.scale_log2);
                    let huge = softmax_folded_rescale::<MT, NT, DT>(&s, &mut o, m, l, c, SM == 2);
                    // The exponentials and P V in one basic block per branch, so that ptxas
                    // interleaves the MUFU and the tensor-core work.
                    if huge {
                        softmax_folded_p::<MT, NT, true>(&mut s, m, l, c);
                        // SAFETY: as for K above.
                        unsafe { pv::<E, DV, MT, DT, DVK, NT, NK, PF>(&w, &s, &mut o, v_s(stage)) };
                    } else {
                        softmax_folded_p::<MT, NT, false>(&mut s, m, l, c);
                        // SAFETY: as for K above.
                        unsafe { pv::<E, DV, MT, DT, DVK, NT, NK, PF>(&w, &s, &mut o, v_s(stage)) };
                    }
                }
            }
        }
        cp_async::wait_all();
    }
    let sink2 = if CAPSINK {
        // SAFETY: `sinks` is null or has `heads_q` values (the contract of the parameters).
        unsafe { logits::sink_log2(&p.logits, head) }
    } else {
        f32::NEG_INFINITY
    };
    store_output::<L, E, MT, DT, CAPSINK>(pp, &seq, &w, &o, &row_max, &row_sum, sink2);
}

/// The body of a kernel with element type `$elem` and tile configuration `$cfg` (a constant
/// expression) on the parameter struct `$p`.
macro_rules! attention_body {
    ($layout:ty, $p:expr, $elem:ty, $cfg:expr, $capsink:expr) => {{
        const CFG: kernel_abi::attention::TileConfig = $cfg;
        forward::<
            $layout,
            $elem,
            { CFG.head_dim },
            { CFG.value_dim },
            { CFG.warp_m_tiles as usize },
            { (CFG.value_dim / 8) as usize },
            { (CFG.head_dim / 16) as usize },
            { (CFG.value_dim / 16) as usize },
            { CFG.block_m },
            { CFG.block_n },
            { (CFG.block_n / 8) as usize },
            { (CFG.block_n / 16) as usize },
            { CFG.stages },
            { CFG.stages - 2 },
            { CFG.q_in_registers },
            { CFG.prefetch },
            { CFG.softmax.code() },
            { CFG.threads() },
            $capsink,
        >(&$p, &CFG)
    }};
}

/// Declare the kernels: the PTX entry points (with their launch bounds) and, in host builds,
/// the emulator's table `$table` of the same bodies: [`forward`] on parameters `$params` in the
/// layout `$layout` ([`Dense`] or [`Packed`]).
macro_rules! attention_kernels {
    ($table:ident, $params:ty, $layout:ty; $( $name:expr, $elem:ty, $cfg:expr, $capsink:expr; )*) => {
        $(
            #[cfg(target_arch = "nvptx64")]
            const _: () = {
                /// See the module documentation (the tile configuration named in the macro
                /// call).
                ///
                /// # Safety
                /// Launched with grid `(num_m_blocks, heads_q, batch)`, the configuration's
                /// threads and shared memory, and parameters satisfying their type's contract
                /// (validated by the host).
                #[unsafe(export_name = $name)]
                pub unsafe extern "ptx-kernel" fn kernel(p: $params) {
                    crate::launch_bounds!(name = $name, kernel_abi::attention::KERNELS);
                    // SAFETY: forwarded to the caller.
                    unsafe { attention_body!($layout, p, $elem, $cfg, $capsink) }
                }
            };
        )*

        /// Kernels of this family, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: &[crate::emu::EmuKernel] = &[
            $(
                crate::emu::EmuKernel {
                    name: $name,
                    params: core::mem::size_of::<$params>(),
                    threads: $cfg.threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: the emulator passes a parameter struct of this kernel's
                            // type (it checks the size), whose contract the caller upholds.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const $params);
                                attention_body!($layout, p, $elem, $cfg, $capsink)
                            }
                        }
                        run
                    },
                },
            )*
        ];
    };
}

/// The forward's entries for the head dimensions' tokens
/// ([`kernel_abi::with_attention_head_dims!`]): the default tiles of each, the tuning variants
/// (`kernel_abi::attention::TUNING_VARIANTS`, in order), the softcap and sinks
/// (`kernel_abi::attention::LogitOptions`); then over packed sequences
/// (`kernel_abi::attention::MMA_VARLEN_KERNELS`).
macro_rules! forward_kernels {
    ($($d:tt),*) => {
        attention_kernels! {
            EMU_KERNELS, AttentionParams, Dense;
            $(concat!("attention_fwd_bf16_d", $d), Bf16, tile_config_of($d), false;)*
            $(concat!("attention_fwd_f16_d", $d), F16, tile_config_of($d), false;)*
            "attention_fwd_bf16_d128_mt1", Bf16, TUNING_VARIANTS[0].1, false;
            "attention_fwd_bf16_d128_n64", Bf16, TUNING_VARIANTS[1].1, false;
            "attention_fwd_bf16_d128_n64pf", Bf16, TUNING_VARIANTS[2].1, false;
            "attention_fwd_bf16_d256_n32", Bf16, TUNING_VARIANTS[3].1, false;
            "attention_fwd_bf16_d128_ffma", Bf16, TUNING_VARIANTS[4].1, false;
            "attention_fwd_bf16_d128_scaled", Bf16, TUNING_VARIANTS[5].1, false;
            "attention_fwd_bf16_d128_n64lazy", Bf16, TUNING_VARIANTS[6].1, false;
            $(concat!("attention_fwd_capsink_bf16_d", $d), Bf16, tile_config_of($d), true;)*
            $(concat!("attention_fwd_capsink_f16_d", $d), F16, tile_config_of($d), true;)*
            "attention_fwd_bf16_d192_v128", Bf16, mma_value_config_of(192, 128), false;
            "attention_fwd_f16_d192_v128", F16, mma_value_config_of(192, 128), false;
        }

        attention_kernels! {
            VARLEN_EMU_KERNELS, AttentionVarlenParams, Packed;
            $(concat!("attention_fwd_varlen_bf16_d", $d), Bf16, tile_config_of($d), false;)*
            $(concat!("attention_fwd_varlen_f16_d", $d), F16, tile_config_of($d), false;)*
            $(concat!("attention_fwd_varlen_capsink_bf16_d", $d), Bf16, tile_config_of($d), true;)*
            $(concat!("attention_fwd_varlen_capsink_f16_d", $d), F16, tile_config_of($d), true;)*
            "attention_fwd_varlen_bf16_d192_v128", Bf16, mma_value_config_of(192, 128), false;
            "attention_fwd_varlen_f16_d192_v128", F16, mma_value_config_of(192, 128), false;
        }
    };
}

kernel_abi::with_attention_head_dims!(forward_kernels!());
