//! `attention-backward`: the attention backward (`kernels::attention::backward`), with the
//! forward's softcap and sinks.

use super::Elem;
use crate::tensors::{Data, Dim, Inputs, Outputs};
use crate::{CliError, Common, Job, Result, launch_timed};
use clap::Args;
use half::{bf16, f16};
use kernels::Gpu;
use kernels::attention::{
    self, AttentionProblem, BackwardOptions, Dtype, VALUE_DIMS, View, reference,
};
use kernels::memory::{download, poisoned, upload};
use kernels::timing::Timings;
use safetensors::Dtype as St;

/// `kernels-cli attention-backward --help`.
pub const HELP_BACKWARD: &str = "\
Attention backward: the gradients dQ, dK, dV of a loss through O = softmax(scale Q K^T + mask) V \
(and through the row log-sum-exp LSE when dlse is given), from the forward's O and LSE; \
softmax recomputed and accumulation in f32.

Inputs (the forward's layout and masking; see `kernels-cli attention --help`):
  q     bf16 or f16  [B, Sq, Hq, D]    D a multiple of 16 from 32 to 256
  k     same as q    [B, Sk, Hkv, D]   Hq a multiple of Hkv
  v     same as q    [B, Sk, Hkv, Dv]  Dv = D, or 128 beside D = 192 (Hopper GPUs)
  o     same as q    [B, Sq, Hq, Dv]   the forward's output
  lse   f32          [B, Hq, Sq]       the forward's log-sum-exp (natural log)
  do    same as q    [B, Sq, Hq, Dv]   the loss's gradient with respect to O
  dlse  f32          [B, Hq, Sq]       optional: the gradient with respect to LSE
  sinks f32          [Hq]              optional: the forward's attention sinks

Outputs:
  dq     dtype of q  [B, Sq, Hq, D]    (f64 with --reference)
  dk     dtype of q  [B, Sk, Hkv, D]   summed over the query heads of each group
  dv     dtype of q  [B, Sk, Hkv, Dv]
  dsinks f32         [Hq]              with sinks: their gradient, summed over B and Sq

--softcap C: the forward's softcap (every logit l = scale q.k capped as C tanh(l / C)); the \
gradients go through it.

The kernels trust o and lse to be the forward's on these q, k, v (the f64 reference of \
--reference and --check recomputes them from q, k, v). A row with no allowed key has a dq row \
of 0 whatever its do and dlse. By default dq is accumulated with f32 atomics where the \
kernels do so (the order of the additions varies between runs; on the Hopper path at D 96 the \
deterministic kernels run in either mode); --deterministic computes it in its own kernel, \
bitwise reproducible.

--check compares each gradient with the f64 reference under the tests' tolerance rule \
(FlashAttention's): max |G - ref| <= 2 max |G_naive - ref| + 1e-3 max |ref| + 1e-6, where \
G_naive is the same computation in the input precision, and fails if one exceeds it.";

/// `kernels-cli attention-backward` options.
#[derive(Clone, Debug, Args)]
pub struct AttentionBackwardArgs {
    /// Input, output and mode.
    #[command(flatten)]
    pub common: Common,
    /// Causal masking, bottom-right aligned (as the forward).
    #[arg(long)]
    pub causal: bool,
    /// Sliding window: keys at most LEFT positions before the diagonal (default unbounded).
    #[arg(long, value_name = "LEFT")]
    pub window_left: Option<usize>,
    /// Sliding window: keys at most RIGHT positions after the diagonal (default unbounded;
    /// --causal sets 0).
    #[arg(long, value_name = "RIGHT")]
    pub window_right: Option<usize>,
    /// Softmax scale (default 1 / sqrt(D)).
    #[arg(long)]
    pub scale: Option<f32>,
    /// Bitwise reproducible gradients: dQ from its own kernel instead of f32 atomics.
    #[arg(long)]
    pub deterministic: bool,
    /// The forward's softcap C (logits capped as C tanh(l / C)).
    #[arg(long, value_name = "C")]
    pub softcap: Option<f32>,
}

/// The tensors `attention-backward` reads.
pub const TENSORS_BACKWARD: &[&str] = &["q", "k", "v", "o", "lse", "do", "dlse", "sinks"];

