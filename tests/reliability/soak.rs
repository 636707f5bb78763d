//! Soak and concurrency: 10,000 launches of random valid and invalid problems from 4 host
//! threads, each on its own stream, through the Rust API; every valid result is checked against
//! the f64 reference, every invalid problem must be refused with a typed error, and afterwards
//! the free device memory must be back where it was. (The Python layer's soak is
//! `python/e2e/soak.py`.)

use kernel_tests::{TestResult, ensure, gpu_ok, sanitizer};
use kernels::attention::{self, AttentionProblem, Dtype, View};
use kernels::data::rng;
use kernels::memory::{download, free_device_memory, poisoned, upload};
use kernels::{Error, Gpu, bf16};
use rand::Rng;

/// Launches over all threads (200 under a sanitizer, where each launch is orders of magnitude
/// slower; the results are checked the same way, the device memory only reported).
const LAUNCHES: usize = 10_000;
const THREADS: usize = 4;
/// Launches before the baseline is read.
const WARMUP: usize = 400;

/// What one thread saw.
#[derive(Default, Debug)]
struct Counts {
    forward: usize,
    backward: usize,
    refused: usize,
    worst_ratio: f64,
}

pub fn threads_streams(g: &'static Gpu) -> TestResult {
    gpu_ok(g.bind())?;
    let under_sanitizer = sanitizer().is_some();
    let launches = if under_sanitizer { 200 } else { LAUNCHES };
    // A warm-up long enough to meet every kernel the soak can launch: the driver loads a
    // module's functions lazily (CUDA_MODULE_LOADING=LAZY), and their code takes device memory
    // on first launch, which is not a leak.
    gpu_ok(worker(g, 99, if under_sanitizer { 20 } else { WARMUP }))?;
    gpu_ok(g.bind())?;
    let before = gpu_ok(free_device_memory())?;
    let counts: Vec<kernels::Result<Counts>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| s.spawn(move || worker(g, t as u64, launches / THREADS)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a soak thread panicked"))
            .collect()
    });
    gpu_ok(g.bind())?;
    let after = gpu_ok(free_device_memory())?;
    let mut total = Counts::default();
    for c in counts {
        let c = gpu_ok(c)?;
        total.forward += c.forward;
        total.backward += c.backward;
        total.refused += c.refused;
        total.worst_ratio = total.worst_ratio.max(c.worst_ratio);
    }
    println!(
        "soak: {} launches from {THREADS} threads on {THREADS} streams: {} forward, {} backward \
         checked against the f64 reference (worst error / tolerance {:.3}), {} invalid problems \
         refused with typed errors; free device memory {} MiB before, {} MiB after",
        total.forward + total.backward + total.refused,
        total.forward,
        total.backward,
        total.worst_ratio,
        total.refused,
        before >> 20,
        after >> 20,
    );
    ensure(
        total.forward + total.backward + total.refused >= launches,
        || "fewer launches than planned".into(),
    )?;
    // The driver frees synchronously; allow one 2 MiB page of allocator granularity. Under a
    // sanitizer the short warm-up may not meet every kernel (and the tool allocates for
    // itself): the numbers are printed, not checked.
    if under_sanitizer {
        return Ok(());
    }
    ensure(after + (2 << 20) >= before, || {
        format!("device memory not returned: {before} bytes free before, {after} after")
    })
}

/// `n` random problems on one stream of this thread: 6 in 10 valid forwards, 1 in 10 valid
/// backwards, 3 in 10 invalid (each kind of mistake a caller makes).
fn worker(g: &Gpu, seed: u64, n: usize) -> kernels::Result<Counts> {
    g.bind()?;
    let stream = g.stream()?;
    let mut r = rng(0x50a4 ^ seed);
    let mut c = Counts::default();
    for i in 0..n {
        let b = r.random_range(1..=2usize);
        let sq = r.random_range(1..=64usize);
        let sk = r.random_range(1..=64usize);
        let hkv = r.random_range(1..=2usize);
        let hq = hkv * r.random_range(1..=2usize);
        let d = [64usize, 128][r.random_range(0..2usize)];
        let mut p = AttentionProblem::new(b, sq, sk, hq, hkv, d, Dtype::Bf16);
        p.causal = r.random_bool(0.5);
        if r.random_bool(0.3) {
            p = p.window(Some(r.random_range(0..=20usize)), None);
        }
        let kind = r.random_range(0..10u32);
        let seed = seed * 1_000_003 + i as u64;
        if kind < 6 {
            let (q, k, v) = kernels_testing::attention::random_inputs::<bf16>(&p, 1.0, seed);
            let (o, lse) = forward_on(g, &stream, &p, &q, &k, &v)?;
            let want = attention::reference(&p, &q, &k, &v);
            let naive = attention::naive_same_precision(&p, &q, &k, &v);
            let naive_err = want
                .o
                .iter()
                .zip(&naive.o)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            let tol = 2.0 * naive_err + 1e-3;
            let err = o
                .iter()
                .zip(&want.o)
                .map(|(a, b)| {
                    if (a.to_f64() - b).is_nan() {
                        f64::INFINITY
                    } else {
                        (a.to_f64() - b).abs()
                    }
                })
                .fold(0.0, f64::max);
            let lse_err = lse
                .iter()
                .zip(&want.lse)
                .map(|(&a, &b)| match (a as f64, b) {
                    (a, b) if a == b => 0.0,
                    (a, b) => (a - b).abs(),
                })
                .fold(0.0, f64::max);
            if err > tol || lse_err.is_nan() || lse_err > 1e-3 {
                return Err(Error::invalid(
                    "soak",
                    format!("{p:?}: O error {err:.3e} (tol {tol:.3e}), LSE error {lse_err:.3e}"),
                ));
            }
            c.worst_ratio = c.worst_ratio.max(err / tol);
            c.forward += 1;
        } else if kind < 7 {
            let (q, k, v) = kernels_testing::attention::random_inputs::<bf16>(&p, 1.0, seed);
            let fwd = attention::reference(&p, &q, &k, &v);
            let o: Vec<bf16> = fwd.o.iter().map(|&x| bf16::from_f64(x)).collect();
            let lse: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
            let d_o = kernels::data::uniform_bf16(&mut r, q.len(), -1.0, 1.0);
            let x = kernels_testing::attention::BackwardInputs {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lse,
                d_o: &d_o,
                d_lse: None,
            };
            let deterministic = r.random_bool(0.5);
            let (dq, dk, dv) = kernels_testing::attention::device_backward(
                g,
                &p,
                &x,
                attention::BackwardOptions { deterministic },
            )?;
            let want = attention::reference::backward(&p, &q, &k, &v, &d_o, None);
            let naive = attention::naive_backward_same_precision(&p, &q, &k, &v, &d_o, None);
            let diff = |a: &[f64], b: &[f64]| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| {
                        if (x - y).is_nan() {
                            f64::INFINITY
                        } else {
                            (x - y).abs()
                        }
                    })
                    .fold(0.0, f64::max)
            };
            let wide = |x: &[bf16]| -> Vec<f64> { x.iter().map(|x| x.to_f64()).collect() };
            for (name, got, w, nv) in [
                ("dQ", wide(&dq), &want.dq, &naive.dq),
                ("dK", wide(&dk), &want.dk, &naive.dk),
                ("dV", wide(&dv), &want.dv, &naive.dv),
            ] {
                let max_ref = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                let tol = attention::reference::backward_tolerance(diff(nv, w), max_ref);
                let err = diff(&got, w);
                if err > tol {
                    return Err(Error::invalid(
                        "soak",
                        format!("{p:?}: {name} error {err:.3e} > tol {tol:.3e}"),
                    ));
                }
                c.worst_ratio = c.worst_ratio.max(err / tol);
            }
            c.backward += 1;
        } else {
            refused(g, &stream, &p, &mut r)?;
            c.refused += 1;
        }
    }
    Ok(c)
}

