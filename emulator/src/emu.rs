//! CPU emulation of a kernel launch.
//!
//! On a machine without a GPU the portable kernels can still be *executed*: this crate compiles
//! their sources over [`crate::arch`], which implements the device layer's functions on the CPU,
//! and [`launch`] runs a grid with one OS thread per GPU thread:
//!
//! - blocks run one after the other; the threads of a block run concurrently;
//! - `bar.sync` is a barrier over the block's threads; warp-collective operations (shuffles,
//!   votes, `mma.sync`, `ldmatrix`) exchange their operands through the warp's slots between two
//!   barriers over its 32 threads, and compute what the PTX ISA specifies for each lane;
//! - shared memory is one buffer per block, poisoned (all bits set) at the start; its dynamic
//!   base is deliberately not 1024-aligned, so kernels must place buffers from
//!   `smem::aligned_base()`; every access is bounds- and alignment-checked, as are global vector
//!   accesses and `cp.async` sources (inside a registered buffer when any is registered, see
//!   [`register_buffer`]); a `cp.async` lands only when its thread's `wait_group` requires it
//!   (the latest order the hardware may choose), and a thread must not exit with copies pending;
//! - `ex2.approx.ftz` flushes subnormal inputs and results to zero, as on the device (its
//!   rounding is libm's, more accurate);
//! - a barrier that waits longer than [`DEADLOCK_SECS`] fails the launch (a real GPU would hang);
//! - shared-memory hazards between warps are detected, whatever the order the threads happened
//!   to run in (see [`track_smem`]): a typed load or store (`SmemValue`, `SmemArray`) or an
//!   `ldmatrix` row of one warp that conflicts with a store (or, for a store, a load) of
//!   another warp between the same two block barriers fails the launch, as compute-sanitizer's
//!   racecheck reports it. Accesses through generic pointers and `cp.async` are not tracked.
//!
//! It checks the logic of a kernel (indexing, fragment layouts, barrier counts, arithmetic) and
//! the barrier protocol of its typed shared-memory accesses, not its timing; racecheck covers
//! the rest on the GPU.

use core::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A barrier that has waited this long reports a deadlock.
pub const DEADLOCK_SECS: u64 = 60;

/// Shared-window address of the emulated dynamic shared memory (not 1024-aligned on purpose).
pub const DYN_BASE: u32 = 48;

/// Words a lane can publish in one warp-collective operation.
const SLOT_WORDS: usize = 16;

/// A kernel as the emulator sees it: name, parameter struct size, declared block size, entry.
#[derive(Clone, Copy)]
pub struct EmuKernel {
    /// Kernel name (as in the PTX).
    pub name: &'static str,
    /// Size of its parameter struct.
    pub params: usize,
    /// Its launch bound (threads per block).
    pub threads: u32,
    /// Run the kernel body for the calling emulated thread with the parameter struct at `p`.
    pub run: unsafe fn(p: *const u8),
}

struct Barrier {
    state: Mutex<(u32, u64)>,
    cv: Condvar,
    count: u32,
}

impl Barrier {
    fn new(count: u32) -> Self {
        Barrier {
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
            count,
        }
    }

    fn wait(&self, poison: &AtomicBool, what: &str) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let generation = st.1;
        st.0 += 1;
        if st.0 == self.count {
            st.0 = 0;
            st.1 += 1;
            self.cv.notify_all();
            return;
        }
        let start = Instant::now();
        loop {
            let (s, _) = self
                .cv
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner());
            st = s;
            if st.1 != generation {
                return;
            }
            if poison.load(Relaxed) {
                drop(st);
                panic!("emulated block aborted: another thread of the block failed");
            }
            if start.elapsed() > Duration::from_secs(DEADLOCK_SECS) {
                poison.store(true, Relaxed);
                let arrived = st.0;
                drop(st);
                panic!(
                    "deadlock: {arrived} of {} threads arrived at a {what} barrier",
                    self.count
                );
            }
        }
    }
}

