//! `gla_fwd_pp_dk{DK}_dv{DV}` and `gla_states_pp_dk{DK}_dv{DV}`: the GLA forward pass (and its
//! segment-state pass) on Hopper (sm_90a), warp-specialized: TMA into mbarrier rings, `wgmma`
//! for the state products, consumer warpgroups taking turns (pingpong). Same segments, same
//! chunkwise math (chunks of 16 tokens, halves of 8 with their midpoints as reference points,
//! see the parent module), same outputs as the baseline kernels. The state pass is its own
//! kernel (see [`states_walk`]: every factor relative to the segment's end, so a segment's
//! state is a sum, not a chain); `gla_combine` is not launched: each forward item folds its
//! sequence's earlier segments into its initial state.
//!
//! # Parameters
//! [`GlaPingpongParams`]: 3-D tensor maps of q, k, g, v (dims `[d, heads, rows]`, box
//! `[64, 1, step]`, 128-byte swizzle) and the baseline's [`GlaParams`] for the rest.
//!
//! # Work and thread mapping
//! `(1 + NC) 128` threads ([`PingpongConfig`]: `NC` consumers, 2 in every shipped
//! configuration; the code takes up to [`PP_MAX_CONSUMERS`]). Block `x` owns items
//! `NC x .. NC x + NC`, one per consumer warpgroup; item `i` is segment `i / (heads parts)`,
//! head `i / parts % heads` and value columns `dv (i % parts) ..` (`parts = dv_parts`: at
//! `dk = dv = 128` an item is half of the value columns, an independent GLA problem with the
//! same q, k, g, so the state of an item fits the registers). Warpgroup 0 produces: it drops to
//! `PP_PRODUCER_REGS` registers and its thread 0 issues the TMA loads of every consumer's steps
//! (`step` tokens of q, k, g and the item's v columns) into their own `stages`-deep rings, in
//! the order the consumers use them (step `i` of consumer 0, 1, .., then step `i + 1`). The
//! consumers take `PingpongConfig::consumer_regs` registers. Per step, consumer `c` (in the
//! shared-item mode below, steps 1 and 2 on one chunk of the step, in step with the other):
//! 1. element-wise phase (all 128 threads, vectorized: thread `(chunk, group, part)` takes 4
//!    or 8 consecutive key channels of a run of 2 to 8 tokens of a chunk, 8- or 16-byte shared
//!    accesses, so a warp's stores cover whole rows): the parent module's formulas (cumulative
//!    log-decays, a shuffle scan over the run's lanes), writing the operand tiles `q_inter`,
//!    `k_state` (swizzled, for `wgmma`), `q_diag`, `k_half0`, `k_half1` (padded, for
//!    `ldmatrix`) and the decay rows. Rows past the segment's end (TMA loaded the next sequence's tokens there) count as
//!    zero: q, k, g are masked on load and the v rows are zeroed in the stage;
//! 2. intra-chunk scores (warp `w` takes chunks `w, w + 4, ..`): `mma.sync` of
//!    `q_diag` with `k_half0` / `k_half1`, masked as in the baseline, stored as the bf16 tile
//!    `P[t][s]`;
//! 3. GEMM phase, in its turn: with `S^T` (`[dv, dk]` f32, the `wgmma` accumulator, `dv / 64`
//!    m64 halves) and `o^T` (`[dv, 16]`) in registers, per chunk:
//!    `o^T = S^T q_inter^T` (A = `S^T` packed to bf16 from its own accumulators),
//!    `o^T += v^T P^T`, then `S^T = decay S^T + v^T k_state` (A = v, MN-major, from the stage);
//!    one batch per m64 half of `S^T`, each waited for at once (the next chunk needs the
//!    state: it is a chain; a uniform wait keeps ptxas from serializing the batch); a chunk's
//!    `o^T` is stored while the next chunk's batch runs.
//!
//! While one consumer runs its chain of `wgmma`s, the others run their element-wise phases and
//! scores: the tensor cores and the ALUs work on different items at once.
//!
//! Shared-item mode (`PingpongConfig::shares_item`, `dk = dv = 128`: two consumers, each one
//! half of the value columns of the same (segment, head)): the block has one ring (v with all
//! 128 columns) and two operand sets; the element-wise phase and the scores of step `i` are
//! computed once, in step by both consumers (consumer `c` takes chunk `c` of the 32-token step),
//! into set `i % 2`, and both consumers run their GEMM phases on it (each its own v columns and
//! state), without turns. The element-wise work per item is halved, and done by 8 warps
//! instead of 4. (Measured: an owner per step, `i % 2`, computing the whole step while the
//! other consumer ran its GEMM phases was slower, 281 / 288 us against 268 / 271 at the
//! benchmark's D = 128 configurations: bench/NOTES.md.)
//!
//! Initial state: the sequence's (or zero); for a segment that is not first, the earlier
//! segments of its sequence are folded in from `delta` and `decay_log2` (written by the state
//! pass): `gla_combine`'s recurrence `S <- 2^{D_m} S + delta_m`, per item, walked backwards.
//!
//! # Barrier protocol
//! - Start: thread 0 initializes `full[c][s]` and `empty[c][s]` (count 1 each; in the
//!   shared-item mode one ring, `c = 0`, whose `empty` counts both consumers' arrivals),
//!   `fence.mbarrier_init`, then `sync_threads` publishes them. No block barrier follows.
//! - Ring, per consumer `c` (its step `i` at stage `i % stages`, parity `(i / stages) % 2`):
//!   the producer waits on `empty[c][s]` with the parity of the previous use (`^ 1`: the first
//!   pass does not wait), arrives on `full[c][s]` expecting the boxes' bytes and issues the
//!   loads; the consumer waits on `full[c][s]` before its first read of the stage.
//! - Consumer-local barrier `PP_LOCAL_BARRIER + c` (128 threads), per step: (L1) after the
//!   element-wise phase (its generic writes, each writer's `fence.proxy.async` first, so the
//!   `wgmma`s see them), (L2) after the scores (same), (L3) after the GEMM
//!   phase's last `wgmma.wait_group 0`: every product reading the stage and the operand tiles
//!   is complete and every thread's element-wise reads of the stage are done, so thread 0 of
//!   the consumer then arrives on `empty[c][s]`, and the next step may rewrite the operand
//!   tiles.
//! - Turns (named barriers `PP_ORDER_BARRIER + c`, 256 threads: consumer `c` syncs, its
//!   predecessor arrives). The GEMM phases are ordered round by round: round `r` visits the
//!   consumers `0 .. NC` in order, leaving out those with fewer than `r + 1` steps. Consumer
//!   `c` syncs before its step `r` iff its predecessor in that order is another consumer
//!   (`turn_waits`), and arrives on its successor's barrier (`turn_next`), if that is another
//!   consumer, once it has issued its step's last batch (between the commit and the wait of
//!   the last chunk's last half, uniformly). Arrival and
//!   sync pair up one to one (the successor of `a` is `b` exactly when the predecessor of `b`
//!   is `a`, since every position between them is left out), and the next arrival on `b`'s
//!   barrier comes from `b`'s next predecessor, which follows `b`'s own phase in the order: a
//!   barrier never holds two phases' arrivals. With two consumers this is strict alternation
//!   while both have steps; a consumer without an item exits at once and nobody waits for it.
//! - Shared-item mode, instead of L1, L2 and the turns: both consumers (256 threads) sync on
//!   `PP_PAIR_BARRIER` after their element-wise chunks (and consumer 0's zeroing of the v rows
//!   past the end), each writer's `fence.proxy.async` first, and again after the scores: then
//!   set `i % 2` is complete for both GEMM phases. The set is rewritten in step `i + 2`, after
//!   the first pair barrier of step `i + 1`, which each consumer reaches only after its GEMM
//!   phase of step `i` (its `wait_group 0` and L3). Both consumers wait on `full` and release
//!   every stage (`empty` counts 2).
//! - Deadlock freedom: the producer issues in the order the turns consume (every consumer's
//!   step `i` before any step `i + 1`), so every wait it does is on a stage whose consumer can
//!   finish it with stages already issued; in the shared-item mode both consumers pass the same
//!   barriers in the same order.
//! - Launch order: the forward is launched with `overlap_previous` (programmatic dependent
//!   launch) right after the state pass when a sequence is split, and the state pass lets it be
//!   scheduled at once (`griddepcontrol.launch_dependents` at its start): the forward's barrier
//!   set-up, tensor-map prefetches and first TMA loads (q, k, g, v: inputs, which the state
//!   pass only reads) overlap the state pass's tail. Every consumer thread executes
//!   `griddepcontrol.wait` before anything else it does after the role split, so before its
//!   first read of `delta` / `decay_log2` and its first write (o, the final state), all of which
//!   then see the complete state pass; every block has a consumer with an item, so the forward
//!   completes after the state pass. The producer reads only inputs and never waits. Launched
//!   without a primary (one segment per sequence) the wait returns at once. No deadlock: the
//!   forward's blocks are scheduled only once every block of the state pass has started
//!   (executed the trigger) or exited, so a waiting forward block never keeps a state-pass
//!   block from an SM.
//! - Registers: the `S^T` bf16 fragments read by an in-flight `wgmma` are rebuilt only after
//!   its `wait_group`; accumulators are pinned around every wait (`fence_operands`), and a
//!   `wgmma.fence` precedes every batch (the decay scaling writes `S^T` with ordinary
//!   instructions). The outputs stored during a batch are a copy taken before it (`o_prev`).

