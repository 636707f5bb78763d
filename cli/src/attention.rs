//! `attention`: the attention forward (`kernels::attention`).

use crate::tensors::{Data, Dim, Inputs, Outputs};
use crate::{CliError, Common, Job, Result, launch_timed};
use clap::{Args, ValueEnum};
use half::{bf16, f16};
use kernels::Gpu;
use kernels::attention::{self, AttentionElem, AttentionProblem, Dtype, Path, View};
use kernels::memory::{download, poisoned, upload};
use kernels::timing::Timings;
use safetensors::Dtype as St;

/// `kernels-cli attention --help`.
pub const HELP: &str = "\
Attention forward: O = softmax(scale Q K^T + mask) V and the row log-sum-exp (natural log), \
softmax and accumulation in f32.

Inputs (FlashAttention's layout: sequence before heads, head dimension last):
  q    bf16 or f16  [B, Sq, Hq, D]    D in {64, 128, 256}
  k    same as q    [B, Sk, Hkv, D]   Hq a multiple of Hkv (GQA; Hkv = 1 is MQA)
  v    same as q    [B, Sk, Hkv, D]

Outputs:
  o    dtype of q   [B, Sq, Hq, D]    (f64 with --reference)
  lse  f32          [B, Hq, Sq]       (f64 with --reference); -inf for a row with no allowed key

Masking (FlashAttention >= 2.1): with Sq != Sk the causal diagonal is aligned to the \
bottom-right corner: query i may attend key j iff j <= i + Sk - Sq. A window (LEFT, RIGHT) \
allows i + Sk - Sq - LEFT <= j <= i + Sk - Sq + RIGHT; --causal is RIGHT = 0. A row with no \
allowed key gets O = 0 and LSE = -inf.

PyTorch's scaled_dot_product_attention takes [B, H, S, D]: pass q.transpose(1, 2) etc.";

/// Which kernel to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PathArg {
    /// The Hopper path on sm_90a GPUs for D >= 128, else mma.sync.
    Auto,
    /// The mma.sync path (any GPU of compute capability >= 8.0).
    MmaSync,
    /// The Hopper path (TMA, wgmma); an error on other GPUs.
    Hopper,
}

/// `kernels-cli attention` options.
#[derive(Clone, Debug, Args)]
pub struct AttentionArgs {
    /// Input, output and mode.
    #[command(flatten)]
    pub common: Common,
    /// Causal masking, bottom-right aligned (query i attends key j iff j <= i + Sk - Sq).
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
    /// Kernel path (GPU only; the reference is the same for all).
    #[arg(long, value_enum, default_value_t = PathArg::Auto)]
    pub path: PathArg,
}

/// The tensors `attention` reads.
pub const TENSORS: &[&str] = &["q", "k", "v"];

/// Read and check the inputs, build the problem.
pub fn job(args: &AttentionArgs) -> Result<Box<dyn Job>> {
    let mut inp = Inputs::open(&args.common.input)?;
    let q = inp.take(
        "q",
        &[St::BF16, St::F16],
        &[Dim::Var("B"), Dim::Var("Sq"), Dim::Var("Hq"), Dim::Var("D")],
    )?;
    let kv = [
        Dim::Var("B"),
        Dim::Var("Sk"),
        Dim::Var("Hkv"),
        Dim::Var("D"),
    ];
    let k = inp.take("k", &[St::BF16, St::F16], &kv)?;
    let v = inp.take("v", &[St::BF16, St::F16], &kv)?;
    for t in [("k", &k), ("v", &v)] {
        if t.1.dtype() != q.dtype() {
            return Err(CliError::Dtype {
                name: t.0.to_string(),
                expected: format!(
                    "{} (the dtype of `q`)",
                    crate::tensors::dtype_name(q.dtype())
                ),
                got: crate::tensors::dtype_name(t.1.dtype()),
            });
        }
    }
    inp.finish("attention", TENSORS, &[])?;
    let [b, sq, hq, d] = q.shape().try_into().expect("rank checked");
    let [_, sk, hkv, _] = k.shape().try_into().expect("rank checked");
    let dtype = if q.dtype() == St::BF16 {
        Dtype::Bf16
    } else {
        Dtype::F16
    };
    let mut p = AttentionProblem::new(b, sq, sk, hq, hkv, d, dtype)
        .window(args.window_left, args.window_right)
        .path(match args.path {
            PathArg::Auto => Path::Auto,
            PathArg::MmaSync => Path::MmaSync,
            PathArg::Hopper => Path::Hopper,
        });
    p.causal = args.causal;
    if let Some(s) = args.scale {
        p = p.scale(s);
    }
    p.validate()?;
    Ok(match dtype {
        Dtype::Bf16 => Box::new(AttentionJob::<bf16> {
            p,
            q: q.bf16(),
            k: k.bf16(),
            v: v.bf16(),
        }),
        Dtype::F16 => Box::new(AttentionJob::<f16> {
            p,
            q: q.f16(),
            k: k.f16(),
            v: v.f16(),
        }),
    })
}

/// A 16-bit element type as output data.
trait Elem: AttentionElem {
    fn data(v: Vec<Self>) -> Data;
}

impl Elem for bf16 {
    fn data(v: Vec<Self>) -> Data {
        Data::Bf16(v)
    }
}

impl Elem for f16 {
    fn data(v: Vec<Self>) -> Data {
        Data::F16(v)
    }
}

struct AttentionJob<T> {
    p: AttentionProblem,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
}

impl<T: Elem> Job for AttentionJob<T> {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let stream = gpu.stream()?;
        let (q, k, v) = (upload(&self.q)?, upload(&self.k)?, upload(&self.v)?);
        let o = poisoned::<T>(self.q.len())?;
        let mut lse = poisoned::<f32>(p.lse_len())?;
        let timings = {
            let qv = View::contiguous(&q, p.q_shape());
            let kv = View::contiguous(&k, p.kv_shape());
            let vv = View::contiguous(&v, p.kv_shape());
            let mut ov = View::contiguous(&o, p.q_shape());
            launch_timed(gpu, &stream, repeat, "attention forward", || {
                attention::forward(gpu, &stream, p, &qv, &kv, &vv, &mut ov, &mut lse)
            })?
        };
        let mut out = Outputs::default();
        out.push("o", &p.q_shape(), T::data(download(&o)?));
        out.push("lse", &lse_shape(p), Data::F32(download(&lse)?));
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let r = attention::reference(&self.p, &self.q, &self.k, &self.v);
        let mut out = Outputs::default();
        out.push("o", &self.p.q_shape(), Data::F64(r.o));
        out.push("lse", &lse_shape(&self.p), Data::F64(r.lse));
        Ok(out)
    }
}

fn lse_shape(p: &AttentionProblem) -> [usize; 3] {
    [p.batch, p.heads_q, p.seq_q]
}
