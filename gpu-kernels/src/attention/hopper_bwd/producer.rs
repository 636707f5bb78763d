//! What the dK/dV kernels ([`super::dkdv`], [`super::wide`]) share: the block's walk over the
//! query blocks that see its keys, the order of its dQ additions in deterministic mode, the
//! shared-memory ring, and the producer warpgroup that fills it (thread 0 issues the TMA loads
//! of K, V and each step's Q and dO; warp 1 writes each step's row values). The ring's barrier
//! protocol is documented on each kernel.

use super::super::elem::Elem;
use super::super::mask;
use super::super::seq::clamp_range;
use super::CONSUMER_THREADS;
use crate::arch::mbarrier::{Mbarrier, RingPos};
use crate::arch::tma::TensorMapPtr;
use crate::arch::{atomic, fence, global, index, math, regs, smem, sync};
use kernel_abi::attention::hopper_bwd::{
    HOPPER_BWD_STAGES as STAGES, HOPPER_DQ_TILE_ROWS, HopperBwdConfig, HopperBwdParams, dkdv_block,
    dq_accum_row0, dq_accum_rows, dq_accum_varlen_row0, dq_order_index,
};
use kernel_abi::attention::{HOPPER_ATOM, HOPPER_PRODUCER_REGS};

/// Lanes of producer warp 1 that write the row values of each step (`block_m / 32` rows
/// each).
pub(super) const ROW_WRITERS: u32 = 32;

/// This block's position in the dK/dV grid, `(x, key/value head, sequence)`: its block
/// indices, with the (key/value head, sequence) pairs interleaved in launch order by groups of
/// `order_group` ([`dkdv_block`]; the deterministic mode's).
#[inline(always)]
pub(super) fn grid_position(p: &HopperBwdParams) -> (u32, u32, u32) {
    let (x, y, z) = (
        index::block_idx_x(),
        index::block_idx_y(),
        index::block_idx_z(),
    );
    if p.order_group <= 1 {
        return (x, y, z);
    }
    let heads_kv = index::grid_dim_y();
    let pairs = heads_kv * index::grid_dim_z();
    let (x, f) = dkdv_block(
        x,
        y + heads_kv * z,
        index::grid_dim_x(),
        pairs,
        p.order_group,
    );
    (x, f % heads_kv, f / heads_kv)
}

/// The query blocks a block of keys visits, the same in every thread: for each query head of
/// the key/value head's group in turn, the `block_m`-row query blocks that may see a key of
/// the block (causal and window bounds). Block `x` ([`grid_position`]) takes key block `x`, or
/// in deterministic mode (`dq_order` not null) key block `nb - 1 - x` of `nb`: the order in
/// which the blocks of a head add into each dQ tile is then the order of their launch.
///
/// `VARLEN` (packed sequences): the block's sequence (`grid_position`'s) is located from
/// `cu_seqlens_*`, its bounds clamped into `0 ..= total_*` and its lengths to the longest
/// (`base.seq_q`, `base.seq_k`, which size the grid and the preprocess's); the rows of its
/// tensors and of its tiles in the accumulator come from there. A block past the sequence's
/// key blocks has no step and stores nothing. Thread 0 stores the sequence (and, in every
/// kernel, the block's key/value head and sequence) in shared memory ([`Walk::publish`]) and
/// the roles read them from there where they use them, so that no register holds them across
/// their loops (as the dense batches read the lengths from the parameters where they are
/// used).
#[derive(Clone, Copy)]
pub(super) struct Walk<const VARLEN: bool> {
    /// First key of the block.
    pub n0: u32,
    /// The block's key/value head and sequence, for [`Walk::publish`]; read back from shared
    /// memory after ([`Walk::head_kv`], [`Walk::batch`]), so that no role holds them in
    /// registers (the producer warpgroup has few).
    position: [u32; 2],
    /// The block's key block.
    pub key_block: u32,
    /// Key blocks of the sequence.
    pub key_blocks: u32,
    /// Keys per block.
    block_n: u32,
    /// Query rows per step.
    pub block_m: u32,
    /// Query heads per key/value head.
    group: u32,
    /// First query block that may see a key of the block.
    mb_lo: u32,
    /// Query blocks per head.
    m_steps: u32,
    /// Steps of the walk (`group m_steps`).
    pub steps: u32,
    /// `VARLEN`: the sequence's query rows, key rows, first query row and first key row (for
    /// [`Walk::of`] and [`Walk::publish`]; read back from shared memory after).
    seq: [u32; 4],
    /// `VARLEN`: the shared-memory address of the published sequence.
    seq_at: u32,

