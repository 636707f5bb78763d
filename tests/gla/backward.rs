//! The f64 backward reference (`gla::reference::backward`) against central finite differences
//! of the f64 forward it differentiates (`gla::reference::clamped_recurrence`, the recurrence
//! with `g` clamped at `G_FLOOR`; checked equal to `recurrence` on the cases' bf16 inputs where
//! no `g` is clamped), through the scalar loss `L = sum(o W) + sum(final_state U)` (random `W`,
//! `U`; without `U` where the case has no final-state gradient).
//!
//! Per tensor (q, k, v, g and the initial state, a zero one where the case has none) 20 random elements and the first
//! element of every sequence's first token (last head) `x` are perturbed by `h = 1e-6 max(1, |x|)`: `fd = (L(x + h) - L(x - h)) / 2h`.
//!
//! Tolerance: `|grad - fd| <= 1e-6 |grad| + 4 eps_f64 L_abs / h`, `L_abs = sum |o W| +
//! sum |final_state U|` (the rounding of the loss, amplified by `1 / h`). `L` is affine in any
//! single element of q, k, v or the initial state, and affine in `exp(g)` for a single `g`, so
//! the central difference has no truncation error but for g (`h^2 / 6` relative, 1e-10 at most
//! here). Printed: the worst `|grad - fd| / bound` (at most 1) and the worst relative error
//! `|grad - fd| / |grad|` over the elements whose gradient is resolved (`|grad|` above 1000
//! times the noise term) per tensor.
//!
//! The log-decays, also:
//! - where `g < G_FLOOR - 2h` (clamped on both sides of the difference), `dg` must be exactly 0
//!   and so is the difference; elements within `2h` of the floor are skipped (counted);
//! - since `L = alpha + beta exp(g)` while `g` stays above the floor, the secant
//!   `(L(g + s) - L(g - s)) / (2 sinh s)` with `s = min(0.25, (g - G_FLOOR) / 2)` is the
//!   derivative exactly (no truncation at any step): it resolves the tiny gradients near the
//!   floor (`exp(-20) = 2e-9` times the state), which the step `h` leaves in the loss's rounding.
//!   Same tolerance with `s` for `h`.

use super::{Case, Decay, case, data};
use kernel_tests::{Suite, TestResult, ensure, gpu_ok};
use kernels::data::rng;
use kernels::gla::reference::{
    self, ExactInputs, OutputGrads, backward, backward_head, clamped_recurrence, rel_l2,
};
use kernels::gla::{G_FLOOR, GlaProblem};
use rand::Rng;
use rand::rngs::StdRng;

/// Relative part of the finite-difference bound.
const RTOL: f64 = 1e-6;
/// Multiple of `eps_f64 L_abs / h` in the bound.
const NOISE: f64 = 4.0;
/// Elements perturbed per tensor.
const SAMPLES: usize = 20;

/// A case: the forward's case (sizes, decays, initial state, `final_state`: whether the loss
/// has the final-state term), and optionally log-decays drawn here instead.
struct BwdCase {
    c: Case,
    g: Option<fn(&mut StdRng) -> f64>,
}