struct Warp {
    slots: Vec<[AtomicU32; SLOT_WORDS]>,
    barrier: Barrier,
}

/// The state of one emulated block.
pub(crate) struct Block {
    smem: *mut u8,
    smem_end: u32,
    barrier: Barrier,
    warps: Vec<Warp>,
    poison: AtomicBool,
    /// Per byte of shared memory: the last store `(epoch << 32) | (warp + 1)` (0: none).
    last_store: Vec<AtomicU64>,
    /// Per byte: the loads of the last epoch that loaded it, `(epoch << 32) | (warp + 1)`, or
    /// `MANY_WARPS` in the low word when several warps did.
    last_load: Vec<AtomicU64>,
    /// The first hazard found, if any.
    hazard: Mutex<Option<String>>,
}

/// Low word of a `last_load` entry read by more than one warp in its epoch.
const MANY_WARPS: u64 = u32::MAX as u64;

// SAFETY: the threads of a block share the shared-memory buffer as the threads of a GPU block
// do: accesses of a correct kernel are ordered by its barriers (whose mutex gives the
// happens-before edges); everything else in `Block` is a synchronization primitive.
unsafe impl Sync for Block {}

/// The calling emulated thread's coordinates.
#[derive(Clone, Copy)]
pub(crate) struct Ctx {
    pub tid: u32,
    pub block: (u32, u32, u32),
    pub block_dim: u32,
    pub grid: (u32, u32, u32),
    block_state: *const Block,
}

std::thread_local! {
    static CTX: Cell<Option<Ctx>> = const { Cell::new(None) };
    /// Block barriers the calling emulated thread has passed: its epoch. A thread passes
    /// barrier `e` only once every thread arrived there, so two accesses of the same epoch by
    /// different threads are unordered, and accesses of different epochs are ordered.
    static EPOCH: Cell<u32> = const { Cell::new(0) };
}

/// The calling thread's context; device code called outside [`launch`] panics.
pub(crate) fn ctx() -> Ctx {
    CTX.with(|c| c.get())
        .expect("device code called outside an emulated launch")
}

fn block() -> &'static Block {
    // SAFETY: `block_state` points at the `Block` of the running launch, which outlives every
    // thread of the block (the threads are scoped inside `launch_block`).
    unsafe { &*ctx().block_state }
}

/// Wait at the calling thread's block barrier (`bar.sync 0`).
pub(crate) fn sync_block() {
    let b = block();
    b.barrier.wait(&b.poison, "block");
    EPOCH.with(|e| e.set(e.get() + 1));
}

/// Record a typed shared-memory access of `bytes` bytes at `addr` (in bounds, checked by
/// [`smem_ptr`]) by the calling thread and check it against the other warps' accesses of the
/// same epoch: a load after another warp's store (read-after-write), a store after another
/// warp's load (write-after-read) or store (write-after-write), in either real order, is a
/// hazard; the first one is reported as the launch's failure once the block finished.
/// Accesses by lanes of one warp are not compared (warp-collective operations order them).
pub(crate) fn track_smem(addr: u32, bytes: u32, store: bool) {
    let c = ctx();
    let b = block();
    let warp = (c.tid / 32) as u64;
    let epoch = EPOCH.with(|e| e.get()) as u64;
    let me = (epoch << 32) | (warp + 1);
    let other = |v: u64| v >> 32 == epoch && (v & 0xffff_ffff) != 0 && v != me;
    let mut found: Option<&str> = None;
    for i in addr..addr + bytes {
        let i = i as usize;
        let prev_store = if store {
            b.last_store[i].swap(me, Relaxed)
        } else {
            b.last_store[i].load(Relaxed)
        };
        if other(prev_store) {
            found = Some(if store {
                "write-after-write"
            } else {
                "read-after-write"
            });
        }
        if store {
            if other(b.last_load[i].load(Relaxed)) {
                found = Some("write-after-read");
            }
        } else {
            let _ = b.last_load[i].fetch_update(Relaxed, Relaxed, |v| {
                Some(if v >> 32 != epoch || v == me {
                    me
                } else {
                    (epoch << 32) | MANY_WARPS
                })
            });
        }
    }
    if let Some(kind) = found {
        let mut h = b.hazard.lock().unwrap_or_else(|e| e.into_inner());
        if h.is_none() {
            *h = Some(format!(
                "shared-memory {kind} hazard at window address {addr} ({bytes} bytes, {} by \
                 thread {} of warp {warp}) with another warp, no barrier between them",
                if store { "store" } else { "load" },
                c.tid
            ));
        }
    }
}