/// Read and check the inputs of `attention-backward`, build the problem.
pub fn backward_job(args: &AttentionBackwardArgs) -> Result<Box<dyn Job>> {
    let mut inp = Inputs::open(&args.common.input)?;
    let qd = [Dim::Var("B"), Dim::Var("Sq"), Dim::Var("Hq"), Dim::Var("D")];
    let kd = [
        Dim::Var("B"),
        Dim::Var("Sk"),
        Dim::Var("Hkv"),
        Dim::Var("D"),
    ];
    let ld = [Dim::Var("B"), Dim::Var("Hq"), Dim::Var("Sq")];
    let half = [St::BF16, St::F16];
    let q = inp.take("q", &half, &qd)?;
    let k = inp.take("k", &half, &kd)?;
    // V, O and dO may have a head dimension of their own where the pair has kernels
    // (`VALUE_DIMS`); otherwise they are checked as K and Q.
    let pair = match (q.shape(), inp.shape_of("v")) {
        ([.., d], Some([_, _, _, dv])) => VALUE_DIMS.contains(&(*d as u32, *dv as u32)),
        _ => false,
    };
    let (vd, od) = if pair {
        let vd = [
            Dim::Var("B"),
            Dim::Var("Sk"),
            Dim::Var("Hkv"),
            Dim::Var("Dv"),
        ];
        let od = [
            Dim::Var("B"),
            Dim::Var("Sq"),
            Dim::Var("Hq"),
            Dim::Var("Dv"),
        ];
        (vd, od)
    } else {
        (kd, qd)
    };
    let v = inp.take("v", &half, &vd)?;
    let o = inp.take("o", &half, &od)?;
    let lse = inp.take("lse", &[St::F32], &ld)?;
    let d_o = inp.take("do", &half, &od)?;
    let d_lse = inp.take_opt("dlse", &[St::F32], &ld)?;
    let sinks = inp
        .take_opt("sinks", &[St::F32], &[Dim::Var("Hq")])?
        .map(|t| t.f32());
    for (name, t) in [("k", &k), ("v", &v), ("o", &o), ("do", &d_o)] {
        if t.dtype() != q.dtype() {
            return Err(CliError::Dtype {
                name: name.to_string(),
                expected: format!(
                    "{} (the dtype of `q`)",
                    crate::tensors::dtype_name(q.dtype())
                ),
                got: crate::tensors::dtype_name(t.dtype()),
            });
        }
    }
    inp.finish("attention-backward", TENSORS_BACKWARD, &[])?;
    let [b, sq, hq, d] = q.shape().try_into().expect("rank checked");
    let [_, sk, hkv, _] = k.shape().try_into().expect("rank checked");
    let dv = v.shape()[3];
    let dtype = if q.dtype() == St::BF16 {
        Dtype::Bf16
    } else {
        Dtype::F16
    };
    let mut p = AttentionProblem::new(b, sq, sk, hq, hkv, d, dtype)
        .window(args.window_left, args.window_right);
    p.causal = args.causal;
    if let Some(s) = args.scale {
        p = p.scale(s);
    }
    p.softcap = args.softcap;
    p.sinks = sinks.is_some();
    p.value_dim = (dv != d).then_some(dv);
    p.validate()?;
    let options = BackwardOptions {
        deterministic: args.deterministic,
    };
    let (lse, d_lse) = (lse.f32(), d_lse.map(|t| t.f32()));
    Ok(match dtype {
        Dtype::Bf16 => Box::new(BackwardJob::<bf16> {
            p,
            options,
            q: q.bf16(),
            k: k.bf16(),
            v: v.bf16(),
            o: o.bf16(),
            lse,
            d_o: d_o.bf16(),
            d_lse,
            sinks,
        }),
        Dtype::F16 => Box::new(BackwardJob::<f16> {
            p,
            options,
            q: q.f16(),
            k: k.f16(),
            v: v.f16(),
            o: o.f16(),
            lse,
            d_o: d_o.f16(),
            d_lse,
            sinks,
        }),
    })
}

struct BackwardJob<T> {
    p: AttentionProblem,
    options: BackwardOptions,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    o: Vec<T>,
    lse: Vec<f32>,
    d_o: Vec<T>,
    d_lse: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
}