use super::{ChunkTiles, Raw, Var, chunk_edges, chunk_operands, intra_scores, shfl_f32};
use crate::arch::mbarrier::{Mbarrier, RingPos};
use crate::arch::smem::SmemValue;
use crate::arch::tma::TensorMapPtr;
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{convert, fence, griddep, index, math, regs, smem, sync, warp};
use crate::tensor_map_ptr;
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gla::{
    CHUNK, G_FLOOR, GlaConfig, GlaPingpongParams, HALF, PP_ATOM, PP_LOCAL_BARRIER,
    PP_MAX_CONSUMERS, PP_ORDER_BARRIER, PP_PAIR_BARRIER, PP_PRODUCER_REGS, PP_STATE_GROUPS,
    PP_STATE_STAGES, PP_STATE_THREADS, PingpongConfig, SEG_FIRST, SEG_LAST, Segment,
    pingpong_config_of,
};

/// Threads in one turn barrier phase: one consumer syncing, the other arriving.
const ORDER_THREADS: u32 = 2 * WARPGROUP_SIZE;

/// Address of byte `col` of row `row` in a swizzled tile whose 128-byte column blocks are
/// `block` bytes apart (128-byte swizzle: the 16-byte chunk index XOR the row modulo 8; the
/// tile is 1024-byte aligned).
#[inline(always)]
fn swizzled(base: u32, block: u32, row: u32, col: u32) -> u32 {
    base + (col / 128) * block + row * 128 + ((((col % 128) / 16) ^ (row % 8)) * 16) + col % 16
}

/// A consumer's tiles for one chunk of the current step (rows `r0 .. r0 + 16`).
struct PingpongChunk<const DK: u32> {
    q: u32,
    k: u32,
    g: u32,
    q_inter: u32,
    k_state: u32,
    q_diag: u32,
    k_half0: u32,
    k_half1: u32,
    decay: u32,
    r0: u32,
    block: u32,
}

impl<const DK: u32> ChunkTiles for PingpongChunk<DK> {
    #[inline(always)]
    fn raw(&self, t: Raw, row: u32, col: u32) -> u32 {
        swizzled(
            t.pick(self.q, self.k, self.g),
            self.block,
            self.r0 + row,
            col,
        )
    }

    #[inline(always)]
    fn var(&self, t: Var, row: u32, col: u32) -> u32 {
        let padded = |base: u32| base + (self.r0 + row) * const { GlaConfig::row_bytes(DK) } + col;
        match t {
            Var::QInter => swizzled(self.q_inter, self.block, self.r0 + row, col),
            Var::KState => swizzled(self.k_state, self.block, self.r0 + row, col),
            Var::QDiag => padded(self.q_diag),
            Var::KHalf0 => padded(self.k_half0),
            Var::KHalf1 => padded(self.k_half1),
        }
    }

    #[inline(always)]
    fn decay(&self) -> u32 {
        self.decay
    }
}

/// One consumer's work item.
#[derive(Clone, Copy)]
struct Item {
    seg: Segment,
    slot: u32,
    head: u32,
    /// First value column of the item (`dv (i % dv_parts)`).
    dv0: u32,
    steps: u32,
}

/// Item of consumer `c` of this block (`steps == 0`: none, or nothing to do).
#[inline(always)]
fn item<const STEP: u32, const NC: u32, const DV: u32, const PARTS: u32, const OUT: bool>(
    p: &GlaPingpongParams,
    c: u32,
) -> Item {
    let i = NC * index::block_idx_x() + c;
    let none = Item {
        seg: Segment::default(),
        slot: 0,
        head: 0,
        dv0: 0,
        steps: 0,
    };
    if i >= p.items {
        return none;
    }
    let heads = p.base.heads;
    let slot = i / (heads * PARTS);
    // SAFETY: i < items = segments * heads * PARTS, so slot < segments, inside the table.
    let seg: Segment = unsafe { *p.base.segments.add(slot as usize) };
    if !OUT && seg.flags & SEG_LAST != 0 {
        return none;
    }
    Item {
        seg,
        slot,
        head: i / PARTS % heads,
        dv0: DV * (i % PARTS),
        steps: seg.len.div_ceil(STEP),
    }
}

/// The turn order of the GEMM phases (module documentation): round `r` visits consumers
/// `0 .. NC` in order, leaving out those without a step `r` (`n[c]` steps each). Whether
/// consumer `c`'s step `r` has a predecessor that is another consumer (then it waits for
/// that one's arrival).
#[inline(always)]
fn turn_waits<const NC: u32>(n: &[u32; PP_MAX_CONSUMERS as usize], r: u32, c: u32) -> bool {
    let mut waits = false;
    for c2 in 0..NC {
        let before = if c2 < c {
            r < n[c2 as usize]
        } else {
            c2 > c && r >= 1 && r - 1 < n[c2 as usize]
        };
        waits |= before;
    }
    waits
}

/// The consumer whose GEMM phase follows consumer `c`'s step `r` in the turn order, if it is
/// another consumer (then `c` arrives on its turn barrier).
#[inline(always)]
fn turn_next<const NC: u32>(n: &[u32; PP_MAX_CONSUMERS as usize], r: u32, c: u32) -> Option<u32> {
    let mut next = None;
    // The first consumer before c with a step r + 1, overridden by the first after c with a
    // step r (it comes sooner in the order).
    for c2 in (0..NC).rev() {
        if c2 < c && r + 1 < n[c2 as usize] {
            next = Some(c2);
        }
    }
    for c2 in (0..NC).rev() {
        if c2 > c && r < n[c2 as usize] {
            next = Some(c2);
        }
    }
    next
}

/// `ld.shared` of `CPT` consecutive bf16 (`CPT` = 8: 16 bytes; 4: 8 bytes) as packed words
/// (the first `CPT / 2` are used).
///
/// # Safety
/// `addr` is a shared-window address of `2 CPT` valid bytes, aligned to their size.
#[inline(always)]
unsafe fn load_words<const CPT: usize>(addr: u32) -> [u32; 4] {
    if CPT == 8 {
        // SAFETY: forwarded to the caller (16 bytes, 16-byte aligned).
        unsafe { <[u32; 4]>::load(addr) }
    } else {
        // SAFETY: forwarded to the caller (8 bytes, 8-byte aligned).
        let v = unsafe { u64::load(addr) };
        [v as u32, (v >> 32) as u32, 0, 0]
    }
}

/// `st.shared` of the first `CPT / 2` packed words (see [`load_words`]).
///
/// # Safety
/// As for [`load_words`]; no other thread accesses the bytes before the next barrier.
#[inline(always)]
unsafe fn store_words<const CPT: usize>(addr: u32, w: [u32; 4]) {
    if CPT == 8 {
        // SAFETY: forwarded to the caller.
        unsafe { <[u32; 4]>::store(addr, w) }
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { u64::store(addr, (w[0] as u64) | ((w[1] as u64) << 32)) }
    }
}

/// The `CPT` bf16 of packed words as f32.
#[inline(always)]
fn unpack<const CPT: usize>(w: [u32; 4]) -> [f32; CPT] {
    let mut x = [0.0f32; CPT];
    for j in 0..CPT / 2 {
        (x[2 * j], x[2 * j + 1]) = convert::unpack_bf16x2(w[j]);
    }
    x
}

/// `CPT` f32 packed to bf16 words.
#[inline(always)]
fn pack<const CPT: usize>(x: &[f32; CPT]) -> [u32; 4] {
    let mut w = [0u32; 4];
    for j in 0..CPT / 2 {
        w[j] = convert::pack_bf16x2(x[2 * j], x[2 * j + 1]);
    }
    w
}

/// `CPT` f32 stored at `addr` (`4 CPT` bytes, 16-byte aligned).
///
/// # Safety
/// As for [`store_words`].
#[inline(always)]
unsafe fn store_f32<const CPT: usize>(addr: u32, x: &[f32; CPT]) {
    for j in 0..CPT / 4 {
        let w = [
            x[4 * j].to_bits(),
            x[4 * j + 1].to_bits(),
            x[4 * j + 2].to_bits(),
            x[4 * j + 3].to_bits(),
        ];
        // SAFETY: forwarded to the caller (16 bytes of the row, 16-byte aligned).
        unsafe { <[u32; 4]>::store(addr + 16 * j as u32, w) };
    }
}

/// Zero rows `valid .. step` of a swizzled `[step, 64 blocks]` v tile at `v` (`blocks` column
/// blocks `block` bytes apart): the rows past a segment's end, where TMA loaded the next
/// sequence's tokens. The warpgroup's 128 threads share the 16-byte words (`ctid` is this
/// thread's index in it).
///
/// # Safety
/// The stage's full phase completed and no product reads it before the caller's next barrier
/// (with its proxy fence); no other thread writes these rows.
#[inline(always)]
unsafe fn zero_rows_past(v: u32, block: u32, blocks: u32, step: u32, valid: u32, ctid: u32) {
    let row_words = 8u32; // 16-byte words per 128-byte row
    let words = (step - valid) * row_words * blocks;
    let mut w = ctid;
    while w < words {
        let (cb, rest) = (
            w / ((step - valid) * row_words),
            w % ((step - valid) * row_words),
        );
        let row = valid + rest / row_words;
        // SAFETY: a row >= valid of the tile, 16-byte aligned, one writer (the caller's
        // contract).
        unsafe { <[u32; 4]>::store(v + cb * block + row * 128 + (rest % row_words) * 16, [0; 4]) };
        w += WARPGROUP_SIZE;
    }
}

