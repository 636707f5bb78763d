//! Semi-Markov CRF: the f64 reference against brute force and finite differences (CPU), the
//! kernels against the reference (GPU), per checkpoint segment, on awkward shapes; bad input.
//!
//! Tolerances (the rule, 1e-4 relative, made precise per quantity):
//! - log Z: `1e-4 max(1, |log Z|)`;
//! - marginals (probabilities, one `exp` each): `1e-4 |mu| + 1e-7`;
//! - d log Z / d S = end - start marginals (a difference): `1e-4 (end + start) + 1e-7`;
//! - d / d dur, d / d trans (sums of marginals): `1e-4 |g| + 1e-6`.
//!
//! Every GPU output buffer and the forward state (checkpoints) start poisoned with NaN, so an
//! element that is not written, or a checkpoint slot read before it is written, fails.

// Index loops over (sequence, position, label) mirror the kernels and the formulas.
#![allow(clippy::needless_range_loop)]

use kernel_tests::{
    Needs, Suite, TestResult, check_close, ensure, gpu_ok, portable_gpu, racecheck_size,
};
use kernels::memory::download;
use kernels::semicrf::reference::{self, Model};
use kernels::semicrf::{self, SemiCrfProblem};
use kernels::{Error, Gpu};
use kernels_testing::semicrf::{RandomInputs, random_inputs};

/// A test problem: sizes, checkpoint interval (None: default), varied lengths, seed.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    t: usize,
    k: usize,
    c: usize,
    ckpt: Option<usize>,
    varied: bool,
    seed: u64,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "b{}_t{}_k{}_c{}_s{}{}",
            self.b,
            self.t,
            self.k,
            self.c,
            self.problem().checkpoint,
            if self.varied { "_varied" } else { "" }
        )
    }
    fn problem(&self) -> SemiCrfProblem {
        let p = SemiCrfProblem::new(self.b, self.t, self.k, self.c);
        match self.ckpt {
            Some(s) => p.with_checkpoint(s),
            None => p,
        }
    }
}

const fn case(b: usize, t: usize, k: usize, c: usize, ckpt: Option<usize>, varied: bool) -> Case {
    Case {
        b,
        t,
        k,
        c,
        ckpt,
        varied,
        seed: (b * 1000 + t * 7 + k * 13 + c * 31) as u64,
    }
}

/// GPU cases: batch 1 and > 1, varied lengths, T not a multiple of S, K > T, K = T, C = 1,
/// C = 24, C = 64 (the maximum), tiny T, many segments (small S).
const CASES: [Case; 11] = [
    case(1, 1, 1, 1, None, false),
    case(1, 37, 5, 3, Some(6), false),
    case(3, 50, 4, 2, Some(7), true),
    case(2, 9, 12, 3, None, false),
    case(4, 64, 8, 1, Some(16), true),
    case(2, 120, 16, 8, None, true),
    case(3, 160, 32, 16, Some(20), true),
    case(1, 150, 32, 16, Some(45), false),
    case(2, 120, 10, 24, Some(25), true),
    case(1, 80, 6, 64, Some(11), false),
    case(2, 100, 100, 5, None, true),
];

fn main() {
    let mut s = Suite::new();
    s.cpu(
        "reference/matches_brute_force",
        reference_matches_brute_force,
    );
    s.cpu("reference/factored_equals_literal", factored_equals_literal);
    s.cpu(
        "reference/marginals_cover_each_position_once",
        marginals_cover_positions,
    );
    s.cpu(
        "reference/gradients_equal_finite_differences",
        finite_differences,
    );
    s.cpu("reference/viterbi_is_valid_and_best", viterbi_reference);
    s.cpu("reference/kernel_algorithm_model", kernel_model);
    s.cpu(
        "reference/kernel_precision_long_sequence",
        long_sequence_precision,
    );
    s.cpu("host/rejects_bad_input", rejects_bad_input);
    s.cpu("host/checkpoint_defaults_and_layouts", checkpoint_defaults);
    s.cpu("host/cumulative_scores", cumulative_scores);
    for c in CASES {
        let n = c.name();
        s.gpu(&format!("forward/{n}"), Needs::Gpu, move |g| forward(g, c));
        s.gpu(&format!("backward/{n}"), Needs::Gpu, move |g| {
            backward(g, c)
        });
        s.gpu(
            &format!("fused_equals_separate/{n}"),
            Needs::Gpu,
            move |g| fused(g, c),
        );
        s.gpu(&format!("viterbi/{n}"), Needs::Gpu, move |g| viterbi(g, c));
    }
    s.gpu(
        "backward/sm_80_target",
        Needs::Gpu,
        |_| match portable_gpu() {
            Some(g) => backward(g, CASES[6]),
            None => {
                println!("the default target is already sm_80");
                Ok(())
            }
        },
    );
    s.gpu("deterministic", Needs::Gpu, deterministic);
    s.gpu(
        "rejects_mismatched_buffers",
        Needs::Gpu,
        rejects_mismatched_buffers,
    );
    s.gpu("scale/t100000_k32_c16_b4", Needs::Gpu, scale);
    s.run()
}

