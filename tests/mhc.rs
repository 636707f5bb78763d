//! mHC: the f64 reference checked by finite differences; the kernels executed on the CPU (in
//! the emulator) and on the GPU against the reference, every output on its own (dbias_pre,
//! dbias_post and dbias_res separately); bitwise determinism; bad input -> typed errors.
//!
//! Tolerances (stated once, in `kernels::mhc::reference`): bf16 outputs (`x_in`, `x_next`,
//! `dx`, `dy`): `|err| <= 2^-7 |ref| + 2^-13 sum|terms|` (twice bf16's unit roundoff, plus the
//! f32 coefficients' error); f32 outputs (coefficients, saved
//! `h~` and `r`, weight gradients): relative error `<= 1e-3` with the denominator floored at 1%
//! of the tensor's largest magnitude (per token for per-token tensors), and for the projection
//! `h~` also `2^-15 sum|terms|` (`tol_proj`: the bf16 `hi + lo` split of `phi`). Outputs start poisoned
//! (NaN), so an element a kernel does not write fails.

use kernel_abi::mhc as abi;
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok, portable_gpu};
use kernels::memory::{poisoned, upload};
use kernels::mhc::reference::{self, MhcData};
use kernels::mhc::{
    self, MhcCoefficients, MhcGradients, MhcProblem, MhcTensors, MhcWeights, MhcWorkspace,
    RawCoefficients, RawGradients, RawScratch, RawWeights,
};
use kernels::{Error, Gpu, bf16};
use kernels_testing::mhc::MhcDeviceRun;
use kernels_testing::mhc::MhcHostOutputs;

/// One configuration: `(B, S, n, C)`, gamma, Sinkhorn iterations, seed.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    s: usize,
    n: usize,
    c: usize,
    gamma: bool,
    iters: u32,
    seed: u64,
}

const fn case(b: usize, s: usize, n: usize, c: usize, gamma: bool, iters: u32) -> Case {
    Case {
        b,
        s,
        n,
        c,
        gamma,
        iters,
        seed: (b * 1_000_003 + s * 1009 + n * 101 + c) as u64 + iters as u64 + gamma as u64,
    }
}

impl Case {
    fn problem(&self) -> MhcProblem {
        MhcProblem::new(self.b, self.s, self.n, self.c)
            .with_gamma(self.gamma)
            .with_iters(self.iters)
    }

    fn name(&self) -> String {
        format!(
            "b{}_s{}_n{}_c{}{}_t{}",
            self.b,
            self.s,
            self.n,
            self.c,
            if self.gamma { "_gamma" } else { "" },
            self.iters
        )
    }
}

/// GPU configurations: three of the default n = 4, every n from 2 to 8, C = 8 mod 16, token counts that
/// fill no tile, 1 and 100 iterations, one token.
const GPU_CASES: [Case; 13] = [
    case(2, 64, 4, 128, false, 20),
    case(1, 256, 4, 256, false, 20),
    case(4, 512, 8, 128, false, 20),
    case(2, 64, 4, 128, true, 20),
    case(2, 100, 2, 72, true, 20),
    case(3, 37, 3, 40, true, 7),
    case(1, 129, 5, 24, false, 20),
    case(2, 33, 6, 16, true, 20),
    case(1, 70, 7, 56, false, 1),
    case(1, 300, 8, 64, true, 20),
    case(1, 96, 4, 64, true, 100),
    case(1, 1, 4, 8, false, 20),
    case(3, 333, 4, 1000, true, 20),
];

/// The realistic size (B x S = 16k, n = 4, C = 4096); `large` in its name lets the sanitizer
/// pass skip it (`SANITIZER_SKIP=large`).
const LARGE: Case = case(4, 4096, 4, 4096, true, 20);

/// Configurations run in the CPU emulator (every kernel's own code; small, it is slow). The
/// first has a long K (several projection splits of many chunks, 64 dx channel groups, 16
/// weight-gradient K tiles), the next two span several projection token blocks, dx blocks and
/// weight-gradient token splits.
const EMULATED_CASES: [Case; 10] = [
    case(1, 16, 4, 1024, true, 20),
    case(1, 150, 2, 16, false, 2),
    case(2, 70, 4, 8, true, 3),
    case(1, 5, 2, 8, false, 3),
    case(1, 20, 3, 24, true, 5),
    case(2, 9, 4, 40, false, 4),
    case(1, 18, 5, 16, true, 2),
    case(1, 12, 6, 8, false, 100),
    case(1, 7, 7, 24, true, 2),
    case(1, 17, 8, 8, true, 3),
];

