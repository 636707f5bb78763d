//! Semi-Markov CRF: forward (log partition), Viterbi and backward (marginals and gradients)
//! with checkpointing. The semantics are specified by the f64 reference in
//! `host/src/semicrf/reference.rs`; this module holds what kernels and host share.
//!
//! # Kernels
//! - `semicrf_scan`: one block per (sequence, direction). Direction 0 is the forward (alpha)
//!   scan: log Z and the alpha checkpoints. Direction 1 is the reverse (beta) scan: the beta
//!   checkpoints. A fused forward+backward launches both directions in one grid.
//! - `semicrf_viterbi`: the forward scan in the max semiring, with backpointers and traceback.
//! - `semicrf_marginals`: one block per (checkpoint segment, sequence): recomputes alpha and
//!   beta inside its segment from the two checkpoints into its own shared memory, then writes
//!   the marginals, the gradient with respect to the cumulative scores, and its partial
//!   expected counts of durations and transitions.
//! - `semicrf_reduce`: sums the partial counts over segments and sequences in a fixed order.
//!
//! # Precision
//! The scans carry their state (the ring, the P and Q rows, their log-sum-exps) in f64 with an
//! accurate f64 `exp`/`ln`: a scan is a chain of up to ~1e5 dependent steps, and the marginals
//! combine a forward and a reverse scan, so their errors must not accumulate (in f32 the two
//! directions drift apart by ~1e-2 in log space at T = 1e5, and every marginal with them).
//! The checkpoints are f64. The per-position rows that `semicrf_marginals` keeps in shared
//! memory are f32, stored relative to a per-position f64 shift that makes them small (so their
//! rounding is ~1e-7 relative); the combination forms its exponents in f64 and evaluates one f32
//! exponential per marginal.
//!
//! # Memory (device)
//! With `nseg = T / S + 1` checkpoint segments of `S` positions, the workspace is
//! `B nseg ((2K + 1) C + 2) f64` for the checkpoints plus `B nseg (K C + C^2)` f64 partial
//! counts, i.e. O(B (T / S) K C); the per-segment recomputation lives in on-chip shared memory,
//! O(S C + K C + C^2) per resident block (see [`segment_layout`]). Inputs and outputs are
//! `B (T + 1) C` f32 each for the cumulative scores and their gradient.

use crate::{Kernel, KernelDecl, SMEM_ALIGN, align_up};

/// Threads per block of every semi-CRF kernel.
pub const THREADS: u32 = 128;
/// Largest number of labels.
pub const MAX_C: u32 = 64;
/// Rows of cumulative scores staged per chunk by the scan, and the interval (in steps) at which
/// a scan subtracts its running maximum from the live state (rebase, see the kernels' docs).
pub const CHUNK: u32 = 16;
/// Dynamic shared memory a semi-CRF kernel may use (fits every sm_80+ GPU's opt-in limit, with
/// room for two blocks per SM on A100/H100).
pub const SMEM_BUDGET: usize = 96 * 1024;
/// Threads per block of `semicrf_reduce`.
pub const REDUCE_THREADS: u32 = 128;

/// Labels rounded up to a power of two, at least 4.
pub const fn padded_labels(c: u32) -> u32 {
    let p = c.next_power_of_two();
    if p < 4 { 4 } else { p }
}

/// Largest power of two `<= x` (1 for 0).
pub const fn pow2_floor(x: u32) -> u32 {
    if x <= 1 {
        1
    } else {
        1 << (31 - x.leading_zeros())
    }
}

/// Threads that cooperate on one label (`G`): a power of two dividing 32, with
/// `padded_labels(c) * G <= THREADS`. Thread `tid` works for label `tid / G` (labels `>= C` are
/// padding) on the terms `i` with `i % G == tid % G` of each reduction (durations, or previous
/// labels); `G` grows with `max(K, C)` so each thread has a few terms.
pub const fn lanes_per_label(k: u32, c: u32) -> u32 {
    let cap = THREADS / padded_labels(c);
    let want = pow2_floor(if k > c { k } else { c } / 2);
    if want < cap { want } else { cap }
}