    /// `VARLEN`: deterministic mode on boundaries in order (see [`Walk::ordered`]).
    ordered: bool,
}

/// The `block_m`-row query blocks `(mb_lo, m_steps)` that may see a key of the `block_n` keys
/// from `n0` (`n0 < seq_k`) of a sequence of `seq_q` query and `seq_k` key rows, `(0, 0)` when
/// none does ([`mask::query_blocks`]).
#[inline(always)]
fn query_blocks(
    p: &HopperBwdParams,
    seq_q: u32,
    seq_k: u32,
    n0: u32,
    block_n: u32,
    block_m: u32,
) -> (u32, u32) {
    let keys = (seq_k - n0).min(block_n);
    let (wl, wr) = (p.base.window_left, p.base.window_right);
    mask::query_blocks(n0, keys, seq_q, seq_k, wl, wr, block_m)
}

impl<const VARLEN: bool> Walk<VARLEN> {
    /// The walk of this block (`grid_position = (x, key/value head, sequence)`) in the
    /// kernel's configuration (its keys per block and query rows per step).
    ///
    /// # Safety
    /// Every thread of the block calls it once, at the kernel's start, in uniform control flow
    /// (with `VARLEN` in deterministic mode it meets the block at a barrier). `VARLEN`:
    /// `cu_seqlens_q` and `cu_seqlens_k` hold `base.batch + 1` entries (the grid's z is
    /// `base.batch`).
    #[inline(always)]
    pub unsafe fn of(p: &HopperBwdParams, cfg: &HopperBwdConfig) -> Self {
        let (block_n, block_m) = (cfg.block_n(), cfg.block_m);
        let (x, head_kv, batch) = grid_position(p);
        let (seq_q, seq_k, q0, k0) = if VARLEN {
            // SAFETY: `batch < base.batch` (the grid's z; `grid_position` permutes the grid)
            // and both arrays hold `batch + 1` entries (the caller's).
            let (q0, q1, k0, k1) = unsafe {
                (
                    *p.cu_seqlens_q.add(batch as usize),
                    *p.cu_seqlens_q.add(batch as usize + 1),
                    *p.cu_seqlens_k.add(batch as usize),
                    *p.cu_seqlens_k.add(batch as usize + 1),
                )
            };
            let (q0, q1) = clamp_range(q0, q1, p.total_q);
            let (k0, k1) = clamp_range(k0, k1, p.total_k);
            (
                (q1 - q0).min(p.base.seq_q),
                (k1 - k0).min(p.base.seq_k),
                q0,
                k0,
            )
        } else {
            (p.base.seq_q, p.base.seq_k, 0, 0)
        };
        let key_blocks = seq_k.div_ceil(block_n);
        // A block past its sequence's key blocks keeps its own (keys past `seq_k`, no steps,
        // nothing stored) and runs through like any other: returning early costs the kernel's
        // register allocation more than the blocks cost.
        let past_end = VARLEN && x >= key_blocks;
        let key_block = if p.base.dq_order.is_null() || past_end {
            x
        } else {
            key_blocks - 1 - x
        };
        let n0 = key_block * block_n;
        let (mb_lo, m_steps) = if past_end {
            (0, 0)
        } else {
            query_blocks(p, seq_q, seq_k, n0, block_n, block_m)
        };
        let group = p.base.heads_q / p.base.heads_kv;
        // Packed sequences own disjoint accumulator tiles, so that no two sequences share an
        // order counter, when `cu_seqlens_q` is in order inside `0 ..= total_q`; contents out
        // of order could make blocks of two sequences wait on one counter for marks it never
        // holds. The block checks every boundary (each thread some, combined by the barrier)
        // and adds without order (no wait) if any is out of order.
        let ordered = if VARLEN && !p.base.dq_order.is_null() {
            let mut bad = false;
            let mut i = index::thread_idx_x();
            while i <= p.base.batch {
                // SAFETY: `i <= batch`: inside the `batch + 1` entries (the caller's).
                let hi = unsafe { *p.cu_seqlens_q.add(i as usize) };
                let lo = if i == 0 {
                    0
                } else {
                    // SAFETY: as above.
                    unsafe { *p.cu_seqlens_q.add(i as usize - 1) }
                };
                bad |= hi < lo || (i == p.base.batch && hi as u32 > p.total_q);
                i += index::block_dim_x();
            }
            // SAFETY: every thread of the block, once, at the kernel's start (the caller's).
            !unsafe { sync::sync_threads_or(bad) }
        } else {
            false
        };
        Walk {
            n0,
            position: [head_kv, batch],
            key_block,
            key_blocks,
            block_n,
            block_m,
            group,
            mb_lo,
            m_steps,
            steps: group * m_steps,
            seq: [seq_q, seq_k, q0, k0],
            seq_at: smem::aligned_base() + cfg.seq_offset(),
            ordered,
        }
    }