/// Tiny configurations for the finite-difference check of the reference's backward.
const FD_CASES: [Case; 4] = [
    case(1, 3, 2, 8, true, 3),
    case(2, 2, 3, 8, false, 5),
    case(1, 2, 4, 16, true, 20),
    case(1, 1, 8, 8, true, 4),
];

fn main() {
    let mut s = Suite::new();
    for c in FD_CASES {
        s.cpu(
            &format!("mhc/reference/finite_differences_{}", c.name()),
            move || finite_differences(c),
        );
    }
    s.cpu(
        "mhc/reference/sinkhorn_is_doubly_stochastic",
        sinkhorn_converges,
    );
    s.cpu("mhc/layout/packings_cover_each_entry_once", packings);
    s.cpu("mhc/validation/rejects_bad_problems", rejects_bad_problems);
    s.cpu("mhc/validation/rejects_bad_buffers", rejects_bad_buffers);
    for c in EMULATED_CASES {
        s.cpu(&format!("mhc/emulated/{}", c.name()), move || emulated(c));
    }
    for c in GPU_CASES {
        s.gpu(&format!("mhc/gpu/{}", c.name()), Needs::Gpu, move |g| {
            on_gpu(g, c)
        });
    }
    s.gpu(
        &format!("mhc/gpu/large_{}", LARGE.name()),
        Needs::Gpu,
        |g| on_gpu(g, LARGE),
    );
    for &kernel_abi::mhc::ProjVariant { name: v, n: vn, .. } in kernel_abi::mhc::PROJ_VARIANTS {
        s.gpu(&format!("mhc/gpu/proj_variant_{v}"), Needs::Gpu, move |g| {
            // 8 token blocks, several pipeline steps per block (the ring wraps).
            let c = case(2, 512, vn as usize, 1000, true, 20);
            let mut data = MhcData::random(&c.problem(), c.seed);
            data.problem.proj_variant = Some(v);
            let out = gpu_ok(run_gpu(g, &data))?;
            check_outputs(
                &data,
                &out,
                &format!("{} {} variant {v}", g.arch(), c.name()),
            )
        });
    }
    s.gpu("mhc/gpu/deterministic", Needs::Gpu, deterministic);
    s.cpu("mhc/nonfinite/emulated", nonfinite_emulated);
    s.gpu("mhc/nonfinite/gpu", Needs::Gpu, nonfinite_gpu);
    s.gpu("mhc/gpu/sm_80_target", Needs::Gpu, |_| {
        match portable_gpu() {
            Some(g) => on_gpu(g, case(2, 64, 4, 128, true, 20)),
            None => {
                println!("the default target is already sm_80");
                Ok(())
            }
        }
    });
    s.gpu(
        "mhc/gpu/rejects_mismatched_buffers",
        Needs::Gpu,
        rejects_mismatched_buffers,
    );
    s.run()
}

// ---------------------------------------------------------------------------------------------
// Outputs and their comparison with the reference.

/// Compare every output with the f64 reference, print one line per output, fail on any
/// element out of tolerance.
fn check_outputs(data: &MhcData, out: &MhcHostOutputs, label: &str) -> TestResult {
    let cmp = kernels_testing::mhc::compare(data, out, None);
    for line in cmp.lines(label) {
        println!("{line}");
    }
    let p = &data.problem;
    for name in kernels_testing::mhc::OUTPUTS {
        let expected = !(name == "dgamma" && !p.gamma);
        ensure(!expected || cmp.get(name).values > 0, || {
            format!("{label}: {name} was not compared")
        })?;
    }
    let failures = cmp.failures();
    ensure(failures.is_empty(), || {
        format!("{label}:\n  {}", failures.join("\n  "))
    })
}

// ---------------------------------------------------------------------------------------------
// Running the kernels.

fn run_gpu(g: &Gpu, data: &MhcData) -> kernels::Result<MhcHostOutputs> {
    let stream = g.stream()?;
    let mut run = MhcDeviceRun::upload(data)?;
    run.forward(g, &stream)?;
    run.backward(g, &stream)?;
    g.sync(&stream, "mhc forward and backward")?;
    run.download()
}

/// Host buffers standing in for every device tensor of one problem.
struct HostProblem {
    x: HostBuf<bf16>,
    y: HostBuf<bf16>,
    phi: HostBuf<f32>,
    gamma: Option<HostBuf<f32>>,
    alpha: HostBuf<f32>,
    bias: HostBuf<f32>,
    d_xin: HostBuf<bf16>,
    d_xnext: HostBuf<bf16>,
    scratch: [HostBuf<f32>; 7],
    packed: [HostBuf<u32>; 2],
    coeffs: [HostBuf<f32>; 5],
    x_in: HostBuf<bf16>,
    x_next: HostBuf<bf16>,
    dx: HostBuf<bf16>,
    dy: HostBuf<bf16>,
    dphi: HostBuf<f32>,
    dgamma: Option<HostBuf<f32>>,
    dalpha: HostBuf<f32>,
    dbias: HostBuf<f32>,
}