/// Wait at the calling thread's warp barrier.
pub(crate) fn sync_warp() {
    let b = block();
    let w = &b.warps[(ctx().tid / 32) as usize];
    w.barrier.wait(&b.poison, "warp");
}

/// A warp-collective step: publish `words` in this lane's slots, wait for the whole warp, run
/// `f` with a reader of every lane's slots, wait again (so slots are not overwritten early).
pub(crate) fn warp_exchange<R>(
    words: &[u32],
    f: impl FnOnce(&dyn Fn(u32, usize) -> u32) -> R,
) -> R {
    assert!(words.len() <= SLOT_WORDS);
    let c = ctx();
    let b = block();
    let w = &b.warps[(c.tid / 32) as usize];
    let lane = (c.tid % 32) as usize;
    for (i, &v) in words.iter().enumerate() {
        w.slots[lane][i].store(v, Relaxed);
    }
    w.barrier.wait(&b.poison, "warp");
    let r = f(&|l, i| w.slots[l as usize][i].load(Relaxed));
    w.barrier.wait(&b.poison, "warp");
    r
}

/// Host pointer of `bytes` bytes of shared memory at window address `addr`, after checking
/// bounds and `align`.
pub(crate) fn smem_ptr(addr: u32, bytes: u32, align: u32) -> *mut u8 {
    let b = block();
    assert!(
        addr >= DYN_BASE && addr.checked_add(bytes).is_some_and(|e| e <= b.smem_end),
        "shared memory access of {bytes} bytes at {addr} outside [{DYN_BASE}, {})",
        b.smem_end
    );
    assert!(
        addr.is_multiple_of(align),
        "shared memory access at {addr} not {align}-byte aligned"
    );
    // SAFETY: in bounds of the block's buffer (checked above).
    unsafe { b.smem.add(addr as usize) }
}

/// Host buffers standing in for device allocations (`[start, end)` byte ranges), registered by
/// their owners while alive; empty when nobody registers.
static BUFFERS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Declare `bytes` bytes at `addr` a live "device allocation": while any is registered, every
/// checked global access (`cp.async` sources, `arch::global` loads and stores) must lie inside
/// one of them.
pub fn register_buffer(addr: usize, bytes: usize) {
    BUFFERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((addr, addr + bytes));
}

/// Withdraw the buffer registered at `addr`.
pub fn unregister_buffer(addr: usize) {
    let mut b = BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = b.iter().position(|r| r.0 == addr) {
        b.swap_remove(i);
    }
}

/// Check a global access of `bytes` at `ptr` for alignment `align`, null, and (when buffers
/// are registered) for lying inside one registered buffer: out-of-bounds reads and writes fail
/// the launch instead of touching other host memory (the device reports an illegal address).
pub(crate) fn check_global<T>(ptr: *const T, align: usize, bytes: usize) {
    assert!(!ptr.is_null(), "global access through a null pointer");
    assert!(
        (ptr as usize).is_multiple_of(align),
        "global access at {ptr:p} not {align}-byte aligned"
    );
    let (start, end) = (ptr as usize, ptr as usize + bytes);
    let b = BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        b.is_empty() || b.iter().any(|&(lo, hi)| lo <= start && end <= hi),
        "global access of {bytes} bytes at {ptr:p} outside every live buffer"
    );
}

struct PoisonOnPanic<'a>(&'a Block);