/// Inclusive prefix sums, over the `P` consecutive lanes from `base_lane` (this lane is
/// `part`), of each lane's run totals `acc`: returns the exclusive prefix of this lane's run.
///
/// # Safety
/// All 32 lanes execute the call (uniform loop bounds).
#[inline(always)]
unsafe fn run_prefix<const CPT: usize, const P: u32>(acc: [f32; CPT], part: u32) -> [f32; CPT] {
    let mut incl = acc;
    let mut off = 1;
    while off < P {
        for c in 0..CPT {
            // SAFETY: every lane executes the shuffle.
            let v = f32::from_bits(unsafe {
                warp::shfl_up_u32(warp::FULL_MASK, incl[c].to_bits(), off)
            });
            if part >= off {
                incl[c] += v;
            }
        }
        off *= 2;
    }
    let mut excl = [0.0f32; CPT];
    for c in 0..CPT {
        // SAFETY: every lane executes the shuffle.
        let v = f32::from_bits(unsafe { warp::shfl_up_u32(warp::FULL_MASK, incl[c].to_bits(), 1) });
        excl[c] = if part == 0 { 0.0 } else { v };
    }
    excl
}

/// Local inclusive cumulative log2-decays of the thread's `TPT` rows `first ..` of a tile
/// (`g` clamped below at `G_FLOOR`; rows `>= valid` count as zero), for its `CPT` channels at
/// byte column `col`; returns them and the run total.
///
/// # Safety
/// The rows were published (the stage's full phase completed); whole warps call it.
#[inline(always)]
unsafe fn local_cumsum<const CPT: usize, const TPT: usize>(
    g_at: impl Fn(u32) -> u32,
    first: u32,
    valid: u32,
) -> ([[f32; CPT]; TPT], [f32; CPT]) {
    let mut b = [[0.0f32; CPT]; TPT];
    let mut acc = [0.0f32; CPT];
    for (i, bi) in b.iter_mut().enumerate() {
        let row = first + i as u32;
        // SAFETY: a published row of the stage (the caller's contract), aligned.
        let w = unsafe { load_words::<CPT>(g_at(row)) };
        let w = if row >= valid { [0; 4] } else { w };
        let g = unpack::<CPT>(w);
        for c in 0..CPT {
            // (`max` returns its non-NaN operand: a NaN log-decay reads as the floor.)
            acc[c] = math::fma(g[c].max(G_FLOOR), math::LOG2_E, acc[c]);
        }
        *bi = acc;
    }
    (b, acc)
}

/// The element-wise phase of a whole step for the forward kernel, vectorized: the parent
/// module's [`super::elementwise`] (same formulas, same operand tiles, same decay rows), with
/// thread `ctid` of the consumer taking `CPT` consecutive key channels (one 16- or 8-byte piece
/// of a row) of `TPT` consecutive tokens of one chunk: `ctid = (chunk' NG + group) P + part`
/// with `NG = DK / CPT` channel groups and `P = 16 / TPT` lanes per (chunk, group), so a
/// warp's stores cover whole rows; `chunk'` counts the chunks done at once (`128 / (P NG)`),
/// and the step's `NCH` chunks take `NCH / (128 / (P NG))` passes. Chunks past `valid` are
/// skipped (warp-uniform).
///
/// # Safety
/// The consumer's 128 threads call it (whole warps; chunks are warp-uniform); the stage was
/// published by its full phase; the operand tiles are not read before the next barrier.
#[inline(always)]
unsafe fn elementwise_step<
    const DK: u32,
    const CPT: usize,
    const P: u32,
    const TPT: usize,
    const NCH: u32,
>(
    ctid: u32,
    base: &PingpongChunk<DK>,
    valid: u32,
) {
    const {
        assert!(
            P * TPT as u32 == CHUNK
                && TPT as u32 <= HALF
                && P >= 2
                && 32 % P == 0
                && (CPT == 8 || CPT == 4)
        )
    };
    const { assert!(4.0 * -G_FLOOR * math::LOG2_E < 126.0) };
    let ng = DK / CPT as u32;
    let part = ctid % P;
    let group = (ctid / P) % ng;
    // Chunks done at once by the 128 threads; the step's chunks take `NCH / per_pass` passes.
    let per_pass = WARPGROUP_SIZE / (P * ng);
    for pass in 0..NCH / per_pass {
        let chunk = pass * per_pass + ctid / (P * ng);
        // SAFETY: forwarded to the caller (the chunk is warp-uniform).
        unsafe { elementwise_chunk::<DK, CPT, P, TPT>(chunk, part, group, base, valid) };
    }
}

/// One chunk of [`elementwise_step`]: channel group `group`, lane `part` of its `P`.
///
/// # Safety
/// As for [`elementwise_step`]; whole warps call it with the same chunk.
#[inline(always)]
unsafe fn elementwise_chunk<const DK: u32, const CPT: usize, const P: u32, const TPT: usize>(
    chunk: u32,
    part: u32,
    group: u32,
    base: &PingpongChunk<DK>,
    valid: u32,
) {
    let r0 = chunk * CHUNK;
    if r0 >= valid {
        return;
    }
    let t = PingpongChunk::<DK> { r0, ..*base };
    let base_lane = index::lane_id() - part;
    let col = group * 2 * CPT as u32;
    let first = part * TPT as u32;
    let cvalid = valid - r0;
    // SAFETY: published raw g rows < 16 of the chunk (the caller's contract); aligned pieces.
    let (mut b, acc) =
        unsafe { local_cumsum::<CPT, TPT>(|row| t.raw(Raw::G, row, col), first, cvalid) };
    // SAFETY: whole warps (chunks are warp-uniform), uniform loop bounds.
    let excl = unsafe { run_prefix::<CPT, P>(acc, part) };
    for bi in b.iter_mut() {
        for c in 0..CPT {
            bi[c] += excl[c];
        }
    }
    // b_0, b_7, b_8, b_15 of the thread's channels, from the lanes whose runs hold them.
    // SAFETY: every lane executes the shuffles (whole warps); the sources are this group's.
    let edge = unsafe { chunk_edges::<CPT, TPT, P>(&b, base_lane) };
    let b15 = edge[3];
    if part == P - 1 {
        let mut d = [0.0f32; CPT];
        for c in 0..CPT {
            d[c] = math::exp2(b15[c]);
        }
        // SAFETY: channels `CPT group ..` of the chunk's decay row (16-byte aligned); this
        // thread is their only writer until the next barrier.
        unsafe { store_f32::<CPT>(t.decay + r0 / CHUNK * DK * 4 + 4 * CPT as u32 * group, &d) };
    }
    let half = first / HALF;
    let mut m = [[0.0f32; CPT]; 2];
    let mut mh = [0.0f32; CPT];
    let mut f_inter = [0.0f32; CPT];
    let mut f_10_root = [0.0f32; CPT];
    let mut f_state = [0.0f32; CPT];
    for c in 0..CPT {
        m[0][c] = 0.5 * (edge[0][c] + edge[1][c]);
        m[1][c] = 0.5 * (edge[2][c] + edge[3][c]);
        mh[c] = if half == 0 { m[0][c] } else { m[1][c] };
        f_inter[c] = math::exp2(mh[c]);
        // The square root of 2^{M_1 - M_0}: see the parent module (never flushed).
        f_10_root[c] = if half == 0 {
            math::exp2(0.5 * (m[1][c] - m[0][c]))
        } else {
            1.0
        };
        f_state[c] = math::exp2(b15[c] - m[1][c]);
    }
    for (i, bi) in b.iter().enumerate() {
        let row = first + i as u32;
        // SAFETY: published raw q, k rows < 16 of the chunk; aligned pieces.
        let (qw, kw) = unsafe {
            (
                load_words::<CPT>(t.raw(Raw::Q, row, col)),
                load_words::<CPT>(t.raw(Raw::K, row, col)),
            )
        };
        let (qw, kw) = if row >= cvalid {
            ([0; 4], [0; 4])
        } else {
            (qw, kw)
        };
        let (q, k) = (unpack::<CPT>(qw), unpack::<CPT>(kw));
        let mut qd = [0.0f32; CPT];
        let mut kd = [0.0f32; CPT];
        let mut qi = [0.0f32; CPT];
        let mut kh1 = [0.0f32; CPT];
        let mut ks = [0.0f32; CPT];
        for c in 0..CPT {
            [qd[c], kd[c], qi[c], kh1[c], ks[c]] = chunk_operands(
                q[c],
                k[c],
                bi[c] - mh[c],
                [f_inter[c], f_10_root[c], f_state[c]],
            );
        }
        // SAFETY: rows < 16 of the chunk (k_half0: half 0 only), this thread's channels: one
        // writer per piece; aligned; nobody reads the tiles before the next barrier.
        unsafe {
            let at = |v: Var| t.var(v, row, col);
            store_words::<CPT>(at(Var::QDiag), pack::<CPT>(&qd));
            store_words::<CPT>(at(Var::QInter), pack::<CPT>(&qi));
            if half == 0 {
                store_words::<CPT>(at(Var::KHalf0), pack::<CPT>(&kd));
            }
            store_words::<CPT>(at(Var::KHalf1), pack::<CPT>(&kh1));
            store_words::<CPT>(at(Var::KState), pack::<CPT>(&ks));
        }
    }
}