impl HostProblem {
    fn new(data: &MhcData) -> Self {
        let p = &data.problem;
        let plan = p.layout();
        let (t, n, c, k, m) = (p.tokens(), p.n, p.c, p.k(), p.m());
        let nan = |len| HostBuf::filled(len, f32::NAN);
        let nan16 = |len| HostBuf::filled(len, bf16::NAN);
        HostProblem {
            x: HostBuf::from_slice(&data.x),
            y: HostBuf::from_slice(&data.y),
            phi: HostBuf::from_slice(&data.phi),
            gamma: data.gamma.as_deref().map(HostBuf::from_slice),
            alpha: HostBuf::from_slice(&data.alpha),
            bias: HostBuf::from_slice(&data.bias),
            d_xin: HostBuf::from_slice(&data.d_xin),
            d_xnext: HostBuf::from_slice(&data.d_xnext),
            scratch: [
                nan(plan.part_proj),
                nan(plan.part_sumsq),
                nan(plan.dh),
                nan(plan.u),
                nan(t),
                nan(plan.part_coef),
                nan(plan.part_w),
            ],
            packed: [
                HostBuf::filled(plan.packed_f1, u32::MAX),
                HostBuf::filled(plan.packed_b2, u32::MAX),
            ],
            coeffs: [nan(t * n), nan(t * n), nan(t * n * n), nan(t * m), nan(t)],
            x_in: nan16(t * c),
            x_next: nan16(t * k),
            dx: nan16(t * k),
            dy: nan16(t * c),
            dphi: nan(k * m),
            dgamma: p.gamma.then(|| nan(k)),
            dalpha: nan(3),
            dbias: nan(m),
        }
    }
}

fn run_emulated(data: &MhcData) -> kernels::Result<MhcHostOutputs> {
    let p = &data.problem;
    let mut h = HostProblem::new(data);
    let HostProblem {
        x,
        y,
        phi,
        gamma,
        alpha,
        bias,
        d_xin,
        d_xnext,
        scratch,
        packed,
        coeffs,
        x_in,
        x_next,
        dx,
        dy,
        dphi,
        dgamma,
        dalpha,
        dbias,
    } = &mut h;
    let weights = RawWeights {
        phi: phi.view(),
        gamma: gamma.as_mut().map(|g| g.view()),
        alpha: alpha.view(),
        bias: bias.view(),
    };
    let [part_proj, part_sumsq, dh, u, xcoef, part_coef, part_w] = scratch;
    let [packed_f1, packed_b2] = packed;
    let raw_scratch = RawScratch {
        packed_f1: packed_f1.view(),
        packed_b2: packed_b2.view(),
        part_proj: part_proj.view(),
        part_sumsq: part_sumsq.view(),
        dh: dh.view(),
        u: u.view(),
        xcoef: xcoef.view(),
        part_coef: part_coef.view(),
        part_w: part_w.view(),
    };
    let [h_pre, h_post, h_res, hproj, rms] = coeffs;
    let raw_coeffs = RawCoefficients {
        h_pre: h_pre.view(),
        h_post: h_post.view(),
        h_res: h_res.view(),
        hproj: hproj.view(),
        rms: rms.view(),
    };
    let raw_grads = RawGradients {
        dx: dx.view(),
        dy: dy.view(),
        dphi: dphi.view(),
        dgamma: dgamma.as_mut().map(|g| g.view()),
        dalpha: dalpha.view(),
        dbias: dbias.view(),
    };
    // The plan's launches, run in the emulator.
    let plan = p.layout();
    let forward_pre =
        plan.forward_pre(&weights, x.view(), &raw_scratch, &raw_coeffs, x_in.view())?;
    let forward_post = plan.forward_post(x.view(), y.view(), &raw_coeffs, x_next.view())?;
    let backward = plan.backward(
        &weights,
        x.view(),
        y.view(),
        &raw_coeffs,
        d_xin.view(),
        d_xnext.view(),
        &raw_scratch,
        &raw_grads,
    )?;
    // SAFETY: every view is a distinct host buffer of the problem's size, alive for the runs;
    // the emulator runs on host memory.
    unsafe {
        forward_pre.run(&Emulator)?;
        forward_post.run(&Emulator)?;
        backward.run(&Emulator)?;
    }
    let guards = [
        x.guards_intact(),
        y.guards_intact(),
        phi.guards_intact(),
        gamma.as_ref().is_none_or(|g| g.guards_intact()),
        alpha.guards_intact(),
        bias.guards_intact(),
        d_xin.guards_intact(),
        d_xnext.guards_intact(),
        [
            &*part_proj,
            &*part_sumsq,
            &*dh,
            &*u,
            &*xcoef,
            &*part_coef,
            &*part_w,
        ]
        .iter()
        .all(|b| b.guards_intact()),
        packed_f1.guards_intact() && packed_b2.guards_intact(),
        [&*h_pre, &*h_post, &*h_res, &*hproj, &*rms]
            .iter()
            .all(|b| b.guards_intact()),
        x_in.guards_intact(),
        x_next.guards_intact(),
        dx.guards_intact(),
        dy.guards_intact(),
        dphi.guards_intact(),
        dgamma.as_ref().is_none_or(|g| g.guards_intact()),
        dalpha.guards_intact(),
        dbias.guards_intact(),
    ];
    if let Some(i) = guards.iter().position(|ok| !ok) {
        return Err(kernels::Error::invalid(
            "emulated run",
            format!("a kernel wrote outside buffer #{i} (its guard band changed)"),
        ));
    }
    Ok(MhcHostOutputs {
        x_in: x_in.to_vec(),
        x_next: x_next.to_vec(),
        h_pre: h_pre.to_vec(),
        h_post: h_post.to_vec(),
        h_res: h_res.to_vec(),
        hproj: hproj.to_vec(),
        rms: rms.to_vec(),
        dx: dx.to_vec(),
        dy: dy.to_vec(),
        dphi: dphi.to_vec(),
        dgamma: dgamma.as_ref().map(|g| g.to_vec()),
        dalpha: dalpha.to_vec(),
        dbias: dbias.to_vec(),
    })
}

