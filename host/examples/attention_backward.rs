//! Attention forward then backward on random inputs, as a training step runs them: the forward
//! gives O and LSE, the backward dQ, dK and dV of a loss with gradient dO (and dLSE), in both
//! modes (atomic dQ, `deterministic`). A small problem (bf16, batch 2, 300 queries and 400 keys,
//! 8 query heads over 2 key/value heads, D 128, causal) is checked against the f64 reference
//! under the tests' tolerance rule (`attention::reference::backward_tolerance`); a large one
//! (batch 4, 4096 tokens, 16 heads of 128, causal) is timed.
//! Run with `cargo run --release --example attention_backward`.

use kernels::attention::reference::{backward as reference_backward, backward_tolerance};
use kernels::attention::{
    self, AttentionProblem, BackwardOptions, Dtype, View, naive_backward_same_precision,
};
use kernels::data::{rng, uniform_bf16, uniform_f32};
use kernels::memory::{download, poisoned, upload};
use kernels::timing::time_on_stream;
use kernels::{DeviceBuffer, Gpu, Stream, bf16};

/// Device tensors of one problem: the inputs, the forward's outputs, the gradients.
struct Step {
    q: DeviceBuffer<bf16>,
    k: DeviceBuffer<bf16>,
    v: DeviceBuffer<bf16>,
    d_o: DeviceBuffer<bf16>,
    d_lse: DeviceBuffer<f32>,
    o: DeviceBuffer<bf16>,
    lse: DeviceBuffer<f32>,
    dq: DeviceBuffer<bf16>,
    dk: DeviceBuffer<bf16>,
    dv: DeviceBuffer<bf16>,
}

/// Host inputs of a problem: Q, K, V, dO uniform in [-1, 1), dLSE in [-0.5, 0.5).
struct HostInputs {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    d_o: Vec<bf16>,
    d_lse: Vec<f32>,
}

fn host_inputs(p: &AttentionProblem, seed: u64) -> HostInputs {
    let mut r = rng(seed);
    let nq: usize = p.q_shape().iter().product();
    let nk: usize = p.kv_shape().iter().product();
    HostInputs {
        q: uniform_bf16(&mut r, nq, -1.0, 1.0),
        k: uniform_bf16(&mut r, nk, -1.0, 1.0),
        v: uniform_bf16(&mut r, nk, -1.0, 1.0),
        d_o: uniform_bf16(&mut r, nq, -1.0, 1.0),
        d_lse: uniform_f32(&mut r, p.lse_len(), -0.5, 0.5),
    }
}

impl Step {
    fn new(p: &AttentionProblem, x: &HostInputs) -> kernels::Result<Step> {
        Ok(Step {
            q: upload(&x.q)?,
            k: upload(&x.k)?,
            v: upload(&x.v)?,
            d_o: upload(&x.d_o)?,
            d_lse: upload(&x.d_lse)?,
            o: poisoned(x.q.len())?,
            lse: poisoned(p.lse_len())?,
            dq: poisoned(x.q.len())?,
            dk: poisoned(x.k.len())?,
            dv: poisoned(x.k.len())?,
        })
    }

    /// The forward (O, LSE), then the backward (dQ, dK, dV); waits for both.
    fn run(
        &mut self,
        gpu: &Gpu,
        stream: &Stream,
        p: &AttentionProblem,
        options: BackwardOptions,
    ) -> kernels::Result<()> {
        let (qs, ks) = (p.q_shape(), p.kv_shape());
        let (q, k, v) = (
            View::contiguous(&self.q, qs),
            View::contiguous(&self.k, ks),
            View::contiguous(&self.v, ks),
        );
        let mut o = View::contiguous(&self.o, qs);
        attention::forward(gpu, stream, p, &q, &k, &v, &mut o, &mut self.lse)?;
        attention::backward(
            gpu,
            stream,
            p,
            &q,
            &k,
            &v,
            &View::contiguous(&self.o, qs),
            &self.lse,
            &View::contiguous(&self.d_o, qs),
            Some(&self.d_lse),
            &mut View::contiguous(&self.dq, qs),
            &mut View::contiguous(&self.dk, ks),
            &mut View::contiguous(&self.dv, ks),
            options,
        )
    }
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
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
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = match Gpu::new() {
        Ok(g) => g,
        Err(e) => {
            println!("no GPU here ({e}); nothing to run");
            return Ok(());
        }
    };
    let stream = gpu.stream()?;

    // Checked against the f64 reference.
    let p = AttentionProblem::new(2, 300, 400, 8, 2, 128, Dtype::Bf16).causal();
    let x = host_inputs(&p, 7);
    let want = reference_backward(&p, &x.q, &x.k, &x.v, &x.d_o, Some(&x.d_lse));
    let naive = naive_backward_same_precision(&p, &x.q, &x.k, &x.v, &x.d_o, Some(&x.d_lse));
    for deterministic in [false, true] {
        let mut step = Step::new(&p, &x)?;
        step.run(&gpu, &stream, &p, BackwardOptions { deterministic })?;
        let wide = |b: &DeviceBuffer<bf16>| -> kernels::Result<Vec<f64>> {
            Ok(download(b)?.iter().map(|x| x.to_f64()).collect())
        };
        let got = [wide(&step.dq)?, wide(&step.dk)?, wide(&step.dv)?];
        let mode = if deterministic {
            "deterministic"
        } else {
            "atomic dQ"
        };
        for (name, g, w, n) in [
            ("dQ", &got[0], &want.dq, &naive.dq),
            ("dK", &got[1], &want.dk, &naive.dk),
            ("dV", &got[2], &want.dv, &naive.dv),
        ] {
            let max_ref = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let tol = backward_tolerance(max_diff(n, w), max_ref);
            let err = max_diff(g, w);
            println!("{mode:>13} {name}: max |G - ref| {err:.3e} (tolerance {tol:.3e})");
            assert!(
                err <= tol,
                "{mode} {name}: error {err:.3e} exceeds {tol:.3e}"
            );
        }
    }

    // Timed: forward + backward as a training step runs them.
    let p = AttentionProblem::new(4, 4096, 4096, 16, 16, 128, Dtype::Bf16).causal();
    let x = host_inputs(&p, 8);
    let mut step = Step::new(&p, &x)?;
    for deterministic in [false, true] {
        let options = BackwardOptions { deterministic };
        let t = time_on_stream(&gpu, &stream, 2, 10, || {
            step.run(&gpu, &stream, &p, options)
        })?;
        // FlashAttention's convention: the backward counts 2.5 forwards.
        let flops = 3.5 * p.flops();
        println!(
            "{}: attention fwd+bwd bf16 b4 s4096 h16 d128 causal{}: {:.3} ms, {:.0} TFLOP/s",
            gpu.info().name,
            if deterministic { " deterministic" } else { "" },
            t.median_ms(),
            flops / t.median_ms() / 1e9
        );
    }
    Ok(())
}
