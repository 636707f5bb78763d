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
//! The contraction order inside a chunk is permuted so that every operand is one 16-byte
//! vector: lane `(g, t)` (`g = lane / 4`, `t = lane % 4`) takes `x[row][32 c + 8 t .. + 8]` for
//! its rows `g` and `g + 8` of each tile, and k16 step `h` uses words `2h, 2h + 1` of those
//! vectors. In PTX terms, step `h`'s logical K index `2t + e` is the physical
//! `32 c + 8 t + 4 h + e` and `2t + 8 + e` is `32 c + 8 t + 4 h + 2 + e`; A's and B's fragments
//! agree on it because `mhc_prep` packed each lane's B words (`f1_word_source`) from the same
//! physical positions.
//!
//! Precision: `x` is exact in bf16; `phi'` is `hi + lo` (two `mma`s), accurate to `2^-17`
//! relative per term; accumulation is f32.
//!
//! # Pipeline
//! `x` and the chunk's `phi'` blocks stream through a ring of `ST` `cp.async` stages of `SC`
//! chunks ([`ProjConfig`]: `proj_config(n)`, or a tuning variant): stage `s` holds the block's
//! `proj_tokens` rows of `row_bytes = 64 SC` (row `r`'s 16-byte piece `p` at
//! `r * row_bytes + 16 (p ^ 4 (r & 1))`: the XOR puts rows `g` and `g + 1`, read by one
//! quarter-warp, in different bank halves), then the stage's `phi'` blocks as they lie in the
//! packing. Copies do not hold registers, so each SM keeps `ST - 1` stages per block in flight
//! (88 KB at `n = 4` by default: 2 blocks of 44 KB stages), more than HBM needs at its unloaded
//! latency (~26 KB per SM at 4.3 TB/s and ~800 ns); the configurations' times are in
//! `bench/NOTES.md`. Pieces of rows past `T`, of K past `K`, or of chunks past the block's range
//! are zero-filled without reading.
//!
//! # Thread mapping
//! `PROJ_THREADS` = 4 warps. Copies: thread `tid` copies piece `tid % P` of rows
//! `tid / P + (128 / P) i` (`P = 4 SC` pieces per row: `P` threads read a row's `64 SC`
//! contiguous bytes), then pieces `tid + 128 i` of the `phi'` blocks. Products: lane `(g, t)` of
//! warp `w` holds, for tile `mt`, the rows `(w MT + mt) 16 + g (+8)` of the block; it reads its `x` vectors and its `hi`/`lo` B words
//! with one `ld.shared.v4` each. The sum of squares accumulates per lane over its 8 values per
//! row and chunk, then over the 4 lanes `t` (shuffles). Accumulator element `(row, 2t + e)` of
//! tile `j` is coefficient `m = 8 j + 2 t + e`. Only rows `< T` and `m < M` are written.
//!
//! # Barrier protocol (all `bar.sync 0`, reached uniformly by every thread of the block)
//! - Prologue: the copies of steps `0 .. ST - 1` go to stages `0 ..`, one commit group per
//!   step (empty groups past the last step).
//! - Step `s`: `cp.async.wait_group(ST - 2)` (this thread's copies of step `s` have landed),
//!   then the barrier: every thread's copies of step `s` are visible, and every thread has
//!   finished the products of step `s - 1`, the last reads of stage `(s - 1) % ST`. Then the
//!   copies of step `s + ST - 1` go to that stage (one commit group), and the products of step
//!   `s` read stage `s % ST`.
//! - The shuffles and `mma`s are executed by all 32 lanes of a warp in uniform control flow
//!   (warps whose rows are all past `T` compute on zeros and write nothing). The block waits for
//!   all its copies before it exits.

use super::unpack;
use crate::arch::{cp_async, index, mma, smem, sync, warp};
use kernel_abi::WARP_SIZE;
use kernel_abi::mhc::*;
use smem::SmemValue;

/// Byte offset of piece `piece` of row `row` in a stage's `x` tile of `SC` chunks per row.
#[inline(always)]
const fn x_piece<const SC: u32>(row: u32, piece: u32) -> u32 {
    row * (SC * F1_CHUNK * 2) + 16 * (piece ^ ((row & 1) << 2))
}

