//! `cargo run --release --example mhc`: the mHC forward and backward on a default problem
//! (B = 2, S = 1024, n = 4, C = 2048, with gamma, 20 Sinkhorn iterations), every output
//! validated against the f64 reference, then timed. Without a GPU it says so and runs the
//! reference on a small problem.

use kernels::mhc::MhcProblem;
use kernels::mhc::reference::{self, MhcData};
use kernels::timing::time_on_stream;
use kernels::{Gpu, Result};
use kernels_testing::mhc::MhcDeviceRun;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let p = MhcProblem::new(2, 1024, 4, 2048).with_gamma(true);
    match Gpu::new() {
        Ok(gpu) => match on_gpu(&gpu, &p) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("mhc example failed: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            println!("No usable GPU ({e}); running the f64 reference on B=2 S=64 n=4 C=128.");
            let small = MhcProblem::new(2, 64, 4, 128).with_gamma(true);
            let start = Instant::now();
            let r = reference::reference(&MhcData::random(&small, 1));
            println!(
                "reference forward and backward in {:.1} ms: dbias_res[0] = {:.6}, dalpha = {:?}",
                start.elapsed().as_secs_f64() * 1e3,
                r.grads.dbias[2 * small.n],
                r.grads.dalpha
            );
            ExitCode::SUCCESS
        }
    }
}

fn on_gpu(gpu: &Gpu, p: &MhcProblem) -> Result<bool> {
    println!(
        "{} ({}), PTX {}: mHC B={} S={} n={} C={} gamma={} t_max={}",
        gpu.info().name,
        gpu.info().driver,
        gpu.arch(),
        p.batch,
        p.seq,
        p.n,
        p.c,
        p.gamma,
        p.sinkhorn_iters
    );
    let data = MhcData::random(p, 1);
    let stream = gpu.stream()?;
    let mut run = MhcDeviceRun::upload(&data)?;
    run.forward(gpu, &stream)?;
    run.backward(gpu, &stream)?;
    gpu.sync(&stream, "mhc forward and backward")?;
    let cmp = kernels_testing::mhc::compare(&data, &run.download()?, None);
    for line in cmp.lines("  ") {
        println!("{line}");
    }
    for f in cmp.failures() {
        println!("  FAILED {f}");
    }
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        Ok(time_on_stream(gpu, &stream, 5, 20, f)?.median_ms())
    };
    let fwd = time(&mut || run.forward(gpu, &stream))?;
    let bwd = time(&mut || run.backward(gpu, &stream))?;
    println!(
        "forward  {fwd:.4} ms ({:.0} GB/s of {:.3} GB)\nbackward {bwd:.4} ms ({:.0} GB/s of {:.3} GB)",
        p.forward_bytes() / fwd / 1e6,
        p.forward_bytes() / 1e9,
        p.backward_bytes() / bwd / 1e6,
        p.backward_bytes() / 1e9
    );
    println!(
        "{}",
        if cmp.ok() {
            "validated: every output within tolerance"
        } else {
            "VALIDATION FAILED"
        }
    );
    Ok(cmp.ok())
}
