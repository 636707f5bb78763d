//! `mhc_bwd_dx_n{N}`: the gradient of `x`,
//! `dx[i][c] = H_pre[i] d_xin[c] + sum_j H_res[j][i] d_xnext[j][c] + xcoef x[i][c]
//!  + sum_m phi'[i C + c][m] u[m]`, the last term on tensor cores.
//!
//! # Parameters
//! [`DxParams`]: `x`, `d_xnext [T, N, C]`, `d_xin [T, C]` bf16; `h_pre [T, N]`,
//! `h_res [T, N, N]`, `xcoef [T]`, `u [T, m16]` f32; `packed_b2` (from `mhc_prep`); output
//! `dx [T, N, C]` bf16.
//!
//! # Tiling
//! A block owns `DX_TOKENS` = 64 tokens; warp `w` owns the m16 tile of tokens `16 w .. +16` (the
//! `mma` M dimension) and walks the channels in groups of 16 (two n8 tiles, the N dimension),
//! doing all `N` streams of a group before the next, since `dx` of stream `i` needs
//! `d_xnext` of every stream at the same channels. The contraction is over the `M`
//! coefficients (`S` k16 steps, zero padded to `m16`).
//!
//! The columns of the two n8 tiles are permuted (`kernel_abi::mhc::b2_channel`) so that lane
//! `(g, t)` of the accumulators owns the 4 consecutive channels `16 group + 4 t .. + 4` of its
//! rows `g` and `g + 8`: then `x`, `d_xnext`, `d_xin` and `dx` are plain 8-byte accesses in the
//! accumulator layout (a row's 4 lanes cover 32 contiguous bytes). `mhc_prep` packed each lane's
//! B words for those columns (`b2_word_source`); the A fragments (`u`) are fixed per warp and
//! loaded once.
//!
//! Precision: `u` and `phi'` are both split `hi + lo` (bf16); the product is
//! `u_hi phi_hi + u_lo phi_hi + u_hi phi_lo` (the `lo lo` term is below `2^-17`), f32
//! accumulation, then the other terms in f32 and one rounding to bf16.
//!
//! # Thread mapping
//! `DX_THREADS` = 4 warps. Lane `(g, t)` handles tokens `16 w + g` and `16 w + g + 8` of the
//! block. Rows past `T` and channels past `C` (when `C = 8 mod 16`) load zeros and are not
//! written. The loads of channel group `g + 1` are issued before group `g` is computed.
//!
//! # Barrier protocol
//! 1. Every thread copies part of the block's coefficient table (`H_res`, `H_pre`, `xcoef` of its
//!    128 tokens, zeros past `T`) into shared memory: entry `e` by thread `e mod DX_THREADS`.
//! 2. `sync_threads`: the table is visible to every warp.
//! 3. Warps only read the table afterwards (a warp whose tokens are all past `T` returns here, as
//!    a whole; no barrier follows).

use super::{split_pair, unpack};
use crate::arch::{convert, global, index, mma, smem, sync};
use kernel_abi::mhc::*;

