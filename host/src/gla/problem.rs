//! The problem: sizes and options ([`GlaProblem`], validated by [`GlaProblem::validate`]), and
//! its decomposition into segments ([`SegmentPlan`], from [`GlaProblem::segments`]).

use crate::attention::Target;
use crate::error::{Error, Result};
use crate::ptx::Arch;
use kernel_abi::gla::{
    CombineEntry, GlaConfig, HEAD_DIMS, SEG_FIRST, SEG_LAST, STEP, Segment, config, pingpong_config,
};

/// Segments shorter than this are not made by the automatic choice (each segment's state pass
/// and start-up cost must be amortized over enough chunks).
pub const MIN_AUTO_SEGMENT: usize = 256;

/// Which kernels compute the forward pass (same API, same results within the tolerance).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GlaKernel {
    /// The plan chooses ([`GlaProblem::kernel_for`]): the pingpong on an sm_90a target for
    /// every `(dk, dv)` it has kernels for (every supported pair), else the baseline.
    #[default]
    Auto,
    /// The baseline: every warp the same work, `cp.async` ring, plain barriers (sm_80+).
    Baseline,
    /// The warp-specialized pingpong kernels (sm_90a: TMA ring with mbarriers, `wgmma`, two
    /// consumer warpgroups taking turns, `setmaxnreg`); an error on other GPUs.
    Pingpong,
}

/// A GLA forward problem: sizes and options. Tensors are contiguous.
#[derive(Clone, Debug, PartialEq)]
pub struct GlaProblem {
    /// Batch size B (1 with `cu_seqlens`).
    pub batch: usize,
    /// Tokens per batch row T (the total with `cu_seqlens`).
    pub seq_len: usize,
    /// Heads H.
    pub heads: usize,
    /// Key head dimension (64 or 128).
    pub dk: usize,
    /// Value head dimension (64 or 128).
    pub dv: usize,
    /// Output scale; `None` is `dk^-0.5`.
    pub scale: Option<f32>,
    /// Packed variable-length sequences: offsets `[0, ..., seq_len]` (strictly increasing).
    pub cu_seqlens: Option<Vec<usize>>,
    /// Tokens per segment (a multiple of 32): `None` chooses from the problem and the GPU
    /// ([`plan_auto`]); `Some(usize::MAX)` never splits a sequence.
    pub segment_len: Option<usize>,
    /// Which kernels run.
    pub kernel: GlaKernel,
}

/// (Sequence, head) pairs from which the automatic choice on sm_90a is the pingpong. With fewer,
/// each pair is cut into many segments to fill the GPU, and the baseline measured as fast or
/// faster (H100: 1 to 4 pairs, up to 14% faster at one sequence of 32k tokens with 4 heads);
/// from 8 pairs up the two are within run-to-run variation on short sequences and the pingpong
/// is faster as soon as there is work (bench/NOTES.md has the measurements).
pub const PINGPONG_MIN_PAIRS: usize = 8;

impl GlaProblem {
    /// `batch` sequences of `seq_len` tokens each.
    pub fn new(batch: usize, seq_len: usize, heads: usize, dk: usize, dv: usize) -> Self {
        GlaProblem {
            batch,
            seq_len,
            heads,
            dk,
            dv,
            scale: None,
            cu_seqlens: None,
            segment_len: None,
            kernel: GlaKernel::Auto,
        }
    }

    /// Packed sequences with offsets `cu_seqlens` (B = 1, T = the last offset).
    pub fn varlen(cu_seqlens: Vec<usize>, heads: usize, dk: usize, dv: usize) -> Self {
        GlaProblem {
            batch: 1,
            seq_len: cu_seqlens.last().copied().unwrap_or(0),
            heads,
            dk,
            dv,
            scale: None,
            cu_seqlens: Some(cu_seqlens),
            segment_len: None,
            kernel: GlaKernel::Auto,
        }
    }

    /// With an explicit output scale.
    pub fn with_scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// With an explicit segment length (a multiple of 32; `usize::MAX`: no splitting).
    pub fn with_segment_len(mut self, tokens: usize) -> Self {
        self.segment_len = Some(tokens);
        self
    }

