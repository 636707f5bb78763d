//! Gated linear attention (GLA) forward, chunkwise, after flash-linear-attention's `chunk_gla`:
//!
//! `S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t`, `o_t = scale q_t S_t`
//!
//! per sequence and head, with q, k, g `[B, T, H, Dk]`, v `[B, T, H, Dv]` in bf16, the output o
//! `[B, T, H, Dv]` in bf16, optional initial states `[N, H, Dk, Dv]` f32 and optional final
//! states of the same shape (`N` sequences). [`reference::recurrence`] (f64) is the
//! specification.
//!
//! - `Dk`, `Dv` in {64, 128}, independently; any `T >= 1`.
//! - Variable lengths: with `cu_seqlens = [0, l_0, l_0 + l_1, ..., total]` (fla's convention:
//!   `B = 1`, `T = total`) the sequences are packed along the token axis and each starts from
//!   its own initial state; no padding is needed. Every sequence must have at least one token.
//! - `scale` defaults to `Dk^-0.5`.
//! - Log-decays: `g <= 0` is the model's domain (`exp(g)` is a forget gate). The kernels clamp
//!   `g` below at [`G_FLOOR`] = -20 (`exp(-20) = 2.1e-9`; a token with a stronger decay keeps
//!   2e-9 of its past instead of less): every `g` in `[-20, 0]`, `g = 0` and `g = -20` included,
//!   is used exactly as given and gives finite outputs. **Positive `g`** (growth) is accepted
//!   and computed with the same formulas, but without guarantees: the state grows as
//!   `exp(sum g)` and the kernels' intermediate factors reach `exp(16 max g)`, so large
//!   positive values overflow f32 (the tests cover `0 <= g <= 0.1`).
//!
//! # Algorithm
//! Chunks of 16 tokens (one tensor-core tile). Within a chunk, with `b_t` the cumulative
//! log-decay from the chunk start (inclusive):
//! `o_t = scale (q_t exp(b_t)) S_0 + scale sum_{s <= t} (q_t . k_s exp(b_t - b_s)) v_s`, and the
//! state after the chunk is `exp(b_15) S_0 + sum_s (k_s exp(b_15 - b_s))^T v_s`. The
//! intra-chunk products are split in halves of 8 tokens so that every factor stays within
//! `exp(+-70)` (see the kernel documentation in `gpu-kernels/src/gla`).
//!
//! Long sequences are split into **segments** so that the GPU has enough blocks: the state each
//! segment adds from a zero state is computed first (in parallel), then combined along each
//! sequence, then every segment computes its outputs from its own initial state
//! ([`GlaPlan`]). [`reference::chunked`] runs exactly this algorithm on the CPU (same chunking,
//! same bf16 roundings, same segments), to check the algorithm itself against the recurrence.

pub mod reference;

use crate::error::{Error, Result};
use crate::gpu::{Gpu, LaunchConfig};
use crate::memory::{poisoned, upload};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use half::bf16;
use kernel_abi::gla::{
    COMBINE_THREADS, CombineEntry, CombineParams, GlaConfig, GlaParams, HEAD_DIMS, SEG_FIRST,
    SEG_LAST, STEP, Segment, config,
};

pub use kernel_abi::gla::G_FLOOR;

