//! The tile scheduler of the Hopper kernel: block `b` computes tiles `b`, `b + grid`, ... in
//! the order of [`tile`]; both the producer and the consumers walk the same sequence.
//!
//! Packed sequences (`VARLEN`, one block per tile): the tiles of one query head are slots
//! `0 .. num_m_blocks` (`floor(total_q / 128) + batch` of them), sequence `b` owning the slots
//! from `first(b) = floor(cu_seqlens_q[b] / 128) + b` on. `first` is non-decreasing and leaves
//! each sequence `floor((cu_seqlens_q[b] % 128 + len) / 128) + 1 >= ceil(len / 128)` slots: its
//! query blocks, and at most one empty slot more. So no grid position is spent on a query block
//! past a short sequence's end (as a `max_seqlen_q` grid would), and a block finds its sequence
//! with a 32-way search of `cu_seqlens_q` by each warp ([`packed_sequence`]).
//!
//! The packed kernels' persistent grid ([`HopperParams::tile_counter`]): the lengths differ, so
//! the tiles are claimed at run time. One scheduler warp per block draws them and finds their
//! sequences ([`schedule`]), and hands each to the producer and the consumers through the
//! [`Handoff`] in shared memory, a ring of `HOPPER_HANDOFF_SLOTS` slots. The dense kernels of
//! `HopperGrid::Dynamic` draw theirs the same way (tiles of unequal length under a mask, taken
//! by whichever block is free first).

use crate::arch::mbarrier::Mbarrier;
use crate::arch::smem::SmemArray;
use crate::arch::{atomic, index, warp};
use crate::attention::seq::clamp_range;
use kernel_abi::attention::{
    HOPPER_BLOCK_M, HOPPER_HANDOFF_SLOTS, HopperParams, hopper_varlen_first_slot,
};

/// The tile handoff of the scheduled kernels (`SCHEDULED`: the packed ones and those of
/// `HopperGrid::Dynamic`): slot `n % HOPPER_HANDOFF_SLOTS` carries the block's
/// `n`-th tile (its index and packed sequence; an index of at least `num_tiles` ends the walk).
///
/// # Barrier protocol
/// `full[s]` (count 1) and `empty[s]` (count `HOPPER_HANDOFF_TAKERS`: every consumer thread and
/// the producer's thread), phase `n / HOPPER_HANDOFF_SLOTS` for the `n`-th tile. Lane 0 of the
/// scheduler warp waits until `empty[s]` completed the slot's previous phase (parity `^ 1`: the
/// first pass does not wait), writes the slot and arrives on `full[s]` (release); each taker
/// waits on `full[s]` (acquire), reads the slot and arrives on `empty[s]`. The last tile (the
/// end) is read by every taker and released by none: nothing is written after it.
#[derive(Clone, Copy)]
pub(super) struct Handoff {
    /// `2 HOPPER_HANDOFF_SLOTS` words: (tile, sequence) per slot.
    pub(super) slots: SmemArray<u32>,
    /// The first `full` barrier; the `empty` ones follow the `full` ones.
    pub(super) bars: u32,
}

impl Handoff {
    fn full(self, s: u32) -> Mbarrier {
        Mbarrier::at(self.bars + 8 * s)
    }

    fn empty(self, s: u32) -> Mbarrier {
        Mbarrier::at(self.bars + 8 * (HOPPER_HANDOFF_SLOTS + s))
    }

    /// Initialize the barriers: `takers` arrivals per phase of `empty`.
    ///
    /// # Safety
    /// One thread, with the kernel's other barriers (published the same way).
    #[inline(always)]
    pub(super) unsafe fn init(self, takers: u32) {
        for s in 0..HOPPER_HANDOFF_SLOTS {
            // SAFETY: forwarded to the caller.
            unsafe {
                self.full(s).init(1);
                self.empty(s).init(takers);
            }
        }
    }

    /// Publish the `n`-th tile (lane 0 of the scheduler warp, tiles in order).
    ///
    /// # Safety
    /// The barriers are initialized and published; one caller.
    #[inline(always)]
    unsafe fn put(self, n: u32, tile: u32, seq: u32) {
        let (s, phase) = (n % HOPPER_HANDOFF_SLOTS, (n / HOPPER_HANDOFF_SLOTS) & 1);
        // SAFETY: the protocol above: the slot is free once `empty` completed its previous
        // phase; only this thread writes the slots.
        unsafe {
            self.empty(s).wait_parity(phase ^ 1);
            self.slots.store(2 * s, tile);
            self.slots.store(2 * s + 1, seq);
            self.full(s).arrive();
        }
    }

