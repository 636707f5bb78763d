//! `gla_fwd_pp_dk{DK}_dv{DV}` and `gla_states_pp_dk{DK}_dv{DV}`: the GLA forward pass (and its
//! segment-state pass) on Hopper (sm_90a), warp-specialized: TMA into an mbarrier ring, `wgmma`
//! for the state products, two consumer warpgroups in pingpong. Same segments, same chunkwise
//! math (chunks of 16 tokens, halves of 8 with their midpoints as reference points, see the
//! parent module), same outputs as the baseline kernels; `gla_combine` is shared.
//!
//! # Parameters
//! [`GlaPingpongParams`]: 3-D tensor maps of q, k, g, v (dims `[d, heads, rows]`, box
//! `[64, 1, step]`, 128-byte swizzle) and the baseline's [`GlaParams`] for the rest.
//!
//! # Work and thread mapping
//! 384 threads. Block `x` owns items `2x` and `2x + 1` (item `i`: segment `i / heads`, head
//! `i % heads`), one per consumer warpgroup. Warpgroup 0 produces: it drops to
//! `PP_PRODUCER_REGS` registers and its thread 0 issues the TMA loads of both consumers' steps
//! (`step` tokens of q, k, g, v) into their own `stages`-deep rings, in the order the consumers
//! use them (step `i` of consumer 0, then of consumer 1, then step `i + 1`). Warpgroups 1 and 2
//! consume (`PP_CONSUMER_REGS` registers). Per step, consumer `c`:
//! 1. element-wise phase (all 128 threads, the parent module's `elementwise` on each chunk of
//!    the step, reading the swizzled TMA tiles): cumulative log-decays, the operand tiles
//!    `q_inter`, `k_state` (swizzled, for `wgmma`), `q_diag`, `k_half0`, `k_half1` (padded, for
//!    `ldmatrix`) and the decay rows. Rows past the segment's end (TMA loaded the next
//!    sequence's tokens there) count as zero: q, k, g are masked on load and the v rows are
//!    zeroed in the stage;
//! 2. intra-chunk scores (warp `w` takes chunks `w, w + 4, ..`): `mma.sync` of `q_diag` with
//!    `k_half0` / `k_half1`, masked as in the baseline, stored as the bf16 tile `P[t][s]`;
//! 3. GEMM phase, in turn with the other consumer: per chunk, with `S^T` (`[dv, dk]` f32, the
//!    `wgmma` accumulator, `dv / 64` m64 halves) and `o^T` (`[dv, 16]`) in registers:
//!    `o^T = S^T q_inter^T` (A = `S^T` packed to bf16 from its own accumulators),
//!    `o^T += v^T P^T`, then `S^T = decay S^T + v^T k_state` (A = v, MN-major, from the stage);
//!    one batch per m64 half of `S^T`, each waited for at once (the next chunk needs the
//!    state: it is a chain; a uniform wait keeps ptxas from serializing the batch), then the
//!    chunk's `o^T` is stored.
//!
//! While one consumer runs its chain of `wgmma`s, the other runs its element-wise phase and
//! scores: the tensor cores and the ALUs work on the two items at once.
//!
//! # Barrier protocol
//! - Start: thread 0 initializes `full[c][s]` and `empty[c][s]` (count 1 each),
//!   `fence.mbarrier_init`, then `sync_threads` publishes them. No block barrier follows.
//! - Ring, per consumer `c` (its step `i` at stage `i % stages`, parity `(i / stages) % 2`):
//!   the producer waits on `empty[c][s]` with the parity of the previous use (`^ 1`: the first
//!   pass does not wait), arrives on `full[c][s]` expecting the boxes' bytes and issues the
//!   loads; the consumer waits on `full[c][s]` before its first read of the stage.
//! - Consumer-local barrier `PP_LOCAL_BARRIER + c` (128 threads), per step: (L1) after the
//!   element-wise phase (its generic writes, each writer's `fence.proxy.async` first, so the
//!   `wgmma`s see them), (L2) after the scores (same), (L3) after the GEMM phase's last
//!   `wgmma.wait_group 0`: every product reading the stage and the operand tiles is complete
//!   and every thread's element-wise reads of the stage are done, so thread 0 of the consumer
//!   then arrives on `empty[c][s]`, and the next step may rewrite the operand tiles.
//! - Turns (named barriers `PP_ORDER_BARRIER + c`, 256 threads: consumer `c` syncs, the other
//!   arrives). With `n_c` steps for consumer `c`, consumer 0 syncs before the GEMM phase of
//!   step `j` iff `1 <= j <= n_1` and arrives on the other's barrier after issuing it iff
//!   `j < n_1`; consumer 1 syncs iff `j < n_0` and arrives iff `j + 1 < n_0`. Every sync is
//!   matched by exactly one arrival of the other consumer's previous GEMM phase (consumer 0's
//!   step `j` by consumer 1's step `j - 1`, consumer 1's step `j` by consumer 0's step `j`), so
//!   they alternate strictly while both have steps and run freely after; a consumer without
//!   an item exits at once and the other never waits for it.
//! - Deadlock freedom: the producer issues in the order the alternation consumes (both
//!   consumers' step `i` before either's step `i + 1`), so every wait it does is on a stage
//!   whose consumer can finish it with stages already issued.
//! - Registers: the `S^T` bf16 fragments read by an in-flight `wgmma` are rebuilt only after
//!   its `wait_group`; accumulators are pinned around every wait (`fence_operands`), and a
//!   `wgmma.fence` precedes every batch (the decay scaling writes `S^T` with ordinary
//!   instructions).

