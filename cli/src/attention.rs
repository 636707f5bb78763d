//! `attention`, `attention-backward` and `attention-decode`: the attention forward, backward
//! and decode step over a paged KV cache (`kernels::attention`).

use crate::tensors::{Data, Dim, Inputs, Outputs, Tensor};
use crate::{CliError, Common, Job, Result, launch_timed};
use clap::{Args, ValueEnum};
use half::{bf16, f16};
use kernels::Gpu;
use kernels::attention::{
    self, AttentionElem, AttentionProblem, AttentionVarlenProblem, CuSeqlens, Dtype, E4m3,
    Fp8Scales, Path, VALUE_DIMS, View,
};
use kernels::memory::{download, poisoned, upload};
use kernels::timing::Timings;
use safetensors::Dtype as St;

mod backward;
mod decode;
pub use backward::{AttentionBackwardArgs, HELP_BACKWARD, TENSORS_BACKWARD, backward_job};
pub use decode::{AttentionDecodeArgs, HELP_DECODE, TENSORS_DECODE, decode_job};

/// `kernels-cli attention --help`.
pub const HELP: &str = "\
Attention forward: O = softmax(scale Q K^T + mask) V and the row log-sum-exp (natural log), \
softmax and accumulation in f32.

Inputs (FlashAttention's layout: sequence before heads, head dimension last):
  q    bf16, f16    [B, Sq, Hq, D]    D in {32, 48, .., 256}
       or e4m3                        (FP8, Hopper GPUs: D in {128, 256}; see below)
  k    same as q    [B, Sk, Hkv, D]   Hq a multiple of Hkv (GQA; Hkv = 1 is MQA)
  v    same as q    [B, Sk, Hkv, Dv]  Dv = D, or 128 beside D = 192 (bf16/f16; no softcap
                                    or sinks with it)

  sinks f32         [Hq]              optional: attention sinks (gpt-oss), one logit per query
                                    head that joins every row's softmax and adds no value

Outputs:
  o    dtype of q   [B, Sq, Hq, Dv]   (f64 with --reference)
  lse  f32          [B, Hq, Sq]       (f64 with --reference); -inf for a row with no allowed key
                                    (the sink with sinks)

--softcap C caps every logit l = scale q.k as C tanh(l / C) (Gemma 2).

Masking (FlashAttention >= 2.1): with Sq != Sk the causal diagonal is aligned to the \
bottom-right corner: query i may attend key j iff j <= i + Sk - Sq. A window (LEFT, RIGHT) \
allows i + Sk - Sq - LEFT <= j <= i + Sk - Sq + RIGHT; --causal is RIGHT = 0. A row with no \
allowed key gets O = 0 and LSE = -inf.

PyTorch's scaled_dot_product_attention takes [B, H, S, D]: pass q.transpose(1, 2) etc.

Packed sequences of different lengths (FlashAttention's flash_attn_varlen_func), with both \
optional tensors:
  cu_seqlens_q  i32/i64  [N + 1]   [0, lq_0, lq_0 + lq_1, ..., Tq]: sequence n owns query rows
                                   cu_seqlens_q[n] .. cu_seqlens_q[n + 1]
  cu_seqlens_k  i32/i64  [N + 1]   the same for key rows, ending at Tk
q is then [1, Tq, Hq, D], k and v [1, Tk, Hkv, D] (B = 1, the sequences packed along the \
sequence axis); each sequence is attended on its own, the mask applied per sequence (causal \
aligned to each sequence's bottom-right corner); empty sequences are allowed. Outputs: o \
[1, Tq, Hq, D] and lse [Hq, Tq] (FlashAttention's varlen layout). --path as for dense batches.

FP8: q, k and v in e4m3 (safetensors F8_E4M3) with optional per-tensor descales
  q_descale, k_descale, v_descale  f32 [1]   the real value of an element is its e4m3 value
                                             times its tensor's descale (default 1)
run the FP8 forward (Hopper GPUs, D 128 or 256, dense batches, no softcap or sinks); o is \
bf16, the reference is the f64 forward of the dequantized inputs, and --check holds o to \
2x the error of the plain FP8 computation (e4m3 P, f32 sums) plus 1e-3.";

/// Which kernel to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PathArg {
    /// The Hopper path on sm_90a GPUs where it takes the problem, else mma.sync.
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
    /// Softcap: every logit l becomes C tanh(l / C) (default none).
    #[arg(long, value_name = "C")]
    pub softcap: Option<f32>,
    /// Kernel path (GPU only; the reference is the same for all).
    #[arg(long, value_enum, default_value_t = PathArg::Auto)]
    pub path: PathArg,
}

/// The tensors `attention` reads.
pub const TENSORS: &[&str] = &[
    "q",
    "k",
    "v",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "sinks",
    "q_descale",
    "k_descale",
    "v_descale",
];

/// Read and check the inputs, build the problem.
pub fn job(args: &AttentionArgs) -> Result<Box<dyn Job>> {
    let mut inp = Inputs::open(&args.common.input)?;
    let q = inp.take(
        "q",
        &[St::BF16, St::F16, St::F8_E4M3],
        &[Dim::Var("B"), Dim::Var("Sq"), Dim::Var("Hq"), Dim::Var("D")],
    )?;
    let kv = [
        Dim::Var("B"),
        Dim::Var("Sk"),
        Dim::Var("Hkv"),
        Dim::Var("D"),
    ];
    let k = inp.take("k", &[St::BF16, St::F16, St::F8_E4M3], &kv)?;
    // V's head dimension may differ from Q's and K's where the pair has kernels
    // (`VALUE_DIMS`); otherwise V is checked as K.
    let pair = match (q.shape(), inp.shape_of("v")) {
        ([.., d], Some([_, _, _, dv])) => {
            VALUE_DIMS.contains(&(*d as u32, *dv as u32)) && q.dtype() != St::F8_E4M3
        }
        _ => false,
    };
    let v_dims = [
        Dim::Var("B"),
        Dim::Var("Sk"),
        Dim::Var("Hkv"),
        Dim::Var("Dv"),
    ];
    let v = inp.take(
        "v",
        &[St::BF16, St::F16, St::F8_E4M3],
        if pair { &v_dims } else { &kv },
    )?;
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
    let cu_q = inp.take_opt("cu_seqlens_q", &[St::I32, St::I64], &[Dim::Succ("N")])?;
    let cu_k = inp.take_opt("cu_seqlens_k", &[St::I32, St::I64], &[Dim::Succ("N")])?;
    let sinks = inp
        .take_opt("sinks", &[St::F32], &[Dim::Var("Hq")])?
        .map(|t| t.f32());
    let mut descale = |name: &str| -> Result<Option<f32>> {
        Ok(inp
            .take_opt(name, &[St::F32], &[Dim::Is("1", 1)])?
            .map(|t| t.f32()[0]))
    };
    let descales = [
        descale("q_descale")?,
        descale("k_descale")?,
        descale("v_descale")?,
    ];
    inp.finish("attention", TENSORS, &[])?;
    let fp8 = q.dtype() == St::F8_E4M3;
    if !fp8 && let Some(i) = descales.iter().position(Option::is_some) {
        return Err(CliError::Value {
            name: format!("{}_descale", ["q", "k", "v"][i]),
            reason: format!(
                "descales are for e4m3 inputs; q is {}",
                crate::tensors::dtype_name(q.dtype())
            ),
        });
    }
    let [b, sq, hq, d] = q.shape().try_into().expect("rank checked");
    let [_, sk, hkv, _] = k.shape().try_into().expect("rank checked");
    let dv = v.shape()[3];
    let dtype = if q.dtype() == St::BF16 {
        Dtype::Bf16
    } else {
        Dtype::F16
    };
    let cu = match (cu_q, cu_k) {
        (None, None) => None,
        (Some(cq), Some(ck)) => Some((cq, ck)),
        (q, _) => {
            return Err(CliError::MissingTensor {
                name: if q.is_some() {
                    "cu_seqlens_k"
                } else {
                    "cu_seqlens_q"
                }
                .into(),
                expected: "i32/i64 [N + 1] (packed sequences take both cu_seqlens_q and \
                           cu_seqlens_k)"
                    .into(),
            });
        }
    };
    if fp8 && (cu.is_some() || sinks.is_some() || args.softcap.is_some()) {
        return Err(CliError::Value {
            name: "q".into(),
            reason: "the FP8 forward (e4m3) takes dense batches without cu_seqlens, a \
                     softcap or sinks"
                .into(),
        });
    }
    if let Some((cq, ck)) = cu {
        return varlen_job(args, dtype, (&q, &k, &v), (&cq, &ck), sinks);
    }
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
    p.softcap = args.softcap;
    p.sinks = sinks.is_some();
    p.value_dim = (dv != d).then_some(dv);
    p.validate()?;
    if fp8 {
        // The FP8 forward writes bf16 O: the problem's dtype is the output's.
        p.dtype = Dtype::Bf16;
        let e4m3 = |t: &Tensor| t.bytes().iter().map(|&b| E4m3(b)).collect();
        return Ok(Box::new(Fp8Job {
            p,
            q: e4m3(&q),
            k: e4m3(&k),
            v: e4m3(&v),
            scales: Fp8Scales {
                q: descales[0].unwrap_or(1.0),
                k: descales[1].unwrap_or(1.0),
                v: descales[2].unwrap_or(1.0),
            },
        }));
    }
    Ok(match dtype {
        Dtype::Bf16 => Box::new(AttentionJob::<bf16> {
            p,
            q: q.bf16(),
            k: k.bf16(),
            v: v.bf16(),
            sinks,
        }),
        Dtype::F16 => Box::new(AttentionJob::<f16> {
            p,
            q: q.f16(),
            k: k.f16(),
            v: v.f16(),
            sinks,
        }),
    })
}

/// The values of the integer tensor `name` (i32 or i64) as i32, each checked to fit.
fn ints_i32(name: &str, t: &Tensor) -> Result<Vec<i32>> {
    t.int()
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            i32::try_from(x).map_err(|_| CliError::Value {
                name: name.to_string(),
                reason: format!("element {i} is {x}, outside i32"),
            })
        })
        .collect()
}

