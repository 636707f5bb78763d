//! The Hopper bf16 GEMM against the f64 reference, on awkward shapes, plus bad input.

use kernel_tests::{Needs, Suite, TestResult, check_close, ensure, gpu_ok};
use kernels::data::{rng, uniform_bf16};
use kernels::gemm::{self, GemmProblem};
use kernels::memory::{download, poisoned, upload};
use kernels::{Error, Gpu, bf16};

fn main() {
    let mut s = Suite::new();
    let shapes = [
        (1, 8, 8),
        (128, 256, 64),
        (129, 264, 72),
        (300, 520, 1000),
        (64, 1024, 200),
        (1024, 1024, 1024),
        (777, 2056, 136),
    ];
    for (m, n, k) in shapes {
        s.gpu(&format!("gemm/m{m}_n{n}_k{k}"), Needs::Hopper, move |g| {
            run(g, m, n, k)
        });
    }
    s.gpu("gemm/deterministic", Needs::Hopper, deterministic);
    s.cpu("gemm/rejects_bad_problems", rejects_bad_problems);
    s.gpu(
        "gemm/rejects_mismatched_buffers",
        Needs::Hopper,
        rejects_mismatched_buffers,
    );
    s.run()
}

fn inputs(m: usize, n: usize, k: usize, seed: u64) -> (Vec<bf16>, Vec<bf16>) {
    let mut r = rng(seed);
    (
        uniform_bf16(&mut r, m * k, -1.0, 1.0),
        uniform_bf16(&mut r, n * k, -1.0, 1.0),
    )
}

fn gpu_gemm(g: &Gpu, p: &GemmProblem, a: &[bf16], b: &[bf16]) -> kernels::Result<Vec<bf16>> {
    let stream = g.stream()?;
    let (da, db) = (upload(a)?, upload(b)?);
    let mut dc = poisoned::<bf16>(p.m * p.n)?;
    gemm::gemm_bf16(g, &stream, p, &da, &db, &mut dc)?;
    g.sync(&stream, "gemm_bf16_tn")?;
    download(&dc)
}

fn run(g: &Gpu, m: usize, n: usize, k: usize) -> TestResult {
    let seed = (m * 31 + n * 7 + k) as u64;
    let (a, b) = inputs(m, n, k, seed);
    let p = GemmProblem { m, n, k };
    let c = gpu_ok(gpu_gemm(g, &p, &a, &b))?;
    let got: Vec<f32> = c.iter().map(|x| x.to_f32()).collect();
    let (want, abs) = gemm::reference(&a, &b, m, n, k);
    check_close(
        &format!("gemm {m}x{n}x{k} (seed {seed})"),
        &got,
        &want,
        |i| gemm::tolerance(want[i], abs[i], k),
    )
}

fn deterministic(g: &Gpu) -> TestResult {
    let (m, n, k) = (512, 768, 320);
    let (a, b) = inputs(m, n, k, 5);
    let p = GemmProblem { m, n, k };
    let first = gpu_ok(gpu_gemm(g, &p, &a, &b))?;
    let second = gpu_ok(gpu_gemm(g, &p, &a, &b))?;
    let same = first
        .iter()
        .zip(&second)
        .all(|(x, y)| x.to_bits() == y.to_bits());
    ensure(same, || "two runs on the same inputs differ".into())
}

fn rejects_bad_problems() -> TestResult {
    for (m, n, k) in [(0, 8, 8), (8, 0, 8), (8, 8, 0), (8, 12, 8), (8, 8, 12)] {
        match (GemmProblem { m, n, k }).validate() {
            Err(Error::InvalidArgument { .. } | Error::Unsupported { .. }) => {}
            other => return Err(format!("{m}x{n}x{k}: expected an error, got {other:?}").into()),
        }
    }
    Ok(())
}

fn rejects_mismatched_buffers(g: &Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let p = GemmProblem {
        m: 64,
        n: 64,
        k: 64,
    };
    let a = gpu_ok(upload(&vec![bf16::ONE; 64 * 64]))?;
    let short = gpu_ok(upload(&vec![bf16::ONE; 64 * 63]))?;
    let mut c = gpu_ok(poisoned::<bf16>(64 * 64))?;
    match gemm::gemm_bf16(g, &stream, &p, &a, &short, &mut c) {
        Err(Error::ShapeMismatch { .. }) => Ok(()),
        other => Err(format!("a short B must be rejected, got {other:?}").into()),
    }
}
