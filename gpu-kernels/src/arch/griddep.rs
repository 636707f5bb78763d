//! Programmatic dependent launch (sm_90): a kernel launched with
//! `LaunchConfig::overlap_previous` (host crate) may start while the kernel before it on the
//! stream (its *primary*) still runs, and waits for it only where it needs its results.
//!
//! The contract: the dependent executes [`wait_primary`] before its first access to memory the
//! primary writes, and before its first write to memory the primary reads; every block of the
//! dependent executes it in at least one thread that then writes, so the dependent grid
//! completes after the primary (later stream work, which waits for the dependent, then sees
//! both). The primary may execute [`launch_dependents`] to let the dependent's blocks be
//! scheduled before it completes; that gives no memory guarantee.

use core::arch::asm;

/// `griddepcontrol.wait`: wait until the primary grid has completed and its memory operations
/// are performed and visible to this grid. Returns at once when this launch has no primary
/// (launched without `overlap_previous`). A compiler memory barrier as well: no access is
/// moved across it.
#[inline(always)]
pub fn wait_primary() {
    // SAFETY: a wait with no operands; it only orders this thread after the primary grid.
    unsafe { asm!("griddepcontrol.wait;", options(nostack)) };
}

/// `griddepcontrol.launch_dependents`: allow the dependent grid (launched after this one with
/// `overlap_previous`) to be scheduled once every block of this grid has executed this or
/// exited. No effect without such a dependent, and no memory ordering.
#[inline(always)]
pub fn launch_dependents() {
    // SAFETY: a scheduling hint with no operands and no memory effect.
    unsafe { asm!("griddepcontrol.launch_dependents;", options(nostack)) };
}
