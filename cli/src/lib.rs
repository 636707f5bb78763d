//! `kernels-cli`: run one of the library's kernels on tensors from a safetensors file and write
//! its outputs to another, or run the f64 CPU reference instead (`--reference`), or both with
//! a report of the differences (`--check`).
//!
//! The binary (`src/main.rs`) parses the command line into [`Cli`] and calls [`run`]; tests call
//! [`run`] with arguments parsed by [`Cli::try_parse_from`]. Each subcommand reads and checks
//! its inputs ([`tensors::Inputs`]), builds the library's typed problem (validated by the
//! library, so the tool accepts exactly what the kernels accept), and hands a [`Job`] to one
//! driver that runs the GPU or the reference and writes the outputs atomically.
#![warn(missing_docs)]

pub mod attention;
pub mod compare;
pub mod error;
pub mod gla;
pub mod info;
pub mod mhc;
pub use kernels::progress;
pub mod semicrf;
pub mod tensors;

pub use error::{CliError, Result};

use clap::{Args, Parser, Subcommand};
use kernels::timing::{Timings, time_on_stream};
use kernels::{Gpu, Stream};
use std::collections::HashMap;
use std::path::PathBuf;
use tensors::Outputs;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "kernels-cli",
    version,
    about = "Run the library's GPU kernels (or their f64 CPU references) on safetensors files",
    long_about = "Run the library's GPU kernels (or their f64 CPU references) on safetensors \
                  files.\n\nEach kernel subcommand reads named tensors from INPUT (a safetensors \
                  file, e.g. written by `safetensors.torch.save_file`), runs the kernel on the \
                  GPU and writes its outputs to --output. Tensors are contiguous and row-major, \
                  in the layouts listed by `kernels-cli <subcommand> --help`. Errors print one \
                  line and exit with status 1; no output file is left behind on error."
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attention forward: O = softmax(scale Q K^T + mask) V and the row log-sum-exp.
    #[command(long_about = attention::HELP)]
    Attention(attention::AttentionArgs),
    /// Attention backward: dQ, dK, dV from the forward's O and LSE and the gradient dO.
    #[command(long_about = attention::HELP_BACKWARD)]
    AttentionBackward(attention::AttentionBackwardArgs),
    /// Attention decode over a paged KV cache (block table, split-KV): O and the row
    /// log-sum-exp of each sequence's new tokens.
    #[command(long_about = attention::HELP_DECODE)]
    AttentionDecode(attention::AttentionDecodeArgs),
    /// Gated linear attention (GLA) forward, chunkwise, after fla's chunk_gla.
    #[command(long_about = gla::HELP)]
    Gla(gla::GlaArgs),
    /// Gated linear attention (GLA) backward: gradients of every input from dO (and dS_final).
    #[command(long_about = gla::HELP_BACKWARD)]
    GlaBackward(gla::GlaArgs),
    /// Semi-Markov CRF forward: log Z per sequence, and the Viterbi segmentation (--viterbi).
    #[command(long_about = semicrf::HELP_FORWARD)]
    Semicrf(semicrf::SemicrfArgs),
    /// Semi-Markov CRF backward: log Z, gradients of log Z, segment marginals (--marginals).
    #[command(long_about = semicrf::HELP_BACKWARD)]
    SemicrfBackward(semicrf::SemicrfBackwardArgs),
    /// mHC forward: coefficients (RMS, projection, Sinkhorn), x_in and x_next.
    #[command(long_about = mhc::HELP_FORWARD)]
    Mhc(mhc::MhcArgs),
    /// mHC backward: gradients of x, y and the weights from upstream gradients.
    #[command(long_about = mhc::HELP_BACKWARD)]
    MhcBackward(mhc::MhcArgs),
    /// The GPU (name, compute capability, driver) and the embedded PTX targets.
    Info,
}