fn cases() -> Vec<(&'static str, BwdCase)> {
    let slow = Decay::Uniform(-1.0, 0.0);
    let tiny = |batch, t, heads, dk, dv, decay| {
        let mut c = case(batch, t, heads, dk, dv, decay);
        c.init = false;
        c
    };
    let plain = tiny(2, 7, 2, 64, 64, slow);
    let init = case(1, 9, 2, 64, 128, slow);
    let mut no_dfinal = case(2, 6, 1, 128, 64, slow);
    no_dfinal.final_state = false;
    let mut varlen = case(1, 0, 2, 64, 64, slow);
    varlen.p = GlaProblem::varlen(vec![0, 5, 6, 13], 2, 64, 64);
    varlen.seed = 777;
    let near_clamp = case(1, 8, 2, 128, 128, Decay::Uniform(-20.5, -19.5));
    let spiky = case(2, 8, 1, 64, 64, slow);
    let mut scaled = case(1, 6, 2, 64, 64, slow);
    scaled.p = scaled.p.with_scale(0.37);
    let t1 = case(3, 1, 2, 128, 64, slow);
    let mut t1_bare = tiny(2, 1, 1, 64, 128, slow);
    t1_bare.final_state = false;
    let plain_case = |c| BwdCase { c, g: None };
    vec![
        ("plain", plain_case(plain)),
        ("init_state", plain_case(init)),
        ("no_final_grad", plain_case(no_dfinal)),
        ("varlen", plain_case(varlen)),
        ("near_clamp", plain_case(near_clamp)),
        (
            "spiky",
            BwdCase {
                c: spiky,
                // A quarter very negative (clamped and not), the rest near 0.
                g: Some(|r| {
                    if r.random_range(0..4) == 0 {
                        r.random_range(-30.0..-10.0)
                    } else {
                        r.random_range(-0.1..0.0)
                    }
                }),
            },
        ),
        ("scale", plain_case(scaled)),
        ("t1", plain_case(t1)),
        ("t1_no_init_no_final_grad", plain_case(t1_bare)),
    ]
}

pub fn register(s: &mut Suite) {
    for (name, c) in cases() {
        s.cpu(&format!("reference/backward/{name}"), move || check(&c));
    }
    s.cpu(
        "reference/backward/rejects_bad_lengths",
        rejects_bad_lengths,
    );
}

/// The loss and `L_abs` at `x`.
fn loss(p: &GlaProblem, x: &ExactInputs, w: &[f64], u: Option<&[f64]>) -> (f64, f64) {
    let e = clamped_recurrence(p, x).expect("validated inputs");
    let (mut l, mut abs) = (0.0f64, 0.0f64);
    for (o, w) in e.o.iter().zip(w) {
        l += o * w;
        abs += (o * w).abs();
    }
    if let Some(u) = u {
        for (f, u) in e.final_state.iter().zip(u) {
            l += f * u;
            abs += (f * u).abs();
        }
    }
    (l, abs)
}

/// Tensor `which` of `x`: q, k, v, g, the initial state.
fn tensor(x: &mut ExactInputs, which: usize) -> &mut Vec<f64> {
    match which {
        0 => &mut x.q,
        1 => &mut x.k,
        2 => &mut x.v,
        3 => &mut x.g,
        _ => x.init_state.as_mut().expect("present"),
    }
}

/// The worst measured errors of one tensor.
#[derive(Default)]
struct Worst {
    ratio: f64,
    rel: f64,
    checked: usize,
    resolved: usize,
}

impl Worst {
    fn add(&mut self, grad: f64, fd: f64, noise: f64) {
        let err = (grad - fd).abs();
        self.ratio = self.ratio.max(err / (RTOL * grad.abs() + noise));
        if grad.abs() > 1e3 * noise {
            self.rel = self.rel.max(err / grad.abs());
            self.resolved += 1;
        }
        self.checked += 1;
    }
}