/// The offsets of the `cu_seqlens_*` tensor `name` as i32, the last checked to be `rows` (the packed
/// rows of `of`).
fn offsets(name: &str, t: &Tensor, rows: usize, of: &str) -> Result<Vec<i32>> {
    let v = ints_i32(name, t)?;
    let name = name.to_string();
    if v.last().map(|&x| x as i64) != Some(rows as i64) {
        return Err(CliError::Value {
            name,
            reason: format!(
                "the last offset is {}, expected {rows} (the rows of `{of}`)",
                v.last().map_or("missing".into(), |x| x.to_string())
            ),
        });
    }
    Ok(v)
}

/// The job of packed sequences: `q` `[1, Tq, Hq, D]`, `k`, `v` `[1, Tk, Hkv, D]`.
fn varlen_job(
    args: &AttentionArgs,
    dtype: Dtype,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (cq, ck): (&Tensor, &Tensor),
    sinks: Option<Vec<f32>>,
) -> Result<Box<dyn Job>> {
    let [b, tq, hq, d] = q.shape().try_into().expect("rank checked");
    let [_, tk, hkv, _] = k.shape().try_into().expect("rank checked");
    let dv = v.shape()[3];
    if b != 1 {
        return Err(CliError::Shape {
            name: "q".into(),
            expected: "[1, Tq, Hq, D] (with cu_seqlens the sequences are packed along the \
                       sequence axis and B must be 1)"
                .into(),
            got: format!("{:?}", q.shape()),
        });
    }
    let seqlens = CuSeqlens::new(
        &offsets("cu_seqlens_q", cq, tq, "q")?,
        &offsets("cu_seqlens_k", ck, tk, "k")?,
    )?;
    let mut p = AttentionVarlenProblem::new(&seqlens, hq, hkv, d, dtype)
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
    p.softcap = args.softcap;
    p.sinks = sinks.is_some();
    p.value_dim = (dv != d).then_some(dv);
    p.validate()?;
    Ok(match dtype {
        Dtype::Bf16 => Box::new(VarlenJob::<bf16> {
            p,
            seqlens,
            q: q.bf16(),
            k: k.bf16(),
            v: v.bf16(),
            sinks,
        }),
        Dtype::F16 => Box::new(VarlenJob::<f16> {
            p,
            seqlens,
            q: q.f16(),
            k: k.f16(),
            v: v.f16(),
            sinks,
        }),
    })
}