impl<T: Elem> Job for BackwardJob<T> {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let stream = gpu.stream()?;
        let (q, k, v) = (upload(&self.q)?, upload(&self.k)?, upload(&self.v)?);
        let (o, d_o, lse) = (upload(&self.o)?, upload(&self.d_o)?, upload(&self.lse)?);
        let d_lse = self.d_lse.as_deref().map(upload).transpose()?;
        let sinks = self.sinks.as_deref().map(upload).transpose()?;
        let mut d_sinks = self
            .sinks
            .as_ref()
            .map(|s| poisoned::<f32>(s.len()))
            .transpose()?;
        let dq = poisoned::<T>(self.q.len())?;
        let dk = poisoned::<T>(self.k.len())?;
        let dv = poisoned::<T>(self.v.len())?;
        let (qs, ks) = (p.q_shape(), p.kv_shape());
        let (vs, os) = (p.v_shape(), p.o_shape());
        let timings = {
            let (qv, kv, vv) = (
                View::contiguous(&q, qs),
                View::contiguous(&k, ks),
                View::contiguous(&v, vs),
            );
            let (ov, dov) = (View::contiguous(&o, os), View::contiguous(&d_o, os));
            let mut dqv = View::contiguous(&dq, qs);
            let mut dkv = View::contiguous(&dk, ks);
            let mut dvv = View::contiguous(&dv, vs);
            launch_timed(gpu, &stream, repeat, "attention backward", || {
                match (&sinks, d_sinks.as_mut()) {
                    (Some(s), Some(ds)) => attention::backward_with_sinks(
                        gpu,
                        &stream,
                        p,
                        &qv,
                        &kv,
                        &vv,
                        &ov,
                        &lse,
                        &dov,
                        d_lse.as_ref(),
                        &mut dqv,
                        &mut dkv,
                        &mut dvv,
                        s,
                        ds,
                        self.options,
                    ),
                    _ => attention::backward(
                        gpu,
                        &stream,
                        p,
                        &qv,
                        &kv,
                        &vv,
                        &ov,
                        &lse,
                        &dov,
                        d_lse.as_ref(),
                        &mut dqv,
                        &mut dkv,
                        &mut dvv,
                        self.options,
                    ),
                }
            })?
        };
        let mut out = Outputs::default();
        out.push("dq", &qs, T::data(download(&dq)?));
        out.push("dk", &ks, T::data(download(&dk)?));
        out.push("dv", &vs, T::data(download(&dv)?));
        if let Some(ds) = &d_sinks {
            out.push("dsinks", &[p.heads_q], Data::F32(download(ds)?));
        }
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let p = &self.p;
        let (r, ds) = reference::backward_sinks(
            p,
            &self.q,
            &self.k,
            &self.v,
            &self.d_o,
            self.d_lse.as_deref(),
            self.sinks.as_deref(),
        );
        let mut out = Outputs::default();
        out.push("dq", &p.q_shape(), Data::F64(r.dq));
        out.push("dk", &p.kv_shape(), Data::F64(r.dk));
        out.push("dv", &p.v_shape(), Data::F64(r.dv));
        if let Some(ds) = ds {
            out.push("dsinks", &[p.heads_q], Data::F64(ds));
        }
        Ok(out)
    }

    fn tolerances(&self, want: &Outputs) -> Result<Vec<(String, f64)>> {
        let (naive, naive_ds) = attention::naive_backward_same_precision_sinks(
            &self.p,
            &self.q,
            &self.k,
            &self.v,
            &self.d_o,
            self.d_lse.as_deref(),
            self.sinks.as_deref(),
        );
        let mut tols = Vec::new();
        let grads = [("dq", &naive.dq), ("dk", &naive.dk), ("dv", &naive.dv)];
        for (name, g) in grads
            .into_iter()
            .chain(naive_ds.as_ref().map(|d| ("dsinks", d)))
        {
            let w = want
                .get(name)
                .ok_or_else(|| CliError::Internal(format!("the reference has no `{name}`")))?
                .data
                .to_f64();
            let naive_err = g
                .iter()
                .zip(&w)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            let max_ref = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            tols.push((
                name.to_string(),
                reference::backward_tolerance(naive_err, max_ref),
            ));
        }
        Ok(tols)
    }
}
