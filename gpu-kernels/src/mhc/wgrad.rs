//! `mhc_bwd_wgrad_n{N}`: `W = x~^T u` (`[K, M]`, contraction over tokens), partial over token
//! splits, on tensor cores. `dphi` and `dgamma` follow from `W` in `mhc_bwd_finalize`.
//!
//! # Parameters
//! [`WgradParams`]: `x [T, K]` bf16, `u [T, m16]` f32; output `part_w [splits, K, M]` f32,
//! `splits = gridDim.y`, split `s` covering tokens `[s tokens_per_split, +tokens_per_split)`.
//!
//! # Tiling
//! Block `(kb, s)` owns the K rows `[kb ktile, +ktile)` (`ktile = wg_ktile(N)`) and walks its
//! tokens in steps of `WG_STEP` = 32 through a `WG_STAGES`-deep `cp.async` ring: per stage the
//! x tile `[32 tokens][ktile]` (bf16, rows padded to `wg_x_pitch`) and the u tile
//! `[32 tokens][m16]` (f32, rows padded to `wg_u_pitch`). Tokens outside the split's range or
//! past `T`, and K past `K`, are zero-filled.
//!
//! `mma` M dimension = K rows (warp `w` owns `MT` m16 tiles), N = coefficients (`NT` n8 tiles),
//! K = tokens (two k16 steps per stage). A (`x~^T`) comes from the x tile by
//! `ldmatrix.x4.trans` (the tile is token-major, the fragment K-major); B (`u`, split into bf16
//! `hi + lo`, two `mma`s) is built by each lane from the f32 u tile: `b[r]` of tile `j` is
//! `u[16 ks + 2 t + 8 r + {0, 1}][8 j + g]`.
//!
//! # Thread mapping
//! `WG_THREADS` = 4 warps; every thread issues `1/128` of each stage's 16-byte copies. Lane
//! `(g, t)`'s accumulator element `(row, 2 t + e)` of tile `(mt, j)` is
//! `W[kb ktile + (w MT + mt) 16 + row][8 j + 2 t + e]`, `row` in `{g, g + 8}`.
//!
//! # Barrier protocol (`cp.async` ring, one commit group per stage)
//! - Prologue: stages `0 .. WG_STAGES - 1` are issued, one group each (empty past the end).
//! - Iteration `i`: `wait_group<WG_STAGES - 2>` (this thread's copies of stage `i` have landed),
//!   then `sync_threads` (everyone's have, and everyone finished reading stage `i - 1`); then
//!   stage `i + WG_STAGES - 1` is issued into the slot of stage `i - 1`, which no thread reads
//!   any more, and committed (an empty group past the end keeps the count); then stage `i` is
//!   read (`ldmatrix`, `ld.shared`) and multiplied.
//! - End: no shared memory is read after the last iteration's products.

use super::split_pair;
use crate::arch::{cp_async, index, ldmatrix, mma, smem, sync};
use kernel_abi::mhc::*;