struct VarlenJob<T> {
    p: AttentionVarlenProblem,
    seqlens: CuSeqlens,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    sinks: Option<Vec<f32>>,
}

impl<T> VarlenJob<T> {
    /// O's shape as read: `[1, Tq, Hq, D_v]`.
    fn o_shape(&self) -> [usize; 4] {
        let [t, h, d] = self.p.o_shape();
        [1, t, h, d]
    }

    /// LSE's shape: `[Hq, Tq]`.
    fn lse_shape(&self) -> [usize; 2] {
        [self.p.heads_q, self.p.total_q]
    }
}

impl<T: Elem> Job for VarlenJob<T> {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let mut out = Outputs::default();
        if p.total_q == 0 {
            // No query row: nothing to compute (the plan has no launch either).
            out.push("o", &self.o_shape(), T::data(Vec::new()));
            out.push("lse", &self.lse_shape(), Data::F32(Vec::new()));
            return Ok((out, None));
        }
        let stream = gpu.stream()?;
        let mut seqlens = self.seqlens.upload()?;
        // K and V in buffers of at least one element (without key rows their views are empty
        // and never read).
        let pad = [T::default()];
        let up = |x: &[T]| upload(if x.is_empty() { &pad[..] } else { x });
        let (q, k, v) = (upload(&self.q)?, up(&self.k)?, up(&self.v)?);
        let o = poisoned::<T>(p.o_shape().iter().product())?;
        let mut lse = poisoned::<f32>(p.lse_len())?;
        let sinks = self.sinks.as_deref().map(upload).transpose()?;
        let timings = {
            let qv = View::packed_contiguous(&q, p.q_shape());
            let kv = View::packed(&k, 0, &p.kv_shape(), &packed_strides(p.kv_shape()))?;
            let vv = View::packed(&v, 0, &p.v_shape(), &packed_strides(p.v_shape()))?;
            let mut ov = View::packed_contiguous(&o, p.o_shape());
            launch_timed(
                gpu,
                &stream,
                repeat,
                "attention varlen forward",
                || match &sinks {
                    None => attention::forward_varlen(
                        gpu,
                        &stream,
                        p,
                        &mut seqlens,
                        &qv,
                        &kv,
                        &vv,
                        &mut ov,
                        &mut lse,
                    ),
                    Some(s) => attention::forward_varlen_with_sinks(
                        gpu,
                        &stream,
                        p,
                        &mut seqlens,
                        &qv,
                        &kv,
                        &vv,
                        &mut ov,
                        &mut lse,
                        s,
                    ),
                },
            )?
        };
        out.push("o", &self.o_shape(), T::data(download(&o)?));
        out.push("lse", &self.lse_shape(), Data::F32(download(&lse)?));
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let (p, s) = (&self.p, &self.seqlens);
        let r = match &self.sinks {
            None => attention::reference_varlen(p, s, &self.q, &self.k, &self.v),
            Some(x) => attention::reference_varlen_with_sinks(p, s, &self.q, &self.k, &self.v, x),
        };
        let mut out = Outputs::default();
        out.push("o", &self.o_shape(), Data::F64(r.o));
        out.push("lse", &self.lse_shape(), Data::F64(r.lse));
        Ok(out)
    }
}