/// Checkpoint segments of a sequence of `t` positions with interval `ckpt`: positions
/// `0..=t` are split into `[j ckpt, (j + 1) ckpt)`.
pub const fn num_segments(t: u32, ckpt: u32) -> u32 {
    t / ckpt + 1
}

/// Integer square root (floor).
pub const fn isqrt(x: u64) -> u64 {
    if x < 2 {
        return x;
    }
    let mut lo = 1u64;
    let mut hi = if x < (1 << 32) { x } else { 1 << 32 };
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if mid <= x / mid {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    lo
}

/// Shared-memory layout of `semicrf_scan` and `semicrf_viterbi` (byte offsets from the aligned
/// base; label-major, so a label's terms are contiguous; the f64 state first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanLayout {
    /// The ring of the last K rows, `ring[c][step % K]`, `[C][K]` f64.
    pub ring: usize,
    /// The current "P" row (alpha, or g in reverse), `[C]` f64.
    pub prow: usize,
    /// A copy of the newest ring row, `[C]` f64.
    pub qrow: usize,
    /// `dur[c][k - 1]`, `[C][K]` f32.
    pub dur: usize,
    /// `m[c][c_in]`, `[C][C]` f32: `trans[c_in][c]` (forward) or `trans[c][c_in]` (reverse).
    pub trans: usize,
    /// Staged cumulative scores, two buffers of `[CHUNK][C]` f32.
    pub srows: usize,
    /// Total, including the `SMEM_ALIGN` slack.
    pub bytes: usize,
}

/// The layout of [`ScanLayout`] for `k` durations and `c` labels.
pub const fn scan_layout(k: u32, c: u32) -> ScanLayout {
    let (k, c) = (k as usize, c as usize);
    let ring = 0;
    let prow = ring + 8 * k * c;
    let qrow = prow + 8 * c;
    let dur = qrow + 8 * c;
    let trans = dur + 4 * k * c;
    let srows = trans + 4 * c * c;
    let end = srows + 4 * 2 * CHUNK as usize * c;
    ScanLayout {
        ring,
        prow,
        qrow,
        dur,
        trans,
        srows,
        bytes: align_up(end, 16) + SMEM_ALIGN,
    }
}

/// Shared-memory layout of `semicrf_marginals` for interval `s`, `k` durations, `c` labels.
/// f64 arrays first (8-byte alignment), then f32 arrays. The f32 rows of a position hold
/// values relative to that position's f64 normalizer (`norm_a`, `norm_b`), which includes a
/// shift that makes them small (see the kernel's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentLayout {
    /// Normalizers of the alpha and u rows, `[S]` f64.
    pub norm_a: usize,
    /// Normalizers of the beta rows, `[S + K]` f64 (positions `s0 .. s0 + S + K`).
    pub norm_b: usize,
    /// Expected duration counts of this segment, `[C][K]` f64.
    pub dur_acc: usize,
    /// Expected transition counts of this segment, `[C (to)][C (from)]` f64.
    pub trans_acc: usize,
    /// As in [`ScanLayout`]: `[C][K]` f64 ring of the sweep in progress.
    pub ring: usize,
    /// `[C]` f64 current P row.
    pub prow: usize,
    /// `[C]` f64 newest ring row.
    pub qrow: usize,
    /// As in [`ScanLayout`]: `[C][K]` f32 durations.
    pub dur: usize,
    /// `[C][C]` f32 transitions (orientation of the sweep in progress).
    pub trans: usize,
    /// Cumulative scores of positions `s0 .. s0 + S + K`, `[S + K][C]` f32.
    pub srows: usize,
    /// alpha rows, `[S][C]` f32.
    pub alpha: usize,
    /// u rows (`u[s, c] = lse_c' alpha[s, c'] + trans[c', c]`), `[S][C]` f32.
    pub u: usize,
    /// beta rows, `[C][S + K]` f32 (label-major).
    pub beta: usize,
    /// Total, including the `SMEM_ALIGN` slack.
    pub bytes: usize,
}

