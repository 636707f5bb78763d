//! `semicrf` and `semicrf-backward`: the semi-Markov CRF (`kernels::semicrf`).

use crate::tensors::{Data, Dim, Inputs, Outputs};
use crate::{CliError, Common, Job, Result, launch_timed, progress};
use clap::Args;
use kernels::Gpu;
use kernels::memory::download;
use kernels::semicrf::reference::{self as sref, Model};
use kernels::semicrf::{
    self, DeviceInputs, ForwardState, Gradients, SemiCrfInputs, SemiCrfProblem, ViterbiOutput,
};
use kernels::timing::Timings;
use safetensors::Dtype as St;

/// The inputs section of both semi-CRF help texts (a macro so `concat!` can use it).
macro_rules! crf_inputs {
    () => {
        "Inputs (f32 scores; give `cumsum` or `scores`, not both):
  cumsum   f32      [B, T + 1, C]   cumulative label scores S, S[b, 0, :] = 0 (usually)
  scores   f32      [B, T, C]       per-position label scores; the tool forms S (in f64,
                                    rounded once to f32)
  dur      f32      [K, C]          duration scores, row k - 1 for duration k
  trans    f32      [C, C]          transition scores [from, to]
  lengths  i32/i64  [B]             optional: sequence lengths in 1..=T (default T)

A segment [s, s + k) with label c after label c' scores S[s + k, c] - S[s, c] + dur[k - 1, c] + \
trans[c', c]; before position 0 there is a virtual label, summed over (log Z) or maximized \
(Viterbi), as in flash-semicrf and torch-struct."
    };
}

/// `kernels-cli semicrf --help`.
pub const HELP_FORWARD: &str = concat!(
    "Semi-Markov CRF forward: log Z per sequence (f64 scan), and with --viterbi the best \
     segmentation.\n\n",
    crf_inputs!(),
    "

Outputs (f64 instead of f32 with --reference):
  log_z            f32  [B]
  with --viterbi:
  viterbi_score    f32  [B]     best score
  viterbi_count    i64  [B]     segments of the best segmentation
  viterbi_start    i64  [B, T]  first position of each segment (-1 past the count)
  viterbi_dur      i64  [B, T]  duration of each segment (-1 past the count)
  viterbi_label    i64  [B, T]  label of each segment (-1 past the count)"
);

/// `kernels-cli semicrf-backward --help`.
pub const HELP_BACKWARD: &str = concat!(
    "Semi-Markov CRF backward: log Z and the gradients of sum_b log Z_b (checkpointed forward \
     and reverse scans in f64), and with --marginals the segment marginals.\n\n",
    crf_inputs!(),
    "

Outputs (f64 instead of f32 with --reference):
  log_z        f32  [B]
  grad_cumsum  f32  [B, T + 1, C]  d log Z_b / d S[b]
  grad_scores  f32  [B, T, C]      d log Z_b / d scores[b] (only when `scores` was given)
  grad_dur     f32  [K, C]         d (sum_b log Z_b) / d dur
  grad_trans   f32  [C, C]         d (sum_b log Z_b) / d trans
  marginals    f32  [B, T, K, C]   with --marginals: P(segment [t, t + k) has label c),
                                   at [b, t, k - 1, c]"
);

/// Options of both semi-CRF subcommands.
#[derive(Clone, Debug, Args)]
pub struct CrfOptions {
    /// Checkpoint interval S in positions (default: round(sqrt(T K)), capped so that a
    /// segment's workspace fits shared memory). GPU only; results do not depend on it beyond
    /// rounding.
    #[arg(long, value_name = "S")]
    pub checkpoint: Option<usize>,
}

/// `kernels-cli semicrf` options.
#[derive(Clone, Debug, Args)]
pub struct SemicrfArgs {
    /// Input, output and mode.
    #[command(flatten)]
    pub common: Common,
    /// Semi-CRF options.
    #[command(flatten)]
    pub crf: CrfOptions,
    /// Also compute the best segmentation (Viterbi).
    #[arg(long)]
    pub viterbi: bool,
}