fn fail(e: Error) -> kernel_tests::TestFailure {
    format!("{e}").into()
}

fn emulated(c: Case) -> TestResult {
    let data = MhcData::random(&c.problem(), c.seed);
    let out = run_emulated(&data).map_err(fail)?;
    check_outputs(
        &data,
        &out,
        &format!("emulated {} (seed {})", c.name(), c.seed),
    )
}

fn on_gpu(g: &Gpu, c: Case) -> TestResult {
    let data = MhcData::random(&c.problem(), c.seed);
    let out = gpu_ok(run_gpu(g, &data))?;
    check_outputs(
        &data,
        &out,
        &format!("{} {} (seed {})", g.arch(), c.name(), c.seed),
    )
}

fn deterministic(g: &Gpu) -> TestResult {
    let c = case(2, 300, 4, 512, true, 20);
    let data = MhcData::random(&c.problem(), c.seed);
    let first = gpu_ok(run_gpu(g, &data))?;
    let second = gpu_ok(run_gpu(g, &data))?;
    ensure(first.same_bits(&second), || {
        "two runs on the same inputs differ in some output".into()
    })
}

// ---------------------------------------------------------------------------------------------
// The reference.

/// The reference's backward against central differences of its loss, for every weight, bias
/// (pre, post, res separately), gain, `gamma` entry, and every element of `x` and `y`.
fn finite_differences(c: Case) -> TestResult {
    let p = c.problem();
    let data = MhcData::random(&p, c.seed);
    let w = data.weights();
    let f64s = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let (x, y, dxin, dxn) = (
        f64s(&data.x),
        f64s(&data.y),
        f64s(&data.d_xin),
        f64s(&data.d_xnext),
    );
    let r = reference::reference(&data);
    let loss =
        |w: &reference::Weights, x: &[f64], y: &[f64]| reference::loss(&p, w, x, y, &dxin, &dxn);
    let (n, cc, k) = (p.n, p.c, p.k());
    let step = 1e-5;
    let mut worst = 0.0f64;
    let mut check =
        |what: &str, analytic: &[f64], perturb: &dyn Fn(usize, f64) -> f64| -> TestResult {
            let scale = analytic.iter().fold(1e-12f64, |m, a| m.max(a.abs()));
            for (i, &a) in analytic.iter().enumerate() {
                let fd = (perturb(i, step) - perturb(i, -step)) / (2.0 * step);
                let err = (fd - a).abs() / (a.abs() + scale);
                worst = worst.max(err);
                ensure(err < 1e-6, || {
                    format!("{what}[{i}]: analytic {a}, finite difference {fd} (rel {err:.2e})")
                })?;
            }
            Ok(())
        };
    let with_w = |edit: &dyn Fn(&mut reference::Weights)| {
        let mut w2 = w.clone();
        edit(&mut w2);
        loss(&w2, &x, &y)
    };
    check("dphi", &r.grads.dphi, &|i, h| {
        with_w(&|w: &mut reference::Weights| w.phi[i] += h)
    })?;
    if let Some(dg) = &r.grads.dgamma {
        check("dgamma", dg, &|i, h| {
            with_w(&|w: &mut reference::Weights| w.gamma.as_mut().unwrap()[i] += h)
        })?;
    }
    check("dalpha", &r.grads.dalpha, &|i, h| {
        with_w(&|w: &mut reference::Weights| w.alpha[i] += h)
    })?;
    for (part, range) in [
        ("dbias_pre", 0..n),
        ("dbias_post", n..2 * n),
        ("dbias_res", 2 * n..p.m()),
    ] {
        let start = range.start;
        check(part, &r.grads.dbias[range], &|i, h| {
            with_w(&|w: &mut reference::Weights| w.bias[start + i] += h)
        })?;
    }
    let dx: Vec<f64> = r.backward.iter().flat_map(|b| b.dx.clone()).collect();
    check("dx", &dx, &|i, h| {
        let mut x2 = x.clone();
        x2[i] += h;
        loss(&w, &x2, &y)
    })?;
    let dy: Vec<f64> = r.backward.iter().flat_map(|b| b.dy.clone()).collect();
    check("dy", &dy, &|i, h| {
        let mut y2 = y.clone();
        y2[i] += h;
        loss(&w, &x, &y2)
    })?;
    println!(
        "{} (T = {}, K = {k}, C = {cc}): worst relative difference analytic vs finite difference {worst:.2e}",
        c.name(),
        p.tokens()
    );
    Ok(())
}

