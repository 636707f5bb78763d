//! Semi-Markov CRF (`gpu-kernels/src/semicrf`): forward (log Z), Viterbi, and backward
//! (segment marginals and gradients) with checkpointing; the f64 reference in [`reference`] is
//! the specification (model, conventions and formulas are documented there).
//!
//! # Use
//! ```text
//! let problem = SemiCrfProblem::new(batch, t, k, c);      // default checkpoint interval
//! let inputs = SemiCrfInputs { cumsum, dur, trans, lengths };
//! let dev = DeviceInputs::upload(&problem, &inputs)?;     // validated here, once
//! let mut state = ForwardState::new(&problem)?;
//! forward_launch(&gpu, &stream, &problem, &dev, &mut state)?;            // log Z
//! let mut grads = Gradients::new(&problem, false)?;
//! backward_launch(&gpu, &stream, &problem, &dev, &mut state, &mut grads)?; // gradients
//! ```
//! or the synchronous [`log_partition`], [`posterior`] and [`viterbi`].
//!
//! # Checkpointing and memory
//! The forward scan keeps the alpha state (the ring of the last K rows and the current alpha
//! row) every `S` positions; the backward runs the reverse scan (beta checkpoints at the same
//! boundaries), then one block per (segment, sequence) recomputes alpha and beta inside its
//! segment, in its own shared memory, and combines them. Device memory:
//!
//! | what | size |
//! |---|---|
//! | inputs | `B (T + 1) C` f32 + `K C + C C` f32 + `B` u32 |
//! | forward state | `B nseg ((2K + 1) C + 2) f64 + B nseg (K C + C C) f64 + 3 B` f64/f32 |
//! | gradients | `B (T + 1) C + K C + C C` f32 (+ `B T K C` f32 marginals if asked for) |
//!
//! with `nseg = T / S + 1`: O(B (T / S) K C) beyond the inputs and outputs, and O(S C + K C +
//! C^2) shared memory per resident block (at most [`kernel_abi::semicrf::SMEM_BUDGET`]). For
//! B = 4, T = 100 000, K = 32, C = 16 the default `S` is 291 (the budget caps `sqrt(T K)` =
//! 1789): 344 segments, 11.5 MB of (f64) checkpoints and 8.5 MB of partial counts (19.9 MB of
//! state), against 25.6 MB for the cumulative scores and 25.6 MB for their gradient
//! ([`SemiCrfProblem::memory`]); 71.1 MB in all for a forward+backward.
//!
//! # Precision
//! The scans run in f64 (state and log-sum-exp), the combination into marginals and gradients
//! in f32 from f64 exponents (see `kernel_abi::semicrf`): log Z is accurate to ~1e-9 relative
//! and every marginal to ~1e-6 relative at any length (T = 100 000 included), so the gradient's
//! identities (`sum_c dlogZ/dS[t, c]` is -1 at 0, +1 at L, 0 between) hold to ~1e-6.

pub mod reference;

use crate::error::{Error, Result};
use crate::gpu::{Gpu, LaunchConfig};
use crate::memory::{download, poisoned, upload};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use kernel_abi::semicrf::{
    self as abi, MAX_C, MarginalParams, REDUCE_THREADS, ReduceParams, ScanParams, THREADS,
    ViterbiParams,
};

pub use reference::Segment;

/// Sizes of a semi-CRF problem and its checkpoint interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SemiCrfProblem {
    /// Sequences B.
    pub batch: usize,
    /// Positions T of the longest sequence (the padded length of the tensors).
    pub t: usize,
    /// Largest segment duration K.
    pub k: usize,
    /// Labels C.
    pub c: usize,
    /// Checkpoint interval S (positions per segment).
    pub checkpoint: usize,
}

/// Device memory of a problem, in bytes (what the launchers allocate; nothing else is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    /// Cumulative scores, `dur`, `trans`, lengths.
    pub inputs: usize,
    /// [`ForwardState`]: log Z, checkpoints, partial counts.
    pub state: usize,
    /// [`Gradients`] without marginals.
    pub gradients: usize,
    /// The optional marginals `[B, T, K, C]`.
    pub marginals: usize,
}

impl MemoryUse {
    /// Inputs, state and gradients (the peak of a forward+backward without marginals).
    pub fn forward_backward(&self) -> usize {
        self.inputs + self.state + self.gradients
    }
}