/// Options every kernel subcommand takes.
#[derive(Clone, Debug, Args)]
pub struct Common {
    /// Input safetensors file.
    pub input: PathBuf,
    /// Output safetensors file. Written to a temporary file in the same directory and renamed
    /// on success, so an error never leaves a partial output (an existing file is replaced
    /// only on success).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Run the f64 CPU reference (the specification) instead of the GPU kernel; needs no GPU.
    /// For small problems. Floating-point outputs are then written as f64.
    #[arg(long, conflicts_with_all = ["check", "repeat"])]
    pub reference: bool,
    /// Run the GPU kernel and the CPU reference on the same inputs, print the max abs and
    /// relative L2 error of every output, and write the kernel's outputs. Subcommands with a
    /// tolerance rule (`attention-backward`, `attention-decode`) also compare each output's
    /// error with its tolerance and fail (exit status 1, no output written) when one exceeds it.
    #[arg(long)]
    pub check: bool,
    /// Time the kernel: one warm-up run, then N timed runs (CUDA events); prints the median and
    /// the minimum. The outputs of the last run are written.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: Option<u32>,
}

/// What a run produced, for the caller to print.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Lines for stdout.
    pub lines: Vec<String>,
    /// With `--check`: the error of every output.
    pub diffs: Vec<compare::Diff>,
    /// With `--repeat`: the timings.
    pub timings: Option<Timings>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for l in &self.lines {
            writeln!(f, "{l}")?;
        }
        Ok(())
    }
}

/// One kernel run, set up from checked inputs: the GPU path and the reference path compute
/// outputs of the same names and shapes.
pub trait Job {
    /// The kernel on `gpu` (once, or 1 + `repeat` times with timing); its outputs.
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)>;
    /// The f64 CPU reference; its outputs (floating-point ones in f64).
    fn reference(&self) -> Result<Outputs>;
    /// With `--check`: the largest error against `reference` (the output of [`Job::reference`])
    /// each named output may have, by the tests' tolerance rule; `--check` fails when one is
    /// exceeded. Empty (the default) for a job whose check only reports.
    fn tolerances(&self, reference: &Outputs) -> Result<Vec<(String, f64)>> {
        let _ = reference;
        Ok(Vec::new())
    }
}

/// Run the command line (the GPU paths open device 0 as [`Gpu::new`] does).
pub fn run(cli: &Cli) -> Result<Report> {
    run_with(cli, None)
}

/// Run the command line, with the GPU paths on `gpu` where given (tests share one).
pub fn run_with(cli: &Cli, gpu: Option<&Gpu>) -> Result<Report> {
    match &cli.command {
        Command::Attention(a) => execute("attention", &a.common, &*attention::job(a)?, gpu),
        Command::AttentionBackward(a) => execute(
            "attention-backward",
            &a.common,
            &*attention::backward_job(a)?,
            gpu,
        ),
        Command::AttentionDecode(a) => execute(
            "attention-decode",
            &a.common,
            &*attention::decode_job(a)?,
            gpu,
        ),
        Command::Gla(a) => execute("gla", &a.common, &gla::job(a)?, gpu),
        Command::GlaBackward(a) => execute("gla-backward", &a.common, &gla::backward_job(a)?, gpu),
        Command::Semicrf(a) => execute("semicrf", &a.common, &semicrf::forward_job(a)?, gpu),
        Command::SemicrfBackward(a) => execute(
            "semicrf-backward",
            &a.common,
            &semicrf::backward_job(a)?,
            gpu,
        ),
        Command::Mhc(a) => execute("mhc", &a.common, &mhc::job(a, false)?, gpu),
        Command::MhcBackward(a) => execute("mhc-backward", &a.common, &mhc::job(a, true)?, gpu),
        Command::Info => Ok(Report {
            lines: info::lines(),
            ..Report::default()
        }),
    }
}

