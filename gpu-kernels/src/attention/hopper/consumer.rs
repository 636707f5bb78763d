//! The consumers of the Hopper kernel: warpgroups 1 and 2, each owning 64 query rows of every
//! tile. Per tile: S = Q K^T (`wgmma`, shared-memory operands), the online softmax on the
//! accumulators, O += P V (`wgmma`, P from registers), then the epilogue. Two main loops: one
//! step after the other, or (`OVERLAP`) the intra-warpgroup software pipeline. The barrier
//! protocol (rings, Q, pingpong turns) is in the module documentation of [`super`].
//!
//! Macros rather than functions, expanded in the kernel body: the producer and the epilogue
//! moved into `#[inline(always)]` functions already changed the kernels' PTX, and the
//! expansion is the kernel body's own code.
//!
//! The two main loops share a step's halves: [`s_step!`] (wait for K, S = Q K^T, wait, release
//! K) and [`pv_step!`] (wait for V, rescale O, O += P V, wait, release V), each with its
//! pingpong turn. One step after the other is `s_step!`, the softmax, `pv_step!`; the pipeline
//! uses `s_step!` for step 0 and `pv_step!` for the last P V, and in between issues S_i and
//! P_{i-1} V_{i-1} under one turn with `wait_group 1` between them, so its iteration calls the
//! batches ([`issue_s!`], [`issue_pv!`]) directly. One step after the other rescales O right
//! after the softmax, before packing P (`pv_step!` gets no factor): rescaling after V's wait
//! and the turn, as the pipeline's last P V does, changes those kernels' PTX.

/// One `wgmma` batch S = Q K^T of ring slot `$stage` into `$s` for consumer `$c`: the fence,
/// the products (K-major Q and K; 16-wide K slices through the column blocks), the commit.
/// `$s_zero` / `$s_mma` are the `wgmma` shapes, `$q_s` the Q tile, `$k_s` the K slots' closure.
/// Macros rather than closures: a closure called from several places may stay a function
/// call, and a call between `wgmma`s serializes them. Unsafe as the `wgmma` functions it calls:
/// the whole warpgroup, uniform control flow, Q and K published and not overwritten before the
/// `wait_group` that retires the batch.
macro_rules! issue_s {
    (
        $s_zero:ident, $s_mma:ident, $cfg:ident, $q_s:ident, $k_s:ident, $c:ident;
        $s:expr, $stage:expr
    ) => {
        $crate::arch::wgmma::fence();
        for kk in 0..DK as u32 {
            let (cb, within) = (kk / 4, 32 * (kk % 4));
            let a = $crate::arch::wgmma::Descriptor::k_major_sw128(
                $q_s + cb * $cfg.block_bytes(::kernel_abi::attention::HOPPER_BLOCK_M)
                    + $c * ::kernel_abi::attention::HOPPER_WG_ROWS * 128
                    + within,
            );
            let b = $crate::arch::wgmma::Descriptor::k_major_sw128(
                $k_s($stage) + cb * $cfg.block_bytes(BN) + within,
            );
            if kk == 0 {
                $s_zero($s, a, b);
            } else {
                $s_mma($s, a, b);
            }
        }
        $crate::arch::wgmma::commit_group();
    };
}
pub(super) use issue_s;

/// One `wgmma` batch O += P V of ring slot `$stage` (P from the registers `$pa`; V MN-major, or
/// with `FP8` the K-major `V^T`): the fence, the products with the `wgmma` shape `$o_mma`, the
/// commit; `$v_s` is the V slots' closure. Unsafe as [`issue_s!`], for V.
macro_rules! issue_pv {
    ($o_mma:ident, $cfg:ident, $v_s:ident; $o:expr, $pa:expr, $stage:expr) => {
        $crate::arch::wgmma::fence();
        for kk in 0..NK {
            let b = if FP8 {
                // V^T: D rows of the step's 128 keys, K-major; the k32 slice `kk` at `32 kk`
                // bytes of each row.
                $crate::arch::wgmma::Descriptor::k_major_sw128($v_s($stage) + 32 * kk as u32)
            } else {
                $crate::arch::wgmma::Descriptor::mn_major_sw128(
                    $v_s($stage) + 2048 * kk as u32,
                    $cfg.block_bytes(BN),
                )
            };
            $o_mma($o, $pa[kk], b);
        }
        $crate::arch::wgmma::commit_group();
    };
}
pub(super) use issue_pv;

