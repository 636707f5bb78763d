//! `mhc_fwd_proj_n{N}`: partial projections `x~ phi'` and sums of squares `|x~|^2`, split over K,
//! on tensor cores (`mma.sync.m16n8k16`, bf16 x bf16 -> f32).
//!
//! # Parameters
//! [`ProjParams`]: `x [T, K]` bf16, `packed_f1` (from `mhc_prep`), outputs
//! `part_proj [splits, T, M]`, `part_sumsq [splits, T]` (f32), `splits = gridDim.y`.
//!
//! # Tiling
//! Block `(bx, split)` owns tokens `[bx * proj_tokens(N), +proj_tokens(N))` and the K chunks
//! `[split * chunks_per_split, +chunks_per_split)` (32 K values each). Each warp owns `MT` m16
//! tiles of tokens (the `mma` M dimension) and computes all `NT` n8 tiles of the coefficients
//! (the N dimension); a chunk is two k16 steps.
//!
//! The contraction order inside a chunk is permuted so that every operand is a plain 16-byte
//! load: lane `(g, t)` (`g = lane / 4`, `t = lane % 4`) loads `x[row][32 c + 8 t .. + 8]` for
//! its rows `g` and `g + 8` of each tile, and k16 step `h` uses words `2h, 2h + 1` of those
//! vectors. In PTX terms, step `h`'s logical K index `2t + e` is the physical
//! `32 c + 8 t + 4 h + e` and `2t + 8 + e` is `32 c + 8 t + 4 h + 2 + e`; A's and B's fragments
//! agree on it because `mhc_prep` packed each lane's B words (`f1_word_source`) from the same
//! physical positions. Each lane reads its `hi` and `lo` B words of tile `j` as one 16-byte load
//! each (lane-contiguous, through L1: all warps of the block read the same words).
//!
//! Precision: `x` is exact in bf16; `phi'` is `hi + lo` (two `mma`s), accurate to `2^-17`
//! relative per term; accumulation is f32.
//!
//! # Thread mapping
//! `PROJ_THREADS` = 4 warps. Lane `(g, t)` of warp `w` holds, for tile `mt`, the rows
//! `tok = bx * proj_tokens + (w MT + mt) 16 + g (+8)`; the loads of chunk `c + 2` are issued
//! before the products of chunk `c` (a ring of three register buffers), so each warp keeps two
//! chunks (`2 MT` KB) in flight; at `n = 4` (134 registers) three blocks fit on an SM, 48 KB of
//! loads in flight per SM, above what HBM needs (~26 KB at 4.3 TB/s and ~800 ns). The sum of
//! squares accumulates
//! per lane over its 8 values per row and chunk, then over the 4 lanes `t` (shuffles).
//! Accumulator element `(row, 2t + e)` of tile `j` is coefficient `m = 8 j + 2 t + e`.
//! Rows past `T` and chunks past `K` load zeros; only rows `< T` and `m < M` are written.
//!
//! # Barrier protocol
//! No shared memory and no block barrier. The shuffles and `mma`s are executed by all 32 lanes
//! of a warp in uniform control flow (a warp whose first row is past `T` returns at once, as a
//! whole).

use super::unpack;
use crate::arch::{global, index, mma, warp};
use kernel_abi::mhc::*;

/// Load the lane's 16-byte vectors of chunk `chunk` for its `2 MT` rows (zeros outside).
#[inline(always)]
unsafe fn load_chunk<const MT: usize>(
    p: &ProjParams,
    rows: &[[u32; 2]; MT],
    chunk: u32,
    t: u32,
) -> [[[u32; 4]; 2]; MT] {
    let mut v = [[[0u32; 4]; 2]; MT];
    let k = chunk * F1_CHUNK + 8 * t;
    if k < p.k {
        for mt in 0..MT {
            for r in 0..2 {
                let tok = rows[mt][r];
                if tok < p.tokens {
                    // SAFETY: tok < T and k + 8 <= K (K is a multiple of 8): inside x; the
                    // offset is a multiple of 8 elements (K and k are), so 16-byte aligned.
                    v[mt][r] = unsafe {
                        global::load_cg_v4(
                            p.x.add(tok as usize * p.k as usize + k as usize) as *const u32
                        )
                    };
                }
            }
        }
    }
    v
}

