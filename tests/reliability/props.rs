//! Property tests of every family's host API: arbitrary sizes and options never panic; they
//! either fail validation with a typed error, or validate, and then every launch the library
//! would make passes the same checks `Gpu::launch` makes (kernel in the PTX, parameter size,
//! block size against the launch bounds, grid and shared memory against an H100's limits),
//! checked without a GPU; small valid problems also run the CPU reference. Also the GLA
//! backward's GPU property in the CPU emulator ([`gla_backward_emulated`]).

use crate::HOPPER_MAX_SMEM;
use crate::{gla_backward, props_gpu};
use kernel_abi::semicrf::{SEMICRF_MARGINALS, SEMICRF_REDUCE, SEMICRF_SCAN, SEMICRF_VITERBI};
use kernel_tests::TestResult;
use kernels::attention::{
    self, AttentionBackwardPlan, AttentionBackwardTensors, AttentionElem, AttentionPlan,
    AttentionProblem, AttentionTensors, BackwardOptions, BackwardWorkspace, Dtype, Path, Target,
    View,
};
use kernels::gla::{self, GlaKernel, GlaProblem};
use kernels::gpu::check_kernel_launch;
use kernels::mhc::{self, DevView, Exec, MhcProblem, MhcTensors};
use kernels::semicrf::{
    self, GradientViews, InputViews, SemiCrfPlan, SemiCrfProblem, SemiCrfTensors, StateViews,
    ViterbiViews,
};
use kernels::{Arch, Error, KernelDecl, Launch, LaunchConfig, bf16, f16};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::cell::RefCell;

/// Cases per property: enough to cover every option combination many times, small enough that
/// the suite stays a few seconds (CI runs without a GPU).
const CASES: u32 = 256;

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