    /// Thread 0 stores the sequence (`VARLEN`) and the block's key/value head and sequence for
    /// the roles to read ([`Walk::sequence`], [`Walk::position`]).
    ///
    /// # Safety
    /// Every thread calls it, before the barrier of [`Ring::init`] that publishes the store.
    #[inline(always)]
    pub unsafe fn publish(&self) {
        if index::thread_idx_x() == 0 {
            if VARLEN {
                // SAFETY: the configuration's sequence words (16 bytes, 16-byte aligned), read
                // only after the barrier that follows (the caller's).
                unsafe { smem::SmemValue::store(self.seq_at, self.seq) };
            }
            // SAFETY: the configuration's position words (16 bytes after the sequence's,
            // 16-byte aligned), read only after the barrier that follows (the caller's).
            unsafe {
                smem::SmemValue::store(self.seq_at + 16, [self.position[0], self.position[1], 0, 0])
            };
        }
    }

    /// The block's key/value head ([`grid_position`]), from shared memory (after
    /// [`Walk::publish`]'s barrier).
    #[inline(always)]
    pub fn head_kv(&self) -> u32 {
        load_sequence(self.seq_at, 4)
    }

    /// The block's sequence ([`grid_position`]), from shared memory (after [`Walk::publish`]'s
    /// barrier).
    #[inline(always)]
    pub fn batch(&self) -> u32 {
        load_sequence(self.seq_at, 5)
    }

    /// Word `i` of the sequence `[seq_q, seq_k, q0, k0]` (`VARLEN`), from shared memory.
    #[inline(always)]
    fn sequence(&self, i: u32) -> u32 {
        load_sequence(self.seq_at, i)
    }

    /// Whether the block orders its dQ additions (deterministic mode): `dq_order` set and,
    /// over packed sequences, the boundaries in order.
    #[inline(always)]
    pub fn ordered(&self, p: &HopperBwdParams) -> bool {
        if VARLEN {
            self.ordered
        } else {
            !p.base.dq_order.is_null()
        }
    }

    /// Query rows of the sequence.
    #[inline(always)]
    pub fn seq_q(&self, p: &HopperBwdParams) -> u32 {
        if VARLEN {
            self.sequence(0)
        } else {
            p.base.seq_q
        }
    }

    /// Key rows of the sequence.
    #[inline(always)]
    pub fn seq_k(&self, p: &HopperBwdParams) -> u32 {
        if VARLEN {
            self.sequence(1)
        } else {
            p.base.seq_k
        }
    }

    /// The mask's sizes `(seq_q, key offset seq_k - seq_q, seq_k)` of the sequence: a packed
    /// sequence's loaded at each call (8 bytes of shared memory), so that the consumers hold
    /// them in registers only where they compare (their products hold the most); a dense
    /// batch's are `dense` (the parameters', as the caller computed them).
    #[inline(always)]
    pub fn mask_sizes_or(&self, dense: (u32, i32, i32)) -> (u32, i32, i32) {
        if VARLEN {
            // SAFETY: as for `load_sequence`; 8-byte aligned.
            let [seq_q, seq_k] = unsafe { smem::load_volatile_v2(regs::opaque(self.seq_at)) };
            (seq_q, (seq_k as i64 - seq_q as i64) as i32, seq_k as i32)
        } else {
            dense
        }
    }

