//! The f64 backward reference against central finite differences of the f64 forward
//! reference, on tiny problems (CPU): `reference/backward/<case>`; with a softcap and sinks
//! too (`backward_f64_sinks`, the sinks' gradient included).

use kernel_tests::{Suite, TestResult, ensure};
use kernels::attention::{self, AttentionProblem, Dtype};
use kernels::bf16;
use kernels::data::rng;
use rand::Rng;

/// Register the cases.
pub fn register(s: &mut Suite) {
    for c in backward_cases() {
        s.cpu(&format!("reference/backward/{}", c.name), move || {
            backward_against_finite_differences(&c)
        });
    }
}

/// A backward-reference case: the gradients of `L = sum(O * W) + sum(LSE * U)` (U = 0 without
/// dLSE) against central finite differences of the f64 forward reference.
struct BackwardCase {
    name: &'static str,
    p: AttentionProblem,
    /// Whether the loss has the LSE term (`d_lse` given) or not (`None`).
    with_lse: bool,
    /// Inputs in bf16 through [`attention::reference::backward`] (else f64 through
    /// `backward_f64`); the finite differences always perturb the inputs in f64.
    bf16: bool,
}

fn backward_cases() -> Vec<BackwardCase> {
    let p = |b, sq, sk, hq, hkv| AttentionProblem::new(b, sq, sk, hq, hkv, 64, Dtype::Bf16);
    let pair = |b, sq, sk, hq, hkv| {
        AttentionProblem::new(b, sq, sk, hq, hkv, 192, Dtype::Bf16).value_dim(128)
    };
    let c = |name, p, with_lse| BackwardCase {
        name,
        p,
        with_lse,
        bf16: false,
    };
    vec![
        c("plain", p(2, 5, 7, 2, 2), true),
        c("plain_no_dlse", p(2, 5, 7, 2, 2), false),
        c("causal_sq_lt_sk", p(1, 3, 7, 2, 2).causal(), true),
        // The first 4 rows have no allowed key.
        c(
            "causal_sq_gt_sk_empty_rows",
            p(1, 7, 3, 2, 2).causal(),
            true,
        ),
        c("window", p(1, 6, 6, 2, 1).window(Some(1), Some(2)), true),
        // diag = i - 2: rows 0 and 1 have no allowed key.
        c(
            "window_empty_rows",
            p(2, 6, 4, 2, 2).window(Some(0), Some(0)),
            true,
        ),
        c(
            "causal_window",
            p(1, 6, 7, 2, 2).causal().window(Some(2), None),
            false,
        ),
        c("gqa", p(2, 4, 5, 4, 2).causal(), true),
        c("mqa", p(1, 5, 6, 4, 1), true),
        c("mqa_no_dlse", p(1, 5, 6, 4, 1).window(None, Some(1)), false),
        c("sq1", p(2, 1, 7, 2, 1).causal(), true),
        c("sq1_sk1", p(1, 1, 1, 2, 2), true),
        c("sk1", p(1, 4, 1, 2, 2).causal(), true),
        c("scale", p(1, 5, 5, 2, 2).scale(0.4), true),
        // Softcaps small enough to bend the logits (|scale q.k| reaches about 1).
        c("softcap", p(2, 5, 7, 2, 2).softcap(0.7), true),
        c("sinks", p(2, 5, 7, 2, 2).with_sinks(), true),
        c("sinks_no_dlse", p(1, 5, 6, 4, 2).with_sinks(), false),
        // Rows with no key: their LSE is the sink, and dLSE reaches the sink's gradient.
        c(
            "softcap_sinks_causal_empty_rows",
            p(1, 7, 3, 2, 2).causal().softcap(1.5).with_sinks(),
            true,
        ),
        c(
            "softcap_sinks_gqa_window",
            p(2, 4, 5, 4, 2)
                .window(Some(1), Some(1))
                .softcap(2.0)
                .with_sinks(),
            true,
        ),
        BackwardCase {
            name: "gqa_bf16_inputs",
            p: p(1, 5, 6, 4, 2).causal(),
            with_lse: true,
            bf16: true,
        },
        // V, O and dO of their own head dimension (Q and K of 192, V and O of 128).
        c("value_dim", pair(2, 5, 7, 2, 2), true),
        c("value_dim_gqa_causal", pair(1, 6, 4, 4, 2).causal(), true),
        c(
            "value_dim_window_no_dlse",
            pair(1, 6, 6, 2, 1).window(Some(1), Some(2)),
            false,
        ),
    ]
}

/// Relative bound on `|analytic - fd|`: `FD_TOL * (1 + |fd|)`. Central differences with step
/// `h = 1e-6 max(1, |x|)` in f64 have truncation error `O(h^2)` (~1e-12 here) and rounding
/// error about `eps |L| / h` (~1e-9 for these losses), far below it.
const FD_TOL: f64 = 1e-6;

/// Elements of each of Q, K and V perturbed (a random subset, so each case takes milliseconds).
const FD_SAMPLES: usize = 24;