    /// With an explicit choice of kernels.
    pub fn with_kernel(mut self, kernel: GlaKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// The kernels that run on PTX target `arch`: [`GlaKernel::Baseline`] or
    /// [`GlaKernel::Pingpong`]. `Auto` is the pingpong where the target has it (sm_90a: TMA,
    /// `wgmma`), it exists for `(dk, dv)` and the problem has at least [`PINGPONG_MIN_PAIRS`]
    /// (sequence, head) pairs, else the baseline; the pingpong's kernels cover every shape the
    /// baseline's do (any length, packed sequences, segments, initial and final states). A
    /// forced choice is kept; the pingpong on another target is an error.
    pub fn kernel_for(&self, arch: Arch) -> Result<GlaKernel> {
        let kernel = match self.kernel {
            GlaKernel::Auto
                if arch.has_hopper_kernels()
                    && pingpong_config(self.dk as u32, self.dv as u32).is_some()
                    && self.num_seqs() * self.heads >= PINGPONG_MIN_PAIRS =>
            {
                GlaKernel::Pingpong
            }
            GlaKernel::Auto => GlaKernel::Baseline,
            forced => forced,
        };
        check_kernel(kernel, arch)?;
        Ok(kernel)
    }

    /// The output scale in effect.
    pub fn output_scale(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.dk as f32).sqrt())
    }

    /// Token rows of the tensors: `batch * seq_len`.
    pub fn rows(&self) -> usize {
        self.batch * self.seq_len
    }

    /// Sequences N (B, or `cu_seqlens.len() - 1`).
    pub fn num_seqs(&self) -> usize {
        match &self.cu_seqlens {
            Some(cu) => cu.len().saturating_sub(1),
            None => self.batch,
        }
    }

    /// `(first row, length)` of every sequence, in order.
    pub fn sequences(&self) -> Vec<(usize, usize)> {
        match &self.cu_seqlens {
            Some(cu) => cu.windows(2).map(|w| (w[0], w[1] - w[0])).collect(),
            None => (0..self.batch)
                .map(|b| (b * self.seq_len, self.seq_len))
                .collect(),
        }
    }

    /// Elements of q, k and g: `rows * heads * dk`.
    pub fn qk_len(&self) -> usize {
        self.rows() * self.heads * self.dk
    }

    /// Elements of v and o: `rows * heads * dv`.
    pub fn v_len(&self) -> usize {
        self.rows() * self.heads * self.dv
    }

    /// Elements of an initial or final state tensor: `seqs * heads * dk * dv`.
    pub fn state_len(&self) -> usize {
        self.num_seqs() * self.heads * self.dk * self.dv
    }

    /// The kernels' tile configuration.
    pub fn config(&self) -> Result<GlaConfig> {
        config(self.dk as u32, self.dv as u32).ok_or_else(|| {
            Error::unsupported(
                format!("GLA head dimensions dk = {}, dv = {}", self.dk, self.dv),
                format!("dk and dv must each be one of {HEAD_DIMS:?}"),
            )
        })
    }

    /// Floating-point operations of the recurrence, `4 rows heads dk dv` (per token and head
    /// one `dk x dv` rank-1 update and one `dk`-by-`(dk x dv)` product, two FLOPs per
    /// multiply-add): the same count for every implementation, whatever its chunking.
    pub fn flops(&self) -> f64 {
        4.0 * self.rows() as f64 * (self.heads * self.dk * self.dv) as f64
    }

    /// Bytes every implementation must move at least: q, k, g, v read once and o written once
    /// (bf16), plus the states read and written when given.
    pub fn min_bytes(&self, init: bool, final_state: bool) -> f64 {
        let io = 2.0 * (3 * self.qk_len() + 2 * self.v_len()) as f64;
        io + 4.0 * self.state_len() as f64 * (u8::from(init) + u8::from(final_state)) as f64
    }

    /// Check sizes and options.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [
            ("batch", self.batch),
            ("seq_len", self.seq_len),
            ("heads", self.heads),
            ("dk", self.dk),
            ("dv", self.dv),
        ] {
            if v == 0 {
                return Err(Error::invalid(format!("GLA {what}"), "must be at least 1"));
            }
        }
        self.config()?;
        if self.kernel == GlaKernel::Pingpong
            && pingpong_config(self.dk as u32, self.dv as u32).is_none()
        {
            return Err(Error::unsupported(
                format!(
                    "the GLA pingpong kernels at dk = {}, dv = {}",
                    self.dk, self.dv
                ),
                "they exist for (64, 64), (64, 128), (128, 64) and (128, 128); use the baseline",
            ));
        }
        if self.heads > 65_535 {
            return Err(Error::unsupported(
                format!("GLA heads = {}", self.heads),
                "at most 65535 (grid y)",
            ));
        }
        if self.batch as u128 * self.seq_len as u128 * self.heads as u128 >= 1 << 31 {
            return Err(Error::unsupported(
                format!(
                    "GLA problem of {} x {} rows x {} heads",
                    self.batch, self.seq_len, self.heads
                ),
                "rows * heads must be below 2^31",
            ));
        }
        if let Some(cu) = &self.cu_seqlens {
            if self.batch != 1 {
                return Err(Error::invalid(
                    "GLA batch",
                    format!(
                        "with cu_seqlens the batch must be 1 (sequences are packed along the \
                         token axis), got {}",
                        self.batch
                    ),
                ));
            }
            if cu.len() < 2 || cu[0] != 0 {
                return Err(Error::invalid(
                    "GLA cu_seqlens",
                    format!("must start with 0 and hold at least 2 offsets, got {cu:?}"),
                ));
            }
            if let Some(i) = (1..cu.len()).find(|&i| cu[i] <= cu[i - 1]) {
                return Err(Error::invalid(
                    "GLA cu_seqlens",
                    format!(
                        "offsets must increase strictly (every sequence has at least one \
                         token): cu_seqlens[{}] = {}, cu_seqlens[{i}] = {}",
                        i - 1,
                        cu[i - 1],
                        cu[i]
                    ),
                ));
            }
            if *cu.last().expect("len >= 2") != self.seq_len {
                return Err(Error::shape(
                    "GLA cu_seqlens last offset",
                    format!("seq_len = {}", self.seq_len),
                    cu.last().expect("len >= 2"),
                ));
            }
        }
        if let Some(l) = self.segment_len
            && (l == 0 || (l != usize::MAX && !l.is_multiple_of(STEP as usize)))
        {
            return Err(Error::invalid(
                "GLA segment length",
                format!("{l} is not a positive multiple of {STEP} (or usize::MAX)"),
            ));
        }
        let scale = self.output_scale();
        if !scale.is_finite() {
            return Err(Error::invalid(
                "GLA scale",
                format!("{scale} is not finite"),
            ));
        }
        Ok(())
    }

    /// The segments of a forward pass on `target` (what [`GlaProblem::plan`] launches on):
    /// with [`GlaProblem::segment_len`], [`plan_segments`]; else [`plan_auto`] for one wave of
    /// the resident blocks of the kernels [`GlaProblem::kernel_for`] chooses.
    pub fn segments(&self, target: Target) -> Result<SegmentPlan> {
        let kernel = self.kernel_for(target.arch)?;
        self.segments_of(kernel, target.multiprocessors as usize)
    }

    /// The segments for `kernel` (resolved: baseline or pingpong) on `sms` multiprocessors.
    pub(super) fn segments_of(&self, kernel: GlaKernel, sms: usize) -> Result<SegmentPlan> {
        // (segment, head) pairs per SM for one wave.
        let per_sm = match pingpong_config(self.dk as u32, self.dv as u32) {
            // One block per SM, one item per consumer warpgroup, `dv_parts` items per pair.
            Some(c) if kernel == GlaKernel::Pingpong => (c.consumers / c.dv_parts).max(1) as usize,
            _ => self.config()?.blocks_per_sm as usize,
        };
        match self.segment_len {
            Some(l) => plan_segments(self, l),
            None => plan_auto(self, sms * per_sm),
        }
    }

    /// Elements of the workspace buffers of a forward pass on `segments` (made for this
    /// problem), `(seg_init and delta each, decay_log2)`, when some sequence is split (else
    /// `None`: no workspace beyond the segment table).
    pub fn workspace_len(&self, segments: &SegmentPlan) -> Option<(usize, usize)> {
        if segments.combine.is_empty() {
            return None;
        }
        let n = segments.segments.len() * self.heads;
        Some((n * self.dk * self.dv, n * self.dk))
    }
}

