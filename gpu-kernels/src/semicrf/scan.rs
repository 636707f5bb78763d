//! `semicrf_scan`: the forward (alpha) and reverse (beta) scans with checkpoints.
//!
//! # Parameters
//! [`ScanParams`]: cumulative scores `S [B, T + 1, C]`, `dur [K, C]`, `trans [C, C]`,
//! `lengths [B]` (each in `1..=T`), outputs log Z and the checkpoints (layouts in the struct's
//! docs). Grid `(B, directions)`: block `(b, y)` scans sequence `b` in direction
//! `first_direction + y` (0 forward, 1 reverse), so a fused forward+backward runs both scans
//! of every sequence concurrently in one launch.
//!
//! # Tiling
//! One block owns one (sequence, direction) for the whole scan: its state (the ring of the last
//! K Q rows, `[C][K]`), the tables (`dur` and `trans`, oriented for the direction) and the
//! current P row stay in shared memory; nothing goes back to global memory per step except the
//! checkpoints every `S` positions. Cumulative scores are staged `CHUNK` rows at a time into a
//! double buffer with `cp.async` one chunk ahead.
//!
//! # Thread mapping
//! `THREADS` threads; thread `tid` works for label `tid / G` (`G = lanes_per_label(K, C)`,
//! see [`super::Sweep`]): in phase A on durations `k ≡ tid + 1 (mod G)`, in phase B on previous
//! labels `c_in ≡ tid (mod G)`, reduced by butterflies within the label's group of `G` lanes.
//! Copies of the ring (checkpoints) and rebases partition the ring's `K C` entries by
//! `e ≡ tid (mod THREADS)`, the same partition for both.
//!
//! # Barrier protocol (all barriers are `bar.sync 0`, reached uniformly by the whole block)
//! - Setup: every thread stores its share of the tables and `-inf` into its ring entries, issues
//!   `cp.async` for chunk 0 and waits for its own copies; barrier B0 publishes all of it.
//! - Step `r`: phase A reads ring rows `r - K..r` and `dur`; the group leader stores P;
//!   barrier B1 publishes P. Phase B reads P and `trans`; the leader stores Q into ring slot
//!   `r % K` (read last by phase A of this step as age K, before B1) and into `qrow`;
//!   barrier B2 publishes them. (Step 0 in reverse has only B2.)
//! - Checkpoint after B2 of a step at a multiple of `S`: each thread copies its own ring entries
//!   (nobody writes the ring before the next step's B1), the leader copies its P value from its
//!   register, thread 0 the normalizer.
//! - Chunk end (`(r + 1) % CHUNK == 0`, `r < L`): each thread waits for its `cp.async` group of
//!   the next chunk (issued at the chunk's start into the buffer last read before the previous
//!   chunk-end barrier), reads `qrow` (published by B2) and subtracts its maximum from its own
//!   ring entries (the same entries it copied to a checkpoint, so no cross-thread hazard);
//!   barrier B3 publishes the rebased ring and the staged rows.
//! - End: warp 0 reads P (forward) or Q and the staged `S[0]` (reverse), published by the last
//!   B2, and thread 0 writes log Z.

use super::{Step, Sweep};
use crate::arch::{cp_async, index, smem, sync};
use kernel_abi::semicrf::{CHUNK, ScanParams, THREADS, scan_layout};

