//! `mhc` and `mhc-backward`: manifold-constrained hyper-connections (`kernels::mhc`).

use crate::tensors::{Data, Dim, Inputs, Outputs, Tensor};
use crate::{Common, Job, Result, launch_timed};
use clap::Args;
use half::bf16;
use kernels::Gpu;
use kernels::memory::{download, poisoned, upload};
use kernels::mhc::reference::{self as mref, MhcData, Weights};
use kernels::mhc::{
    DEFAULT_EPS, DEFAULT_SINKHORN_ITERS, MhcCoefficients, MhcGradients, MhcProblem, MhcWeights,
    MhcWorkspace,
};
use kernels::timing::Timings;
use safetensors::Dtype as St;

/// The inputs section of both mHC help texts (a macro so `concat!` can use it).
macro_rules! mhc_inputs {
    () => {
        "Per token (B S tokens), x~ = x[b, s] flattened (n C values), M = n^2 + 2n coefficients: \
r = sqrt(|x~|^2 / (n C) + eps), h~ = x~ diag(gamma) phi / r, H_pre = sigmoid(a_pre h~_pre + \
b_pre), H_post = 2 sigmoid(a_post h~_post + b_post), H_res = Sinkhorn(exp(a_res h~_res + \
b_res)) (t_max iterations, rows then columns), x_in = H_pre x, x_next = H_res x + H_post^T y. \
Coefficient order: pre [0, n), post [n, 2n), res [2n, 2n + n^2) row-major.

Inputs:
  x        bf16  [B, S, n, C]   n residual streams (2..=8), C channels (a multiple of 8)
  phi      f32   [n C, M]       projection, M = n^2 + 2n
  alpha    f32   [3]            gains a_pre, a_post, a_res
  bias     f32   [M]            biases (pre, post, res)
  gamma    f32   [n C]          optional RMSNorm weight (folded into phi)"
    };
}

/// `kernels-cli mhc --help`.
pub const HELP_FORWARD: &str = concat!(
    "mHC forward (DeepSeek, arXiv 2512.24880): the coefficients of every token and their \
     applications.\n\n",
    mhc_inputs!(),
    "
  y        bf16  [B, S, C]      optional: the layer's output on x_in; gives x_next
  (d_xin and d_xnext are accepted and ignored, so one file serves mhc and mhc-backward)

Outputs (f64 instead of f32/bf16 with --reference):
  x_in     bf16  [B, S, C]
  x_next   bf16  [B, S, n, C]   only when y is given
  h_pre    f32   [B, S, n]
  h_post   f32   [B, S, n]
  h_res    f32   [B, S, n, n]
  hproj    f32   [B, S, M]      h~ (saved for the backward)
  rms      f32   [B, S]         r"
);

/// `kernels-cli mhc-backward --help`.
pub const HELP_BACKWARD: &str = concat!(
    "mHC backward: the gradients of L = sum (d_xin . x_in + d_xnext . x_next) through every \
     Sinkhorn iteration (the forward runs first, on the GPU as part of the job).\n\n",
    mhc_inputs!(),
    "
  y        bf16  [B, S, C]      the layer's output on x_in
  d_xin    bf16  [B, S, C]      upstream gradient of x_in
  d_xnext  bf16  [B, S, n, C]   upstream gradient of x_next

Outputs (f64 instead of f32/bf16 with --reference):
  dx       bf16  [B, S, n, C]
  dy       bf16  [B, S, C]
  dphi     f32   [n C, M]
  dgamma   f32   [n C]          only when gamma is given
  dalpha   f32   [3]
  dbias    f32   [M]"
);

/// `kernels-cli mhc` and `mhc-backward` options.
#[derive(Clone, Debug, Args)]
pub struct MhcArgs {
    /// Input, output and mode.
    #[command(flatten)]
    pub common: Common,
    /// Sinkhorn iterations t_max.
    #[arg(long, visible_alias = "sinkhorn-iters", value_name = "N", default_value_t = DEFAULT_SINKHORN_ITERS)]
    pub t_max: u32,
    /// RMS epsilon.
    #[arg(long, default_value_t = DEFAULT_EPS)]
    pub eps: f32,
}

