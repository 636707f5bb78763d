//! `attention_decode_{bf16,f16}_d{D}`: one decode step over a paged KV cache with the context
//! split over blocks (flash-decoding), on `mma.sync` tensor cores (any GPU of compute
//! capability >= 8.0); `attention_decode_combine_{bf16,f16}_d{D}` merges the splits
//! ([`combine`]). [`AttentionDecodeParams`] documents the layout, the masking and the outputs.
//! `attention_kv_append` ([`append`]) writes new keys and values into the pages first, when a
//! step brings them.
//!
//! # Work split
//! Grid `(num_splits, heads_kv * row_blocks, batch)`. A block takes one key/value head of one
//! sequence, `DECODE_BLOCK_M` = 16 of its rows (the group's query heads for each new token:
//! every query head of a group reads each K/V page once, in the same block) and one split of
//! the sequence's keys. Decoding is bound by reading the cache, so the block's four warps do
//! not split the rows (there is one m16 tile) but the keys: each step loads
//! `DECODE_BLOCK_N` = 64 keys, warp `w` computes S = Q K^T, the online softmax and O += P V on
//! keys `16 w .. 16 w + 16` of it, keeping its own running maxima, sums and O. The epilogue
//! merges the four warps' states through shared memory ([`epilogue`]).
//!
//! # Loads
//! K and V tiles come from the pages of the block table through a `stages`-deep ring of
//! `cp.async` copies ([`pages`]): a 16-key slice always lies in one page (pages hold a multiple
//! of 16 keys), so each slice needs one table entry. The entries of the next tile to issue are
//! read one iteration ahead into registers, so no copy waits for a table read. Keys past the
//! context are zero-filled and masked. Steps beyond the last key any row of the block may
//! attend (causal) are not loaded.
//!
//! # Barrier protocol
//! The `cp.async` ring of the forward's `mma.sync` kernel: Q and step 0 form group 0, steps
//! `1 .. stages - 1` one group each (empty past the end), one group per iteration. At
//! iteration `i`:
//! 1. `cp.async.wait_group(stages - 2)`: this thread's copies of step `i` (and Q) are complete.
//! 2. `sync_threads`: every thread's copies of step `i` are visible to all, and every thread
//!    has finished iteration `i - 1` (its reads of stage `(i - 1) % stages`).
//! 3. Copies of step `i + stages - 1` go to stage `(i + stages - 1) % stages` =
//!    `(i - 1) % stages`, free by 2.
//! 4. Compute from stage `i % stages` (and Q): reads only.
//!
//! Epilogue: `wait_all`, then a barrier (every warp's last reads of the ring are done) before
//! the warps write their states over the ring, and a barrier that publishes them before any
//! thread merges them. Q's tile is written only by group 0.
//!
//! Per step a warp reads its K and V fragments from shared memory (up to D = 128 Q's fragments
//! are read once, at the first step, and kept in registers), masks only a slice that reaches a row's last key,
//! and runs the folded online softmax with lazy rescaling ([`super::softmax`]): the scale in
//! the exponent's FFMA, O and the sums rescaled only when a row's maximum grows past the
//! threshold. Decoding streams the cache at a few FLOPs per byte with two warps per scheduler,
//! so the instructions of a step, not the tensor cores, set its pace: these keep them few.
//!
//! NaN safety: the family's softmax rules ([`super::softmax`]); keys past the context are
//! zero-filled (no garbage reaches P V) and masked; a row with no key gets O = 0, LSE = -inf.
//!
//! The `capsink` kernels (`CAPSINK`) soft-cap the products before masking and join each row's
//! sink at its end ([`super::logits`]): in the epilogue with one split, in the combine kernel
//! (as one more split with no value) with several.
//!
//! # Files
//! - this file: the kernel body (prologue, main loop, masks) and the entry points;
//! - [`pages`]: the Q rows and the paged K/V tile loads, the block-table reads;
//! - [`epilogue`]: the warps' states merged, O and LSE (or the split's partials) written;
//! - [`combine`]: the splits merged;
//! - [`append`]: new keys and values written into the cache.
//!
//! The tensor-core steps (S = Q K^T, O += P V) are the forward's
//! ([`super::mma::mainloop`]), on one m16 tile and one 16-key slice per warp.