/// Issue this thread's copies of the `SC` chunks `chunk0 ..` into the stage at shared address
/// `at`.
///
/// # Safety
/// The launch contract of [`run`]; the stage at `at` is not read by any thread until the
/// barrier that follows this thread's `wait_group` for these copies.
#[inline(always)]
unsafe fn copy_step<const N: usize, const SC: u32>(
    p: &ProjParams,
    at: u32,
    tok0: u32,
    chunk0: u32,
    last: u32,
) {
    const { assert!(SC >= 2 && PROJ_THREADS.is_multiple_of(SC * F1_CHUNK / 8)) };
    let pieces = SC * F1_CHUNK / 8;
    let tid = index::thread_idx_x();
    let tokens = proj_tokens(N as u32);
    let piece = tid % pieces;
    let chunk = chunk0 + piece / (F1_CHUNK / 8);
    let k = chunk0 * F1_CHUNK + 8 * piece;
    let col_ok = chunk < last && k < p.k;
    let mut row = tid / pieces;
    while row < tokens {
        let tok = tok0 + row;
        let dst = at + x_piece::<SC>(row, piece);
        if col_ok && tok < p.tokens {
            // SAFETY: tok < T and k + 8 <= K (K is a multiple of 8): 16 readable bytes of `x`,
            // 16-byte aligned (K and k multiples of 8); dst is inside the stage (row < tokens).
            unsafe {
                cp_async::copy_16(
                    dst,
                    p.x.add(tok as usize * p.k as usize + k as usize) as *const u8,
                )
            };
        } else {
            // SAFETY: nothing is read (0 source bytes); dst is inside the stage.
            unsafe { cp_async::copy_16_zfill(dst, p.x as *const u8, 0) };
        }
        row += PROJ_THREADS / pieces;
    }
    let phi_at = at + proj_tokens(N as u32) * SC * F1_CHUNK * 2;
    let block_pieces = WARP_SIZE; // one 16-byte piece per lane and block
    let blocks_per_chunk = nt_of(N as u32) * 2;
    let mut i = tid;
    while i < SC * blocks_per_chunk * block_pieces {
        let c = chunk0 + i / (blocks_per_chunk * block_pieces);
        let dst = phi_at + 16 * i;
        if c < last {
            // SAFETY: c < last <= f1_chunks(K): piece i of the stage is word
            // 4 (chunk0 * blocks_per_chunk * 32 + i) of `packed_f1`, inside `f1_words(N, K)`,
            // 16-byte aligned; dst is inside the stage's phi area.
            unsafe {
                cp_async::copy_16(
                    dst,
                    p.packed_f1
                        .add(4 * (chunk0 * blocks_per_chunk * block_pieces + i) as usize)
                        as *const u8,
                )
            };
        } else {
            // SAFETY: nothing is read; dst is inside the stage.
            unsafe { cp_async::copy_16_zfill(dst, p.packed_f1 as *const u8, 0) };
        }
        i += PROJ_THREADS;
    }
}

/// See the module documentation.
///
/// # Safety
/// Grid `(ceil(T / proj_tokens(N)), splits)` of `PROJ_THREADS` threads, `smem_bytes(N)` of
/// dynamic shared memory for the [`ProjConfig`] of `SC` chunks and `ST` stages (`WAIT = ST - 2`); `chunks_per_split * splits >= f1_chunks(K)`; the pointers hold the
/// documented sizes.
#[inline(always)]
pub unsafe fn run<
    const N: usize,
    const NT: usize,
    const MT: usize,
    const SC: u32,
    const ST: u32,
    const WAIT: u32,
>(
    p: ProjParams,
) {
    const {
        assert!(NT == nt_of(N as u32) as usize && MT == proj_mt(N as u32) as usize);
        assert!(ST >= 2 && WAIT == ST - 2 && F1_CHUNK == 32);
    }
    let cfg = ProjConfig {
        stage_chunks: SC,
        stages: ST,
        target_blocks: 0,
    };
    let m_total = m_of(N as u32);
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let tok0 = index::block_idx_x() * proj_tokens(N as u32);
    let row0 = index::warp_id() * MT as u32 * 16;
    let split = index::block_idx_y();
    let first = split * p.chunks_per_split;
    let last = (first + p.chunks_per_split).min(f1_chunks(p.k));
    let steps = last.saturating_sub(first).div_ceil(SC);
    let smem = smem::aligned_base();
    let stage_at = |s: u32| smem + (s % ST) * cfg.stage_bytes(N as u32);
    let issue = |step: u32| {
        if step < steps {
            // SAFETY: the launch contract; the stage's previous contents were last read before
            // the barrier that precedes this call (barrier protocol).
            unsafe { copy_step::<N, SC>(&p, stage_at(step), tok0, first + step * SC, last) };
        }
        cp_async::commit_group();
    };
    for s in 0..ST - 1 {
        issue(s);
    }

    let mut acc = [[[0.0f32; 4]; NT]; MT];
    let mut sq = [[0.0f32; 2]; MT];
    let mut step = 0;
    while step < steps {
        cp_async::wait_group::<WAIT>();
        // SAFETY: reached by every thread of the block (uniform loop over `steps`).
        unsafe { sync::sync_threads() };
        issue(step + ST - 1);
        let at = stage_at(step);
        let phi_at = at + cfg.x_stage_bytes(N as u32);
        for cc in 0..SC {
            let mut cur = [[[0u32; 4]; 2]; MT];
            for mt in 0..MT {
                for r in 0..2 {
                    let row = row0 + 16 * mt as u32 + g + 8 * r as u32;
                    // SAFETY: row < proj_tokens, piece < 8: inside the stage's x tile, 16-byte
                    // aligned; published by the barrier above.
                    cur[mt][r] = unsafe { <[u32; 4]>::load(at + x_piece::<SC>(row, 4 * cc + t)) };
                    for w in 0..4 {
                        let [a, b] = unpack(cur[mt][r][w]);
                        sq[mt][r] += a * a + b * b;
                    }
                }
            }
            for j in 0..NT {
                let blk = |hl: u32| phi_at + 16 * ((cc * NT as u32 + j as u32) * 2 + hl) * 32;
                // SAFETY: inside the stage's phi area (cc < SC, j < NT), 16-byte
                // aligned; published by the barrier above.
                let (bhi, blo) = unsafe {
                    (
                        <[u32; 4]>::load(blk(0) + 16 * lane),
                        <[u32; 4]>::load(blk(1) + 16 * lane),
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
        }
        step += 1;
    }
    cp_async::wait_all();

    let base = split as usize * p.tokens as usize;
    for mt in 0..MT {
        for r in 0..2 {
            let mut s = sq[mt][r];
            // SAFETY: all 32 lanes execute these shuffles (uniform control flow).
            unsafe {
                s += warp::shfl_xor_f32(warp::FULL_MASK, s, 1);
                s += warp::shfl_xor_f32(warp::FULL_MASK, s, 2);
            }
            let tok = tok0 + row0 + 16 * mt as u32 + g + 8 * r as u32;
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