impl SemiCrfProblem {
    /// A problem with the default checkpoint interval
    /// ([`kernel_abi::semicrf::default_checkpoint`]: `round(sqrt(T K))`, capped so a segment's
    /// workspace fits the shared-memory budget; 0 where nothing fits, which
    /// [`SemiCrfProblem::validate`] rejects).
    pub fn new(batch: usize, t: usize, k: usize, c: usize) -> Self {
        let fits = |x: usize| u32::try_from(x).ok();
        let checkpoint = match (fits(t), fits(k), fits(c)) {
            (Some(t), Some(k), Some(c)) if k <= u16::MAX as u32 && c <= MAX_C => {
                abi::default_checkpoint(t, k, c) as usize
            }
            _ => 1,
        };
        SemiCrfProblem {
            batch,
            t,
            k,
            c,
            checkpoint,
        }
    }

    /// The same problem with checkpoint interval `s`.
    pub fn with_checkpoint(self, s: usize) -> Self {
        SemiCrfProblem {
            checkpoint: s,
            ..self
        }
    }

    /// Check the sizes the kernels support.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [
            ("batch", self.batch),
            ("T", self.t),
            ("K", self.k),
            ("C", self.c),
        ] {
            if v == 0 {
                return Err(Error::invalid(
                    format!("semi-CRF {what}"),
                    "must be at least 1",
                ));
            }
        }
        if self.batch > 65_535 {
            return Err(Error::unsupported(
                format!("semi-CRF batch = {}", self.batch),
                "at most 65535 sequences (grid y)",
            ));
        }
        if self.c > MAX_C as usize {
            return Err(Error::unsupported(
                format!("semi-CRF C = {}", self.c),
                format!("at most {MAX_C} labels"),
            ));
        }
        if self.k > u16::MAX as usize {
            return Err(Error::unsupported(
                format!("semi-CRF K = {}", self.k),
                "at most 65535 (backpointers hold 16 bits)",
            ));
        }
        let elems = self.batch as u128 * (self.t as u128 + 1) * self.c as u128;
        if self.t >= u32::MAX as usize / 2 || elems * self.k as u128 >= 1 << 62 {
            return Err(Error::unsupported(
                format!("semi-CRF T = {}", self.t),
                "too long for 32-bit positions",
            ));
        }
        let (k, c) = (self.k as u32, self.c as u32);
        if abi::scan_layout(k, c).bytes > abi::SMEM_BUDGET {
            return Err(Error::unsupported(
                format!("semi-CRF K = {}, C = {}", self.k, self.c),
                format!(
                    "the scan state (K C ring and tables) needs {} bytes of shared memory; the \
                     budget is {}",
                    abi::scan_layout(k, c).bytes,
                    abi::SMEM_BUDGET
                ),
            ));
        }
        let max = abi::max_checkpoint(k, c) as usize;
        if self.checkpoint == 0 || self.checkpoint > max {
            return Err(Error::invalid(
                "semi-CRF checkpoint interval",
                if max == 0 {
                    format!(
                        "K = {}, C = {}: no segment workspace fits {} bytes of shared memory",
                        self.k,
                        self.c,
                        abi::SMEM_BUDGET
                    )
                } else {
                    format!(
                        "{} is outside 1..={max} (a segment's workspace must fit {} bytes of \
                         shared memory)",
                        self.checkpoint,
                        abi::SMEM_BUDGET
                    )
                },
            ));
        }
        Ok(())
    }

    /// Checkpoint segments per sequence, `T / S + 1`.
    pub fn num_segments(&self) -> usize {
        self.t / self.checkpoint + 1
    }

    /// Threads per label of the kernels' mapping.
    pub fn lanes(&self) -> u32 {
        abi::lanes_per_label(self.k as u32, self.c as u32)
    }

    /// Device memory (see the module docs).
    pub fn memory(&self) -> MemoryUse {
        let (b, t, k, c, n) = (self.batch, self.t, self.k, self.c, self.num_segments());
        MemoryUse {
            inputs: 4 * (b * (t + 1) * c + k * c + c * c + b),
            state: 4 * b
                + 8 * 2 * b
                + 8 * b * n * (2 * k + 1) * c
                + 8 * 2 * b * n
                + 8 * b * n * abi::partial_len(k as u32, c as u32),
            gradients: 4 * (b * (t + 1) * c + k * c + c * c),
            marginals: 4 * b * t * k * c,
        }
    }

    /// The launch shape of each kernel of this problem: `semicrf_scan` (both directions in one
    /// launch, the largest grid), `semicrf_marginals`, `semicrf_reduce`, `semicrf_viterbi`,
    /// with the size of its parameter struct. The launchers use these shapes; tests check them
    /// against the PTX and the device limits without a GPU ([`crate::gpu::check_launch`]).
    pub fn launches(&self) -> [(&'static str, usize, LaunchConfig); 4] {
        use std::mem::size_of;
        [
            (
                "semicrf_scan",
                size_of::<ScanParams>(),
                scan_config(self, 2),
            ),
            (
                "semicrf_marginals",
                size_of::<MarginalParams>(),
                marginals_config(self),
            ),
            (
                "semicrf_reduce",
                size_of::<ReduceParams>(),
                reduce_config(self),
            ),
            (
                "semicrf_viterbi",
                size_of::<ViterbiParams>(),
                viterbi_config(self),
            ),
        ]
    }

    /// Element-operations of one scan step summed over positions (`B T (K C + C^2)`, the
    /// factored recurrence), for rates.
    pub fn scan_terms(&self) -> f64 {
        (self.batch * self.t) as f64 * (self.k * self.c + self.c * self.c) as f64
    }
}