    /// Take the `n`-th tile: (index, sequence); every taker, tiles in order. The slot is
    /// released unless the tile ends the walk (`index >= num_tiles`).
    ///
    /// # Safety
    /// The barriers are initialized and published; the caller is one of the takers and takes
    /// every tile up to the end.
    #[inline(always)]
    pub(super) unsafe fn take(self, n: u32, num_tiles: u32) -> (u32, u32) {
        let (s, phase) = (n % HOPPER_HANDOFF_SLOTS, (n / HOPPER_HANDOFF_SLOTS) & 1);
        // SAFETY: the protocol above: the scheduler wrote the slot before completing this
        // phase of `full`, and does not write it again before every taker arrived on `empty`.
        unsafe {
            self.full(s).wait_parity(phase);
            let (tile, seq) = (self.slots.load(2 * s), self.slots.load(2 * s + 1));
            if tile < num_tiles {
                self.empty(s).arrive();
            }
            (tile, seq)
        }
    }
}

/// The scheduler warp of a persistent grid whose tiles are drawn at run time (the packed
/// kernels', `VARLEN`, and the dense kernels' of `HopperGrid::Dynamic`): draws the block's
/// tiles (tile `blockIdx.x` first, then `grid + r` for each `r` drawn from `tile_counter`, or
/// `blockIdx.x + k grid` without one; [`HopperParams::tile_counter`]), finds each packed
/// tile's sequence ([`packed_sequence`]; 0 on a dense batch) and publishes it; the first index
/// past the tiles ends the walk. The block drawing the launch's last value (`num_tiles - 1`)
/// resets the counter.
///
/// # Safety
/// Every lane of one warp, uniformly; the handoff's barriers are initialized and published;
/// the kernel's parameters as documented on [`HopperParams`].
#[inline(always)]
pub(super) unsafe fn schedule<const VARLEN: bool>(p: &HopperParams, handoff: Handoff) {
    let (lane, grid) = (index::lane_id(), index::grid_dim_x());
    let mut t = index::block_idx_x();
    let mut n = 0u32;
    loop {
        let seq = if VARLEN && t < p.num_tiles {
            // SAFETY: the whole warp, uniformly; the kernel's parameters.
            unsafe { packed_sequence(p, t) }
        } else {
            0
        };
        if lane == 0 {
            // SAFETY: lane 0 of the one scheduler warp, tiles in order.
            unsafe { handoff.put(n, t, seq) };
        }
        n += 1;
        if t >= p.num_tiles {
            return;
        }
        t = if p.tile_counter.is_null() {
            t + grid
        } else {
            let r = if lane == 0 {
                // SAFETY: the counter is a u32 of global memory (the parameters' contract).
                let r = unsafe { atomic::add_u32(p.tile_counter, 1) };
                if r == p.num_tiles - 1 {
                    // The launch's last draw: every block has drawn its last value.
                    // SAFETY: as above.
                    unsafe { atomic::store_release_u32(p.tile_counter, 0) };
                }
                r
            } else {
                0
            };
            // SAFETY: the whole warp, uniformly. Tile indices stay below 2^31 (the host's
            // bound), so `r + grid` does not wrap for the values `r < num_tiles` that matter.
            unsafe { warp::shfl_idx_u32(warp::FULL_MASK, r, 0) }.saturating_add(grid)
        };
    }
}

/// One tile of the persistent grid: 128 query rows of one (batch, head) and the key steps
/// they may attend.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    /// First query row of the tile in its sequence.
    pub(super) m0: u32,
    pub(super) head: u32,
    pub(super) batch: u32,
    pub(super) head_kv: u32,
    /// Query rows of the tile inside its sequence (0 for an empty slot of packed sequences).
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

/// `first(b)` of the module documentation, from the clamped start of sequence `b`.
///
/// # Safety
/// `b <= p.batch` and `cu_seqlens_q` has `batch + 1` entries.
#[inline(always)]
unsafe fn first_slot(p: &HopperParams, b: u32) -> u32 {
    // SAFETY: forwarded to the caller.
    let start = unsafe { *p.cu_seqlens_q.add(b as usize) };
    hopper_varlen_first_slot((start.max(0) as u32).min(p.total_q), b)
}