/// Element strides of a contiguous `[rows, heads, D]` tensor.
fn packed_strides([_, h, d]: [usize; 3]) -> [usize; 3] {
    [h * d, d, 1]
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
    sinks: Option<Vec<f32>>,
}

impl<T: Elem> Job for AttentionJob<T> {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let stream = gpu.stream()?;
        let (q, k, v) = (upload(&self.q)?, upload(&self.k)?, upload(&self.v)?);
        let o = poisoned::<T>(p.o_shape().iter().product())?;
        let mut lse = poisoned::<f32>(p.lse_len())?;
        let sinks = self.sinks.as_deref().map(upload).transpose()?;
        // The tile counter short causal problems draw their tiles from (left zero).
        let mut counter = upload(&[0u32])?;
        let timings = {
            let qv = View::contiguous(&q, p.q_shape());
            let kv = View::contiguous(&k, p.kv_shape());
            let vv = View::contiguous(&v, p.v_shape());
            let mut ov = View::contiguous(&o, p.o_shape());
            launch_timed(gpu, &stream, repeat, "attention forward", || match &sinks {
                None => attention::forward_with_counter(
                    gpu,
                    &stream,
                    p,
                    &qv,
                    &kv,
                    &vv,
                    &mut ov,
                    &mut lse,
                    &mut counter,
                ),
                Some(s) => attention::forward_with_sinks(
                    gpu, &stream, p, &qv, &kv, &vv, &mut ov, &mut lse, s,
                ),
            })?
        };
        let mut out = Outputs::default();
        out.push("o", &p.o_shape(), T::data(download(&o)?));
        out.push("lse", &lse_shape(p), Data::F32(download(&lse)?));
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let r = match &self.sinks {
            None => attention::reference(&self.p, &self.q, &self.k, &self.v),
            Some(s) => attention::reference_with_sinks(&self.p, &self.q, &self.k, &self.v, s),
        };
        let mut out = Outputs::default();
        out.push("o", &self.p.o_shape(), Data::F64(r.o));
        out.push("lse", &lse_shape(&self.p), Data::F64(r.lse));
        Ok(out)
    }
}