fn inputs(c: &Case) -> RandomInputs {
    random_inputs(&c.problem(), c.seed, c.varied)
}

fn rel_close(what: &str, got: f64, want: f64, rel: f64) -> TestResult {
    let err = (got - want).abs();
    let tol = rel * want.abs().max(1.0);
    println!("{what}: got {got:.9}, want {want:.9}, |err| {err:.3e} (tol {tol:.3e})");
    ensure(err <= tol, || {
        format!("{what}: |err| {err:.3e} > {tol:.3e}")
    })
}

// ----------------------------------------------------------------------------------------
// CPU: the reference.

fn reference_matches_brute_force() -> TestResult {
    let mut n = 0;
    for (t, k, c) in [
        (1, 1, 1),
        (3, 2, 2),
        (5, 3, 1),
        (6, 3, 3),
        (8, 3, 3),
        (8, 2, 3),
        (7, 9, 2),
    ] {
        for varied in [false, true] {
            let p = SemiCrfProblem::new(3, t, k, c);
            let inp = random_inputs(&p, (t * 100 + k * 10 + c) as u64, varied);
            let m = Model::new(&p, &inp.view());
            let z = reference::log_partition(&m);
            let zf = reference::log_partition_factored(&m);
            let post = reference::posterior(&m);
            let vit = reference::viterbi(&m);
            for b in 0..p.batch {
                let bf = reference::brute_force(&m, b);
                let tol = 1e-10 * bf.log_z.abs().max(1.0);
                for (what, v) in [
                    ("literal", z[b]),
                    ("factored", zf[b]),
                    ("posterior", post.log_z[b]),
                ] {
                    ensure((v - bf.log_z).abs() <= tol, || {
                        format!(
                            "T{t} K{k} C{c} b{b}: {what} log Z {v} vs brute force {}",
                            bf.log_z
                        )
                    })?;
                }
                ensure((vit[b].0 - bf.best).abs() <= tol, || {
                    format!(
                        "T{t} K{k} C{c} b{b}: Viterbi {} vs brute force {}",
                        vit[b].0, bf.best
                    )
                })?;
                let per = t * k * c;
                let mine = &post.marginals[b * per..(b + 1) * per];
                let worst = mine
                    .iter()
                    .zip(&bf.marginals)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                ensure(worst <= 1e-12, || {
                    format!("T{t} K{k} C{c} b{b}: marginals differ by {worst:.3e}")
                })?;
                n += bf.paths;
            }
        }
    }
    println!("{n} paths enumerated; log Z, Viterbi and marginals match to 1e-10");
    Ok(())
}

