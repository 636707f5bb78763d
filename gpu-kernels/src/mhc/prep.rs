//! `mhc_prep`: `phi' = diag(gamma) phi` as bf16 `hi`/`lo` tensor-core fragments.
//!
//! # Parameters
//! [`PrepParams`]: `phi [K, M]` f32, `gamma [K]` f32 or null, outputs `packed_f1`
//! (`f1_words(n, K)` u32) and `packed_b2` (`b2_words(n, C)` u32).
//!
//! # Thread mapping
//! One thread per packed u32 word (two bf16): word `id < f1_words` of the projection packing,
//! the rest of the input-gradient packing; `PREP_THREADS` per block, a one-dimensional grid
//! covering both. What each word holds is `kernel_abi::mhc::f1_word_source` /
//! `b2_word_source`; `hi = bf16(phi')`, `lo = bf16(phi' - hi)` (exact difference in f32);
//! positions outside `K x M` hold zero.
//!
//! # Barrier protocol
//! None: every thread writes its own word.

use crate::arch::{convert, index};
use kernel_abi::WARP_SIZE;
use kernel_abi::mhc::*;

/// `hi` (`hl = 0`) or `lo` (`hl = 1`) half of `phi'[k][m]` as bf16 bits; zero outside the matrix.
#[inline(always)]
fn half(p: &PrepParams, k: u32, m: u32, hl: u32) -> u32 {
    let (kk, mm) = (p.n * p.c, m_of(p.n));
    if k >= kk || m >= mm {
        return 0;
    }
    // SAFETY: k < K and m < M: inside `phi [K, M]`; `gamma` (when not null) holds K values.
    let v = unsafe {
        let w = *p.phi.add(k as usize * mm as usize + m as usize);
        if p.gamma.is_null() {
            w
        } else {
            w * *p.gamma.add(k as usize)
        }
    };
    let hi = convert::f32_to_bf16(v);
    if hl == 0 {
        hi as u32
    } else {
        convert::f32_to_bf16(v - convert::bf16_to_f32(hi)) as u32
    }
}

/// See the module documentation.
///
/// # Safety
/// Grid of at least `(f1_words + b2_words) / PREP_THREADS` blocks (rounded up) of
/// `PREP_THREADS` threads; the pointers hold the documented sizes for `n`, `c`.
#[inline(always)]
pub unsafe fn run(p: PrepParams) {
    let id = index::block_idx_x() * PREP_THREADS + index::thread_idx_x();
    let (n, c) = (p.n, p.c);
    let f1 = f1_words(n, n * c);
    let b2 = b2_words(n, c);
    if id < f1 {
        let w = id % 4;
        let lane = (id / 4) % WARP_SIZE;
        let hl = (id / (4 * WARP_SIZE)) % 2;
        let block = id / (8 * WARP_SIZE);
        let (j, chunk) = (block % nt_of(n), block / nt_of(n));
        let (k, m) = f1_word_source(chunk, j, lane, w);
        let word = half(&p, k, m, hl) | half(&p, k + 1, m, hl) << 16;
        // SAFETY: id < f1_words = length of `packed_f1`.
        unsafe { *p.packed_f1.add(id as usize) = word };
    } else if id < f1 + b2 {
        let id = id - f1;
        let w = id % 4;
        let lane = (id / 4) % WARP_SIZE;
        let hl = (id / (4 * WARP_SIZE)) % 2;
        let block = id / (8 * WARP_SIZE);
        let s = block % s16_of(n);
        let rest = block / s16_of(n);
        let (group, i) = (rest % b2_groups(c), rest / b2_groups(c));
        let (ch, m) = b2_word_source(group, s, lane, w);
        let word = if ch < c {
            let k = i * c + ch;
            half(&p, k, m, hl) | half(&p, k, m + 1, hl) << 16
        } else {
            0
        };
        // SAFETY: id < b2_words = length of `packed_b2`.
        unsafe { *p.packed_b2.add(id as usize) = word };
    }
}
