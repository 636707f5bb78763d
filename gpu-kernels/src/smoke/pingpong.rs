//! `smoke_pingpong`: a producer warpgroup streams tiles with TMA into a 3-stage shared-memory
//! ring guarded by mbarriers; two consumer warpgroups take alternate tiles, and a pair of named
//! barriers makes them enter an ordered section strictly in turn. Built so it cannot deadlock:
//! nothing spins on flags in plain memory; every wait is an mbarrier phase or a hardware named
//! barrier, with counts matched below.
//!
//! # Parameters
//! [`PingpongParams`]: input tensor map (`[num_tiles * 64, 64]` bf16, box 64x64, no swizzle),
//! `out [num_tiles * 4096]` f32, `order [num_tiles]` u32, `counter` (one u32, zero), `num_tiles`.
//!
//! # Thread mapping
//! 384 threads. Warpgroup 0 produces (thread 0 issues, the rest idle after `setmaxnreg.dec`);
//! warpgroup `1 + c` (c = 0, 1) consumes tiles `t = c, c + 2, ...`: in the ordered section its
//! thread 0 takes a ticket `order[t] = atomicAdd(counter, 1)`; then each of its 128 threads
//! writes `out[t * 4096 + i] = 2 x_i + t` for `i = tid, tid + 128, ...`.
//!
//! # Barrier protocol
//! Ring (stage `s = t % 3`, phase parity `(t / 3) % 2`, see `RingPos`):
//! - `full[s]`: init count 1. The producer waits until `empty[s]` completed the previous use,
//!   then `arrive_expect_tx(tile bytes)` and issues the TMA load on `full[s]`; the phase completes
//!   when the bytes land. The consumer of tile `t` waits on `full[s]` with the tile's parity.
//! - `empty[s]`: init count 128. Each of the 128 threads of the tile's consumer arrives after its
//!   last read of the stage. The producer waits with parity `phase ^ 1` (so the first pass over
//!   the ring does not wait: see `arch::mbarrier`).
//!
//! Ordered section (named barriers `ORDER + c`, 256 threads each: 128 syncing + 128 arriving):
//! - Consumer `c` enters with `named_sync(ORDER + c)` and leaves with
//!   `named_arrive(ORDER + (1 - c))`, only if a tile `t + 1` exists (its other consumer will
//!   sync once for it).
//! - Consumer 1 pre-arrives once on `ORDER + 0` (if tile 0 exists), which admits consumer 0 to
//!   tile 0.
//!
//! Count check: consumer `c` syncs once per tile `t` it owns; the matching arrival is the other
//! consumer's leave after tile `t - 1` (or the pre-arrival for `t = 0`), which happens exactly
//! when tile `t` exists. So every phase gets 256 threads and none is left half-arrived.
//!
//! Start: thread 0 initializes all barriers, `fence.mbarrier_init`, `sync_threads`. End: all
//! threads `sync_threads`, thread 0 invalidates the barriers.

use crate::arch::mbarrier::{Mbarrier, RingPos};
use crate::arch::{atomic, convert, fence, index, regs, smem, sync};
use crate::tensor_map_ptr;
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::smoke::{
    PINGPONG_CONSUMER_REGS, PINGPONG_ORDER_BARRIER, PINGPONG_PRODUCER_REGS,
    PINGPONG_SMEM_BARS_OFFSET, PINGPONG_STAGES, PINGPONG_TILE_BYTES, PINGPONG_TILE_ELEMS,
    PINGPONG_TILE_ROWS, PingpongParams,
};

type Pos = RingPos<PINGPONG_STAGES>;

/// Threads taking part in one phase of an ordering barrier: one consumer warpgroup syncing,
/// the other arriving.
const ORDER_THREADS: u32 = 2 * WARPGROUP_SIZE;

