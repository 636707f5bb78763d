//! A default GLA forward problem (bf16, batch 2, 4096 tokens, 16 heads, Dk = Dv = 128, initial
//! and final states), validated on two (sequence, head) pairs against the f64 recurrence and
//! timed; then the same problem packed as variable-length sequences. Without a GPU it runs the
//! CPU references on a smaller problem instead.
//! Run with `cargo run --release --example gla`.

use kernels::data::{rng, uniform_bf16, uniform_f32};
use kernels::gla::reference::{self, HostInputs, rel_l2};
use kernels::gla::{GlaInputs, GlaOutputs, GlaProblem, GlaSession};
use kernels::memory::{download, poisoned, upload};
use kernels::timing::time_on_stream;
use kernels::{Gpu, bf16};
use kernels_testing::gla::log_sigmoid_decays;

struct Data {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    g: Vec<bf16>,
    init: Vec<f32>,
}

fn data(p: &GlaProblem, seed: u64) -> Data {
    let mut r = rng(seed);
    Data {
        q: uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0),
        k: uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0),
        v: uniform_bf16(&mut r, p.v_len(), -1.0, 1.0),
        g: log_sigmoid_decays(&mut r, p.qk_len()),
        init: uniform_f32(&mut r, p.state_len(), -1.0, 1.0),
    }
}

impl Data {
    fn host(&self) -> HostInputs<'_> {
        HostInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            init_state: Some(&self.init),
        }
    }
}

/// Worst relative L2 error of the outputs and final states of two (sequence, head) pairs.
fn check(p: &GlaProblem, d: &Data, o: &[bf16], fs: &[f32]) -> Result<f64, kernels::Error> {
    let mut worst = 0.0f64;
    let seqs = p.sequences();
    for (seq, head) in [(0, 0), (seqs.len() - 1, p.heads - 1)] {
        let (want_o, want_s) = reference::recurrence_head(p, &d.host(), seq, head)?;
        let (start, len) = seqs[seq];
        let got = (0..len).flat_map(|i| {
            let at = ((start + i) * p.heads + head) * p.dv;
            o[at..at + p.dv].iter().map(|x| x.to_f64())
        });
        let s0 = (seq * p.heads + head) * p.dk * p.dv;
        let got_s = fs[s0..s0 + p.dk * p.dv].iter().map(|&x| x as f64);
        worst = worst.max(rel_l2(got, &want_o)).max(rel_l2(got_s, &want_s));
    }
    Ok(worst)
}

fn run(gpu: &Gpu, p: &GlaProblem, what: &str) -> Result<(), Box<dyn std::error::Error>> {
    let d = data(p, 7);
    let stream = gpu.stream()?;
    let (dq, dk, dv, dg, di) = (
        upload(&d.q)?,
        upload(&d.k)?,
        upload(&d.v)?,
        upload(&d.g)?,
        upload(&d.init)?,
    );
    let mut o = poisoned::<bf16>(p.v_len())?;
    let mut fs = poisoned::<f32>(p.state_len())?;
    let mut session = GlaSession::new(gpu, p)?;
    let inputs = GlaInputs {
        q: &dq,
        k: &dk,
        v: &dv,
        g: &dg,
        init_state: Some(&di),
    };
    let t = time_on_stream(gpu, &stream, 5, 20, || {
        session.forward(
            gpu,
            &stream,
            &inputs,
            &mut GlaOutputs {
                o: &mut o,
                final_state: Some(&mut fs),
            },
        )
    })?;
    let worst = check(p, &d, &download(&o)?, &download(&fs)?)?;
    assert!(
        worst <= 1e-2,
        "{what}: relative L2 error {worst:.3e} against the f64 recurrence exceeds 1e-2"
    );
    println!(
        "{}: GLA fwd {what}: {:.3} ms, {:.1} M tokens/s, {:.1} TFLOP/s (4 B T H dk dv), {} \
         segments; rel L2 error on two heads {worst:.2e}",
        gpu.info().name,
        t.median_ms(),
        p.rows() as f64 / t.median_ms() / 1e3,
        p.flops() / t.median_ms() / 1e9,
        session.segments().segments.len()
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let p = GlaProblem::new(2, 4096, 16, 128, 128);
    let varlen = GlaProblem::varlen(vec![0, 1000, 4096, 4097, 8192], 16, 128, 128);
    let gpu = match Gpu::new() {
        Ok(g) => g,
        Err(e) => {
            println!("no GPU here ({e}); running the CPU references on a smaller problem");
            let small = GlaProblem::new(1, 300, 2, 64, 64);
            let d = data(&small, 7);
            let exact = reference::recurrence(&small, &d.host())?;
            let segments = kernels::gla::plan_segments(&small, 64)?;
            let chunked = reference::chunked(&small, &d.host(), &segments)?;
            let err = rel_l2(chunked.o.iter().map(|x| x.to_f64()), &exact.o);
            println!(
                "CPU chunked algorithm ({} segments) vs f64 recurrence, B1 T300 H2 dk64 dv64: \
                 rel L2 error {err:.2e}",
                segments.segments.len()
            );
            assert!(err <= 1e-2);
            return Ok(());
        }
    };
    run(&gpu, &p, "B2 T4096 H16 dk128 dv128")?;
    run(
        &gpu,
        &varlen,
        "4 packed sequences (1000, 3096, 1, 4095) H16 dk128 dv128",
    )
}
