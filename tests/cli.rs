//! `kernels-cli` end to end through its library entry point (argument parsing, input files,
//! problem checks, the run, the output file): every subcommand in `--reference` mode against
//! the library's references called directly, bad inputs (one-line typed errors, no output
//! left behind), and on a GPU every subcommand in `--check` mode.
//!
//! Inputs are written and outputs read with the `safetensors` crate directly, not with the
//! tool's own reader and writer, so a layout mistake cannot cancel out.

use clap::Parser;
use kernel_tests::{Needs, Suite, TestFailure, TestResult, ensure};
use kernels::attention::{AttentionDecodeProblem, AttentionProblem, Dtype as AttnDtype};
use kernels::data::{rng, uniform_bf16, uniform_f16, uniform_f32};
use kernels::gla::GlaProblem;
use kernels::gla::reference::{ExactInputs, HostInputs, OutputGrads, recurrence};
use kernels::mhc::MhcProblem;
use kernels::mhc::reference::{self as mref, MhcData};
use kernels::semicrf::reference::{self as sref, Model};
use kernels::semicrf::{SemiCrfInputs, SemiCrfProblem, cumulative_scores};
use kernels::{Gpu, bf16, f16};
use kernels_cli::{Cli, CliError, Report};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

// The attention subcommands' reference checks (tests/cli/attention.rs), the error cases
// (tests/cli/errors.rs) and the GPU checks (tests/cli/gpu.rs).
#[path = "cli/attention.rs"]
mod attention;
#[path = "cli/errors.rs"]
mod errors;
#[path = "cli/gpu.rs"]
mod gpu;
use attention::*;
use errors::{NO_GPU_CASE, error_tests, fails, run_error_cases};
use gpu::*;

fn main() {
    let mut s = Suite::new();
    s.cpu("reference/attention_bf16_causal_gqa", attention_bf16_causal);
    s.cpu("reference/attention_f16_window_mqa", attention_f16_window);
    s.cpu(
        "reference/attention_backward_dlse",
        attention_backward_reference,
    );
    s.cpu("reference/attention_varlen_causal_gqa", attention_varlen);
    s.cpu("reference/attention_decode_paged", attention_decode);
    s.cpu("reference/gla_varlen_initial_state", gla_varlen);
    s.cpu("reference/gla_batch", gla_batch);
    s.cpu("reference/gla_backward_varlen", gla_backward_varlen);
    s.cpu("reference/semicrf_forward_viterbi", semicrf_forward_viterbi);
    s.cpu("reference/semicrf_backward_marginals", semicrf_backward);
    s.cpu(
        "reference/semicrf_backward_grad_scores_finite_differences",
        semicrf_grad_scores,
    );
    s.cpu("reference/mhc_forward", mhc_forward);
    s.cpu("reference/mhc_backward", mhc_backward);
    s.cpu("info/lists_ptx_targets", info);
    s.cpu("args/conflicts_and_ranges", args);
    for (name, cases) in error_tests() {
        s.cpu(name, move || run_error_cases(cases));
    }
    if kernel_tests::gpu().is_err() {
        s.cpu(NO_GPU_CASE.test, || {
            run_error_cases(std::slice::from_ref(&NO_GPU_CASE))
        });
    }
    s.gpu("gpu/attention_check", Needs::Gpu, gpu_attention);
    s.gpu(
        "gpu/attention_varlen_check",
        Needs::Gpu,
        gpu_attention_varlen,
    );
    s.gpu(
        "gpu/attention_capsink_check",
        Needs::Gpu,
        gpu_attention_capsink,
    );
    s.gpu(
        "gpu/attention_backward_check",
        Needs::Gpu,
        gpu_attention_backward,
    );
    s.gpu(
        "gpu/attention_decode_check",
        Needs::Gpu,
        gpu_attention_decode,
    );
    s.gpu(
        "gpu/attention_fp8_check",
        Needs::Hopper,
        gpu::gpu_attention_fp8,
    );
    s.gpu("gpu/gla_check", Needs::Gpu, gpu_gla);
    s.gpu("gpu/gla_backward_check", Needs::Gpu, gpu_gla_backward);
    s.gpu("gpu/gla_kernels_check", Needs::Hopper, gpu_gla_kernels);
    s.gpu("gpu/semicrf_check", Needs::Gpu, gpu_semicrf);
    s.gpu("gpu/mhc_check", Needs::Gpu, gpu_mhc);
    s.run()
}