/// The element-wise phase of one step of the state pass: `k_state = k 2^{(E - B_s) + C}`
/// relative to the end of the segment (`B` cumulative from the step's start, `E` the step's
/// total, `C` = `carry` the total of the segment's later steps, all log2: every factor is the
/// token's true weight in the segment's state, `<= 1` for `g <= 0`, so a flushed one only drops
/// a term below `2^-126 |k|`). Thread `ctid` takes `CPT = 8` channels (group `ctid / P`) of
/// `TPT` consecutive tokens (`P` lanes per group). Returns `E` of its channels.
///
/// # Safety
/// The warpgroup's 128 threads call it (whole warps); the stage was published by its full
/// phase; the `k_state` tile is not read before the next barrier.
#[inline(always)]
unsafe fn elementwise_states<const DK: u32, const P: u32, const TPT: usize>(
    ctid: u32,
    t: &PingpongChunk<DK>,
    valid: u32,
    carry: &[f32; 8],
) -> [f32; 8] {
    const CPT: usize = 8;
    const { assert!(P * (DK / CPT as u32) == WARPGROUP_SIZE && 32 % P == 0 && P >= 2) };
    let part = ctid % P;
    let group = ctid / P;
    let base_lane = index::lane_id() - part;
    let col = group * 2 * CPT as u32;
    let first = part * TPT as u32;
    // SAFETY: published raw g rows of the step (the caller's contract); aligned pieces.
    let (b, acc) = unsafe { local_cumsum::<CPT, TPT>(|row| t.raw(Raw::G, row, col), first, valid) };
    // SAFETY: whole warps, uniform loop bounds.
    let excl = unsafe { run_prefix::<CPT, P>(acc, part) };
    let mut e = [0.0f32; CPT];
    for c in 0..CPT {
        // SAFETY: every lane executes the shuffle; the source is the group's last lane, whose
        // inclusive run total is the step's total.
        e[c] = unsafe { shfl_f32(acc[c] + excl[c], base_lane + P - 1) };
    }
    // Per channel, `E - excl + C`: the token's exponent is this minus its local cumsum.
    let mut off = [0.0f32; CPT];
    for c in 0..CPT {
        off[c] = (e[c] - excl[c]) + carry[c];
    }
    for (i, bi) in b.iter().enumerate() {
        let row = first + i as u32;
        // SAFETY: a published raw k row of the step; aligned piece.
        let kw = unsafe { load_words::<CPT>(t.raw(Raw::K, row, col)) };
        let kw = if row >= valid { [0; 4] } else { kw };
        let k = unpack::<CPT>(kw);
        let mut ks = [0.0f32; CPT];
        for c in 0..CPT {
            ks[c] = k[c] * math::exp2(off[c] - bi[c]);
        }
        // SAFETY: row < step of the swizzled k_state tile, this thread's piece: one writer;
        // nobody reads it before the next barrier.
        unsafe { store_words::<CPT>(t.var(Var::KState, row, col), pack::<CPT>(&ks)) };
    }
    e
}

/// The intra-chunk scores of chunk `cc` of the step (one warp): `P[t][s]` as in the baseline's
/// matrix phase, stored as bf16 in the swizzled score tile at K offset `16 cc`.
///
/// # Safety
/// Whole warp, uniform control flow; the padded operand tiles were published by a barrier;
/// this warp is the only writer of the chunk's part of the score tile until the next barrier.
#[inline(always)]
unsafe fn scores<const DK: u32, const NKK: usize>(
    lane: u32,
    q_diag: u32,
    k_half0: u32,
    k_half1: u32,
    p_tile: u32,
    cc: u32,
) {
    let rb = const { GlaConfig::row_bytes(DK) };
    let at = |base: u32| base + 16 * cc * rb;
    // SAFETY: whole warp, uniform; the tiles were published (the caller's contract).
    let pa = unsafe { intra_scores::<DK, NKK>(lane, at(q_diag), at(k_half0), at(k_half1)) };
    let (g, t) = (lane / 4, lane % 4);
    // The A-fragment words at their (row t, column s) places of P.
    // The A-fragment words at their (row t, column s) places of P (written out, not iterated
    // over an array, which LLVM left in local memory).
    let put = |row: u32, col: u32, w: u32| {
        // SAFETY: row < 16, column 16 cc + col + 1 < 64 of the score tile; 4-byte aligned; one
        // writer per element (this warp, this lane).
        unsafe { u32::store(swizzled(p_tile, 0, row, 32 * cc + 2 * col), w) }
    };
    put(g, 2 * t, pa[0]);
    put(g + 8, 2 * t, pa[1]);
    put(g, 8 + 2 * t, pa[2]);
    put(g + 8, 8 + 2 * t, pa[3]);
}

/// The pingpong walk; see the module documentation. `SR = DK / 2` accumulator registers per
/// m64 half of `S^T`, `MH = DV / 64` halves, `NKK = DK / 16`, `NCH = STEP / 16`. `st_mma` is
/// `wgmma.m64n{DK}k16` (A MN-major, B MN-major), `st_fence` pins its accumulators.
///
/// # Safety
/// Launched as documented on [`GlaPingpongParams`] with the configuration `cfg`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn walk<
    const DK: u32,
    const DV: u32,
    const DVT: u32,
    const PARTS: u32,
    const STEP: u32,
    const STAGES: u32,
    const CPT: usize,
    const PE: u32,
    const TPTE: usize,
    const NKK: usize,
    const SR: usize,
    const MH: usize,
    const NCH: u32,
    const NC: u32,
    const CREGS: u32,