/// See the module documentation.
///
/// # Safety
/// Grid `(ceil(T / proj_tokens(N)), splits)` of `PROJ_THREADS` threads, no shared memory;
/// `chunks_per_split * splits >= f1_chunks(K)`; the pointers hold the documented sizes.
#[inline(always)]
pub unsafe fn run<const N: usize, const NT: usize, const MT: usize>(p: ProjParams) {
    const {
        assert!(NT == nt_of(N as u32) as usize && MT == proj_mt(N as u32) as usize);
    }
    let m_total = m_of(N as u32);
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let tok0 = index::block_idx_x() * proj_tokens(N as u32) + index::warp_id() * MT as u32 * 16;
    if tok0 >= p.tokens {
        return;
    }
    let split = index::block_idx_y();
    let first = split * p.chunks_per_split;
    let last = (first + p.chunks_per_split).min(f1_chunks(p.k));
    let mut rows = [[0u32; 2]; MT];
    for mt in 0..MT {
        rows[mt] = [tok0 + 16 * mt as u32 + g, tok0 + 16 * mt as u32 + g + 8];
    }

    let mut acc = [[[0.0f32; 4]; NT]; MT];
    let mut sq = [[0.0f32; 2]; MT];
    // A ring of three register buffers: chunks `c + 1` and `c + 2` are in flight while `c` is
    // multiplied (a warp keeps `2 MT` KB of loads outstanding).
    let load = |c: u32| {
        if c < last {
            // SAFETY: bounds are checked inside (rows < T, k < K).
            unsafe { load_chunk::<MT>(&p, &rows, c, t) }
        } else {
            [[[0; 4]; 2]; MT]
        }
    };
    let mut cur = load(first);
    let mut next = load(first + 1);
    let mut chunk = first;
    while chunk < last {
        let after = load(chunk + 2);
        for mt in 0..MT {
            for r in 0..2 {
                for w in 0..4 {
                    let [a, b] = unpack(cur[mt][r][w]);
                    sq[mt][r] += a * a + b * b;
                }
            }
        }
        for j in 0..NT {
            let at = |hl: u32| lane_word(f1_block(N as u32, chunk, j as u32, hl), lane, 0) as usize;
            // SAFETY: chunk < f1_chunks(K) and j < NT: inside `packed_f1`; the index is a
            // multiple of 4 words (16-byte aligned); nothing writes it during the kernel.
            let (bhi, blo) = unsafe {
                (
                    global::load_nc_v4(p.packed_f1.add(at(0))),
                    global::load_nc_v4(p.packed_f1.add(at(1))),
                )
            };
            for h in 0..2 {
                for mt in 0..MT {
                    let a = [
                        cur[mt][0][2 * h],
                        cur[mt][1][2 * h],
                        cur[mt][0][2 * h + 1],
                        cur[mt][1][2 * h + 1],
                    ];
                    // SAFETY: the whole warp executes this in uniform control flow.
                    unsafe {
                        mma::m16n8k16_bf16(&mut acc[mt][j], a, [bhi[2 * h], bhi[2 * h + 1]]);
                        mma::m16n8k16_bf16(&mut acc[mt][j], a, [blo[2 * h], blo[2 * h + 1]]);
                    }
                }
            }
        }
        cur = next;
        next = after;
        chunk += 1;
    }

    let base = split as usize * p.tokens as usize;
    for mt in 0..MT {
        for r in 0..2 {
            let mut s = sq[mt][r];
            // SAFETY: all 32 lanes execute these shuffles (uniform control flow).
            unsafe {
                s += warp::shfl_xor_f32(warp::FULL_MASK, s, 1);
                s += warp::shfl_xor_f32(warp::FULL_MASK, s, 2);
            }
            let tok = rows[mt][r];
            if tok >= p.tokens {
                continue;
            }
            let row = base + tok as usize;
            if t == 0 {
                // SAFETY: split < splits and tok < T: inside `part_sumsq [splits, T]`.
                unsafe { *p.part_sumsq.add(row) = s };
            }
            for j in 0..NT {
                for e in 0..2 {
                    let m = 8 * j as u32 + 2 * t + e as u32;
                    if m < m_total {
                        // SAFETY: row < splits * T and m < M: inside `part_proj`.
                        unsafe {
                            *p.part_proj.add(row * m_total as usize + m as usize) =
                                acc[mt][j][2 * r + e]
                        };
                    }
                }
            }
        }
    }
}