/// `kernels-cli semicrf-backward` options.
#[derive(Clone, Debug, Args)]
pub struct SemicrfBackwardArgs {
    /// Input, output and mode.
    #[command(flatten)]
    pub common: Common,
    /// Semi-CRF options.
    #[command(flatten)]
    pub crf: CrfOptions,
    /// Also write the segment marginals [B, T, K, C] (memory: 4 B T K C bytes).
    #[arg(long)]
    pub marginals: bool,
}

/// The tensors the semi-CRF subcommands read.
pub const TENSORS: &[&str] = &["cumsum", "scores", "dur", "trans", "lengths"];

/// What to compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Forward { viterbi: bool },
    Backward { marginals: bool },
}

/// A checked semi-CRF problem and its inputs.
pub struct SemiCrfJob {
    p: SemiCrfProblem,
    cumsum: Vec<f32>,
    dur: Vec<f32>,
    trans: Vec<f32>,
    lengths: Vec<u32>,
    /// The input was `scores` (so `grad_scores` is written too).
    from_scores: bool,
    kind: Kind,
}

/// `semicrf`.
pub fn forward_job(args: &SemicrfArgs) -> Result<SemiCrfJob> {
    load(
        &args.common,
        &args.crf,
        Kind::Forward {
            viterbi: args.viterbi,
        },
    )
}

/// `semicrf-backward`.
pub fn backward_job(args: &SemicrfBackwardArgs) -> Result<SemiCrfJob> {
    load(
        &args.common,
        &args.crf,
        Kind::Backward {
            marginals: args.marginals,
        },
    )
}

fn load(common: &Common, opts: &CrfOptions, kind: Kind) -> Result<SemiCrfJob> {
    let command = match kind {
        Kind::Forward { .. } => "semicrf",
        Kind::Backward { .. } => "semicrf-backward",
    };
    let mut inp = Inputs::open(&common.input)?;
    let cumsum_dims = [Dim::Var("B"), Dim::Succ("T"), Dim::Var("C")];
    let (cumsum, from_scores) = match (inp.has("cumsum"), inp.has("scores")) {
        (true, true) => {
            return Err(CliError::Value {
                name: "scores".into(),
                reason: "give either `cumsum` or `scores`, not both".into(),
            });
        }
        (false, false) => {
            return Err(CliError::MissingTensor {
                name: "cumsum".into(),
                expected: "f32 [B, T + 1, C] (or `scores` f32 [B, T, C])".into(),
            });
        }
        (true, false) => (inp.take("cumsum", &[St::F32], &cumsum_dims)?.f32(), false),
        (false, true) => {
            let s = inp.take(
                "scores",
                &[St::F32],
                &[Dim::Var("B"), Dim::Var("T"), Dim::Var("C")],
            )?;
            let [b, t, c] = s.shape().try_into().expect("rank checked");
            (semicrf::cumulative_scores(&s.f32(), b, t, c)?, true)
        }
    };
    let dur = inp.take("dur", &[St::F32], &[Dim::Var("K"), Dim::Var("C")])?;
    let trans = inp.take("trans", &[St::F32], &[Dim::Var("C"), Dim::Var("C")])?;
    let lengths = inp.take_opt("lengths", &[St::I32, St::I64], &[Dim::Var("B")])?;
    let (b, t, c, k) = (
        inp.dim("B").expect("fixed by the scores"),
        inp.dim("T").expect("fixed by the scores"),
        inp.dim("C").expect("fixed by the scores"),
        inp.dim("K").expect("fixed by dur"),
    );
    inp.finish(command, TENSORS, &[])?;
    let lengths = match lengths {
        Some(l) => l.u32()?,
        None => vec![t as u32; b],
    };
    let mut p = SemiCrfProblem::new(b, t, k, c);
    if let Some(s) = opts.checkpoint {
        p = p.with_checkpoint(s);
    }
    let job = SemiCrfJob {
        p,
        cumsum,
        dur: dur.f32(),
        trans: trans.f32(),
        lengths,
        from_scores,
        kind,
    };
    job.inputs().validate(&p)?;
    Ok(job)
}