>(
    p: &GlaPingpongParams,
    cfg: &PingpongConfig,
    tmaps: [TensorMapPtr; 4],
    st_mma: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    st_fence: impl Fn(&mut [f32; SR]),
) {
    const {
        assert!(
            SR as u32 * 2 == DK
                && MH as u32 * PP_ATOM == DV
                && DV * PARTS == DVT
                && NKK as u32 * 16 == DK
                && NCH * CHUNK == STEP
                && NCH <= 4
                && (PE * (DK / CPT as u32) * NCH).is_multiple_of(WARPGROUP_SIZE)
                && NC >= 2
                && NC <= PP_MAX_CONSUMERS
                && (PARTS == 1 || (PARTS == NC && NC == 2))
        )
    };
    // Shared-item mode (`PingpongConfig::shares_item`): the consumers are the value parts of
    // one item, with one ring and the element-wise phase of step `i` done by consumer `i % 2`.
    let shared = PARTS > 1;
    // Value columns of a ring stage, rings (and their barrier pairs).
    let ring_dv = if shared { DVT } else { DV };
    let rings = if shared { 1 } else { NC };
    let [tmap_q, tmap_k, tmap_g, tmap_v] = tmaps;
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let base = smem::aligned_base();
    let bars = base + cfg.barriers_offset();
    // Ring of consumer c's steps.
    let ring = |c: u32| if shared { 0 } else { c };
    let full = |c: u32, s: u32| Mbarrier::at(bars + 8 * (ring(c) * STAGES + s));
    let empty = |c: u32, s: u32| Mbarrier::at(bars + 8 * ((NC + ring(c)) * STAGES + s));
    // Region of consumer c's ring and operand set (shared mode: the one ring, and set `b`).
    let region = |c: u32, b: u32| {
        if shared {
            base + cfg.shared_region(b)
        } else {
            base + c * cfg.consumer_bytes()
        }
    };
    let block = cfg.block_bytes();
    // Every consumer's item (unused entries have no steps).
    let mut items = [Item {
        seg: Segment::default(),
        slot: 0,
        head: 0,
        dv0: 0,
        steps: 0,
    }; PP_MAX_CONSUMERS as usize];
    for (c, it) in items.iter_mut().enumerate() {
        if (c as u32) < NC {
            *it = item::<STEP, NC, DV, PARTS, true>(p, c as u32);
        }
    }
    let mut n = [0u32; PP_MAX_CONSUMERS as usize];
    for (nc, it) in n.iter_mut().zip(items.iter()) {
        *nc = it.steps;
    }
    let max_steps = n[0].max(n[1]).max(n[2]);

    if tid == 0 {
        for t in tmaps {
            t.prefetch();
        }
        // SAFETY: single initializer before any use; published by the barrier below.
        unsafe {
            for c in 0..rings {
                for s in 0..STAGES {
                    full(c, s).init(1);
                    // Shared mode: both consumers release the stage.
                    empty(c, s).init(if shared { NC } else { 1 });
                }
            }
        }
        fence::fence_mbarrier_init();
    }
    // SAFETY: all threads reach this barrier once, before the role split.
    unsafe { sync::sync_threads() };

    if wg == 0 {
        // SAFETY: the whole producer warpgroup executes this, uniformly.
        unsafe { regs::decrease::<PP_PRODUCER_REGS>() };
        if tid == 0 {
            // Every consumer's steps `i` advance together, so one ring position serves all.
            let mut pos = RingPos::<STAGES>::of(0);
            for i in 0..max_steps {
                for c in 0..rings {
                    let it = items[c as usize];
                    if i >= it.steps {
                        continue;
                    }
                    let s = pos.stage;
                    let r = region(c, 0);
                    let (x, y, z) = (0i32, it.head as i32, (it.seg.start + i * STEP) as i32);
                    // SAFETY: ring protocol (module docs): the stage is free once `empty`
                    // completed its previous phase; `full` expects exactly the boxes' bytes;
                    // the destinations are 1024-aligned column blocks of this consumer's
                    // stage, untouched until the phase completes.
                    unsafe {
                        empty(c, s).wait_parity(pos.phase ^ 1);
                        let bar = full(c, s);
                        bar.arrive_expect_tx(cfg.load_bytes(true));
                        for cb in 0..DK / PP_ATOM {
                            let xo = x + (cb * PP_ATOM) as i32;
                            tmap_q.load_3d(r + cfg.q_offset(s) + cb * block, xo, y, z, bar);
                            tmap_k.load_3d(r + cfg.k_offset(s) + cb * block, xo, y, z, bar);
                            tmap_g.load_3d(r + cfg.g_offset(s) + cb * block, xo, y, z, bar);
                        }
                        for cb in 0..ring_dv / PP_ATOM {
                            let xo = (it.dv0 + cb * PP_ATOM) as i32;
                            tmap_v.load_3d(r + cfg.v_offset(s) + cb * block, xo, y, z, bar);
                        }
                    }
                }
                pos = pos.next();
            }
        }
        return;
    }

    // Consumers.
    // SAFETY: the whole consumer warpgroup executes this, uniformly.
    unsafe { regs::increase::<CREGS>() };
    // The state pass (this launch's primary when a sequence is split) may still be running:
    // every consumer thread waits for it before its first read of delta / decay_log2 and its
    // first write (module docs, "Launch order").
    griddep::wait_primary();
    let c = wg - 1;
    // (Recomputed rather than indexed by the runtime `c`, which would put the array in local
    // memory.)
    let it = item::<STEP, NC, DV, PARTS, true>(p, c);
    if it.steps == 0 {
        return;
    }
    let ctid = tid - wg * WARPGROUP_SIZE;
    let warp = ctid / 32;
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let heads = p.base.heads as u64;
    // States and outputs have all DVT = DV PARTS value columns; this item owns DV of them.
    let state_len = (DK * DVT) as usize;
    let seg = it.seg;
    let pair_head = (seg.seq as u64 * heads + it.head as u64) as usize * state_len;
    // Element (j, e) of half mh of S^T: S[8 j + 2 t + e % 2][64 mh + 16 warp + g + 8 (e / 2)].
    let state_index = |mh: usize, j: usize, e: usize| {
        let dk = 8 * j as u32 + 2 * t + (e as u32 % 2);
        let dv = it.dv0 + 64 * mh as u32 + 16 * warp + g + 8 * (e as u32 / 2);
        (dk * DVT + dv) as usize
    };

    // The initial state: the sequence's (or zero), with, for a segment that is not first, every
    // earlier segment of the sequence folded in (`gla_combine`'s recurrence
    // `S <- 2^{D_m} S + delta_m`, done here per item instead of in a launch of its own), walked
    // backwards: `S = W S_init + sum_m W_m delta_m`, `W_m` the product of `2^{D_l}` over the
    // segments between m and this one. Each segment's loads (its flags, delta and decay) are
    // independent of the previous one's, so the walk costs one round trip per segment.
    let mut st = [[0.0f32; SR]; MH];
    // W of channels 8 j + 2 t, + 1 (j < SR / 4 <= 16).
    const { assert!(SR / 4 <= 16) };
    let mut w = [[1.0f32; 2]; 16];
    if seg.flags & SEG_FIRST == 0 {
        // The sequence's segments are consecutive in the table, its first one flagged (so
        // slot >= 1 here, and the walk stops at the sequence's first segment).
        let mut m = it.slot;
        loop {
            m -= 1;
            let mh_slot = (m as u64 * heads + it.head as u64) as usize;
            let delta = p.base.delta.wrapping_add(mh_slot * state_len);
            let decay = p.base.decay_log2.wrapping_add(mh_slot * DK as usize);
            // SAFETY: m < slot < segments, inside the table.
            let flags = unsafe { (*p.base.segments.add(m as usize)).flags };
            for (mh, half) in st.iter_mut().enumerate() {
                for j in 0..SR / 4 {
                    for e in 0..4 {
                        // SAFETY: segment m < slot is not last, so `gla_states_pp` wrote its
                        // delta slice (DK * DVT elements, host-checked sizes) before this
                        // launch; state_index < DK * DVT.
                        let d = unsafe { *delta.add(state_index(mh, j, e)) };
                        half[4 * j + e] = math::fma(w[j][e % 2], d, half[4 * j + e]);
                    }
                }
            }
            for j in 0..SR / 4 {
                let dk = 8 * j + 2 * t as usize;
                // SAFETY: as for delta: its decay slice (DK elements), channels dk, dk + 1 < DK.
                let (d0, d1) = unsafe { (*decay.add(dk), *decay.add(dk + 1)) };
                w[j][0] *= math::exp2(d0);
                w[j][1] *= math::exp2(d1);
            }
            if flags & SEG_FIRST != 0 {
                break;
            }
        }
    }
    if p.base.has_init != 0 {
        let init = p.base.init_state.wrapping_add(pair_head);
        for (mh, half) in st.iter_mut().enumerate() {
            for j in 0..SR / 4 {
                for e in 0..4 {
                    // SAFETY: the state slice of (seq, head) has DK * DVT elements
                    // (host-checked sizes); state_index < DK * DVT.
                    let x = unsafe { *init.add(state_index(mh, j, e)) };
                    half[4 * j + e] = math::fma(w[j][e % 2], x, half[4 * j + e]);
                }
            }
        }
    }

    let mut o = [[0.0f32; 8]; MH];
    let row_stride = (heads * DVT as u64) as usize;
    // Store o^T of chunk `cc` of step `step` (valid rows only), scaled, as bf16. The values are
    // converted and pinned before any branch: a read of `wgmma` accumulators on a divergent
    // path makes ptxas serialize the products.
    let store_o = |o: &[[f32; 8]; MH], step: u32, cc: u32, valid: u32| {
        let row0 = seg.start as u64 + (step * STEP + cc * CHUNK) as u64;
        let dst = p
            .base
            .o
            .wrapping_add(((row0 * heads + it.head as u64) * DVT as u64 + it.dv0 as u64) as usize);
        for (mh, half) in o.iter().enumerate() {
            let sc = p.base.scale;
            let mut w = [
                convert::pack_bf16x2(half[0] * sc, half[1] * sc),
                convert::pack_bf16x2(half[2] * sc, half[3] * sc),
                convert::pack_bf16x2(half[4] * sc, half[5] * sc),
                convert::pack_bf16x2(half[6] * sc, half[7] * sc),
            ];
            wgmma::pin_fragment(&mut w);
            for j in 0..2u32 {
                for e in 0..4u32 {
                    let token = 8 * j + 2 * t + e % 2;
                    let dv = 64 * mh as u32 + 16 * warp + g + 8 * (e / 2);
                    let word = w[(2 * j + e / 2) as usize];
                    let v = (word >> (16 * (e % 2))) as u16;
                    if cc * CHUNK + token < valid {
                        // SAFETY: token row < valid rows of the segment's step, dv < DV:
                        // inside o; this thread is the element's only writer.
                        unsafe { *dst.wrapping_add(token as usize * row_stride + dv as usize) = v };
                    }
                }
            }
        }
    };

    let mut pos = RingPos::<STAGES>::of(0);
    for step in 0..it.steps {
        let s = pos.stage;
        let valid = (seg.len - step * STEP).min(STEP);
        let nchunks = valid.div_ceil(CHUNK);
        // The operand set of this step (shared mode: set `step % 2`, written by both consumers)
        // and the ring.
        let b = step % 2;
        let (rs, r) = (region(c, 0), region(c, b));
        let q_inter = r + cfg.q_inter_offset();
        let k_state = r + cfg.k_state_offset();
        let p_tile = r + cfg.p_offset();
        let q_diag = r + cfg.q_diag_offset();
        let k_half0 = r + cfg.k_half0_offset();
        let k_half1 = r + cfg.k_half1_offset();
        let decay = r + cfg.decay_offset();
        let (q_s, k_s, g_s, v_s) = (
            rs + cfg.q_offset(s),
            rs + cfg.k_offset(s),
            rs + cfg.g_offset(s),
            rs + cfg.v_offset(s),
        );
        // This consumer's value columns of the stage (shared mode: column block c).
        let v_own = if shared { v_s + c * block } else { v_s };
        // SAFETY: the producer issues every step of this item, so the phase completes.
        unsafe { full(c, s).wait_parity(pos.phase) };

        let tiles = PingpongChunk::<DK> {
            q: q_s,
            k: k_s,
            g: g_s,
            q_inter,
            k_state,
            q_diag,
            k_half0,
            k_half1,
            decay,
            r0: 0,
            block,
        };
        if shared {
            // Both consumers, in step: consumer c computes chunk c of the step (its
            // element-wise phase and scores); two barriers of both consumers (256 threads)
            // publish the set. The set the step writes was last read by the GEMM phases of
            // step - 2, which both consumers finished before the first of these barriers in
            // step - 1.
            const { assert!(PARTS == 1 || (NCH == 2 && PE * (DK / CPT as u32) == WARPGROUP_SIZE)) };
            if valid < STEP && c == 0 {
                // SAFETY: the stage's full phase completed; it is released only after both
                // consumers' L3; consumer 0 alone writes these rows.
                unsafe { zero_rows_past(v_s, block, ring_dv / PP_ATOM, STEP, valid, ctid) };
            }
            let part = ctid % PE;
            let group = (ctid / PE) % (DK / CPT as u32);
            // SAFETY: the consumer's 128 threads, chunk c (warp-uniform); the stage was
            // published by its full phase; the set is not read before the barrier below.
            unsafe { elementwise_chunk::<DK, CPT, PE, TPTE>(c, part, group, &tiles, valid) };
            fence::fence_proxy_async_shared();
            // SAFETY: both consumers' 256 threads, uniformly.
            unsafe { sync::named_sync(PP_PAIR_BARRIER, ORDER_THREADS) };
            if warp == 0 && c < nchunks {
                // SAFETY: whole warp; tiles published by the barrier above; this warp writes
                // only chunk c's part of the score tile.
                unsafe { scores::<DK, NKK>(lane, q_diag, k_half0, k_half1, p_tile, c) };
            }
            fence::fence_proxy_async_shared();
            // SAFETY: both consumers' 256 threads, uniformly.
            unsafe { sync::named_sync(PP_PAIR_BARRIER, ORDER_THREADS) };
        } else {
            // 1. Element-wise phase; rows past the segment's end are zero.
            if valid < STEP {
                // SAFETY: this consumer's stage (full phase completed, released only after
                // barrier L3).
                unsafe { zero_rows_past(v_s, block, ring_dv / PP_ATOM, STEP, valid, ctid) };
            }
            // SAFETY: the consumer's 128 threads (chunks are warp-uniform); the stage was
            // published by its full phase; the operand tiles are not read before L1.
            unsafe { elementwise_step::<DK, CPT, PE, TPTE, NCH>(ctid, &tiles, valid) };
            fence::fence_proxy_async_shared();
            // SAFETY: barrier L1 of the protocol (the consumer's 128 threads, uniformly).
            unsafe { sync::named_sync(PP_LOCAL_BARRIER + c, WARPGROUP_SIZE) };

            // 2. Intra-chunk scores.
            let mut cc = warp;
            while cc < nchunks {
                // SAFETY: whole warp (cc is warp-uniform); tiles published by L1; this warp
                // writes only chunk cc's part of the score tile.
                unsafe { scores::<DK, NKK>(lane, q_diag, k_half0, k_half1, p_tile, cc) };
                cc += 4;
            }
            fence::fence_proxy_async_shared();
            // SAFETY: barrier L2 of the protocol.
            unsafe { sync::named_sync(PP_LOCAL_BARRIER + c, WARPGROUP_SIZE) };
        }

        // 3. GEMM phase, in turn.
        // (No turns in the shared mode: the sets' hand-offs order the consumers.)
        let (sync_turn, arrive_turn) = if shared {
            (false, None)
        } else {
            (turn_waits::<NC>(&n, step, c), turn_next::<NC>(&n, step, c))
        };
        if sync_turn {
            // SAFETY: turn protocol (module docs): matched by one arrival of the other
            // consumer.
            unsafe { sync::named_sync(PP_ORDER_BARRIER + c, ORDER_THREADS) };
        }
        for cc in 0..nchunks {
            // The previous chunk's outputs (final after its wait), stored while this chunk's
            // batch runs.
            let o_prev = o;
            let drow = decay + cc * DK * 4;
            // One batch per m64 half of S^T (its fragments are the only ones live: with
            // DK = DV = 128 both halves' would not fit in the registers beside S^T).
            for mh in 0..MH {
                // S^T (before this chunk's update) as bf16 A fragments, read by the in-flight
                // `o^T = S^T q_inter^T`: pinned after its wait so their registers are not
                // reused before.
                let mut frag = [[0u32; 4]; NKK];
                for (kk, f) in frag.iter_mut().enumerate() {
                    let a = &st[mh][8 * kk..8 * kk + 8];
                    *f = [
                        convert::pack_bf16x2(a[0], a[1]),
                        convert::pack_bf16x2(a[2], a[3]),
                        convert::pack_bf16x2(a[4], a[5]),
                        convert::pack_bf16x2(a[6], a[7]),
                    ];
                }
                // S^T *= decay (per key channel, the accumulator column).
                for j in 0..SR / 4 {
                    // SAFETY: channels 8 j + 2 t, +1 < DK of the published decay row.
                    let d = unsafe { u64::load(drow + 4 * (8 * j as u32 + 2 * t)) };
                    let d = [f32::from_bits(d as u32), f32::from_bits((d >> 32) as u32)];
                    for e in 0..4 {
                        st[mh][4 * j + e] *= d[e % 2];
                    }
                }
                // The scaled state and the fragments are final here: keep the compiler from
                // sinking their definitions between the `wgmma`s of the batch (which would
                // serialize it).
                st_fence(&mut st[mh]);
                wgmma::fence_operands_8(&mut o[mh]);
                for f in frag.iter_mut() {
                    wgmma::pin_fragment(f);
                }
                // SAFETY: whole warpgroup, uniform; the operand tiles were published by L1/L2
                // (shared mode: the pair barriers), with the proxy fence, and the stage by its
                // full phase; none is rewritten before L3 of this step.
                unsafe {
                    wgmma::fence();
                    let va =
                        Descriptor::mn_major_sw128(v_own + mh as u32 * block + 2048 * cc, block);
                    for (kk, f) in frag.iter().enumerate() {
                        let (cb, within) = (kk as u32 / 4, 32 * (kk as u32 % 4));
                        let b =
                            Descriptor::k_major_sw128(q_inter + cb * block + 2048 * cc + within);
                        if kk == 0 {
                            wgmma::m64n16k16_bf16_rs::<0, false>(&mut o[mh], *f, b);
                        } else {
                            wgmma::m64n16k16_bf16_rs::<0, true>(&mut o[mh], *f, b);
                        }
                    }
                    let pb = Descriptor::k_major_sw128(p_tile + 32 * cc);
                    wgmma::m64n16k16_bf16_ss::<1, 0, true>(&mut o[mh], va, pb);
                    let kb = Descriptor::mn_major_sw128(k_state + 2048 * cc, block);
                    st_mma(&mut st[mh], va, kb);
                    wgmma::commit_group();
                    // The turn ends with the issue of the step's last batch: the next consumer
                    // may issue while this one waits and stores its outputs.
                    if cc + 1 == nchunks
                        && mh + 1 == MH
                        && let Some(next) = arrive_turn
                    {
                        // SAFETY: turn protocol: the next consumer in the turn order syncs once
                        // for this arrival (uniform: the whole warpgroup is here).
                        sync::named_arrive(PP_ORDER_BARRIER + next, ORDER_THREADS);
                    }
                    if cc > 0 && mh + 1 == MH {
                        store_o(&o_prev, step, cc - 1, valid);
                    }
                    // The next chunk needs this state: wait here (uniformly, so ptxas keeps
                    // the batch pipelined).
                    wgmma::wait_group::<0>();
                }
                for f in frag.iter_mut() {
                    wgmma::pin_fragment(f);
                }
                st_fence(&mut st[mh]);
                wgmma::fence_operands_8(&mut o[mh]);
            }
        }
        store_o(&o, step, nchunks - 1, valid);
        // SAFETY: barrier L3 of the protocol.
        unsafe { sync::named_sync(PP_LOCAL_BARRIER + c, WARPGROUP_SIZE) };
        if ctid == 0 {
            // SAFETY: every read of the stage by this consumer is complete (L3); one arrival
            // per phase and consumer of the ring.
            unsafe { empty(c, s).arrive() };
        }
        pos = pos.next();
    }

    if seg.flags & SEG_LAST != 0 && p.base.has_final != 0 {
        let out = p.base.final_state.wrapping_add(pair_head);
        for (mh, half) in st.iter().enumerate() {
            for j in 0..SR / 4 {
                for e in 0..4 {
                    // SAFETY: this item's columns of its sequence's final state, DK * DVT
                    // elements; state_index < DK * DVT.
                    unsafe { *out.add(state_index(mh, j, e)) = half[4 * j + e] };
                }
            }
        }
    }
}