/// Segments shorter than this are not made by the automatic choice (each segment's state pass
/// and start-up cost must be amortized over enough chunks).
pub const MIN_AUTO_SEGMENT: usize = 256;

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
}

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
        if self.heads > 65_535 {
            return Err(Error::unsupported(
                format!("GLA heads = {}", self.heads),
                "at most 65535 (grid y)",
            ));
        }
        if self.rows() as u128 * self.heads as u128 >= 1 << 31 {
            return Err(Error::unsupported(
                format!("GLA problem of {} rows x {} heads", self.rows(), self.heads),
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

    /// The segments a launch on a GPU with `sms` multiprocessors uses: with
    /// [`GlaProblem::segment_len`], [`plan_segments`]; else [`plan_auto`] for one wave of
    /// `sms * blocks_per_sm` resident blocks.
    pub fn plan(&self, sms: usize) -> Result<SegmentPlan> {
        match self.segment_len {
            Some(l) => plan_segments(self, l),
            None => plan_auto(self, sms * self.config()?.blocks_per_sm as usize),
        }
    }
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

/// Split every sequence into segments of about `segment_len` tokens: a sequence of `len`
/// tokens gets `n = ceil(len / segment_len)` segments (`usize::MAX`: one), see [`split`].
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

/// The device tensors of one launch (contiguous).
pub struct GlaInputs<'a> {
    /// Queries `[B, T, H, dk]`.
    pub q: &'a DeviceBuffer<bf16>,
    /// Keys `[B, T, H, dk]`.
    pub k: &'a DeviceBuffer<bf16>,
    /// Values `[B, T, H, dv]`.
    pub v: &'a DeviceBuffer<bf16>,
    /// Log-decays `[B, T, H, dk]` (natural log).
    pub g: &'a DeviceBuffer<bf16>,
    /// Initial states `[N, H, dk, dv]`, or zero states.
    pub init_state: Option<&'a DeviceBuffer<f32>>,
}

/// The device outputs of one launch.
pub struct GlaOutputs<'a> {
    /// Outputs `[B, T, H, dv]`.
    pub o: &'a mut DeviceBuffer<bf16>,
    /// Final states `[N, H, dk, dv]`, if wanted.
    pub final_state: Option<&'a mut DeviceBuffer<f32>>,
}

/// A problem made ready to launch on one GPU: its segment tables on the device and the
/// workspace of the segment passes. Build once, launch many times (one launch at a time: the
/// workspace is the plan's).
pub struct GlaPlan {
    problem: GlaProblem,
    cfg: GlaConfig,
    plan: SegmentPlan,
    /// The segment table as words (`[start, len, seq, flags]` per entry).
    segments: DeviceBuffer<u32>,
    /// `(combine table, seg_init, delta, decay_log2)` when some sequence has several segments.
    split: Option<SplitWorkspace>,
}

struct SplitWorkspace {
    /// `[seq, first, count, 0]` per entry.
    combine: DeviceBuffer<u32>,
    seg_init: DeviceBuffer<f32>,
    delta: DeviceBuffer<f32>,
    decay_log2: DeviceBuffer<f32>,
}

impl GlaPlan {
    /// Validate `problem`, decide the segments for `gpu`, upload the tables and allocate the
    /// workspace (`(2 dk dv + dk) * 4` bytes per segment and head, only when a sequence is
    /// split).
    pub fn new(gpu: &Gpu, problem: &GlaProblem) -> Result<GlaPlan> {
        problem.validate()?;
        let cfg = problem.config()?;
        let plan = problem.plan(gpu.info().multiprocessors as usize)?;
        gpu.bind()?;
        let segments = upload_words(
            plan.segments
                .iter()
                .map(|s| [s.start, s.len, s.seq, s.flags]),
        )?;
        let split = if plan.combine.is_empty() {
            None
        } else {
            let n = plan.segments.len() * problem.heads;
            let state = n * problem.dk * problem.dv;
            Some(SplitWorkspace {
                combine: upload_words(
                    plan.combine
                        .iter()
                        .map(|c| [c.seq, c.first, c.count, c.pad]),
                )?,
                seg_init: poisoned(state)?,
                delta: poisoned(state)?,
                decay_log2: poisoned(n * problem.dk)?,
            })
        };
        Ok(GlaPlan {
            problem: problem.clone(),
            cfg,
            plan,
            segments,
            split,
        })
    }

    /// The problem.
    pub fn problem(&self) -> &GlaProblem {
        &self.problem
    }

    /// The segment decomposition.
    pub fn segments(&self) -> &SegmentPlan {
        &self.plan
    }

    /// Launch the forward pass on `stream` (asynchronous; up to three kernels).
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        stream: &Stream,
        inputs: &GlaInputs,
        outputs: &mut GlaOutputs,
    ) -> Result<()> {
        let p = &self.problem;
        for (what, buf, want) in [
            ("q [B, T, H, dk]", inputs.q, p.qk_len()),
            ("k [B, T, H, dk]", inputs.k, p.qk_len()),
            ("g [B, T, H, dk]", inputs.g, p.qk_len()),
            ("v [B, T, H, dv]", inputs.v, p.v_len()),
        ] {
            if buf.len() != want {
                return Err(Error::shape(
                    format!("GLA {what}"),
                    format!("{want} elements"),
                    buf.len(),
                ));
            }
        }
        if outputs.o.len() != p.v_len() {
            return Err(Error::shape(
                "GLA o [B, T, H, dv]",
                format!("{} elements", p.v_len()),
                outputs.o.len(),
            ));
        }
        for (what, len) in [
            (
                "initial state [N, H, dk, dv]",
                inputs.init_state.map(|b| b.len()),
            ),
            (
                "final state [N, H, dk, dv]",
                outputs.final_state.as_ref().map(|b| b.len()),
            ),
        ] {
            if let Some(len) = len
                && len != p.state_len()
            {
                return Err(Error::shape(
                    format!("GLA {what}"),
                    format!("{} elements", p.state_len()),
                    len,
                ));
            }
        }
        let ptr = |b: &DeviceBuffer<bf16>| b.as_device_ptr().as_raw() as *const u16;
        let fptr = |b: &DeviceBuffer<f32>| b.as_device_ptr().as_raw() as *mut f32;
        let null = std::ptr::null_mut::<f32>();
        let (seg_init, delta, decay_log2) = match &self.split {
            Some(w) => (fptr(&w.seg_init), fptr(&w.delta), fptr(&w.decay_log2)),
            None => (null, null, null),
        };
        let params = GlaParams {
            q: ptr(inputs.q),
            k: ptr(inputs.k),
            v: ptr(inputs.v),
            g: ptr(inputs.g),
            o: outputs.o.as_device_ptr().as_raw() as *mut u16,
            segments: self.segments.as_device_ptr().as_raw() as *const Segment,
            init_state: inputs.init_state.map_or(null, fptr) as *const f32,
            final_state: outputs.final_state.as_ref().map_or(null, |b| fptr(b)),
            seg_init: seg_init as *const f32,
            delta,
            decay_log2,
            heads: p.heads as u32,
            scale: p.output_scale(),
            has_init: u32::from(inputs.init_state.is_some()),
            has_final: u32::from(outputs.final_state.is_some()),
        };
        let grid = (self.plan.segments.len() as u32, p.heads as u32, 1);
        let launch = LaunchConfig::new(grid, self.cfg.threads(), self.cfg.smem_bytes());
        let suffix = format!("dk{}_dv{}", p.dk, p.dv);
        if let Some(w) = &self.split {
            // SAFETY: q, k, g, v have the problem's sizes (checked above); the segment table
            // covers exactly the problem's sequences (built by `split` from the
            // validated problem) and has gridDim.x entries; delta and decay_log2 hold
            // segments * heads * dk * dv and segments * heads * dk f32; the kernel writes only
            // the slices of the segments that are not last, each from its own block.
            unsafe {
                gpu.launch(stream, &format!("gla_states_{suffix}"), &launch, &params)?;
            }
            let combine = CombineParams {
                entries: w.combine.as_device_ptr().as_raw() as *const CombineEntry,
                init_state: params.init_state,
                seg_init: fptr(&w.seg_init),
                delta: fptr(&w.delta) as *const f32,
                decay_log2: fptr(&w.decay_log2) as *const f32,
                heads: p.heads as u32,
                dk: p.dk as u32,
                dv: p.dv as u32,
                has_init: params.has_init,
            };
            let elems = (p.dk * p.dv) as u32;
            let claunch = LaunchConfig::new(
                (
                    self.plan.combine.len() as u32,
                    p.heads as u32,
                    elems.div_ceil(COMBINE_THREADS),
                ),
                COMBINE_THREADS,
                0,
            );
            // SAFETY: the combine entries name consecutive segments of the table (count >= 2,
            // all of one sequence, seq < N); every buffer has the size the parameters document
            // (the initial state was checked above); each thread writes its own element of the
            // later segments' initial states.
            unsafe {
                gpu.launch(stream, "gla_combine", &claunch, &combine)?;
            }
        }
        // SAFETY: as for `gla_states`; o has rows * heads * dv elements; the initial and final
        // states were checked to hold N * heads * dk * dv elements; seg_init was written by
        // `gla_combine` (just before, on the same stream) for every segment that is not first,
        // the only ones that read it; each block writes only its own rows of o and, if it is
        // the last of its sequence, that sequence's final state.
        unsafe { gpu.launch(stream, &format!("gla_fwd_{suffix}"), &launch, &params) }
    }
}

/// The words of a table of ABI entries (each a `#[repr(C)]` struct of four `u32`s, so the
/// device reads the word buffer as the table).
fn upload_words(words: impl Iterator<Item = [u32; 4]>) -> Result<DeviceBuffer<u32>> {
    let flat: Vec<u32> = words.flatten().collect();
    upload(&flat)
}

/// Convenience: plan and launch `problem` on `stream`, then wait for it (tests, examples).
pub fn forward_sync(
    gpu: &Gpu,
    stream: &Stream,
    problem: &GlaProblem,
    inputs: &GlaInputs,
    outputs: &mut GlaOutputs,
) -> Result<()> {
    let mut plan = GlaPlan::new(gpu, problem)?;
    plan.forward(gpu, stream, inputs, outputs)?;
    gpu.sync(stream, "GLA forward")
}