impl Drop for PoisonOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poison.store(true, Relaxed);
        }
    }
}

fn panic_text(e: &(dyn core::any::Any + Send)) -> String {
    if let Some(s) = e.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Run `kernel` over `grid` blocks of `threads` threads with `smem_bytes` of dynamic shared
/// memory, the parameter struct at `params` (of `kernel.params` bytes). Returns the first
/// failure of a thread (a panic: a failed bounds or alignment check, a trap, a deadlock).
///
/// # Safety
/// `params` points at a parameter struct of `kernel`'s type whose pointers refer to live host
/// memory of the sizes the kernel's contract requires.
pub unsafe fn launch(
    kernel: &EmuKernel,
    grid: (u32, u32, u32),
    threads: u32,
    smem_bytes: usize,
    params: *const u8,
) -> Result<(), String> {
    if threads == 0 || !threads.is_multiple_of(32) || threads > kernel.threads {
        return Err(format!(
            "{}: {threads} threads per block (bound {}, whole warps only)",
            kernel.name, kernel.threads
        ));
    }
    let smem_end = DYN_BASE as usize + smem_bytes;
    let params_addr = params as usize;
    for bz in 0..grid.2 {
        for by in 0..grid.1 {
            for bx in 0..grid.0 {
                // Poisoned (all bits set: NaN as f32, bf16 and f16), as the device's shared
                // memory holds garbage: a read of shared memory nobody wrote shows.
                let mut buffer: Vec<u128> = vec![u128::MAX; smem_end.div_ceil(16)];
                let state = Block {
                    smem: buffer.as_mut_ptr() as *mut u8,
                    smem_end: smem_end as u32,
                    barrier: Barrier::new(threads),
                    warps: (0..threads / 32)
                        .map(|_| Warp {
                            slots: (0..32)
                                .map(|_| core::array::from_fn(|_| AtomicU32::new(0)))
                                .collect(),
                            barrier: Barrier::new(32),
                        })
                        .collect(),
                    poison: AtomicBool::new(false),
                    last_store: (0..smem_end).map(|_| AtomicU64::new(0)).collect(),
                    last_load: (0..smem_end).map(|_| AtomicU64::new(0)).collect(),
                    hazard: Mutex::new(None),
                };
                let state_ref = &state;
                let failures: Vec<String> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..threads)
                        .map(|tid| {
                            std::thread::Builder::new()
                                .stack_size(8 << 20)
                                .spawn_scoped(s, move || {
                                    EPOCH.with(|e| e.set(0));
                                    CTX.with(|c| {
                                        c.set(Some(Ctx {
                                            tid,
                                            block: (bx, by, bz),
                                            block_dim: threads,
                                            grid,
                                            block_state: state_ref as *const Block,
                                        }))
                                    });
                                    let _guard = PoisonOnPanic(state_ref);
                                    // SAFETY: forwarded to the caller (parameter struct contract).
                                    unsafe { (kernel.run)(params_addr as *const u8) };
                                    let pending = crate::arch::cp_async::pending_at_exit();
                                    assert!(
                                        pending == 0,
                                        "thread {tid} exited with {pending} cp.async copies \
                                         never waited for"
                                    );
                                })
                                .expect("spawning an emulated thread")
                        })
                        .collect();
                    handles
                        .into_iter()
                        .filter_map(|h| h.join().err().map(|e| panic_text(&*e)))
                        .collect()
                });
                drop(buffer);
                let hazard = state
                    .hazard
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                if let Some(h) = hazard.filter(|_| failures.is_empty()) {
                    return Err(format!("{} block ({bx}, {by}, {bz}): {h}", kernel.name));
                }
                if let Some(first) = failures
                    .iter()
                    .find(|f| !f.starts_with("emulated block aborted"))
                    .or(failures.first())
                {
                    return Err(format!("{} block ({bx}, {by}, {bz}): {first}", kernel.name));
                }
            }
        }
    }
    Ok(())
}
