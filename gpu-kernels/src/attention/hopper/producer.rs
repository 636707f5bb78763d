//! The producer of the Hopper kernel: thread 0 of warpgroup 0 issues every TMA load of the
//! block (Q once per tile, then K and V of each step through their rings) in the order the
//! consumers read them. The barrier protocol is in the module documentation of [`super`].
//!
//! A macro rather than a function, expanded in the kernel body: moving this loop into an
//! `#[inline(always)]` function (taking the same values and closures) changed the PTX of the
//! consumers' descriptor arithmetic; the expansion is the kernel body's own code.

/// The producer's loop over the block's tiles (thread 0 only, once, after the mbarriers were
/// initialized and published). `$p`: the kernel's `&HopperParams`; `$cfg`: its
/// `&HopperConfig`; `($cblocks, $v_cblocks)`: the column blocks of a Q or K tile and of a V
/// tile; `$handoff`: the `scheduler::Handoff` the scheduled kernels (`SCHEDULED`) take their tiles
/// and sequences from; the tensor maps of Q, K and V;
/// then per operand its shared memory and its `full` and `empty` mbarriers: the Q tile
/// `$q_s` with `$q_full`, `$q_empty`, and the closures of ring slot `s`: `$k_s(s)`,
/// `$full_k(s)`, `$empty_k(s)` and likewise for V. `BN`, `STAGES`, `OVERLAP`, `VARLEN`, `FP8`
/// and `SCHEDULED` are the kernel's const parameters (with `FP8` V's map describes `V^T`,
/// `kernel_abi::attention::fp8`). Packed sequences (`VARLEN`): a box reaching past a sequence's
/// rows loads the next sequence's (or, past the tensor, zeros): its key rows are masked, its
/// query rows computed and not stored.
macro_rules! load_tiles {
    (
        $p:ident, $cfg:ident, ($cblocks:ident, $v_cblocks:ident), $handoff:ident,
        [$tmap_q:ident, $tmap_k:ident, $tmap_v:ident],
        q: ($q_s:ident, $q_full:ident, $q_empty:ident),
        k: ($k_s:ident, $full_k:ident, $empty_k:ident),
        v: ($v_s:ident, $full_v:ident, $empty_v:ident)
    ) => {
        // K/V tiles through the rings and Q tiles loaded so far (tiles without a step load
        // nothing, on both sides).
        let (mut kv, mut q_iter) = (0u32, 0u32);
        let (mut t, mut seq, mut taken) = ($crate::arch::index::block_idx_x(), 0u32, 0u32);
        loop {
            if SCHEDULED {
                // SAFETY: the producer's thread is a taker and takes every tile to the end.
                (t, seq) = unsafe { $handoff.take(taken, $p.num_tiles) };
                taken += 1;
            }
            if t >= $p.num_tiles {
                break;
            }
            let tl = {
                // SAFETY: the kernel's parameters, as documented on `HopperParams`; a packed
                // tile's sequence from the scheduler.
                unsafe { $crate::attention::hopper::scheduler::tile::<BN, VARLEN>($p, t, seq) }
            };
            if !SCHEDULED {
                t += $crate::arch::index::grid_dim_x();
            }
            if tl.steps == 0 {
                continue;
            }
            // SAFETY: Q's tile is free once `q_empty` completed its previous phase (the
            // consumers' last S of the previous tile is complete; the first pass does not
            // wait); `q_full` expects exactly the Q boxes' bytes; the destinations are
            // 1024-aligned column blocks sized by the ABI, read only after the phase
            // completes; the D coordinates are multiples of 64 elements (TMA's 16-byte
            // rule holds).
            unsafe {
                $q_empty.wait_parity((q_iter & 1) ^ 1);
                $q_full.arrive_expect_tx($cfg.q_bytes());
                for cb in 0..$cblocks {
                    let dst = $q_s + cb * $cfg.block_bytes(::kernel_abi::attention::HOPPER_BLOCK_M);
                    let x = (cb
                        * if FP8 {
                            ::kernel_abi::attention::HOPPER_FP8_ATOM
                        } else {
                            ::kernel_abi::attention::HOPPER_ATOM
                        }) as i32;
                    // Packed sequences: rows of one `[D, heads, total, 1]` map from the
                    // sequence's first row (below 2^30 each: the sums fit i32).
                    let (h, b) = (tl.head as i32, if VARLEN { 0 } else { tl.batch as i32 });
                    $tmap_q.load_4d(dst, x, h, (tl.q0 + tl.m0) as i32, b, $q_full);
                }
            }
            // Tiles in the order the consumers read them: with the overlap K of step i + 1
            // before V of step i (S of step i + 1 is issued before P V of step i), else K
            // and V of each step.
            let load = |j: u32, k: bool| {
                let pos = $crate::arch::mbarrier::RingPos::<STAGES>::of(kv + j);
                let (full, empty, map, dst, cblocks, bytes) = if k {
                    (
                        $full_k(pos.stage),
                        $empty_k(pos.stage),
                        $tmap_k,
                        $k_s(pos.stage),
                        $cblocks,
                        $cfg.tile_bytes(),
                    )
                } else {
                    (
                        $full_v(pos.stage),
                        $empty_v(pos.stage),
                        $tmap_v,
                        $v_s(pos.stage),
                        $v_cblocks,
                        $cfg.v_tile_bytes(),
                    )
                };
                let n0 = (tl.k0 + (tl.nb_lo + j) * BN) as i32;
                // SAFETY: ring protocol (module docs): the slot is free once `empty`
                // completed its previous phase; `full` expects exactly the tile's bytes;
                // the destination is untouched until that phase completes.
                unsafe {
                    empty.wait_parity(pos.phase ^ 1);
                    full.arrive_expect_tx(bytes);
                    if FP8 && !k {
                        // V^T `[seq_pad, D, heads_kv, batch]`: one box of the step's 128 keys
                        // by all D rows (`D * 128` bytes, the tile's).
                        map.load_4d(dst, n0, 0, tl.head_kv as i32, tl.batch as i32, full);
                    } else {
                        for cb in 0..cblocks {
                            let x = (cb
                                * if FP8 {
                                    ::kernel_abi::attention::HOPPER_FP8_ATOM
                                } else {
                                    ::kernel_abi::attention::HOPPER_ATOM
                                }) as i32;
                            let d = dst + cb * $cfg.block_bytes(BN);
                            let (h, b) =
                                (tl.head_kv as i32, if VARLEN { 0 } else { tl.batch as i32 });
                            map.load_4d(d, x, h, n0, b, full);
                        }
                    }
                }
            };
            if OVERLAP {
                load(0, true);
            }
            for step in 0..tl.steps {
                if !OVERLAP {
                    load(step, true);
                } else if step + 1 < tl.steps {
                    load(step + 1, true);
                }
                load(step, false);
            }
            kv += tl.steps;
            q_iter += 1;
        }
    };
}
pub(super) use load_tiles;