/// The packed sequence of tile `t` (the last `b < batch` with `first(b) <= t % num_m_blocks`;
/// 0 if none): a 32-way search by the whole warp, each lane reading one `cu_seqlens_q` entry
/// per round (at most 4 rounds for 65535 sequences). Boundaries that contradict the sizes give
/// some `b < batch`, whose tile [`tile`] clamps as it does every sequence.
///
/// # Safety
/// Every lane of the warp calls it with the same `t < num_tiles` (uniform control flow);
/// `cu_seqlens_q` has `batch + 1` entries.
#[inline(always)]
pub(super) unsafe fn packed_sequence(p: &HopperParams, t: u32) -> u32 {
    let slot = t % p.num_m_blocks;
    let lane = index::lane_id();
    // Candidates `lo .. lo + n`; `first` is non-decreasing on well-formed boundaries, so the
    // lanes that pass form a prefix and the last of them brackets the answer.
    let (mut lo, mut n) = (0u32, p.batch);
    while n > 1 {
        let stride = n.div_ceil(32);
        let i = lane * stride;
        // SAFETY: `lo + i < lo + n <= batch` when read.
        let pass = i < n && unsafe { first_slot(p, lo + i) } <= slot;
        // SAFETY: the whole warp runs this loop uniformly (`n` is the same in every lane).
        let mask = unsafe { warp::ballot(warp::FULL_MASK, pass) };
        let k = if mask == 0 {
            0
        } else {
            31 - mask.leading_zeros()
        };
        lo += k * stride;
        n = stride.min(n - k * stride);
    }
    lo
}

/// Tile `t` (`< num_tiles`). The query blocks of one (batch, head) are consecutive, so that the
/// blocks running at one time share K and V in L2 (walking all heads of one query block first,
/// longest first, was slower under causal masking: bench/NOTES.md); under causal masking
/// (`reverse_m`) each (batch, head) starts from its last, longest query block. `VARLEN`: `t`
/// is slot `t % num_m_blocks` of head `t / num_m_blocks` (module docs) and `seq` its sequence
/// ([`packed_sequence`]), whose rows are read from `cu_seqlens_*` and clamped into the totals
/// (as the `mma.sync` kernels' `seq::Packed`); an empty slot has no row and no step.
///
/// # Safety
/// `p` is the kernel's parameters; with `VARLEN`, `cu_seqlens_*` hold `batch + 1` entries and
/// `seq < batch`.
#[inline(always)]
pub(super) unsafe fn tile<const BN: u32, const VARLEN: bool>(
    p: &HopperParams,
    t: u32,
    seq: u32,
) -> Tile {
    let (m_idx, hb) = (t % p.num_m_blocks, t / p.num_m_blocks);
    let (m_block, head, batch, seq_q, seq_k, q0, k0) = if VARLEN {
        // SAFETY: `seq < batch` and both arrays have `batch + 1` entries (the caller's
        // contract).
        let (q0, q1, k0, k1) = unsafe {
            let b = seq as usize;
            (
                *p.cu_seqlens_q.add(b),
                *p.cu_seqlens_q.add(b + 1),
                *p.cu_seqlens_k.add(b),
                *p.cu_seqlens_k.add(b + 1),
            )
        };
        let (q0, q1) = clamp_range(q0, q1, p.total_q);
        let (k0, k1) = clamp_range(k0, k1, p.total_k);
        let (seq_q, first) = (q1 - q0, hopper_varlen_first_slot(q0, seq));
        let blocks = seq_q.div_ceil(HOPPER_BLOCK_M);
        if m_idx < first || m_idx - first >= blocks {
            return Tile {
                m0: 0,
                head: hb,
                batch: seq,
                head_kv: hb / (p.heads_q / p.heads_kv),
                rows_valid: 0,
                nb_lo: 0,
                steps: 0,
                seq_q,
                seq_k: k1 - k0,
                q0,
                k0,
            };
        }
        let idx = m_idx - first;
        let m_block = if p.reverse_m != 0 {
            blocks - 1 - idx
        } else {
            idx
        };
        (m_block, hb, seq, seq_q, k1 - k0, q0, k0)
    } else {
        let m_block = if p.reverse_m != 0 {
            p.num_m_blocks - 1 - m_idx
        } else {
            m_idx
        };
        let (head, batch) = (hb % p.heads_q, hb / p.heads_q);
        (m_block, head, batch, p.seq_q, p.seq_k, 0, 0)
    };
    let m0 = m_block * HOPPER_BLOCK_M;
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