/// See the module documentation.
///
/// # Safety
/// One block of `PINGPONG_THREADS` threads, `pingpong_smem_bytes()` of dynamic shared memory,
/// a valid tensor map over `num_tiles * 64` rows, outputs sized as documented, `*counter == 0`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_pingpong(p: PingpongParams) {
    crate::launch_bounds!(smoke_pingpong in kernel_abi::smoke::KERNELS);
    let tmap = tensor_map_ptr!(smoke_pingpong, 0, PingpongParams, tmap);
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let base = smem::aligned_base();
    let full = |s: u32| Mbarrier::at(base + PINGPONG_SMEM_BARS_OFFSET as u32 + 8 * s);
    let empty =
        |s: u32| Mbarrier::at(base + PINGPONG_SMEM_BARS_OFFSET as u32 + 8 * (PINGPONG_STAGES + s));
    let stage_addr = |s: u32| base + s * PINGPONG_TILE_BYTES;
    let num_tiles = p.num_tiles;

    if tid == 0 {
        tmap.prefetch();
        for s in 0..PINGPONG_STAGES {
            // SAFETY: single initializer, before any use (published below).
            unsafe {
                full(s).init(1);
                empty(s).init(WARPGROUP_SIZE);
            }
        }
        fence::fence_mbarrier_init();
    }
    // SAFETY: all 384 threads reach this barrier once.
    unsafe { sync::sync_threads() };

    if wg == 0 {
        // SAFETY: the whole producer warpgroup executes this, uniformly.
        unsafe { regs::decrease::<PINGPONG_PRODUCER_REGS>() };
        if tid == 0 {
            let mut pos = Pos::of(0);
            for t in 0..num_tiles {
                // SAFETY: ring protocol (module docs): the stage is free once `empty` completed
                // its previous phase; `full` then expects exactly one tile's bytes, and the
                // destination stage is not read until that phase completes.
                unsafe {
                    empty(pos.stage).wait_parity(pos.phase ^ 1);
                    full(pos.stage).arrive_expect_tx(PINGPONG_TILE_BYTES);
                    tmap.load_2d(
                        stage_addr(pos.stage),
                        0,
                        (t * PINGPONG_TILE_ROWS) as i32,
                        full(pos.stage),
                    );
                }
                pos = pos.next();
            }
        }
    } else {
        // SAFETY: the whole consumer warpgroup executes this, uniformly.
        unsafe { regs::increase::<PINGPONG_CONSUMER_REGS>() };
        let c = wg - 1;
        let ctid = tid % WARPGROUP_SIZE;
        let my_barrier = PINGPONG_ORDER_BARRIER + c;
        let other_barrier = PINGPONG_ORDER_BARRIER + (1 - c);
        if c == 1 && num_tiles > 0 {
            // SAFETY: the pre-arrival that admits consumer 0 to tile 0 (count check in docs).
            unsafe { sync::named_arrive(other_barrier, ORDER_THREADS) };
        }
        let mut t = c;
        while t < num_tiles {
            let pos = Pos::of(t);
            // SAFETY: the producer issues tile t, so this phase completes.
            unsafe { full(pos.stage).wait_parity(pos.phase) };

            // Ordered section.
            // SAFETY: matched by the other consumer's arrival (count check in docs).
            unsafe { sync::named_sync(my_barrier, ORDER_THREADS) };
            if ctid == 0 {
                // SAFETY: `counter` and `order[t]` (t < num_tiles) are valid (launch contract).
                unsafe { *p.order.add(t as usize) = atomic::add_u32(p.counter, 1) };
            }
            if t + 1 < num_tiles {
                // SAFETY: the other consumer owns tile t + 1 and syncs once for it.
                unsafe { sync::named_arrive(other_barrier, ORDER_THREADS) };
            }

            let tile = smem::SmemArray::<u16>::new(stage_addr(pos.stage), PINGPONG_TILE_ELEMS);
            let out = p.out.wrapping_add((t * PINGPONG_TILE_ELEMS) as usize);
            let mut i = ctid;
            while i < PINGPONG_TILE_ELEMS {
                // SAFETY: i < tile length; the tile was published by the completed `full`
                // phase; out[t * 4096 + i] is inside `out` (t < num_tiles).
                unsafe {
                    *out.add(i as usize) = 2.0 * convert::bf16_to_f32(tile.load(i)) + t as f32
                };
                i += WARPGROUP_SIZE;
            }
            // SAFETY: this thread's last read of the stage is above; 128 arrivals per phase.
            unsafe { empty(pos.stage).arrive() };
            t += 2;
        }
    }

    // SAFETY: all 384 threads reach this barrier once.
    unsafe { sync::sync_threads() };
    if tid == 0 {
        for s in 0..PINGPONG_STAGES {
            // SAFETY: no thread or copy uses the barriers after the barrier above (every issued
            // load was waited for by its consumer).
            unsafe {
                full(s).inval();
                empty(s).inval();
            }
        }
    }
}