/// See the module documentation.
///
/// # Safety
/// Launched as documented on [`ScanParams`] (grid `(B, 1 or 2)` with `first_direction + 1 <= 2`
/// rows, `THREADS` threads, `scan_layout(k, c).bytes` of shared memory), with every pointer
/// holding its documented size and lengths in `1..=T`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn semicrf_scan(p: ScanParams) {
    crate::launch_bounds!(semicrf_scan in kernel_abi::semicrf::KERNELS);
    let b = index::block_idx_x();
    let reverse = p.first_direction + index::block_idx_y() == 1;
    let (k, c) = (p.k, p.c);
    // SAFETY: b < B (grid), lengths holds B values.
    let len = unsafe { *p.lengths.add(b as usize) };
    let base = smem::aligned_base();
    let lay = scan_layout(k, c);
    let sw = Sweep::new(
        k,
        c,
        p.lanes,
        base + lay.dur as u32,
        base + lay.trans as u32,
        base + lay.ring as u32,
        base + lay.prow as u32,
        base + lay.qrow as u32,
    );
    let srows = smem::SmemArray::<f32>::new(base + lay.srows as u32, 2 * CHUNK * c);
    let sgn = if reverse { -1.0f64 } else { 1.0 };
    let row_len = (p.t_max + 1) as usize * c as usize;
    // SAFETY: b < B, so the sequence's rows lie inside cumsum.
    let seq = unsafe { p.cumsum.add(b as usize * row_len) };
    let pos = |r: u32| if reverse { len - r } else { r };

    // Stage the S rows of steps chunk * CHUNK .. + CHUNK (those <= L) into buffer chunk % 2.
    let stage = |chunk: u32| {
        let buf = (chunk % 2) * CHUNK * c;
        let mut e = sw.tid;
        while e < CHUNK * c {
            let r = chunk * CHUNK + e / c;
            if r <= len {
                let src = pos(r) as usize * c as usize + (e % c) as usize;
                // SAFETY: pos(r) <= L <= T and e % c < C: inside the sequence's rows; the
                // destination is inside the staging buffers; both 4-byte aligned.
                unsafe { cp_async::copy_4(srows.addr_of(buf + e), seq.add(src) as *const u8) };
            }
            e += THREADS;
        }
        cp_async::commit_group();
    };

    // SAFETY: dur and trans hold K C and C C values; nothing reads the tables before B0.
    unsafe {
        sw.load_dur(p.dur);
        sw.load_trans(p.trans, reverse);
        sw.clear_ring();
    }
    stage(0);
    cp_async::wait_all();
    // SAFETY: B0, reached by every thread once.
    unsafe { sync::sync_threads() };

    let nseg = p.nseg as usize;
    let mut norm = 0.0f64;
    let mut r = 0u32;
    loop {
        if r.is_multiple_of(CHUNK) {
            stage(r / CHUNK + 1);
        }
        let row = (r / CHUNK % 2) * CHUNK * c + (r % CHUNK) * c;
        let s = if sw.valid {
            // SAFETY: row + label < 2 CHUNK C; the row was staged and published.
            unsafe { srows.load(row + sw.label) as f64 }
        } else {
            0.0
        };
        // SAFETY: uniform calls; the barrier protocol of the module docs holds.
        let st: Step = unsafe {
            if r == 0 {
                if reverse {
                    sw.first_reverse(s)
                } else {
                    sw.first_forward::<false>(s)
                }
            } else {
                sw.step::<false, false>(r, s, sgn)
            }
        };
        let at = pos(r);
        if at.is_multiple_of(p.ckpt) && (!reverse || at >= p.ckpt) {
            let j = if reverse {
                at / p.ckpt - 1
            } else {
                at / p.ckpt
            } as usize;
            let seg = b as usize * nseg + j;
            // Rows per checkpoint: K ring rows, plus the alpha row in the forward direction.
            let (ckpt, norms, stride) = if reverse {
                (p.beta_ckpt, p.beta_norm, k as usize)
            } else {
                (p.alpha_ckpt, p.alpha_norm, k as usize + 1)
            };
            sw.for_owned_ring(r, |e, label, age| {
                let dst = (seg * stride + age as usize) * c as usize + label as usize;
                // SAFETY: j < nseg (at <= L <= T), age < K, label < C: inside the checkpoint
                // array; e < K C is this thread's own ring entry (published by B2).
                unsafe { *ckpt.add(dst) = sw.ring.load(e) };
            });
            if !reverse && sw.leader() {
                let dst = (seg * stride + k as usize) * c as usize + sw.label as usize;
                // SAFETY: row K of the checkpoint, label < C.
                unsafe { *ckpt.add(dst) = st.p };
            }
            if sw.tid == 0 {
                // SAFETY: seg < B nseg.
                unsafe { *norms.add(seg) = norm };
            }
        }
        if r == len {
            break;
        }
        if (r + 1).is_multiple_of(CHUNK) {
            cp_async::wait_all();
            // SAFETY: qrow published by B2; the thread's own ring entries.
            let d = unsafe { sw.rebase(r) };
            // SAFETY: B3, uniform (r and len are block-uniform).
            unsafe { sync::sync_threads() };
            norm += d;
        }
        r += 1;
    }
    cp_async::wait_all();

    // log Z: forward lse_c alpha[L, c]; reverse lse_c (w[0, c] - S[0, c]) (alpha[0, .] = 0).
    let row = (len / CHUNK % 2) * CHUNK * c + (len % CHUNK) * c;
    // SAFETY: warp 0 (and the others, unused) read P/Q and S rows published by the last B2.
    let (lse, _) = unsafe {
        sw.lse_labels::<false>(|i| {
            if reverse {
                sw.qrow.load(i) - srows.load(row + i) as f64
            } else {
                sw.prow.load(i)
            }
        })
    };
    if sw.tid == 0 {
        let z = norm + lse;
        let d = reverse as usize;
        // SAFETY: b < B; log_z64 holds 2 B values, log_z B.
        unsafe {
            *p.log_z64.add(d * p.batch as usize + b as usize) = z;
            if !reverse {
                *p.log_z.add(b as usize) = z as f32;
            }
        }
    }
}