/// The GPU, or [`CliError::NoGpu`] saying why there is none.
pub fn open_gpu() -> Result<Gpu> {
    Gpu::new().map_err(|e| match e {
        kernels::Error::NoDevice { reason } => CliError::NoGpu { reason },
        e @ kernels::Error::UnsupportedDevice { .. } => CliError::NoGpu {
            reason: e.to_string(),
        },
        e => CliError::Kernel(e),
    })
}

fn execute(command: &str, common: &Common, job: &dyn Job, gpu: Option<&Gpu>) -> Result<Report> {
    let mut report = Report::default();
    let (outputs, mode) = if common.reference {
        (job.reference()?, "reference")
    } else {
        let opened;
        let gpu = match gpu {
            Some(g) => g,
            None => {
                opened = open_gpu()?;
                &opened
            }
        };
        let (outputs, timings) = job.gpu(gpu, common.repeat)?;
        if let Some(t) = &timings {
            report.lines.push(format!(
                "{command}: {} timed runs on {} ({}): median {:.4} ms, min {:.4} ms",
                t.samples_ms.len(),
                gpu.info().name,
                gpu.arch(),
                t.median_ms(),
                t.min_ms()
            ));
        }
        report.timings = timings;
        if common.check {
            let reference = job.reference()?;
            report.diffs = compare::compare(&outputs, &reference);
            report
                .lines
                .push(format!("{command}: kernel vs f64 reference"));
            report.lines.extend(compare::table(&report.diffs));
            let tolerances = job.tolerances(&reference)?;
            let mut failures = Vec::new();
            for (name, tol) in &tolerances {
                let Some(d) = report.diffs.iter().find(|d| d.name == *name) else {
                    return Err(CliError::Internal(format!(
                        "a tolerance for `{name}`, which is not an output"
                    )));
                };
                // `!(a <= b)`: an infinite or NaN error fails too.
                let pass = d.max_abs <= *tol && d.nonfinite == 0;
                report.lines.push(format!(
                    "{command}: {name}: max abs {:.3e} {} tolerance {tol:.3e}",
                    d.max_abs,
                    if pass { "<=" } else { "EXCEEDS" }
                ));
                if !pass {
                    failures.push(format!(
                        "{name} max abs {:.3e} > tolerance {tol:.3e} ({} nonfinite)",
                        d.max_abs, d.nonfinite
                    ));
                }
            }
            if !failures.is_empty() {
                return Err(CliError::CheckFailed {
                    command: command.to_string(),
                    failures: failures.join("; "),
                });
            }
        }
        (outputs, "gpu")
    };
    let metadata = HashMap::from([
        (
            "producer".to_string(),
            format!("kernels-cli {}", env!("CARGO_PKG_VERSION")),
        ),
        ("command".to_string(), command.to_string()),
        ("mode".to_string(), mode.to_string()),
    ]);
    let bytes = outputs.serialize(metadata)?;
    tensors::write_atomic(&common.output, &bytes)?;
    let names: Vec<&str> = outputs.0.iter().map(|o| o.name.as_str()).collect();
    report.lines.push(format!(
        "{command}: wrote {} ({mode}): {}",
        common.output.display(),
        names.join(", ")
    ));
    Ok(report)
}

/// Enqueue `launch` on `stream` once and wait, or with `repeat = Some(n)` once as warm-up and
/// `n` more times between CUDA events (with a progress bar), returning the timings.
pub fn launch_timed(
    gpu: &Gpu,
    stream: &Stream,
    repeat: Option<u32>,
    what: &str,
    mut launch: impl FnMut() -> kernels::Result<()>,
) -> Result<Option<Timings>> {
    match repeat {
        None => {
            launch()?;
            gpu.sync(stream, what)?;
            Ok(None)
        }
        Some(n) => {
            let bar = progress::bar(n as u64 + 1, &format!("{what} (1 warm-up + {n})"));
            let t = time_on_stream(gpu, stream, 1, n as usize, || {
                launch()?;
                bar.inc(1);
                Ok(())
            });
            bar.finish_and_clear();
            Ok(Some(t?))
        }
    }
}