/// Host inputs of a problem.
#[derive(Clone, Copy, Debug)]
pub struct SemiCrfInputs<'a> {
    /// Cumulative scores `S [B, T + 1, C]` (`S[b, 0, .]` is usually 0; see
    /// [`cumulative_scores`]). Precision: the kernels use these f32 values exactly (every
    /// `S[t + k] - S[t]` is formed in f64), but an f32 cumulative sum rounds to `ulp(|S|)`
    /// when it is built, so scores with a large mean lose precision there; centre the scores.
    pub cumsum: &'a [f32],
    /// Duration scores `[K, C]`, row `k - 1` for duration `k`.
    pub dur: &'a [f32],
    /// Transition scores `[C (from), C (to)]`.
    pub trans: &'a [f32],
    /// Sequence lengths `[B]`, each in `1..=T`.
    pub lengths: &'a [u32],
}

impl SemiCrfInputs<'_> {
    /// Shapes, lengths in `1..=T`, and finite values.
    pub fn validate(&self, problem: &SemiCrfProblem) -> Result<()> {
        problem.validate()?;
        let (b, t, k, c) = (problem.batch, problem.t, problem.k, problem.c);
        for (what, expected, got) in [
            (
                "cumulative scores [B, T + 1, C]",
                b * (t + 1) * c,
                self.cumsum.len(),
            ),
            ("duration scores [K, C]", k * c, self.dur.len()),
            ("transition scores [C, C]", c * c, self.trans.len()),
            ("lengths [B]", b, self.lengths.len()),
        ] {
            if expected != got {
                return Err(Error::shape(what, format!("{expected} elements"), got));
            }
        }
        if let Some((i, &l)) = self
            .lengths
            .iter()
            .enumerate()
            .find(|(_, l)| **l == 0 || **l as usize > t)
        {
            return Err(Error::invalid(
                "semi-CRF lengths",
                format!("lengths[{i}] = {l} is outside 1..={t}"),
            ));
        }
        for (what, v) in [
            ("cumulative scores", self.cumsum),
            ("duration scores", self.dur),
            ("transition scores", self.trans),
        ] {
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(Error::invalid(
                    format!("semi-CRF {what}"),
                    format!("element {i} is {} (every score must be finite)", v[i]),
                ));
            }
        }
        Ok(())
    }
}

/// `S [B, T + 1, C]` from per-position scores `[B, T, C]`: `S[b, 0, c] = 0`,
/// `S[b, t + 1, c] = S[b, t, c] + scores[b, t, c]`, summed in f64 and rounded once.
pub fn cumulative_scores(scores: &[f32], batch: usize, t: usize, c: usize) -> Result<Vec<f32>> {
    if scores.len() != batch * t * c {
        return Err(Error::shape(
            "scores [B, T, C]",
            format!("{} elements", batch * t * c),
            scores.len(),
        ));
    }
    let mut out = vec![0.0f32; batch * (t + 1) * c];
    for b in 0..batch {
        for ci in 0..c {
            let mut acc = 0.0f64;
            for ti in 0..t {
                acc += scores[(b * t + ti) * c + ci] as f64;
                out[(b * (t + 1) + ti + 1) * c + ci] = acc as f32;
            }
        }
    }
    Ok(out)
}