mod append;
mod combine;
mod epilogue;
mod pages;

use super::elem::{Bf16, Elem, F16};
use super::logits;
use super::mma::mainloop::{Warp, pv, q_fragment, qk};
use super::softmax::{softmax_folded_p, softmax_folded_rescale};
use crate::arch::{cp_async, index, smem, sync};
use kernel_abi::attention::decode::{
    AttentionDecodeCombineParams, AttentionDecodeParams, DECODE_BLOCK_M, DECODE_BLOCK_N,
    DECODE_THREADS, DecodeConfig, decode_config,
};
use pages::{Place, load_kv, load_q, tile_pages};

#[cfg(not(target_arch = "nvptx64"))]
pub use append::APPEND_EMU_KERNELS;

/// The decode step; see the module documentation. `DT = D / 8`, `DK = D / 16`, `WAIT = STAGES -
/// 2`.
///
/// # Safety
/// Launched as documented on [`AttentionDecodeParams`] with grid `(num_splits, heads_kv *
/// row_blocks, batch)`, `DECODE_THREADS` threads and `cfg.smem_bytes()` of shared memory.
#[inline(always)]
unsafe fn decode<
    E: Elem,
    const D: u32,
    const DT: usize,
    const DK: usize,
    const STAGES: u32,
    const WAIT: u32,
    const CAPSINK: bool,
