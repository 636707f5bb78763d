//! The attention mask: which keys a query row may attend, shared by both kernels (each applies
//! it to its own accumulator layout: the `mma.sync` kernel per S fragment, the Hopper kernel
//! through each row's key range).
//!
//! Row `i` (of `seq_q`) may attend key `j` (of `seq_k`) when `j < seq_k` and, with the window
//! aligned to the bottom right (`offset = seq_k - seq_q`), `j >= i + offset - window_left` and
//! `j <= i + offset + window_right`; a negative bound is no bound, and `window_right = 0` is the
//! causal mask. Masked logits are -inf (the softmax never forms `-inf - -inf`: see
//! [`super::softmax`]). A step of keys that lies inside every row's window skips the mask
//! ([`step_needs_mask`]). Sequence lengths and windows are kept below 2^30 by the host, so the
//! sums below are exact in i32 unless noted.

/// Whether the key step `n0 .. n0 + BN` crosses, for some row of the query block
/// `m0 .. m0 + BM`, a window edge or `seq_k` (else every logit of the step is allowed).
#[inline(always)]
pub(super) fn step_needs_mask<const BM: u32, const BN: u32>(
    m0: u32,
    n0: u32,
    offset: i32,
    window_left: i32,
    window_right: i32,
    seq_k: i32,
) -> bool {
    let (off, wl, wr, sk) = (offset, window_left, window_right, seq_k);
    let row_lo = m0 as i32;
    let row_hi = (m0 + BM - 1) as i32;
    let (key_lo, key_hi) = (n0 as i32, (n0 + BN - 1) as i32);
    key_hi >= sk
        || (wr >= 0 && key_hi > row_lo + off + wr)
        || (wl >= 0 && key_lo < row_hi + off - wl)
}

/// Whether row `row` may attend key `key` (both absolute).
#[inline(always)]
pub(super) fn allowed(
    row: i32,
    key: i32,
    offset: i32,
    window_left: i32,
    window_right: i32,
    seq_k: i32,
) -> bool {
    let (off, wl, wr, sk) = (offset, window_left, window_right, seq_k);
    key < sk && (wl < 0 || key >= row + off - wl) && (wr < 0 || key <= row + off + wr)
}

/// The `block_m`-row query blocks `mb_lo .. mb_lo + m_steps` whose rows may attend a key of
/// `n0 .. n0 + keys` (`n0 + keys <= seq_k`): `(mb_lo, m_steps)`, `(0, 0)` when no row does.
/// The walk of a backward block of keys over its query blocks.
#[inline(always)]
pub(super) fn query_blocks(
    n0: u32,
    keys: u32,
    seq_q: u32,
    seq_k: u32,
    window_left: i32,
    window_right: i32,
    block_m: u32,
) -> (u32, u32) {
    let (wl, wr) = (window_left, window_right);
    // Query rows that may see a key of the block: [i_lo, i_hi) (i64: the offset is any sign).
    let off = seq_k as i64 - seq_q as i64;
    let i_lo = if wr >= 0 {
        (n0 as i64 - off - wr as i64).max(0)
    } else {
        0
    };
    let i_hi = if wl >= 0 {
        ((n0 + keys) as i64 - off + wl as i64).min(seq_q as i64)
    } else {
        seq_q as i64
    };
    if i_hi > i_lo {
        let lo = i_lo as u32 / block_m;
        (lo, (i_hi as u32).div_ceil(block_m) - lo)
    } else {
        (0, 0)
    }
}