// ---------------------------------------------------------------------------------------------
// Files.

/// A scratch directory under the system's temporary directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let p =
            std::env::temp_dir().join(format!("kernels-cli-test-{}-{}", std::process::id(), test));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("creating a scratch directory");
        Dir(p)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    fn s(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    /// The words of the command line `line` (split at spaces), a word `@name` standing for the
    /// file `name` of the directory.
    fn command(&self, line: &str) -> Vec<String> {
        line.split_whitespace()
            .map(|w| match w.strip_prefix('@') {
                Some(file) => self.s(file),
                None => w.to_string(),
            })
            .collect()
    }

    /// The names of the files in the directory, sorted.
    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Every file of the directory with its bytes.
    fn contents(&self) -> Result<BTreeMap<String, Vec<u8>>, TestFailure> {
        self.files()
            .into_iter()
            .map(|f| match std::fs::read(self.path(&f)) {
                Ok(bytes) => Ok((f, bytes)),
                Err(e) => Err(format!("{f}: {e}").into()),
            })
            .collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Values of an input tensor.
#[derive(Clone)]
enum V {
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    F32(Vec<f32>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    /// e4m3 bytes.
    E4m3(Vec<u8>),
}

impl V {
    fn dtype(&self) -> Dtype {
        match self {
            V::Bf16(_) => Dtype::BF16,
            V::F16(_) => Dtype::F16,
            V::F32(_) => Dtype::F32,
            V::I32(_) => Dtype::I32,
            V::I64(_) => Dtype::I64,
            V::E4m3(_) => Dtype::F8_E4M3,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            V::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            V::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            V::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            V::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            V::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            V::E4m3(v) => v.clone(),
        }
    }
}

type Named = (&'static str, Vec<usize>, V);

fn write_inputs(path: &Path, tensors: &[Named]) -> TestResult {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| t.2.bytes()).collect();
    let mut views = Vec::new();
    for (t, b) in tensors.iter().zip(&bytes) {
        let view = safetensors::tensor::TensorView::new(t.2.dtype(), t.1.clone(), b)
            .map_err(|e| format!("test input {}: {e}", t.0))?;
        views.push((t.0.to_string(), view));
    }
    safetensors::serialize_to_file(views, &None, path)
        .map_err(|e| format!("writing {}: {e}", path.display()).into())
}

/// One output tensor, values widened to f64.
struct Out {
    dtype: Dtype,
    shape: Vec<usize>,
    values: Vec<f64>,
}

fn read_outputs(path: &Path) -> Result<BTreeMap<String, Out>, TestFailure> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        let d = view.data();
        let values: Vec<f64> = match view.dtype() {
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
                .collect(),
            Dtype::F64 => d
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64)
                .collect(),
            other => return Err(format!("output {name}: unexpected dtype {other:?}").into()),
        };
        out.insert(
            name.to_string(),
            Out {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                values,
            },
        );
    }
    Ok(out)
}

/// Parse `args` as the command line and run it (on `gpu` for the GPU paths, if given).
fn cli_on(args: &[impl AsRef<str>], gpu: Option<&Gpu>) -> Result<Report, CliError> {
    let words = args.iter().map(|a| a.as_ref());
    let cli = Cli::try_parse_from(std::iter::once("kernels-cli").chain(words))
        .map_err(|e| CliError::Internal(format!("argument parsing: {e}")))?;
    kernels_cli::run_with(&cli, gpu)
}

fn cli(args: &[impl AsRef<str>]) -> Result<Report, CliError> {
    cli_on(args, None)
}

/// `args` joined into one line, for messages.
fn line(args: &[impl AsRef<str>]) -> String {
    let words: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
    words.join(" ")
}

fn ok(args: &[impl AsRef<str>]) -> Result<Report, TestFailure> {
    cli(args).map_err(|e| format!("kernels-cli {}: {e}", line(args)).into())
}

