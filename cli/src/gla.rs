//! `gla`: the gated linear attention forward (`kernels::gla`).

use crate::tensors::{Data, Dim, Inputs, Outputs};
use crate::{CliError, Common, Job, Result, launch_timed};
use clap::Args;
use half::bf16;
use kernels::Gpu;
use kernels::gla::reference::{ExactInputs, HostInputs, OutputGrads, backward, recurrence};
use kernels::gla::{
    GlaGradients, GlaInputs, GlaKernel, GlaOutputGrads, GlaOutputs, GlaProblem, GlaSession,
};
use kernels::memory::{download, poisoned, upload};
use kernels::timing::Timings;
use safetensors::Dtype as St;

/// `kernels-cli gla --help`.
pub const HELP: &str = "\
Gated linear attention (GLA) forward, chunkwise (after flash-linear-attention's chunk_gla): per \
sequence and head, S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t and o_t = scale q_t S_t.

Inputs (fla's layout, `head_first=False`):
  q              bf16      [B, T, H, Dk]    Dk in {64, 128}
  k              bf16      [B, T, H, Dk]
  g              bf16      [B, T, H, Dk]    log-decays (natural log, <= 0; clamped below at -20)
  v              bf16      [B, T, H, Dv]    Dv in {64, 128}
  initial_state  f32       [N, H, Dk, Dv]   optional (default zero)
  cu_seqlens     i32/i64   [N + 1]          optional: packed variable-length sequences,
                                            [0, l_0, l_0 + l_1, ..., T] with B = 1

N is B, or the number of sequences in cu_seqlens.

Outputs:
  o              bf16      [B, T, H, Dv]    (f64 with --reference)
  final_state    f32       [N, H, Dk, Dv]   (f64 with --reference)";

/// `kernels-cli gla` options.
#[derive(Clone, Debug, Args)]
pub struct GlaArgs {
    /// Input, output and mode.
    #[command(flatten)]
    pub common: Common,
    /// Output scale (default Dk^-0.5).
    #[arg(long)]
    pub scale: Option<f32>,
    /// Tokens per segment when splitting long sequences (a multiple of 32; default: chosen
    /// for the GPU). GPU only; the result does not depend on it beyond rounding.
    #[arg(long, value_name = "TOKENS")]
    pub segment_len: Option<usize>,
    /// The kernels that compute the forward: `auto` (the library's choice for the GPU: the
    /// pingpong on sm_90, else the baseline),
    /// `baseline` (the portable `mma.sync` kernels, any GPU) or `pingpong` (the warp-specialized
    /// Hopper kernels; an error on other GPUs). GPU only.
    #[arg(long, value_enum, default_value_t = KernelArg::Auto)]
    pub kernel: KernelArg,
}

/// `--kernel`: which GLA kernels run ([`GlaKernel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelArg {
    /// [`GlaKernel::Auto`].
    Auto,
    /// [`GlaKernel::Baseline`].
    Baseline,
    /// [`GlaKernel::Pingpong`].
    Pingpong,
}

impl From<KernelArg> for GlaKernel {
    fn from(k: KernelArg) -> GlaKernel {
        match k {
            KernelArg::Auto => GlaKernel::Auto,
            KernelArg::Baseline => GlaKernel::Baseline,
            KernelArg::Pingpong => GlaKernel::Pingpong,
        }
    }
}

/// The tensors `gla` reads.
pub const TENSORS: &[&str] = &["q", "k", "g", "v", "initial_state", "cu_seqlens"];

/// Read and check the inputs, build the problem.
pub fn job(args: &GlaArgs) -> Result<GlaJob> {
    let mut inp = Inputs::open(&args.common.input)?;
    let job = forward_inputs(&mut inp, args)?;
    inp.finish("gla", TENSORS, &[])?;
    Ok(job)
}

