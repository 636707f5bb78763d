//! `mbarrier` (sm_90 forms): shared-memory barrier objects with an arrival count, a transaction
//! byte count (for TMA) and a phase bit.
//!
//! A phase completes when the pending arrival count reaches zero *and* the pending transaction
//! bytes reach zero; the barrier then flips its phase and re-arms with the init count. Waiters
//! wait on the parity of the phase they expect to complete: `try_wait.parity P` succeeds once
//! the phase with parity `P` has completed. Right after init the barrier is in phase 0, so a
//! wait on parity 1 succeeds immediately (the producer's "slot is empty" convention).
//!
//! Waiting is `mbarrier.try_wait` in a loop: the hardware suspends the thread inside each try
//! for a time, so this is not a spin on plain memory.

use core::arch::asm;

/// An 8-byte `mbarrier` object in shared memory, by its shared-window address (8-byte aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mbarrier(u32);

/// Bytes of shared memory an mbarrier occupies.
pub const MBARRIER_BYTES: u32 = 8;

impl Mbarrier {
    /// The mbarrier at shared-window address `addr`.
    #[inline(always)]
    pub const fn at(addr: u32) -> Self {
        Mbarrier(addr)
    }

    /// Its shared-window address.
    #[inline(always)]
    pub const fn addr(self) -> u32 {
        self.0
    }

    /// `mbarrier.init.shared::cta.b64 [bar], count`: arm with `count` expected arrivals per phase.
    ///
    /// # Safety
    /// One thread initializes, before any other use; then [`super::fence::fence_mbarrier_init`]
    /// and a block barrier publish it. `count` is in 1..2^20.
    #[inline(always)]
    pub unsafe fn init(self, count: u32) {
        // SAFETY: forwarded to the caller (single initializer, valid address).
        unsafe {
            asm!("mbarrier.init.shared::cta.b64 [{0}], {1};", in(reg32) self.0, in(reg32) count,
                 options(nostack))
        };
    }

    /// `mbarrier.arrive.shared::cta.b64`: one arrival (release semantics: this thread's earlier
    /// memory accesses are visible to threads that observe the phase complete).
    ///
    /// # Safety
    /// The barrier is initialized; the arrival is one of the `count` expected in this phase.
    #[inline(always)]
    pub unsafe fn arrive(self) {
        let _state: u64;
        // SAFETY: forwarded to the caller (initialized barrier, expected arrival).
        unsafe {
            asm!("mbarrier.arrive.shared::cta.b64 {0}, [{1}];", out(reg64) _state, in(reg32) self.0,
                 options(nostack))
        };
    }

    /// `mbarrier.arrive.expect_tx.shared::cta.b64`: add `bytes` to the phase's expected
    /// transaction count, then arrive. The phase completes only once TMA copies signalling this
    /// barrier (`complete_tx`) have delivered exactly that many bytes.
    ///
    /// # Safety
    /// As for [`Mbarrier::arrive`]; the copies issued for this phase deliver exactly `bytes`.
    #[inline(always)]
    pub unsafe fn arrive_expect_tx(self, bytes: u32) {
        let _state: u64;
        // SAFETY: forwarded to the caller (initialized barrier, matching byte count).
        unsafe {
            asm!("mbarrier.arrive.expect_tx.shared::cta.b64 {0}, [{1}], {2};", out(reg64) _state,
                 in(reg32) self.0, in(reg32) bytes, options(nostack))
        };
    }

    /// `mbarrier.try_wait.parity.shared::cta.b64`: whether the phase of parity `parity` has
    /// completed (acquire semantics when it returns true). May suspend the thread for a while.
    ///
    /// # Safety
    /// The barrier is initialized and published.
    #[inline(always)]
    pub unsafe fn try_wait_parity(self, parity: u32) -> bool {
        let done: u32;
        // SAFETY: forwarded to the caller (initialized barrier).
        unsafe {
            asm!(
                "{{",
                ".reg .pred p;",
                "mbarrier.try_wait.parity.shared::cta.b64 p, [{1}], {2};",
                "selp.u32 {0}, 1, 0, p;",
                "}}",
                out(reg32) done, in(reg32) self.0, in(reg32) parity, options(nostack)
            )
        };
        done != 0
    }

    /// Wait until the phase of parity `parity` has completed.
    ///
    /// # Safety
    /// As for [`Mbarrier::try_wait_parity`]; some thread or copy completes that phase (else the
    /// thread waits forever, which the host's launch watchdog reports).
    #[inline(always)]
    pub unsafe fn wait_parity(self, parity: u32) {
        // SAFETY: forwarded to the caller (initialized barrier).
        while !unsafe { self.try_wait_parity(parity) } {}
    }

    /// `mbarrier.inval.shared::cta.b64`: invalidate before the memory is reused for other data.
    ///
    /// # Safety
    /// No thread or copy uses the barrier afterwards.
    #[inline(always)]
    pub unsafe fn inval(self) {
        // SAFETY: forwarded to the caller (no later use).
        unsafe {
            asm!("mbarrier.inval.shared::cta.b64 [{0}];", in(reg32) self.0, options(nostack))
        };
    }
}

/// A ring position: stage index and the phase parity that a consumer waits on.
///
/// Stage `s` of a ring of `STAGES` is used for the tiles `s, s + STAGES, ...`; the `n`th reuse
/// of a stage completes the barrier's phase `n`, of parity `n % 2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingPos<const STAGES: u32> {
    /// Stage index (0..STAGES).
    pub stage: u32,
    /// Parity of the phase that completes when this position's tile is full.
    pub phase: u32,
}

impl<const STAGES: u32> RingPos<STAGES> {
    /// The position of the `i`th tile through the ring.
    #[inline(always)]
    pub const fn of(i: u32) -> Self {
        RingPos {
            stage: i % STAGES,
            phase: (i / STAGES) & 1,
        }
    }

    /// The next position.
    #[inline(always)]
    pub const fn next(self) -> Self {
        if self.stage + 1 == STAGES {
            RingPos {
                stage: 0,
                phase: self.phase ^ 1,
            }
        } else {
            RingPos {
                stage: self.stage + 1,
                phase: self.phase,
            }
        }
    }
}