    /// `VARLEN`: the packed tensors' row of the sequence's query row `m` (the tensor maps'
    /// row coordinate; their batch coordinate is 0).
    #[inline(always)]
    fn packed_q_row(&self, m: u32) -> i32 {
        (self.sequence(2) + m) as i32
    }

    /// `VARLEN`: the packed tensors' row of the sequence's key row `n`.
    #[inline(always)]
    fn packed_k_row(&self, n: u32) -> i32 {
        (self.sequence(3) + n) as i32
    }

    /// `VARLEN`: the index in LSE and `delta'` (`[heads_q, total_q]`) of query row 0 of head
    /// `h` of the sequence.
    #[inline(always)]
    fn packed_lse_row0(&self, p: &HopperBwdParams, h: u32) -> u64 {
        h as u64 * p.total_q as u64 + self.sequence(2) as u64
    }

    /// The first row of query head `h` of the sequence in the tiled dQ accumulator.
    #[inline(always)]
    pub fn accum_row0(&self, p: &HopperBwdParams, h: u32) -> u64 {
        if VARLEN {
            let q0 = self.sequence(2);
            dq_accum_varlen_row0(q0, self.batch(), h, p.total_q, p.base.batch)
        } else {
            dq_accum_row0(self.batch(), h, p.base.heads_q, p.base.seq_q)
        }
    }

    /// `VARLEN`: element offsets of key row 0 of the block's key/value head in dK and dV (the
    /// sequence's first key row).
    #[inline(always)]
    fn packed_dk_dv_rows(&self, p: &HopperBwdParams) -> (u64, u64) {
        let (dk_st, dv_st) = (p.base.dk_strides, p.base.dv_strides);
        let (k0, head_kv) = (self.sequence(3) as u64, self.head_kv() as u64);
        (
            k0 * dk_st[1] + head_kv * dk_st[2],
            k0 * dv_st[1] + head_kv * dv_st[2],
        )
    }

    /// The query blocks `(mb_lo, m_steps)` of the key block after this one (`key_block + 1`,
    /// the one before it in deterministic mode's order), `(0, 0)` for the last.
    #[inline(always)]
    pub fn next_query_blocks(&self, p: &HopperBwdParams) -> (u32, u32) {
        if self.key_block + 1 < self.key_blocks {
            let n0 = (self.key_block + 1) * self.block_n;
            query_blocks(
                p,
                self.seq_q(p),
                self.seq_k(p),
                n0,
                self.block_n,
                self.block_m,
            )
        } else {
            (0, 0)
        }
    }

    /// Step `s`'s query head.
    #[inline(always)]
    pub fn head(&self, s: u32) -> u32 {
        self.head_kv() * self.group + s / self.m_steps
    }

    /// Step `s`'s first query row.
    #[inline(always)]
    pub fn m0(&self, s: u32) -> u32 {
        (self.mb_lo + s % self.m_steps) * self.block_m
    }
}

/// Word `i` of `[seq_q, seq_k, q0, k0, head_kv, batch]` published at `at` ([`Walk::publish`]),
/// loaded where used (each call a load of its own) rather than held in registers (the
/// producer warpgroup has few; the consumers' accumulators take the most).
#[inline(always)]
fn load_sequence(at: u32, i: u32) -> u32 {
    // SAFETY: stored by `Walk::publish` before the barrier of `Ring::init`, which every role
    // passed before using the walk; never written again; `i < 6`: inside the 8 words.
    unsafe { smem::load_volatile_u32(regs::opaque(at) + 4 * i) }
}