/// The tensors `mhc` reads.
pub const TENSORS_FORWARD: &[&str] = &["x", "phi", "alpha", "bias", "gamma", "y"];
/// The tensors `mhc-backward` reads.
pub const TENSORS_BACKWARD: &[&str] = &[
    "x", "phi", "alpha", "bias", "gamma", "y", "d_xin", "d_xnext",
];

/// A checked mHC problem and its inputs (the upstream gradients only for the backward).
pub struct MhcJob {
    p: MhcProblem,
    x: Vec<bf16>,
    y: Option<Vec<bf16>>,
    phi: Vec<f32>,
    gamma: Option<Vec<f32>>,
    alpha: [f32; 3],
    bias: Vec<f32>,
    /// `(d_xin, d_xnext)`: the job is the backward.
    grads: Option<(Vec<bf16>, Vec<bf16>)>,
}

/// Read and check the inputs of `mhc` (`backward = false`) or `mhc-backward`.
pub fn job(args: &MhcArgs, backward: bool) -> Result<MhcJob> {
    let mut inp = Inputs::open(&args.common.input)?;
    let x = inp.take(
        "x",
        &[St::BF16],
        &[Dim::Var("B"), Dim::Var("S"), Dim::Var("n"), Dim::Var("C")],
    )?;
    let [b, s, n, c] = x.shape().try_into().expect("rank checked");
    let p = MhcProblem::new(b, s, n, c)
        .with_iters(args.t_max)
        .with_eps(args.eps);
    // The weights' sizes follow from n and C; n itself is checked by the problem below, but
    // an absurd n must not make M overflow first.
    let (k, m) = (n * c, n.saturating_mul(n).saturating_add(2 * n));
    let phi = inp.take("phi", &[St::F32], &[Dim::Is("n C", k), Dim::Is("M", m)])?;
    let alpha = inp.take("alpha", &[St::F32], &[Dim::Is("3", 3)])?;
    let bias = inp.take("bias", &[St::F32], &[Dim::Is("M", m)])?;
    let gamma = inp.take_opt("gamma", &[St::F32], &[Dim::Is("n C", k)])?;
    let bsc = [Dim::Var("B"), Dim::Var("S"), Dim::Var("C")];
    let y = if backward {
        Some(inp.take("y", &[St::BF16], &bsc)?)
    } else {
        inp.take_opt("y", &[St::BF16], &bsc)?
    };
    let (grads, accepted, ignored): (Option<(Tensor, Tensor)>, _, &[&str]) = if backward {
        let d_xin = inp.take("d_xin", &[St::BF16], &bsc)?;
        let d_xnext = inp.take(
            "d_xnext",
            &[St::BF16],
            &[Dim::Var("B"), Dim::Var("S"), Dim::Var("n"), Dim::Var("C")],
        )?;
        (Some((d_xin, d_xnext)), TENSORS_BACKWARD, &[])
    } else {
        (None, TENSORS_FORWARD, &["d_xin", "d_xnext"])
    };
    inp.finish(
        if backward { "mhc-backward" } else { "mhc" },
        accepted,
        ignored,
    )?;
    let p = p.with_gamma(gamma.is_some());
    p.validate()?;
    let a = alpha.f32();
    Ok(MhcJob {
        p,
        x: x.bf16(),
        y: y.map(|t| t.bf16()),
        phi: phi.f32(),
        gamma: gamma.map(|t| t.f32()),
        alpha: [a[0], a[1], a[2]],
        bias: bias.f32(),
        grads: grads.map(|(a, b)| (a.bf16(), b.bf16())),
    })
}

impl MhcJob {
    fn shape(&self, tail: &[usize]) -> Vec<usize> {
        let mut s = vec![self.p.batch, self.p.seq];
        s.extend_from_slice(tail);
        s
    }