/// Validated inputs on the device (built only by [`DeviceInputs::upload`], so the kernels can
/// trust the lengths).
pub struct DeviceInputs {
    problem: SemiCrfProblem,
    cumsum: DeviceBuffer<f32>,
    dur: DeviceBuffer<f32>,
    trans: DeviceBuffer<f32>,
    lengths: DeviceBuffer<u32>,
}

impl DeviceInputs {
    /// Validate `inputs` for `problem` and copy them to the device.
    pub fn upload(problem: &SemiCrfProblem, inputs: &SemiCrfInputs) -> Result<DeviceInputs> {
        inputs.validate(problem)?;
        Ok(DeviceInputs {
            problem: *problem,
            cumsum: upload(inputs.cumsum)?,
            dur: upload(inputs.dur)?,
            trans: upload(inputs.trans)?,
            lengths: upload(inputs.lengths)?,
        })
    }

    /// The cumulative scores on the device.
    pub fn cumsum(&self) -> &DeviceBuffer<f32> {
        &self.cumsum
    }
}

fn ptr<T: cust::memory::DeviceCopy>(buf: &DeviceBuffer<T>) -> u64 {
    buf.as_device_ptr().as_raw()
}

/// What the forward keeps for the backward: log Z and the checkpoints (device buffers, made
/// for one problem).
pub struct ForwardState {
    problem: SemiCrfProblem,
    log_z: DeviceBuffer<f32>,
    log_z64: DeviceBuffer<f64>,
    alpha_ckpt: DeviceBuffer<f64>,
    alpha_norm: DeviceBuffer<f64>,
    beta_ckpt: DeviceBuffer<f64>,
    beta_norm: DeviceBuffer<f64>,
    partials: DeviceBuffer<f64>,
}

impl ForwardState {
    /// Buffers for `problem`, poisoned (NaN) so that a read of an unwritten element shows.
    pub fn new(problem: &SemiCrfProblem) -> Result<ForwardState> {
        problem.validate()?;
        let (b, k, c, n) = (problem.batch, problem.k, problem.c, problem.num_segments());
        Ok(ForwardState {
            problem: *problem,
            log_z: poisoned(b)?,
            log_z64: poisoned(2 * b)?,
            alpha_ckpt: poisoned(b * n * (k + 1) * c)?,
            alpha_norm: poisoned(b * n)?,
            beta_ckpt: poisoned(b * n * k * c)?,
            beta_norm: poisoned(b * n)?,
            partials: poisoned(b * n * abi::partial_len(k as u32, c as u32))?,
        })
    }

    /// log Z per sequence (f32, written by the forward).
    pub fn log_z(&self) -> &DeviceBuffer<f32> {
        &self.log_z
    }

    /// log Z per sequence from the forward and from the reverse scan (f64; the reverse one is
    /// written by a backward or fused launch and is a consistency check).
    pub fn log_z_both(&self) -> Result<(Vec<f64>, Vec<f64>)> {
        let v = download(&self.log_z64)?;
        let b = self.problem.batch;
        Ok((v[..b].to_vec(), v[b..].to_vec()))
    }
}

/// Outputs of the backward (device buffers for one problem, poisoned at creation).
pub struct Gradients {
    problem: SemiCrfProblem,
    /// `[B, T + 1, C]` d log Z_b / d S.
    pub grad_cumsum: DeviceBuffer<f32>,
    /// `[K, C]` d (sum_b log Z_b) / d dur.
    pub grad_dur: DeviceBuffer<f32>,
    /// `[C, C]` d (sum_b log Z_b) / d trans.
    pub grad_trans: DeviceBuffer<f32>,
    /// `[B, T, K, C]` segment marginals, when asked for.
    pub marginals: Option<DeviceBuffer<f32>>,
}

