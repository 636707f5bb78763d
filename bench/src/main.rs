//! `kbench`: the benchmark runner (one family at a time, peers side by side), the report
//! generator, and the main job.
//!
//! ```text
//! kbench main [--quick]                 every kernel on default sizes, validated and timed
//! kbench <family> --out DIR [--quick]   benchmark a family (smoke, attention, attention-backward,
//!                                       attention-decode, attention-varlen, attention-fp8, gla, semicrf,
//!                                       mhc), write
//!                                       DIR/<family>.json
//! kbench report [--results DIR] [--out FILE] [--plots DIR]
//! ```

mod attention;
mod attention_bwd;
mod attention_decode;
mod attention_fp8;
mod attention_varlen;
mod gla;
mod harness;
mod main_job;
mod mhc;
mod plots;
mod reliability;
mod report;
mod semicrf;
mod smoke;

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Benchmarks, report and main job of the kernel library")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every kernel on default sizes, validated against the references and timed. Without a
    /// GPU: says so and runs the CPU references.
    Main {
        /// Smaller problems.
        #[arg(long)]
        quick: bool,
    },
    /// Smoke kernels and the Hopper GEMM (beside cuBLAS).
    Smoke(FamilyArgs),
    /// Attention forward (beside PyTorch SDPA FLASH and CUDNN, and FlashAttention-4 where
    /// installed).
    Attention(FamilyArgs),
    /// Attention backward, alone and after the forward (beside the same peers); writes
    /// `attention-backward.json`.
    AttentionBackward(FamilyArgs),
    /// Attention decode over a paged KV cache (beside SDPA on the contexts gathered dense, and
    /// the device copy bandwidth); writes `attention-decode.json`.
    AttentionDecode(FamilyArgs),
    /// The FP8 attention forward (Hopper) beside the bf16 forward on the same values; writes
    /// `attention-fp8.json`.
    AttentionFp8(FamilyArgs),
    /// Attention forward over packed sequences of mixed lengths beside the equal-length
    /// forward of the same work; writes `attention-varlen.json`.
    AttentionVarlen(FamilyArgs),
    /// Chunkwise gated linear attention forward beside fla's chunk_gla and a PyTorch chunked
    /// reference.
    Gla(FamilyArgs),
    /// Semi-Markov CRF forward and forward+backward beside flash-semicrf, torch-struct and a
    /// PyTorch autograd baseline.
    Semicrf(FamilyArgs),
    /// mHC forward and backward (beside PyTorch eager and torch.compile).
    Mhc(FamilyArgs),
    /// Render bench/results/*.json into BENCHMARKS.md and plots (SVG).
    Report {
        /// Directory of results files.
        #[arg(long, default_value = "bench/results")]
        results: PathBuf,
        /// Output markdown file.
        #[arg(long, default_value = "BENCHMARKS.md")]
        out: PathBuf,
        /// Directory for the plots (its SVG files are all generated: stale ones are removed).
        #[arg(long, default_value = "bench/plots")]
        plots: PathBuf,
    },
}

#[derive(clap::Args)]
struct FamilyArgs {
    /// Directory for `<family>.json`.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Fewer runs, smaller problems (to check the runner itself).
    #[arg(long)]
    quick: bool,
}

fn family(
    name: &str,
    args: &FamilyArgs,
    body: fn(&mut harness::Bench) -> kernels::Result<()>,
) -> ExitCode {
    let result = harness::Bench::new(name, args.quick).and_then(|mut b| {
        body(&mut b)?;
        b.finish(&args.out)
    });
    match result {
        Ok(path) => {
            eprintln!("kbench {name}: wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kbench {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Main { quick } => main_job::run(quick),
        Command::Smoke(args) => family("smoke", &args, smoke::run),
        Command::Attention(args) => family("attention", &args, attention::run),
        Command::AttentionBackward(args) => {
            family("attention-backward", &args, attention::run_backward)
        }
        Command::AttentionDecode(args) => family("attention-decode", &args, attention_decode::run),
        Command::AttentionVarlen(args) => family("attention-varlen", &args, attention_varlen::run),
        Command::AttentionFp8(args) => family("attention-fp8", &args, attention_fp8::run),
        Command::Gla(args) => family("gla", &args, gla::run),
        Command::Semicrf(args) => family("semicrf", &args, semicrf::run),
        Command::Mhc(args) => family("mhc", &args, mhc::run),
        Command::Report {
            results,
            out,
            plots,
        } => match report_files(&results, &out, &plots) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kbench report: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `kbench report`: the plots, then the markdown that links them.
fn report_files(results: &Path, out: &Path, plots_dir: &Path) -> Result<(), String> {
    let files = report::load(results)?;
    let rendered = plots::render_all(&files, plots_dir)?;
    for m in &rendered.messages {
        eprintln!("kbench report: {m}");
    }
    let md_dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let link = report::relative_link(md_dir, plots_dir)?;
    let mut md = report::render(&files, &rendered.plots, &link);
    md.extend(reliability::section(results)?);
    std::fs::write(out, md).map_err(|e| format!("writing {}: {e}", out.display()))?;
    eprintln!(
        "kbench report: wrote {} and {} plots in {}",
        out.display(),
        rendered.plots.len(),
        plots_dir.display()
    );
    Ok(())
}