    /// The host data the library's reference and device run take (zero upstream gradients
    /// and `y` where not given: only the outputs that do not depend on them are written).
    fn data(&self) -> MhcData {
        let (t, c, k) = (self.p.tokens(), self.p.c, self.p.k());
        let zeros = |len| vec![bf16::ZERO; len];
        let (d_xin, d_xnext) = self
            .grads
            .clone()
            .unwrap_or_else(|| (zeros(t * c), zeros(t * k)));
        MhcData {
            problem: self.p,
            x: self.x.clone(),
            y: self.y.clone().unwrap_or_else(|| zeros(t * c)),
            phi: self.phi.clone(),
            gamma: self.gamma.clone(),
            alpha: self.alpha,
            bias: self.bias.clone(),
            d_xin,
            d_xnext,
        }
    }

    fn gpu_forward(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let (t, n, c, m) = (p.tokens(), p.n, p.c, p.m());
        let stream = gpu.stream()?;
        let x = upload(&self.x)?;
        let y = self.y.as_deref().map(upload).transpose()?;
        let (phi, alpha, bias) = (
            upload(&self.phi)?,
            upload(&self.alpha)?,
            upload(&self.bias)?,
        );
        let gamma = self.gamma.as_deref().map(upload).transpose()?;
        let weights = MhcWeights {
            phi: &phi,
            gamma: gamma.as_ref(),
            alpha: &alpha,
            bias: &bias,
        };
        let mut workspace = MhcWorkspace::new(p)?;
        let mut coeffs = MhcCoefficients::new(p)?;
        let mut x_in = poisoned::<bf16>(t * c)?;
        let mut x_next = poisoned::<bf16>(t * n * c)?;
        let timings = launch_timed(gpu, &stream, repeat, "mHC forward", || {
            kernels::mhc::forward_pre(
                gpu,
                &stream,
                p,
                &weights,
                &x,
                &mut workspace,
                &mut coeffs,
                &mut x_in,
            )?;
            match &y {
                Some(y) => kernels::mhc::forward_post(gpu, &stream, p, &x, y, &coeffs, &mut x_next),
                None => Ok(()),
            }
        })?;
        let mut out = Outputs::default();
        out.push("x_in", &self.shape(&[c]), Data::Bf16(download(&x_in)?));
        if y.is_some() {
            out.push(
                "x_next",
                &self.shape(&[n, c]),
                Data::Bf16(download(&x_next)?),
            );
        }
        let f = |b: &kernels::DeviceBuffer<f32>| download(b).map(Data::F32);
        out.push("h_pre", &self.shape(&[n]), f(&coeffs.h_pre)?);
        out.push("h_post", &self.shape(&[n]), f(&coeffs.h_post)?);
        out.push("h_res", &self.shape(&[n, n]), f(&coeffs.h_res)?);
        out.push("hproj", &self.shape(&[m]), f(&coeffs.hproj)?);
        out.push("rms", &self.shape(&[]), f(&coeffs.rms)?);
        Ok((out, timings))
    }

