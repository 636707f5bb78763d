//! Property tests on the GPU: small random problems of every family, the kernels against the
//! f64 references (the GLA backward's also in the CPU emulator, on smaller problems:
//! `props::gla_backward_emulated`).

use crate::gla_backward;
use crate::run_attention;
use kernel_tests::{TestResult, gpu_ok};
use kernels::attention::{self, AttentionProblem, Dtype, Path, reference};
use kernels::gla::{self, GlaKernel, GlaProblem};
use kernels::memory::{download, poisoned, upload};
use kernels::mhc::{self, MhcProblem};
use kernels::semicrf::{self, SemiCrfProblem};
use kernels::{Gpu, bf16};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// `((batch, seq_q, seq_k, heads_kv), head_dim, (causal, hopper, window_left))`.
type AttentionCase = (
    (usize, usize, usize, usize),
    usize,
    (bool, bool, Option<usize>),
);

pub fn attention_small(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let strategy = (
        (1usize..=2, 1usize..=150, 1usize..=150, 1usize..=2),
        prop_oneof![Just(64usize), Just(128), Just(256)],
        (
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0usize..=40),
        ),
    );
    let run = |((b, sq, sk, hkv), d, (causal, hopper, left)): AttentionCase| -> Result<(), TestCaseError> {
        let mut p = AttentionProblem::new(b, sq, sk, 2 * hkv, hkv, d, Dtype::Bf16)
            .window(left, None)
            .path(if hopper && g.arch().has_hopper_kernels() {
                Path::Hopper
            } else {
                Path::MmaSync
            });
        p.causal = causal;
        let mut r = kernels::data::rng((b * 7 + sq * 13 + sk * 17 + d) as u64);
        let q = kernels::data::uniform_bf16(&mut r, b * sq * 2 * hkv * d, -1.0, 1.0);
        let k = kernels::data::uniform_bf16(&mut r, b * sk * hkv * d, -1.0, 1.0);
        let v = kernels::data::uniform_bf16(&mut r, b * sk * hkv * d, -1.0, 1.0);
        let (o, lse) = run_attention(g, &stream, &p, &q, &k, &v)
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let want = attention::reference(&p, &q, &k, &v);
        for (i, (x, w)) in o.iter().zip(&want.o).enumerate() {
            // bf16 output: 2^-8 relative plus accumulation in f32 over at most 150 keys.
            prop_assert!(
                (x.to_f32() as f64 - w).abs() <= 1e-2 * w.abs() + 1e-2,
                "O[{i}] {x} vs {w}"
            );
        }
        for (x, w) in lse.iter().zip(&want.lse) {
            prop_assert!((*x as f64 == *w) || (*x as f64 - w).abs() <= 1e-3 * w.abs().max(1.0));
        }
        Ok(())
    };
    gpu_runner(32)
        .run(&strategy, run)
        .map_err(|e| format!("{e}").into())
}

/// `((batch, seq_q, seq_k, heads_kv), head_dim, (causal, deterministic, with_dlse, left))`.
type BackwardCase = (
    (usize, usize, usize, usize),
    usize,
    (bool, bool, bool, Option<usize>),
);

