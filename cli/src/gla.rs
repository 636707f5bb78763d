//! `gla`: the gated linear attention forward (`kernels::gla`).

use crate::tensors::{Data, Dim, Inputs, Outputs};
use crate::{CliError, Common, Job, Result, launch_timed};
use clap::Args;
use half::bf16;
use kernels::Gpu;
use kernels::gla::reference::{HostInputs, recurrence};
use kernels::gla::{GlaInputs, GlaKernel, GlaOutputs, GlaProblem, GlaSession};
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
    inp.finish("gla", TENSORS, &[])?;
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
