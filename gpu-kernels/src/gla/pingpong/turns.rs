//! The turn order of the forward's GEMM phases (the "Turns" item of the barrier protocol in the
//! pingpong module documentation): which consumer waits for which before its step, over the
//! named barriers `PP_ORDER_BARRIER + c`.

use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gla::PP_MAX_CONSUMERS;

/// Threads in one turn barrier phase: one consumer syncing, the other arriving.
pub(super) const ORDER_THREADS: u32 = 2 * WARPGROUP_SIZE;

/// The turn order of the GEMM phases (pingpong module documentation): round `r` visits consumers
/// `0 .. NC` in order, leaving out those without a step `r` (`n[c]` steps each). Whether
/// consumer `c`'s step `r` has a predecessor that is another consumer (then it waits for
/// that one's arrival).
#[inline(always)]
pub(super) fn turn_waits<const NC: u32>(
    n: &[u32; PP_MAX_CONSUMERS as usize],
    r: u32,
    c: u32,
) -> bool {
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
pub(super) fn turn_next<const NC: u32>(
    n: &[u32; PP_MAX_CONSUMERS as usize],
    r: u32,
    c: u32,
) -> Option<u32> {
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
