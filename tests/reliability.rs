//! The reliability sweep (issue #8), across the families:
//!
//! - `props_*`: property tests of every family's host API: arbitrary sizes and options never
//!   panic; they either fail validation with a typed error, or validate, and then every launch
//!   the library would make passes the same checks `Gpu::launch` makes (kernel in the PTX,
//!   parameter size, block size against the launch bounds, grid and shared memory against an
//!   H100's limits), checked without a GPU; small valid problems also run the CPU reference
//!   (and, on a GPU, the kernels against it: `props_gpu_*`).
//! - `limits_*`: element counts above 2^31 (accepted, the kernels use 64-bit offsets, or a typed
//!   error), the largest head dimension and sequence lengths; no allocation.
//! - `nonfinite_*`: NaN and Inf inputs, behaviour as documented in README.md ("NaN and Inf");
//!   the GLA and mHC kernels' behaviour is tested in their suites (`gla/nonfinite/*`,
//!   `mhc/nonfinite/*`), where the emulator runs the same checks without a GPU.
//! - `negative_*`: the negative controls (`gpu-kernels/src/negative.rs`): the checks must catch
//!   them. The sanitizer passes of `bundle/run.sh` leave these tests out; `bundle/reliability.sh`
//!   runs them under racecheck and expects hazards.
//! - `concurrent_*`: all four families on several streams at once, bitwise equal to sequential
//!   runs.

use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, check_close, ensure, gpu_ok, racecheck_size};
use kernels::attention::{self, AttentionProblem, Dtype, Path, View};
use kernels::gla::{self, GlaProblem};
use kernels::gpu::check_launch;
use kernels::memory::{download, poisoned, upload};
use kernels::mhc::{self, DevView, Exec, MhcProblem};
use kernels::semicrf::{self, SemiCrfProblem};
use kernels::{Arch, Error, Gpu, LaunchConfig, bf16};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::cell::RefCell;

/// Dynamic shared memory per block an H100/H200 allows (227 KiB): launches are checked against
/// it without a GPU.
const HOPPER_MAX_SMEM: usize = 227 * 1024;

/// Cases per property: enough to cover every option combination many times, small enough that
/// the suite stays a few seconds (CI runs without a GPU).
const CASES: u32 = 256;

fn main() {
    let mut s = Suite::new();
    s.cpu("props_attention_validate_or_typed_error", props_attention);
    s.cpu("props_attention_view_bounds", props_attention_views);
    s.cpu("props_semicrf_validate_or_typed_error", props_semicrf);
    s.cpu("props_gla_validate_or_typed_error", props_gla);
    s.cpu("props_mhc_validate_or_typed_error", props_mhc);
    s.gpu("props_gpu_attention_small", Needs::Gpu, props_gpu_attention);
    s.gpu("props_gpu_semicrf_small", Needs::Gpu, props_gpu_semicrf);
    s.gpu("props_gpu_gla_small", Needs::Gpu, props_gpu_gla);
    s.gpu("props_gpu_mhc_small", Needs::Gpu, props_gpu_mhc);
    s.cpu("limits_attention", limits_attention);
    s.cpu("limits_semicrf", limits_semicrf);
    s.cpu("limits_gla", limits_gla);
    s.cpu("limits_mhc", limits_mhc);
    s.cpu("nonfinite_semicrf_rejected", nonfinite_semicrf);
    s.gpu(
        "nonfinite_semicrf_gpu_rejected",
        Needs::Gpu,
        nonfinite_semicrf_gpu,
    );
    s.cpu(
        "nonfinite_attention_reference",
        nonfinite_attention_reference,
    );
    s.gpu(
        "nonfinite_attention_gpu",
        Needs::Gpu,
        nonfinite_attention_gpu,
    );
    s.gpu(
        "large_offsets_attention_gpu",
        Needs::Gpu,
        large_offsets_attention_gpu,
    );
    s.gpu("large_offsets_gla_gpu", Needs::Gpu, large_offsets_gla_gpu);
    s.cpu("nonfinite_gla_reference", nonfinite_gla_reference);
    s.cpu("negative_emulated_reduce_barrier_hazard", negative_emulated);
    s.gpu(
        "negative_reduce_no_barrier_wrong",
        Needs::Gpu,
        negative_reduce_wrong,
    );
    s.gpu(
        "negative_reduce_no_barrier_racecheck_target",
        Needs::Gpu,
        negative_reduce_target,
    );
    s.gpu(
        "negative_semicrf_aliased_wrong",
        Needs::Gpu,
        negative_semicrf,
    );
    s.gpu("concurrent_four_families_bitwise", Needs::Gpu, concurrent);
    s.run()
}

// ---------------------------------------------------------------------------------------------
// Properties

/// Run `prop` on `CASES` cases of `strategy` (deterministic seed: proptest's default runner
/// with a fixed RNG, so a failure reproduces; the failing, shrunk case is in the message).
fn property<S: Strategy>(
    strategy: S,
    prop: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> TestResult
where
    S::Value: std::fmt::Debug,
{
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    runner
        .run(&strategy, |v| {
            // A panic is a failure of the property, reported with the case.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prop(v))) {
                Ok(r) => r,
                Err(e) => Err(TestCaseError::fail(format!(
                    "panicked: {}",
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                ))),
            }
        })
        .map_err(|e| format!("{e}").into())
}

/// Sizes from tiny to far beyond every limit, biased towards the interesting small values.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0usize..=4,
        4 => 1usize..=300,
        2 => 1usize..=70_000,
        1 => (0u32..=63).prop_map(|b| 1usize << b),
        1 => any::<usize>(),
    ]
}

/// The launch checks of `Gpu::launch` on every PTX target, for an H100/H200's limits.
fn launch_ok(
    name: &str,
    param_bytes: usize,
    cfg: &LaunchConfig,
    hopper_only: bool,
) -> Result<(), TestCaseError> {
    for arch in Arch::ALL {
        if hopper_only && !arch.has_hopper_kernels() {
            continue;
        }
        check_launch(arch, name, cfg, param_bytes, HOPPER_MAX_SMEM).map_err(|e| {
            TestCaseError::fail(format!(
                "a validated problem would launch invalidly on {arch}: {e}"
            ))
        })?;
    }
    Ok(())
}

/// A typed error of validation: any variant but the device ones.
fn typed(e: &Error) -> Result<(), TestCaseError> {
    match e {
        Error::ShapeMismatch { .. }
        | Error::Unsupported { .. }
        | Error::InvalidArgument { .. }
        | Error::Misaligned { .. } => Ok(()),
        other => Err(TestCaseError::fail(format!(
            "unexpected error kind: {other}"
        ))),
    }
}