fn factored_equals_literal() -> TestResult {
    let p = SemiCrfProblem::new(3, 60, 7, 4);
    let inp = random_inputs(&p, 9, true);
    let m = Model::new(&p, &inp.view());
    let (z, zf) = (
        reference::log_partition(&m),
        reference::log_partition_factored(&m),
    );
    for b in 0..3 {
        rel_close(&format!("log Z b{b}"), zf[b], z[b], 1e-12)?;
    }
    let (lit, fac) = (reference::posterior(&m), reference::posterior_factored(&m));
    rel_close(
        "factored posterior log Z",
        fac.log_z[2],
        lit.log_z[2],
        1e-12,
    )?;
    for (what, got, want) in [
        ("dlogZ/dS", &fac.grad_cumsum, &lit.grad_cumsum),
        ("end marginals", &fac.end, &lit.end),
        ("start marginals", &fac.start, &lit.start),
        ("dlogZ/ddur", &fac.grad_dur, &lit.grad_dur),
        ("dlogZ/dtrans", &fac.grad_trans, &lit.grad_trans),
    ] {
        let err = max_abs_diff(got, want);
        println!("factored posterior {what}: max |diff| {err:.3e}");
        ensure(got.len() == want.len() && err <= 1e-12, || {
            format!("factored posterior: {what} differs by {err:.3e}")
        })?;
    }
    Ok(())
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn marginals_cover_positions() -> TestResult {
    let p = SemiCrfProblem::new(2, 40, 6, 3);
    let inp = random_inputs(&p, 4, true);
    let m = Model::new(&p, &inp.view());
    let post = reference::posterior(&m);
    check_cover(&p, &inp.lengths, |i| post.marginals[i], 1e-12)
}

/// For every position `t < L` the marginals of the segments covering it sum to 1.
fn check_cover(
    p: &SemiCrfProblem,
    lengths: &[u32],
    mu: impl Fn(usize) -> f64,
    tol: f64,
) -> TestResult {
    let mut worst = 0.0f64;
    for b in 0..p.batch {
        let len = lengths[b] as usize;
        for pos in 0..len {
            let mut sum = 0.0;
            for s in pos.saturating_sub(p.k - 1)..=pos {
                for k in (pos - s + 1)..=p.k.min(len - s) {
                    for c in 0..p.c {
                        sum += mu(((b * p.t + s) * p.k + k - 1) * p.c + c);
                    }
                }
            }
            worst = worst.max((sum - 1.0).abs());
        }
    }
    println!("marginals covering a position sum to 1 within {worst:.3e}");
    ensure(worst <= tol, || {
        format!("coverage off by {worst:.3e} > {tol:.1e}")
    })
}

fn finite_differences() -> TestResult {
    let p = SemiCrfProblem::new(2, 12, 4, 3);
    let inp = random_inputs(&p, 21, true);
    let m = Model::new(&p, &inp.view());
    let post = reference::posterior(&m);
    let total = |m: &Model| reference::log_partition(m).iter().sum::<f64>();
    let h = 1e-5;
    let mut worst = 0.0f64;
    let mut check =
        |what: &str, get: &dyn Fn(&mut Model) -> &mut f64, analytic: f64| -> TestResult {
            let (mut plus, mut minus) = (m.clone(), m.clone());
            *get(&mut plus) += h;
            *get(&mut minus) -= h;
            let fd = (total(&plus) - total(&minus)) / (2.0 * h);
            let err = (fd - analytic).abs();
            worst = worst.max(err);
            ensure(err <= 1e-7, || {
                format!("{what}: finite difference {fd}, analytic {analytic}")
            })
        };
    for i in (0..m.cumsum.len()).step_by(5) {
        check(
            &format!("S[{i}]"),
            &|m| &mut m.cumsum[i],
            post.grad_cumsum[i],
        )?;
    }
    for i in 0..m.dur.len() {
        check(&format!("dur[{i}]"), &|m| &mut m.dur[i], post.grad_dur[i])?;
    }
    for i in 0..m.trans.len() {
        check(
            &format!("trans[{i}]"),
            &|m| &mut m.trans[i],
            post.grad_trans[i],
        )?;
    }
    println!("gradients match central differences (h = 1e-5) within {worst:.3e}");
    Ok(())
}

fn viterbi_reference() -> TestResult {
    let p = SemiCrfProblem::new(3, 30, 5, 4);
    let inp = random_inputs(&p, 5, true);
    let m = Model::new(&p, &inp.view());
    for (b, (score, segs)) in reference::viterbi(&m).iter().enumerate() {
        let s = reference::segmentation_score(&m, b, segs).ok_or("invalid Viterbi path")?;
        ensure((s - score).abs() <= 1e-9, || {
            format!("b{b}: path score {s} vs {score}")
        })?;
    }
    // An invalid path is rejected.
    let bad = [reference::Segment {
        start: 0,
        dur: 1,
        label: 0,
    }];
    ensure(reference::segmentation_score(&m, 0, &bad).is_none(), || {
        "short path accepted".into()
    })
}

fn rejects_bad_input() -> TestResult {
    let p = SemiCrfProblem::new(2, 10, 3, 4);
    let inp = random_inputs(&p, 1, false);
    inp.view()
        .validate(&p)
        .map_err(|e| format!("valid input rejected: {e}"))?;
    let mut bad_len = inp.clone();
    bad_len.lengths[1] = 11;
    let mut zero_len = inp.clone();
    zero_len.lengths[0] = 0;
    let mut nan = inp.clone();
    nan.cumsum[17] = f32::NAN;
    let mut inf_dur = inp.clone();
    inf_dur.dur[2] = f32::INFINITY;
    let mut nan_trans = inp.clone();
    nan_trans.trans[5] = f32::NAN;
    let mut short = inp.clone();
    short.cumsum.pop();
    let mut wrong_dur = inp.clone();
    wrong_dur.dur.push(0.0);
    let mut wrong_b = inp.clone();
    wrong_b.lengths.push(3);
    type Check = fn(&Error) -> bool;
    let invalid: Check = |e| matches!(e, Error::InvalidArgument { .. });
    let shape: Check = |e| matches!(e, Error::ShapeMismatch { .. });
    let unsupported: Check = |e| matches!(e, Error::Unsupported { .. });
    let cases: Vec<(&str, &RandomInputs, SemiCrfProblem, Check)> = vec![
        ("length > T", &bad_len, p, invalid),
        ("length 0", &zero_len, p, invalid),
        ("NaN score", &nan, p, invalid),
        ("inf duration", &inf_dur, p, invalid),
        ("NaN transition", &nan_trans, p, invalid),
        ("short cumsum", &short, p, shape),
        ("dur not [K, C]", &wrong_dur, p, shape),
        ("lengths not [B]", &wrong_b, p, shape),
        ("K = 0", &inp, SemiCrfProblem::new(2, 10, 0, 4), invalid),
        ("C = 0", &inp, SemiCrfProblem::new(2, 10, 3, 0), invalid),
        ("B = 0", &inp, SemiCrfProblem::new(0, 10, 3, 4), invalid),
        ("T = 0", &inp, SemiCrfProblem::new(2, 0, 3, 4), invalid),
        (
            "C = 65",
            &inp,
            SemiCrfProblem::new(2, 10, 3, 65),
            unsupported,
        ),
        ("checkpoint 0", &inp, p.with_checkpoint(0), invalid),
        (
            "checkpoint too large",
            &inp,
            p.with_checkpoint(100_000),
            invalid,
        ),
        (
            "K C too large",
            &inp,
            SemiCrfProblem::new(2, 10, 5000, 64),
            unsupported,
        ),
    ];
    for (what, i, prob, ok) in cases {
        match i.view().validate(&prob) {
            Err(e) if ok(&e) => println!("{what}: {e}"),
            other => return Err(format!("{what}: expected a typed error, got {other:?}").into()),
        }
    }
    Ok(())
}

fn checkpoint_defaults() -> TestResult {
    use kernel_abi::semicrf::*;
    for k in [1u32, 2, 3, 8, 17, 32, 100, 255] {
        for c in [1u32, 2, 3, 4, 5, 16, 24, 33, 64] {
            let g = lanes_per_label(k, c);
            ensure(
                g.is_power_of_two() && g <= 32 && padded_labels(c) * g <= THREADS,
                || format!("K{k} C{c}: {g} lanes per label"),
            )?;
            let max = max_checkpoint(k, c);
            if max > 0 {
                ensure(segment_layout(max, k, c).bytes <= SMEM_BUDGET, || {
                    "max does not fit".into()
                })?;
                ensure(segment_layout(max + 1, k, c).bytes > SMEM_BUDGET, || {
                    "max not maximal".into()
                })?;
            }
            for t in [1u32, 10, 1000, 100_000] {
                let s = default_checkpoint(t, k, c);
                let ideal = ((t as f64) * (k as f64))
                    .sqrt()
                    .round()
                    .clamp(1.0, t as f64) as u32;
                ensure(s == ideal.min(max), || {
                    format!("T{t} K{k} C{c}: default {s}, ideal {ideal}, max {max}")
                })?;
            }
        }
    }
    let p = SemiCrfProblem::new(4, 100_000, 32, 16);
    let m = p.memory();
    println!(
        "B4 T100000 K32 C16: S = {}, {} segments, inputs {} B, state {} B, gradients {} B",
        p.checkpoint,
        p.num_segments(),
        m.inputs,
        m.state,
        m.gradients
    );
    ensure(p.validate().is_ok() && m.state < m.inputs, || {
        "scale problem does not fit".into()
    })
}

fn cumulative_scores() -> TestResult {
    let scores = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let s = semicrf::cumulative_scores(&scores, 1, 3, 2).map_err(|e| e.to_string())?;
    ensure(s == [0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 9.0, 12.0], || {
        format!("got {s:?}")
    })?;
    ensure(
        semicrf::cumulative_scores(&scores, 1, 4, 2).is_err(),
        || "bad shape accepted".into(),
    )
}

// ----------------------------------------------------------------------------------------
// GPU.

fn forward(g: &Gpu, c: Case) -> TestResult {
    let p = c.problem();
    let inp = inputs(&c);
    let stream = gpu_ok(g.stream())?;
    let got = gpu_ok(semicrf::log_partition(g, &stream, &p, &inp.view()))?;
    let want = reference::log_partition(&Model::new(&p, &inp.view()));
    for b in 0..p.batch {
        rel_close(
            &format!("log Z b{b} L{} (seed {})", inp.lengths[b], c.seed),
            got[b] as f64,
            want[b],
            1e-4,
        )?;
    }
    Ok(())
}

/// Compare a GPU posterior with the reference, segment by segment.
fn compare_posterior(
    p: &SemiCrfProblem,
    got: &semicrf::Posterior,
    want: &reference::Posterior,
    label: &str,
) -> TestResult {
    let (t, k, c, s) = (p.t, p.k, p.c, p.checkpoint);
    for b in 0..p.batch {
        let rel = 1e-4 * want.log_z[b].abs().max(1.0);
        let err = (got.log_z[b] as f64 - want.log_z[b]).abs();
        ensure(err <= rel, || {
            format!("{label} log Z b{b}: |err| {err:.3e}")
        })?;
        for j in 0..p.num_segments() {
            let (lo, hi) = (j * s, ((j + 1) * s).min(t + 1));
            let g0 = (b * (t + 1) + lo) * c;
            let g1 = (b * (t + 1) + hi) * c;
            let gw: Vec<f64> = want.grad_cumsum[g0..g1].to_vec();
            check_close(
                &format!("{label} dlogZ/dS, sequence {b}, segment {j} (positions {lo}..{hi})"),
                &got.grad_cumsum[g0..g1],
                &gw,
                |i| 1e-4 * (want.end[g0 + i] + want.start[g0 + i]) + 1e-7,
            )?;
            if let Some(mu) = &got.marginals {
                let (m0, m1) = ((b * t + lo.min(t)) * k * c, (b * t + hi.min(t)) * k * c);
                check_close(
                    &format!("{label} marginals, sequence {b}, segment {j}"),
                    &mu[m0..m1],
                    &want.marginals[m0..m1],
                    |i| 1e-4 * want.marginals[m0 + i] + 1e-7,
                )?;
            }
        }
    }
    check_close(
        &format!("{label} dlogZ/ddur"),
        &got.grad_dur,
        &want.grad_dur,
        |i| 1e-4 * want.grad_dur[i].abs() + 1e-6,
    )?;
    check_close(
        &format!("{label} dlogZ/dtrans"),
        &got.grad_trans,
        &want.grad_trans,
        |i| 1e-4 * want.grad_trans[i].abs() + 1e-6,
    )
}

fn backward(g: &Gpu, c: Case) -> TestResult {
    let p = c.problem();
    let inp = inputs(&c);
    println!(
        "{} on {}, seed {}, lengths {:?}",
        c.name(),
        g.arch(),
        c.seed,
        inp.lengths
    );
    let stream = gpu_ok(g.stream())?;
    let got = gpu_ok(semicrf::posterior(g, &stream, &p, &inp.view(), true))?;
    let want = reference::posterior(&Model::new(&p, &inp.view()));
    compare_posterior(&p, &got, &want, &c.name())?;
    let mu = got.marginals.as_ref().ok_or("no marginals")?;
    check_cover(&p, &inp.lengths, |i| mu[i] as f64, 1e-4)
}

fn fused(g: &Gpu, c: Case) -> TestResult {
    let p = c.problem();
    let inp = inputs(&c);
    let stream = gpu_ok(g.stream())?;
    let dev = gpu_ok(semicrf::DeviceInputs::upload(&p, &inp.view()))?;
    // log Z, dS, ddur, dtrans, forward and reverse log Z (f64).
    type Outputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f64>, Vec<f64>);
    let run = |fused: bool| -> kernels::Result<Outputs> {
        let mut st = semicrf::ForwardState::new(&p)?;
        let mut gr = semicrf::Gradients::new(&p, false)?;
        if fused {
            semicrf::forward_backward_launch(g, &stream, &p, &dev, &mut st, &mut gr)?;
        } else {
            semicrf::forward_launch(g, &stream, &p, &dev, &mut st)?;
            semicrf::backward_launch(g, &stream, &p, &dev, &mut st, &mut gr)?;
        }
        g.sync(&stream, "semicrf")?;
        let (zf, zr) = st.log_z_both()?;
        Ok((
            download(st.log_z())?,
            download(&gr.grad_cumsum)?,
            download(&gr.grad_dur)?,
            download(&gr.grad_trans)?,
            zf,
            zr,
        ))
    };
    let a = gpu_ok(run(false))?;
    let b = gpu_ok(run(true))?;
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    ensure(
        bits(&a.0) == bits(&b.0)
            && bits(&a.1) == bits(&b.1)
            && bits(&a.2) == bits(&b.2)
            && bits(&a.3) == bits(&b.3),
        || "fused and separate launches differ".into(),
    )?;
    // The reverse scan's log Z agrees with the forward's.
    for i in 0..p.batch {
        rel_close(
            &format!("forward vs reverse log Z b{i}"),
            b.5[i],
            b.4[i],
            1e-5,
        )?;
    }
    Ok(())
}