/// The S half of a step, on its own: waits for K in ring position `$pos`, takes the turn,
/// issues S = Q K^T, passes the turn, waits for the product and releases the K slot; evaluates
/// to S. Q must be published (`q_full` waited for). `($take_turn, $pass_turn, $release)` are
/// [`consume_tiles!`]'s closures of those names; the other parameters are its own.
macro_rules! s_step {
    (
        $cfg:ident, $c:ident, ($take_turn:ident, $pass_turn:ident, $release:ident),
        q: $q_s:ident,
        k: ($k_s:ident, $full_k:ident, $empty_k:ident),
        s: ($s_zero:ident, $s_mma:ident, $s_fence:ident);
        $pos:expr
    ) => {{
        let pos = $pos;
        // SAFETY: the producer issues every step's K, so this phase completes.
        unsafe { $full_k(pos.stage).wait_parity(pos.phase) };
        let mut s = [0.0f32; SR];
        $take_turn();
        // SAFETY: whole warpgroup, uniform control flow; Q and K were published by the completed
        // mbarrier phases and are not overwritten before `empty_k` is arrived on.
        unsafe {
            $crate::attention::hopper::consumer::issue_s!(
                $s_zero, $s_mma, $cfg, $q_s, $k_s, $c; &mut s, pos.stage
            );
        }
        $pass_turn(false);
        // SAFETY: whole warpgroup.
        unsafe { $crate::arch::wgmma::wait_group::<0>() };
        $s_fence(&mut s);
        $release($empty_k(pos.stage));
        s
    }};
}
pub(super) use s_step;

/// The P V half of a step, on its own: waits for V in ring position `$pos`, takes the turn,
/// rescales `$o` by `$correction` (if any), issues O += P V with P in `$pa`, passes the turn
/// (`$last`: the tile's last batch), waits for the product and releases the V slot. Parameters
/// as for [`s_step!`].
macro_rules! pv_step {
    (
        $cfg:ident, ($take_turn:ident, $pass_turn:ident, $release:ident),
        v: ($v_s:ident, $full_v:ident, $empty_v:ident),
        o: ($o_mma:ident, $o_fence:ident);
        $o:ident, $pa:expr, $correction:expr, $pos:expr, $last:expr
    ) => {{
        let pos = $pos;
        // SAFETY: the producer issues every step's V, so this phase completes.
        unsafe { $full_v(pos.stage).wait_parity(pos.phase) };
        $take_turn();
        if let Some(correction) = $correction {
            $crate::attention::hopper::softmax::rescale(&mut $o, correction);
        }
        // SAFETY: whole warpgroup, uniform control flow; V was published by the completed phase
        // and is released only after the wait below; `wgmma.fence` orders the rescale of `o`
        // and the writes of `pa` before the products.
        unsafe {
            $crate::attention::hopper::consumer::issue_pv!(
                $o_mma, $cfg, $v_s; &mut $o, $pa, pos.stage
            );
        }
        $pass_turn($last);
        // SAFETY: whole warpgroup.
        unsafe { $crate::arch::wgmma::wait_group::<0>() };
        $o_fence(&mut $o);
        $release($empty_v(pos.stage));
    }};
}
pub(super) use pv_step;