/// The layout of [`SegmentLayout`].
pub const fn segment_layout(s: u32, k: u32, c: u32) -> SegmentLayout {
    let (s, k, c) = (s as usize, k as usize, c as usize);
    let norm_a = 0;
    let norm_b = norm_a + 8 * s;
    let dur_acc = norm_b + 8 * (s + k);
    let trans_acc = dur_acc + 8 * k * c;
    let ring = trans_acc + 8 * c * c;
    let prow = ring + 8 * k * c;
    let qrow = prow + 8 * c;
    let dur = qrow + 8 * c;
    let trans = dur + 4 * k * c;
    let srows = trans + 4 * c * c;
    let alpha = srows + 4 * (s + k) * c;
    let u = alpha + 4 * s * c;
    let beta = u + 4 * s * c;
    let end = beta + 4 * c * (s + k);
    SegmentLayout {
        norm_a,
        norm_b,
        dur_acc,
        trans_acc,
        ring,
        prow,
        qrow,
        dur,
        trans,
        srows,
        alpha,
        u,
        beta,
        bytes: align_up(end, 16) + SMEM_ALIGN,
    }
}

/// The largest checkpoint interval whose segment workspace fits [`SMEM_BUDGET`] (0 if none).
pub const fn max_checkpoint(k: u32, c: u32) -> u32 {
    if segment_layout(1, k, c).bytes > SMEM_BUDGET {
        return 0;
    }
    let (mut lo, mut hi) = (1u32, 1u32 << 16);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if segment_layout(mid, k, c).bytes <= SMEM_BUDGET {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    lo
}

/// The default checkpoint interval: `round(sqrt(T K))`, at most `T` and at most
/// [`max_checkpoint`] (0 if no interval fits).
pub const fn default_checkpoint(t: u32, k: u32, c: u32) -> u32 {
    let cap = max_checkpoint(k, c);
    let tk = t as u64 * k as u64;
    let r = isqrt(4 * tk);
    let mut s = r.div_ceil(2);
    if s < 1 {
        s = 1;
    }
    if s > t as u64 {
        s = t as u64;
    }
    if s > cap as u64 { cap } else { s as u32 }
}

/// The problem sizes the shared memory of `semicrf_scan` and `semicrf_viterbi` depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanShape {
    /// Largest duration `K`.
    pub k: u32,
    /// Labels `C`.
    pub c: u32,
}

/// The problem sizes the shared memory of `semicrf_marginals` depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentShape {
    /// Checkpoint interval `S`.
    pub ckpt: u32,
    /// Largest duration `K`.
    pub k: u32,
    /// Labels `C`.
    pub c: u32,
}

/// `semicrf_scan`: one block per (sequence, direction), [`THREADS`] threads,
/// [`scan_layout`] of shared memory.
pub const SEMICRF_SCAN: Kernel<ScanParams, ScanShape> =
    Kernel::new("semicrf_scan", THREADS, 1, |s| scan_layout(s.k, s.c).bytes);

/// `semicrf_viterbi`: one block per sequence, [`THREADS`] threads, [`scan_layout`] of shared
/// memory.
pub const SEMICRF_VITERBI: Kernel<ViterbiParams, ScanShape> =
    Kernel::new("semicrf_viterbi", THREADS, 1, |s| {
        scan_layout(s.k, s.c).bytes
    });

/// `semicrf_marginals`: one block per (checkpoint segment, sequence), [`THREADS`] threads,
/// [`segment_layout`] of shared memory.
pub const SEMICRF_MARGINALS: Kernel<MarginalParams, SegmentShape> =
    Kernel::new("semicrf_marginals", THREADS, 1, |s| {
        segment_layout(s.ckpt, s.k, s.c).bytes
    });