impl Gradients {
    /// Buffers for `problem`, with the `[B, T, K, C]` marginals if `marginals`.
    pub fn new(problem: &SemiCrfProblem, marginals: bool) -> Result<Gradients> {
        problem.validate()?;
        let (b, t, k, c) = (problem.batch, problem.t, problem.k, problem.c);
        Ok(Gradients {
            problem: *problem,
            grad_cumsum: poisoned(b * (t + 1) * c)?,
            grad_dur: poisoned(k * c)?,
            grad_trans: poisoned(c * c)?,
            marginals: if marginals {
                Some(poisoned(b * t * k * c)?)
            } else {
                None
            },
        })
    }
}

fn same_problem(what: &str, expected: &SemiCrfProblem, got: &SemiCrfProblem) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::shape(
            what,
            format!("{expected:?}"),
            format!("{got:?}"),
        ))
    }
}

fn scan_params(
    p: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &ForwardState,
    first: u32,
) -> ScanParams {
    ScanParams {
        cumsum: ptr(&inputs.cumsum) as *const f32,
        dur: ptr(&inputs.dur) as *const f32,
        trans: ptr(&inputs.trans) as *const f32,
        lengths: ptr(&inputs.lengths) as *const u32,
        log_z: ptr(&state.log_z) as *mut f32,
        log_z64: ptr(&state.log_z64) as *mut f64,
        alpha_ckpt: ptr(&state.alpha_ckpt) as *mut f64,
        alpha_norm: ptr(&state.alpha_norm) as *mut f64,
        beta_ckpt: ptr(&state.beta_ckpt) as *mut f64,
        beta_norm: ptr(&state.beta_norm) as *mut f64,
        batch: p.batch as u32,
        t_max: p.t as u32,
        k: p.k as u32,
        c: p.c as u32,
        ckpt: p.checkpoint as u32,
        nseg: p.num_segments() as u32,
        lanes: p.lanes(),
        first_direction: first,
    }
}

/// `semicrf_scan` over `directions` (1 or 2): one block per (sequence, direction).
fn scan_config(p: &SemiCrfProblem, directions: u32) -> LaunchConfig {
    LaunchConfig::new(
        (p.batch as u32, directions, 1),
        THREADS,
        abi::scan_layout(p.k as u32, p.c as u32).bytes,
    )
}

/// `semicrf_marginals`: one block per (segment, sequence).
fn marginals_config(p: &SemiCrfProblem) -> LaunchConfig {
    LaunchConfig::new(
        (p.num_segments() as u32, p.batch as u32, 1),
        THREADS,
        abi::segment_layout(p.checkpoint as u32, p.k as u32, p.c as u32).bytes,
    )
}

/// `semicrf_reduce`: one thread per partial count.
fn reduce_config(p: &SemiCrfProblem) -> LaunchConfig {
    let blocks = (abi::partial_len(p.k as u32, p.c as u32) as u32).div_ceil(REDUCE_THREADS);
    LaunchConfig::new((blocks, 1, 1), REDUCE_THREADS, 0)
}

/// `semicrf_viterbi`: one block per sequence.
fn viterbi_config(p: &SemiCrfProblem) -> LaunchConfig {
    LaunchConfig::new(
        (p.batch as u32, 1, 1),
        THREADS,
        abi::scan_layout(p.k as u32, p.c as u32).bytes,
    )
}

/// Launch the scans: directions `first..=last` (0 forward, 1 reverse).
fn launch_scan(
    gpu: &Gpu,
    stream: &Stream,
    p: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    first: u32,
    last: u32,
) -> Result<()> {
    p.validate()?;
    same_problem("device inputs", p, &inputs.problem)?;
    same_problem("forward state", p, &state.problem)?;
    let params = scan_params(p, inputs, state, first);
    let cfg = scan_config(p, last - first + 1);
    // SAFETY: every buffer was allocated for this (validated) problem: inputs (lengths
    // validated in 1..=T at upload), checkpoints [B, nseg, K(+1), C], normalizers [B, nseg],
    // log Z [B] and [2, B]; grid rows first..=last <= 1.
    unsafe { gpu.launch_by_name(stream, "semicrf_scan", &cfg, &params) }
}

fn launch_marginals_and_reduce(
    gpu: &Gpu,
    stream: &Stream,
    p: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    grads: &mut Gradients,
) -> Result<()> {
    launch_marginals_and_reduce_of(gpu, stream, "semicrf_marginals", p, inputs, state, grads)
}