fn check(bc: &BwdCase) -> TestResult {
    let c = &bc.c;
    let p = &c.p;
    let d = data(c);
    let mut x = ExactInputs::from_host(&d.host());
    let floor = G_FLOOR as f64;
    if let Some(draw) = bc.g {
        let mut r = rng(c.seed ^ 0x6a09);
        x.g = (0..p.qk_len()).map(|_| draw(&mut r)).collect();
    } else if x.g.iter().all(|&g| g >= floor) {
        // The differentiated forward is the specification where nothing is clamped.
        let spec = gpu_ok(reference::recurrence(p, &d.host()))?;
        let got = gpu_ok(clamped_recurrence(p, &x))?;
        let (eo, ef) = (
            rel_l2(got.o.iter().copied(), &spec.o),
            rel_l2(got.final_state.iter().copied(), &spec.final_state),
        );
        println!("clamped_recurrence vs recurrence: rel L2 o {eo:.1e}, final {ef:.1e}");
        ensure(eo <= 1e-14 && ef <= 1e-14, || {
            format!("clamped_recurrence differs from recurrence: {eo:e}, {ef:e}")
        })?;
    }
    let mut r = rng(c.seed ^ 0xbb67);
    let w: Vec<f64> = (0..p.v_len()).map(|_| r.random_range(-1.0..1.0)).collect();
    let u: Option<Vec<f64>> = c.final_state.then(|| {
        (0..p.state_len())
            .map(|_| r.random_range(-1.0..1.0))
            .collect()
    });
    let dy = OutputGrads {
        d_o: &w,
        d_final_state: u.as_deref(),
    };
    let grads = gpu_ok(backward(p, &x, &dy))?;
    for (what, v) in [
        ("dq", &grads.dq),
        ("dk", &grads.dk),
        ("dv", &grads.dv),
        ("dg", &grads.dg),
        ("d_init_state", &grads.d_init_state),
    ] {
        ensure(v.iter().all(|x| x.is_finite()), || {
            format!("{what} is not finite")
        })?;
    }
    // backward_head gives the same numbers, (sequence, head) by (sequence, head).
    for (n, (start, len)) in p.sequences().into_iter().enumerate() {
        for h in 0..p.heads {
            let one = gpu_ok(backward_head(p, &x, &dy, n, h))?;
            for i in 0..len {
                let row = (start + i) * p.heads + h;
                let same = one.dq[i * p.dk..(i + 1) * p.dk]
                    == grads.dq[row * p.dk..(row + 1) * p.dk]
                    && one.dk[i * p.dk..(i + 1) * p.dk] == grads.dk[row * p.dk..(row + 1) * p.dk]
                    && one.dg[i * p.dk..(i + 1) * p.dk] == grads.dg[row * p.dk..(row + 1) * p.dk]
                    && one.dv[i * p.dv..(i + 1) * p.dv] == grads.dv[row * p.dv..(row + 1) * p.dv];
                ensure(same, || {
                    format!("backward_head({n}, {h}) differs at row {i}")
                })?;
            }
            let sz = p.dk * p.dv;
            let at = (n * p.heads + h) * sz;
            ensure(one.d_init_state == grads.d_init_state[at..at + sz], || {
                format!("backward_head({n}, {h}): initial-state gradient differs")
            })?;
        }
    }

    let u = u.as_deref();
    let mut r = rng(c.seed ^ 0x3c6e);
    let mut failures = Vec::new();
    let tensors: [(&str, usize, &[f64]); 5] = [
        ("q", 0, &grads.dq),
        ("k", 1, &grads.dk),
        ("v", 2, &grads.dv),
        ("g", 3, &grads.dg),
        ("init_state", 4, &grads.d_init_state),
    ];
    // The initial state's gradient is checked at a zero initial state where none is given (the
    // same forward).
    let x = ExactInputs {
        init_state: Some(
            x.init_state
                .clone()
                .unwrap_or_else(|| vec![0.0; p.state_len()]),
        ),
        ..x
    };
    for (what, which, grad) in tensors {
        let len = grad.len();
        let dim = len / (p.rows() * p.heads).max(1);
        let mut picks = rand::seq::index::sample(&mut r, len, SAMPLES.min(len)).into_vec();
        if which < 4 {
            for (start, _) in p.sequences() {
                picks.push((start * p.heads + p.heads - 1) * dim);
            }
        }
        picks.sort_unstable();
        picks.dedup();
        let (mut worst, mut secant) = (Worst::default(), Worst::default());
        let (mut skipped, mut clamped) = (0usize, 0usize);
        for i in picks {
            let x0 = tensor(&mut x.clone(), which)[i];
            let h = 1e-6 * x0.abs().max(1.0);
            // (L(x0 + step) - L(x0 - step), L_abs at x0 + step).
            let diff = |step: f64| -> (f64, f64) {
                let at = |v: f64| {
                    let mut xp = x.clone();
                    tensor(&mut xp, which)[i] = v;
                    loss(p, &xp, &w, u)
                };
                let ((lp, abs), (lm, _)) = (at(x0 + step), at(x0 - step));
                (lp - lm, abs)
            };
            if which == 3 && (x0 - floor).abs() <= 2.0 * h {
                skipped += 1;
                continue;
            }
            let (dl, abs) = diff(h);
            let fd = dl / (2.0 * h);
            let noise = NOISE * f64::EPSILON * abs / h;
            if which == 3 && x0 < floor {
                clamped += 1;
                if grad[i] != 0.0 || fd != 0.0 {
                    failures.push(format!(
                        "dg at clamped g[{i}] = {x0}: {} (fd {fd})",
                        grad[i]
                    ));
                }
                continue;
            }
            worst.add(grad[i], fd, noise);
            if RTOL * grad[i].abs() + noise < (grad[i] - fd).abs() {
                failures.push(format!("{what}[{i}] = {x0}: {} vs fd {fd}", grad[i]));
            }
            if which == 3 {
                let s = (0.5 * (x0 - floor)).min(0.25);
                let (dl, abs) = diff(s);
                let exact = dl / (2.0 * s.sinh());
                let noise = NOISE * f64::EPSILON * abs / s;
                secant.add(grad[i], exact, noise);
                if RTOL * grad[i].abs() + noise < (grad[i] - exact).abs() {
                    failures.push(format!(
                        "dg[{i}] = {x0}: {} vs secant {exact} (step {s})",
                        grad[i]
                    ));
                }
            }
        }
        print!(
            "d{what}: {} checked, worst |grad - fd| / bound {:.2e}, worst rel {:.2e} ({} resolved)",
            worst.checked, worst.ratio, worst.rel, worst.resolved
        );
        if which == 3 {
            print!(
                "; secant: worst / bound {:.2e}, worst rel {:.2e} ({} resolved); {clamped} \
                 clamped (0 = 0), {skipped} within 2h of the floor skipped",
                secant.ratio, secant.rel, secant.resolved
            );
        }
        println!();
    }
    ensure(failures.is_empty(), || {
        format!(
            "{} mismatches (bound {RTOL:e} |grad| + {NOISE} eps L_abs / h): {}",
            failures.len(),
            failures.join("; ")
        )
    })
}