fn props_attention() -> TestResult {
    let strategy = (
        (size(), size(), size(), size(), size()),
        prop_oneof![Just(64usize), Just(128), Just(256), size()],
        (any::<bool>(), any::<bool>()),
        (
            proptest::option::of(size()),
            proptest::option::of(size()),
            proptest::option::of(prop_oneof![
                Just(f32::NAN),
                Just(f32::INFINITY),
                Just(0.0f32),
                Just(-1.0f32),
                1e-6f32..10.0
            ]),
        ),
    );
    property(
        strategy,
        |((b, sq, sk, hq, hkv), d, (f16, causal), (wl, wr, scale))| {
            let mut p = AttentionProblem::new(
                b,
                sq,
                sk,
                hq,
                hkv,
                d,
                if f16 { Dtype::F16 } else { Dtype::Bf16 },
            )
            .window(wl, wr);
            p.causal = causal;
            p.scale = scale;
            match p.validate() {
                Err(e) => typed(&e),
                Ok(()) => {
                    // Everything a launch computes from the problem stays in range.
                    let _ = (p.flops(), p.lse_len(), p.q_shape(), p.kv_shape());
                    for hopper in [false, true] {
                        let (name, bytes, cfg) = attention::launch_shape(&p, hopper)
                            .map_err(|e| TestCaseError::fail(format!("launch shape: {e}")))?;
                        launch_ok(&name, bytes, &cfg, hopper)?;
                    }
                    // Small problems: the reference runs, and rows are finite or fully masked.
                    if b * sq * sk * hq * d <= 1 << 16 {
                        let mut r = kernels::data::rng(1);
                        let q = kernels::data::uniform_bf16(&mut r, b * sq * hq * d, -1.0, 1.0);
                        let k = kernels::data::uniform_bf16(&mut r, b * sk * hkv * d, -1.0, 1.0);
                        let v = kernels::data::uniform_bf16(&mut r, b * sk * hkv * d, -1.0, 1.0);
                        let out = attention::reference(&p, &q, &k, &v);
                        prop_assert!(out.o.iter().all(|x| x.is_finite()));
                        prop_assert!(
                            out.lse
                                .iter()
                                .all(|x| x.is_finite() || *x == f64::NEG_INFINITY)
                        );
                    }
                    Ok(())
                }
            }
        },
    )
}

fn props_attention_views() -> TestResult {
    // The bound check of every view: no stride or offset, however large, wraps around.
    let dim = || prop_oneof![1usize..=8, any::<usize>()];
    let strategy = (
        dim(),
        [dim(), dim(), dim(), dim()],
        [dim(), dim(), dim(), dim()],
    );
    property(strategy, |(offset, shape, strides)| {
        if let Some(last) = attention::last_element(offset, shape, strides) {
            let exact: u128 = offset as u128
                + (0..4)
                    .map(|i| (shape[i] as u128 - 1) * strides[i] as u128)
                    .sum::<u128>();
            prop_assert_eq!(last, exact);
        } else {
            prop_assert!(shape.contains(&0));
        }
        Ok(())
    })
}

fn props_semicrf() -> TestResult {
    let strategy = (
        (
            size(),
            size(),
            prop_oneof![1usize..=40, size()],
            prop_oneof![1usize..=40, size()],
        ),
        proptest::option::of(size()),
    );
    property(strategy, |((b, t, k, c), ckpt)| {
        let mut p = SemiCrfProblem::new(b, t, k, c);
        if let Some(s) = ckpt {
            p = p.with_checkpoint(s);
        }
        match p.validate() {
            Err(e) => typed(&e),
            Ok(()) => {
                let _ = (p.num_segments(), p.lanes(), p.memory(), p.scan_terms());
                for (name, bytes, cfg) in p.launches() {
                    launch_ok(name, bytes, &cfg, false)?;
                }
                if b * (t + 1) * k * c <= 4096 {
                    let inp = semicrf::random_inputs(&p, 7, true);
                    inp.view()
                        .validate(&p)
                        .map_err(|e| TestCaseError::fail(format!("random inputs rejected: {e}")))?;
                    let m = semicrf::reference::Model::new(&p, &inp.view());
                    let z = semicrf::reference::log_partition(&m);
                    let zf = semicrf::reference::log_partition_factored(&m);
                    for (a, b) in z.iter().zip(&zf) {
                        prop_assert!(a.is_finite() && (a - b).abs() <= 1e-9 * a.abs().max(1.0));
                    }
                }
                Ok(())
            }
        }
    })
}

/// An executor that runs nothing: it checks each launch as `Gpu::launch` would (without a
/// device) against the PTX of every target, and records the kernel names and whether each
/// launch overlaps its predecessor.
struct CheckingExec {
    launched: RefCell<Vec<(String, bool)>>,
}

impl CheckingExec {
    /// Checking against every target.
    fn all() -> Self {
        CheckingExec {
            launched: RefCell::new(Vec::new()),
        }
    }
}

impl Exec for CheckingExec {
    unsafe fn launch_by_name<P: Copy>(
        &self,
        name: &str,
        cfg: &LaunchConfig,
        _params: &P,
    ) -> kernels::Result<()> {
        for arch in Arch::ALL {
            check_launch(arch, name, cfg, std::mem::size_of::<P>(), HOPPER_MAX_SMEM)?;
        }
        self.launched
            .borrow_mut()
            .push((name.to_string(), cfg.overlap_previous));
        Ok(())
    }
}

/// A view of `len` elements at a made-up, 16-byte aligned address: only for [`CheckingExec`],
/// which never accesses memory.
fn fake<'a, T>(len: usize) -> DevView<'a, T> {
    // SAFETY: the view is only passed to `CheckingExec`, which never dereferences it.
    unsafe { DevView::from_raw(1 << 40, len) }
}

fn props_gla() -> TestResult {
    let strategy = (
        (size(), size(), prop_oneof![1usize..=4, size()]),
        (
            prop_oneof![Just(64usize), Just(128), size()],
            prop_oneof![Just(64usize), Just(128), size()],
        ),
        proptest::option::of(prop_oneof![
            Just(32usize),
            Just(64),
            Just(96),
            Just(usize::MAX),
            size()
        ]),
        proptest::option::of(proptest::collection::vec(0usize..=600, 0..6)),
        proptest::option::of(prop_oneof![
            Just(f32::NAN),
            Just(f32::INFINITY),
            -2.0f32..2.0
        ]),
    );
    property(strategy, |((b, t, h), (dk, dv), seg, cu, scale)| {
        let mut p = match cu {
            Some(lens) => {
                let mut cu = vec![0];
                for l in lens {
                    cu.push(cu.last().unwrap() + l);
                }
                GlaProblem::varlen(cu, h, dk, dv)
            }
            None => GlaProblem::new(b, t, h, dk, dv),
        };
        p.segment_len = seg;
        p.scale = scale;
        match p.validate() {
            Err(e) => typed(&e),
            Ok(()) => {
                let _ = (p.flops(), p.min_bytes(true, true), p.config());
                // Plans are built in memory: only for problems of modest size.
                if p.rows() > 1 << 16 {
                    return Ok(());
                }
                let plan = p
                    .plan(132)
                    .map_err(|e| TestCaseError::fail(format!("plan of a valid problem: {e}")))?;
                let ws = gla::workspace_len(&p, &plan);
                let (seg_words, comb_words) = gla::table_words(&plan);
                let tables = gla::RawGlaTables {
                    segments: fake(seg_words.len()),
                    split: ws.map(|(state, decay)| gla::RawSplitWorkspace {
                        combine: fake(comb_words.len()),
                        seg_init: fake(state),
                        delta: fake(state),
                        decay_log2: fake(decay),
                    }),
                };
                let t = gla::RawGlaTensors {
                    q: fake(p.qk_len()),
                    k: fake(p.qk_len()),
                    v: fake(p.v_len()),
                    g: fake(p.qk_len()),
                    init_state: Some(fake(p.state_len())),
                    o: fake(p.v_len()),
                    final_state: Some(fake(p.state_len())),
                };
                // (The baseline's launches; the pingpong's encode tensor maps, which needs the
                // driver: its launch sequence runs in the GPU tests.)
                let exec = CheckingExec::all();
                // SAFETY: `CheckingExec` never accesses the (made-up) views.
                unsafe { gla::forward_raw(&exec, &p, &plan, &tables, &t) }
                    .map_err(|e| TestCaseError::fail(format!("launch sequence: {e}")))?;
                // Split: the state pass, the combination, the forward, none overlapping its
                // predecessor (the baseline runs on sm_80 too).
                let overlaps: Vec<bool> = exec.launched.borrow().iter().map(|l| l.1).collect();
                prop_assert_eq!(overlaps, vec![false; if ws.is_some() { 3 } else { 1 }]);
                // Every token of every sequence is in exactly one segment.
                let covered: usize = plan.segments.iter().map(|s| s.len as usize).sum();
                prop_assert_eq!(covered, p.rows());
                Ok(())
            }
        }
    })
}