/// Whether `kernel` (resolved: baseline or pingpong) exists for PTX target `arch`.
pub(super) fn check_kernel(kernel: GlaKernel, arch: Arch) -> Result<()> {
    if kernel == GlaKernel::Pingpong && !arch.has_hopper_kernels() {
        return Err(Error::unsupported(
            "the GLA pingpong kernels",
            format!("they need an sm_90 GPU (TMA, wgmma); this one is {arch}"),
        ));
    }
    Ok(())
}

/// The work decomposition of a problem: the segment table (in token order; the segments of a
/// sequence are consecutive) and the sequences split into several segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentPlan {
    /// One entry per block of `gla_fwd`.
    pub segments: Vec<Segment>,
    /// One entry per sequence with two or more segments (what `gla_combine` walks).
    pub combine: Vec<CombineEntry>,
}

impl SegmentPlan {
    /// The words of the segment table (`[start, len, seq, flags]` per segment) and of the
    /// combination table (`[seq, first, count, 0]` per split sequence): what a forward pass's
    /// workspace tables hold.
    pub fn table_words(&self) -> (Vec<u32>, Vec<u32>) {
        let segments = self
            .segments
            .iter()
            .flat_map(|s| [s.start, s.len, s.seq, s.flags])
            .collect();
        let combine = self
            .combine
            .iter()
            .flat_map(|c| [c.seq, c.first, c.count, c.pad])
            .collect();
        (segments, combine)
    }
}

