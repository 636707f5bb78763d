//! The problem: sizes, checkpoint interval, host inputs, and what the launches of a problem
//! need (shared-memory shapes, buffer sizes, device memory).

use crate::error::{Error, Result};
use kernel_abi::semicrf::{self as abi, MAX_C, ScanShape, SegmentShape};

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

/// Elements of each device buffer of a problem (what [`SemiCrfProblem::plan`] checks the
/// tensors against, and what the buffer types allocate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferLens {
    /// Cumulative scores `[B, T + 1, C]`.
    pub cumsum: usize,
    /// Duration scores `[K, C]`.
    pub dur: usize,
    /// Transition scores `[C, C]`.
    pub trans: usize,
    /// Lengths `[B]`.
    pub lengths: usize,
    /// log Z `[B]` f32.
    pub log_z: usize,
    /// log Z of both directions `[2, B]` f64.
    pub log_z64: usize,
    /// Alpha checkpoints `[B, nseg, K + 1, C]` f64.
    pub alpha_ckpt: usize,
    /// Their normalizers `[B, nseg]` f64.
    pub alpha_norm: usize,
    /// Beta checkpoints `[B, nseg, K, C]` f64.
    pub beta_ckpt: usize,
    /// Their normalizers `[B, nseg]` f64.
    pub beta_norm: usize,
    /// Partial counts `[B, nseg, K C + C C]` f64.
    pub partials: usize,
    /// Gradient of the cumulative scores `[B, T + 1, C]`.
    pub grad_cumsum: usize,
    /// Gradient of the duration scores `[K, C]`.
    pub grad_dur: usize,
    /// Gradient of the transition scores `[C, C]`.
    pub grad_trans: usize,
    /// Segment marginals `[B, T, K, C]`.
    pub marginals: usize,
    /// Viterbi scores `[B]`.
    pub viterbi_score: usize,
    /// Viterbi backpointers `[B, T + 1, C]`.
    pub viterbi_backptr: usize,
    /// Each of the Viterbi segment starts, durations, labels `[B, T]`.
    pub viterbi_segments: usize,
    /// Viterbi segment counts `[B]`.
    pub viterbi_count: usize,
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

    /// The sizes the shared memory of the scans depends on.
    pub fn scan_shape(&self) -> ScanShape {
        ScanShape {
            k: self.k as u32,
            c: self.c as u32,
        }
    }

    /// The sizes the shared memory of the segment kernel depends on.
    pub fn segment_shape(&self) -> SegmentShape {
        SegmentShape {
            ckpt: self.checkpoint as u32,
            k: self.k as u32,
            c: self.c as u32,
        }
    }

    /// Elements of every device buffer of this problem.
    pub fn buffer_lens(&self) -> BufferLens {
        let (b, t, k, c, n) = (self.batch, self.t, self.k, self.c, self.num_segments());
        BufferLens {
            cumsum: b * (t + 1) * c,
            dur: k * c,
            trans: c * c,
            lengths: b,
            log_z: b,
            log_z64: 2 * b,
            alpha_ckpt: b * n * (k + 1) * c,
            alpha_norm: b * n,
            beta_ckpt: b * n * k * c,
            beta_norm: b * n,
            partials: b * n * abi::partial_len(k as u32, c as u32),
            grad_cumsum: b * (t + 1) * c,
            grad_dur: k * c,
            grad_trans: c * c,
            marginals: b * t * k * c,
            viterbi_score: b,
            viterbi_backptr: b * (t + 1) * c,
            viterbi_segments: b * t,
            viterbi_count: b,
        }
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