fn viterbi(g: &Gpu, c: Case) -> TestResult {
    let p = c.problem();
    let inp = inputs(&c);
    let stream = gpu_ok(g.stream())?;
    let got = gpu_ok(semicrf::viterbi(g, &stream, &p, &inp.view()))?;
    let m = Model::new(&p, &inp.view());
    let want = reference::viterbi(&m);
    let mut same = 0;
    for b in 0..p.batch {
        let best = want[b].0;
        rel_close(
            &format!("Viterbi score b{b}"),
            got[b].score as f64,
            best,
            1e-4,
        )?;
        let s = reference::segmentation_score(&m, b, &got[b].segments).ok_or_else(|| {
            format!(
                "b{b}: the GPU path is not a segmentation: {:?}",
                got[b].segments
            )
        })?;
        // f32 may resolve a near-tie differently; the path it returns must still be optimal.
        rel_close(&format!("f64 score of the GPU path b{b}"), s, best, 1e-4)?;
        same += usize::from(got[b].segments == want[b].1);
    }
    println!("{same} of {} paths identical to the reference's", p.batch);
    Ok(())
}

fn deterministic(g: &Gpu) -> TestResult {
    let c = CASES[6];
    let p = c.problem();
    let inp = inputs(&c);
    let stream = gpu_ok(g.stream())?;
    let a = gpu_ok(semicrf::posterior(g, &stream, &p, &inp.view(), true))?;
    let b = gpu_ok(semicrf::posterior(g, &stream, &p, &inp.view(), true))?;
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    ensure(
        bits(&a.log_z) == bits(&b.log_z)
            && bits(&a.grad_cumsum) == bits(&b.grad_cumsum)
            && bits(&a.grad_dur) == bits(&b.grad_dur)
            && bits(&a.grad_trans) == bits(&b.grad_trans)
            && a.marginals.as_deref().map(bits) == b.marginals.as_deref().map(bits),
        || "two runs differ".into(),
    )
}