/// Contiguous forward on `stream`: O and LSE downloaded.
fn forward_on(
    g: &Gpu,
    stream: &kernels::Stream,
    p: &AttentionProblem,
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
) -> kernels::Result<(Vec<bf16>, Vec<f32>)> {
    let (dq, dk, dv) = (upload(q)?, upload(k)?, upload(v)?);
    let o_buf = poisoned::<bf16>(q.len())?;
    let mut lse = poisoned::<f32>(p.lse_len())?;
    {
        let mut o = View::contiguous(&o_buf, p.q_shape());
        attention::forward(
            g,
            stream,
            p,
            &View::contiguous(&dq, p.q_shape()),
            &View::contiguous(&dk, p.kv_shape()),
            &View::contiguous(&dv, p.kv_shape()),
            &mut o,
            &mut lse,
        )?;
    }
    g.sync(stream, "soak forward")?;
    Ok((download(&o_buf)?, download(&lse)?))
}

/// One invalid call, which must be refused with a typed error (and launch nothing).
fn refused(
    g: &Gpu,
    stream: &kernels::Stream,
    valid: &AttentionProblem,
    r: &mut impl Rng,
) -> kernels::Result<()> {
    let mut p = valid.clone();
    let mut lse_len = p.lse_len();
    let mut q_len = p.q_shape().iter().product::<usize>();
    let what = match r.random_range(0..5u32) {
        0 => {
            p.head_dim = 72;
            "head dimension 72"
        }
        1 => {
            p.heads_q = p.heads_kv * 2 + 1;
            "query heads not a multiple of the K/V heads"
        }
        2 => {
            p.seq_q = 0;
            "an empty query sequence"
        }
        3 => {
            lse_len = lse_len.saturating_sub(1).max(1);
            if lse_len == p.lse_len() {
                q_len = q_len.saturating_sub(1);
            }
            "an LSE buffer too short"
        }
        _ => {
            q_len = q_len.saturating_sub(8).max(1);
            "a Q buffer too short for its shape"
        }
    };
    let kv_len = valid.kv_shape().iter().product::<usize>().max(1);
    let (dq, dk, dv) = (
        poisoned::<bf16>(q_len.max(1))?,
        poisoned::<bf16>(kv_len)?,
        poisoned::<bf16>(kv_len)?,
    );
    let o_buf = poisoned::<bf16>(valid.q_shape().iter().product::<usize>().max(1))?;
    let mut lse = poisoned::<f32>(lse_len.max(1))?;
    let result = (|| {
        let qv = View::new(
            &dq,
            0,
            &p.q_shape(),
            &attention::contiguous_strides(p.q_shape()),
        )?;
        let kv = View::contiguous(&dk, valid.kv_shape());
        let vv = View::contiguous(&dv, valid.kv_shape());
        let mut o = View::new(
            &o_buf,
            0,
            &p.q_shape(),
            &attention::contiguous_strides(p.q_shape()),
        )?;
        attention::forward(g, stream, &p, &qv, &kv, &vv, &mut o, &mut lse)
    })();
    match result {
        Err(
            Error::NoDevice { .. }
            | Error::Cuda { .. }
            | Error::Driver { .. }
            | Error::Timeout { .. },
        ) => Err(Error::invalid(
            "soak",
            format!("{what}: a device error instead of a refusal: {result:?}"),
        )),
        Err(_) => Ok(()),
        Ok(()) => Err(Error::invalid("soak", format!("{what}: accepted ({p:?})"))),
    }
}