/// `name` has `dtype` and `shape`, and its values equal `want` exactly (the tool and the test
/// call the same reference function on the same inputs).
fn exact(
    out: &BTreeMap<String, Out>,
    name: &str,
    dtype: Dtype,
    shape: &[usize],
    want: &[f64],
) -> TestResult {
    let o = out
        .get(name)
        .ok_or_else(|| format!("output `{name}` missing; have {:?}", out.keys()))?;
    ensure(o.dtype == dtype, || {
        format!("{name}: dtype {:?}, expected {dtype:?}", o.dtype)
    })?;
    ensure(o.shape == shape, || {
        format!("{name}: shape {:?}, expected {shape:?}", o.shape)
    })?;
    ensure(o.values.len() == want.len(), || {
        format!("{name}: {} values, expected {}", o.values.len(), want.len())
    })?;
    match o.values.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!("{name}[{i}]: {} != reference {}", o.values[i], want[i]).into()),
    }
}

/// As [`exact`] within `tol` times the largest `|want|` (sums the tool forms in another order).
fn close(
    out: &BTreeMap<String, Out>,
    name: &str,
    shape: &[usize],
    want: &[f64],
    tol: f64,
) -> TestResult {
    let o = out
        .get(name)
        .ok_or_else(|| format!("output `{name}` missing; have {:?}", out.keys()))?;
    ensure(o.shape == shape, || {
        format!("{name}: shape {:?}, expected {shape:?}", o.shape)
    })?;
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    let err = o
        .values
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((g - w).abs()));
    println!("{name}: max |err| = {err:.3e} (scale {scale:.3e})");
    ensure(o.values.len() == want.len() && err <= tol * scale, || {
        format!("{name}: max |err| {err:.3e} > {tol:e} x {scale:.3e}")
    })
}

// ---------------------------------------------------------------------------------------------
// Reference mode, every subcommand.

fn gla_varlen() -> TestResult {
    let d = Dir::new("gla_varlen");
    let cu = vec![0usize, 3, 8, 13];
    let p = GlaProblem::varlen(cu.clone(), 2, 64, 128).with_scale(0.25);
    let mut r = rng(21);
    let q = uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let k = uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let g = uniform_bf16(&mut r, p.qk_len(), -1.0, 0.0);
    let v = uniform_bf16(&mut r, p.v_len(), -1.0, 1.0);
    let init = uniform_f32(&mut r, p.state_len(), -1.0, 1.0);
    let qk = vec![1, 13, 2, 64];
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", qk.clone(), V::Bf16(q.clone())),
            ("k", qk.clone(), V::Bf16(k.clone())),
            ("g", qk, V::Bf16(g.clone())),
            ("v", vec![1, 13, 2, 128], V::Bf16(v.clone())),
            ("initial_state", vec![3, 2, 64, 128], V::F32(init.clone())),
            (
                "cu_seqlens",
                vec![4],
                V::I32(cu.iter().map(|&x| x as i32).collect()),
            ),
        ],
    )?;
    ok(&d.command("gla @in.safetensors -o @out.safetensors --reference --scale 0.25"))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = recurrence(
        &p,
        &HostInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            init_state: Some(&init),
        },
    )
    .map_err(|e| e.to_string())?;
    exact(&out, "o", Dtype::F64, &[1, 13, 2, 128], &want.o)?;
    exact(
        &out,
        "final_state",
        Dtype::F64,
        &[3, 2, 64, 128],
        &want.final_state,
    )
}