/// `semicrf_reduce`: one thread per partial count, [`REDUCE_THREADS`] threads per block, no
/// shared memory.
pub const SEMICRF_REDUCE: Kernel<ReduceParams> =
    Kernel::new("semicrf_reduce", REDUCE_THREADS, 1, |()| 0);

/// The family's kernels.
pub const KERNELS: &[KernelDecl] = &[
    SEMICRF_SCAN.info(),
    SEMICRF_VITERBI.info(),
    SEMICRF_MARGINALS.info(),
    SEMICRF_REDUCE.info(),
];

/// `negative_semicrf_marginals_aliased`: `semicrf_marginals` with two segments writing one
/// `partials` slice, a negative control for the test suites (`gpu-kernels/src/negative.rs`);
/// the launch shape of [`SEMICRF_MARGINALS`].
pub const NEGATIVE_SEMICRF_MARGINALS_ALIASED: Kernel<MarginalParams, SegmentShape> =
    Kernel::new("negative_semicrf_marginals_aliased", THREADS, 1, |s| {
        segment_layout(s.ckpt, s.k, s.c).bytes
    });

/// The family's negative controls (never launched by the library).
pub const NEGATIVE: &[KernelDecl] = &[NEGATIVE_SEMICRF_MARGINALS_ALIASED.info()];

/// Reduced partial counts per (sequence, segment): `K C` duration counts then `C C` transition
/// counts.
pub const fn partial_len(k: u32, c: u32) -> usize {
    (k * c + c * c) as usize
}

/// Parameters of `semicrf_scan` (grid `(B, directions)`, [`THREADS`] threads,
/// `scan_layout(k, c).bytes` of shared memory).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ScanParams {
    /// Cumulative scores `S [B, T + 1, C]` f32.
    pub cumsum: *const f32,
    /// Duration scores `[K, C]` (row `k - 1` for duration `k`).
    pub dur: *const f32,
    /// Transition scores `[C (from), C (to)]`.
    pub trans: *const f32,
    /// Lengths `[B]`, each in `1..=T`.
    pub lengths: *const u32,
    /// `[B]` log Z (f32), written by direction 0.
    pub log_z: *mut f32,
    /// `[2, B]` log Z in f64: row `d` written by direction `d` (row 1 is a consistency check).
    pub log_z64: *mut f64,
    /// `[B, nseg, K + 1, C]` f64: for segment `j` with `j S <= L`, rows `i < K` hold the ring
    /// value (`u - S`) at position `j S - i`, row `K` alpha at `j S` (all relative to the
    /// normalizer).
    pub alpha_ckpt: *mut f64,
    /// `[B, nseg]` f64 normalizer of each alpha checkpoint.
    pub alpha_norm: *mut f64,
    /// `[B, nseg, K, C]` f64: for segment `j` with `(j + 1) S <= L`, row `i` holds `S + beta`
    /// at position `(j + 1) S + i` (relative to the normalizer).
    pub beta_ckpt: *mut f64,
    /// `[B, nseg]` f64 normalizer of each beta checkpoint.
    pub beta_norm: *mut f64,
    /// Sequences `B`.
    pub batch: u32,
    /// Positions `T` (longest sequence).
    pub t_max: u32,
    /// Largest duration `K`.
    pub k: u32,
    /// Labels `C`.
    pub c: u32,
    /// Checkpoint interval `S`.
    pub ckpt: u32,
    /// Segments per sequence, `num_segments(T, S)`.
    pub nseg: u32,
    /// `lanes_per_label(k, c)`.
    pub lanes: u32,
    /// Direction of grid row 0 (0: forward first; 1: reverse only).
    pub first_direction: u32,
}