/// The state pass (`gla_states_pp_*`): block `x` is (segment `x / heads`, head `x % heads`)
/// with all `DV` value columns, no producer warpgroup and no turns. The state a segment adds
/// from a zero state is `sum_s (k_s 2^{L - b_s})^T v_s` (`b` cumulative from the segment's
/// start, `L` its total, log2): a sum, not a chain, once every factor is taken relative to the
/// segment's end. So each of the [`PP_STATE_GROUPS`] warpgroups takes a contiguous part of the
/// segment's steps (warpgroup 1 the later one) and walks it from its last step to its first,
/// carrying `C` (the total of the steps already walked) per channel; `S^T += v^T k_state`
/// accumulates in the `wgmma` accumulators, never rescaled and never waited for between steps
/// (step `i`'s batch runs while step `i + 1`'s element-wise phase does; two `k_state` tiles).
/// Each warpgroup's thread 0 issues its TMA loads `PP_STATE_STAGES - 1` steps ahead. At the
/// end warpgroup 0 adds warpgroup 1's state to its own scaled by `2^{C_1}` (`C_1` the later
/// part's total) and writes `delta` (the segment's state, relative to its end) and
/// `decay_log2` (`C_0 + C_1`, the segment's total).
///
/// # Barrier protocol
/// - Launch order: every thread first executes `griddepcontrol.launch_dependents`, so the
///   forward (launched next with `overlap_previous`) may be scheduled while this grid runs; it
///   waits for this grid's completion before reading `delta` / `decay_log2` (module docs).
/// - Start: thread 0 of warpgroup `w` initializes its `full[w][s]` (count 1),
///   `fence.mbarrier_init`, issues the loads of its first `PP_STATE_STAGES` steps; the block
///   barrier (`sync_threads`) publishes the barriers.
/// - Warpgroup `w`'s walked step `i` at stage `i % PP_STATE_STAGES`, parity
///   `(i / PP_STATE_STAGES) % 2`: every thread waits on `full[w][s]` before reading the stage;
///   writes `k_state[i % 2]` (and zeroes the v rows past the segment's end); its proxy fence,
///   then barrier A (`PP_LOCAL_BARRIER + w`, 128 threads) publishes them to the `wgmma`s; the
///   batch of step `i` is committed, then `wait_group 1`: this thread's batch of step `i - 1`
///   is complete; barrier B (same id): every warp's is, so the stage and the `k_state` tile of
///   step `i - 1` are free: thread 0 then reloads the stage (step `i - 1 + PP_STATE_STAGES`),
///   and step `i + 1` rewrites that tile only after B.
/// - End: every thread waits for its last batch (`wait_group 0`); warpgroup 1 writes its state
///   and `C_1` into its own region (every load into it completed, every `wgmma` reading it
///   too); the block barrier publishes them to warpgroup 0, which alone writes the outputs.
///
/// # Safety
/// Launched as documented on [`GlaPingpongParams`] with the state pass's grid (`segments *
/// heads` blocks of `PP_STATE_THREADS`, `state_smem_bytes`).
#[inline(always)]
unsafe fn states_walk<
    const DK: u32,
    const DV: u32,
    const STEP: u32,
    const PS: u32,
    const TPTS: usize,
    const SR: usize,
    const MH: usize,
    const NCH: u32,