/// `gla-backward --reference` on packed sequences with initial states and a final-state
/// gradient: exactly the f64 backward.
fn gla_backward_varlen() -> TestResult {
    let d = Dir::new("gla_backward_varlen");
    let cu = vec![0usize, 1, 6, 9];
    let p = GlaProblem::varlen(cu.clone(), 2, 64, 128).with_scale(0.25);
    let mut r = rng(23);
    let q = uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let k = uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let g = uniform_bf16(&mut r, p.qk_len(), -21.0, 0.0);
    let v = uniform_bf16(&mut r, p.v_len(), -1.0, 1.0);
    let init = uniform_f32(&mut r, p.state_len(), -1.0, 1.0);
    let d_o = uniform_bf16(&mut r, p.v_len(), -1.0, 1.0);
    let d_final = uniform_f32(&mut r, p.state_len(), -1.0, 1.0);
    let (qk, vs, st) = (vec![1, 9, 2, 64], vec![1, 9, 2, 128], vec![3, 2, 64, 128]);
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", qk.clone(), V::Bf16(q.clone())),
            ("k", qk.clone(), V::Bf16(k.clone())),
            ("g", qk.clone(), V::Bf16(g.clone())),
            ("v", vs.clone(), V::Bf16(v.clone())),
            ("initial_state", st.clone(), V::F32(init.clone())),
            (
                "cu_seqlens",
                vec![4],
                V::I32(cu.iter().map(|&x| x as i32).collect()),
            ),
            ("d_o", vs.clone(), V::Bf16(d_o.clone())),
            ("d_final_state", st.clone(), V::F32(d_final.clone())),
        ],
    )?;
    ok(&d.command("gla-backward @in.safetensors -o @out.safetensors --reference --scale 0.25"))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let x = ExactInputs::from_host(&HostInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        init_state: Some(&init),
    });
    let d_o: Vec<f64> = d_o.iter().map(|v| v.to_f64()).collect();
    let d_final: Vec<f64> = d_final.iter().map(|&v| v as f64).collect();
    let want = kernels::gla::reference::backward(
        &p,
        &x,
        &OutputGrads {
            d_o: &d_o,
            d_final_state: Some(&d_final),
        },
    )
    .map_err(|e| e.to_string())?;
    exact(&out, "d_q", Dtype::F64, &qk, &want.dq)?;
    exact(&out, "d_k", Dtype::F64, &qk, &want.dk)?;
    exact(&out, "d_v", Dtype::F64, &vs, &want.dv)?;
    exact(&out, "d_g", Dtype::F64, &qk, &want.dg)?;
    exact(&out, "d_initial_state", Dtype::F64, &st, &want.d_init_state)
}

fn gla_batch() -> TestResult {
    let d = Dir::new("gla_batch");
    let p = GlaProblem::new(2, 5, 1, 64, 64);
    let mut r = rng(22);
    let q = uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let k = uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let g = uniform_bf16(&mut r, p.qk_len(), -2.0, 0.0);
    let v = uniform_bf16(&mut r, p.v_len(), -1.0, 1.0);
    let shape = vec![2, 5, 1, 64];
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", shape.clone(), V::Bf16(q.clone())),
            ("k", shape.clone(), V::Bf16(k.clone())),
            ("g", shape.clone(), V::Bf16(g.clone())),
            ("v", shape.clone(), V::Bf16(v.clone())),
        ],
    )?;
    ok(&d.command("gla @in.safetensors -o @out.safetensors --reference"))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = recurrence(
        &p,
        &HostInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            init_state: None,
        },
    )
    .map_err(|e| e.to_string())?;
    exact(&out, "o", Dtype::F64, &shape, &want.o)?;
    exact(
        &out,
        "final_state",
        Dtype::F64,
        &[2, 1, 64, 64],
        &want.final_state,
    )
}

