//! The tile scheduler of the persistent Hopper kernel: block `b` computes tiles `b`,
//! `b + grid`, ... in the order of [`tile`]; both the producer and the consumers walk the same
//! sequence.

use kernel_abi::attention::{HOPPER_BLOCK_M, HopperParams};

/// One tile of the persistent grid: 128 query rows of one (batch, head) and the key steps
/// they may attend.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub(super) m0: u32,
    pub(super) head: u32,
    pub(super) batch: u32,
    pub(super) head_kv: u32,
    pub(super) rows_valid: u32,
    /// First key step (keys `nb_lo * BN ..`).
    pub(super) nb_lo: u32,
    /// Key steps (0 when no row of the tile may attend any key).
    pub(super) steps: u32,
}

/// Tile `t` (`< num_tiles`). The query blocks of one (batch, head) are consecutive, so that the
/// blocks running at one time share K and V in L2 (walking all heads of one query block first,
/// longest first, was slower under causal masking: bench/NOTES.md); under causal masking
/// (`reverse_m`) each (batch, head) starts from its last, longest query block.
#[inline(always)]
pub(super) fn tile<const BN: u32>(p: &HopperParams, t: u32) -> Tile {
    let (m_idx, hb) = (t % p.num_m_blocks, t / p.num_m_blocks);
    let m_block = if p.reverse_m != 0 {
        p.num_m_blocks - 1 - m_idx
    } else {
        m_idx
    };
    let (head, batch) = (hb % p.heads_q, hb / p.heads_q);
    let m0 = m_block * HOPPER_BLOCK_M;
    let rows_valid = (p.seq_q - m0).min(HOPPER_BLOCK_M);
    let offset = p.seq_k as i64 - p.seq_q as i64;
    let n_lo = if p.window_left >= 0 {
        (m0 as i64 + offset - p.window_left as i64).max(0)
    } else {
        0
    };
    let n_hi = if p.window_right >= 0 {
        ((m0 + rows_valid - 1) as i64 + offset + p.window_right as i64 + 1).min(p.seq_k as i64)
    } else {
        p.seq_k as i64
    };
    let (nb_lo, steps) = if n_hi > n_lo {
        let lo = n_lo as u32 / BN;
        (lo, (n_hi as u32).div_ceil(BN) - lo)
    } else {
        (0, 0)
    };
    Tile {
        m0,
        head,
        batch,
        head_kv: head / (p.heads_q / p.heads_kv),
        rows_valid,
        nb_lo,
        steps,
    }
}
