//! `cargo run --release --example semicrf`: the default semi-CRF problem (B = 16, T = 1000,
//! K = 32, C = 16) validated against the f64 reference and timed, then a small end-to-end demo:
//! decode a synthetic segmentation task with Viterbi and print the best segmentation beside the
//! truth. Without a GPU it says so and runs the CPU reference instead.

use kernels::data::rng;
use kernels::memory::download;
use kernels::semicrf::reference::{self, Model, Segment};
use kernels::semicrf::{
    self, DeviceInputs, ForwardState, Gradients, SemiCrfInputs, SemiCrfProblem,
};
use kernels::timing::time_on_stream;
use kernels::{Gpu, Result};
use rand::Rng;

fn main() -> Result<()> {
    let gpu = match Gpu::new() {
        Ok(g) => Some(g),
        Err(e) => {
            println!("No usable CUDA GPU ({e}); running the f64 CPU reference instead.\n");
            None
        }
    };
    default_problem(gpu.as_ref())?;
    demo(gpu.as_ref())
}

fn default_problem(gpu: Option<&Gpu>) -> Result<()> {
    let p = SemiCrfProblem::new(16, 1000, 32, 16);
    p.validate()?;
    let inp = kernels_testing::semicrf::random_inputs(&p, 1, true);
    let m = Model::new(&p, &inp.view());
    let start = std::time::Instant::now();
    let want = reference::log_partition_factored(&m);
    let cpu_ms = start.elapsed().as_secs_f64() * 1e3;
    println!(
        "semi-CRF B={} T={} K={} C={} (checkpoint interval {}, lengths in [T/2, T])",
        p.batch, p.t, p.k, p.c, p.checkpoint
    );
    println!(
        "  f64 reference forward (CPU): {cpu_ms:.1} ms, log Z[0] = {:.4}",
        want[0]
    );
    let Some(g) = gpu else { return Ok(()) };
    let stream = g.stream()?;
    let dev = DeviceInputs::upload(&p, &inp.view())?;
    let mut st = ForwardState::new(&p)?;
    let mut gr = Gradients::new(&p, false)?;
    let fwd = time_on_stream(g, &stream, 3, 20, || {
        semicrf::forward_launch(g, &stream, &p, &dev, &mut st)
    })?;
    let z = download(st.log_z())?;
    let err = z
        .iter()
        .zip(&want)
        .map(|(a, b)| (*a as f64 - b).abs() / b.abs().max(1.0))
        .fold(0.0, f64::max);
    let fb = time_on_stream(g, &stream, 3, 20, || {
        semicrf::forward_launch(g, &stream, &p, &dev, &mut st)?;
        semicrf::backward_launch(g, &stream, &p, &dev, &mut st, &mut gr)
    })?;
    let fused = time_on_stream(g, &stream, 3, 20, || {
        semicrf::forward_backward_launch(g, &stream, &p, &dev, &mut st, &mut gr)
    })?;
    println!(
        "  GPU ({}, {}): forward {:.3} ms, forward+backward {:.3} ms (fused {:.3} ms), \
         log Z max relative error {err:.2e} [{}], {:.1} MiB of device memory",
        g.info().name,
        g.arch(),
        fwd.median_ms(),
        fb.median_ms(),
        fused.median_ms(),
        if err <= 1e-4 { "ok" } else { "FAILED" },
        p.memory().forward_backward() as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// A synthetic task: a true segmentation (durations 2..=6, labels 0..4, no label twice in a
/// row), noisy per-position scores favouring the true label, transitions that discourage
/// repeating a label. Decode and print.
fn demo(gpu: Option<&Gpu>) -> Result<()> {
    let (t, k, c) = (72usize, 8usize, 4usize);
    let mut r = rng(7);
    let mut truth = Vec::new();
    let (mut pos, mut prev) = (0usize, usize::MAX);
    while pos < t {
        let dur = r.random_range(2..=6).min(t - pos);
        let mut label = r.random_range(0..c);
        while label == prev {
            label = r.random_range(0..c);
        }
        truth.push(Segment {
            start: pos,
            dur,
            label,
        });
        (pos, prev) = (pos + dur, label);
    }
    let mut scores = vec![0.0f32; t * c];
    for s in &truth {
        for p in s.start..s.start + s.dur {
            for l in 0..c {
                let signal = if l == s.label { 1.0 } else { 0.0 };
                scores[p * c + l] = signal + r.random_range(-0.8..0.8);
            }
        }
    }
    let cumsum = semicrf::cumulative_scores(&scores, 1, t, c)?;
    let dur: Vec<f32> = (0..k * c)
        .map(|i| if i / c == 0 { -1.0 } else { 0.0 })
        .collect();
    let trans: Vec<f32> = (0..c * c)
        .map(|i| if i / c == i % c { -3.0 } else { 0.0 })
        .collect();
    let lengths = [t as u32];
    let inputs = SemiCrfInputs {
        cumsum: &cumsum,
        dur: &dur,
        trans: &trans,
        lengths: &lengths,
    };
    let p = SemiCrfProblem::new(1, t, k, c);
    let (score, best, source) = match gpu {
        Some(g) => {
            let stream = g.stream()?;
            let out = semicrf::viterbi(g, &stream, &p, &inputs)?.remove(0);
            (out.score as f64, out.segments, "GPU")
        }
        None => {
            let (s, segs) = reference::viterbi(&Model::new(&p, &inputs)).remove(0);
            (s, segs, "CPU reference")
        }
    };
    let show = |segs: &[Segment]| -> String {
        segs.iter()
            .map(|s| {
                let ch = (b'A' + s.label as u8) as char;
                std::iter::repeat_n(ch, s.dur).collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("|")
    };
    let agree = best
        .iter()
        .flat_map(|s| std::iter::repeat_n(s.label, s.dur))
        .zip(
            truth
                .iter()
                .flat_map(|s| std::iter::repeat_n(s.label, s.dur)),
        )
        .filter(|(a, b)| a == b)
        .count();
    println!(
        "\nDemo: decode a noisy segmentation (T = {t}, K = {k}, C = {c}) with Viterbi ({source})"
    );
    println!("  truth:   {}", show(&truth));
    println!("  decoded: {}", show(&best));
    println!(
        "  score {score:.3}; {} segments decoded ({} true); {agree}/{t} positions labelled as in \
         the truth",
        best.len(),
        truth.len()
    );
    println!(
        "  segments (start, duration, label): {:?}",
        best.iter()
            .map(|s| (s.start, s.dur, s.label))
            .collect::<Vec<_>>()
    );
    Ok(())
}
