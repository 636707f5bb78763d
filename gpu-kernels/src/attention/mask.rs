//! The attention mask: which keys a query row may attend, shared by both kernels (each applies
//! it to its own accumulator layout: the `mma.sync` kernel per S fragment, the Hopper kernel
//! through each row's key range).
//!
//! Row `i` (of `seq_q`) may attend key `j` (of `seq_k`) when `j < seq_k` and, with the window
//! aligned to the bottom right (`offset = seq_k - seq_q`), `j >= i + offset - window_left` and
//! `j <= i + offset + window_right`; a negative bound is no bound, and `window_right = 0` is the
//! causal mask. Masked logits are -inf (the softmax never forms `-inf - -inf`: see
//! [`super::softmax`]). A step of keys that lies inside every row's window skips the mask
//! ([`step_needs_mask`]). The range helpers (`key_range`, `query_range`, `fill_outside`) serve
//! the Hopper kernels and are compiled with them (sm_90a). Sequence lengths and windows are
//! kept below 2^30 by the host, so the sums below are exact in i32 unless noted.

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

/// The keys row `row` may attend: `lo ..= hi` (empty when `lo > hi`), the keys `j < seq_k`
/// with [`allowed`]`(row, j, ..)`, clamped to `0 ..= seq_k - 1` (computed in i64: the sum of
/// three values below 2^30 may leave i32). Masks on accumulators whose rows are queries.
#[cfg(target_feature = "sm_90a")]
pub(super) fn key_range(
    row: u32,
    window_left: i32,
    window_right: i32,
    seq_k: i32,
    offset: i32,
) -> (i32, i32) {
    let r = row as i64 + offset as i64;
    let lo = if window_left >= 0 {
        (r - window_left as i64).max(0)
    } else {
        0
    };
    let hi = if window_right >= 0 {
        (r + window_right as i64).min(seq_k as i64 - 1)
    } else {
        seq_k as i64 - 1
    };
    // lo <= seq_k and hi >= -2^31 after the clamps: both fit i32 (hi only matters when
    // compared with keys >= 0, so a very negative one is clamped to -1).
    (lo.min(seq_k as i64) as i32, hi.max(-1) as i32)
}

/// The query rows that may attend key `key`: `lo ..= hi` (empty when `lo > hi`), the rows
/// `i < seq_q` with [`allowed`]`(i, key, ..)` (none when `key >= seq_k`), clamped to `0 ..=
/// seq_q - 1` (in i64, as [`key_range`]). Masks on accumulators whose rows are keys (the
/// backward's `S^T`).
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub(super) fn query_range(
    key: i32,
    seq_q: u32,
    offset: i32,
    window_left: i32,
    window_right: i32,
    seq_k: i32,
) -> (i32, i32) {
    // key <= i + offset + window_right and key >= i + offset - window_left, solved for i: the
    // keys row `key` may attend at offset `-offset` with the windows exchanged.
    let (lo, hi) = key_range(key as u32, window_right, window_left, seq_q as i32, -offset);
    (lo, if key < seq_k { hi } else { -1 })
}

/// Set to `fill` the entries of a thread's f32 `wgmma` accumulator fragment that lie outside
/// their row's allowed columns. Entry `4 j + e` is in row `e / 2` of the thread's two (`g`, `g +
/// 8` of its warp) and column `8 j + e % 2` counted from the thread's first (`2 t`); `lo[h] ..=
/// hi[h]` are row `h`'s allowed columns on that count. Branch-free: two compares and a select
/// per entry.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub(super) fn fill_outside<const SR: usize>(
    s: &mut [f32; SR],
    lo: [i32; 2],
    hi: [i32; 2],
    fill: f32,
) {
    for j in 0..SR / 4 {
        for e in 0..4 {
            let (h, c) = (e / 2, (8 * j + e % 2) as i32);
            let allowed = c >= lo[h] && c <= hi[h];
            s[4 * j + e] = if allowed { s[4 * j + e] } else { fill };
        }
    }
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