fn semicrf_forward_viterbi() -> TestResult {
    let d = Dir::new("semicrf_forward");
    let (b, t, k, c) = (3, 12, 4, 3);
    let mut r = rng(31);
    let scores = uniform_f32(&mut r, b * t * c, -1.0, 1.0);
    let dur = uniform_f32(&mut r, k * c, -0.5, 0.5);
    let trans = uniform_f32(&mut r, c * c, -0.5, 0.5);
    let lengths = vec![12u32, 7, 1];
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("scores", vec![b, t, c], V::F32(scores.clone())),
            ("dur", vec![k, c], V::F32(dur.clone())),
            ("trans", vec![c, c], V::F32(trans.clone())),
            (
                "lengths",
                vec![b],
                V::I64(lengths.iter().map(|&l| l as i64).collect()),
            ),
        ],
    )?;
    ok(&d.command("semicrf @in.safetensors -o @out.safetensors --reference --viterbi"))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let cumsum = cumulative_scores(&scores, b, t, c).map_err(|e| e.to_string())?;
    let p = SemiCrfProblem::new(b, t, k, c);
    let m = Model::new(
        &p,
        &SemiCrfInputs {
            cumsum: &cumsum,
            dur: &dur,
            trans: &trans,
            lengths: &lengths,
        },
    );
    exact(&out, "log_z", Dtype::F64, &[b], &sref::log_partition(&m))?;
    let best = sref::viterbi(&m);
    let scores_want: Vec<f64> = best.iter().map(|x| x.0).collect();
    exact(&out, "viterbi_score", Dtype::F64, &[b], &scores_want)?;
    let counts: Vec<f64> = best.iter().map(|x| x.1.len() as f64).collect();
    exact(&out, "viterbi_count", Dtype::I64, &[b], &counts)?;
    let field = |f: fn(&sref::Segment) -> usize| -> Vec<f64> {
        best.iter()
            .flat_map(|(_, segs)| (0..t).map(move |j| segs.get(j).map_or(-1.0, |s| f(s) as f64)))
            .collect()
    };
    exact(
        &out,
        "viterbi_start",
        Dtype::I64,
        &[b, t],
        &field(|s| s.start),
    )?;
    exact(&out, "viterbi_dur", Dtype::I64, &[b, t], &field(|s| s.dur))?;
    exact(
        &out,
        "viterbi_label",
        Dtype::I64,
        &[b, t],
        &field(|s| s.label),
    )
}

fn semicrf_backward() -> TestResult {
    let d = Dir::new("semicrf_backward");
    let (b, t, k, c) = (2, 6, 3, 2);
    let p = SemiCrfProblem::new(b, t, k, c).with_checkpoint(2);
    let inp = kernels_testing::semicrf::random_inputs(&p, 32, false);
    let lengths = vec![6u32, 4];
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("cumsum", vec![b, t + 1, c], V::F32(inp.cumsum.clone())),
            ("dur", vec![k, c], V::F32(inp.dur.clone())),
            ("trans", vec![c, c], V::F32(inp.trans.clone())),
            ("lengths", vec![b], V::I32(vec![6, 4])),
        ],
    )?;
    ok(&d.command(
        "semicrf-backward @in.safetensors -o @out.safetensors --reference --marginals \
         --checkpoint 2",
    ))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let m = Model::new(
        &p,
        &SemiCrfInputs {
            cumsum: &inp.cumsum,
            dur: &inp.dur,
            trans: &inp.trans,
            lengths: &lengths,
        },
    );
    let want = sref::posterior(&m);
    ensure(!out.contains_key("grad_scores"), || {
        "grad_scores written although `cumsum` was given".into()
    })?;
    exact(&out, "log_z", Dtype::F64, &[b], &want.log_z)?;
    exact(
        &out,
        "grad_cumsum",
        Dtype::F64,
        &[b, t + 1, c],
        &want.grad_cumsum,
    )?;
    exact(
        &out,
        "marginals",
        Dtype::F64,
        &[b, t, k, c],
        &want.marginals,
    )?;
    // Summed over the sequences in another order: equal to rounding.
    close(&out, "grad_dur", &[k, c], &want.grad_dur, 1e-13)?;
    close(&out, "grad_trans", &[c, c], &want.grad_trans, 1e-13)
}

