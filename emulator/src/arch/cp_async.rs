//! Emulated `cp.async`: the source is read when the copy is issued (bounds- and
//! alignment-checked), but the data lands in shared memory only when a `wait_group`/`wait_all`
//! of the issuing thread requires its group to be complete (the latest moment the hardware may
//! choose), so a missing or miscounted wait shows up as a read of stale shared memory. A thread
//! that exits with copies still pending fails the launch.

use crate::emu::{check_global, smem_ptr};
use core::cell::RefCell;

/// One copy not landed yet: shared destination and the 16 bytes.
struct Pending {
    dst: u32,
    data: [u8; 16],
}

#[derive(Default)]
struct Groups {
    /// Copies issued since the last `commit_group`.
    open: Vec<Pending>,
    /// Committed groups, oldest first.
    committed: Vec<Vec<Pending>>,
}

std::thread_local! {
    static GROUPS: RefCell<Groups> = RefCell::new(Groups::default());
}

/// Copy 16 bytes from global `src` to shared `dst`.
///
/// # Safety
/// As on the device: `src` holds 16 readable bytes, both 16-byte aligned.
pub unsafe fn copy_16(dst: u32, src: *const u8) {
    // SAFETY: forwarded.
    unsafe { copy_16_zfill(dst, src, 16) }
}

/// Copy the first `src_bytes` of `src` to `dst` and zero the rest of the 16 bytes.
///
/// # Safety
/// As on the device.
pub unsafe fn copy_16_zfill(dst: u32, src: *const u8, src_bytes: u32) {
    assert!(src_bytes <= 16, "cp.async of {src_bytes} > 16 source bytes");
    // Checked now (the destination must be a valid, aligned 16 bytes when issued).
    smem_ptr(dst, 16, 16);
    let mut data = [0u8; 16];
    if src_bytes > 0 {
        check_global(src, 16, src_bytes as usize);
        // SAFETY: the caller guarantees `src_bytes` readable bytes at `src` (and the check
        // above found them inside a live buffer when buffers are registered).
        unsafe { core::ptr::copy_nonoverlapping(src, data.as_mut_ptr(), src_bytes as usize) };
    }
    GROUPS.with(|g| g.borrow_mut().open.push(Pending { dst, data }));
}

fn land(group: Vec<Pending>) {
    for c in group {
        let d = smem_ptr(c.dst, 16, 16);
        // SAFETY: `d` is 16 in-bounds bytes of shared memory (checked).
        unsafe { core::ptr::copy_nonoverlapping(c.data.as_ptr(), d, 16) };
    }
}

/// `cp.async.commit_group`: close the open group (possibly empty).
pub fn commit_group() {
    GROUPS.with(|g| {
        let mut g = g.borrow_mut();
        let open = core::mem::take(&mut g.open);
        g.committed.push(open);
    });
}

/// `cp.async.wait_group N`: land the oldest committed groups until at most `N` are pending
/// (copies not committed yet are not waited for, as on the device).
pub fn wait_group<const N: u32>() {
    let ready: Vec<Vec<Pending>> = GROUPS.with(|g| {
        let mut g = g.borrow_mut();
        let n = g.committed.len().saturating_sub(N as usize);
        g.committed.drain(..n).collect()
    });
    ready.into_iter().for_each(land);
}

/// `cp.async.wait_all`: land every copy of this thread (committed or not).
pub fn wait_all() {
    let ready: Vec<Vec<Pending>> = GROUPS.with(|g| {
        let mut g = g.borrow_mut();
        let open = core::mem::take(&mut g.open);
        let mut all: Vec<Vec<Pending>> = g.committed.drain(..).collect();
        all.push(open);
        all
    });
    ready.into_iter().for_each(land);
}

/// Copies of the calling thread that were issued and never waited for (checked at its exit).
pub(crate) fn pending_at_exit() -> usize {
    GROUPS.with(|g| {
        let mut g = g.borrow_mut();
        let n = g.open.len() + g.committed.iter().map(Vec::len).sum::<usize>();
        *g = Groups::default();
        n
    })
}
