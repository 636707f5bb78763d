//! The named barriers of the Hopper kernel: the pingpong turns between the two consumers
//! (`HopperConfig::pingpong`), barriers `HOPPER_SCHED_BARRIER + c` for consumer `c`. The
//! protocol and why it cannot deadlock are in the module documentation of [`super`]; the
//! consumers' `take_turn` / `pass_turn` ([`super::consumer`]) sync and arrive on them.

use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::attention::HOPPER_CONSUMERS;

/// Threads per phase of a pingpong turn barrier: one consumer syncs, the other arrives.
pub(super) const SCHED_THREADS: u32 = 2 * WARPGROUP_SIZE;
const _: () = assert!(
    HOPPER_CONSUMERS == 2,
    "the pingpong turns pair two consumers"
);