/// The consumer's loop over the block's tiles, with the epilogue of each: every thread of
/// consumer warpgroup `$wg` (1 or 2) expands it once, after the mbarriers were initialized
/// and published and its registers were raised. `$p`: the kernel's `&HopperParams`; `$cfg`:
/// its `&HopperConfig`; `$handoff`: the `scheduler::Handoff` of the scheduled kernels' tiles
/// (`SCHEDULED`); then per operand its
/// shared memory and its `full` and `empty` mbarriers (the Q tile `$q_s` with `$q_full`,
/// `$q_empty`; the closures of ring slot `s` for K and V); then the `wgmma` shapes and operand fences of S and O. `E`, `BN`, `STAGES`, `SR`,
/// `OR`, `NT`, `NK`, `DK`, `OVERLAP`, `PINGPONG`, `MODE`, `CAPSINK`, `VARLEN`, `FP8` and `SCHEDULED` are the kernel's
/// parameters (see [`super::forward`]).
macro_rules! consume_tiles {
    (
        $p:ident, $cfg:ident, $wg:ident, $handoff:ident,
        q: ($q_s:ident, $q_full:ident, $q_empty:ident),
        k: ($k_s:ident, $full_k:ident, $empty_k:ident),
        v: ($v_s:ident, $full_v:ident, $empty_v:ident),
        s: ($s_zero:ident, $s_mma:ident, $s_fence:ident),
        o: ($o_mma:ident, $o_fence:ident)
    ) => {
        let c = $wg - 1;
        let lane = $crate::arch::index::lane_id();
        let (g, t) = (lane / 4, lane % 4);
        let warp_row = c * ::kernel_abi::attention::HOPPER_WG_ROWS
            + ($crate::arch::index::warp_id() % 4) * 16;
        // Pingpong turns (module docs): consumer `c` syncs on `HOPPER_SCHED_BARRIER + c` before
        // each `wgmma` batch and, after issuing it, arrives on the other's barrier; the last
        // consumer's last batch passes no turn (nobody waits for it), and consumer 1 hands
        // consumer 0 the first turn.
        let take_turn = || {
            if PINGPONG {
                // SAFETY: whole warpgroup, uniform control flow; matched by the other consumer's
                // arrivals as counted in the module docs.
                unsafe {
                    $crate::arch::sync::named_sync(
                        ::kernel_abi::attention::HOPPER_SCHED_BARRIER + c,
                        $crate::attention::hopper::named_barrier::SCHED_THREADS,
                    )
                };
            }
        };
        let pass_turn = |last: bool| {
            if PINGPONG && !(last && c == ::kernel_abi::attention::HOPPER_CONSUMERS - 1) {
                // SAFETY: as for `take_turn`: one arrival per sync of the other consumer.
                unsafe {
                    $crate::arch::sync::named_arrive(
                        ::kernel_abi::attention::HOPPER_SCHED_BARRIER + (c ^ 1),
                        $crate::attention::hopper::named_barrier::SCHED_THREADS,
                    )
                };
            }
        };

        // Release of a K or V slot: one arrival per consumer warp and phase, once every product
        // reading it is complete.
        let release = |bar: $crate::arch::mbarrier::Mbarrier| {
            if lane == 0 {
                // SAFETY: the callers arrive only after the `wait_group` that completes the last
                // product reading the slot; one arrival per warp per phase (the count is the
                // consumer warps).
                unsafe { bar.arrive() };
            }
        };

        let (mut kv, mut q_iter) = (0u32, 0u32);
        let (mut tile_idx, mut seq, mut taken) =
            ($crate::arch::index::block_idx_x(), 0u32, 0u32);
        loop {
            if SCHEDULED {
                // SAFETY: every consumer thread is a taker and takes every tile to the end.
                (tile_idx, seq) = unsafe { $handoff.take(taken, $p.num_tiles) };
                taken += 1;
            }
            if tile_idx >= $p.num_tiles {
                break;
            }
            let tile = {
                // SAFETY: the kernel's parameters, as documented on `HopperParams`; a packed
                // tile's sequence from the scheduler.
                unsafe {
                    $crate::attention::hopper::scheduler::tile::<BN, VARLEN>($p, tile_idx, seq)
                }
            };
            let $crate::attention::hopper::scheduler::Tile {
                m0,
                head,
                batch,
                rows_valid,
                nb_lo,
                steps,
                seq_q,
                seq_k,
                q0,
                ..
            } = tile;
            if !SCHEDULED {
                tile_idx += $crate::arch::index::grid_dim_x();
            }
            // The dense kernels read the lengths from the parameters where they use them.
            let (seq_q, seq_k) = if VARLEN { (seq_q, seq_k) } else { ($p.seq_q, $p.seq_k) };
            let offset = seq_k as i64 - seq_q as i64;
            let range = |h: u32| {
                let row = m0 + warp_row + g + 8 * h;
                $crate::attention::mask::key_range(
                    row,
                    $p.window_left,
                    $p.window_right,
                    seq_k as i32,
                    offset as i32,
                )
            };
            let (range0, range1) = (range(0), range(1));
            let rows = $crate::attention::hopper::mask::Rows {
                m0,
                t,
                window_left: $p.window_left,
                window_right: $p.window_right,
                seq_k: seq_k as i32,
                offset: offset as i32,
                key_lo: [range0.0, range1.0],
                key_hi: [range0.1, range1.1],
                scale_log2: $p.scale_log2,
                softcap_scale: $p.logits.softcap_scale,
            };
            let mut o = [0.0f32; OR];
            let mut row_max = [f32::NEG_INFINITY; 2];
            let mut row_sum = [0.0f32; 2];
            if PINGPONG && steps > 0 && c == 1 {
                // SAFETY: consumer 0's first turn of this tile (module docs).
                unsafe {
                    $crate::arch::sync::named_arrive(
                        ::kernel_abi::attention::HOPPER_SCHED_BARRIER,
                        $crate::attention::hopper::named_barrier::SCHED_THREADS,
                    )
                };
            }
            // This tile's first K/V position in the rings.
            let first = $crate::arch::mbarrier::RingPos::<STAGES>::of(kv);
            if steps > 0 && !OVERLAP {
                // One step after the other: S, softmax, P V, each product waited for.
                // SAFETY: the producer issues Q when `steps > 0`, completing this phase.
                unsafe { $q_full.wait_parity(q_iter & 1) };
                let mut pos = first;
                for step in 0..steps {
                    let mut s = $crate::attention::hopper::consumer::s_step!(
                        $cfg, c, (take_turn, pass_turn, release),
                        q: $q_s,
                        k: ($k_s, $full_k, $empty_k),
                        s: ($s_zero, $s_mma, $s_fence);
                        pos
                    );
                    let n0 = (nb_lo + step) * BN;
                    let correction = $crate::attention::hopper::softmax::softmax_step::<
                        SR,
                        NT,
                        BN,
                        MODE,
                        CAPSINK,
                    >(&rows, &mut s, n0, &mut row_max, &mut row_sum);
                    if let Some(correction) = correction {
                        $crate::attention::hopper::softmax::rescale(&mut o, correction);
                    }
                    let pa = $crate::attention::hopper::softmax::pack::<E, SR, NK, FP8>(&s);
                    $crate::attention::hopper::consumer::pv_step!(
                        $cfg, (take_turn, pass_turn, release),
                        v: ($v_s, $full_v, $empty_v),
                        o: ($o_mma, $o_fence);
                        o, pa, None, pos, step + 1 == steps
                    );
                    pos = pos.next();
                }
                // Every S of the tile is complete: Q's tile may be reloaded.
                release($q_empty);
            }
            if steps > 0 && OVERLAP {
                // Software pipeline within the warpgroup (FlashAttention-3's intra-warpgroup
                // overlap): iteration i issues S_i, rescales O (the factor of step i - 1), issues
                // O += P_{i-1} V_{i-1}, and runs the softmax of S_i while the P V product is in
                // flight. Step 0's S and the last step's P V are the steps' own halves.
                // SAFETY: the producer issues Q when `steps > 0`, completing this phase.
                unsafe { $q_full.wait_parity(q_iter & 1) };
                let mut s = $crate::attention::hopper::consumer::s_step!(
                    $cfg, c, (take_turn, pass_turn, release),
                    q: $q_s,
                    k: ($k_s, $full_k, $empty_k),
                    s: ($s_zero, $s_mma, $s_fence);
                    first
                );
                // O is still 0: the first factor does not matter.
                $crate::attention::hopper::softmax::softmax_step::<SR, NT, BN, MODE, CAPSINK>(
                    &rows,
                    &mut s,
                    nb_lo * BN,
                    &mut row_max,
                    &mut row_sum,
                );
                let mut pa = $crate::attention::hopper::softmax::pack::<E, SR, NK, FP8>(&s);
                let mut correction = None;
                let mut prev = first;
                for step in 1..steps {
                    let pos = prev.next();
                    let mut s_next = [0.0f32; SR];
                    // SAFETY: the producer issues every K and V, so these phases complete.
                    unsafe {
                        $full_k(pos.stage).wait_parity(pos.phase);
                        $full_v(prev.stage).wait_parity(prev.phase);
                    }
                    take_turn();
                    // SAFETY: whole warpgroup, uniform control flow. K_i and V_{i-1} were published
                    // by their `full` phases and are released only after the `wait_group`s below.
                    // The first batch's fence orders the writes of `pa` before the products, the
                    // second's the rescale of `o` (which S_next does not read).
                    unsafe {
                        $crate::attention::hopper::consumer::issue_s!(
                            $s_zero, $s_mma, $cfg, $q_s, $k_s, c; &mut s_next, pos.stage
                        );
                        if let Some(correction) = correction {
                            $crate::attention::hopper::softmax::rescale(&mut o, correction);
                        }
                        $crate::attention::hopper::consumer::issue_pv!(
                            $o_mma, $cfg, $v_s; &mut o, pa, prev.stage
                        );
                    }
                    pass_turn(false);
                    // Groups complete in order: at most one pending means S_next is complete (the
                    // P V product may still run).
                    // SAFETY: whole warpgroup.
                    unsafe { $crate::arch::wgmma::wait_group::<1>() };
                    $s_fence(&mut s_next);
                    release($empty_k(pos.stage));
                    let n0 = (nb_lo + step) * BN;
                    correction = $crate::attention::hopper::softmax::softmax_step::<
                        SR,
                        NT,
                        BN,
                        MODE,
                        CAPSINK,
                    >(&rows, &mut s_next, n0, &mut row_max, &mut row_sum);
                    // SAFETY: whole warpgroup.
                    unsafe { $crate::arch::wgmma::wait_group::<0>() };
                    $o_fence(&mut o);
                    for kk in 0..NK {
                        // The P V product read `pa` until the wait above: keep its registers
                        // until here.
                        $crate::arch::wgmma::pin_fragment(&mut pa[kk]);
                    }
                    release($empty_v(prev.stage));
                    pa = $crate::attention::hopper::softmax::pack::<E, SR, NK, FP8>(&s_next);
                    prev = pos;
                }
                // Every S of the tile is complete (the last one waited for above): Q's tile may
                // be reloaded while the last P V runs.
                release($q_empty);
                $crate::attention::hopper::consumer::pv_step!(
                    $cfg, (take_turn, pass_turn, release),
                    v: ($v_s, $full_v, $empty_v),
                    o: ($o_mma, $o_fence);
                    o, pa, correction, prev, true
                );
            }

            // Epilogue: finish the row sums across the quad, normalize, store O and LSE.
            $crate::attention::hopper::epilogue::store_tile!(
                E, OR, $p, o, row_max, row_sum, m0, q0, head, batch, rows_valid, warp_row, g, t
            );
            if steps > 0 {
                kv += steps;
                q_iter += 1;
            }
        }
    };
}
pub(super) use consume_tiles;