    fn gpu_backward(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let (t, c, k) = (p.tokens(), p.c, p.k());
        let data = self.data();
        let stream = gpu.stream()?;
        let (x, y) = (upload(&data.x)?, upload(&data.y)?);
        let (d_xin, d_xnext) = (upload(&data.d_xin)?, upload(&data.d_xnext)?);
        let (phi, alpha, bias) = (
            upload(&data.phi)?,
            upload(&data.alpha)?,
            upload(&data.bias)?,
        );
        let gamma = data.gamma.as_deref().map(upload).transpose()?;
        let weights = MhcWeights {
            phi: &phi,
            gamma: gamma.as_ref(),
            alpha: &alpha,
            bias: &bias,
        };
        let mut workspace = MhcWorkspace::new(p)?;
        let mut coeffs = MhcCoefficients::new(p)?;
        let mut grads = MhcGradients::new(p)?;
        let mut x_in = poisoned::<bf16>(t * c)?;
        let mut x_next = poisoned::<bf16>(t * k)?;
        let timings = launch_timed(gpu, &stream, repeat, "mHC forward+backward", || {
            kernels::mhc::forward_pre(
                gpu,
                &stream,
                p,
                &weights,
                &x,
                &mut workspace,
                &mut coeffs,
                &mut x_in,
            )?;
            kernels::mhc::forward_post(gpu, &stream, p, &x, &y, &coeffs, &mut x_next)?;
            kernels::mhc::backward(
                gpu,
                &stream,
                p,
                &weights,
                &x,
                &y,
                &coeffs,
                &d_xin,
                &d_xnext,
                &mut workspace,
                &mut grads,
            )
        })?;
        let mut out = Outputs::default();
        out.push(
            "dx",
            &self.shape(&[p.n, p.c]),
            Data::Bf16(download(&grads.dx)?),
        );
        out.push("dy", &self.shape(&[p.c]), Data::Bf16(download(&grads.dy)?));
        out.push("dphi", &[k, p.m()], Data::F32(download(&grads.dphi)?));
        if let Some(g) = &grads.dgamma {
            out.push("dgamma", &[k], Data::F32(download(g)?));
        }
        out.push("dalpha", &[3], Data::F32(download(&grads.dalpha)?));
        out.push("dbias", &[p.m()], Data::F32(download(&grads.dbias)?));
        Ok((out, timings))
    }
}

impl Job for MhcJob {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        match self.grads {
            None => self.gpu_forward(gpu, repeat),
            Some(_) => self.gpu_backward(gpu, repeat),
        }
    }

    fn reference(&self) -> Result<Outputs> {
        let p = &self.p;
        let (n, c, k, m) = (p.n, p.c, p.k(), p.m());
        let data = self.data();
        let mut out = Outputs::default();
        if self.grads.is_some() {
            let r = mref::reference(&data);
            let cat = |f: &dyn Fn(&mref::TokenBackward) -> &Vec<f64>| {
                r.backward.iter().flat_map(|b| f(b).clone()).collect()
            };
            out.push("dx", &self.shape(&[n, c]), Data::F64(cat(&|b| &b.dx)));
            out.push("dy", &self.shape(&[c]), Data::F64(cat(&|b| &b.dy)));
            out.push("dphi", &[k, m], Data::F64(r.grads.dphi));
            if let Some(g) = r.grads.dgamma {
                out.push("dgamma", &[k], Data::F64(g));
            }
            out.push("dalpha", &[3], Data::F64(r.grads.dalpha.to_vec()));
            out.push("dbias", &[m], Data::F64(r.grads.dbias));
            return Ok(out);
        }
        let w: Weights = data.weights();
        let fwd = mref::map_tokens(p.tokens(), |t| {
            mref::token_forward(
                p,
                &w,
                &MhcData::token(&data.x, t, k),
                &MhcData::token(&data.y, t, c),
            )
        });
        let cat = |f: &dyn Fn(&mref::TokenForward) -> Vec<f64>| {
            Data::F64(fwd.iter().flat_map(f).collect())
        };
        out.push("x_in", &self.shape(&[c]), cat(&|f| f.x_in.clone()));
        if self.y.is_some() {
            out.push("x_next", &self.shape(&[n, c]), cat(&|f| f.x_next.clone()));
        }
        out.push("h_pre", &self.shape(&[n]), cat(&|f| f.h_pre.clone()));
        out.push("h_post", &self.shape(&[n]), cat(&|f| f.h_post.clone()));
        out.push("h_res", &self.shape(&[n, n]), cat(&|f| f.h_res.clone()));
        out.push("hproj", &self.shape(&[m]), cat(&|f| f.hproj.clone()));
        out.push("rms", &self.shape(&[]), cat(&|f| vec![f.rms]));
        Ok(out)
    }
}
