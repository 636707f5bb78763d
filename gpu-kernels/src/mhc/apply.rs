//! `mhc_fwd_pre_n{N}` and `mhc_fwd_post_n{N}`: the applications of the coefficients.
//!
//! # Parameters
//! [`PreParams`]: `x [T, N, C]` bf16, `h_pre [T, N]` f32, output `x_in [T, C]` bf16.
//! [`PostParams`]: `x [T, N, C]`, `y [T, C]` bf16, `h_post [T, N]`, `h_res [T, N, N]` f32,
//! output `x_next [T, N, C]` bf16.
//!
//! # Thread mapping
//! One thread per 8-channel vector `v` of one token: item `blockIdx.x * APPLY_THREADS + tid`
//! is token `item / (C / 8)`, vector `item % (C / 8)`, so a warp reads 512 contiguous bytes of
//! each stream. A thread loads the `N` 16-byte vectors of `x` (and one of `y`), L2-only (they are
//! read once), and the token's coefficients through L1 (shared by the `C / 8` threads of the
//! token); it accumulates in f32 (`x_in = sum_i H_pre[i] x_i`, `x_next_i = sum_j H_res[i][j] x_j
//! + H_post[i] y`, in that order) and rounds to bf16 (nearest even).
//!
//! Memory-bound: per token `x_in` moves `2 N C + 2 C` bytes, `x_next` `4 N C + 2 C`. For
//! `N <= 4` `x_next` is declared with 3 resident blocks per SM (at most 85 registers), so 24
//! warps per SM keep about 60 KB of loads in flight.
//!
//! # Barrier protocol
//! None (no shared memory; each thread writes its own vectors).

use super::unpack;
use crate::arch::{convert, global, index};
use kernel_abi::mhc::*;

/// The calling thread's (token, vector) item, if it is one.
#[inline(always)]
fn item(tokens: u32, c: u32) -> Option<(usize, usize)> {
    let vecs = (c / VEC) as usize;
    let item =
        index::block_idx_x() as usize * APPLY_THREADS as usize + index::thread_idx_x() as usize;
    if item < tokens as usize * vecs {
        Some((item / vecs, item % vecs))
    } else {
        None
    }
}

/// Eight f32 to a 16-byte vector of bf16.
#[inline(always)]
fn pack8(v: &[f32; 8]) -> [u32; 4] {
    let mut w = [0u32; 4];
    for e in 0..4 {
        w[e] = convert::pack_bf16x2(v[2 * e], v[2 * e + 1]);
    }
    w
}

/// See the module documentation.
///
/// # Safety
/// Grid of `ceil(T C / 8 / APPLY_THREADS)` blocks of `APPLY_THREADS` threads; `C` is a multiple
/// of 8; the pointers hold the documented sizes (16-byte aligned).
#[inline(always)]
pub unsafe fn pre<const N: usize>(p: PreParams) {
    let Some((tok, v)) = item(p.tokens, p.c) else {
        return;
    };
    let c = p.c as usize;
    let mut xs = [[0u32; 4]; N];
    let mut h = [0.0f32; N];
    for i in 0..N {
        // SAFETY: tok < T, i < N, 8 v + 8 <= C: inside `x`, 16-byte aligned (C multiple of 8);
        // tok N + i inside `h_pre [T, N]`, read-only here.
        unsafe {
            xs[i] = global::load_cg_v4(p.x.add((tok * N + i) * c + VEC as usize * v) as *const u32);
            h[i] = global::load_nc_f32(p.h_pre.add(tok * N + i));
        }
    }
    let mut acc = [0.0f32; 8];
    for i in 0..N {
        for e in 0..4 {
            let [lo, hi] = unpack(xs[i][e]);
            acc[2 * e] += h[i] * lo;
            acc[2 * e + 1] += h[i] * hi;
        }
    }
    // SAFETY: tok < T, 8 v + 8 <= C: inside `x_in [T, C]`, 16-byte aligned, written by this
    // thread only.
    unsafe {
        global::store_v4(
            p.x_in.add(tok * c + VEC as usize * v) as *mut u32,
            pack8(&acc),
        )
    };
}

/// See the module documentation.
///
/// # Safety
/// As for [`pre`], with `y`, `h_post`, `h_res` and `x_next` of the documented sizes.
#[inline(always)]
pub unsafe fn post<const N: usize>(p: PostParams) {
    let Some((tok, v)) = item(p.tokens, p.c) else {
        return;
    };
    let c = p.c as usize;
    let off = VEC as usize * v;
    let mut xs = [[0u32; 4]; N];
    let mut hq = [0.0f32; N];
    let mut hr = [[0.0f32; N]; N];
    // SAFETY: tok < T, 8 v + 8 <= C: inside `y` and (for each stream) `x`, 16-byte aligned;
    // coefficient indices inside `h_post [T, N]` and `h_res [T, N, N]`, read-only here.
    let yv = unsafe { global::load_cg_v4(p.y.add(tok * c + off) as *const u32) };
    for j in 0..N {
        // SAFETY: as above.
        unsafe {
            xs[j] = global::load_cg_v4(p.x.add((tok * N + j) * c + off) as *const u32);
            hq[j] = global::load_nc_f32(p.h_post.add(tok * N + j));
        }
        for i in 0..N {
            // SAFETY: as above.
            hr[i][j] = unsafe { global::load_nc_f32(p.h_res.add((tok * N + i) * N + j)) };
        }
    }
    for i in 0..N {
        let mut acc = [0.0f32; 8];
        for j in 0..N {
            for e in 0..4 {
                let [lo, hi] = unpack(xs[j][e]);
                acc[2 * e] += hr[i][j] * lo;
                acc[2 * e + 1] += hr[i][j] * hi;
            }
        }
        for e in 0..4 {
            let [lo, hi] = unpack(yv[e]);
            acc[2 * e] += hq[i] * lo;
            acc[2 * e + 1] += hq[i] * hi;
        }
        // SAFETY: inside `x_next [T, N, C]`, 16-byte aligned, written by this thread only.
        unsafe {
            global::store_v4(
                p.x_next.add((tok * N + i) * c + off) as *mut u32,
                pack8(&acc),
            )
        };
    }
}