>(
    p: &AttentionDecodeParams,
    cfg: &DecodeConfig,
) {
    const { assert!(DT as u32 * 8 == D && DK as u32 * 16 == D && STAGES >= 2 && WAIT == STAGES - 2) };
    // Q's fragments in registers (module docs).
    let q_regs = D <= 128;
    let lane = index::lane_id();
    let warp = index::warp_id();
    let split = index::block_idx_x();
    let (hkv, row_block) = (
        index::block_idx_y() / p.row_blocks,
        index::block_idx_y() % p.row_blocks,
    );
    let b = index::block_idx_z();
    let group = p.heads_q / p.heads_kv;
    let row0 = row_block * DECODE_BLOCK_M;
    // SAFETY: b < batch (the grid): inside `cache_seqlens`.
    let raw_len = unsafe { *p.cache_seqlens.add(b as usize) };
    let at = Place {
        b,
        hkv,
        group,
        row0,
        rows_valid: (p.seq_q * group - row0).min(DECODE_BLOCK_M),
        len: (raw_len.max(0) as u32).min(p.max_pages * p.page_size),
    };
    let (g, t) = (lane / 4, lane % 4);
    // The keys rows g and g + 8 of this thread may attend: `0 .. limit[h]`. Causal: token i
    // sits at position len - seq_q + i.
    let limit_of = |r: u32| -> u32 {
        if p.causal != 0 && r < at.rows_valid {
            let token = (row0 + r) / group;
            (at.len as i64 - p.seq_q as i64 + token as i64 + 1).clamp(0, at.len as i64) as u32
        } else {
            at.len
        }
    };
    let limit = [limit_of(g), limit_of(g + 8)];
    // The block's keys: this split's share of the sequence's steps, up to the last key any of
    // its rows may attend.
    let block_limit = limit_of(at.rows_valid - 1);
    let total_steps = at.len.div_ceil(DECODE_BLOCK_N);
    let per_split = total_steps.div_ceil(p.num_splits);
    let step_lo = (split * per_split).min(total_steps);
    let step_hi = (step_lo + per_split)
        .min(total_steps)
        .min(block_limit.div_ceil(DECODE_BLOCK_N))
        .max(step_lo);
    let steps = step_hi - step_lo;

    let w = Warp {
        lane,
        g,
        t,
        warp_row: 0,
        m0: 0,
        rows_valid: at.rows_valid,
        offset: 0,
        window_left: -1,
        window_right: -1,
        seq_k: at.len as i32,
        scale_log2: p.scale_log2,
    };
    let mut o = [[[0.0f32; 4]; DT]; 1];
    let mut row_max = [[f32::NEG_INFINITY; 2]; 1];
    let mut row_sum = [[0.0f32; 2]; 1];
    let smem = smem::aligned_base();
    if steps > 0 {
        let q_s = smem + cfg.q_offset();
        let k_s = |stage: u32| smem + cfg.k_offset(stage);
        let v_s = |stage: u32| smem + cfg.v_offset(stage);
        let n0 = |step: u32| (step_lo + step) * DECODE_BLOCK_N;
        let slice = 16 * warp * cfg.row_bytes();

        // Prologue: Q and steps 0 .. STAGES - 2, one group each (empty past the end); the
        // pages of step STAGES - 1 read ahead.
        load_q::<D, DECODE_THREADS>(p, &at, q_s);
        for s in 0..STAGES - 1 {
            if s < steps {
                let pages = tile_pages(p, &at, n0(s));
                load_kv::<D, DECODE_THREADS>(p, &at, k_s(s), v_s(s), n0(s), &pages);
            }
            cp_async::commit_group();
        }
        let mut next_pages = tile_pages(p, &at, n0(STAGES - 1));
        // Up to D = 128, Q's fragments are read from shared memory once (at step 0, after the
        // barrier that publishes Q) and kept in registers; above, their registers would spill,
        // and each step reads them from shared memory.
        let mut q_frag = [[[0u32; 4]; DK]; 1];
        // Keys from which some row of the block may need its mask: the first row's limit (row
        // 0 is the earliest token, whose causal limit is the smallest).
        let mask_from = limit_of(0);
        for step in 0..steps {
            cp_async::wait_group::<WAIT>();
            // SAFETY: barrier protocol step 2; every thread reaches it `steps` times.
            unsafe { sync::sync_threads() };
            if q_regs && step == 0 {
                for (kk, f) in q_frag[0].iter_mut().enumerate() {
                    *f = q_fragment::<D>(&w, q_s, 0, kk);
                }
            }
            let issue = step + STAGES - 1;
            if issue < steps {
                let stage = issue % STAGES;
                load_kv::<D, DECODE_THREADS>(
                    p,
                    &at,
                    k_s(stage),
                    v_s(stage),
                    n0(issue),
                    &next_pages,
                );
                next_pages = tile_pages(p, &at, n0(issue + 1));
            }
            cp_async::commit_group();
            let stage = step % STAGES;
            let key0 = n0(step) + 16 * warp;
            // Warp-uniform: a slice past every row's keys adds nothing.
            if key0 < block_limit {
                let k_tile = k_s(stage) + slice;
                // SAFETY: the stage and Q were published by this iteration's barrier and are
                // not overwritten before the next one; whole warp, uniform control flow.
                let mut s = unsafe {
                    if q_regs {
                        qk::<E, D, 1, DK, 2, 1, true, false>(&w, q_s, &q_frag, k_tile)
                    } else {
                        qk::<E, D, 1, DK, 2, 1, false, false>(&w, q_s, &q_frag, k_tile)
                    }
                };
                if CAPSINK {
                    logits::softcap::<1, 2>(&mut s, &p.logits);
                }
                // Warp-uniform: only a slice reaching a row's limit has keys to mask.
                if key0 + 16 > mask_from {
                    for (j, tile) in s[0].iter_mut().enumerate() {
                        for (e, x) in tile.iter_mut().enumerate() {
                            let key = key0 + 8 * j as u32 + 2 * t + e as u32 % 2;
                            if key >= limit[e / 2] {
                                *x = f32::NEG_INFINITY;
                            }
                        }
                    }
                }
                // The folded softmax with lazy rescaling (the scale in the exponent's FFMA; O
                // and the sums rescaled only when a row's maximum grows past the threshold).
                let (m, l) = (&mut row_max, &mut row_sum);
                if softmax_folded_rescale::<1, 2, DT>(&s, &mut o, m, l, p.scale_log2, true) {
                    softmax_folded_p::<1, 2, true>(&mut s, m, l, p.scale_log2);
                } else {
                    softmax_folded_p::<1, 2, false>(&mut s, m, l, p.scale_log2);
                }
                // SAFETY: as for K.
                unsafe { pv::<E, D, 1, DT, DK, 2, 1, false>(&w, &s, &mut o, v_s(stage) + slice) };
            }
        }
        cp_async::wait_all();
    }
    // SAFETY: every thread of the block gets here, its copies complete.
    unsafe {
        epilogue::finish::<E, D, DT, CAPSINK>(p, cfg, smem, &at, &o[0], &row_max[0], &row_sum[0])
    };
}