/// The order of a block's dQ additions in deterministic mode (`dq_order` not null): each tile of
/// the accumulator receives the additions of the key blocks that see it in descending key-block
/// order, whatever the timing, so its sums are the same bit for bit from run to run. Before its
/// first addition into a step's tiles, the block waits (acquire) until each tile's counter
/// holds `nb - n - 1`, the mark of key block `n + 1`, when that block adds into the step's tiles
/// (its query blocks contain the step's: the key blocks that see a tile are consecutive); once
/// its own additions are performed, it stores (release) `nb - n` in each. Key block `n + 1` is
/// block `x - 1` of the same head and sequence ([`Walk`], [`grid_position`]), launched before
/// this one, and waits only for blocks launched before it: no cycle.
#[derive(Clone, Copy)]
pub(super) struct DqOrder<const VARLEN: bool> {
    /// The counters (one u32 per tile, zeroed by the preprocess), null in the default mode.
    counters: *mut u32,
    /// `(mb_lo, m_steps)` of key block `n + 1`.
    next_lo: u32,
    next_steps: u32,
    /// This block's mark, `nb - n`.
    mark: u32,
    heads_q: u32,
    /// Dense: the query rows.
    seq_q: u32,
    /// Query rows per step (a multiple of the tile's rows).
    block_m: u32,
    /// The published sequence's and position's address ([`Walk::publish`]); `VARLEN`: the
    /// query rows and the sequences.
    seq_at: u32,
    total_q: u32,
    batches: u32,
}

impl<const VARLEN: bool> DqOrder<VARLEN> {
    /// The order of the block of `walk` under parameters `p`.
    #[inline(always)]
    pub fn of(p: &HopperBwdParams, walk: &Walk<VARLEN>) -> Self {
        let (next_lo, next_steps) = walk.next_query_blocks(p);
        DqOrder {
            counters: if walk.ordered(p) {
                p.base.dq_order
            } else {
                core::ptr::null_mut()
            },
            next_lo,
            next_steps,
            mark: walk.key_blocks - walk.key_block,
            heads_q: p.base.heads_q,
            seq_q: p.base.seq_q,
            block_m: walk.block_m,
            seq_at: walk.seq_at,
            total_q: p.total_q,
            batches: p.base.batch,
        }
    }

    /// The block's sequence (published by [`Walk::publish`]).
    #[inline(always)]
    fn batch(&self) -> u32 {
        load_sequence(self.seq_at, 5)
    }

    /// Whether the additions are ordered (deterministic mode).
    #[inline(always)]
    pub fn ordered(&self) -> bool {
        !self.counters.is_null()
    }

    /// The counter of the tile of query head `h` from row `m`.
    #[inline(always)]
    fn counter(&self, h: u32, m: u32) -> *mut u32 {
        let i = if VARLEN {
            let q0 = load_sequence(self.seq_at, 2);
            let row0 = dq_accum_varlen_row0(q0, self.batch(), h, self.total_q, self.batches);
            (row0 + m as u64) / HOPPER_DQ_TILE_ROWS as u64
        } else {
            dq_order_index(self.batch(), h, self.heads_q, self.seq_q, m)
        };
        self.counters.wrapping_add(i as usize)
    }

    /// The first rows of the accumulator tiles of a step from row `m0` (those inside the
    /// accumulator: a tile all of whose rows are past `seq_q` does not exist).
    #[inline(always)]
    fn tiles(&self, m0: u32) -> impl Iterator<Item = u32> {
        let seq_q = if VARLEN {
            load_sequence(self.seq_at, 0)
        } else {
            self.seq_q
        };
        let rows = dq_accum_rows(seq_q);
        (0..self.block_m / HOPPER_DQ_TILE_ROWS)
            .map(move |t| m0 + t * HOPPER_DQ_TILE_ROWS)
            .filter(move |&m| m < rows)
    }

    /// Wait (acquire) until key block `n + 1` has added into the tiles of the step of query
    /// head `h` from row `m0`, when it adds into them.
    ///
    /// # Safety
    /// Ordered mode; one thread, before its block's first addition into these tiles, with the
    /// counters sized by the host for every tile and zeroed before the kernel.
    #[inline(always)]
    pub unsafe fn acquire(&self, h: u32, m0: u32) {
        if (m0 / self.block_m).wrapping_sub(self.next_lo) < self.next_steps {
            for m in self.tiles(m0) {
                // SAFETY: the tile's counter (the caller's), written only by the blocks of
                // this head's order.
                while unsafe { atomic::load_acquire_u32(self.counter(h, m)) } != self.mark - 1 {}
            }
        }
    }