/// `grad_scores` against central differences of the f64 log Z: raising `scores[b, t, c]` by h
/// raises `S[b, u, c]` for every `u > t`.
fn semicrf_grad_scores() -> TestResult {
    let d = Dir::new("semicrf_grad_scores");
    let (b, t, k, c) = (2, 8, 3, 2);
    let mut r = rng(33);
    let scores = uniform_f32(&mut r, b * t * c, -1.0, 1.0);
    let dur = uniform_f32(&mut r, k * c, -0.5, 0.5);
    let trans = uniform_f32(&mut r, c * c, -0.5, 0.5);
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("scores", vec![b, t, c], V::F32(scores.clone())),
            ("dur", vec![k, c], V::F32(dur.clone())),
            ("trans", vec![c, c], V::F32(trans.clone())),
        ],
    )?;
    ok(&d.command("semicrf-backward @in.safetensors -o @out.safetensors --reference"))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let gs = out
        .get("grad_scores")
        .ok_or("grad_scores missing although `scores` was given")?;
    ensure(gs.shape == [b, t, c], || {
        format!("grad_scores shape {:?}", gs.shape)
    })?;
    let cumsum = cumulative_scores(&scores, b, t, c).map_err(|e| e.to_string())?;
    let lengths = vec![t as u32; b];
    let p = SemiCrfProblem::new(b, t, k, c);
    let base = Model::new(
        &p,
        &SemiCrfInputs {
            cumsum: &cumsum,
            dur: &dur,
            trans: &trans,
            lengths: &lengths,
        },
    );
    let h = 1e-4;
    let mut worst = 0.0f64;
    for bi in 0..b {
        for ti in 0..t {
            for ci in 0..c {
                let shifted = |sign: f64| {
                    let mut m = base.clone();
                    for u in ti + 1..=t {
                        m.cumsum[(bi * (t + 1) + u) * c + ci] += sign * h;
                    }
                    sref::log_partition(&m)[bi]
                };
                let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * h);
                let got = gs.values[(bi * t + ti) * c + ci];
                worst = worst.max((got - fd).abs());
            }
        }
    }
    println!("grad_scores vs central differences: max |err| = {worst:.3e}");
    ensure(worst < 1e-7, || {
        format!("grad_scores differs from central differences by {worst:.3e}")
    })
}

fn mhc_tensors(data: &MhcData, with_y: bool, with_grads: bool) -> Vec<Named> {
    let p = &data.problem;
    let (b, s, n, c, k, m) = (p.batch, p.seq, p.n, p.c, p.k(), p.m());
    let mut v: Vec<Named> = vec![
        ("x", vec![b, s, n, c], V::Bf16(data.x.clone())),
        ("phi", vec![k, m], V::F32(data.phi.clone())),
        ("alpha", vec![3], V::F32(data.alpha.to_vec())),
        ("bias", vec![m], V::F32(data.bias.clone())),
    ];
    if let Some(g) = &data.gamma {
        v.push(("gamma", vec![k], V::F32(g.clone())));
    }
    if with_y {
        v.push(("y", vec![b, s, c], V::Bf16(data.y.clone())));
    }
    if with_grads {
        v.push(("d_xin", vec![b, s, c], V::Bf16(data.d_xin.clone())));
        v.push(("d_xnext", vec![b, s, n, c], V::Bf16(data.d_xnext.clone())));
    }
    v
}

fn mhc_forward() -> TestResult {
    let d = Dir::new("mhc_forward");
    let p = MhcProblem::new(1, 3, 4, 16)
        .with_gamma(true)
        .with_iters(5)
        .with_eps(1e-5);
    let data = MhcData::random(&p, 41);
    let (n, c, k, m) = (p.n, p.c, p.k(), p.m());
    let w = data.weights();
    let want: Vec<mref::TokenForward> = (0..p.tokens())
        .map(|t| {
            mref::token_forward(
                &p,
                &w,
                &MhcData::token(&data.x, t, k),
                &MhcData::token(&data.y, t, c),
            )
        })
        .collect();
    let cat = |f: &dyn Fn(&mref::TokenForward) -> Vec<f64>| -> Vec<f64> {
        want.iter().flat_map(f).collect()
    };
    // With y (and the upstream gradients, which the forward ignores), then without y.
    for (file, with_y) in [("full", true), ("no_y", false)] {
        let (input, output) = (
            format!("{file}.safetensors"),
            format!("{file}.out.safetensors"),
        );
        write_inputs(&d.path(&input), &mhc_tensors(&data, with_y, with_y))?;
        ok(&d.command(&format!(
            "mhc @{input} -o @{output} --reference --t-max 5 --eps 1e-5"
        )))?;
        let out = read_outputs(&d.path(&output))?;
        exact(
            &out,
            "x_in",
            Dtype::F64,
            &[1, 3, c],
            &cat(&|f| f.x_in.clone()),
        )?;
        if with_y {
            exact(
                &out,
                "x_next",
                Dtype::F64,
                &[1, 3, n, c],
                &cat(&|f| f.x_next.clone()),
            )?;
        } else {
            ensure(!out.contains_key("x_next"), || "x_next without y".into())?;
        }
        exact(
            &out,
            "h_pre",
            Dtype::F64,
            &[1, 3, n],
            &cat(&|f| f.h_pre.clone()),
        )?;
        exact(
            &out,
            "h_post",
            Dtype::F64,
            &[1, 3, n],
            &cat(&|f| f.h_post.clone()),
        )?;
        exact(
            &out,
            "h_res",
            Dtype::F64,
            &[1, 3, n, n],
            &cat(&|f| f.h_res.clone()),
        )?;
        exact(
            &out,
            "hproj",
            Dtype::F64,
            &[1, 3, m],
            &cat(&|f| f.hproj.clone()),
        )?;
        exact(&out, "rms", Dtype::F64, &[1, 3], &cat(&|f| vec![f.rms]))?;
    }
    Ok(())
}