/// [`launch_marginals_and_reduce`] with `marginals_kernel`: `semicrf_marginals` or its
/// negative control (`crate::negative`), which has its parameters and launch shape.
pub(crate) fn launch_marginals_and_reduce_of(
    gpu: &Gpu,
    stream: &Stream,
    marginals_kernel: &str,
    p: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    grads: &mut Gradients,
) -> Result<()> {
    same_problem("gradients", p, &grads.problem)?;
    let (k, c) = (p.k as u32, p.c as u32);
    let params = MarginalParams {
        cumsum: ptr(&inputs.cumsum) as *const f32,
        dur: ptr(&inputs.dur) as *const f32,
        trans: ptr(&inputs.trans) as *const f32,
        lengths: ptr(&inputs.lengths) as *const u32,
        log_z64: ptr(&state.log_z64) as *const f64,
        alpha_ckpt: ptr(&state.alpha_ckpt) as *const f64,
        alpha_norm: ptr(&state.alpha_norm) as *const f64,
        beta_ckpt: ptr(&state.beta_ckpt) as *const f64,
        beta_norm: ptr(&state.beta_norm) as *const f64,
        grad_cumsum: ptr(&grads.grad_cumsum) as *mut f32,
        marginals: grads
            .marginals
            .as_ref()
            .map_or(std::ptr::null_mut(), |m| ptr(m) as *mut f32),
        partials: ptr(&state.partials) as *mut f64,
        batch: p.batch as u32,
        t_max: p.t as u32,
        k,
        c,
        ckpt: p.checkpoint as u32,
        nseg: p.num_segments() as u32,
        lanes: p.lanes(),
        pad: 0,
    };
    let cfg = marginals_config(p);
    // SAFETY: buffers allocated for this problem (checked above); the scans of both
    // directions were enqueued before on the same stream with the same state.
    unsafe { gpu.launch_by_name(stream, marginals_kernel, &cfg, &params)? };
    let reduce = ReduceParams {
        partials: ptr(&state.partials) as *const f64,
        lengths: ptr(&inputs.lengths) as *const u32,
        grad_dur: ptr(&grads.grad_dur) as *mut f32,
        grad_trans: ptr(&grads.grad_trans) as *mut f32,
        batch: p.batch as u32,
        k,
        c,
        ckpt: p.checkpoint as u32,
        nseg: p.num_segments() as u32,
        pad: 0,
    };
    let cfg = reduce_config(p);
    // SAFETY: partials [B, nseg, K C + C C] written by the launch above; outputs [K, C], [C, C].
    unsafe { gpu.launch_by_name(stream, "semicrf_reduce", &cfg, &reduce) }
}

/// [`launch_scan`] for `crate::negative`.
#[cfg(feature = "negative-controls")]
pub(crate) fn launch_scans(
    gpu: &Gpu,
    stream: &Stream,
    p: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
) -> Result<()> {
    launch_scan(gpu, stream, p, inputs, state, 0, 1)
}

/// Forward (asynchronous): log Z into `state.log_z()` and the alpha checkpoints.
pub fn forward_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
) -> Result<()> {
    launch_scan(gpu, stream, problem, inputs, state, 0, 0)
}

/// Backward after [`forward_launch`] with the same `state` (asynchronous): the reverse scan,
/// then the segment kernel and the reduction into `grads`.
pub fn backward_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    grads: &mut Gradients,
) -> Result<()> {
    same_problem("gradients", problem, &grads.problem)?;
    launch_scan(gpu, stream, problem, inputs, state, 1, 1)?;
    launch_marginals_and_reduce(gpu, stream, problem, inputs, state, grads)
}

/// Forward and backward in one go (asynchronous): both scans in one launch (they are
/// independent), then the segment kernel and the reduction. Same results as
/// [`forward_launch`] then [`backward_launch`].
pub fn forward_backward_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    grads: &mut Gradients,
) -> Result<()> {
    same_problem("gradients", problem, &grads.problem)?;
    launch_scan(gpu, stream, problem, inputs, state, 0, 1)?;
    launch_marginals_and_reduce(gpu, stream, problem, inputs, state, grads)
}

