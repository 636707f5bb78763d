//! The tile scheduler of the persistent Hopper kernel: block `b` computes tiles `b`,
//! `b + grid`, ... in the order of [`tile`]; both the producer and the consumers walk the same
//! sequence.

use crate::attention::seq::clamp_range;
use kernel_abi::attention::{HOPPER_BLOCK_M, HopperParams};

/// One tile of the persistent grid: 128 query rows of one (batch, head) and the key steps
/// they may attend.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    /// First query row of the tile in its sequence.
    pub(super) m0: u32,
    pub(super) head: u32,
    pub(super) batch: u32,
    pub(super) head_kv: u32,
    /// Query rows of the tile inside its sequence (0 for a tile past a packed sequence's end).
    pub(super) rows_valid: u32,
    /// First key step (keys `nb_lo * BN ..`).
    pub(super) nb_lo: u32,
    /// Key steps (0 when no row of the tile may attend any key).
    pub(super) steps: u32,
    /// The sequence's query and key rows (`seq_q`, `seq_k` of the parameters on a dense batch).
    pub(super) seq_q: u32,
    pub(super) seq_k: u32,
    /// The sequence's first query and key rows in the packed tensors (0 on a dense batch).
    pub(super) q0: u32,
    pub(super) k0: u32,
}

/// Tile `t` (`< num_tiles`). The query blocks of one (batch, head) are consecutive, so that the
/// blocks running at one time share K and V in L2 (walking all heads of one query block first,
/// longest first, was slower under causal masking: bench/NOTES.md); under causal masking
/// (`reverse_m`) each (batch, head) starts from its last, longest query block. `VARLEN`: `batch`
/// is a packed sequence, its rows read from `cu_seqlens_*` and clamped into the totals (as the
/// `mma.sync` kernels' `seq::Packed`); a tile past its sequence's query rows has no row and no
/// step.
///
/// # Safety
/// `p` is the kernel's parameters (with `VARLEN`, `cu_seqlens_*` hold `batch + 1` entries).
#[inline(always)]
pub(super) unsafe fn tile<const BN: u32, const VARLEN: bool>(p: &HopperParams, t: u32) -> Tile {
    let (m_idx, hb) = (t % p.num_m_blocks, t / p.num_m_blocks);
    let m_block = if p.reverse_m != 0 {
        p.num_m_blocks - 1 - m_idx
    } else {
        m_idx
    };
    let (head, batch) = (hb % p.heads_q, hb / p.heads_q);
    let m0 = m_block * HOPPER_BLOCK_M;
    let (seq_q, seq_k, q0, k0) = if VARLEN {
        // SAFETY: `batch < p.batch` (t < num_tiles) and both arrays have `batch + 1` entries
        // (the caller's contract).
        let (q0, q1, k0, k1) = unsafe {
            let b = batch as usize;
            (
                *p.cu_seqlens_q.add(b),
                *p.cu_seqlens_q.add(b + 1),
                *p.cu_seqlens_k.add(b),
                *p.cu_seqlens_k.add(b + 1),
            )
        };
        let (q0, q1) = clamp_range(q0, q1, p.total_q);
        let (k0, k1) = clamp_range(k0, k1, p.total_k);
        (q1 - q0, k1 - k0, q0, k0)
    } else {
        (p.seq_q, p.seq_k, 0, 0)
    };
    if VARLEN && m0 >= seq_q {
        return Tile {
            m0,
            head,
            batch,
            head_kv: head / (p.heads_q / p.heads_kv),
            rows_valid: 0,
            nb_lo: 0,
            steps: 0,
            seq_q,
            seq_k,
            q0,
            k0,
        };
    }
    let rows_valid = (seq_q - m0).min(HOPPER_BLOCK_M);
    let offset = seq_k as i64 - seq_q as i64;
    let n_lo = if p.window_left >= 0 {
        (m0 as i64 + offset - p.window_left as i64).max(0)
    } else {
        0
    };
    let n_hi = if p.window_right >= 0 {
        ((m0 + rows_valid - 1) as i64 + offset + p.window_right as i64 + 1).min(seq_k as i64)
    } else {
        seq_k as i64
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
        seq_q,
        seq_k,
        q0,
        k0,
    }
}