use super::{ChunkTiles, Raw, Var, elementwise, intra_scores};
use crate::arch::mbarrier::{Mbarrier, RingPos};
use crate::arch::smem::SmemValue;
use crate::arch::tma::TensorMapPtr;
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{convert, fence, index, regs, smem, sync};
use crate::tensor_map_ptr;
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gla::{
    CHUNK, GlaConfig, GlaPingpongParams, PP_ATOM, PP_CONSUMER_REGS, PP_CONSUMERS, PP_LOCAL_BARRIER,
    PP_ORDER_BARRIER, PP_PRODUCER_REGS, PP_THREADS, PingpongConfig, SEG_FIRST, SEG_LAST, Segment,
    config_of, pingpong_config_of,
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
    steps: u32,
}

/// Item of consumer `c` of this block (`steps == 0`: none, or nothing to do).
#[inline(always)]
fn item<const STEP: u32, const OUT: bool>(p: &GlaPingpongParams, c: u32) -> Item {
    let i = PP_CONSUMERS * index::block_idx_x() + c;
    let none = Item {
        seg: Segment::default(),
        slot: 0,
        head: 0,
        steps: 0,
    };
    if i >= p.items {
        return none;
    }
    let heads = p.base.heads;
    let slot = i / heads;
    // SAFETY: i < items = segments * heads, so slot < segments, inside the table.
    let seg: Segment = unsafe { *p.base.segments.add(slot as usize) };
    if !OUT && seg.flags & SEG_LAST != 0 {
        return none;
    }
    Item {
        seg,
        slot,
        head: i % heads,
        steps: seg.len.div_ceil(STEP),
    }
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
    let words = [
        (g, 2 * t, pa[0]),
        (g + 8, 2 * t, pa[1]),
        (g, 8 + 2 * t, pa[2]),
        (g + 8, 8 + 2 * t, pa[3]),
    ];
    for (row, s, w) in words {
        // SAFETY: row < 16, column 16 cc + s + 1 < 64 of the score tile; 4-byte aligned; one
        // writer per element (this warp, this lane).
        unsafe { u32::store(swizzled(p_tile, 0, row, 32 * cc + 2 * s), w) };
    }
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
    const STEP: u32,
    const STAGES: u32,
    const P: u32,
    const TPT: usize,
    const NKK: usize,
    const SR: usize,
    const MH: usize,
    const NCH: u32,
    const OUT: bool,
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
                && NKK as u32 * 16 == DK
                && NCH * CHUNK == STEP
                && NCH <= 4
                && P * (DK / 2) == WARPGROUP_SIZE
        )
    };
    let [tmap_q, tmap_k, tmap_g, tmap_v] = tmaps;
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let base = smem::aligned_base();
    let bars = base + cfg.barriers_offset();
    let full = |c: u32, s: u32| Mbarrier::at(bars + 8 * (c * STAGES + s));
    let empty = |c: u32, s: u32| Mbarrier::at(bars + 8 * ((PP_CONSUMERS + c) * STAGES + s));
    let region = |c: u32| base + c * cfg.consumer_bytes();
    let block = cfg.block_bytes();
    let (item0, item1) = (item::<STEP, OUT>(p, 0), item::<STEP, OUT>(p, 1));

    if tid == 0 {
        for t in tmaps {
            t.prefetch();
        }
        // SAFETY: single initializer before any use; published by the barrier below.
        unsafe {
            for c in 0..PP_CONSUMERS {
                for s in 0..STAGES {
                    full(c, s).init(1);
                    empty(c, s).init(1);
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
            // Both consumers' steps `i` advance together, so one ring position serves both.
            let mut pos = RingPos::<STAGES>::of(0);
            for i in 0..item0.steps.max(item1.steps) {
                for c in 0..PP_CONSUMERS {
                    let it = if c == 0 { item0 } else { item1 };
                    if i >= it.steps {
                        continue;
                    }
                    let s = pos.stage;
                    let r = region(c);
                    let (x, y, z) = (0i32, it.head as i32, (it.seg.start + i * STEP) as i32);
                    // SAFETY: ring protocol (module docs): the stage is free once `empty`
                    // completed its previous phase; `full` expects exactly the boxes' bytes;
                    // the destinations are 1024-aligned column blocks of this consumer's
                    // stage, untouched until the phase completes.
                    unsafe {
                        empty(c, s).wait_parity(pos.phase ^ 1);
                        let bar = full(c, s);
                        bar.arrive_expect_tx(cfg.load_bytes(OUT));
                        for cb in 0..DK / PP_ATOM {
                            let xo = x + (cb * PP_ATOM) as i32;
                            if OUT {
                                tmap_q.load_3d(r + cfg.q_offset(s) + cb * block, xo, y, z, bar);
                            }
                            tmap_k.load_3d(r + cfg.k_offset(s) + cb * block, xo, y, z, bar);
                            tmap_g.load_3d(r + cfg.g_offset(s) + cb * block, xo, y, z, bar);
                        }
                        for cb in 0..DV / PP_ATOM {
                            let xo = x + (cb * PP_ATOM) as i32;
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
    unsafe { regs::increase::<PP_CONSUMER_REGS>() };
    let c = wg - 1;
    let (it, other_steps) = if c == 0 {
        (item0, item1.steps)
    } else {
        (item1, item0.steps)
    };
    if it.steps == 0 {
        return;
    }
    let ctid = tid - wg * WARPGROUP_SIZE;
    let warp = ctid / 32;
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let r = region(c);
    let q_inter = r + cfg.q_inter_offset();
    let k_state = r + cfg.k_state_offset();
    let p_tile = r + cfg.p_offset();
    let q_diag = r + cfg.q_diag_offset();
    let k_half0 = r + cfg.k_half0_offset();
    let k_half1 = r + cfg.k_half1_offset();
    let decay = r + cfg.decay_offset();
    let heads = p.base.heads as u64;
    let state_len = (DK * DV) as usize;
    let seg = it.seg;
    let pair_head = (seg.seq as u64 * heads + it.head as u64) as usize * state_len;
    let slot_head = (it.slot as u64 * heads + it.head as u64) as usize;
    // Element (j, e) of half mh of S^T: S[8 j + 2 t + e % 2][64 mh + 16 warp + g + 8 (e / 2)].
    let state_index = |mh: usize, j: usize, e: usize| {
        let dk = 8 * j as u32 + 2 * t + (e as u32 % 2);
        let dv = 64 * mh as u32 + 16 * warp + g + 8 * (e as u32 / 2);
        (dk * DV + dv) as usize
    };

    let mut st = [[0.0f32; SR]; MH];
    let init: *const f32 = if !OUT {
        core::ptr::null()
    } else if seg.flags & SEG_FIRST != 0 {
        if p.base.has_init != 0 {
            p.base.init_state.wrapping_add(pair_head)
        } else {
            core::ptr::null()
        }
    } else {
        p.base.seg_init.wrapping_add(slot_head * state_len)
    };
    if !init.is_null() {
        for (mh, half) in st.iter_mut().enumerate() {
            for j in 0..SR / 4 {
                for e in 0..4 {
                    // SAFETY: the state slice of (seq, head) or (slot, head) has DK * DV
                    // elements (host-checked sizes); state_index < DK * DV.
                    half[4 * j + e] = unsafe { *init.add(state_index(mh, j, e)) };
                }
            }
        }
    }

    let mut o = [[0.0f32; 8]; MH];
    let mut total = [0.0f32; 2];
    let row_stride = (heads * DV as u64) as usize;
    // Store o^T of chunk `cc` of step `step` (valid rows only), scaled, as bf16. The values are
    // converted and pinned before any branch: a read of `wgmma` accumulators on a divergent
    // path makes ptxas serialize the products.
    let store_o = |o: &[[f32; 8]; MH], step: u32, cc: u32, valid: u32| {
        let row0 = seg.start as u64 + (step * STEP + cc * CHUNK) as u64;
        let dst = p
            .base
            .o
            .wrapping_add(((row0 * heads + it.head as u64) * DV as u64) as usize);
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
        let (q_s, k_s, g_s, v_s) = (
            r + cfg.q_offset(s),
            r + cfg.k_offset(s),
            r + cfg.g_offset(s),
            r + cfg.v_offset(s),
        );
        // SAFETY: the producer issues every step of this item, so the phase completes.
        unsafe { full(c, s).wait_parity(pos.phase) };

        // 1. Element-wise phase; rows past the segment's end are zero.
        if valid < STEP {
            let row_words = 8u32; // 16-byte words per 128-byte row
            let words = (STEP - valid) * row_words * (DV / PP_ATOM);
            let mut w = ctid;
            while w < words {
                let (cb, rest) = (
                    w / ((STEP - valid) * row_words),
                    w % ((STEP - valid) * row_words),
                );
                let row = valid + rest / row_words;
                let at = v_s + cb * block + row * 128 + (rest % row_words) * 16;
                // SAFETY: a row >= valid of this consumer's stage (full phase completed, the
                // stage is released only after barrier L3); 16-byte aligned; one writer.
                unsafe { <[u32; 4]>::store(at, [0; 4]) };
                w += WARPGROUP_SIZE;
            }
        }
        for cc in 0..NCH {
            if cc < nchunks {
                let tiles = PingpongChunk::<DK> {
                    q: q_s,
                    k: k_s,
                    g: g_s,
                    q_inter,
                    k_state,
                    q_diag,
                    k_half0,
                    k_half1,
                    decay: decay + cc * DK * 4,
                    r0: cc * CHUNK,
                    block,
                };
                // SAFETY: the consumer's 128 threads (uniform: nchunks is uniform); the stage
                // was published by its full phase; the operand tiles are not read before L1.
                let b15 = unsafe {
                    elementwise::<DK, P, TPT, OUT, true>(ctid, &tiles, valid - cc * CHUNK)
                };
                total[0] += b15[0];
                total[1] += b15[1];
            }
        }
        fence::fence_proxy_async_shared();
        // SAFETY: barrier L1 of the protocol (the consumer's 128 threads, uniformly).
        unsafe { sync::named_sync(PP_LOCAL_BARRIER + c, WARPGROUP_SIZE) };

        // 2. Intra-chunk scores.
        if OUT {
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
        let (sync_turn, arrive_turn) = if c == 0 {
            (step >= 1 && step <= other_steps, step < other_steps)
        } else {
            (step < other_steps, step + 1 < other_steps)
        };
        if sync_turn {
            // SAFETY: turn protocol (module docs): matched by one arrival of the other
            // consumer.
            unsafe { sync::named_sync(PP_ORDER_BARRIER + c, ORDER_THREADS) };
        }
        for cc in 0..nchunks {
            let drow = decay + cc * DK * 4;
            // One batch per m64 half of S^T (its fragments are the only ones live: with
            // DK = DV = 128 both halves' would not fit in the registers beside S^T).
            for mh in 0..MH {
                // S^T (before this chunk's update) as bf16 A fragments, read by the in-flight
                // `o^T = S^T q_inter^T`: pinned after its wait so their registers are not
                // reused before.
                let mut frag = [[0u32; 4]; NKK];
                if OUT {
                    for (kk, f) in frag.iter_mut().enumerate() {
                        let a = &st[mh][8 * kk..8 * kk + 8];
                        *f = [
                            convert::pack_bf16x2(a[0], a[1]),
                            convert::pack_bf16x2(a[2], a[3]),
                            convert::pack_bf16x2(a[4], a[5]),
                            convert::pack_bf16x2(a[6], a[7]),
                        ];
                    }
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
                if OUT {
                    wgmma::fence_operands_8(&mut o[mh]);
                    for f in frag.iter_mut() {
                        wgmma::pin_fragment(f);
                    }
                }
                // SAFETY: whole warpgroup, uniform; the operand tiles were published by L1/L2
                // (with the proxy fence) and the stage by its full phase; none is rewritten
                // before L3 of this step.
                unsafe {
                    wgmma::fence();
                    let va = Descriptor::mn_major_sw128(v_s + mh as u32 * block + 2048 * cc, block);
                    if OUT {
                        for (kk, f) in frag.iter().enumerate() {
                            let (cb, within) = (kk as u32 / 4, 32 * (kk as u32 % 4));
                            let b = Descriptor::k_major_sw128(
                                q_inter + cb * block + 2048 * cc + within,
                            );
                            if kk == 0 {
                                wgmma::m64n16k16_bf16_rs::<0, false>(&mut o[mh], *f, b);
                            } else {
                                wgmma::m64n16k16_bf16_rs::<0, true>(&mut o[mh], *f, b);
                            }
                        }
                        let pb = Descriptor::k_major_sw128(p_tile + 32 * cc);
                        wgmma::m64n16k16_bf16_ss::<1, 0, true>(&mut o[mh], va, pb);
                    }
                    let kb = Descriptor::mn_major_sw128(k_state + 2048 * cc, block);
                    st_mma(&mut st[mh], va, kb);
                    wgmma::commit_group();
                    // The next chunk needs this state: wait here (uniformly, so ptxas keeps
                    // the batch pipelined).
                    wgmma::wait_group::<0>();
                }
                for f in frag.iter_mut() {
                    wgmma::pin_fragment(f);
                }
                st_fence(&mut st[mh]);
                if OUT {
                    wgmma::fence_operands_8(&mut o[mh]);
                }
            }
            if OUT {
                store_o(&o, step, cc, valid);
            }
        }
        if arrive_turn {
            // SAFETY: turn protocol: the other consumer syncs once for this arrival.
            unsafe { sync::named_arrive(PP_ORDER_BARRIER + (1 - c), ORDER_THREADS) };
        }
        // SAFETY: barrier L3 of the protocol.
        unsafe { sync::named_sync(PP_LOCAL_BARRIER + c, WARPGROUP_SIZE) };
        if ctid == 0 {
            // SAFETY: every read of the stage by this consumer is complete (L3); one arrival
            // per phase.
            unsafe { empty(c, s).arrive() };
        }
        pos = pos.next();
    }

    let out: *mut f32 = if OUT {
        if seg.flags & SEG_LAST != 0 && p.base.has_final != 0 {
            p.base.final_state.wrapping_add(pair_head)
        } else {
            core::ptr::null_mut()
        }
    } else {
        p.base.delta.wrapping_add(slot_head * state_len)
    };
    if !out.is_null() {
        for (mh, half) in st.iter().enumerate() {
            for j in 0..SR / 4 {
                for e in 0..4 {
                    // SAFETY: this item's own state slice (final state of its sequence, or its
                    // segment's delta), DK * DV elements; state_index < DK * DV.
                    unsafe { *out.add(state_index(mh, j, e)) = half[4 * j + e] };
                }
            }
        }
    }
    if !OUT && ctid % P == P - 1 {
        let dst = p
            .base
            .decay_log2
            .wrapping_add(slot_head * DK as usize + 2 * (ctid / P) as usize);
        // SAFETY: channels 2 (ctid / P), +1 < DK of this segment's decay row; one writer.
        unsafe {
            *dst = total[0];
            *dst.add(1) = total[1];
        }
    }
}

/// The body of a pingpong kernel for one head-dimension pair.
macro_rules! pp_body {
    ($p:expr, $tmaps:expr, $dk:literal, $dv:literal, $out:literal, $st_mma:ident, $st_fence:ident) => {{
        const CFG: PingpongConfig = pingpong_config_of($dk, $dv);
        const BASE: GlaConfig = config_of($dk, $dv);
        const P: u32 = WARPGROUP_SIZE / ($dk / 2);
        walk::<
            $dk,
            $dv,
            { CFG.step },
            { CFG.stages },
            P,
            { (CHUNK / P) as usize },
            { $dk / 16 },
            { $dk / 2 },
            { $dv / 64 },
            { CFG.step / CHUNK },
            $out,
        >(
            &$p,
            &CFG,
            $tmaps,
            |acc, a, b| wgmma::$st_mma::<1, 1, true>(acc, a, b),
            wgmma::$st_fence,
        );
        let _ = BASE;
    }};
}

macro_rules! gla_pp_kernels {
    ($( $fwd:ident, $states:ident, $dk:literal, $dv:literal, $st_mma:ident, $st_fence:ident; )*) => {
        $(
            /// The pingpong `gla_fwd` for this pair of head dimensions; see the module
            /// documentation.
            ///
            /// # Safety
            /// Grid `ceil(items / PP_CONSUMERS)`, `PP_THREADS` threads, the configuration's
            /// shared memory, parameters satisfying [`GlaPingpongParams`]'s contract (validated
            /// by the host); for segments that are not first, `seg_init` written by
            /// `gla_combine`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $fwd(p: GlaPingpongParams) {
                crate::launch_bounds!($fwd, PP_THREADS, 1);
                let tmaps = [
                    tensor_map_ptr!($fwd, 0, GlaPingpongParams, tmap_q),
                    tensor_map_ptr!($fwd, 0, GlaPingpongParams, tmap_k),
                    tensor_map_ptr!($fwd, 0, GlaPingpongParams, tmap_g),
                    tensor_map_ptr!($fwd, 0, GlaPingpongParams, tmap_v),
                ];
                // SAFETY: forwarded to the caller; the closures are this pair's wgmma shapes,
                // called by whole warpgroups in uniform control flow.
                unsafe { pp_body!(p, tmaps, $dk, $dv, true, $st_mma, $st_fence) }
            }

            /// The pingpong `gla_states` for this pair of head dimensions; see the module
            /// documentation.
            ///
            /// # Safety
            /// As for the `gla_fwd_pp` kernel of the pair; `delta` and `decay_log2` hold a
            /// slice per (segment, head).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $states(p: GlaPingpongParams) {
                crate::launch_bounds!($states, PP_THREADS, 1);
                let tmaps = [
                    tensor_map_ptr!($states, 0, GlaPingpongParams, tmap_q),
                    tensor_map_ptr!($states, 0, GlaPingpongParams, tmap_k),
                    tensor_map_ptr!($states, 0, GlaPingpongParams, tmap_g),
                    tensor_map_ptr!($states, 0, GlaPingpongParams, tmap_v),
                ];
                // SAFETY: as for the `gla_fwd_pp` kernel.
                unsafe { pp_body!(p, tmaps, $dk, $dv, false, $st_mma, $st_fence) }
            }
        )*
    };
}

gla_pp_kernels! {
    gla_fwd_pp_dk64_dv64, gla_states_pp_dk64_dv64, 64, 64, m64n64k16_bf16_ss, fence_operands_32;
    gla_fwd_pp_dk64_dv128, gla_states_pp_dk64_dv128, 64, 128, m64n64k16_bf16_ss, fence_operands_32;
    gla_fwd_pp_dk128_dv64, gla_states_pp_dk128_dv64, 128, 64, m64n128k16_bf16_ss, fence_operands_64;
}