/// The FP8 forward (e4m3 inputs, bf16 O).
struct Fp8Job {
    p: AttentionProblem,
    q: Vec<E4m3>,
    k: Vec<E4m3>,
    v: Vec<E4m3>,
    scales: Fp8Scales,
}

impl Job for Fp8Job {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let stream = gpu.stream()?;
        let (q, k, v) = (upload(&self.q)?, upload(&self.k)?, upload(&self.v)?);
        let o = poisoned::<bf16>(self.q.len())?;
        let mut lse = poisoned::<f32>(p.lse_len())?;
        let mut ws = poisoned::<E4m3>(p.fp8_workspace_len())?;
        let timings = {
            let qv = View::contiguous(&q, p.q_shape());
            let kv = View::contiguous(&k, p.kv_shape());
            let vv = View::contiguous(&v, p.kv_shape());
            let mut ov = View::contiguous(&o, p.q_shape());
            launch_timed(gpu, &stream, repeat, "attention FP8 forward", || {
                attention::forward_fp8(
                    gpu,
                    &stream,
                    p,
                    &qv,
                    &kv,
                    &vv,
                    self.scales,
                    &mut ov,
                    &mut lse,
                    &mut ws,
                )
            })?
        };
        let mut out = Outputs::default();
        out.push("o", &p.q_shape(), Data::Bf16(download(&o)?));
        out.push("lse", &lse_shape(p), Data::F32(download(&lse)?));
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let r = attention::reference_fp8(&self.p, &self.q, &self.k, &self.v, self.scales);
        let mut out = Outputs::default();
        out.push("o", &self.p.q_shape(), Data::F64(r.o));
        out.push("lse", &lse_shape(&self.p), Data::F64(r.lse));
        Ok(out)
    }

    fn tolerances(&self, want: &Outputs) -> Result<Vec<(String, f64)>> {
        let naive = attention::naive_fp8(&self.p, &self.q, &self.k, &self.v, self.scales);
        let w = want
            .get("o")
            .ok_or_else(|| CliError::Internal("the reference has no `o`".into()))?
            .data
            .to_f64();
        let err = naive
            .o
            .iter()
            .zip(&w)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        Ok(vec![("o".into(), 2.0 * err + 1e-3)])
    }
}

fn lse_shape(p: &AttentionProblem) -> [usize; 3] {
    [p.batch, p.heads_q, p.seq_q]
}
