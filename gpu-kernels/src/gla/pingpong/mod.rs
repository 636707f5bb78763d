//! `gla_fwd_pp_dk{DK}_dv{DV}` and `gla_states_pp_dk{DK}_dv{DV}`: the GLA forward pass (and its
//! segment-state pass) on Hopper (sm_90a), warp-specialized: TMA into mbarrier rings, `wgmma`
//! for the state products, consumer warpgroups taking turns (pingpong). Same segments, same
//! chunkwise math (chunks of 16 tokens, halves of 8 with their midpoints as reference points,
//! see `gla::chunk`), same outputs as the baseline kernels. The state pass is its own
//! kernel (see `states.rs`: every factor relative to the segment's end, so a segment's
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
//!    accesses, so a warp's stores cover whole rows): the formulas of `gla::chunk` (cumulative
//!    log-decays, a shuffle scan over the run's lanes), writing the operand tiles `q_inter`,
//!    `k_state` (swizzled, for `wgmma`), `q_diag`, `k_half0`, `k_half1` (padded, for
//!    `ldmatrix`) and the decay rows. Rows past the segment's end (TMA loaded the next
//!    sequence's tokens there) count as zero: q, k, g are masked on load and the v rows are
//!    zeroed in the stage;
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
//! instead of 4. (The alternative, an owner per step, `i % 2`, computing the whole step while
//! the other consumer runs its GEMM phases, was measured slower: bench/NOTES.md.)
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
//!
//! # Files
//! `forward.rs` (the forward walk: role split, producer, consumers' steps), `states.rs` (the
//! state pass, with its own barrier protocol), `elementwise.rs` (the vectorized element-wise
//! phases of both), `turns.rs` (the turn order of the GEMM phases), `tiles.rs` (swizzled tile
//! addressing and vector shared-memory accesses).

mod elementwise;
mod forward;
mod states;
mod tiles;
mod turns;

use crate::arch::{index, wgmma};
use crate::tensor_map_ptr;
use forward::walk;
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gla::{
    CHUNK, GlaPingpongParams, PingpongConfig, SEG_LAST, Segment, pingpong_config_of,
};
use states::states_walk;

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
                crate::launch_bounds!($fwd in kernel_abi::gla::KERNELS);
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
                crate::launch_bounds!($states in kernel_abi::gla::KERNELS);
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