fn mhc_backward() -> TestResult {
    let d = Dir::new("mhc_backward");
    let p = MhcProblem::new(2, 2, 2, 8).with_gamma(true).with_iters(3);
    let data = MhcData::random(&p, 42);
    write_inputs(&d.path("in.safetensors"), &mhc_tensors(&data, true, true))?;
    ok(&d.command(
        "mhc-backward @in.safetensors -o @out.safetensors --reference --sinkhorn-iters 3",
    ))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let r = mref::reference(&data);
    let (n, c, k, m) = (p.n, p.c, p.k(), p.m());
    let dx: Vec<f64> = r.backward.iter().flat_map(|b| b.dx.clone()).collect();
    let dy: Vec<f64> = r.backward.iter().flat_map(|b| b.dy.clone()).collect();
    exact(&out, "dx", Dtype::F64, &[2, 2, n, c], &dx)?;
    exact(&out, "dy", Dtype::F64, &[2, 2, c], &dy)?;
    exact(&out, "dphi", Dtype::F64, &[k, m], &r.grads.dphi)?;
    exact(
        &out,
        "dgamma",
        Dtype::F64,
        &[k],
        r.grads.dgamma.as_deref().unwrap_or(&[]),
    )?;
    exact(&out, "dalpha", Dtype::F64, &[3], &r.grads.dalpha)?;
    exact(&out, "dbias", Dtype::F64, &[m], &r.grads.dbias)
}

fn info() -> TestResult {
    let report = ok(&["info"])?;
    let text = report.to_string();
    print!("{text}");
    for want in ["sm_90a", "sm_80", "driver", "gpu"] {
        ensure(text.contains(want), || {
            format!("`info` does not mention {want}: {text}")
        })?;
    }
    Ok(())
}

fn args() -> TestResult {
    for bad in [
        &["attention", "in", "-o", "out", "--reference", "--check"][..],
        &[
            "attention",
            "in",
            "-o",
            "out",
            "--reference",
            "--repeat",
            "3",
        ],
        &["attention", "in", "-o", "out", "--repeat", "0"],
        &["attention", "in"],
        &[
            "attention-backward",
            "in",
            "-o",
            "out",
            "--reference",
            "--check",
        ],
        &["attention-backward", "in", "-o", "out", "--path", "hopper"],
        &[
            "attention-decode",
            "in",
            "-o",
            "out",
            "--reference",
            "--check",
        ],
        &["attention-decode", "in", "-o", "out", "--num-splits", "0"],
        &["attention-decode", "in", "-o", "out", "--num-splits", "129"],
        &["attention-decode", "in", "-o", "out", "--window-left", "4"],
        &["semicrf", "in", "-o", "out", "--marginals"],
        &["gla", "in", "-o", "out", "--kernel", "fastest"],
    ] {
        let r = Cli::try_parse_from(std::iter::once("kernels-cli").chain(bad.iter().copied()));
        ensure(r.is_err(), || format!("accepted: {bad:?}"))?;
    }
    Ok(())
}