/// See the module documentation.
///
/// # Safety
/// Grid `(ceil(K / wg_ktile(N)), splits)` of `WG_THREADS` threads, `wg_smem_bytes(N)` of dynamic
/// shared memory; `tokens_per_split` a multiple of `WG_STEP`; the pointers hold the documented
/// sizes (16-byte aligned).
#[inline(always)]
pub unsafe fn run<const N: usize, const NT: usize, const MT: usize>(p: WgradParams) {
    const {
        assert!(NT == nt_of(N as u32) as usize && MT == wg_mt(N as u32) as usize);
    }
    let n = N as u32;
    let (mm, m16, upitch) = (m_of(n), m16_of(n), wg_u_pitch(n));
    let (ktile, xpitch) = (wg_ktile(n), wg_x_pitch(n));
    let tid = index::thread_idx_x();
    let lane = index::lane_id();
    let warp = index::warp_id();
    let (g, t) = (lane / 4, lane % 4);
    let k0 = index::block_idx_x() * ktile;
    let split = index::block_idx_y();
    let t_begin = split * p.tokens_per_split;
    let t_end = (t_begin + p.tokens_per_split).min(p.tokens);
    let steps = if t_end > t_begin {
        (t_end - t_begin).div_ceil(WG_STEP)
    } else {
        0
    };
    let base = smem::aligned_base();

    let issue = |step: u32| {
        let slot = step % WG_STAGES;
        let tok0 = t_begin + step * WG_STEP;
        let xs = base + wg_x_offset(n, slot) as u32;
        let us = base + wg_u_offset(n, slot) as u32;
        let xchunks = ktile / 8;
        let mut q = tid;
        while q < WG_STEP * xchunks {
            let (row, col) = (q / xchunks, q % xchunks);
            let (tok, k) = (tok0 + row, k0 + 8 * col);
            let ok = tok < t_end && k < p.k;
            let src = if ok {
                p.x.wrapping_add(tok as usize * p.k as usize + k as usize)
            } else {
                p.x
            };
            // SAFETY: the destination is 16 bytes of stage `slot`'s x tile (row < 32,
            // col < ktile / 8), 16-byte aligned; the source, when read (ok), is 8 elements of
            // `x` inside row tok < T at k + 8 <= K, 16-byte aligned (K, k multiples of 8).
            unsafe {
                cp_async::copy_16_zfill(
                    xs + row * xpitch + 16 * col,
                    src as *const u8,
                    if ok { 16 } else { 0 },
                )
            };
            q += WG_THREADS;
        }
        let uchunks = m16 / 4;
        let mut q = tid;
        while q < WG_STEP * uchunks {
            let (row, col) = (q / uchunks, q % uchunks);
            let tok = tok0 + row;
            let ok = tok < t_end;
            let src = if ok {
                p.u.wrapping_add(tok as usize * m16 as usize + 4 * col as usize)
            } else {
                p.u
            };
            // SAFETY: the destination is 16 bytes of stage `slot`'s u tile, 16-byte aligned
            // (pitch m16 + 4 floats, a multiple of 4); the source, when read, is 4 floats of
            // `u` row tok < T, 16-byte aligned.
            unsafe {
                cp_async::copy_16_zfill(
                    us + 4 * (row * upitch + 4 * col),
                    src as *const u8,
                    if ok { 16 } else { 0 },
                )
            };
            q += WG_THREADS;
        }
    };

    for s in 0..WG_STAGES - 1 {
        if s < steps {
            issue(s);
        }
        cp_async::commit_group();
    }
    let mut acc = [[[0.0f32; 4]; NT]; MT];
    let krow = warp * MT as u32 * 16;
    for it in 0..steps {
        cp_async::wait_group::<{ WG_STAGES - 2 }>();
        // SAFETY: every thread runs the same `steps` iterations (block-uniform).
        unsafe { sync::sync_threads() };
        if it + WG_STAGES - 1 < steps {
            issue(it + WG_STAGES - 1);
        }
        cp_async::commit_group();
        let slot = it % WG_STAGES;
        let xs = base + wg_x_offset(n, slot) as u32;
        let us = smem::SmemArray::<f32>::new(base + wg_u_offset(n, slot) as u32, WG_STEP * upitch);
        for ks in 0..2u32 {
            let mut bhi = [[0u32; 2]; NT];
            let mut blo = [[0u32; 2]; NT];
            for j in 0..NT {
                let col = 8 * j as u32 + g;
                let r0 = 16 * ks + 2 * t;
                // SAFETY: rows r0 .. r0 + 9 < 32, col < m16 <= upitch: inside this stage's u
                // tile, published by the barrier above.
                let v = unsafe {
                    [
                        us.load(r0 * upitch + col),
                        us.load((r0 + 1) * upitch + col),
                        us.load((r0 + 8) * upitch + col),
                        us.load((r0 + 9) * upitch + col),
                    ]
                };
                let (h0, l0) = split_pair(v[0], v[1]);
                let (h1, l1) = split_pair(v[2], v[3]);
                bhi[j] = [h0, h1];
                blo[j] = [l0, l1];
            }
            for mt in 0..MT {
                let mat = lane / 8;
                let trow = 16 * ks + (mat >> 1) * 8 + lane % 8;
                let kcol = krow + 16 * mt as u32 + (mat & 1) * 8;
                // SAFETY: whole warp, uniform control flow; each address is a 16-byte row
                // (trow < 32, kcol + 8 <= ktile) of this stage's x tile, 16-byte aligned,
                // published by the barrier above.
                let a = unsafe { ldmatrix::x4_trans(xs + trow * xpitch + 2 * kcol) };
                for j in 0..NT {
                    // SAFETY: whole warp, uniform control flow.
                    unsafe {
                        mma::m16n8k16_bf16(&mut acc[mt][j], a, bhi[j]);
                        mma::m16n8k16_bf16(&mut acc[mt][j], a, blo[j]);
                    }
                }
            }
        }
    }

    for mt in 0..MT {
        for r in 0..2u32 {
            let k = k0 + krow + 16 * mt as u32 + g + 8 * r;
            if k >= p.k {
                continue;
            }
            let row = (split as usize * p.k as usize + k as usize) * mm as usize;
            for j in 0..NT {
                for e in 0..2u32 {
                    let m = 8 * j as u32 + 2 * t + e;
                    if m < mm {
                        // SAFETY: split < splits, k < K, m < M: inside `part_w [splits, K, M]`.
                        unsafe {
                            *p.part_w.add(row + m as usize) = acc[mt][j][(2 * r + e) as usize]
                        };
                    }
                }
            }
        }
    }
}