/// Device outputs of the Viterbi kernel.
pub struct ViterbiOutput {
    problem: SemiCrfProblem,
    /// `[B]` best scores.
    pub score: DeviceBuffer<f32>,
    /// `[B, T + 1, C]` backpointers (see `kernel_abi::semicrf::ViterbiParams`).
    pub backptr: DeviceBuffer<u32>,
    /// `[B, T]` segment starts (first `count[b]` entries).
    pub seg_start: DeviceBuffer<u32>,
    /// `[B, T]` segment durations.
    pub seg_dur: DeviceBuffer<u32>,
    /// `[B, T]` segment labels.
    pub seg_label: DeviceBuffer<u32>,
    /// `[B]` segment counts.
    pub seg_count: DeviceBuffer<u32>,
}

impl ViterbiOutput {
    /// Poisoned buffers for `problem`.
    pub fn new(problem: &SemiCrfProblem) -> Result<ViterbiOutput> {
        problem.validate()?;
        let (b, t, c) = (problem.batch, problem.t, problem.c);
        Ok(ViterbiOutput {
            problem: *problem,
            score: poisoned(b)?,
            backptr: poisoned(b * (t + 1) * c)?,
            seg_start: poisoned(b * t)?,
            seg_dur: poisoned(b * t)?,
            seg_label: poisoned(b * t)?,
            seg_count: poisoned(b)?,
        })
    }

    /// Download the best segmentations (after a synchronize).
    pub fn segmentations(&self) -> Result<Vec<Segmentation>> {
        let (b, t) = (self.problem.batch, self.problem.t);
        let score = download(&self.score)?;
        let (start, dur, label) = (
            download(&self.seg_start)?,
            download(&self.seg_dur)?,
            download(&self.seg_label)?,
        );
        let count = download(&self.seg_count)?;
        (0..b)
            .map(|i| {
                let n = count[i] as usize;
                if n > t {
                    return Err(Error::invalid(
                        "Viterbi output",
                        format!("sequence {i}: {n} segments for {t} positions"),
                    ));
                }
                Ok(Segmentation {
                    score: score[i],
                    segments: (0..n)
                        .map(|j| Segment {
                            start: start[i * t + j] as usize,
                            dur: dur[i * t + j] as usize,
                            label: label[i * t + j] as usize,
                        })
                        .collect(),
                })
            })
            .collect()
    }
}

/// A best segmentation and its score.
#[derive(Clone, Debug, PartialEq)]
pub struct Segmentation {
    /// Score (f32, as computed on the device).
    pub score: f32,
    /// Segments in order of position.
    pub segments: Vec<Segment>,
}

/// Viterbi (asynchronous).
pub fn viterbi_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    out: &mut ViterbiOutput,
) -> Result<()> {
    problem.validate()?;
    same_problem("device inputs", problem, &inputs.problem)?;
    same_problem("Viterbi output", problem, &out.problem)?;
    let params = ViterbiParams {
        cumsum: ptr(&inputs.cumsum) as *const f32,
        dur: ptr(&inputs.dur) as *const f32,
        trans: ptr(&inputs.trans) as *const f32,
        lengths: ptr(&inputs.lengths) as *const u32,
        score: ptr(&out.score) as *mut f32,
        backptr: ptr(&out.backptr) as *mut u32,
        seg_start: ptr(&out.seg_start) as *mut u32,
        seg_dur: ptr(&out.seg_dur) as *mut u32,
        seg_label: ptr(&out.seg_label) as *mut u32,
        seg_count: ptr(&out.seg_count) as *mut u32,
        batch: problem.batch as u32,
        t_max: problem.t as u32,
        k: problem.k as u32,
        c: problem.c as u32,
        lanes: problem.lanes(),
        pad: 0,
    };
    let cfg = viterbi_config(problem);
    // SAFETY: buffers allocated for this validated problem (lengths validated at upload).
    unsafe { gpu.launch_by_name(stream, "semicrf_viterbi", &cfg, &params) }
}

/// log Z of every sequence (synchronous convenience).
pub fn log_partition(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &SemiCrfInputs,
) -> Result<Vec<f32>> {
    let dev = DeviceInputs::upload(problem, inputs)?;
    let mut state = ForwardState::new(problem)?;
    forward_launch(gpu, stream, problem, &dev, &mut state)?;
    gpu.sync(stream, "semicrf forward")?;
    download(&state.log_z)
}