/// Take the forward's tensors from `inp` (leaving the others) and build the problem.
fn forward_inputs(inp: &mut Inputs, args: &GlaArgs) -> Result<GlaJob> {
    let qk = [Dim::Var("B"), Dim::Var("T"), Dim::Var("H"), Dim::Var("Dk")];
    let q = inp.take("q", &[St::BF16], &qk)?;
    let k = inp.take("k", &[St::BF16], &qk)?;
    let g = inp.take("g", &[St::BF16], &qk)?;
    let v = inp.take(
        "v",
        &[St::BF16],
        &[Dim::Var("B"), Dim::Var("T"), Dim::Var("H"), Dim::Var("Dv")],
    )?;
    let [b, t, h, dk] = q.shape().try_into().expect("rank checked");
    let dv = v.shape()[3];
    let cu = inp.take_opt("cu_seqlens", &[St::I32, St::I64], &[Dim::Succ("N")])?;
    if cu.is_none() {
        inp.bind("N", b, "B");
    }
    let init = inp.take_opt(
        "initial_state",
        &[St::F32],
        &[Dim::Var("N"), Dim::Var("H"), Dim::Var("Dk"), Dim::Var("Dv")],
    )?;
    let mut p = match &cu {
        None => GlaProblem::new(b, t, h, dk, dv),
        Some(cu) => {
            if b != 1 {
                return Err(CliError::Shape {
                    name: "q".into(),
                    expected: "[1, T, H, Dk] (with cu_seqlens the sequences are packed along \
                               T and B must be 1)"
                        .into(),
                    got: format!("{:?}", q.shape()),
                });
            }
            let offsets: Vec<usize> = cu.u32()?.into_iter().map(|x| x as usize).collect();
            if offsets.last() != Some(&t) {
                return Err(CliError::Value {
                    name: "cu_seqlens".into(),
                    reason: format!(
                        "the last offset is {:?}, expected T = {t} (the token count of `q`)",
                        offsets.last()
                    ),
                });
            }
            GlaProblem::varlen(offsets, h, dk, dv)
        }
    };
    if let Some(s) = args.scale {
        p = p.with_scale(s);
    }
    if let Some(l) = args.segment_len {
        p = p.with_segment_len(l);
    }
    p = p.with_kernel(args.kernel.into());
    p.validate()?;
    Ok(GlaJob {
        p,
        q: q.bf16(),
        k: k.bf16(),
        g: g.bf16(),
        v: v.bf16(),
        init: init.map(|t| t.f32()),
    })
}

/// A checked GLA problem and its inputs.
pub struct GlaJob {
    p: GlaProblem,
    q: Vec<bf16>,
    k: Vec<bf16>,
    g: Vec<bf16>,
    v: Vec<bf16>,
    init: Option<Vec<f32>>,
}

impl GlaJob {
    fn o_shape(&self) -> [usize; 4] {
        [self.p.batch, self.p.seq_len, self.p.heads, self.p.dv]
    }

    fn state_shape(&self) -> [usize; 4] {
        [self.p.num_seqs(), self.p.heads, self.p.dk, self.p.dv]
    }
}

impl Job for GlaJob {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        let stream = gpu.stream()?;
        let (q, k, g, v) = (
            upload(&self.q)?,
            upload(&self.k)?,
            upload(&self.g)?,
            upload(&self.v)?,
        );
        let init = self.init.as_deref().map(upload).transpose()?;
        let mut o = poisoned::<bf16>(p.v_len())?;
        let mut fin = poisoned::<f32>(p.state_len())?;
        let mut session = GlaSession::new(gpu, p)?;
        let inputs = GlaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            init_state: init.as_ref(),
        };
        let timings = launch_timed(gpu, &stream, repeat, "GLA forward", || {
            session.forward(
                gpu,
                &stream,
                &inputs,
                &mut GlaOutputs {
                    o: &mut o,
                    final_state: Some(&mut fin),
                },
            )
        })?;
        let mut out = Outputs::default();
        out.push("o", &self.o_shape(), Data::Bf16(download(&o)?));
        out.push(
            "final_state",
            &self.state_shape(),
            Data::F32(download(&fin)?),
        );
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let exact = recurrence(
            &self.p,
            &HostInputs {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                g: &self.g,
                init_state: self.init.as_deref(),
            },
        )?;
        let mut out = Outputs::default();
        out.push("o", &self.o_shape(), Data::F64(exact.o));
        out.push(
            "final_state",
            &self.state_shape(),
            Data::F64(exact.final_state),
        );
        Ok(out)
    }
}

/// `kernels-cli gla-backward --help`.
pub const HELP_BACKWARD: &str = "\
Gated linear attention (GLA) backward: the gradients of every input of the forward (see \
`kernels-cli gla --help`) given the gradients of its outputs. The forward's options (--scale, \
--segment-len) apply; the backward always runs the portable kernels (--kernel is ignored).

Inputs: those of `gla`, and
  d_o            bf16      [B, T, H, Dv]    gradient of o
  d_final_state  f32       [N, H, Dk, Dv]   optional: gradient of final_state (default zero)

Outputs:
  d_q            bf16      [B, T, H, Dk]    (f64 with --reference)
  d_k            bf16      [B, T, H, Dk]
  d_v            bf16      [B, T, H, Dv]
  d_g            f32       [B, T, H, Dk]    zero where g < -20 (the clamp)
  d_initial_state f32      [N, H, Dk, Dv]   (whether or not initial_state was given)

With --repeat the timed runs include the backward's workspace allocation.";