fn rejects_mismatched_buffers(g: &Gpu) -> TestResult {
    let p = SemiCrfProblem::new(2, 20, 4, 3);
    let q = SemiCrfProblem::new(2, 21, 4, 3);
    let inp = random_inputs(&p, 3, false);
    let stream = gpu_ok(g.stream())?;
    let dev = gpu_ok(semicrf::DeviceInputs::upload(&p, &inp.view()))?;
    let mut wrong_state = gpu_ok(semicrf::ForwardState::new(&q))?;
    match semicrf::forward_launch(g, &stream, &p, &dev, &mut wrong_state) {
        Err(Error::ShapeMismatch { .. }) => {}
        other => return Err(format!("state of another problem accepted: {other:?}").into()),
    }
    let mut st = gpu_ok(semicrf::ForwardState::new(&p))?;
    let mut wrong_grads = gpu_ok(semicrf::Gradients::new(&q, false))?;
    match semicrf::backward_launch(g, &stream, &p, &dev, &mut st, &mut wrong_grads) {
        Err(Error::ShapeMismatch { .. }) => Ok(()),
        other => Err(format!("gradients of another problem accepted: {other:?}").into()),
    }
}

/// T = 100 000, K = 32, C = 16, B = 4: forward and backward fit, log Z and the gradients match
/// the factored f64 reference with the small cases' tolerances (position by position: an
/// error that accumulates along the sequence shows here, while the identities below only see
/// it at the ends), and the gradients satisfy the identities of a distribution over
/// segmentations. Under racecheck (`KERNELS_SANITIZER=racecheck`) T is 2000 instead
/// ([`racecheck_size`]): the same kernels with the same K, C and batch (the shared-memory
/// layout), over fewer checkpoint segments (each sequence still spans several).
fn scale(g: &Gpu) -> TestResult {
    let t = racecheck_size("T", 100_000, 2_000);
    let p = SemiCrfProblem::new(4, t, 32, 16);
    let inp = random_inputs(&p, 100, true);
    let stream = gpu_ok(g.stream())?;
    let free_before = gpu_ok(kernels::memory::free_device_memory())?;
    let dev = gpu_ok(semicrf::DeviceInputs::upload(&p, &inp.view()))?;
    let mut st = gpu_ok(semicrf::ForwardState::new(&p))?;
    let mut gr = gpu_ok(semicrf::Gradients::new(&p, false))?;
    let free_after = gpu_ok(kernels::memory::free_device_memory())?;
    let start = std::time::Instant::now();
    gpu_ok(semicrf::forward_launch(g, &stream, &p, &dev, &mut st))?;
    gpu_ok(g.sync(&stream, "forward"))?;
    let fwd = start.elapsed();
    gpu_ok(semicrf::backward_launch(
        g, &stream, &p, &dev, &mut st, &mut gr,
    ))?;
    gpu_ok(g.sync(&stream, "backward"))?;
    let total = start.elapsed();
    let mem = p.memory();
    println!(
        "scale: T = {}, S = {} ({} segments), forward {:.1} ms, forward+backward {:.1} ms; \
         device memory {} bytes allocated (inputs {} + state {} + gradients {}), {} bytes by \
         cuMemGetInfo",
        p.t,
        p.checkpoint,
        p.num_segments(),
        fwd.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3,
        mem.forward_backward(),
        mem.inputs,
        mem.state,
        mem.gradients,
        free_before.saturating_sub(free_after)
    );
    let z = gpu_ok(download(st.log_z()))?;
    let (zf, zr) = gpu_ok(st.log_z_both())?;
    let want = reference::posterior_factored(&Model::new(&p, &inp.view()));
    for b in 0..p.batch {
        rel_close(&format!("log Z b{b}"), z[b] as f64, want.log_z[b], 1e-4)?;
        // The marginals combine both scans: their log Z must agree far better than 1e-4
        // relative (the identity at t = 0 is -exp(reverse - forward)).
        let d = (zf[b] - zr[b]).abs();
        println!("b{b}: forward vs reverse log Z (f64) differ by {d:.3e}");
        ensure(d <= 1e-5, || {
            format!("b{b}: forward log Z {} vs reverse {}", zf[b], zr[b])
        })?;
    }
    let gs = gpu_ok(download(&gr.grad_cumsum))?;
    let (gd, gt) = (
        gpu_ok(download(&gr.grad_dur))?,
        gpu_ok(download(&gr.grad_trans))?,
    );
    for b in 0..p.batch {
        let (g0, g1) = (b * (p.t + 1) * p.c, (b + 1) * (p.t + 1) * p.c);
        check_close(
            &format!("dlogZ/dS, sequence {b}"),
            &gs[g0..g1],
            &want.grad_cumsum[g0..g1],
            |i| 1e-4 * (want.end[g0 + i] + want.start[g0 + i]) + 1e-7,
        )?;
    }
    check_close("dlogZ/ddur", &gd, &want.grad_dur, |i| {
        1e-4 * want.grad_dur[i].abs() + 1e-6
    })?;
    check_close("dlogZ/dtrans", &gt, &want.grad_trans, |i| {
        1e-4 * want.grad_trans[i].abs() + 1e-6
    })?;
    // sum_c dlogZ/dS[t, c] = P(boundary at t) - P(boundary at t) = 0 inside, -1 at 0, +1 at L.
    let mut worst = 0.0f64;
    for b in 0..p.batch {
        let len = inp.lengths[b] as usize;
        for t in 0..=p.t {
            let sum: f64 = (0..p.c)
                .map(|c| gs[(b * (p.t + 1) + t) * p.c + c] as f64)
                .sum();
            let want = if t == 0 {
                -1.0
            } else if t == len {
                1.0
            } else {
                0.0
            };
            worst = worst.max((sum - want).abs());
        }
    }
    println!("sum_c dlogZ/dS[t, c] within {worst:.3e} of -1 / 0 / +1");
    ensure(worst <= 1e-4, || {
        format!("gradient sums off by {worst:.3e}")
    })?;
    // Every segment has one duration and one incoming transition (the virtual one included).
    let (nd, nt): (f64, f64) = (
        gd.iter().map(|&x| x as f64).sum(),
        gt.iter().map(|&x| x as f64).sum(),
    );
    rel_close(
        "expected segments: dur counts vs trans counts",
        nd,
        nt,
        1e-4,
    )
}