fn backward_against_finite_differences(c: &BackwardCase) -> TestResult {
    use attention::reference::{backward, backward_f64_sinks, reference_f64_sinks};
    let p = &c.p;
    let seed = 0xbacd ^ (c.name.len() as u64 * 7919) ^ (p.seq_q * 131 + p.seq_k) as u64;
    let mut r = rng(seed);
    let mut draw = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let x: f64 = r.random_range(-1.0..1.0);
                if c.bf16 {
                    bf16::from_f64(x).to_f64()
                } else {
                    x
                }
            })
            .collect()
    };
    let n = |s: [usize; 4]| s.iter().product::<usize>();
    let (q, k, v) = (
        draw(n(p.q_shape())),
        draw(n(p.kv_shape())),
        draw(n(p.v_shape())),
    );
    let w = draw(n(p.o_shape()));
    let sinks: Option<Vec<f64>> = p.sinks.then(|| draw(p.heads_q));
    let u = if c.with_lse {
        draw(p.lse_len())
    } else {
        vec![0.0; p.lse_len()]
    };
    let (grads, dsinks) = if c.bf16 {
        let t = |x: &[f64]| -> Vec<bf16> { x.iter().map(|&x| bf16::from_f64(x)).collect() };
        let u32: Vec<f32> = u.iter().map(|&x| x as f32).collect();
        let g = backward(
            p,
            &t(&q),
            &t(&k),
            &t(&v),
            &t(&w),
            c.with_lse.then_some(&u32[..]),
        );
        (g, None)
    } else {
        let d_lse = c.with_lse.then_some(&u[..]);
        backward_f64_sinks(p, &q, &k, &v, &w, d_lse, sinks.as_deref())
    };
    // L = sum(O * W) + sum(LSE * U) over the rows with an allowed key (LSE = -inf elsewhere;
    // U is nonzero there too, and must not reach the gradients).
    let loss_with = |q: &[f64], k: &[f64], v: &[f64], s: Option<&[f64]>| -> f64 {
        let f = reference_f64_sinks(p, q, k, v, s);
        let o: f64 = f.o.iter().zip(&w).map(|(a, b)| a * b).sum();
        let l: f64 = f
            .lse
            .iter()
            .zip(&u)
            .filter(|(l, _)| l.is_finite())
            .map(|(a, b)| a * b)
            .sum();
        o + l
    };
    let loss = |q: &[f64], k: &[f64], v: &[f64]| loss_with(q, k, v, sinks.as_deref());
    for (what, g) in [("dQ", &grads.dq), ("dK", &grads.dk), ("dV", &grads.dv)] {
        ensure(g.iter().all(|x| x.is_finite()), || {
            format!("{}: {what} has NaN or inf", c.name)
        })?;
    }
    // Rows with no allowed key: dQ exactly 0.
    let mut empty_rows = 0;
    let d = p.head_dim;
    for b in 0..p.batch {
        for i in (0..p.seq_q).filter(|&i| (0..p.seq_k).all(|j| !p.allowed(i, j))) {
            for h in 0..p.heads_q {
                empty_rows += 1;
                let start = ((b * p.seq_q + i) * p.heads_q + h) * d;
                ensure(grads.dq[start..start + d].iter().all(|&x| x == 0.0), || {
                    format!(
                        "{}: dQ row (b {b}, i {i}, h {h}) has no allowed key but is not 0",
                        c.name
                    )
                })?;
            }
        }
    }
    let mut worst = 0.0f64; // max |analytic - fd| / (1 + |fd|)
    let mut worst_abs = 0.0f64;
    for (which, analytic) in [(0, &grads.dq), (1, &grads.dk), (2, &grads.dv)] {
        let n = analytic.len();
        let mut picks: Vec<usize> = (0..FD_SAMPLES.min(n))
            .map(|_| r.random_range(0..n))
            .collect();
        picks.sort();
        picks.dedup();
        for idx in picks {
            let mut inputs = [q.clone(), k.clone(), v.clone()];
            let x = inputs[which][idx];
            let h = 1e-6 * x.abs().max(1.0);
            inputs[which][idx] = x + h;
            let xp = inputs[which][idx];
            let lp = loss(&inputs[0], &inputs[1], &inputs[2]);
            inputs[which][idx] = x - h;
            let xm = inputs[which][idx];
            let lm = loss(&inputs[0], &inputs[1], &inputs[2]);
            let fd = (lp - lm) / (xp - xm);
            let a = analytic[idx];
            let err = (a - fd).abs();
            worst_abs = worst_abs.max(err);
            worst = worst.max(err / (1.0 + fd.abs()));
            ensure(err <= FD_TOL * (1.0 + fd.abs()), || {
                format!(
                    "{}: {} [{idx}] analytic {a:.12e} vs finite difference {fd:.12e} (seed {seed:#x})",
                    c.name,
                    ["dQ", "dK", "dV"][which]
                )
            })?;
        }
    }
    // The sinks' gradient, every head.
    if let (Some(s), Some(ds)) = (&sinks, &dsinks) {
        for hd in 0..s.len() {
            let mut sp = s.clone();
            let h = 1e-6 * s[hd].abs().max(1.0);
            sp[hd] = s[hd] + h;
            let xp = sp[hd];
            let lp = loss_with(&q, &k, &v, Some(&sp));
            sp[hd] = s[hd] - h;
            let xm = sp[hd];
            let lm = loss_with(&q, &k, &v, Some(&sp));
            let fd = (lp - lm) / (xp - xm);
            let err = (ds[hd] - fd).abs();
            worst_abs = worst_abs.max(err);
            worst = worst.max(err / (1.0 + fd.abs()));
            ensure(err <= FD_TOL * (1.0 + fd.abs()), || {
                format!(
                    "{}: dsinks [{hd}] analytic {:.12e} vs finite difference {fd:.12e}",
                    c.name, ds[hd]
                )
            })?;
        }
    }
    ensure(sinks.is_some() == dsinks.is_some(), || {
        format!("{}: a sinks gradient exactly with sinks", c.name)
    })?;
    println!(
        "reference/backward/{}: worst |analytic - fd| / (1 + |fd|) = {worst:.3e} (tol {FD_TOL:e}), \
         worst abs {worst_abs:.3e}, {empty_rows} empty rows",
        c.name
    );
    Ok(())
}