/// The backward on small random problems (grouped-query heads, windows, dLSE, both dQ modes)
/// against the f64 reference under the backward tests' tolerance rule
/// (`attention::reference::backward_tolerance`), given the reference forward's O and LSE.
pub fn attention_backward_small(g: &'static Gpu) -> TestResult {
    let strategy = (
        (1usize..=2, 1usize..=130, 1usize..=130, 1usize..=2),
        prop_oneof![Just(64usize), Just(128), Just(256)],
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0usize..=40),
        ),
    );
    let run = |((b, sq, sk, hkv), d, (causal, deterministic, with_dlse, left)): BackwardCase|
     -> Result<(), TestCaseError> {
        let mut p =
            AttentionProblem::new(b, sq, sk, 2 * hkv, hkv, d, Dtype::Bf16).window(left, None);
        p.causal = causal;
        let seed = (b * 7 + sq * 13 + sk * 17 + d + 3) as u64;
        let (q, k, v) = kernels_testing::attention::random_inputs::<bf16>(&p, 1.0, seed);
        let mut r = kernels::data::rng(seed ^ 0xb0);
        let d_o = kernels::data::uniform_bf16(&mut r, q.len(), -1.0, 1.0);
        let fwd = attention::reference(&p, &q, &k, &v);
        let o: Vec<bf16> = fwd.o.iter().map(|&x| bf16::from_f64(x)).collect();
        let lse: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
        let d_lse = with_dlse.then(|| kernels::data::uniform_f32(&mut r, lse.len(), -1.0, 1.0));
        let x = kernels_testing::attention::BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            d_o: &d_o,
            d_lse: d_lse.as_deref(),
        };
        let (dq, dk, dv) = prop_gpu(kernels_testing::attention::device_backward(
            g,
            &p,
            &x,
            attention::BackwardOptions { deterministic },
        ))?;
        let want = reference::backward(&p, &q, &k, &v, &d_o, d_lse.as_deref());
        let naive = attention::naive_backward_same_precision(&p, &q, &k, &v, &d_o, d_lse.as_deref());
        let max_diff = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| if (x - y).is_nan() { f64::INFINITY } else { (x - y).abs() })
                .fold(0.0, f64::max)
        };
        let wide = |x: &[bf16]| -> Vec<f64> { x.iter().map(|x| x.to_f64()).collect() };
        for (name, got, w, n) in [
            ("dQ", wide(&dq), &want.dq, &naive.dq),
            ("dK", wide(&dk), &want.dk, &naive.dk),
            ("dV", wide(&dv), &want.dv, &naive.dv),
        ] {
            let max_ref = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let tol = reference::backward_tolerance(max_diff(n, w), max_ref);
            let err = max_diff(&got, w);
            prop_assert!(err <= tol, "{name}: max error {err:.3e} > tolerance {tol:.3e}");
        }
        Ok(())
    };
    gpu_runner(24)
        .run(&strategy, run)
        .map_err(|e| format!("{e}").into())
}

/// The runner of the GPU properties: `cases` cases from a fixed seed (a failure reproduces),
/// at most 64 shrinking steps (each runs the kernels again).
fn gpu_runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..Config::default()
    };
    TestRunner::new_with_rng(
        config,
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    )
}

/// A library result inside a GPU property: a watchdog timeout ends the process (as
/// [`gpu_ok`]), any other error fails the case.
fn prop_gpu<T>(r: kernels::Result<T>) -> Result<T, TestCaseError> {
    gpu_ok(r).map_err(|e| TestCaseError::fail(e.message().unwrap_or("failed").to_string()))
}