    /// Store (release) this block's mark in the counters of the tiles of the step of query
    /// head `h` from row `m0`.
    ///
    /// # Safety
    /// Ordered mode; one thread, once every addition of the block into these tiles is ordered
    /// before this call (performed, or published to this thread by a barrier); counters as
    /// for [`DqOrder::acquire`].
    #[inline(always)]
    pub unsafe fn release(&self, h: u32, m0: u32) {
        for m in self.tiles(m0) {
            // SAFETY: as for `acquire`.
            unsafe { atomic::store_release_u32(self.counter(h, m), self.mark) };
        }
    }
}

/// The shared memory of a dK/dV kernel's configuration: tiles, the row values and the
/// mbarriers (`kv_full`, then `full[s]` and `empty[s]` of the Q/dO ring).
#[derive(Clone, Copy)]
pub(super) struct Ring {
    /// The aligned base of dynamic shared memory.
    pub base: u32,
    cfg: HopperBwdConfig,
}

impl Ring {
    #[inline(always)]
    pub fn new(cfg: &HopperBwdConfig) -> Ring {
        Ring {
            base: smem::aligned_base(),
            cfg: *cfg,
        }
    }

    /// `kv_full`: K and V landed.
    #[inline(always)]
    pub fn kv_full(&self) -> Mbarrier {
        Mbarrier::at(self.base + self.cfg.barriers_offset())
    }

    /// `full[s]`: stage `s`'s Q, dO and row values landed.
    #[inline(always)]
    pub fn full(&self, s: u32) -> Mbarrier {
        Mbarrier::at(self.base + self.cfg.barriers_offset() + 8 * (1 + s))
    }

    /// `empty[s]`: every consumer thread is done with stage `s`.
    #[inline(always)]
    pub fn empty(&self, s: u32) -> Mbarrier {
        Mbarrier::at(self.base + self.cfg.barriers_offset() + 8 * (1 + STAGES + s))
    }

    /// The K tile.
    #[inline(always)]
    pub fn k(&self) -> u32 {
        self.base + self.cfg.k_offset()
    }

    /// The V tile.
    #[inline(always)]
    pub fn v(&self) -> u32 {
        self.base + self.cfg.v_offset()
    }

    /// Stage `s`'s Q tile.
    #[inline(always)]
    pub fn q(&self, s: u32) -> u32 {
        self.base + self.cfg.q_offset(s)
    }

    /// Stage `s`'s dO tile.
    #[inline(always)]
    pub fn d_o(&self, s: u32) -> u32 {
        self.base + self.cfg.do_offset(s)
    }

    /// Stage `s`'s row values (LSE in base 2, then `delta'`).
    #[inline(always)]
    pub fn rows(&self, s: u32) -> u32 {
        self.base + self.cfg.rows_offset(s)
    }

    /// Thread 0 initializes the mbarriers (`full[s]` counts thread 0's arrival and the row
    /// writers', `empty[s]` every consumer thread's), then the whole block syncs.
    ///
    /// # Safety
    /// Every thread of the block calls it once, before any other use of the mbarriers.
    #[inline(always)]
    pub unsafe fn init(&self, tmaps: &[TensorMapPtr; 4]) {
        if index::thread_idx_x() == 0 {
            for t in tmaps {
                t.prefetch();
            }
            // SAFETY: single initializer before any use; published by the barrier below.
            unsafe {
                self.kv_full().init(1);
                for s in 0..STAGES {
                    self.full(s).init(1 + ROW_WRITERS);
                    self.empty(s).init(CONSUMER_THREADS);
                }
            }
            fence::fence_mbarrier_init();
        }
        // SAFETY: all threads reach this barrier once, before the role split (the caller's).
        unsafe { sync::sync_threads() };
    }
}

