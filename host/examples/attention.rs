//! A default attention forward problem (bf16, batch 4, 4096 tokens, 16 heads of 128, causal),
//! validated on sampled rows against the f64 reference and timed.
//! Run with `cargo run --release --example attention`.

use kernels::attention::{self, AttentionProblem, Dtype, View};
use kernels::data::{rng, uniform_bf16};
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
    let p = AttentionProblem::new(4, 4096, 4096, 16, 16, 128, Dtype::Bf16).causal();
    let n = p.batch * p.seq_q * p.heads_q * p.head_dim;
    let mut r = rng(1);
    let (q, k, v) = (
        uniform_bf16(&mut r, n, -1.0, 1.0),
        uniform_bf16(&mut r, n, -1.0, 1.0),
        uniform_bf16(&mut r, n, -1.0, 1.0),
    );
    let stream = gpu.stream()?;
    let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
    let out = poisoned::<bf16>(n)?;
    let mut lse = poisoned::<f32>(p.lse_len())?;
    let (qv, kv, vv) = (
        View::contiguous(&dq, p.q_shape()),
        View::contiguous(&dk, p.kv_shape()),
        View::contiguous(&dv, p.kv_shape()),
    );
    let mut ov = View::contiguous(&out, p.q_shape());
    let t = time_on_stream(&gpu, &stream, 5, 20, || {
        attention::forward(&gpu, &stream, &p, &qv, &kv, &vv, &mut ov, &mut lse)
    })?;
    let o = download(&out)?;
    let rows: Vec<(usize, usize, usize)> = (0..16)
        .map(|i| (i % p.batch, (i * 977) % p.seq_q, (i * 3) % p.heads_q))
        .collect();
    let mut worst = 0.0f64;
    for (&(b, i, h), (want, _)) in rows
        .iter()
        .zip(attention::reference_rows(&p, &q, &k, &v, &rows))
    {
        let start = ((b * p.seq_q + i) * p.heads_q + h) * p.head_dim;
        for (x, y) in o[start..start + p.head_dim].iter().zip(&want) {
            worst = worst.max((x.to_f64() - y).abs());
        }
    }
    assert!(
        worst < 1e-2,
        "sampled rows differ from the reference by {worst}"
    );
    println!(
        "{}: attention fwd bf16 b4 s4096 h16 d128 causal: {:.3} ms, {:.0} TFLOP/s; max error on 16 sampled rows {worst:.2e}",
        gpu.info().name,
        t.median_ms(),
        p.flops() / t.median_ms() / 1e9
    );
    Ok(())
}