/// See the module documentation.
///
/// # Safety
/// Grid of `ceil(T / DX_TOKENS)` blocks of `DX_THREADS` threads, `dx_smem_bytes(N)` of dynamic
/// shared memory; `C` is a multiple of 8; the pointers hold the documented sizes.
#[inline(always)]
pub unsafe fn run<const N: usize, const S: usize>(p: DxParams) {
    const {
        assert!(S == s16_of(N as u32) as usize);
    }
    let n = N as u32;
    let (tokens, c) = (p.tokens, p.c);
    let tid = index::thread_idx_x();
    let lane = index::lane_id();
    let warp = index::warp_id();
    let (g, t) = (lane / 4, lane % 4);
    let nn = n * n;
    let stride = dx_coef_stride(n);
    let first = index::block_idx_x() * DX_TOKENS;
    let table = smem::SmemArray::<f32>::new(smem::aligned_base(), DX_TOKENS * stride);

    let mut e = tid;
    while e < DX_TOKENS * stride {
        let (row, f) = (e / stride, e % stride);
        let tok = (first + row) as usize;
        let v = if first + row >= tokens {
            0.0
        } else if f < nn {
            // SAFETY: tok < T, f < N^2: inside `h_res [T, N, N]`.
            unsafe { *p.h_res.add(tok * nn as usize + f as usize) }
        } else if f < nn + n {
            // SAFETY: tok < T, f - N^2 < N: inside `h_pre [T, N]`.
            unsafe { *p.h_pre.add(tok * N + (f - nn) as usize) }
        } else {
            // SAFETY: tok < T: inside `xcoef [T]`.
            unsafe { *p.xcoef.add(tok) }
        };
        // SAFETY: e < DX_TOKENS * stride = the table's length, inside the launch's shared
        // memory (`dx_smem_bytes`); one writer per entry (barrier protocol step 1).
        unsafe { table.store(e, v) };
        e += DX_THREADS;
    }
    // SAFETY: every thread reaches this barrier once, before any early return.
    unsafe { sync::sync_threads() };
    if first + 16 * warp >= tokens {
        return;
    }
    let local = [16 * warp + g, 16 * warp + g + 8];
    let toks = [first + local[0], first + local[1]];
    let m16 = m16_of(n) as usize;

    // A fragments (u hi and lo) of the warp's 16 tokens, for every k16 step.
    let mut ahi = [[0u32; 4]; S];
    let mut alo = [[0u32; 4]; S];
    for s in 0..S {
        let mut w = [[0.0f32; 4]; 2];
        for r in 0..2 {
            if toks[r] < tokens {
                let at = toks[r] as usize * m16 + 16 * s + 2 * t as usize;
                // SAFETY: tok < T, at + 9 < (tok + 1) m16: inside `u [T, m16]`; 8-byte
                // aligned (even index); written by an earlier kernel, read-only here.
                let (lo, hi) = unsafe {
                    (
                        global::load_nc_v2_f32(p.u.add(at)),
                        global::load_nc_v2_f32(p.u.add(at + 8)),
                    )
                };
                w[r] = [lo[0], lo[1], hi[0], hi[1]];
            }
        }
        let pairs = [
            split_pair(w[0][0], w[0][1]),
            split_pair(w[1][0], w[1][1]),
            split_pair(w[0][2], w[0][3]),
            split_pair(w[1][2], w[1][3]),
        ];
        for q in 0..4 {
            ahi[s][q] = pairs[q].0;
            alo[s][q] = pairs[q].1;
        }
    }
    let mut xc = [0.0f32; 2];
    for r in 0..2 {
        // SAFETY: local < DX_TOKENS: inside the table, published by the barrier.
        xc[r] = unsafe { table.load(local[r] * stride + nn + n) };
    }

    // The loads of a channel group: `d_xin`, `d_xnext` of every stream and, for N <= 4, `x`
    // of every stream (for larger N the stream loop below is not unrolled, so nothing may index
    // a register array by `i`, and `x_i` is loaded inside it). Rows past T or channels past C
    // load zeros (`ok` false) and are not stored.
    let load_group = |group: u32| {
        let ch = B2_GROUP * group + 4 * t;
        let mut ok = [false; 2];
        let mut di = [[0u32; 2]; 2];
        let mut dn = [[[0u32; 2]; 2]; N];
        let mut xs = [[[0u32; 2]; 2]; N];
        for r in 0..2 {
            ok[r] = group < b2_groups(c) && ch < c && toks[r] < tokens;
            if ok[r] {
                let tok = toks[r] as usize;
                // SAFETY: tok < T, ch + 4 <= C (C and ch are multiples of 4, ch < C): every
                // vector is inside its tensor; offsets are multiples of 4 elements (8 bytes).
                unsafe {
                    di[r] = global::load_cg_v2(
                        p.d_xin.add(tok * c as usize + ch as usize) as *const u32
                    );
                    for j in 0..N {
                        let at = (tok * N + j) * c as usize + ch as usize;
                        dn[j][r] = global::load_cg_v2(p.d_xnext.add(at) as *const u32);
                        if N <= 4 {
                            xs[j][r] = global::load_cg_v2(p.x.add(at) as *const u32);
                        }
                    }
                }
            }
        }
        (ch, ok, di, dn, xs)
    };

    // Group `g + 1` is loaded before group `g` is computed (register double buffer).
    let mut cur = load_group(0);
    for group in 0..b2_groups(c) {
        let next = load_group(group + 1);
        let (ch, ok, di, dn, xs) = cur;
        for i in 0..N {
            let mut xv = [[0u32; 2]; 2];
            for r in 0..2 {
                if N <= 4 {
                    xv[r] = xs[i][r];
                } else if ok[r] {
                    let at = (toks[r] as usize * N + i) * c as usize + ch as usize;
                    // SAFETY: as for the loads of `load_group`.
                    xv[r] = unsafe { global::load_cg_v2(p.x.add(at) as *const u32) };
                }
            }
            let mut acc = [[0.0f32; 4]; 2];
            for s in 0..S {
                let at = |hl: u32| {
                    lane_word(b2_block(n, c, i as u32, group, s as u32, hl), lane, 0) as usize
                };
                // SAFETY: i < N, group < b2_groups(C), s < S: inside `packed_b2`; the index is
                // a multiple of 4 words (16-byte aligned); read-only during the kernel.
                let (bh, bl) = unsafe {
                    (
                        global::load_nc_v4(p.packed_b2.add(at(0))),
                        global::load_nc_v4(p.packed_b2.add(at(1))),
                    )
                };
                for q in 0..2 {
                    // SAFETY: the whole warp executes this in uniform control flow.
                    unsafe {
                        mma::m16n8k16_bf16(&mut acc[q], ahi[s], [bh[2 * q], bh[2 * q + 1]]);
                        mma::m16n8k16_bf16(&mut acc[q], alo[s], [bh[2 * q], bh[2 * q + 1]]);
                        mma::m16n8k16_bf16(&mut acc[q], ahi[s], [bl[2 * q], bl[2 * q + 1]]);
                    }
                }
            }
            for r in 0..2 {
                if !ok[r] {
                    continue;
                }
                let at = local[r] * stride;
                let mut hr = [0.0f32; N];
                for j in 0..N {
                    // SAFETY: inside the table (H_res[j][i] of row `local[r]`), published.
                    hr[j] = unsafe { table.load(at + (j * N + i) as u32) };
                }
                // SAFETY: inside the table (H_pre[i] of row `local[r]`), published.
                let hp = unsafe { table.load(at + nn + i as u32) };
                let mut out = [0.0f32; 4];
                for e in 0..4 {
                    let (w, h) = (e / 2, e % 2);
                    let mut v = acc[e / 2][2 * r + e % 2];
                    v += hp * unpack(di[r][w])[h];
                    v += xc[r] * unpack(xv[r][w])[h];
                    for j in 0..N {
                        v += hr[j] * unpack(dn[j][r][w])[h];
                    }
                    out[e] = v;
                }
                let at = (toks[r] as usize * N + i) * c as usize + ch as usize;
                let words = [
                    convert::pack_bf16x2(out[0], out[1]),
                    convert::pack_bf16x2(out[2], out[3]),
                ];
                // SAFETY: inside `dx [T, N, C]` (as for the loads), 8-byte aligned, written by
                // this lane only.
                unsafe { global::store_v2(p.dx.add(at) as *mut u32, words) };
            }
        }
        cur = next;
    }
}