/// The producer warpgroup: it drops to `HOPPER_PRODUCER_REGS` registers; with steps, thread 0
/// loads K and V (`kv_full`) and each step's Q and dO into the ring, and warp 1 writes each
/// step's row values (LSE in base 2, +inf where P must be 0, and `delta'`; `block_m / 32` rows
/// per lane).
///
/// # Safety
/// The whole warpgroup 0 of a dK/dV kernel calls it after [`Ring::init`], with the block's
/// walk and the kernel's tensor maps (Q, dO, K, V), configuration and parameters.
#[inline(always)]
pub(super) unsafe fn produce<const VARLEN: bool>(
    p: &HopperBwdParams,
    cfg: &HopperBwdConfig,
    ring: &Ring,
    walk: &Walk<VARLEN>,
    tmaps: [TensorMapPtr; 4],
) {
    let [tmap_q, tmap_do, tmap_k, tmap_v] = tmaps;
    // SAFETY: the whole producer warpgroup executes this, uniformly (the caller's).
    unsafe { regs::decrease::<HOPPER_PRODUCER_REGS>() };
    let steps = walk.steps;
    let cblocks = cfg.column_blocks();
    if index::thread_idx_x() == 0 && steps > 0 {
        let kv_full = ring.kv_full();
        // SAFETY: `kv_full` expects exactly K's and V's bytes; the destinations are 1024-aligned
        // column blocks sized by the ABI, read only after the phase completes; the D
        // coordinates are multiples of 64 elements.
        unsafe {
            kv_full.arrive_expect_tx(cfg.kv_bytes());
            for cb in 0..cblocks {
                let x = (cb * HOPPER_ATOM) as i32;
                let at = cb * cfg.block_bytes(cfg.block_n());
                let (h, n) = (walk.head_kv() as i32, walk.n0 as i32);
                let (n, batch) = if VARLEN {
                    (walk.packed_k_row(walk.n0), 0)
                } else {
                    (n, walk.batch() as i32)
                };
                tmap_k.load_4d(ring.k() + at, x, h, n, batch, kv_full);
                tmap_v.load_4d(ring.v() + at, x, h, n, batch, kv_full);
            }
        }
        for step in 0..steps {
            let pos = RingPos::<STAGES>::of(step);
            let (h, m0) = (walk.head(step) as i32, walk.m0(step) as i32);
            let (m0, batch) = if VARLEN {
                (walk.packed_q_row(walk.m0(step)), 0)
            } else {
                (m0, walk.batch() as i32)
            };
            // SAFETY: ring protocol (the kernels' docs): the stage is free once `empty`
            // completed its previous phase; `full` expects exactly the step's bytes; the
            // destinations are untouched until that phase completes.
            unsafe {
                ring.empty(pos.stage).wait_parity(pos.phase ^ 1);
                let bar = ring.full(pos.stage);
                bar.arrive_expect_tx(cfg.step_bytes());
                for cb in 0..cblocks {
                    let x = (cb * HOPPER_ATOM) as i32;
                    let at = cb * cfg.block_bytes(cfg.block_m);
                    tmap_q.load_4d(ring.q(pos.stage) + at, x, h, m0, batch, bar);
                    tmap_do.load_4d(ring.d_o(pos.stage) + at, x, h, m0, batch, bar);
                }
            }
        }
    }
    if index::warp_id() == 1 && steps > 0 {
        let lane = index::lane_id();
        let dense_seq_q = p.base.seq_q;
        for step in 0..steps {
            let pos = RingPos::<STAGES>::of(step);
            let (h, m0) = (walk.head(step), walk.m0(step));
            let (seq_q, row_base) = if VARLEN {
                (walk.seq_q(p), walk.packed_lse_row0(p, h))
            } else {
                // The sequence read per step (shared memory): nothing 64-bit held across the
                // loop in the producer's few registers.
                let rows = walk.batch() as u64 * p.base.heads_q as u64 + h as u64;
                (dense_seq_q, rows * dense_seq_q as u64)
            };
            let at = ring.rows(pos.stage);
            // SAFETY: ring protocol: the stage's row values are free once `empty` completed
            // the stage's previous phase.
            unsafe { ring.empty(pos.stage).wait_parity(pos.phase ^ 1) };
            for part in 0..cfg.block_m / ROW_WRITERS {
                let r = lane + part * ROW_WRITERS;
                let i = m0 + r;
                let (mut lse2, mut delta) = (f32::INFINITY, 0.0f32);
                if i < seq_q {
                    let idx = (row_base + i as u64) as usize;
                    // SAFETY: row i < seq_q of this (batch, head): inside LSE and delta'.
                    let (l, d) = unsafe {
                        (
                            global::load_nc_f32(p.base.lse.wrapping_add(idx)),
                            global::load_nc_f32(p.base.delta.wrapping_add(idx)),
                        )
                    };
                    if l != f32::NEG_INFINITY {
                        lse2 = l * math::LOG2_E;
                    }
                    delta = d;
                }
                // SAFETY: inside the stage's row values (r < block_m), this lane's own words,
                // free since the wait above; read only after `full` completes.
                unsafe {
                    smem::SmemValue::store(at + 4 * r, lse2);
                    smem::SmemValue::store(at + 4 * (cfg.block_m + r), delta);
                }
            }
            // SAFETY: one arrival per lane and phase (`full` counts the 32 lanes); release
            // semantics publish the stores above.
            unsafe { ring.full(pos.stage).arrive() };
        }
    }
}