fn props_mhc() -> TestResult {
    let strategy = (
        (
            size(),
            size(),
            prop_oneof![1usize..=8, size()],
            prop_oneof![(1usize..=64).prop_map(|x| 8 * x), size()],
        ),
        (any::<bool>(), prop_oneof![0u32..=40, any::<u32>()]),
        prop_oneof![Just(f32::NAN), Just(-1.0f32), 0.0f32..1e-3],
    );
    property(strategy, |((b, s, n, c), (gamma, iters), eps)| {
        let p = MhcProblem::new(b, s, n, c)
            .with_gamma(gamma)
            .with_iters(iters)
            .with_eps(eps);
        match p.validate() {
            Err(e) => typed(&e),
            Ok(()) => {
                let _ = (p.forward_bytes(), p.backward_bytes(), p.projection_flops());
                let plan = p.plan();
                let (t, k, m) = (p.tokens(), p.k(), p.m());
                let w = mhc::RawWeights {
                    phi: fake(k * m),
                    gamma: gamma.then(|| fake(k)),
                    alpha: fake(3),
                    bias: fake(m),
                };
                let sc = mhc::RawScratch {
                    packed_f1: fake(plan.packed_f1),
                    packed_b2: fake(plan.packed_b2),
                    part_proj: fake(plan.part_proj),
                    part_sumsq: fake(plan.part_sumsq),
                    dh: fake(plan.dh),
                    u: fake(plan.u),
                    xcoef: fake(t),
                    part_coef: fake(plan.part_coef),
                    part_w: fake(plan.part_w),
                };
                let co = mhc::RawCoefficients {
                    h_pre: fake(t * n),
                    h_post: fake(t * n),
                    h_res: fake(t * n * n),
                    hproj: fake(t * m),
                    rms: fake(t),
                };
                let gr = mhc::RawGradients {
                    dx: fake(t * k),
                    dy: fake(t * c),
                    dphi: fake(k * m),
                    dgamma: gamma.then(|| fake(k)),
                    dalpha: fake(3),
                    dbias: fake(m),
                };
                let exec = CheckingExec::all();
                let fail = |what: &str, e: Error| TestCaseError::fail(format!("{what}: {e}"));
                // SAFETY: `CheckingExec` never accesses the (made-up) views.
                unsafe {
                    mhc::forward_pre_raw(&exec, &p, &w, fake(t * k), &sc, &co, fake(t * c))
                        .map_err(|e| fail("forward_pre", e))?;
                    mhc::forward_post_raw(&exec, &p, fake(t * k), fake(t * c), &co, fake(t * k))
                        .map_err(|e| fail("forward_post", e))?;
                    mhc::backward_raw(
                        &exec,
                        &p,
                        &w,
                        fake(t * k),
                        fake(t * c),
                        &co,
                        fake(t * c),
                        fake(t * k),
                        &sc,
                        &gr,
                    )
                    .map_err(|e| fail("backward", e))?;
                }
                prop_assert!(!exec.launched.borrow().is_empty());
                Ok(())
            }
        }
    })
}

/// `((batch, seq_q, seq_k, heads_kv), head_dim, (causal, hopper, window_left))`.
type AttentionCase = (
    (usize, usize, usize, usize),
    usize,
    (bool, bool, Option<usize>),
);

