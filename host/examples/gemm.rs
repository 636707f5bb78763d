//! A default bf16 GEMM on Hopper: `C = A B^T` at 4096^3, validated on sampled entries against
//! the f64 reference and timed. Run with `cargo run --release --example gemm`.

use kernels::data::{rng, uniform_bf16};
use kernels::gemm::{self, GemmProblem};
use kernels::memory::{download, poisoned, upload};
use kernels::timing::time_on_stream;
use kernels::{Gpu, bf16};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = match Gpu::new() {
        Ok(g) => g,
        Err(e) => {
            println!("no GPU here ({e}); nothing to run");
            return Ok(());
        }
    };
    let s = 4096;
    let p = GemmProblem { m: s, n: s, k: s };
    let mut r = rng(42);
    let a = uniform_bf16(&mut r, s * s, -1.0, 1.0);
    let b = uniform_bf16(&mut r, s * s, -1.0, 1.0);
    let stream = gpu.stream()?;
    let (da, db) = (upload(&a)?, upload(&b)?);
    let mut dc = poisoned::<bf16>(s * s)?;
    let t = time_on_stream(&gpu, &stream, 5, 20, || {
        gemm::gemm_bf16(&gpu, &stream, &p, &da, &db, &mut dc)
    })?;
    let c = download(&dc)?;
    let mut worst = 0.0f64;
    for t in 0..64 {
        let (i, j) = ((t * 7919) % s, (t * 104_729) % s);
        let (mut want, mut abs) = (0.0, 0.0);
        for k in 0..s {
            let x = a[i * s + k].to_f64() * b[j * s + k].to_f64();
            want += x;
            abs += f64::abs(x);
        }
        let err = (c[i * s + j].to_f64() - want).abs();
        assert!(
            err <= gemm::tolerance(want, abs, s),
            "C[{i}][{j}]: {} vs {want}",
            c[i * s + j]
        );
        worst = worst.max(err);
    }
    println!(
        "{}: gemm {s}^3 bf16: {:.3} ms, {:.0} TFLOP/s; max error on 64 sampled entries {worst:.2e}",
        gpu.info().name,
        t.median_ms(),
        p.flops() / t.median_ms() / 1e9
    );
    Ok(())
}