/// The epilogue of a dK/dV kernel: `dK scale` and `dV` (element type) from a thread's `m64nN`
/// accumulators (`DR = N / 2` registers each) over keys `key0` and `key0 + 8` and columns
/// `col0 + 8 j + 2 t, + 1` (`t = lane % 4`) of the block's key/value head and sequence
/// (`walk`'s); keys past the sequence's and columns past the tensors' head dimensions
/// (`head_dim` for dK, `value_dim` for dV) are not stored.
///
/// # Safety
/// `p`'s dK and dV as validated by the host, `key0` and the columns inside the block's keys
/// and the head; no other thread stores these elements.
#[inline(always)]
pub(super) unsafe fn store_dk_dv<E: Elem, const DR: usize, const VARLEN: bool>(
    p: &HopperBwdParams,
    walk: &Walk<VARLEN>,
    key0: u32,
    col0: u32,
    dk: &[f32; DR],
    dv: &[f32; DR],
) {
    let t = index::lane_id() % 4;
    let (dk_st, dv_st) = (p.base.dk_strides, p.base.dv_strides);
    // From shared memory rather than the walk: nothing kept in registers across the steps.
    let (head_kv, batch) = (walk.head_kv(), walk.batch());
    let (head_kv, batch) = (head_kv as u64, batch as u64);
    let (dk_base, dv_base) = if VARLEN {
        let (dk_off, dv_off) = walk.packed_dk_dv_rows(p);
        (
            p.base.dk.wrapping_add(dk_off as usize),
            p.base.dv.wrapping_add(dv_off as usize),
        )
    } else {
        let dk_base = p
            .base
            .dk
            .wrapping_add((batch * dk_st[0] + head_kv * dk_st[2]) as usize);
        let dv_base = p
            .base
            .dv
            .wrapping_add((batch * dv_st[0] + head_kv * dv_st[2]) as usize);
        (dk_base, dv_base)
    };
    let scale = p.base.scale;
    let seq_k = walk.seq_k(p);
    for hh in 0..2 {
        let key = key0 + 8 * hh as u32;
        if key < seq_k {
            let dk_row = dk_base.wrapping_add((key as u64 * dk_st[1]) as usize);
            let dv_row = dv_base.wrapping_add((key as u64 * dv_st[1]) as usize);
            for j in 0..DR / 4 {
                let col = col0 + 8 * j as u32 + 2 * t;
                // Columns past the tensors' head dimension (a padded plan) are not stored.
                if col >= p.base.head_dim {
                    continue;
                }
                let x = 4 * j + 2 * hh;
                let k2 = E::pack(dk[x] * scale, dk[x + 1] * scale);
                // SAFETY: key < the sequence's seq_k, column + 1 < head_dim (even, a multiple of 16): inside
                // dK; 4-byte aligned (16-byte aligned rows, even column); each element has one
                // writer.
                unsafe { *(dk_row.wrapping_add(col as usize) as *mut u32) = k2 };
                // dV's columns stop at D_v under a pair (at most head_dim).
                if col < p.base.value_dim {
                    let v2 = E::pack(dv[x], dv[x + 1]);
                    // SAFETY: as dK's, column + 1 < value_dim: inside dV.
                    unsafe { *(dv_row.wrapping_add(col as usize) as *mut u32) = v2 };
                }
            }
        }
    }
}