/// The tensors `gla-backward` reads.
pub const TENSORS_BACKWARD: &[&str] = &[
    "q",
    "k",
    "g",
    "v",
    "initial_state",
    "cu_seqlens",
    "d_o",
    "d_final_state",
];

/// Read and check the inputs of `gla-backward`, build the problem.
pub fn backward_job(args: &GlaArgs) -> Result<GlaBackwardJob> {
    let mut inp = Inputs::open(&args.common.input)?;
    let fwd = forward_inputs(&mut inp, args)?;
    let d_o = inp.take(
        "d_o",
        &[St::BF16],
        &[Dim::Var("B"), Dim::Var("T"), Dim::Var("H"), Dim::Var("Dv")],
    )?;
    let d_final = inp.take_opt(
        "d_final_state",
        &[St::F32],
        &[Dim::Var("N"), Dim::Var("H"), Dim::Var("Dk"), Dim::Var("Dv")],
    )?;
    inp.finish("gla-backward", TENSORS_BACKWARD, &[])?;
    Ok(GlaBackwardJob {
        fwd,
        d_o: d_o.bf16(),
        d_final: d_final.map(|t| t.f32()),
    })
}

/// A checked GLA backward problem and its inputs.
pub struct GlaBackwardJob {
    fwd: GlaJob,
    d_o: Vec<bf16>,
    d_final: Option<Vec<f32>>,
}

impl GlaBackwardJob {
    fn qk_shape(&self) -> [usize; 4] {
        let p = &self.fwd.p;
        [p.batch, p.seq_len, p.heads, p.dk]
    }
}

impl Job for GlaBackwardJob {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let f = &self.fwd;
        let p = &f.p;
        let stream = gpu.stream()?;
        let (q, k, g, v) = (upload(&f.q)?, upload(&f.k)?, upload(&f.g)?, upload(&f.v)?);
        let init = f.init.as_deref().map(upload).transpose()?;
        let d_o = upload(&self.d_o)?;
        let d_final = self.d_final.as_deref().map(upload).transpose()?;
        let mut d_q = poisoned::<bf16>(p.qk_len())?;
        let mut d_k = poisoned::<bf16>(p.qk_len())?;
        let mut d_v = poisoned::<bf16>(p.v_len())?;
        let mut d_g = poisoned::<f32>(p.qk_len())?;
        let mut d_init = poisoned::<f32>(p.state_len())?;
        let inputs = GlaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            init_state: init.as_ref(),
        };
        let out_grads = GlaOutputGrads {
            d_o: &d_o,
            d_final_state: d_final.as_ref(),
        };
        // One session: its workspace is allocated by the first run, not timed by the repeats.
        let mut session = GlaSession::new(gpu, p)?;
        let timings = launch_timed(gpu, &stream, repeat, "GLA backward", || {
            session.backward(
                gpu,
                &stream,
                &inputs,
                &out_grads,
                &mut GlaGradients {
                    d_q: &mut d_q,
                    d_k: &mut d_k,
                    d_v: &mut d_v,
                    d_g: &mut d_g,
                    d_init_state: &mut d_init,
                },
            )
        })?;
        let mut out = Outputs::default();
        out.push("d_q", &self.qk_shape(), Data::Bf16(download(&d_q)?));
        out.push("d_k", &self.qk_shape(), Data::Bf16(download(&d_k)?));
        out.push("d_v", &f.o_shape(), Data::Bf16(download(&d_v)?));
        out.push("d_g", &self.qk_shape(), Data::F32(download(&d_g)?));
        out.push(
            "d_initial_state",
            &f.state_shape(),
            Data::F32(download(&d_init)?),
        );
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let f = &self.fwd;
        let x = ExactInputs::from_host(&HostInputs {
            q: &f.q,
            k: &f.k,
            v: &f.v,
            g: &f.g,
            init_state: f.init.as_deref(),
        });
        let d_o: Vec<f64> = self.d_o.iter().map(|v| v.to_f64()).collect();
        let d_final: Option<Vec<f64>> = self
            .d_final
            .as_ref()
            .map(|s| s.iter().map(|&v| v as f64).collect());
        let grads = backward(
            &f.p,
            &x,
            &OutputGrads {
                d_o: &d_o,
                d_final_state: d_final.as_deref(),
            },
        )?;
        let mut out = Outputs::default();
        out.push("d_q", &self.qk_shape(), Data::F64(grads.dq));
        out.push("d_k", &self.qk_shape(), Data::F64(grads.dk));
        out.push("d_v", &f.o_shape(), Data::F64(grads.dv));
        out.push("d_g", &self.qk_shape(), Data::F64(grads.dg));
        out.push(
            "d_initial_state",
            &f.state_shape(),
            Data::F64(grads.d_init_state),
        );
        Ok(out)
    }
}