>(
    p: &GlaPingpongParams,
    cfg: &PingpongConfig,
    tmaps: [TensorMapPtr; 4],
    st_mma: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    st_fence: impl Fn(&mut [f32; SR]),
) {
    const {
        assert!(
            SR as u32 * 2 == DK
                && MH as u32 * PP_ATOM == DV
                && NCH * CHUNK == STEP
                && PS * (DK / 8) == WARPGROUP_SIZE
                && PS * TPTS as u32 == STEP
                && PP_STATE_GROUPS == 2
                && PP_STATE_STAGES >= 2
        )
    };
    let [_, tmap_k, tmap_g, tmap_v] = tmaps;
    // The forward may be scheduled now: it waits for this grid's completion before it reads
    // what this grid writes (module docs, "Launch order").
    griddep::launch_dependents();
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let ctid = tid - wg * WARPGROUP_SIZE;
    // Block x is item x with all value columns; nothing to do for last segments.
    let it = item::<STEP, 1, DV, 1, false>(p, 0);
    if it.steps == 0 {
        // Uniform for the block, before any barrier.
        return;
    }
    let seg = it.seg;
    // This warpgroup's steps of the segment: `first .. first + n`.
    let per = it.steps.div_ceil(PP_STATE_GROUPS);
    let first = (wg * per).min(it.steps);
    let n = (first + per).min(it.steps) - first;
    let base = smem::aligned_base();
    let region = base + wg * cfg.state_region_bytes();
    let full =
        |s: u32| Mbarrier::at(base + cfg.state_barriers_offset() + 8 * (wg * PP_STATE_STAGES + s));
    let block = cfg.block_bytes();
    // Walked step i is step `first + n - 1 - i` of the segment.
    let load = |i: u32| {
        let s = i % PP_STATE_STAGES;
        let (y, z) = (
            it.head as i32,
            (seg.start + (first + n - 1 - i) * STEP) as i32,
        );
        let bar = full(s);
        // SAFETY: thread 0 of the warpgroup only; the stage is free (never used, or released
        // after barrier B of the step that last read it); `full` expects exactly the boxes'
        // bytes; the destinations are 1024-aligned column blocks of the stage.
        unsafe {
            bar.arrive_expect_tx(cfg.state_stage_bytes());
            for cb in 0..DK / PP_ATOM {
                let x = (cb * PP_ATOM) as i32;
                tmap_k.load_3d(region + cfg.state_k_offset(s) + cb * block, x, y, z, bar);
                tmap_g.load_3d(region + cfg.state_g_offset(s) + cb * block, x, y, z, bar);
            }
            for cb in 0..DV / PP_ATOM {
                let x = (cb * PP_ATOM) as i32;
                tmap_v.load_3d(region + cfg.state_v_offset(s) + cb * block, x, y, z, bar);
            }
        }
    };
    if ctid == 0 {
        for t in [tmap_k, tmap_g, tmap_v] {
            t.prefetch();
        }
        for s in 0..PP_STATE_STAGES {
            // SAFETY: single initializer before any use; published by the barrier below.
            unsafe { full(s).init(1) };
        }
        fence::fence_mbarrier_init();
        for i in 0..PP_STATE_STAGES.min(n) {
            load(i);
        }
    }
    // SAFETY: every thread of the block, once.
    unsafe { sync::sync_threads() };

    let local = PP_LOCAL_BARRIER + wg;
    let mut st = [[0.0f32; SR]; MH];
    let mut carry = [0.0f32; 8];
    // (A warpgroup without steps, the later one of a one-step segment, issues no `wgmma`:
    // its state stays zero. The branch keeps the zero initialization off the pipelined path.)
    if n > 0 {
        for i in 0..n {
            let s = i % PP_STATE_STAGES;
            let valid = (seg.len - (first + n - 1 - i) * STEP).min(STEP);
            let (k_s, g_s, v_s) = (
                region + cfg.state_k_offset(s),
                region + cfg.state_g_offset(s),
                region + cfg.state_v_offset(s),
            );
            let k_state = region + cfg.state_k_state_offset(i % 2);
            // SAFETY: thread 0 issued this step's loads (the prologue or after barrier B of step
            // i + 1 - PP_STATE_STAGES).
            unsafe { full(s).wait_parity((i / PP_STATE_STAGES) % 2) };
            // Rows past the segment's end (only in the segment's last step) are zero.
            if valid < STEP {
                // SAFETY: the stage's full phase completed; it is reloaded only after barrier B.
                unsafe { zero_rows_past(v_s, block, DV / PP_ATOM, STEP, valid, ctid) };
            }
            let tiles = PingpongChunk::<DK> {
                q: 0,
                k: k_s,
                g: g_s,
                q_inter: 0,
                k_state,
                q_diag: 0,
                k_half0: 0,
                k_half1: 0,
                decay: 0,
                r0: 0,
                block,
            };
            // SAFETY: the warpgroup's 128 threads; the stage was published by its full phase;
            // this k_state tile was last read by step i - 2's batch, complete at barrier B of
            // step i - 1.
            let e = unsafe { elementwise_states::<DK, PS, TPTS>(ctid, &tiles, valid, &carry) };
            for c in 0..8 {
                carry[c] += e[c];
            }
            fence::fence_proxy_async_shared();
            // SAFETY: barrier A (the warpgroup's 128 threads, uniformly).
            unsafe { sync::named_sync(local, WARPGROUP_SIZE) };
            for (mh, half) in st.iter_mut().enumerate() {
                st_fence(half);
                // SAFETY: whole warpgroup, uniform; k_state and the zeroed v rows were published
                // by A (with the proxy fence), the stage by its full phase; neither is rewritten
                // before barrier B of step i + 1.
                unsafe {
                    wgmma::fence();
                    for kk in 0..NCH {
                        let va =
                            Descriptor::mn_major_sw128(v_s + mh as u32 * block + 2048 * kk, block);
                        let kb = Descriptor::mn_major_sw128(k_state + 2048 * kk, block);
                        st_mma(half, va, kb);
                    }
                }
            }
            // SAFETY: whole warpgroup, uniform.
            unsafe {
                wgmma::commit_group();
                wgmma::wait_group::<1>();
            }
            for half in st.iter_mut() {
                st_fence(half);
            }
            // SAFETY: barrier B (the warpgroup's 128 threads, uniformly).
            unsafe { sync::named_sync(local, WARPGROUP_SIZE) };
            if ctid == 0 && i >= 1 && i - 1 + PP_STATE_STAGES < n {
                load(i - 1 + PP_STATE_STAGES);
            }
        }
        // SAFETY: whole warpgroup, uniform.
        unsafe { wgmma::wait_group::<0>() };
        for half in st.iter_mut() {
            st_fence(half);
        }
    }

    // Warpgroup 1's state (thread-major: word `(mh SR + r) 128 + ctid`) and its total `C_1`
    // (`[DK]` f32 after the state) in its own region.
    let xchg = base + cfg.state_region_bytes();
    let xchg_c = xchg + (MH * SR) as u32 * WARPGROUP_SIZE * 4;
    let group = ctid / PS;
    let last_lane = ctid % PS == PS - 1;
    if wg == 1 {
        for (mh, half) in st.iter().enumerate() {
            for (r, x) in half.iter().enumerate() {
                let at = xchg + (((mh * SR + r) as u32) * WARPGROUP_SIZE + ctid) * 4;
                // SAFETY: inside warpgroup 1's region (its state fits: `DK DV 4` bytes plus
                // `4 DK` <= the region, asserted by the host's layout), no load or `wgmma`
                // in flight there; one writer per word; read after the block barrier.
                unsafe { f32::store(at, *x) };
            }
        }
        if last_lane {
            // SAFETY: channels 8 group .. + 8 of the total; one writer (the group's last lane).
            unsafe { store_f32::<8>(xchg_c + 32 * group, &carry) };
        }
    }
    // SAFETY: every thread of the block, once.
    unsafe { sync::sync_threads() };
    if wg == 1 {
        return;
    }
    let (lane, warp) = (index::lane_id(), ctid / 32);
    let (g, t) = (lane / 4, lane % 4);
    let heads = p.base.heads as u64;
    let slot_head = (it.slot as u64 * heads + it.head as u64) as usize;
    let out = p.base.delta.wrapping_add(slot_head * (DK * DV) as usize);
    for (mh, half) in st.iter().enumerate() {
        for j in 0..SR / 4 {
            // SAFETY: C_1 of channels 8 j + 2 t, +1, published by the block barrier.
            let c1 = unsafe { u64::load(xchg_c + 4 * (8 * j as u32 + 2 * t)) };
            let f = [
                math::exp2(f32::from_bits(c1 as u32)),
                math::exp2(f32::from_bits((c1 >> 32) as u32)),
            ];
            for e in 0..4u32 {
                let r = 4 * j + e as usize;
                // SAFETY: warpgroup 1's word of this element, published by the block barrier.
                let later = unsafe {
                    f32::load(xchg + (((mh * SR + r) as u32) * WARPGROUP_SIZE + ctid) * 4)
                };
                // Element (j, e) of half mh of S^T: S[8 j + 2 t + e % 2][dv].
                let dk = 8 * j as u32 + 2 * t + e % 2;
                let dv = 64 * mh as u32 + 16 * warp + g + 8 * (e / 2);
                // SAFETY: this segment's delta slice (DK * DV elements); one writer per
                // element.
                unsafe {
                    *out.add((dk * DV + dv) as usize) = half[r] * f[e as usize % 2] + later;
                }
            }
        }
    }
    if last_lane {
        // SAFETY: C_1 of channels 8 group .., published by the block barrier.
        let c1 = unsafe {
            [
                <[u32; 4]>::load(xchg_c + 32 * group),
                <[u32; 4]>::load(xchg_c + 32 * group + 16),
            ]
        };
        let mut total = [0.0f32; 8];
        for c in 0..8 {
            total[c] = carry[c] + f32::from_bits(c1[c / 4][c % 4]);
        }
        let dst = p
            .base
            .decay_log2
            .wrapping_add(slot_head * DK as usize + 8 * group as usize);
        // SAFETY: channels 8 group .. + 8 <= DK of this segment's decay row, 32-byte aligned
        // (a multiple of 8 floats into a 16-byte aligned buffer); one writer.
        unsafe {
            let dst = dst as *mut [f32; 4];
            *dst = [total[0], total[1], total[2], total[3]];
            *dst.add(1) = [total[4], total[5], total[6], total[7]];
        }
    }
}