impl SemiCrfJob {
    fn inputs(&self) -> SemiCrfInputs<'_> {
        SemiCrfInputs {
            cumsum: &self.cumsum,
            dur: &self.dur,
            trans: &self.trans,
            lengths: &self.lengths,
        }
    }

    fn shapes(&self) -> Shapes {
        let SemiCrfProblem { batch, t, k, c, .. } = self.p;
        Shapes {
            b: [batch],
            bt: [batch, t],
            btc: [batch, t, c],
            cumsum: [batch, t + 1, c],
            kc: [k, c],
            cc: [c, c],
            marginals: [batch, t, k, c],
        }
    }

    /// `d log Z_b / d scores[b, t, c] = sum_{u > t} grad_cumsum[b, u, c]` (since
    /// `S[u] = sum_{t < u} scores[t]`), in f64.
    fn grad_scores(&self, grad_cumsum: &[f64]) -> Vec<f64> {
        let SemiCrfProblem { batch, t, c, .. } = self.p;
        let mut out = vec![0.0; batch * t * c];
        for b in 0..batch {
            for ci in 0..c {
                let mut acc = 0.0;
                for ti in (0..t).rev() {
                    acc += grad_cumsum[(b * (t + 1) + ti + 1) * c + ci];
                    out[(b * t + ti) * c + ci] = acc;
                }
            }
        }
        out
    }

    /// The model of sequence `b` alone (for per-sequence progress of the reference).
    fn sequence_model(&self, m: &Model, b: usize) -> Model {
        let rows = (m.t + 1) * m.c;
        Model {
            batch: 1,
            cumsum: m.cumsum[b * rows..(b + 1) * rows].to_vec(),
            lengths: vec![m.lengths[b]],
            ..m.clone()
        }
    }
}

struct Shapes {
    b: [usize; 1],
    bt: [usize; 2],
    btc: [usize; 3],
    cumsum: [usize; 3],
    kc: [usize; 2],
    cc: [usize; 2],
    marginals: [usize; 4],
}

/// Push the `viterbi_*` tensors: the best scores and, per sequence, its segments as
/// `[start, dur, label]`.
fn push_viterbi(out: &mut Outputs, s: &Shapes, t: usize, score: Data, best: &[Vec<[usize; 3]>]) {
    let b = best.len();
    let mut count = vec![0i64; b];
    let mut start = vec![-1i64; b * t];
    let mut dur = vec![-1i64; b * t];
    let mut label = vec![-1i64; b * t];
    for (i, segs) in best.iter().enumerate() {
        count[i] = segs.len() as i64;
        for (j, seg) in segs.iter().enumerate().take(t) {
            start[i * t + j] = seg[0] as i64;
            dur[i * t + j] = seg[1] as i64;
            label[i * t + j] = seg[2] as i64;
        }
    }
    out.push("viterbi_score", &s.b, score);
    out.push("viterbi_count", &s.b, Data::I64(count));
    out.push("viterbi_start", &s.bt, Data::I64(start));
    out.push("viterbi_dur", &s.bt, Data::I64(dur));
    out.push("viterbi_label", &s.bt, Data::I64(label));
}

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