/// Wrong lengths of the inputs and of the output gradients are typed errors.
fn rejects_bad_lengths() -> TestResult {
    let c = case(1, 3, 1, 64, 64, Decay::Uniform(-1.0, 0.0));
    let p = &c.p;
    let x = ExactInputs::from_host(&data(&c).host());
    let w = vec![0.0f64; p.v_len()];
    let short = vec![0.0f64; p.v_len() - 1];
    let fin = vec![0.0f64; p.state_len() + 1];
    let ok = OutputGrads {
        d_o: &w,
        d_final_state: None,
    };
    ensure(backward(p, &x, &ok).is_ok(), || {
        "valid inputs rejected".into()
    })?;
    for (what, dy) in [
        (
            "short dO",
            OutputGrads {
                d_o: &short,
                d_final_state: None,
            },
        ),
        (
            "long final-state gradient",
            OutputGrads {
                d_o: &w,
                d_final_state: Some(&fin),
            },
        ),
    ] {
        ensure(backward(p, &x, &dy).is_err(), || format!("{what} accepted"))?;
    }
    let mut bad = x.clone();
    bad.g.pop();
    ensure(backward(p, &bad, &ok).is_err(), || {
        "short g accepted".into()
    })?;
    ensure(backward_head(p, &x, &ok, 1, 0).is_err(), || {
        "sequence out of range accepted".into()
    })?;
    ensure(backward_head(p, &x, &ok, 0, 1).is_err(), || {
        "head out of range accepted".into()
    })
}