// ----------------------------------------------------------------------------------------
// CPU model of the kernels' algorithm (`semicrf_model.rs`).

#[path = "semicrf_model.rs"]
mod model;
use model::Numerics;

fn kernel_model() -> TestResult {
    for (b, t, k, c, s, varied) in [
        (1, 1, 1, 1, 1, false),
        (3, 50, 4, 2, 7, true),
        (2, 9, 12, 3, 3, false),
        (2, 70, 5, 3, 16, true),
        (3, 61, 20, 4, 17, true),
        (1, 40, 3, 2, 40, false),
        (2, 70, 5, 3, 5, true),
        (2, 100, 7, 2, 31, true),
    ] {
        let p = SemiCrfProblem::new(b, t, k, c).with_checkpoint(s);
        let inp = random_inputs(&p, (t + k + c) as u64, varied);
        let m = Model::new(&p, &inp.view());
        let want = reference::posterior(&m);
        let mut dur = vec![0.0; k * c];
        let mut trans = vec![0.0; c * c];
        let mut seen = vec![false; b * (t + 1) * c];
        for bi in 0..b {
            let (z, a) = model::scan(&m, Numerics::EXACT, bi, false, s);
            let (zr, be) = model::scan(&m, Numerics::EXACT, bi, true, s);
            let tol = 1e-10 * z.abs().max(1.0);
            ensure(
                (z - want.log_z[bi]).abs() <= tol && (zr - z).abs() <= tol,
                || {
                    format!(
                        "b{bi}: model log Z {z} / reverse {zr}, reference {}",
                        want.log_z[bi]
                    )
                },
            )?;
            for j in 0..p.num_segments() {
                let o = model::segment(&m, Numerics::EXACT, bi, j, s, z, &a, &be, true);
                for (pos, l, g) in o.grad {
                    let i = (bi * (t + 1) + pos) * c + l;
                    ensure(!seen[i], || {
                        format!("b{bi}: position {pos} written by two segments")
                    })?;
                    seen[i] = true;
                    ensure((g - want.grad_cumsum[i]).abs() <= 1e-10, || {
                        format!(
                            "b{bi} segment {j} position {pos} label {l}: grad {g} vs {}",
                            want.grad_cumsum[i]
                        )
                    })?;
                }
                for (pos, kk, l, mu) in o.mu {
                    if pos < t {
                        let w = want.marginals[((bi * t + pos) * k + kk - 1) * c + l];
                        ensure((mu - w).abs() <= 1e-10, || {
                            format!("b{bi} mu[{pos},{kk},{l}] {mu} vs {w}")
                        })?;
                    }
                }
                dur.iter_mut().zip(&o.dur).for_each(|(x, y)| *x += y);
                trans.iter_mut().zip(&o.trans).for_each(|(x, y)| *x += y);
            }
            // Positions past the length are the kernels' zero rows.
            for pos in m.lengths[bi] + 1..=t {
                for l in 0..c {
                    seen[(bi * (t + 1) + pos) * c + l] = true;
                }
            }
        }
        ensure(seen.iter().all(|x| *x), || {
            "a position no segment wrote".into()
        })?;
        for (what, got, want) in [
            ("dur", &dur, &want.grad_dur),
            ("trans", &trans, &want.grad_trans),
        ] {
            let err = got
                .iter()
                .zip(want.iter())
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            ensure(err <= 1e-10, || {
                format!("{what} counts differ by {err:.3e}")
            })?;
        }
        println!("model B{b} T{t} K{k} C{c} S{s}: matches the reference to 1e-10");
    }
    Ok(())
}