/// Split every sequence into segments of about `segment_len` tokens: a sequence of `len`
/// tokens gets `n = ceil(len / segment_len)` segments (`usize::MAX`: one), see `split`.
pub fn plan_segments(problem: &GlaProblem, segment_len: usize) -> Result<SegmentPlan> {
    problem.validate()?;
    if segment_len == 0 || (segment_len != usize::MAX && !segment_len.is_multiple_of(STEP as usize))
    {
        return Err(Error::invalid(
            "GLA segment length",
            format!("{segment_len} is not a positive multiple of {STEP}"),
        ));
    }
    split(problem, |len| len.div_ceil(segment_len))
}

/// The automatic split for `slots` resident blocks (one wave): sequence `i` of `len_i` tokens
/// gets `n_i = floor(len_i * slots / (heads * sum_j len_j))` segments (blocks are
/// `heads * sum n_i <= slots`), at least 1 and at most `len_i / MIN_AUTO_SEGMENT`. With
/// `batch * heads >= slots` nothing is split (no state pass).
pub fn plan_auto(problem: &GlaProblem, slots: usize) -> Result<SegmentPlan> {
    problem.validate()?;
    let work = (problem.rows() * problem.heads) as u128;
    split(problem, |len| {
        let fair = (len as u128 * slots as u128 / work) as usize;
        fair.min(len / MIN_AUTO_SEGMENT).max(1)
    })
}

/// Split sequence `i` of `len` tokens into `n = segments(len)` parts of
/// `round_up(ceil(len / n), 32)` tokens (the last shorter; fewer parts if the rounding covers
/// the sequence sooner), so the segments of a sequence have about equal lengths and every
/// segment but the last is a whole number of pipeline steps.
fn split(problem: &GlaProblem, segments: impl Fn(usize) -> usize) -> Result<SegmentPlan> {
    let step = STEP as usize;
    let mut out = Vec::new();
    let mut combine = Vec::new();
    for (seq, (start, len)) in problem.sequences().into_iter().enumerate() {
        let n = segments(len).clamp(1, len);
        let each = len.div_ceil(n).div_ceil(step) * step;
        let n = len.div_ceil(each);
        let first = out.len();
        for i in 0..n {
            let s = i * each;
            let mut flags = 0;
            if i == 0 {
                flags |= SEG_FIRST;
            }
            if i + 1 == n {
                flags |= SEG_LAST;
            }
            out.push(Segment {
                start: (start + s) as u32,
                len: each.min(len - s) as u32,
                seq: seq as u32,
                flags,
            });
        }
        if n > 1 {
            combine.push(CombineEntry {
                seq: seq as u32,
                first: first as u32,
                count: n as u32,
                pad: 0,
            });
        }
    }
    if out.len() > i32::MAX as usize {
        return Err(Error::unsupported(
            "GLA segments",
            "more than 2^31 - 1 segments (use longer segments)",
        ));
    }
    Ok(SegmentPlan {
        segments: out,
        combine,
    })
}