/// Parameters of `semicrf_marginals` (grid `(nseg, B)`, [`THREADS`] threads,
/// `segment_layout(ckpt, k, c).bytes` of shared memory).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MarginalParams {
    /// As in [`ScanParams`].
    pub cumsum: *const f32,
    /// As in [`ScanParams`].
    pub dur: *const f32,
    /// As in [`ScanParams`].
    pub trans: *const f32,
    /// As in [`ScanParams`].
    pub lengths: *const u32,
    /// `[B]` forward log Z in f64 (row 0 of the scan's `log_z64`).
    pub log_z64: *const f64,
    /// Alpha checkpoints written by the forward scan.
    pub alpha_ckpt: *const f64,
    /// Their normalizers.
    pub alpha_norm: *const f64,
    /// Beta checkpoints written by the reverse scan.
    pub beta_ckpt: *const f64,
    /// Their normalizers.
    pub beta_norm: *const f64,
    /// `[B, T + 1, C]` d log Z_b / d S[b, t, c] (0 past the sequence's length).
    pub grad_cumsum: *mut f32,
    /// `[B, T, K, C]` segment marginals `mu[b, t, k - 1, c]`, or null to skip them.
    pub marginals: *mut f32,
    /// `[B, nseg, partial_len]` f64: expected duration and transition counts per segment.
    pub partials: *mut f64,
    /// As in [`ScanParams`].
    pub batch: u32,
    /// As in [`ScanParams`].
    pub t_max: u32,
    /// As in [`ScanParams`].
    pub k: u32,
    /// As in [`ScanParams`].
    pub c: u32,
    /// As in [`ScanParams`].
    pub ckpt: u32,
    /// As in [`ScanParams`].
    pub nseg: u32,
    /// As in [`ScanParams`].
    pub lanes: u32,
    /// Unused (keeps the struct a multiple of 8 bytes).
    pub pad: u32,
}

/// Parameters of `semicrf_reduce` (grid `ceil(partial_len / REDUCE_THREADS)`,
/// [`REDUCE_THREADS`] threads, no shared memory).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReduceParams {
    /// `[B, nseg, partial_len]` from `semicrf_marginals`.
    pub partials: *const f64,
    /// `[B]` lengths (segment `j` of sequence `b` exists iff `j S <= L_b`).
    pub lengths: *const u32,
    /// `[K, C]` d (sum_b log Z_b) / d dur.
    pub grad_dur: *mut f32,
    /// `[C, C]` d (sum_b log Z_b) / d trans.
    pub grad_trans: *mut f32,
    /// As in [`ScanParams`].
    pub batch: u32,
    /// As in [`ScanParams`].
    pub k: u32,
    /// As in [`ScanParams`].
    pub c: u32,
    /// As in [`ScanParams`].
    pub ckpt: u32,
    /// As in [`ScanParams`].
    pub nseg: u32,
    /// Unused (keeps the struct a multiple of 8 bytes).
    pub pad: u32,
}

/// Parameters of `semicrf_viterbi` (grid `B`, [`THREADS`] threads, `scan_layout(k, c).bytes`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ViterbiParams {
    /// As in [`ScanParams`].
    pub cumsum: *const f32,
    /// As in [`ScanParams`].
    pub dur: *const f32,
    /// As in [`ScanParams`].
    pub trans: *const f32,
    /// As in [`ScanParams`].
    pub lengths: *const u32,
    /// `[B]` best score.
    pub score: *mut f32,
    /// `[B, T + 1, C]` backpointers: bits 0..16 the best duration of a segment ending at `t`
    /// with label `c`, bits 16..32 the best previous label of a segment starting at `t` with
    /// label `c`.
    pub backptr: *mut u32,
    /// `[B, T]` start of each segment of the best segmentation, in order.
    pub seg_start: *mut u32,
    /// `[B, T]` duration of each segment.
    pub seg_dur: *mut u32,
    /// `[B, T]` label of each segment.
    pub seg_label: *mut u32,
    /// `[B]` number of segments.
    pub seg_count: *mut u32,
    /// As in [`ScanParams`].
    pub batch: u32,
    /// As in [`ScanParams`].
    pub t_max: u32,
    /// As in [`ScanParams`].
    pub k: u32,
    /// As in [`ScanParams`].
    pub c: u32,
    /// As in [`ScanParams`].
    pub lanes: u32,
    /// Unused (keeps the struct a multiple of 8 bytes).
    pub pad: u32,
}