/// The launch checks of `Gpu::launch` of `kernel` (a handle's declaration) on every PTX target
/// (those with the Hopper kernels if `hopper_only`), for an H100/H200's limits.
fn launch_ok(
    kernel: &KernelDecl,
    cfg: &LaunchConfig,
    hopper_only: bool,
) -> Result<(), TestCaseError> {
    for arch in Arch::ALL {
        if hopper_only && !arch.has_hopper_kernels() {
            continue;
        }
        check_kernel_launch(arch, kernel, cfg, HOPPER_MAX_SMEM).map_err(|e| {
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

pub fn attention_validate_or_typed_error() -> TestResult {
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
                    // The `mma.sync` path (sm_80's, and sm_90a's fallback) on every target.
                    let plan_err = |e: Error| TestCaseError::fail(format!("plan: {e}"));
                    let mma = attention_plan(&p, Arch::Sm80).map_err(plan_err)?;
                    prop_assert!(!mma.is_hopper());
                    launch_ok(&mma.kernel(), &mma.config(), false)?;
                    // The Hopper path: its launch, or a typed refusal (too many tiles, strides
                    // no tensor map describes) and the default path falling back to `mma.sync`.
                    match attention_plan(&p.clone().path(Path::Hopper), Arch::Sm90a) {
                        Ok(hopper) => {
                            prop_assert!(hopper.is_hopper());
                            launch_ok(&hopper.kernel(), &hopper.config(), true)?;
                        }
                        Err(e) => {
                            typed(&e)?;
                            let auto = attention_plan(&p, Arch::Sm90a).map_err(plan_err)?;
                            prop_assert!(!auto.is_hopper());
                            launch_ok(&auto.kernel(), &auto.config(), true)?;
                        }
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

pub fn attention_backward_plan_or_typed_error() -> TestResult {
    let strategy = (
        (size(), size(), size(), size(), size()),
        prop_oneof![Just(64usize), Just(128), Just(256), size()],
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        (proptest::option::of(size()), proptest::option::of(size())),
    );
    property(
        strategy,
        |((b, sq, sk, hq, hkv), d, (f16, causal, deterministic, with_dlse), (wl, wr))| {
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
            let options = BackwardOptions { deterministic };
            for arch in Arch::ALL {
                match attention_backward_plan(&p, arch, options, with_dlse) {
                    // An invalid problem: the same typed error as its validation.
                    Err(e) => {
                        typed(&e)?;
                        prop_assert!(p.validate().is_err(), "a valid problem failed: {e}");
                    }
                    Ok(plan) => {
                        prop_assert!(p.validate().is_ok());
                        prop_assert_eq!(plan.deterministic(), deterministic);
                        prop_assert_eq!(plan.delta_len(), p.lse_len());
                        // An accumulator of whole 64-row tiles per (sequence, head), in
                        // deterministic mode followed by a counter per tile (rounded up to 4).
                        let tiles = p.batch * p.heads_q * p.seq_q.div_ceil(64);
                        let expect = if deterministic {
                            tiles * 64 * p.head_dim + tiles.next_multiple_of(4)
                        } else {
                            tiles * 64 * p.head_dim
                        };
                        prop_assert_eq!(plan.dq_accum_len(), expect);
                        // The workspace of the sizes the plan asks for: three launches, each
                        // passing `Gpu::launch`'s checks.
                        let ws = BackwardWorkspace {
                            delta: fake_at(9, plan.delta_len()),
                            dq_accum: Some(fake_at(10, plan.dq_accum_len())),
                        };
                        let l = plan
                            .launches(&ws)
                            .map_err(|e| TestCaseError::fail(format!("launches: {e}")))?;
                        // The Hopper path's kernels (the conversion of its accumulator
                        // included) exist in the sm_90a PTX only.
                        let hopper = plan.path() == kernels::attention::BackwardPath::Hopper;
                        for (kernel, cfg, hopper_only) in [
                            (l.pre.kernel(), l.pre.config(), false),
                            (l.dkdv.kernel(), l.dkdv.config(), hopper),
                            (l.dq.kernel(), l.dq.config(), hopper),
                        ] {
                            launch_ok(kernel, cfg, hopper_only)?;
                        }
                        // A workspace that is too small: a typed error, never a launch.
                        if plan.delta_len() > 1 {
                            let small = BackwardWorkspace {
                                delta: fake_at(9, plan.delta_len() - 1),
                                ..ws
                            };
                            match plan.launches(&small) {
                                Ok(_) => prop_assert!(false, "a short delta was accepted"),
                                Err(e) => typed(&e)?,
                            }
                        }
                    }
                }
            }
            Ok(())
        },
    )
}

/// The backward plan of `p` for `arch` on made-up contiguous tensors (planned, never run).
fn attention_backward_plan(
    p: &AttentionProblem,
    arch: Arch,
    options: BackwardOptions,
    with_dlse: bool,
) -> kernels::Result<AttentionBackwardPlan> {
    fn plan<T: AttentionElem>(
        p: &AttentionProblem,
        arch: Arch,
        options: BackwardOptions,
        with_dlse: bool,
    ) -> kernels::Result<AttentionBackwardPlan> {
        let (q, kv) = (p.q_shape(), p.kv_shape());
        // Sizes past the address space: the shapes' own products would overflow.
        let (Some(nq), Some(nk)) = (
            q.iter().try_fold(1usize, |a, &x| a.checked_mul(x)),
            kv.iter().try_fold(1usize, |a, &x| a.checked_mul(x)),
        ) else {
            return p.validate().and(Err(Error::invalid("sizes", "too large")));
        };
        let at = fake_at::<T>;
        let tensors = AttentionBackwardTensors::<T> {
            q: View::contiguous(at(1, nq), q),
            k: View::contiguous(at(2, nk), kv),
            v: View::contiguous(at(3, nk), kv),
            o: View::contiguous(at(4, nq), q),
            d_o: View::contiguous(at(5, nq), q),
            lse: fake(p.lse_len()),
            d_lse: with_dlse.then(|| fake(p.lse_len())),
            dq: View::contiguous(at(6, nq), q),
            dk: View::contiguous(at(7, nk), kv),
            dv: View::contiguous(at(8, nk), kv),
            sinks: None,
            d_sinks: None,
        };
        let target = Target {
            arch,
            multiprocessors: 132,
        };
        p.plan_backward(target, &tensors, options)
    }
    match p.dtype {
        Dtype::Bf16 => plan::<bf16>(p, arch, options, with_dlse),
        Dtype::F16 => plan::<f16>(p, arch, options, with_dlse),
    }
}

/// The plan of `p` for `arch` on made-up contiguous tensors ([`fake`]: planned, never run), on
/// a GPU with a multiprocessor per tile (the Hopper path's largest grid).
pub(crate) fn attention_plan(p: &AttentionProblem, arch: Arch) -> kernels::Result<AttentionPlan> {
    fn plan<T: AttentionElem>(p: &AttentionProblem, arch: Arch) -> kernels::Result<AttentionPlan> {
        let (q, kv) = (p.q_shape(), p.kv_shape());
        let tensors = AttentionTensors::<T> {
            q: View::contiguous(fake(q.iter().product()), q),
            k: View::contiguous(fake(kv.iter().product()), kv),
            v: View::contiguous(fake(kv.iter().product()), kv),
            o: View::contiguous(fake(q.iter().product()), q),
            lse: fake(p.lse_len()),
            sinks: p.sinks.then(|| fake(p.heads_q)),
            // A tile counter for half the problems: short causal ones plan the dynamic grid.
            tile_counter: p.batch.is_multiple_of(2).then(|| fake(1)),
        };
        let target = Target {
            arch,
            multiprocessors: u32::MAX,
        };
        p.plan(target, &tensors, None)
    }
    match p.dtype {
        Dtype::Bf16 => plan::<bf16>(p, arch),
        Dtype::F16 => plan::<f16>(p, arch),
    }
}

pub fn attention_view_bounds() -> TestResult {
    // The bound check of every view: no stride or offset, however large, wraps around.
    let dim = || prop_oneof![1usize..=8, any::<usize>()];
    let strategy = (
        dim(),
        [dim(), dim(), dim(), dim()],
        [dim(), dim(), dim(), dim()],
    );
    property(strategy, |(offset, shape, strides)| {
        if let Some(last) = attention::last_element(offset, shape, strides) {
            // Each term fits u128; their sum saturates (past any memory).
            let exact = (0..4)
                .map(|i| (shape[i] as u128 - 1) * strides[i] as u128)
                .fold(offset as u128, u128::saturating_add);
            prop_assert_eq!(last, exact);
        } else {
            prop_assert!(shape.contains(&0));
        }
        Ok(())
    })
}

pub fn semicrf_validate_or_typed_error() -> TestResult {
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
                // Every pass: the forward scan; the reverse scan, the segment kernel and the
                // reduction; both scans in one launch, then the same; the Viterbi kernel.
                let exec = CheckingExec::all();
                for tensors in semicrf_passes(&p) {
                    let plan = p
                        .plan(&tensors)
                        .map_err(|e| TestCaseError::fail(format!("plan: {e}")))?;
                    // SAFETY: `CheckingExec` never accesses the (made-up) views.
                    unsafe { plan.run(&exec) }
                        .map_err(|e| TestCaseError::fail(format!("launch sequence: {e}")))?;
                }
                let names: Vec<String> =
                    exec.launched.borrow().iter().map(|l| l.0.clone()).collect();
                let (scan, marginals, reduce, viterbi) = (
                    SEMICRF_SCAN.name,
                    SEMICRF_MARGINALS.name,
                    SEMICRF_REDUCE.name,
                    SEMICRF_VITERBI.name,
                );
                prop_assert_eq!(
                    names,
                    [
                        scan, scan, marginals, reduce, scan, marginals, reduce, viterbi
                    ]
                );
                if b * (t + 1) * k * c <= 4096 {
                    let inp = kernels_testing::semicrf::random_inputs(&p, 7, true);
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

/// The tensors of every pass of `p` ([`fake`] views: planned, never accessed): forward,
/// backward, forward and backward, Viterbi.
pub(crate) fn semicrf_passes<'a>(p: &SemiCrfProblem) -> [SemiCrfTensors<'a>; 4] {
    let n = p.buffer_lens();
    let inputs = InputViews {
        cumsum: fake(n.cumsum),
        dur: fake(n.dur),
        trans: fake(n.trans),
        lengths: fake(n.lengths),
    };
    let state = StateViews {
        log_z: fake(n.log_z),
        log_z64: fake(n.log_z64),
        alpha_ckpt: fake(n.alpha_ckpt),
        alpha_norm: fake(n.alpha_norm),
        beta_ckpt: fake(n.beta_ckpt),
        beta_norm: fake(n.beta_norm),
        partials: fake(n.partials),
    };
    let grads = |marginals: bool| GradientViews {
        grad_cumsum: fake(n.grad_cumsum),
        grad_dur: fake(n.grad_dur),
        grad_trans: fake(n.grad_trans),
        marginals: marginals.then(|| fake(n.marginals)),
    };
    let out = ViterbiViews {
        score: fake(n.viterbi_score),
        backptr: fake(n.viterbi_backptr),
        seg_start: fake(n.viterbi_segments),
        seg_dur: fake(n.viterbi_segments),
        seg_label: fake(n.viterbi_segments),
        seg_count: fake(n.viterbi_count),
    };
    [
        SemiCrfTensors::Forward { inputs, state },
        SemiCrfTensors::Backward {
            inputs,
            state,
            grads: grads(false),
        },
        SemiCrfTensors::ForwardBackward {
            inputs,
            state,
            grads: grads(true),
        },
        SemiCrfTensors::Viterbi { inputs, out },
    ]
}

/// Every launch of a semi-CRF plan, in order, with what its handle declares.
pub(crate) fn semicrf_launches(plan: &SemiCrfPlan) -> Vec<(&KernelDecl, &LaunchConfig)> {
    let mut v = Vec::new();
    if let Some(l) = &plan.scan {
        v.push((l.kernel(), l.config()));
    }
    if let Some(l) = &plan.marginals {
        v.push((l.kernel(), l.config()));
    }
    if let Some(l) = &plan.reduce {
        v.push((l.kernel(), l.config()));
    }
    if let Some(l) = &plan.viterbi {
        v.push((l.kernel(), l.config()));
    }
    v
}

/// An executor that runs nothing: it checks each launch as `Gpu::launch` would (without a
/// device) against the PTX of its targets (every target, or those given), and records the
/// kernel names and whether each launch overlaps its predecessor.
struct CheckingExec {
    archs: &'static [Arch],
    launched: RefCell<Vec<(String, bool)>>,
}

impl CheckingExec {
    /// Checking against every target.
    fn all() -> Self {
        CheckingExec::on(&Arch::ALL)
    }

    /// Checking against the targets `archs` (those a plan's kernels exist for).
    fn on(archs: &'static [Arch]) -> Self {
        CheckingExec {
            archs,
            launched: RefCell::new(Vec::new()),
        }
    }
}

impl Exec for CheckingExec {
    unsafe fn launch<P: Copy>(&self, launch: &Launch<P>) -> kernels::Result<()> {
        for &arch in self.archs {
            check_kernel_launch(arch, launch.kernel(), launch.config(), HOPPER_MAX_SMEM)?;
        }
        self.launched
            .borrow_mut()
            .push((launch.name().to_string(), launch.config().overlap_previous));
        Ok(())
    }
}

/// A view of `len` elements at made-up address `slot << 44` (slots 1 to 15: views that alias
/// nothing, for plans that check aliasing); planned only, never run.
fn fake_at<'a, T>(slot: u64, len: usize) -> DevView<'a, T> {
    // SAFETY: the view is only planned, never dereferenced.
    unsafe { DevView::from_raw(slot << 44, len) }
}

/// A view of `len` elements at a made-up, 16-byte aligned address: only for plans that are
/// never run, or run only on [`CheckingExec`], which never accesses memory.
fn fake<'a, T>(len: usize) -> DevView<'a, T> {
    // SAFETY: the view is only planned, and run only on `CheckingExec`, which never
    // dereferences it.
    unsafe { DevView::from_raw(1 << 40, len) }
}

pub fn gla_validate_or_typed_error() -> TestResult {
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
                let t = gla::GlaTensors {
                    q: fake(p.qk_len()),
                    k: fake(p.qk_len()),
                    v: fake(p.v_len()),
                    g: fake(p.qk_len()),
                    init_state: Some(fake(p.state_len())),
                    o: fake(p.v_len()),
                    final_state: Some(fake(p.state_len())),
                };
                // `Auto` (the baseline on sm_80; on sm_90a the pingpong from
                // `PINGPONG_MIN_PAIRS` (sequence, head) pairs up, else the baseline), and each
                // forced: the baseline (every target) and the pingpong (sm_90a only).
                let auto_hopper = if p.num_seqs() * p.heads >= gla::PINGPONG_MIN_PAIRS {
                    GlaKernel::Pingpong
                } else {
                    GlaKernel::Baseline
                };
                let every: &'static [Arch] = &Arch::ALL;
                let hopper: &'static [Arch] = &[Arch::Sm90a];
                for (kernel, arch, archs, resolved) in [
                    (GlaKernel::Auto, Arch::Sm80, every, GlaKernel::Baseline),
                    (
                        GlaKernel::Auto,
                        Arch::Sm90a,
                        if auto_hopper == GlaKernel::Pingpong {
                            hopper
                        } else {
                            every
                        },
                        auto_hopper,
                    ),
                    (GlaKernel::Baseline, Arch::Sm90a, every, GlaKernel::Baseline),
                    (
                        GlaKernel::Pingpong,
                        Arch::Sm90a,
                        hopper,
                        GlaKernel::Pingpong,
                    ),
                ] {
                    let p = p.clone().with_kernel(kernel);
                    let target = gla::Target {
                        arch,
                        multiprocessors: 132,
                    };
                    let plan = p.plan(target, &t).map_err(|e| {
                        TestCaseError::fail(format!("{kernel:?} plan of a valid problem: {e}"))
                    })?;
                    prop_assert_eq!(plan.kernel, resolved);
                    let (seg_words, comb_words) = plan.segments.table_words();
                    let workspace = gla::GlaWorkspace {
                        segments: fake(seg_words.len()),
                        split: plan.workspace.map(|(state, decay)| gla::GlaSplitWorkspace {
                            combine: fake(comb_words.len()),
                            seg_init: fake(state),
                            delta: fake(state),
                            decay_log2: fake(decay),
                        }),
                    };
                    // The launches with zeroed tensor maps (encoding them needs the driver;
                    // `plan.maps` were validated by the plan).
                    let launches = plan
                        .launches(&workspace, &[kernel_abi::TensorMap::ZEROED; 4])
                        .map_err(|e| TestCaseError::fail(format!("{kernel:?} launches: {e}")))?;
                    let exec = CheckingExec::on(archs);
                    for launch in &launches {
                        // SAFETY: `CheckingExec` never accesses the (made-up) views.
                        unsafe { launch.run(&exec) }.map_err(|e| {
                            TestCaseError::fail(format!("{kernel:?} launch sequence: {e}"))
                        })?;
                    }
                    // Split: the state pass, the combination (baseline only), the forward;
                    // only the pingpong's forward overlaps its predecessor.
                    let split = plan.workspace.is_some();
                    let overlaps: Vec<bool> = exec.launched.borrow().iter().map(|l| l.1).collect();
                    let want = match (resolved, split) {
                        (GlaKernel::Pingpong, true) => vec![false, true],
                        (GlaKernel::Pingpong, false) => vec![false],
                        (_, split) => vec![false; if split { 3 } else { 1 }],
                    };
                    prop_assert_eq!(overlaps, want);
                    // Every token of every sequence is in exactly one segment.
                    let covered: usize =
                        plan.segments.segments.iter().map(|s| s.len as usize).sum();
                    prop_assert_eq!(covered, p.rows());
                }
                Ok(())
            }
        }
    })
}

pub fn mhc_validate_or_typed_error() -> TestResult {
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
                let layout = p.layout();
                let (t, k, m) = (p.tokens(), p.k(), p.m());
                let w = mhc::RawWeights {
                    phi: fake(k * m),
                    gamma: gamma.then(|| fake(k)),
                    alpha: fake(3),
                    bias: fake(m),
                };
                let sc = mhc::RawScratch {
                    packed_f1: fake(layout.packed_f1),
                    packed_b2: fake(layout.packed_b2),
                    part_proj: fake(layout.part_proj),
                    part_sumsq: fake(layout.part_sumsq),
                    dh: fake(layout.dh),
                    u: fake(layout.u),
                    xcoef: fake(t),
                    part_coef: fake(layout.part_coef),
                    part_w: fake(layout.part_w),
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
                for (what, tensors) in [
                    (
                        "forward_pre",
                        MhcTensors::ForwardPre {
                            weights: w,
                            x: fake(t * k),
                            scratch: sc,
                            coeffs: co,
                            x_in: fake(t * c),
                        },
                    ),
                    (
                        "forward_post",
                        MhcTensors::ForwardPost {
                            x: fake(t * k),
                            y: fake(t * c),
                            coeffs: co,
                            x_next: fake(t * k),
                        },
                    ),
                    (
                        "backward",
                        MhcTensors::Backward {
                            weights: w,
                            x: fake(t * k),
                            y: fake(t * c),
                            coeffs: co,
                            d_xin: fake(t * c),
                            d_xnext: fake(t * k),
                            scratch: sc,
                            grads: gr,
                        },
                    ),
                ] {
                    let plan = p.plan(&tensors).map_err(|e| fail(what, e))?;
                    // SAFETY: `CheckingExec` never accesses the (made-up) views.
                    unsafe { plan.run(&exec) }.map_err(|e| fail(what, e))?;
                }
                prop_assert!(!exec.launched.borrow().is_empty());
                Ok(())
            }
        }
    })
}

/// The GLA backward's GPU property (`props_gpu::gla_backward_small`) in the CPU emulator (the
/// kernels' own code, no GPU needed), on smaller problems: T up to 150, packed sequences up to
/// 80 tokens, up to 2 rows and 2 heads, forced segments of 32 tokens or one per sequence.
pub fn gla_backward_emulated() -> TestResult {
    const CASES: u32 = 16;
    props_gpu::gla_backward_property(
        "in the emulator",
        CASES,
        props_gpu::gla_backward_cases(2, 150, 80, 2, &[32, usize::MAX]),
        |p, d| gla_backward::emulated(p, d, gla_backward::Kernels::Library),
    )
}