impl Job for SemiCrfJob {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let s = self.shapes();
        let stream = gpu.stream()?;
        let dev = DeviceInputs::upload(p, &self.inputs())?;
        let mut state = ForwardState::new(p)?;
        let mut out = Outputs::default();
        let timings = match self.kind {
            Kind::Forward { viterbi } => {
                let mut vit = if viterbi {
                    Some(ViterbiOutput::new(p)?)
                } else {
                    None
                };
                let timings = launch_timed(gpu, &stream, repeat, "semi-CRF forward", || {
                    semicrf::forward_launch(gpu, &stream, p, &dev, &mut state)?;
                    match vit.as_mut() {
                        Some(v) => semicrf::viterbi_launch(gpu, &stream, p, &dev, v),
                        None => Ok(()),
                    }
                })?;
                out.push("log_z", &s.b, Data::F32(download(state.log_z())?));
                if let Some(v) = vit {
                    let best = v.segmentations()?;
                    let score = Data::F32(best.iter().map(|x| x.score).collect());
                    let segs: Vec<Vec<[usize; 3]>> = best
                        .iter()
                        .map(|x| {
                            x.segments
                                .iter()
                                .map(|g| [g.start, g.dur, g.label])
                                .collect()
                        })
                        .collect();
                    push_viterbi(&mut out, &s, p.t, score, &segs);
                }
                timings
            }
            Kind::Backward { marginals } => {
                let mut grads = Gradients::new(p, marginals)?;
                let timings =
                    launch_timed(gpu, &stream, repeat, "semi-CRF forward+backward", || {
                        semicrf::forward_launch(gpu, &stream, p, &dev, &mut state)?;
                        semicrf::backward_launch(gpu, &stream, p, &dev, &mut state, &mut grads)
                    })?;
                let gc = download(&grads.grad_cumsum)?;
                let gs = self.from_scores.then(|| {
                    let g64: Vec<f64> = gc.iter().map(|&x| x as f64).collect();
                    self.grad_scores(&g64)
                });
                out.push("log_z", &s.b, Data::F32(download(state.log_z())?));
                out.push("grad_cumsum", &s.cumsum, Data::F32(gc));
                if let Some(gs) = gs {
                    out.push("grad_scores", &s.btc, Data::F32(f32s(&gs)));
                }
                out.push("grad_dur", &s.kc, Data::F32(download(&grads.grad_dur)?));
                out.push("grad_trans", &s.cc, Data::F32(download(&grads.grad_trans)?));
                if let Some(m) = &grads.marginals {
                    out.push("marginals", &s.marginals, Data::F32(download(m)?));
                }
                timings
            }
        };
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let p = &self.p;
        let s = self.shapes();
        let model = Model::new(p, &self.inputs());
        let bar = progress::bar(p.batch as u64, "semi-CRF reference (sequences)");
        let mut out = Outputs::default();
        match self.kind {
            Kind::Forward { viterbi } => {
                let mut log_z = Vec::with_capacity(p.batch);
                let mut scores = Vec::new();
                let mut best = Vec::new();
                for b in 0..p.batch {
                    let m = self.sequence_model(&model, b);
                    log_z.push(sref::log_partition(&m)[0]);
                    if viterbi {
                        let (score, segs) = sref::viterbi(&m).remove(0);
                        scores.push(score);
                        best.push(segs.iter().map(|x| [x.start, x.dur, x.label]).collect());
                    }
                    bar.inc(1);
                }
                out.push("log_z", &s.b, Data::F64(log_z));
                if viterbi {
                    push_viterbi(&mut out, &s, p.t, Data::F64(scores), &best);
                }
            }
            Kind::Backward { marginals } => {
                let (t, k, c) = (p.t, p.k, p.c);
                let mut log_z = Vec::with_capacity(p.batch);
                let mut gc = Vec::with_capacity(p.batch * (t + 1) * c);
                let mut mu = Vec::new();
                let mut gd = vec![0.0; k * c];
                let mut gt = vec![0.0; c * c];
                for b in 0..p.batch {
                    let post = sref::posterior(&self.sequence_model(&model, b));
                    log_z.push(post.log_z[0]);
                    gc.extend_from_slice(&post.grad_cumsum);
                    if marginals {
                        mu.extend_from_slice(&post.marginals);
                    }
                    gd.iter_mut().zip(&post.grad_dur).for_each(|(a, x)| *a += x);
                    gt.iter_mut()
                        .zip(&post.grad_trans)
                        .for_each(|(a, x)| *a += x);
                    bar.inc(1);
                }
                let gs = self.from_scores.then(|| self.grad_scores(&gc));
                out.push("log_z", &s.b, Data::F64(log_z));
                out.push("grad_cumsum", &s.cumsum, Data::F64(gc));
                if let Some(gs) = gs {
                    out.push("grad_scores", &s.btc, Data::F64(gs));
                }
                out.push("grad_dur", &s.kc, Data::F64(gd));
                out.push("grad_trans", &s.cc, Data::F64(gt));
                if marginals {
                    out.push("marginals", &s.marginals, Data::F64(mu));
                }
            }
        }
        bar.finish_and_clear();
        Ok(out)
    }
}