/// With many iterations the reference's Sinkhorn output is doubly stochastic.
fn sinkhorn_converges() -> TestResult {
    let n = 5;
    let p0: Vec<f64> = (0..n * n)
        .map(|i| ((i * 7919 % 13) as f64 / 4.0 - 1.5).exp())
        .collect();
    let it = reference::sinkhorn(&p0, n, 200);
    let h = &it.last().expect("iterates").1;
    for i in 0..n {
        let row: f64 = (0..n).map(|j| h[i * n + j]).sum();
        let col: f64 = (0..n).map(|j| h[j * n + i]).sum();
        ensure(
            (row - 1.0).abs() < 1e-9 && (col - 1.0).abs() < 1e-12,
            || format!("row {i} sums to {row}, column to {col}"),
        )?;
    }
    Ok(())
}

/// The fragment packings of `phi'` place every `(k, m)` entry exactly once per half, and the
/// input-gradient permutation gives lane `t` the channels `4 t .. 4 t + 4`.
fn packings() -> TestResult {
    for n in abi::MIN_N..=abi::MAX_N {
        let (m8, m16) = (8 * abi::nt_of(n), abi::m16_of(n));
        for k in [8u32, 40, 96] {
            let chunks = abi::f1_chunks(k);
            let mut seen = vec![0u8; (chunks * 32 * m8) as usize];
            for chunk in 0..chunks {
                for j in 0..abi::nt_of(n) {
                    for lane in 0..32 {
                        for w in 0..4 {
                            let (kk, m) = abi::f1_word_source(chunk, j, lane, w);
                            let at = abi::lane_word(abi::f1_block(n, chunk, j, 0), lane, w);
                            ensure(at < abi::f1_words(n, k), || {
                                format!("f1 index {at} out of range")
                            })?;
                            for e in 0..2 {
                                seen[((kk + e) * m8 + m) as usize] += 1;
                            }
                        }
                    }
                }
            }
            ensure(seen.iter().all(|&s| s == 1), || {
                format!("f1 packing n {n} K {k}: an entry is not covered once")
            })?;
        }
        for c in [8u32, 16, 40] {
            let groups = abi::b2_groups(c);
            let mut seen = vec![0u8; (groups * 16 * m16) as usize];
            for group in 0..groups {
                for s in 0..abi::s16_of(n) {
                    for lane in 0..32 {
                        for w in 0..4 {
                            let (ch, m) = abi::b2_word_source(group, s, lane, w);
                            for e in 0..2 {
                                seen[(ch * m16 + m + e) as usize] += 1;
                            }
                        }
                    }
                }
                for q in 0..2 {
                    for t in 0..4 {
                        for e in 0..2 {
                            let ch = abi::b2_channel(group, q, 2 * t + e);
                            ensure(ch == 16 * group + 4 * t + 2 * q + e, || {
                                "b2 column permutation".into()
                            })?;
                        }
                    }
                }
            }
            ensure(seen.iter().all(|&s| s == 1), || {
                format!("b2 packing n {n} C {c}: an entry is not covered once")
            })?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Bad input.

fn rejects_bad_problems() -> TestResult {
    let ok = MhcProblem::new(2, 8, 4, 64);
    ensure(ok.validate().is_ok(), || {
        "a valid problem was rejected".into()
    })?;
    let cases: Vec<(&str, MhcProblem)> = vec![
        ("n = 1", MhcProblem { n: 1, ..ok }),
        ("n = 9", MhcProblem { n: 9, ..ok }),
        ("C = 0", MhcProblem { c: 0, ..ok }),
        ("C = 12", MhcProblem { c: 12, ..ok }),
        ("batch = 0", MhcProblem { batch: 0, ..ok }),
        ("seq = 0", MhcProblem { seq: 0, ..ok }),
        ("0 iterations", ok.with_iters(0)),
        ("101 iterations", ok.with_iters(abi::MAX_SINKHORN_ITERS + 1)),
        ("eps < 0", ok.with_eps(-1.0)),
        ("eps NaN", ok.with_eps(f32::NAN)),
        ("eps inf", ok.with_eps(f32::INFINITY)),
        (
            "unknown projection variant",
            MhcProblem {
                proj_variant: Some("c9s9"),
                ..ok
            },
        ),
        (
            "projection variant of another n",
            MhcProblem {
                n: 3,
                proj_variant: Some("c4s3"),
                ..ok
            },
        ),
        (
            "n C > 2^20",
            MhcProblem {
                c: (1 << 18) + 8,
                ..ok
            },
        ),
    ];
    for (what, p) in cases {
        match p.validate() {
            Err(Error::InvalidArgument { .. } | Error::Unsupported { .. }) => {}
            other => return Err(format!("{what}: expected a typed error, got {other:?}").into()),
        }
        for r in [
            MhcWorkspace::new(&p).err(),
            MhcCoefficients::new(&p).err(),
            MhcGradients::new(&p).err(),
        ] {
            ensure(
                matches!(
                    r,
                    Some(Error::InvalidArgument { .. } | Error::Unsupported { .. })
                ),
                || {
                    format!(
                        "{what}: allocating for an invalid problem must fail with a typed error"
                    )
                },
            )?;
        }
    }
    Ok(())
}

/// Wrong sizes, misaligned tensors and a gamma mismatch are rejected before any launch (the
/// emulator executor would run the kernels otherwise).
fn rejects_bad_buffers() -> TestResult {
    let p = MhcProblem::new(1, 4, 4, 16);
    let data = MhcData::random(&p, 3);
    let expect = |what: &str, r: kernels::Result<()>, ok: fn(&Error) -> bool| -> TestResult {
        match r {
            Err(e) if ok(&e) => Ok(()),
            other => Err(format!("{what}: expected a validation error, got {other:?}").into()),
        }
    };
    let shape = |e: &Error| matches!(e, Error::ShapeMismatch { .. });
    let misaligned = |e: &Error| matches!(e, Error::Misaligned { .. });
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument { .. });
    for (what, short, offset, gamma, check) in [
        (
            "x one element short",
            1usize,
            0usize,
            false,
            shape as fn(&Error) -> bool,
        ),
        ("x misaligned by 2 bytes", 0, 2, false, misaligned),
        ("gamma given without problem.gamma", 0, 0, true, invalid),
    ] {
        let mut h = HostProblem::new(&data);
        let mut extra_gamma = HostBuf::filled(p.k(), 1.0f32);
        let [part_proj, part_sumsq, dh, u, xcoef, part_coef, part_w] = &mut h.scratch;
        let [packed_f1, packed_b2] = &mut h.packed;
        let [h_pre, h_post, h_res, hproj, rms] = &mut h.coeffs;
        let weights = RawWeights {
            phi: h.phi.view(),
            gamma: gamma.then(|| extra_gamma.view()),
            alpha: h.alpha.view(),
            bias: h.bias.view(),
        };
        let scratch = RawScratch {
            packed_f1: packed_f1.view(),
            packed_b2: packed_b2.view(),
            part_proj: part_proj.view(),
            part_sumsq: part_sumsq.view(),
            dh: dh.view(),
            u: u.view(),
            xcoef: xcoef.view(),
            part_coef: part_coef.view(),
            part_w: part_w.view(),
        };
        let coeffs = RawCoefficients {
            h_pre: h_pre.view(),
            h_post: h_post.view(),
            h_res: h_res.view(),
            hproj: hproj.view(),
            rms: rms.view(),
        };
        let x = if short > 0 || offset > 0 {
            h.x.view_at(offset, short)
        } else {
            h.x.view()
        };
        let r = p
            .plan(&MhcTensors::ForwardPre {
                weights,
                x,
                scratch,
                coeffs,
                x_in: h.x_in.view(),
            })
            .and_then(|plan| {
                // SAFETY: planning rejects these views before any launch (what the test
                // checks); had it not, the views are host buffers the emulator could access.
                unsafe { plan.run(&Emulator) }
            });
        expect(what, r, check)?;
    }
    Ok(())
}

fn rejects_mismatched_buffers(g: &Gpu) -> TestResult {
    let p = MhcProblem::new(1, 16, 4, 64);
    let data = MhcData::random(&p, 9);
    let stream = gpu_ok(g.stream())?;
    let d_x = gpu_ok(upload(&data.x))?;
    let short = gpu_ok(upload(&data.x[1..]))?;
    let (d_phi, d_alpha, d_bias) = (
        gpu_ok(upload(&data.phi))?,
        gpu_ok(upload(&data.alpha))?,
        gpu_ok(upload(&data.bias))?,
    );
    let weights = MhcWeights {
        phi: &d_phi,
        gamma: None,
        alpha: &d_alpha,
        bias: &d_bias,
    };
    let mut ws = gpu_ok(MhcWorkspace::new(&p))?;
    let mut coeffs = gpu_ok(MhcCoefficients::new(&p))?;
    let mut x_in = gpu_ok(poisoned::<bf16>(p.tokens() * p.c))?;
    match mhc::forward_pre(
        g,
        &stream,
        &p,
        &weights,
        &short,
        &mut ws,
        &mut coeffs,
        &mut x_in,
    ) {
        Err(Error::ShapeMismatch { .. }) => {}
        other => return Err(format!("a short x must be rejected, got {other:?}").into()),
    }
    let other = MhcProblem::new(1, 16, 4, 72);
    let mut ws_other = gpu_ok(MhcWorkspace::new(&other))?;
    match mhc::forward_pre(
        g,
        &stream,
        &p,
        &weights,
        &d_x,
        &mut ws_other,
        &mut coeffs,
        &mut x_in,
    ) {
        Err(Error::ShapeMismatch { .. }) => Ok(()),
        other => {
            Err(format!("a workspace of another problem must be rejected, got {other:?}").into())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NaN and Inf inputs (README, "Limits, NaN and Inf").

/// The per-token input that receives a non-finite value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tensor {
    X,
    Y,
    DXin,
    DXnext,
}

/// One non-finite element: tensor, token, element within the token's slice, value.
#[derive(Clone, Copy, Debug)]
struct Poison {
    tensor: Tensor,
    token: usize,
    element: usize,
    value: f32,
}

/// The documented behaviour on one non-finite input element of one token (README, "Limits, NaN
/// and Inf"), checked on the outputs of `run` (the GPU or the emulator): every per-token output
/// of every other token (coefficients, `x_in`, `x_next`, `dx`, `dy`) is finite and within the
/// tolerances of the f64 reference; every output element the reference makes non-finite (the
/// token's own outputs, and the weight gradients, which sum over tokens) is non-finite, and
/// there is at least one.
fn nonfinite_case(
    what: &str,
    clean: &MhcData,
    poison: Poison,
    run: &dyn Fn(&MhcData) -> kernels::Result<MhcHostOutputs>,
) -> TestResult {
    let p = clean.problem;
    let (t, c, k) = (poison.token, p.c, p.k());
    let mut data = clean.clone();
    let x = bf16::from_f32(poison.value);
    match poison.tensor {
        Tensor::X => data.x[t * k + poison.element] = x,
        Tensor::Y => data.y[t * c + poison.element] = x,
        Tensor::DXin => data.d_xin[t * c + poison.element] = x,
        Tensor::DXnext => data.d_xnext[t * k + poison.element] = x,
    }
    let out = gpu_ok(run(&data))?;
    let label = format!("{what} {poison:?}");
    // Every other token: within tolerance (a non-finite value is out of any tolerance).
    let others: Vec<usize> = (0..p.tokens()).filter(|&i| i != t).collect();
    let cmp = kernels_testing::mhc::compare(&data, &out, Some(&others));
    let worst = cmp.stats.iter().fold(0.0f64, |m, s| m.max(s.max_ratio));
    let failures = cmp.failures();
    ensure(failures.is_empty(), || {
        format!("{label}: other tokens:\n  {}", failures.join("\n  "))
    })?;
    // Non-finite where the reference is.
    let want = reference::reference(&data);
    let mut pairs: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
    let bf = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let per_token =
        |pick: &dyn Fn(usize) -> Vec<f64>| -> Vec<f64> { (0..p.tokens()).flat_map(pick).collect() };
    pairs.push((
        "x_in",
        bf(&out.x_in),
        per_token(&|i| want.forward[i].x_in.clone()),
    ));
    pairs.push((
        "x_next",
        bf(&out.x_next),
        per_token(&|i| want.forward[i].x_next.clone()),
    ));
    pairs.push((
        "h_pre",
        f(&out.h_pre),
        per_token(&|i| want.forward[i].h_pre.clone()),
    ));
    pairs.push((
        "h_post",
        f(&out.h_post),
        per_token(&|i| want.forward[i].h_post.clone()),
    ));
    pairs.push((
        "h_res",
        f(&out.h_res),
        per_token(&|i| want.forward[i].h_res.clone()),
    ));
    pairs.push((
        "hproj",
        f(&out.hproj),
        per_token(&|i| want.forward[i].hproj.clone()),
    ));
    pairs.push((
        "rms",
        f(&out.rms),
        per_token(&|i| vec![want.forward[i].rms]),
    ));
    pairs.push((
        "dx",
        bf(&out.dx),
        per_token(&|i| want.backward[i].dx.clone()),
    ));
    pairs.push((
        "dy",
        bf(&out.dy),
        per_token(&|i| want.backward[i].dy.clone()),
    ));
    pairs.push(("dphi", f(&out.dphi), want.grads.dphi.clone()));
    if let (Some(got), Some(w)) = (&out.dgamma, &want.grads.dgamma) {
        pairs.push(("dgamma", f(got), w.clone()));
    }
    pairs.push(("dalpha", f(&out.dalpha), want.grads.dalpha.to_vec()));
    pairs.push(("dbias", f(&out.dbias), want.grads.dbias.clone()));
    let mut nonfinite = 0;
    for (name, got, w) in &pairs {
        ensure(got.len() == w.len(), || {
            format!(
                "{label}: {name}: {} values, reference {}",
                got.len(),
                w.len()
            )
        })?;
        for (i, (x, r)) in got.iter().zip(w).enumerate() {
            if !r.is_finite() {
                nonfinite += 1;
                ensure(!x.is_finite(), || {
                    format!("{label}: {name}[{i}] = {x}, reference {r} (non-finite)")
                })?;
            }
        }
    }
    println!(
        "{label}: other tokens within tolerance (at most {worst:.3} of it); {nonfinite} \
         elements non-finite in the reference, all non-finite here"
    );
    ensure(nonfinite > 0, || {
        format!("{label}: the reference has no non-finite output (the case checks nothing)")
    })
}

/// Non-finite values in x (NaN, +-Inf), y, d_xin and d_xnext of single tokens, B = 2, S = 37
/// (two projection token blocks), n = 4, C = 64, with gamma; then a non-finite eps is a typed
/// error.
fn nonfinite_gpu(g: &Gpu) -> TestResult {
    let c = case(2, 37, 4, 64, true, 20);
    let clean = MhcData::random(&c.problem(), c.seed);
    let run = |d: &MhcData| run_gpu(g, d);
    for (tensor, token, element, value) in [
        (Tensor::X, 5, 17, f32::NAN),
        (Tensor::X, 5, 17, f32::INFINITY),
        (Tensor::X, 40, 200, f32::NEG_INFINITY),
        (Tensor::Y, 50, 3, f32::NAN),
        (Tensor::DXin, 70, 9, f32::INFINITY),
        (Tensor::DXnext, 73, 100, f32::NAN),
    ] {
        let poison = Poison {
            tensor,
            token,
            element,
            value,
        };
        nonfinite_case(&format!("GPU {}", g.arch()), &clean, poison, &run)?;
    }
    for eps in [f32::NAN, f32::INFINITY] {
        let mut d = clean.clone();
        d.problem = d.problem.with_eps(eps);
        match MhcDeviceRun::upload(&d) {
            Err(e @ Error::InvalidArgument { .. }) => println!("eps {eps}: {e}"),
            Err(e) => return Err(format!("eps {eps}: unexpected error {e}").into()),
            Ok(_) => return Err(format!("eps {eps}: accepted").into()),
        }
    }
    Ok(())
}

/// The same checks on the kernels' own code in the CPU emulator (small: B = 1, S = 6, n = 2,
/// C = 8, with gamma): NaN in x of one token, +Inf in d_xnext of another. The GPU test covers
/// the rest; this one runs without a GPU, so CI checks the expectations themselves.
fn nonfinite_emulated() -> TestResult {
    let c = case(1, 6, 2, 8, true, 3);
    let clean = MhcData::random(&c.problem(), c.seed);
    for (tensor, token, element, value) in [
        (Tensor::X, 2, 5, f32::NAN),
        (Tensor::DXnext, 4, 11, f32::INFINITY),
    ] {
        let poison = Poison {
            tensor,
            token,
            element,
            value,
        };
        nonfinite_case("emulated", &clean, poison, &run_emulated)?;
    }
    Ok(())
}