fn props_gpu_attention(g: &'static Gpu) -> TestResult {
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

/// Contiguous attention on `stream`: O and LSE downloaded.
fn run_attention(
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
    g.sync(stream, "attention")?;
    Ok((download(&o_buf)?, download(&lse)?))
}

fn props_gpu_semicrf(g: &'static Gpu) -> TestResult {
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
            let inp = semicrf::random_inputs(&p, (b + 3 * t + 5 * k + 7 * c) as u64, true);
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
enum GlaShape {
    Batch(usize, usize),
    Packed(Vec<usize>),
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
/// uniform in `[lo, 0)` for lo in {-0.05, -1, -3}. Relative L2 error of o and of the final
/// states at most [`GLA_TOL`]; outputs start poisoned (an unwritten or non-finite element fails).
fn props_gpu_gla(g: &'static Gpu) -> TestResult {
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
    let run = |case: GlaCase| -> Result<(), TestCaseError> {
        let seed = seed_of(&case);
        let (shape, heads, (dk, dv), seg, (init, fin), lo) = case;
        let mut p = match shape {
            GlaShape::Batch(b, t) => GlaProblem::new(b, t, heads, dk, dv),
            GlaShape::Packed(lens) => {
                let mut cu = vec![0];
                for l in lens {
                    cu.push(cu.last().unwrap() + l);
                }
                GlaProblem::varlen(cu, heads, dk, dv)
            }
        };
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
        let mut o = prop_gpu(poisoned::<bf16>(p.v_len()))?;
        let mut fs = if fin {
            Some(prop_gpu(poisoned::<f32>(p.state_len()))?)
        } else {
            None
        };
        let mut plan = prop_gpu(gla::GlaPlan::new(g, &p))?;
        prop_gpu(plan.forward(
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
            "{} segments: o rel L2 {err_o:.3e}, final state {err_s:.3e} (tol {GLA_TOL:.0e})",
            plan.segments().segments.len()
        );
        Ok(())
    };
    gpu_runner(CASES)
        .run(&strategy, run)
        .map_err(|e| format!("{e}"))?;
    let (o, st) = worst.get();
    println!(
        "{CASES} cases on {}: worst rel L2 o {o:.3e}, final state {st:.3e} (tol {GLA_TOL:.0e})",
        g.arch()
    );
    Ok(())
}

/// `((B, S, n, C), gamma, Sinkhorn iterations)`.
type MhcCase = ((usize, usize, usize, usize), bool, u32);

/// mHC forward and backward on random problems against the f64 reference, every output (the
/// weight gradients included) within the tolerances stated in `kernels::mhc::reference`
/// (`tol_bf16`, `tol_f32`, `tol_proj`): B 1..=3, S 1..=80 (token counts that fill no tile),
/// n 2..=8 (every supported value), C a multiple of 8 up to 512, with and without gamma, 1, 3
/// or 20 Sinkhorn iterations. Outputs start poisoned.
fn props_gpu_mhc(g: &'static Gpu) -> TestResult {
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
        let mut dev = prop_gpu(mhc::MhcDeviceRun::upload(&data))?;
        prop_gpu(dev.forward(g, &stream))?;
        prop_gpu(dev.backward(g, &stream))?;
        prop_gpu(g.sync(&stream, "mHC forward and backward"))?;
        let out = prop_gpu(dev.download())?;
        let cmp = mhc::reference::compare(&data, &out, None);
        for name in mhc::reference::OUTPUTS {
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

// ---------------------------------------------------------------------------------------------
// Limits

fn limits_attention() -> TestResult {
    // 2^14 x 2^11 x 32 x 128 = 2^37 elements of Q: accepted (the kernels form offsets in 64 bits
    // from 64-bit strides), LSE has 2^30 entries (< 2^32).
    let big = AttentionProblem::new(16, 1 << 14, 1 << 14, 32 * 128, 32, 256, Dtype::Bf16);
    let q_elems: u128 = big.q_shape().iter().map(|&x| x as u128).product();
    ensure(q_elems > 1 << 31, || "not above 2^31".into())?;
    big.validate().map_err(|e| format!("{e}"))?;
    for hopper in [false, true] {
        let (name, bytes, cfg) =
            attention::launch_shape(&big, hopper).map_err(|e| format!("{e}"))?;
        check_launch(Arch::Sm90a, &name, &cfg, bytes, HOPPER_MAX_SMEM)
            .map_err(|e| format!("{e}"))?;
    }
    // The longest sequences: seq < 2^30 each; LSE entries batch * heads * seq_q < 2^32.
    let long =
        AttentionProblem::new(1, (1 << 30) - 1, (1 << 30) - 1, 2, 1, 256, Dtype::Bf16).causal();
    long.validate().map_err(|e| format!("{e}"))?;
    let (name, bytes, cfg) = attention::launch_shape(&long, false).map_err(|e| format!("{e}"))?;
    check_launch(Arch::Sm80, &name, &cfg, bytes, HOPPER_MAX_SMEM).map_err(|e| format!("{e}"))?;
    for (p, what) in [
        (
            AttentionProblem::new(1, 1 << 30, 1, 1, 1, 64, Dtype::Bf16),
            "seq_q = 2^30",
        ),
        (
            AttentionProblem::new(64, 1 << 22, 1, 1024, 1, 64, Dtype::Bf16),
            "LSE of 2^38 entries",
        ),
        (
            AttentionProblem::new(1, 1, 1, 1, 1, 512, Dtype::Bf16),
            "head_dim 512",
        ),
        (
            AttentionProblem::new(70_000, 1, 1, 1, 1, 64, Dtype::Bf16),
            "batch above the grid",
        ),
    ] {
        let e = p
            .validate()
            .err()
            .ok_or_else(|| format!("{what}: accepted"))?;
        ensure(
            matches!(e, Error::Unsupported { .. } | Error::InvalidArgument { .. }),
            || format!("{what}: {e}"),
        )?;
        println!("{what}: {e}");
    }
    Ok(())
}

fn limits_semicrf() -> TestResult {
    // B (T + 1) C K above 2^31: accepted (64-bit offsets in every kernel).
    let p = SemiCrfProblem::new(64, 100_000, 32, 24);
    ensure((p.batch * (p.t + 1) * p.c * p.k) as u64 > 1 << 31, || {
        "not above 2^31".into()
    })?;
    p.validate().map_err(|e| format!("{e}"))?;
    for (name, bytes, cfg) in p.launches() {
        check_launch(Arch::Sm90a, name, &cfg, bytes, HOPPER_MAX_SMEM)
            .map_err(|e| format!("{e}"))?;
    }
    let m = p.memory();
    ensure(m.marginals as u64 > 1 << 31, || {
        "marginals not above 2^31 bytes".into()
    })?;
    for (p, what) in [
        (
            SemiCrfProblem::new(1, (u32::MAX / 2) as usize, 4, 4),
            "T = 2^31",
        ),
        (
            SemiCrfProblem::new(65_536, 10, 4, 4),
            "batch above the grid",
        ),
        (
            SemiCrfProblem::new(1, 10, 70_000, 1),
            "K above 16-bit backpointers",
        ),
        (
            SemiCrfProblem::new(1, 10, 4000, 64),
            "K C over the shared-memory budget",
        ),
    ] {
        let e = p
            .validate()
            .err()
            .ok_or_else(|| format!("{what}: accepted"))?;
        ensure(
            matches!(e, Error::Unsupported { .. } | Error::InvalidArgument { .. }),
            || format!("{what}: {e}"),
        )?;
        println!("{what}: {e}");
    }
    Ok(())
}

fn limits_gla() -> TestResult {
    // rows * heads just below 2^31 at dk = dv = 128: 2^37 elements of q, accepted (64-bit
    // offsets); the tables are not built (they would be large, not invalid).
    let p = GlaProblem::new(1, (1 << 31) / 64 - 1, 64, 128, 128);
    ensure(p.qk_len() as u64 > 1 << 31, || "not above 2^31".into())?;
    p.validate().map_err(|e| format!("{e}"))?;
    for (p, what) in [
        (
            GlaProblem::new(1, 1 << 25, 64, 64, 64),
            "rows * heads = 2^31",
        ),
        // A product that wraps usize must not pass the limit.
        (
            GlaProblem::new(1 << 32, 1 << 32, 1, 64, 64),
            "batch * seq_len = 2^64",
        ),
        (
            GlaProblem::new(1, 64, 70_000, 64, 64),
            "heads above the grid",
        ),
        (GlaProblem::new(1, 64, 1, 256, 64), "dk = 256"),
    ] {
        let e = p
            .validate()
            .err()
            .ok_or_else(|| format!("{what}: accepted"))?;
        ensure(matches!(e, Error::Unsupported { .. }), || {
            format!("{what}: {e}")
        })?;
        println!("{what}: {e}");
    }
    // An overlapped launch (programmatic dependent launch) needs sm_90a code: the same launch
    // of a baseline kernel passes on sm_80 without it and is refused with it.
    let bytes = std::mem::size_of::<kernel_abi::gla::GlaParams>();
    let cfg = LaunchConfig::new((1, 1, 1), 128, 0);
    check_launch(
        Arch::Sm80,
        "gla_fwd_dk64_dv64",
        &cfg,
        bytes,
        HOPPER_MAX_SMEM,
    )
    .map_err(|e| format!("{e}"))?;
    let e = check_launch(
        Arch::Sm80,
        "gla_fwd_dk64_dv64",
        &cfg.overlapping_previous(),
        bytes,
        HOPPER_MAX_SMEM,
    )
    .err()
    .ok_or("an overlapped sm_80 launch: accepted")?;
    ensure(matches!(e, Error::InvalidLaunch { .. }), || format!("{e}"))?;
    println!("overlapped sm_80 launch: {e}");
    Ok(())
}

fn limits_mhc() -> TestResult {
    // T n C = 2^40 (the limit) with T = 2^20 tokens: 2^40 elements of x, accepted.
    let p = MhcProblem::new(1 << 10, 1 << 10, 4, 1 << 18);
    p.validate().map_err(|e| format!("{e}"))?;
    let plan = p.plan();
    ensure(plan.part_w > 0 && plan.dh == p.tokens() * p.m(), || {
        format!("{plan:?}")
    })?;
    for (p, what) in [
        (
            MhcProblem::new(1 << 11, 1 << 10, 4, 1 << 18),
            "T n C = 2^41",
        ),
        // A token count that wraps usize must not pass the limit.
        (
            MhcProblem::new(1 << 33, 1 << 31, 4, 64),
            "batch * seq = 2^64",
        ),
        (MhcProblem::new(1, 1 << 31, 4, 64), "T = 2^31"),
    ] {
        let e = p
            .validate()
            .err()
            .ok_or_else(|| format!("{what}: accepted"))?;
        ensure(matches!(e, Error::Unsupported { .. }), || {
            format!("{what}: {e}")
        })?;
        println!("{what}: {e}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// NaN and Inf

fn nonfinite_semicrf() -> TestResult {
    let p = SemiCrfProblem::new(2, 8, 3, 2);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for which in 0..3 {
            let mut inp = semicrf::random_inputs(&p, 3, false);
            match which {
                0 => inp.cumsum[5] = bad,
                1 => inp.dur[1] = bad,
                _ => inp.trans[2] = bad,
            }
            let e = inp
                .view()
                .validate(&p)
                .err()
                .ok_or("a non-finite score was accepted")?;
            ensure(matches!(e, Error::InvalidArgument { .. }), || {
                format!("{e}")
            })?;
        }
    }
    Ok(())
}

/// Non-finite scores on the GPU entry points: each rejects them with `InvalidArgument` before
/// anything is uploaded (so no kernel ever reads one), a score past a sequence's length (never
/// read) included; the same stream then computes valid inputs correctly (log Z within
/// `1e-4 max(1, |log Z|)` of the f64 reference).
fn nonfinite_semicrf_gpu(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let p = SemiCrfProblem::new(3, 40, 6, 4);
    let clean = semicrf::random_inputs(&p, 13, true);
    let short = (0..p.batch)
        .find(|&b| (clean.lengths[b] as usize) < p.t)
        .unwrap_or(0);
    println!(
        "cumulative scores poisoned at position T of sequence {short} (length {}, T = {})",
        clean.lengths[short], p.t
    );
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for which in ["cumsum", "dur", "trans"] {
            let mut inp = semicrf::random_inputs(&p, 13, true);
            match which {
                "cumsum" => inp.cumsum[(short * (p.t + 1) + p.t) * p.c + 1] = bad,
                "dur" => inp.dur[p.c + 2] = bad,
                _ => inp.trans[3] = bad,
            }
            let v = inp.view();
            let results = [
                (
                    "DeviceInputs::upload",
                    semicrf::DeviceInputs::upload(&p, &v).map(|_| ()),
                ),
                (
                    "log_partition",
                    semicrf::log_partition(g, &stream, &p, &v).map(|_| ()),
                ),
                (
                    "posterior",
                    semicrf::posterior(g, &stream, &p, &v, true).map(|_| ()),
                ),
                ("viterbi", semicrf::viterbi(g, &stream, &p, &v).map(|_| ())),
            ];
            for (what, r) in results {
                match r {
                    Err(Error::InvalidArgument { .. }) => {}
                    Err(e) => {
                        return Err(
                            format!("{bad} in {which}: {what}: unexpected error {e}").into()
                        );
                    }
                    Ok(()) => return Err(format!("{bad} in {which}: {what} accepted it").into()),
                }
            }
        }
        let mut inp = semicrf::random_inputs(&p, 13, true);
        inp.trans[0] = bad;
        let e = semicrf::posterior(g, &stream, &p, &inp.view(), false)
            .err()
            .ok_or("accepted")?;
        println!("{bad}: every entry point rejects it, e.g. {e}");
    }
    let got = gpu_ok(semicrf::posterior(g, &stream, &p, &clean.view(), false))?;
    let want = semicrf::reference::posterior(&semicrf::reference::Model::new(&p, &clean.view()));
    let tol: Vec<f64> = want.log_z.iter().map(|w| 1e-4 * w.abs().max(1.0)).collect();
    check_close(
        "log Z after the rejected calls",
        &got.log_z,
        &want.log_z,
        |i| tol[i],
    )
}

/// Attention with one non-finite element in key `j0` of batch 0, head 0: the output rows that
/// may attend `j0` are non-finite (NaN), every other row is finite; the reference defines it.
fn poisoned_key_case(bad: f32) -> (AttentionProblem, Vec<bf16>, Vec<bf16>, Vec<bf16>, usize) {
    let p = AttentionProblem::new(2, 70, 90, 2, 1, 64, Dtype::Bf16).causal();
    let mut r = kernels::data::rng(11);
    let q = kernels::data::uniform_bf16(&mut r, 2 * 70 * 2 * 64, -1.0, 1.0);
    let mut k = kernels::data::uniform_bf16(&mut r, 2 * 90 * 64, -1.0, 1.0);
    let v = kernels::data::uniform_bf16(&mut r, 2 * 90 * 64, -1.0, 1.0);
    let j0 = 50;
    k[j0 * 64 + 3] = bf16::from_f32(bad);
    (p, q, k, v, j0)
}

fn nonfinite_attention_reference() -> TestResult {
    let (p, q, k, v, j0) = poisoned_key_case(f32::NAN);
    let want = attention::reference(&p, &q, &k, &v);
    for b in 0..2 {
        for i in 0..p.seq_q {
            for h in 0..2 {
                let row = &want.o[((b * p.seq_q + i) * 2 + h) * 64..][..64];
                let bad = b == 0 && p.allowed(i, j0);
                ensure(row.iter().all(|x| x.is_nan() == bad), || {
                    format!("row b{b} i{i} h{h}: NaN expected {bad}")
                })?;
            }
        }
    }
    Ok(())
}

fn nonfinite_attention_gpu(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    for bad in [f32::NAN, f32::INFINITY] {
        for path in [Path::MmaSync, Path::Hopper] {
            if path == Path::Hopper && !g.arch().has_hopper_kernels() {
                continue;
            }
            let (p, q, k, v, _) = poisoned_key_case(bad);
            let p = p.path(path);
            let want = attention::reference(&p, &q, &k, &v);
            let (o, lse) = gpu_ok(run_attention(g, &stream, &p, &q, &k, &v))?;
            let mut finite = 0;
            for (i, (x, w)) in o.iter().zip(&want.o).enumerate() {
                let x = x.to_f32() as f64;
                if w.is_finite() {
                    ensure((x - w).abs() <= 1e-2 * w.abs() + 1e-2, || {
                        format!("{bad} {path:?}: O[{i}] = {x}, reference {w}")
                    })?;
                    finite += 1;
                } else {
                    ensure(!x.is_finite(), || {
                        format!("{bad} {path:?}: O[{i}] = {x}, reference {w} (non-finite)")
                    })?;
                }
            }
            for (i, (x, w)) in lse.iter().zip(&want.lse).enumerate() {
                ensure(x.is_finite() == w.is_finite(), || {
                    format!("{bad} {path:?}: LSE[{i}] = {x}, reference {w}")
                })?;
            }
            println!(
                "{bad} in K, {path:?}: {finite} finite outputs match, the others are non-finite as in the reference"
            );
        }
    }
    Ok(())
}

/// Offsets past 2^31 elements: batch 1 of Q, K, V and O starts `2^31 + 1024` elements into its
/// buffer (a strided view; batch 0 at 0, nothing read in between), so every address of batch 1
/// needs 64-bit offsets. Both paths against the f64 reference; 17 GB of device memory. Under
/// racecheck (`KERNELS_SANITIZER=racecheck`) batch 1 starts right after batch 0 instead
/// ([`racecheck_size`]): the same kernels on the same tiles, without 17 GB to shadow.
fn large_offsets_attention_gpu(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let base = AttentionProblem::new(2, 300, 300, 2, 1, 128, Dtype::Bf16).causal();
    let bs = racecheck_size(
        "batch stride (elements)",
        (1usize << 31) + 1024,
        300 * 256 + 1024,
    );
    let mut r = kernels::data::rng(77);
    let q = kernels::data::uniform_bf16(&mut r, 2 * 300 * 2 * 128, -1.0, 1.0);
    let k = kernels::data::uniform_bf16(&mut r, 2 * 300 * 128, -1.0, 1.0);
    let v = kernels::data::uniform_bf16(&mut r, 2 * 300 * 128, -1.0, 1.0);
    let want = attention::reference(&base, &q, &k, &v);
    // A buffer holding batch b of `host` (contiguous batches of `per` elements) at `b * bs`.
    let spread = |host: &[bf16]| -> kernels::Result<kernels::DeviceBuffer<bf16>> {
        let per = host.len() / 2;
        let mut buf = poisoned::<bf16>(bs + per)?;
        kernels::memory::upload_at(&mut buf, 0, &host[..per])?;
        kernels::memory::upload_at(&mut buf, bs, &host[per..])?;
        Ok(buf)
    };
    let (dq, dk, dv) = (
        gpu_ok(spread(&q))?,
        gpu_ok(spread(&k))?,
        gpu_ok(spread(&v))?,
    );
    let (qs, kvs) = ([bs, 256, 128, 1], [bs, 128, 128, 1]);
    for path in [Path::MmaSync, Path::Hopper] {
        if path == Path::Hopper && !g.arch().has_hopper_kernels() {
            continue;
        }
        let p = base.clone().path(path);
        let o_buf = gpu_ok(poisoned::<bf16>(bs + 300 * 256))?;
        let mut lse = gpu_ok(poisoned::<f32>(p.lse_len()))?;
        {
            let view = |b, shape: [usize; 4], st: [usize; 4]| View::new(b, 0, &shape, &st);
            let mut o = gpu_ok(view(&o_buf, p.q_shape(), qs))?;
            gpu_ok(attention::forward(
                g,
                &stream,
                &p,
                &gpu_ok(view(&dq, p.q_shape(), qs))?,
                &gpu_ok(view(&dk, p.kv_shape(), kvs))?,
                &gpu_ok(view(&dv, p.kv_shape(), kvs))?,
                &mut o,
                &mut lse,
            ))?;
        }
        gpu_ok(g.sync(&stream, "attention (large offsets)"))?;
        let per = 300 * 256;
        let mut o = gpu_ok(kernels::memory::download_range(&o_buf, 0, per))?;
        o.extend(gpu_ok(kernels::memory::download_range(&o_buf, bs, per))?);
        let lse = gpu_ok(download(&lse))?;
        let err_o = o
            .iter()
            .zip(&want.o)
            .map(|(x, w)| (x.to_f32() as f64 - w).abs())
            .fold(0.0, f64::max);
        let err_lse = lse
            .iter()
            .zip(&want.lse)
            .map(|(x, w)| (*x as f64 - w).abs())
            .fold(0.0, f64::max);
        println!(
            "{path:?}, batch 1 at element {bs}: max |O - ref| = {err_o:.3e}, max |LSE - ref| = {err_lse:.3e}"
        );
        ensure(err_o <= 1e-2 && err_lse <= 1e-3, || {
            format!("{path:?}: O error {err_o:.3e} (tol 1e-2), LSE error {err_lse:.3e} (tol 1e-3)")
        })?;
    }
    Ok(())
}

/// Offsets past 2^31 elements in GLA: packed sequences `[0, N0)` (poisoned content, not
/// checked) and `[N0, N0 + 300)` with `64 N0 > 2^31`, one head, Dk = Dv = 64: the second
/// sequence against the f64 recurrence. 22 GB of device memory. Under racecheck the first
/// sequence has 1000 tokens instead ([`racecheck_size`]): the kernels walk 33.5 million tokens
/// of it otherwise, each chunk with the same shared-memory protocol.
fn large_offsets_gla_gpu(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let (len, d) = (300usize, 64usize);
    let n0 = racecheck_size(
        "tokens before the checked sequence",
        (1usize << 31) / 64 + 1000,
        1000,
    );
    let p = GlaProblem::varlen(vec![0, n0, n0 + len], 1, d, d);
    let small = GlaProblem::varlen(vec![0, len], 1, d, d);
    let mut r = kernels::data::rng(78);
    let q = kernels::data::uniform_bf16(&mut r, len * d, -1.0, 1.0);
    let k = kernels::data::uniform_bf16(&mut r, len * d, -1.0, 1.0);
    let v = kernels::data::uniform_bf16(&mut r, len * d, -1.0, 1.0);
    let gd = kernels::data::uniform_bf16(&mut r, len * d, -1.0, 0.0);
    let want = gpu_ok(gla::reference::recurrence(
        &small,
        &gla::reference::HostInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &gd,
            init_state: None,
        },
    ))?;
    let place = |host: &[bf16]| -> kernels::Result<kernels::DeviceBuffer<bf16>> {
        let mut buf = poisoned::<bf16>((n0 + len) * d)?;
        kernels::memory::upload_at(&mut buf, n0 * d, host)?;
        Ok(buf)
    };
    let (dq, dk, dv, dg) = (
        gpu_ok(place(&q))?,
        gpu_ok(place(&k))?,
        gpu_ok(place(&v))?,
        gpu_ok(place(&gd))?,
    );
    let mut o = gpu_ok(poisoned::<bf16>((n0 + len) * d))?;
    let mut fin = gpu_ok(poisoned::<f32>(p.state_len()))?;
    let mut plan = gpu_ok(gla::GlaPlan::new(g, &p))?;
    gpu_ok(plan.forward(
        g,
        &stream,
        &gla::GlaInputs {
            q: &dq,
            k: &dk,
            v: &dv,
            g: &dg,
            init_state: None,
        },
        &mut gla::GlaOutputs {
            o: &mut o,
            final_state: Some(&mut fin),
        },
    ))?;
    gpu_ok(g.sync(&stream, "gla (large offsets)"))?;
    let got = gpu_ok(kernels::memory::download_range(&o, n0 * d, len * d))?;
    let state = gpu_ok(kernels::memory::download_range(&fin, d * d, d * d))?;
    let err_o = gla::reference::rel_l2(got.iter().map(|x| x.to_f32() as f64), &want.o);
    let err_s = gla::reference::rel_l2(state.iter().map(|x| *x as f64), &want.final_state);
    println!(
        "sequence 2 at element {}: rel L2 o {err_o:.3e}, final state {err_s:.3e} (tol 1e-2)",
        n0 * d
    );
    ensure(err_o <= 1e-2 && err_s <= 1e-2, || {
        format!("o rel L2 {err_o:.3e}, final state {err_s:.3e} (tol 1e-2)")
    })
}

fn nonfinite_gla_reference() -> TestResult {
    // A NaN in v at token t0 of sequence 0 reaches o of that sequence from t0 on (through the
    // state), and nothing else.
    let p = GlaProblem::varlen(vec![0, 40, 70], 2, 64, 64);
    let mut r = kernels::data::rng(5);
    let q = kernels::data::uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let k = kernels::data::uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let mut v = kernels::data::uniform_bf16(&mut r, p.v_len(), -1.0, 1.0);
    let g = kernels::data::uniform_bf16(&mut r, p.qk_len(), -1.0, -0.01);
    let t0 = 17;
    v[(t0 * 2) * 64] = bf16::from_f32(f32::NAN);
    let inp = gla::reference::HostInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        init_state: None,
    };
    let out = gla::reference::recurrence(&p, &inp).map_err(|e| format!("{e}"))?;
    for t in 0..70 {
        for h in 0..2 {
            let row = &out.o[(t * 2 + h) * 64..][..64];
            let nan = row.iter().any(|x| x.is_nan());
            let expect = t >= t0 && t < 40 && h == 0;
            ensure(nan == expect, || {
                format!("token {t} head {h}: NaN {nan}, expected {expect}")
            })?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Negative controls

fn negative_emulated() -> TestResult {
    // The emulator finds the missing barrier whatever the order its threads run in, and the
    // correct kernel (same body, with the barrier) passes on the same input.
    let blocks = 3u32;
    let threads = kernel_abi::smoke::REDUCE_THREADS;
    let data: Vec<f32> = (0..blocks * threads * 2)
        .map(|i| (i % 17) as f32 - 8.0)
        .collect();
    let run = |name: &str| -> Result<Vec<f32>, String> {
        let mut input = HostBuf::from_slice(&data);
        let mut partial = HostBuf::filled(blocks as usize, f32::NAN);
        let params = kernel_abi::smoke::ReduceParams {
            input: input.view().addr() as *const f32,
            partial: partial.view().addr() as *mut f32,
            n: data.len() as u32,
        };
        let cfg = LaunchConfig::new(
            (blocks, 1, 1),
            threads,
            kernel_abi::smoke::reduce_smem_bytes(),
        );
        // SAFETY: input holds n f32 and partial one per block, as the kernel requires.
        unsafe { Emulator.launch_by_name(name, &cfg, &params) }.map_err(|e| e.to_string())?;
        Ok(partial.to_vec())
    };
    let good = run("smoke_block_reduce").map_err(|e| format!("the correct kernel failed: {e}"))?;
    let want = kernels_testing::smoke::block_reduce_reference(&data, blocks);
    for (b, (x, w)) in good.iter().zip(&want).enumerate() {
        ensure((*x as f64 - w.0).abs() <= 1e-4 * w.1.max(1.0), || {
            format!("block {b}: {x} vs {}", w.0)
        })?;
    }
    let err = run("negative_block_reduce_no_barrier")
        .err()
        .ok_or("the emulator did not report the missing barrier")?;
    ensure(err.contains("hazard"), || {
        format!("unexpected failure: {err}")
    })?;
    println!("emulator: {err}");
    Ok(())
}

/// `|x - w| <= tol` (false for NaN).
fn within(x: f64, w: f64, tol: f64) -> bool {
    (x - w).abs() <= tol
}

/// Per-block sums of fresh inputs by `launch`; the number of blocks whose sum is wrong.
fn wrong_blocks(
    g: &Gpu,
    stream: &kernels::Stream,
    seed: u64,
    launch: impl Fn(&kernels::DeviceBuffer<f32>, &mut kernels::DeviceBuffer<f32>) -> kernels::Result<()>,
) -> kernels::Result<usize> {
    const BLOCKS: usize = 1024;
    let n = BLOCKS * kernel_abi::smoke::REDUCE_THREADS as usize * 4;
    let mut r = kernels::data::rng(seed);
    let data = kernels::data::uniform_f32(&mut r, n, 1.0, 2.0);
    let input = upload(&data)?;
    let mut partial = poisoned::<f32>(BLOCKS)?;
    launch(&input, &mut partial)?;
    g.sync(stream, "block reduce")?;
    let got = download(&partial)?;
    let want = kernels_testing::smoke::block_reduce_reference(&data, BLOCKS as u32);
    Ok(got
        .iter()
        .zip(&want)
        .filter(|(x, w)| !within(**x as f64, w.0, 1e-4 * w.1))
        .count())
}

fn negative_reduce_wrong(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    // The correct kernel on the same inputs: no wrong block (the check is sound).
    let good = gpu_ok(wrong_blocks(g, &stream, 1, |i, p| {
        kernels_testing::smoke::block_reduce_launch(g, &stream, i, p)
    }))?;
    ensure(good == 0, || {
        format!("smoke_block_reduce: {good} wrong blocks")
    })?;
    // The race shows as wrong sums in some launch (warp 0 reads a slot before its warp wrote
    // it: a stale sum of the previous launch's input, or garbage).
    const TRIALS: u64 = 300;
    for trial in 0..TRIALS {
        let wrong = gpu_ok(wrong_blocks(g, &stream, 100 + trial, |i, p| {
            kernels_testing::negative::block_reduce_no_barrier_launch(g, &stream, i, p)
        }))?;
        if wrong > 0 {
            println!(
                "missing barrier caught by the reference check in trial {trial}: {wrong} of 1024 blocks wrong"
            );
            return Ok(());
        }
    }
    Err(format!(
        "the reference check never caught the missing barrier in {TRIALS} launches (racecheck \
         must still report it: bundle/reliability.sh)"
    )
    .into())
}

fn negative_reduce_target(g: &'static Gpu) -> TestResult {
    // One small launch for racecheck (bundle/reliability.sh expects hazards here); the test
    // itself checks that every block wrote its sum.
    let stream = gpu_ok(g.stream())?;
    let data = vec![1.0f32; 4 * kernel_abi::smoke::REDUCE_THREADS as usize];
    let input = gpu_ok(upload(&data))?;
    let mut partial = gpu_ok(poisoned::<f32>(4))?;
    gpu_ok(kernels_testing::negative::block_reduce_no_barrier_launch(
        g,
        &stream,
        &input,
        &mut partial,
    ))?;
    gpu_ok(g.sync(&stream, "negative block reduce"))?;
    let got = gpu_ok(download(&partial))?;
    ensure(
        got.iter().all(|x| !x.is_nan() || x.to_bits() != u32::MAX),
        || format!("unwritten partial sums: {got:?}"),
    )
}

fn negative_semicrf(g: &'static Gpu) -> TestResult {
    // Eight segments per sequence: the aliased kernel loses the counts of the odd ones.
    let p = SemiCrfProblem::new(2, 60, 4, 3).with_checkpoint(8);
    let inp = semicrf::random_inputs(&p, 21, false);
    let want = semicrf::reference::posterior(&semicrf::reference::Model::new(&p, &inp.view()));
    let stream = gpu_ok(g.stream())?;
    let dev = gpu_ok(semicrf::DeviceInputs::upload(&p, &inp.view()))?;
    let run = |aliased: bool| -> kernels::Result<(Vec<f32>, Vec<f32>)> {
        let mut st = semicrf::ForwardState::new(&p)?;
        let mut gr = semicrf::Gradients::new(&p, false)?;
        if aliased {
            kernels::negative::semicrf_forward_backward_aliased_launch(
                g, &stream, &p, &dev, &mut st, &mut gr,
            )?;
        } else {
            semicrf::forward_backward_launch(g, &stream, &p, &dev, &mut st, &mut gr)?;
        }
        g.sync(&stream, "semicrf")?;
        Ok((download(&gr.grad_dur)?, download(&gr.grad_trans)?))
    };
    let tol = |w: &[f64]| w.iter().map(|x| 1e-4 * x.abs() + 1e-6).collect::<Vec<_>>();
    let (td, tt) = (tol(&want.grad_dur), tol(&want.grad_trans));
    // The correct kernel passes the check the aliased one must fail.
    let (d, t) = gpu_ok(run(false))?;
    check_close("semicrf_marginals ddur", &d, &want.grad_dur, |i| td[i])?;
    check_close("semicrf_marginals dtrans", &t, &want.grad_trans, |i| tt[i])?;
    let (d, t) = gpu_ok(run(true))?;
    let caught = check_close("aliased ddur", &d, &want.grad_dur, |i| td[i]).is_err()
        || check_close("aliased dtrans", &t, &want.grad_trans, |i| tt[i]).is_err();
    ensure(caught, || {
        "the reference check did not catch the aliased workspaces".into()
    })
}

// ---------------------------------------------------------------------------------------------
// Concurrency

/// Every family's outputs as bits.
type Bits = Vec<Vec<u32>>;

fn bits_f32(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn bits_bf16(x: &[bf16]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits() as u32).collect()
}

fn concurrent(g: &'static Gpu) -> TestResult {
    // Uploads need the context current on this (test) thread.
    gpu_ok(g.bind())?;
    // Inputs and device buffers of each family, prepared once; `launch` enqueues a family's
    // work on a stream (no synchronization); `collect` downloads its outputs.
    let att = AttentionProblem::new(2, 300, 300, 4, 2, 128, Dtype::Bf16).causal();
    let mut r = kernels::data::rng(31);
    let aq = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        2 * 300 * 4 * 128,
        -1.0,
        1.0,
    )))?;
    let ak = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        2 * 300 * 2 * 128,
        -1.0,
        1.0,
    )))?;
    let av = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        2 * 300 * 2 * 128,
        -1.0,
        1.0,
    )))?;
    let crf = SemiCrfProblem::new(4, 500, 8, 6);
    let crf_in = semicrf::random_inputs(&crf, 32, true);
    let crf_dev = gpu_ok(semicrf::DeviceInputs::upload(&crf, &crf_in.view()))?;
    let gp = GlaProblem::new(2, 1000, 4, 64, 64).with_segment_len(256);
    let gq = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        gp.qk_len(),
        -1.0,
        1.0,
    )))?;
    let gk = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        gp.qk_len(),
        -1.0,
        1.0,
    )))?;
    let gv = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        gp.v_len(),
        -1.0,
        1.0,
    )))?;
    let gg = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        gp.qk_len(),
        -1.0,
        -0.01,
    )))?;
    let mp = MhcProblem::new(2, 256, 4, 256);
    let mdata = mhc::reference::MhcData::random(&mp, 33);

    let run_all = |streams: &[kernels::Stream]| -> kernels::Result<(Bits, mhc::MhcHostOutputs)> {
        let st = |i: usize| &streams[i % streams.len()];
        // Attention.
        let ao = poisoned::<bf16>(2 * 300 * 4 * 128)?;
        let mut alse = poisoned::<f32>(att.lse_len())?;
        {
            let mut o = View::contiguous(&ao, att.q_shape());
            attention::forward(
                g,
                st(0),
                &att,
                &View::contiguous(&aq, att.q_shape()),
                &View::contiguous(&ak, att.kv_shape()),
                &View::contiguous(&av, att.kv_shape()),
                &mut o,
                &mut alse,
            )?;
        }
        // Semi-CRF.
        let mut cst = semicrf::ForwardState::new(&crf)?;
        let mut cgr = semicrf::Gradients::new(&crf, true)?;
        semicrf::forward_backward_launch(g, st(1), &crf, &crf_dev, &mut cst, &mut cgr)?;
        // GLA.
        let mut plan = gla::GlaPlan::new(g, &gp)?;
        let mut go = poisoned::<bf16>(gp.v_len())?;
        let mut gfin = poisoned::<f32>(gp.state_len())?;
        plan.forward(
            g,
            st(2),
            &gla::GlaInputs {
                q: &gq,
                k: &gk,
                v: &gv,
                g: &gg,
                init_state: None,
            },
            &mut gla::GlaOutputs {
                o: &mut go,
                final_state: Some(&mut gfin),
            },
        )?;
        // mHC.
        let mut m = mhc::MhcDeviceRun::upload(&mdata)?;
        m.forward(g, st(3))?;
        m.backward(g, st(3))?;
        for s in streams {
            g.sync(s, "concurrent families")?;
        }
        let bits = vec![
            bits_bf16(&download(&ao)?),
            bits_f32(&download(&alse)?),
            bits_f32(&download(cst.log_z())?),
            bits_f32(&download(&cgr.grad_cumsum)?),
            bits_f32(&download(&cgr.grad_dur)?),
            bits_f32(&download(&cgr.grad_trans)?),
            bits_f32(&download(cgr.marginals.as_ref().expect("asked for"))?),
            bits_bf16(&download(&go)?),
            bits_f32(&download(&gfin)?),
        ];
        Ok((bits, m.download()?))
    };
    let one = vec![gpu_ok(g.stream())?];
    let sequential = gpu_ok(run_all(&one))?;
    let streams: Vec<kernels::Stream> = (0..4)
        .map(|_| g.stream())
        .collect::<kernels::Result<_>>()
        .map_err(|e| format!("{e}"))?;
    for round in 0..3 {
        let concurrent = gpu_ok(run_all(&streams))?;
        for (i, (a, b)) in sequential.0.iter().zip(&concurrent.0).enumerate() {
            ensure(a == b, || {
                format!("round {round}: output {i} differs between sequential and concurrent runs")
            })?;
        }
        ensure(sequential.1.same_bits(&concurrent.1), || {
            format!("round {round}: mHC outputs differ between sequential and concurrent runs")
        })?;
    }
    println!("four families on four streams, 3 rounds: bitwise equal to the sequential run");
    Ok(())
}