/// The kernels' precision on a long sequence, in the model: with [`Numerics::KERNEL`] (f64
/// scans, f32 combination, the f32 exponential's documented error bound taken fully biased, the
/// worst case for accumulation) the gradient at T = 100 000 matches the f64 reference with the
/// GPU tests' tolerances and its identities hold to 1e-5. With the scans in f32
/// ([`Numerics::F32_SCAN`], the first kernels' numerics, which failed `scale/*` on the GPU) the
/// same checks fail already at T = 20 000: the forward and reverse scans drift apart and every
/// marginal with them, which is what this test guards against.
fn long_sequence_precision() -> TestResult {
    let (worst, report) = precision_case(100_000, Numerics::KERNEL.biased(1.0))?;
    println!("kernel numerics, T = 100000: {report}");
    if let Some(e) = worst {
        return Err(e.into());
    }
    let (worst, report) = precision_case(20_000, Numerics::F32_SCAN)?;
    println!("f32 scans, T = 20000: {report}");
    ensure(worst.is_some(), || {
        "the f32-scan model passes: the precision checks are not sensitive enough".into()
    })
}

/// The model's forward+backward of one sequence of length `t` (K = 32, C = 16, the
/// benchmark's data) checked against the f64 factored reference: returns the first failed check
/// (if any) and a report of the measured errors.
fn precision_case(t: usize, n: Numerics) -> Result<(Option<String>, String), String> {
    let p = SemiCrfProblem::new(1, t, 32, 16);
    let inp = random_inputs(&p, 100, false);
    let m = Model::new(&p, &inp.view());
    let want = reference::posterior_factored(&m);
    let got = model::run(&m, n, p.checkpoint);
    let (ident, counts) = model::identity_error(&m, &got);
    let (zf, zr) = got.log_z[0];
    let mut checks = vec![
        ("sum_c dlogZ/dS[t, c] identity", ident, 1e-5),
        ("duration vs transition counts", counts, 1e-5),
        ("forward vs reverse log Z", (zf - zr).abs(), 1e-6),
        (
            "log Z (relative)",
            (zf - want.log_z[0]).abs() / want.log_z[0].abs(),
            1e-9,
        ),
    ];
    // Errors relative to the tests' tolerances (1 = at the tolerance).
    let ratio = |got: &[f64], want: &[f64], tol: &dyn Fn(usize) -> f64| {
        (0..want.len())
            .map(|i| (got[i] - want[i]).abs() / tol(i))
            .fold(0.0, f64::max)
    };
    checks.push((
        "dlogZ/dS error / (1e-4 (end + start) + 1e-7)",
        ratio(&got.grad_cumsum, &want.grad_cumsum, &|i| {
            1e-4 * (want.end[i] + want.start[i]) + 1e-7
        }),
        1.0,
    ));
    checks.push((
        "dlogZ/ddur error / (1e-4 |g| + 1e-6)",
        ratio(&got.grad_dur, &want.grad_dur, &|i| {
            1e-4 * want.grad_dur[i].abs() + 1e-6
        }),
        1.0,
    ));
    checks.push((
        "dlogZ/dtrans error / (1e-4 |g| + 1e-6)",
        ratio(&got.grad_trans, &want.grad_trans, &|i| {
            1e-4 * want.grad_trans[i].abs() + 1e-6
        }),
        1.0,
    ));
    let report = checks
        .iter()
        .map(|(what, v, tol)| format!("{what} {v:.3e} (bound {tol:.0e})"))
        .collect::<Vec<_>>()
        .join("; ");
    let failed = checks
        .iter()
        .find(|(_, v, tol)| v.is_nan() || v > tol)
        .map(|(what, v, tol)| format!("T = {t}, {n:?}: {what} {v:.3e} > {tol:.0e}"));
    Ok((failed, report))
}