/// The body of a decode kernel of element type `$elem`, head dimension `$d`.
macro_rules! decode_body {
    ($p:expr, $elem:ty, $d:expr, $capsink:expr) => {{
        const CFG: DecodeConfig = decode_config($d);
        decode::<
            $elem,
            $d,
            { ($d / 8) as usize },
            { ($d / 16) as usize },
            { CFG.stages },
            { CFG.stages - 2 },
            $capsink,
        >(&$p, &CFG)
    }};
}

/// Declare the decode and combine kernels (PTX entry points with their launch bounds) and, in
/// host builds, the emulator's table `EMU_KERNELS` of the same bodies.
macro_rules! decode_kernels {
    ($( $name:expr, $combine:expr, $elem:ty, $d:expr, $capsink:expr; )*) => {
        $(
            #[cfg(target_arch = "nvptx64")]
            const _: () = {
                /// See the module documentation.
                ///
                /// # Safety
                /// Launched with grid `(num_splits, heads_kv * row_blocks, batch)`,
                /// `DECODE_THREADS` threads and the configuration's shared memory, on parameters
                /// satisfying their type's contract (validated by the host).
                #[unsafe(export_name = $name)]
                pub unsafe extern "ptx-kernel" fn kernel(p: AttentionDecodeParams) {
                    crate::launch_bounds!(name = $name, kernel_abi::attention::KERNELS);
                    // SAFETY: forwarded to the caller.
                    unsafe { decode_body!(p, $elem, $d, $capsink) }
                }

                /// See [`combine`].
                ///
                /// # Safety
                /// As [`combine::combine`].
                #[unsafe(export_name = $combine)]
                pub unsafe extern "ptx-kernel" fn combine_kernel(p: AttentionDecodeCombineParams) {
                    crate::launch_bounds!(name = $combine, kernel_abi::attention::KERNELS);
                    // SAFETY: forwarded to the caller.
                    unsafe { combine::combine::<$elem, $d, $capsink>(&p) }
                }
            };
        )*

        /// Kernels of this module, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const EMU_KERNELS: &[crate::emu::EmuKernel] = &[
            $(
                crate::emu::EmuKernel {
                    name: $name,
                    params: core::mem::size_of::<AttentionDecodeParams>(),
                    threads: DECODE_THREADS,
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: the emulator passes a parameter struct of this kernel's
                            // type (it checks the size), whose contract the caller upholds.
                            unsafe {
                                let p =
                                    core::ptr::read_unaligned(p as *const AttentionDecodeParams);
                                decode_body!(p, $elem, $d, $capsink)
                            }
                        }
                        run
                    },
                },
                crate::emu::EmuKernel {
                    name: $combine,
                    params: core::mem::size_of::<AttentionDecodeCombineParams>(),
                    threads: kernel_abi::attention::decode::COMBINE_THREADS,
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: as above.
                            unsafe {
                                let p = core::ptr::read_unaligned(
                                    p as *const AttentionDecodeCombineParams,
                                );
                                combine::combine::<$elem, $d, $capsink>(&p)
                            }
                        }
                        run
                    },
                },
            )*
        ];
    };
}

/// The entries for the head dimensions' tokens ([`kernel_abi::with_attention_head_dims!`]), then
/// with softcap and sinks (`kernel_abi::attention::LogitOptions`).
macro_rules! decode_entries {
    ($($d:tt),*) => {
        decode_kernels! {
            $(
                concat!("attention_decode_bf16_d", $d),
                concat!("attention_decode_combine_bf16_d", $d),
                Bf16, $d, false;
            )*
            $(
                concat!("attention_decode_f16_d", $d),
                concat!("attention_decode_combine_f16_d", $d),
                F16, $d, false;
            )*
            $(
                concat!("attention_decode_capsink_bf16_d", $d),
                concat!("attention_decode_combine_capsink_bf16_d", $d),
                Bf16, $d, true;
            )*
            $(
                concat!("attention_decode_capsink_f16_d", $d),
                concat!("attention_decode_combine_capsink_f16_d", $d),
                F16, $d, true;
            )*
        }
    };
}

kernel_abi::with_attention_head_dims!(decode_entries!());
