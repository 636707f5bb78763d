//! `mhc_bwd_dh_n{N}`: gradients of the coefficients (reductions over the channels) and of `y`.
//!
//! # Parameters
//! [`DhdvParams`]: `x [T, N, C]`, `y [T, C]`, `d_xin [T, C]`, `d_xnext [T, N, C]` bf16,
//! `h_post [T, N]` f32; outputs `dh [T, M]` f32 (coefficient order) and `dy [T, C]` bf16.
//!
//! # Thread mapping
//! One warp per token (`DH_TOKENS` = 8 per block); lane `l` takes the 8-channel vectors
//! `l, l + 32, ...` of the token. Per vector it loads `N` vectors of `x`, `N` of `d_xnext`, one
//! of `y` and of `d_xin` (L2-only, read once), accumulates in f32
//! `dH_pre[i] += d_xin . x_i`, `dH_post[i] += d_xnext_i . y`, `dH_res[i][j] += d_xnext_i . x_j`,
//! and writes `dy = sum_i H_post[i] d_xnext_i` (bf16). Then each of the `M` sums is reduced over
//! the 32 lanes by a butterfly (same order every run), and lane `m % 32` writes coefficient `m`.
//!
//! Memory-bound: `(4 N + 6) C` bytes per token (`x`, `d_xnext`, `y`, `d_xin` read, `dy`
//! written), `(N^2 + 2 N) C` FMA.
//!
//! # Barrier protocol
//! None: no shared memory, no block barrier; the shuffles are executed by whole warps (a warp
//! whose token is past `T` returns before any of them, as a whole).

use super::unpack;
use crate::arch::{convert, global, index, warp};
use kernel_abi::WARP_SIZE;
use kernel_abi::mhc::*;

/// See the module documentation.
///
/// # Safety
/// Grid of `ceil(T / DH_TOKENS)` blocks of `DH_THREADS` threads, no shared memory; `C` is a
/// multiple of 8; the pointers hold the documented sizes (16-byte aligned).
#[inline(always)]
pub unsafe fn run<const N: usize>(p: DhdvParams) {
    let tok = (index::block_idx_x() * DH_TOKENS + index::warp_id()) as usize;
    if tok >= p.tokens as usize {
        return;
    }
    let lane = index::lane_id();
    let c = p.c as usize;
    let mm = m_of(N as u32) as usize;
    let mut hq = [0.0f32; N];
    for i in 0..N {
        // SAFETY: tok < T, i < N: inside `h_post [T, N]`, read-only here.
        hq[i] = unsafe { global::load_nc_f32(p.h_post.add(tok * N + i)) };
    }
    let mut pre = [0.0f32; N];
    let mut post = [0.0f32; N];
    let mut res = [[0.0f32; N]; N];
    let mut v = lane;
    while v < p.c / VEC {
        let off = (VEC * v) as usize;
        let mut xs = [[0u32; 4]; N];
        let mut ds = [[0u32; 4]; N];
        // SAFETY: tok < T and 8 v + 8 <= C: every vector is inside its tensor and 16-byte
        // aligned (C is a multiple of 8).
        let (yv, dv) = unsafe {
            for i in 0..N {
                xs[i] = global::load_cg_v4(p.x.add((tok * N + i) * c + off) as *const u32);
                ds[i] = global::load_cg_v4(p.d_xnext.add((tok * N + i) * c + off) as *const u32);
            }
            (
                global::load_cg_v4(p.y.add(tok * c + off) as *const u32),
                global::load_cg_v4(p.d_xin.add(tok * c + off) as *const u32),
            )
        };
        let mut dy = [0u32; 4];
        for e in 0..4 {
            let yy = unpack(yv[e]);
            let di = unpack(dv[e]);
            let mut xf = [[0.0f32; 2]; N];
            let mut df = [[0.0f32; 2]; N];
            for i in 0..N {
                xf[i] = unpack(xs[i][e]);
                df[i] = unpack(ds[i][e]);
            }
            let mut out = [0.0f32; 2];
            for h in 0..2 {
                for i in 0..N {
                    pre[i] += di[h] * xf[i][h];
                    post[i] += df[i][h] * yy[h];
                    out[h] += hq[i] * df[i][h];
                    for j in 0..N {
                        res[i][j] += df[i][h] * xf[j][h];
                    }
                }
            }
            dy[e] = convert::pack_bf16x2(out[0], out[1]);
        }
        // SAFETY: inside `dy [T, C]`, 16-byte aligned, written by this lane only.
        unsafe { global::store_v4(p.dy.add(tok * c + off) as *mut u32, dy) };
        v += WARP_SIZE;
    }
    let out = |m: usize, s: f32| {
        // SAFETY: all lanes of the warp execute the reduction (uniform control flow).
        let total = unsafe { warp::sum_f32(s) };
        if lane as usize == m % WARP_SIZE as usize {
            // SAFETY: tok < T, m < M: inside `dh [T, M]`.
            unsafe { *p.dh.add(tok * mm + m) = total };
        }
    };
    for i in 0..N {
        out(i, pre[i]);
        out(post_col(N as u32, i as u32) as usize, post[i]);
        for j in 0..N {
            out(res_col(N as u32, i as u32, j as u32) as usize, res[i][j]);
        }
    }
}