/// The body of a pingpong kernel for one head-dimension pair.
macro_rules! pp_body {
    ($p:expr, $tmaps:expr, $dk:literal, $dv:literal, $st_mma:ident, $st_fence:ident) => {{
        const CFG: PingpongConfig = pingpong_config_of($dk, $dv);
        // Element-wise mapping: channels per thread (16-byte pieces where the registers
        // allow), lanes per (chunk, channel group).
        const CPT: u32 = if $dk == 64 { 8 } else { 4 };
        const PE: u32 = if ($dk / CPT) * (CFG.step / CHUNK) >= 32 {
            4
        } else {
            WARPGROUP_SIZE / (($dk / CPT) * (CFG.step / CHUNK))
        };
        walk::<
            $dk,
            { CFG.dv },
            $dv,
            { CFG.dv_parts },
            { CFG.step },
            { CFG.stages },
            { CPT as usize },
            PE,
            { (CHUNK / PE) as usize },
            { $dk / 16 },
            { $dk / 2 },
            { (CFG.dv / 64) as usize },
            { CFG.step / CHUNK },
            { CFG.consumers },
            { CFG.consumer_regs() },
        >(
            &$p,
            &CFG,
            $tmaps,
            |acc, a, b| wgmma::$st_mma::<1, 1, true>(acc, a, b),
            wgmma::$st_fence,
        );
    }};
}

/// The body of a pingpong state pass for one head-dimension pair.
macro_rules! pp_states_body {
    ($p:expr, $tmaps:expr, $dk:literal, $dv:literal, $st_mma:ident, $st_fence:ident) => {{
        const CFG: PingpongConfig = pingpong_config_of($dk, $dv);
        // Lanes per group of 8 channels in the element-wise phase.
        const PS: u32 = WARPGROUP_SIZE / ($dk / 8);
        states_walk::<
            $dk,
            $dv,
            { CFG.step },
            PS,
            { (CFG.step / PS) as usize },
            { $dk / 2 },
            { ($dv / 64) as usize },
            { CFG.step / CHUNK },
        >(
            &$p,
            &CFG,
            $tmaps,
            |acc, a, b| wgmma::$st_mma::<1, 1, true>(acc, a, b),
            wgmma::$st_fence,
        );
    }};
}

macro_rules! gla_pp_kernels {
    ($( $fwd:ident, $states:ident, $dk:literal, $dv:literal, $st_mma:ident, $st_fence:ident; )*) => {
        $(
            /// The pingpong `gla_fwd` for this pair of head dimensions; see the module
            /// documentation.
            ///
            /// # Safety
            /// Grid `ceil(items / consumers)`, the configuration's threads and
            /// shared memory, parameters satisfying [`GlaPingpongParams`]'s contract (validated
            /// by the host); for segments that are not first, `delta` and `decay_log2` written
            /// by the state pass (launched just before; see "Launch order" in the module
            /// documentation).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $fwd(p: GlaPingpongParams) {
                crate::launch_bounds!($fwd, pingpong_config_of($dk, $dv).threads(), 1);
                let tmaps = [
                    tensor_map_ptr!($fwd, 0, GlaPingpongParams, tmap_q),
                    tensor_map_ptr!($fwd, 0, GlaPingpongParams, tmap_k),
                    tensor_map_ptr!($fwd, 0, GlaPingpongParams, tmap_g),
                    tensor_map_ptr!($fwd, 0, GlaPingpongParams, tmap_v),
                ];
                // SAFETY: forwarded to the caller; the closures are this pair's wgmma shapes,
                // called by whole warpgroups in uniform control flow.
                unsafe { pp_body!(p, tmaps, $dk, $dv, $st_mma, $st_fence) }
            }

            /// The pingpong `gla_states` for this pair of head dimensions; see the module
            /// documentation.
            ///
            /// # Safety
            /// Grid `segments * heads` (blocks of `PP_STATE_THREADS`), `state_smem_bytes` of
            /// shared memory, parameters as for the `gla_fwd_pp` kernel of the pair;
            /// `delta` and `decay_log2` hold a slice per (segment, head).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $states(p: GlaPingpongParams) {
                crate::launch_bounds!($states, PP_STATE_THREADS, 1);
                let tmaps = [
                    tensor_map_ptr!($states, 0, GlaPingpongParams, tmap_q),
                    tensor_map_ptr!($states, 0, GlaPingpongParams, tmap_k),
                    tensor_map_ptr!($states, 0, GlaPingpongParams, tmap_g),
                    tensor_map_ptr!($states, 0, GlaPingpongParams, tmap_v),
                ];
                // SAFETY: as for the `gla_fwd_pp` kernel.
                unsafe { pp_states_body!(p, tmaps, $dk, $dv, $st_mma, $st_fence) }
            }
        )*
    };
}

gla_pp_kernels! {
    gla_fwd_pp_dk64_dv64, gla_states_pp_dk64_dv64, 64, 64, m64n64k16_bf16_ss, fence_operands_32;
    gla_fwd_pp_dk64_dv128, gla_states_pp_dk64_dv128, 64, 128, m64n64k16_bf16_ss, fence_operands_32;
    gla_fwd_pp_dk128_dv64, gla_states_pp_dk128_dv64, 128, 64, m64n128k16_bf16_ss, fence_operands_64;
    gla_fwd_pp_dk128_dv128, gla_states_pp_dk128_dv128, 128, 128, m64n128k16_bf16_ss, fence_operands_64;
}