/// Host copies of everything the backward computes.
#[derive(Clone, Debug)]
pub struct Posterior {
    /// `[B]`.
    pub log_z: Vec<f32>,
    /// `[B, T + 1, C]`.
    pub grad_cumsum: Vec<f32>,
    /// `[K, C]`.
    pub grad_dur: Vec<f32>,
    /// `[C, C]`.
    pub grad_trans: Vec<f32>,
    /// `[B, T, K, C]`, when asked for.
    pub marginals: Option<Vec<f32>>,
}

/// Forward then backward (synchronous convenience).
pub fn posterior(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &SemiCrfInputs,
    marginals: bool,
) -> Result<Posterior> {
    let dev = DeviceInputs::upload(problem, inputs)?;
    let mut state = ForwardState::new(problem)?;
    let mut grads = Gradients::new(problem, marginals)?;
    forward_launch(gpu, stream, problem, &dev, &mut state)?;
    backward_launch(gpu, stream, problem, &dev, &mut state, &mut grads)?;
    gpu.sync(stream, "semicrf forward+backward")?;
    Ok(Posterior {
        log_z: download(&state.log_z)?,
        grad_cumsum: download(&grads.grad_cumsum)?,
        grad_dur: download(&grads.grad_dur)?,
        grad_trans: download(&grads.grad_trans)?,
        marginals: grads.marginals.as_ref().map(download).transpose()?,
    })
}

/// The best segmentation of every sequence (synchronous convenience).
pub fn viterbi(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &SemiCrfInputs,
) -> Result<Vec<Segmentation>> {
    let dev = DeviceInputs::upload(problem, inputs)?;
    let mut out = ViterbiOutput::new(problem)?;
    viterbi_launch(gpu, stream, problem, &dev, &mut out)?;
    gpu.sync(stream, "semicrf viterbi")?;
    out.segmentations()
}

/// Seeded random inputs for tests, benchmarks and examples: per-position scores uniform in
/// `[-1, 1)` centred per (sequence, label) over the sequence (as flash-semicrf recommends),
/// their cumulative sums, `dur` and `trans` uniform in `[-0.5, 0.5)`, lengths `T` or uniform in
/// `[T/2, T]` (the first sequence always `T`).
pub fn random_inputs(problem: &SemiCrfProblem, seed: u64, varied_lengths: bool) -> RandomInputs {
    use rand::Rng;
    let (b, t, k, c) = (problem.batch, problem.t, problem.k, problem.c);
    let mut r = crate::data::rng(seed);
    let mut scores = crate::data::uniform_f32(&mut r, b * t * c, -1.0, 1.0);
    for bi in 0..b {
        for ci in 0..c {
            let mean = (0..t)
                .map(|ti| scores[(bi * t + ti) * c + ci] as f64)
                .sum::<f64>()
                / t as f64;
            for ti in 0..t {
                scores[(bi * t + ti) * c + ci] -= mean as f32;
            }
        }
    }
    let cumsum = cumulative_scores(&scores, b, t, c).expect("sizes match");
    let dur = crate::data::uniform_f32(&mut r, k * c, -0.5, 0.5);
    let trans = crate::data::uniform_f32(&mut r, c * c, -0.5, 0.5);
    let lengths = (0..b)
        .map(|i| {
            if varied_lengths && i > 0 {
                r.random_range(t.div_ceil(2).max(1)..=t) as u32
            } else {
                t as u32
            }
        })
        .collect();
    RandomInputs {
        cumsum,
        dur,
        trans,
        lengths,
    }
}

/// Owned inputs (see [`random_inputs`]).
#[derive(Clone, Debug)]
pub struct RandomInputs {
    /// `[B, T + 1, C]`.
    pub cumsum: Vec<f32>,
    /// `[K, C]`.
    pub dur: Vec<f32>,
    /// `[C, C]`.
    pub trans: Vec<f32>,
    /// `[B]`.
    pub lengths: Vec<u32>,
}

impl RandomInputs {
    /// Borrowed view.
    pub fn view(&self) -> SemiCrfInputs<'_> {
        SemiCrfInputs {
            cumsum: &self.cumsum,
            dur: &self.dur,
            trans: &self.trans,
            lengths: &self.lengths,
        }
    }
}
