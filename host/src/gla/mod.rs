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
//! sequence (a launch of its own for the baseline; inside each forward item for the pingpong),
//! then every segment computes its outputs from its own initial state ([`GlaPlan`]). [`reference::chunked`] runs exactly this algorithm on the CPU (same chunking,
//! same bf16 roundings, same segments), to check the algorithm itself against the recurrence.

pub mod reference;

use crate::error::{Error, Result};
use crate::exec::{DevView, Exec, OnStream};
use crate::gpu::{Gpu, LaunchConfig};
use crate::memory::{poisoned, upload};
use crate::tensor_map::{MapDtype, MapSwizzle, TiledMap};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use half::bf16;
use kernel_abi::gla::{
    COMBINE_THREADS, CombineEntry, CombineParams, GlaConfig, GlaParams, GlaPingpongParams,
    HEAD_DIMS, PP_ATOM, PP_STATE_THREADS, SEG_FIRST, SEG_LAST, STEP, Segment, config,
    pingpong_config,
};

pub use kernel_abi::gla::G_FLOOR;

/// Segments shorter than this are not made by the automatic choice (each segment's state pass
/// and start-up cost must be amortized over enough chunks).
pub const MIN_AUTO_SEGMENT: usize = 256;

/// Which kernels compute the forward pass (same API, same results within the tolerance).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GlaKernel {
    /// The baseline `mma.sync` kernels on every GPU (see [`GlaKernel::Pingpong`] for why it is
    /// the default).
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

    /// Whether the pingpong kernels run (`Auto` is the baseline).
    pub fn uses_pingpong(&self) -> bool {
        self.kernel == GlaKernel::Pingpong
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
        if self.uses_pingpong() && pingpong_config(self.dk as u32, self.dv as u32).is_none() {
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

    /// The segments a launch on a GPU with `sms` multiprocessors uses: with
    /// [`GlaProblem::segment_len`], [`plan_segments`]; else [`plan_auto`] for one wave of
    /// `sms * blocks_per_sm` resident blocks.
    pub fn plan(&self, sms: usize) -> Result<SegmentPlan> {
        // (segment, head) pairs per SM for one wave.
        let per_sm = match pingpong_config(self.dk as u32, self.dv as u32) {
            // One block per SM, one item per consumer warpgroup, `dv_parts` items per pair.
            Some(c) if self.uses_pingpong() => (c.consumers / c.dv_parts).max(1) as usize,
            _ => self.config()?.blocks_per_sm as usize,
        };
        match self.segment_len {
            Some(l) => plan_segments(self, l),
            None => plan_auto(self, sms * per_sm),
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
        let plan = problem.plan(gpu.info().multiprocessors as usize)?;
        gpu.bind()?;
        let (segment_words, combine_words) = table_words(&plan);
        let segments = upload(&segment_words)?;
        let split = match workspace_len(problem, &plan) {
            None => None,
            Some((state, decay)) => Some(SplitWorkspace {
                combine: upload(&combine_words)?,
                seg_init: poisoned(state)?,
                delta: poisoned(state)?,
                decay_log2: poisoned(decay)?,
            }),
        };
        Ok(GlaPlan {
            problem: problem.clone(),
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
        let tables = RawGlaTables {
            segments: (&self.segments).into(),
            split: self.split.as_mut().map(|w| RawSplitWorkspace {
                combine: (&w.combine).into(),
                seg_init: (&mut w.seg_init).into(),
                delta: (&mut w.delta).into(),
                decay_log2: (&mut w.decay_log2).into(),
            }),
        };
        let tensors = RawGlaTensors {
            q: inputs.q.into(),
            k: inputs.k.into(),
            v: inputs.v.into(),
            g: inputs.g.into(),
            init_state: inputs.init_state.map(|b| b.into()),
            o: (&mut *outputs.o).into(),
            final_state: outputs.final_state.as_mut().map(|b| (&mut **b).into()),
        };
        if self.problem.uses_pingpong() && !gpu.arch().has_hopper_kernels() {
            return Err(Error::unsupported(
                "the GLA pingpong kernels",
                format!(
                    "they need an sm_90 GPU (TMA, wgmma); this one is {}",
                    gpu.arch()
                ),
            ));
        }
        // SAFETY: every view is a live allocation of this GPU's context (device buffers), the
        // tables hold this plan's words (uploaded by `new`) and the workspace its sizes.
        unsafe {
            forward_raw(
                &OnStream { gpu, stream },
                &self.problem,
                &self.plan,
                &tables,
                &tensors,
            )
        }
    }
}

/// The segment tables and workspace of a plan as device views (see [`GlaPlan`]; the
/// emulator tests allocate them with [`table_words`] and [`workspace_len`]).
pub struct RawGlaTables<'a> {
    /// The segment table as words (`[start, len, seq, flags]` per segment).
    pub segments: DevView<'a, u32>,
    /// When some sequence has several segments: the combination table and the workspace.
    pub split: Option<RawSplitWorkspace<'a>>,
}

/// The combination table and the workspace of the segment passes as device views.
pub struct RawSplitWorkspace<'a> {
    /// `[seq, first, count, 0]` per split sequence.
    pub combine: DevView<'a, u32>,
    /// `[segments, heads, dk, dv]` f32.
    pub seg_init: DevView<'a, f32>,
    /// `[segments, heads, dk, dv]` f32.
    pub delta: DevView<'a, f32>,
    /// `[segments, heads, dk]` f32.
    pub decay_log2: DevView<'a, f32>,
}

/// The tensors of one launch as device views (contiguous; shapes as in [`GlaInputs`] and
/// [`GlaOutputs`]).
pub struct RawGlaTensors<'a> {
    /// Queries `[B, T, H, dk]`.
    pub q: DevView<'a, bf16>,
    /// Keys `[B, T, H, dk]`.
    pub k: DevView<'a, bf16>,
    /// Values `[B, T, H, dv]`.
    pub v: DevView<'a, bf16>,
    /// Log-decays `[B, T, H, dk]`.
    pub g: DevView<'a, bf16>,
    /// Initial states `[N, H, dk, dv]`, or zero states.
    pub init_state: Option<DevView<'a, f32>>,
    /// Outputs `[B, T, H, dv]`.
    pub o: DevView<'a, bf16>,
    /// Final states `[N, H, dk, dv]`, if wanted.
    pub final_state: Option<DevView<'a, f32>>,
}

/// The words of a plan's segment table and of its combination table (as [`GlaPlan`] uploads
/// them).
pub fn table_words(plan: &SegmentPlan) -> (Vec<u32>, Vec<u32>) {
    let segments = plan
        .segments
        .iter()
        .flat_map(|s| [s.start, s.len, s.seq, s.flags])
        .collect();
    let combine = plan
        .combine
        .iter()
        .flat_map(|c| [c.seq, c.first, c.count, c.pad])
        .collect();
    (segments, combine)
}

/// Elements of the workspace of a plan, `(seg_init and delta each, decay_log2)`, when some
/// sequence is split (else `None`: no workspace).
pub fn workspace_len(problem: &GlaProblem, plan: &SegmentPlan) -> Option<(usize, usize)> {
    if plan.combine.is_empty() {
        return None;
    }
    let n = plan.segments.len() * problem.heads;
    Some((n * problem.dk * problem.dv, n * problem.dk))
}

fn check_view<T>(what: &str, view: &DevView<'_, T>, want: usize) -> Result<()> {
    if view.len() != want {
        return Err(Error::shape(
            format!("GLA {what}"),
            format!("{want} elements"),
            view.len(),
        ));
    }
    if !view.addr().is_multiple_of(16) {
        return Err(Error::Misaligned {
            what: format!("GLA {what}"),
            required: 16,
            actual: view.addr() % 16,
        });
    }
    Ok(())
}

/// The launch sequence of [`GlaPlan::forward`] on any executor, over raw views: checks every
/// size against `problem` and `plan`, then launches `gla_states` and (baseline only)
/// `gla_combine` when a sequence is split, and `gla_fwd`.
///
/// # Safety
/// Every view is memory of `exec`'s device, alive and not otherwise accessed until the launches
/// completed; `tables` hold the words of `plan` ([`table_words`]), which was made for `problem`
/// ([`GlaProblem::plan`] or [`plan_segments`]).
pub unsafe fn forward_raw<E: Exec>(
    exec: &E,
    problem: &GlaProblem,
    plan: &SegmentPlan,
    tables: &RawGlaTables,
    t: &RawGlaTensors,
) -> Result<()> {
    let p = problem;
    p.validate()?;
    let cfg = p.config()?;
    check_view("q [B, T, H, dk]", &t.q, p.qk_len())?;
    check_view("k [B, T, H, dk]", &t.k, p.qk_len())?;
    check_view("g [B, T, H, dk]", &t.g, p.qk_len())?;
    check_view("v [B, T, H, dv]", &t.v, p.v_len())?;
    check_view("o [B, T, H, dv]", &t.o, p.v_len())?;
    if let Some(s) = &t.init_state {
        check_view("initial state [N, H, dk, dv]", s, p.state_len())?;
    }
    if let Some(s) = &t.final_state {
        check_view("final state [N, H, dk, dv]", s, p.state_len())?;
    }
    check_view("segment table", &tables.segments, 4 * plan.segments.len())?;
    let split = match (workspace_len(p, plan), &tables.split) {
        (None, _) => None,
        (Some((state, decay)), Some(w)) => {
            check_view("combination table", &w.combine, 4 * plan.combine.len())?;
            check_view("workspace seg_init", &w.seg_init, state)?;
            check_view("workspace delta", &w.delta, state)?;
            check_view("workspace decay_log2", &w.decay_log2, decay)?;
            Some(w)
        }
        (Some(_), None) => {
            return Err(Error::invalid(
                "GLA workspace",
                "the plan splits a sequence but no workspace was given",
            ));
        }
    };
    let null = std::ptr::null_mut::<f32>();
    let (seg_init, delta, decay_log2) = match split {
        Some(w) => (w.seg_init.ptr(), w.delta.ptr(), w.decay_log2.ptr()),
        None => (null, null, null),
    };
    let params = GlaParams {
        q: t.q.ptr(),
        k: t.k.ptr(),
        v: t.v.ptr(),
        g: t.g.ptr(),
        o: t.o.ptr(),
        segments: tables.segments.ptr(),
        init_state: t.init_state.map_or(null, |b| b.ptr()),
        final_state: t.final_state.map_or(null, |b| b.ptr()),
        seg_init,
        delta,
        decay_log2,
        heads: p.heads as u32,
        scale: p.output_scale(),
        has_init: u32::from(t.init_state.is_some()),
        has_final: u32::from(t.final_state.is_some()),
    };
    let grid = (plan.segments.len() as u32, p.heads as u32, 1);
    let mut launch = LaunchConfig::new(grid, cfg.threads(), cfg.smem_bytes());
    // The state pass's launch (the baseline's: the same as the forward's).
    let mut states_launch = launch;
    let suffix = format!("dk{}_dv{}", p.dk, p.dv);
    // The pingpong kernels take the same parameters plus tensor maps of q, k, g, v.
    let pp = if p.uses_pingpong() {
        let pcfg = pingpong_config(p.dk as u32, p.dv as u32).expect("validated head dimensions");
        let map = |view: &DevView<'_, bf16>, d: usize| {
            TiledMap {
                address: view.addr(),
                dtype: MapDtype::Bf16,
                dims: &[d as u64, p.heads as u64, p.rows() as u64],
                strides_bytes: &[2 * d as u64, 2 * (p.heads * d) as u64],
                box_dims: &[PP_ATOM, 1, pcfg.step],
                swizzle: MapSwizzle::B128,
            }
            .encode()
        };
        let items = (plan.segments.len() * p.heads) as u32 * pcfg.dv_parts;
        launch = LaunchConfig::new(
            (items.div_ceil(pcfg.consumers), 1, 1),
            pcfg.threads(),
            pcfg.smem_bytes(),
        );
        // One block per (segment, head), all value columns.
        states_launch = LaunchConfig::new(
            ((plan.segments.len() * p.heads) as u32, 1, 1),
            PP_STATE_THREADS,
            pcfg.state_smem_bytes(),
        );
        Some(GlaPingpongParams {
            tmap_q: map(&t.q, p.dk)?,
            tmap_k: map(&t.k, p.dk)?,
            tmap_g: map(&t.g, p.dk)?,
            tmap_v: map(&t.v, p.dv)?,
            base: params,
            items,
        })
    } else {
        None
    };
    let kernel = |pass: &str| match pp {
        Some(_) => format!("gla_{pass}_pp_{suffix}"),
        None => format!("gla_{pass}_{suffix}"),
    };
    // SAFETY (for both launch forms): as documented at each call.
    let run = |name: &str, launch: &LaunchConfig| -> Result<()> {
        match &pp {
            // SAFETY: the caller's contract; the tensor maps describe the checked q, k, g, v
            // views (contiguous `[rows, heads, d]`, 16-byte aligned), the grid covers every
            // (segment, head) item once.
            Some(pp) => unsafe { exec.launch_by_name(name, launch, pp) },
            // SAFETY: the caller's contract (see the call sites).
            None => unsafe { exec.launch_by_name(name, launch, &params) },
        }
    };
    if let Some(w) = split {
        // SAFETY: q, k, g, v have the problem's sizes (checked above); the segment table
        // covers exactly the problem's sequences (built by `split` from the validated problem,
        // the caller's contract) and has gridDim.x entries; delta and decay_log2 hold
        // segments * heads * dk * dv and segments * heads * dk f32 (checked); the kernel
        // writes only the slices of the segments that are not last, each from its own block.
        run(&kernel("states"), &states_launch)?;
        // The pingpong forward folds the earlier segments' states into each item's initial
        // state itself (from delta and decay_log2): no combination launch. It is launched
        // overlapping the state pass (programmatic dependent launch): its set-up and first
        // loads run during the state pass's tail; its consumers wait for the state pass
        // (`griddepcontrol.wait`) before reading delta or writing anything.
        if pp.is_some() {
            launch = launch.overlapping_previous();
        } else {
            let combine = CombineParams {
                entries: w.combine.ptr(),
                init_state: params.init_state,
                seg_init: w.seg_init.ptr(),
                delta: w.delta.ptr(),
                decay_log2: w.decay_log2.ptr(),
                heads: p.heads as u32,
                dk: p.dk as u32,
                dv: p.dv as u32,
                has_init: params.has_init,
            };
            let elems = (p.dk * p.dv) as u32;
            let claunch = LaunchConfig::new(
                (
                    plan.combine.len() as u32,
                    p.heads as u32,
                    elems.div_ceil(COMBINE_THREADS),
                ),
                COMBINE_THREADS,
                0,
            );
            // SAFETY: the combine entries name consecutive segments of the table (count >= 2,
            // all of one sequence, seq < N); every buffer has the size the parameters document
            // (checked above); each thread writes its own element of the later segments' initial
            // states.
            unsafe { exec.launch_by_name("gla_combine", &claunch, &combine)? };
        }
    }
    // SAFETY: as for `gla_states`; o has rows * heads * dv elements; the initial and final
    // states hold N * heads * dk * dv elements (checked); seg_init was written by `gla_combine`
    // (just before, in order on the executor) for every segment that is not first, the only
    // ones that read it (the pingpong's read delta and decay_log2 of their sequence's earlier
    // segments, written by `gla_states_pp` just before, after waiting for it to complete:
    // the overlapped launch's contract, kept by every consumer thread); each block writes only
    // its own rows of o and, if it is the last of its sequence, that sequence's final state.
    run(&kernel("fwd"), &launch)
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