pub fn semicrf_small(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let strategy = (
        1usize..=3,
        1usize..=60,
        1usize..=6,
        1usize..=5,
        proptest::option::of(1usize..=20),
    );
    gpu_runner(32)
        .run(&strategy, |(b, t, k, c, ckpt)| {
            let mut p = SemiCrfProblem::new(b, t, k, c);
            if let Some(s) = ckpt {
                p = p.with_checkpoint(s);
            }
            let inp = kernels_testing::semicrf::random_inputs(
                &p,
                (b + 3 * t + 5 * k + 7 * c) as u64,
                true,
            );
            let got = semicrf::posterior(g, &stream, &p, &inp.view(), false)
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            let want =
                semicrf::reference::posterior(&semicrf::reference::Model::new(&p, &inp.view()));
            for (x, w) in got.log_z.iter().zip(&want.log_z) {
                prop_assert!(
                    (*x as f64 - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "log Z {x} vs {w}"
                );
            }
            for (x, w) in got.grad_dur.iter().zip(&want.grad_dur) {
                prop_assert!(
                    (*x as f64 - w).abs() <= 1e-4 * w.abs() + 1e-6,
                    "ddur {x} vs {w}"
                );
            }
            for (x, w) in got.grad_trans.iter().zip(&want.grad_trans) {
                prop_assert!(
                    (*x as f64 - w).abs() <= 1e-4 * w.abs() + 1e-6,
                    "dtrans {x} vs {w}"
                );
            }
            Ok(())
        })
        .map_err(|e| format!("{e}").into())
}

/// The bound on GLA's relative L2 errors (o and final states), as in `tests/gla.rs`.
const GLA_TOL: f64 = 1e-2;

/// A seed from a case's description (FNV-1a), so each case has its own data and a failing case
/// reproduces from its printed form.
fn seed_of(case: &impl std::fmt::Debug) -> u64 {
    format!("{case:?}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
}

/// GLA shapes of the GPU property: `batch` rows of `seq_len` tokens, or packed sequences of the
/// given lengths.
#[derive(Clone, Debug)]
pub enum GlaShape {
    Batch(usize, usize),
    Packed(Vec<usize>),
}

impl GlaShape {
    /// The problem of this shape.
    fn problem(&self, heads: usize, dk: usize, dv: usize) -> GlaProblem {
        match self {
            GlaShape::Batch(b, t) => GlaProblem::new(*b, *t, heads, dk, dv),
            GlaShape::Packed(lens) => {
                let mut cu = vec![0];
                for l in lens {
                    cu.push(cu.last().unwrap() + l);
                }
                GlaProblem::varlen(cu, heads, dk, dv)
            }
        }
    }
}

/// `(shape, heads, (dk, dv), segment length, (initial state, final state), lowest log-decay)`.
type GlaCase = (
    GlaShape,
    usize,
    (usize, usize),
    Option<usize>,
    (bool, bool),
    f32,
);

/// GLA on random shapes against the f64 recurrence: T of any length (rarely a multiple of the
/// 16-token chunk), packed variable lengths, every (Dk, Dv) pair, with and without initial and
/// final states, automatic and forced segments (state pass and combination), log-decays
/// uniform in `[lo, 0)` for lo in {-0.05, -1, -3}; each case on the baseline kernels and, on
/// sm_90a, on the pingpong (forced: with these few (sequence, head) pairs the automatic choice
/// is mostly the baseline). Relative L2 error of o and of the final
/// states at most [`GLA_TOL`]; outputs start poisoned (an unwritten or non-finite element fails).
pub fn gla_small(g: &'static Gpu) -> TestResult {
    const CASES: u32 = 24;
    let stream = gpu_ok(g.stream())?;
    let dim = || prop_oneof![Just(64usize), Just(128)];
    let strategy = (
        prop_oneof![
            (1usize..=3, 1usize..=200).prop_map(|(b, t)| GlaShape::Batch(b, t)),
            proptest::collection::vec(1usize..=150, 1..=4).prop_map(GlaShape::Packed),
        ],
        1usize..=3,
        (dim(), dim()),
        prop_oneof![
            Just(None),
            Just(Some(32usize)),
            Just(Some(64)),
            Just(Some(96))
        ],
        (any::<bool>(), any::<bool>()),
        prop_oneof![Just(-0.05f32), Just(-1.0), Just(-3.0)],
    );
    let worst = std::cell::Cell::new((0.0f64, 0.0f64));
    let choices = if g.arch().has_hopper_kernels() {
        vec![GlaKernel::Baseline, GlaKernel::Pingpong]
    } else {
        vec![GlaKernel::Baseline]
    };
    let run = |case: GlaCase| -> Result<(), TestCaseError> {
        let seed = seed_of(&case);
        let (shape, heads, (dk, dv), seg, (init, fin), lo) = case;
        let mut p = shape.problem(heads, dk, dv);
        p.segment_len = seg;
        let mut r = kernels::data::rng(seed);
        let q = kernels::data::uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
        let k = kernels::data::uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
        let v = kernels::data::uniform_bf16(&mut r, p.v_len(), -1.0, 1.0);
        let gd = kernels::data::uniform_bf16(&mut r, p.qk_len(), lo, 0.0);
        let init_state = init.then(|| kernels::data::uniform_f32(&mut r, p.state_len(), -1.0, 1.0));
        let want = prop_gpu(gla::reference::recurrence(
            &p,
            &gla::reference::HostInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &gd,
                init_state: init_state.as_deref(),
            },
        ))?;
        let (dq, dkb, dvb, dg) = (
            prop_gpu(upload(&q))?,
            prop_gpu(upload(&k))?,
            prop_gpu(upload(&v))?,
            prop_gpu(upload(&gd))?,
        );
        let dinit = prop_gpu(init_state.as_deref().map(upload).transpose())?;
        // The baseline, and on sm_90a also the automatic choice (the pingpong).
        for &kernel in &choices {
            p.kernel = kernel;
            let mut o = prop_gpu(poisoned::<bf16>(p.v_len()))?;
            let mut fs = if fin {
                Some(prop_gpu(poisoned::<f32>(p.state_len()))?)
            } else {
                None
            };
            let mut session = prop_gpu(gla::GlaSession::new(g, &p))?;
            prop_gpu(session.forward(
                g,
                &stream,
                &gla::GlaInputs {
                    q: &dq,
                    k: &dkb,
                    v: &dvb,
                    g: &dg,
                    init_state: dinit.as_ref(),
                },
                &mut gla::GlaOutputs {
                    o: &mut o,
                    final_state: fs.as_mut(),
                },
            ))?;
            prop_gpu(g.sync(&stream, "GLA forward"))?;
            let o = prop_gpu(download(&o))?;
            let err_o = gla::reference::rel_l2(o.iter().map(|x| x.to_f64()), &want.o);
            let err_s = match &fs {
                Some(b) => gla::reference::rel_l2(
                    prop_gpu(download(b))?.iter().map(|&x| x as f64),
                    &want.final_state,
                ),
                None => 0.0,
            };
            let (wo, ws) = worst.get();
            worst.set((wo.max(err_o), ws.max(err_s)));
            prop_assert!(
                err_o <= GLA_TOL && err_s <= GLA_TOL,
                "{:?} kernels, {} segments: o rel L2 {err_o:.3e}, final state {err_s:.3e} \
                 (tol {GLA_TOL:.0e})",
                session.kernel(),
                session.segments().segments.len()
            );
        }
        Ok(())
    };
    gpu_runner(CASES)
        .run(&strategy, run)
        .map_err(|e| format!("{e}"))?;
    let (o, st) = worst.get();
    println!(
        "{CASES} cases on {}, kernels {choices:?}: worst rel L2 o {o:.3e}, final state {st:.3e} \
         (tol {GLA_TOL:.0e})",
        g.arch()
    );
    Ok(())
}

/// `(shape, heads, (dk, dv), segment length, (initial state, dS_final), scale, log-decays)`.
pub type GlaBwdCase = (
    GlaShape,
    usize,
    (usize, usize),
    Option<usize>,
    (bool, bool),
    Option<f32>,
    gla_backward::Decay,
);

/// The GLA backward's random cases: `batch` rows of T tokens (T = 1 half the time, else up to
/// `max_t`: rarely a multiple of the 16-token chunk or the 64-token block) or packed sequences
/// (each of one token half the time, else up to `max_len`), 1 ..= `max_heads` heads, every
/// (Dk, Dv) pair of {64, 128}, automatic or forced segments (`segments`; split sequences: the
/// state passes and combinations), with and without initial states and dS_final, the default
/// or a random scale, log-decays slow, moderate, strong, straddling the clamp `G_FLOOR` = -20
/// (`[-20.5, -19.5)`) or spiky (a quarter at -20).
pub fn gla_backward_cases(
    max_batch: usize,
    max_t: usize,
    max_len: usize,
    max_heads: usize,
    segments: &[usize],
) -> impl Strategy<Value = GlaBwdCase> {
    use gla_backward::Decay;
    let dim = || prop_oneof![Just(64usize), Just(128)];
    let seg = proptest::option::of(proptest::sample::select(segments.to_vec()));
    (
        prop_oneof![
            (
                1usize..=max_batch,
                prop_oneof![Just(1usize), 1usize..=max_t]
            )
                .prop_map(|(b, t)| GlaShape::Batch(b, t)),
            proptest::collection::vec(prop_oneof![Just(1usize), 1usize..=max_len], 1..=4)
                .prop_map(GlaShape::Packed),
        ],
        1usize..=max_heads,
        (dim(), dim()),
        seg,
        (any::<bool>(), any::<bool>()),
        proptest::option::of(0.05f32..2.0),
        prop_oneof![
            Just(Decay::Uniform(-0.05, 0.0)),
            Just(Decay::Uniform(-1.0, 0.0)),
            Just(Decay::Uniform(-3.0, 0.0)),
            Just(Decay::Uniform(-20.5, -19.5)),
            Just(Decay::Spiky),
        ],
    )
}

/// The GLA backward property: `cases` cases of `strategy`, each run by `run` (a whole backward
/// through its plan, outputs and workspace poisoned) and every gradient (dq, dk, dv, dg, dS_0)
/// checked against the f64 backward (`gla_backward::Errors::ok`: relative L2 at most
/// `gla_backward::TOL` each, dg exactly 0 where `g < G_FLOOR`). Prints each case's errors and
/// the worst of all.
pub fn gla_backward_property(
    what: &str,
    cases: u32,
    strategy: impl Strategy<Value = GlaBwdCase>,
    run: impl Fn(&GlaProblem, &gla_backward::Data) -> kernels::Result<gla_backward::Got>,
) -> TestResult {
    let worst = std::cell::Cell::new(gla_backward::Errors::default());
    let check = |case: GlaBwdCase| -> Result<(), TestCaseError> {
        let seed = seed_of(&case);
        let (shape, heads, (dk, dv), seg, (init, d_final), scale, decay) = case.clone();
        let mut p = shape.problem(heads, dk, dv);
        p.segment_len = seg;
        if let Some(s) = scale {
            p = p.with_scale(s);
        }
        let c = gla_backward::Case {
            p,
            init,
            d_final,
            decay,
            seed,
        };
        let d = gla_backward::Data::random(&c);
        let want = prop_gpu(d.reference(&c.p))?;
        let got = prop_gpu(run(&c.p, &d))?;
        let e = gla_backward::Errors::of(&d, &got, &want);
        println!("  {case:?}: {e}");
        worst.set(worst.get().max(e));
        prop_assert!(e.ok(), "{e}");
        Ok(())
    };
    gpu_runner(cases)
        .run(&strategy, check)
        .map_err(|e| format!("{e}"))?;
    println!("{cases} cases {what}: worst {}", worst.get());
    Ok(())
}

/// The GLA backward on small random problems on the GPU (see [`gla_backward_cases`]): T up to
/// 300, packed sequences up to 200 tokens, up to 3 rows and 2 heads, forced segments of 32, 64
/// or 96 tokens or one per sequence (`usize::MAX`).
pub fn gla_backward_small(g: &'static Gpu) -> TestResult {
    const CASES: u32 = 32;
    gla_backward_property(
        &format!("on {}", g.arch()),
        CASES,
        gla_backward_cases(3, 300, 200, 2, &[32, 64, 96, usize::MAX]),
        |p, d| gla_backward::on_gpu(g, p, d, gla_backward::Kernels::Library),
    )
}

/// `((B, S, n, C), gamma, Sinkhorn iterations)`.
type MhcCase = ((usize, usize, usize, usize), bool, u32);

/// mHC forward and backward on random problems against the f64 reference, every output (the
/// weight gradients included) within the tolerances stated in `kernels::mhc::reference`
/// (`tol_bf16`, `tol_f32`, `tol_proj`): B 1..=3, S 1..=80 (token counts that fill no tile),
/// n 2..=8 (every supported value), C a multiple of 8 up to 512, with and without gamma, 1, 3
/// or 20 Sinkhorn iterations. Outputs start poisoned.
pub fn mhc_small(g: &'static Gpu) -> TestResult {
    const CASES: u32 = 24;
    let stream = gpu_ok(g.stream())?;
    let strategy = (
        (
            1usize..=3,
            1usize..=80,
            2usize..=8,
            (1usize..=64).prop_map(|x| 8 * x),
        ),
        any::<bool>(),
        prop_oneof![Just(1u32), Just(3), Just(20)],
    );
    let worst = std::cell::Cell::new(0.0f64);
    let run = |case: MhcCase| -> Result<(), TestCaseError> {
        let seed = seed_of(&case);
        let ((b, s, n, c), gamma, iters) = case;
        let p = MhcProblem::new(b, s, n, c)
            .with_gamma(gamma)
            .with_iters(iters);
        let data = mhc::reference::MhcData::random(&p, seed);
        let mut dev = prop_gpu(kernels_testing::mhc::MhcDeviceRun::upload(&data))?;
        prop_gpu(dev.forward(g, &stream))?;
        prop_gpu(dev.backward(g, &stream))?;
        prop_gpu(g.sync(&stream, "mHC forward and backward"))?;
        let out = prop_gpu(dev.download())?;
        let cmp = kernels_testing::mhc::compare(&data, &out, None);
        for name in kernels_testing::mhc::OUTPUTS {
            prop_assert!(
                cmp.get(name).values > 0 || (name == "dgamma" && !gamma),
                "{name} was not compared"
            );
        }
        worst.set(
            cmp.stats
                .iter()
                .fold(worst.get(), |m, st| m.max(st.max_ratio)),
        );
        prop_assert!(cmp.ok(), "{}", cmp.failures().join("; "));
        Ok(())
    };
    gpu_runner(CASES)
        .run(&strategy, run)
        .map_err(|e| format!("{e}"))?;
    println!(
        "{CASES} cases on {}: every output within tolerance, at most {:.3} of it",
        g.arch(),
        worst.get()
    );
    Ok(())
}
