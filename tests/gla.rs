//! GLA forward against the f64 recurrence (`gla::reference::recurrence`).
//!
//! Tolerance: relative L2 error `||x - ref|| / ||ref|| <= 1e-2` for the outputs and for the
//! final states (the bound for bf16 inputs; the kernels round q, k variants, the
//! intra-chunk scores, the state operand and the output to bf16, each a relative 2^-9, so the
//! expected error is a few 1e-3). Every output element must be finite (outputs are poisoned with
//! NaN before the launch, so an unwritten element fails).
//!
//! The same cases run on the CPU through `gla::reference::chunked`, the kernels' algorithm in
//! f32 (chunking, clamping, reference points, `ex2.approx.ftz`'s flush to zero, bf16 roundings,
//! segment passes), so that the algorithm itself is checked here without a GPU; and small cases (`gla/emulated/...`) run
//! the kernels' own code in the CPU emulator (`kernel-emulator`), through the problem's plan
//! (`GlaProblem::plan`, `GlaPlan::run`), the launch sequence of the GPU path, with the same
//! tolerance and guard bands around every buffer (a write outside one fails the test).

// The backward reference's checks (`reference/backward/...`), in a file of their own.
#[path = "gla/backward.rs"]
mod backward;
// The backward kernels' checks (`gla/backward/...`).
#[path = "gla/backward_kernels.rs"]
mod backward_kernels;

use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok, portable_gpu};
use kernels::data::rng;
use kernels::gla::reference::{self, HostInputs, rel_l2};
use kernels::gla::{
    self, G_FLOOR, GlaInputs, GlaKernel, GlaOutputs, GlaProblem, GlaSession, GlaSplitWorkspace,
    GlaTensors, GlaWorkspace, SegmentPlan, Target, plan_segments,
};
use kernels::memory::{download, poisoned, upload};
use kernels::{Arch, Error, Gpu, bf16};
use rand::Rng;

/// The bound on the relative L2 errors.
const TOL: f64 = 1e-2;

/// How the log-decays are drawn.
#[derive(Clone, Copy, Debug)]
enum Decay {
    /// Uniform in `[lo, hi)`.
    Uniform(f32, f32),
    /// Every element equal.
    Const(f32),
    /// Each element -20 with probability 1/4, else uniform in `[-0.1, 0)`: strong and weak
    /// decays mixed within a chunk half.
    Spiky,
    /// -20 everywhere except 0 at position 8 of every 16-token chunk (sequences of one batch
    /// row each): the cross-half scores `(8, 7)` are of order 1 while the cross-half factor
    /// `2^{M_1 - M_0}` is `2^-202`, far below the normal range.
    Gap,
}

#[derive(Clone, Debug)]
struct Case {
    p: GlaProblem,
    decay: Decay,
    init: bool,
    final_state: bool,
    seed: u64,
}

fn case(batch: usize, t: usize, heads: usize, dk: usize, dv: usize, decay: Decay) -> Case {
    Case {
        p: GlaProblem::new(batch, t, heads, dk, dv),
        decay,
        init: true,
        final_state: true,
        seed: (batch * 1_000_003 + t * 7919 + heads * 131 + dk * 17 + dv) as u64,
    }
}

fn name(c: &Case) -> String {
    let p = &c.p;
    let mut s = match &p.cu_seqlens {
        Some(cu) => format!("varlen{}_t{}", cu.len() - 1, p.seq_len),
        None => format!("b{}_t{}", p.batch, p.seq_len),
    };
    s.push_str(&format!("_h{}_dk{}_dv{}", p.heads, p.dk, p.dv));
    s.push_str(&match c.decay {
        Decay::Uniform(lo, hi) => format!("_g[{lo},{hi})"),
        Decay::Const(x) => format!("_g{x}"),
        Decay::Spiky => "_gspiky".to_string(),
        Decay::Gap => "_ggap".to_string(),
    });
    if let Some(l) = p.segment_len {
        s.push_str(&format!("_seg{l}"));
    }
    if !c.init {
        s.push_str("_noinit");
    }
    s
}

fn cases() -> Vec<Case> {
    let slow = Decay::Uniform(-0.05, 0.0);
    let mut v = Vec::new();
    // Lengths of one token, around a step and long, on every head-dimension pair (Dk != Dv included).
    for (dk, dv) in [(64, 64), (128, 128), (64, 128), (128, 64)] {
        for t in [1, 63, 64, 65, 1000] {
            v.push(case(2, t, 2, dk, dv, slow));
        }
    }
    v.push(case(1, 4096, 2, 64, 64, slow));
    v.push(case(1, 4096, 2, 128, 128, Decay::Uniform(-1.0, 0.0)));
    // Decays: none, the strongest exact one, clamped ones, mixed, and positive (growth).
    for d in [
        Decay::Const(0.0),
        Decay::Const(-20.0),
        Decay::Const(-30.0),
        Decay::Spiky,
        Decay::Uniform(-3.0, 0.0),
        Decay::Uniform(0.0, 0.1),
    ] {
        v.push(case(2, 333, 2, 128, 64, d));
        v.push(case(1, 257, 3, 64, 128, d));
    }
    // The case of `gla/sm_80_target` (see `emulated_cases`), and its extreme form.
    v.push(case(1, 65, 2, 64, 128, Decay::Spiky));
    v.push(case(2, 100, 2, 128, 64, Decay::Gap));
    let mut c = case(1, 4096, 1, 128, 128, Decay::Const(0.0));
    c.init = false;
    v.push(c);
    // Without an initial state, and without asking for the final state.
    let mut c = case(2, 100, 2, 64, 64, slow);
    c.init = false;
    c.final_state = false;
    v.push(c);
    // Scale other than the default.
    let mut c = case(1, 77, 2, 64, 64, slow);
    c.p = c.p.with_scale(0.3);
    v.push(c);
    // Variable lengths (packed), with and without forced short segments.
    let lens = [1usize, 15, 16, 17, 100, 333, 64, 1000, 31, 32, 33];
    let mut cu = vec![0usize];
    for l in lens {
        cu.push(cu.last().unwrap() + l);
    }
    for (dk, dv) in [(64, 64), (128, 128), (64, 128)] {
        for seg in [None, Some(64), Some(96)] {
            let mut c = case(1, 0, 2, dk, dv, slow);
            c.p = GlaProblem::varlen(cu.clone(), 2, dk, dv);
            c.p.segment_len = seg;
            c.seed = 4242 + dk as u64 + seg.unwrap_or(0) as u64;
            v.push(c);
        }
    }
    // Sequences split into many segments (the state pass and the combination), strong and no
    // decay.
    for (seg, d) in [
        (32, slow),
        (64, Decay::Const(0.0)),
        (160, Decay::Spiky),
        (320, Decay::Uniform(-1.0, 0.0)),
    ] {
        let mut c = case(2, 1000, 2, 128, 128, d);
        c.p.segment_len = Some(seg);
        v.push(c);
        let mut c = case(3, 513, 2, 64, 64, d);
        c.p.segment_len = Some(seg);
        v.push(c);
    }
    v
}

/// Cases run in the CPU emulator (the kernels' own code; one OS thread per GPU thread, so
/// small): every head-dimension pair, one chunk, a partial step, whole and partial chunks and
/// steps, a sequence split into segments (state pass and combination), variable lengths.
fn emulated_cases() -> Vec<Case> {
    let slow = Decay::Uniform(-0.05, 0.0);
    let mut v = Vec::new();
    for (dk, dv) in [(64, 64), (128, 128), (64, 128), (128, 64)] {
        v.push(case(2, 1, 2, dk, dv, slow));
    }
    v.push(case(1, 17, 2, 64, 64, Decay::Spiky));
    // The case of `gla/sm_80_target`: chunks whose cross-half factor 2^{M_1 - M_0} is below
    // 2^-126 (flushed by ex2.approx.ftz) while k_half1 = k 2^{M_1 - b_s} is not negligible.
    v.push(case(1, 65, 2, 64, 128, Decay::Spiky));
    v.push(case(1, 33, 1, 64, 64, Decay::Gap));
    v.push(case(1, 65, 1, 128, 64, Decay::Uniform(-1.0, 0.0)));
    v.push(case(1, 100, 1, 128, 128, Decay::Uniform(-3.0, 0.0)));
    let mut c = case(1, 64, 1, 64, 128, slow);
    c.init = false;
    c.final_state = false;
    v.push(c);
    // Three segments (32, 32, 1 tokens): gla_states, gla_combine, gla_fwd from seg_init.
    for (dk, dv) in [(64, 64), (128, 128)] {
        let mut c = case(1, 65, 1, dk, dv, slow);
        c.p.segment_len = Some(32);
        v.push(c);
    }
    // Segments of several pipeline steps (64, 64, 22 tokens), strong and mixed decays.
    let mut c = case(1, 150, 1, 64, 64, Decay::Spiky);
    c.p.segment_len = Some(64);
    v.push(c);
    let mut c = case(1, 0, 1, 64, 64, slow);
    c.p = GlaProblem::varlen(vec![0, 1, 17, 50], 1, 64, 64);
    c.p.segment_len = Some(32);
    c.seed = 4343;
    v.push(c);
    v
}

struct Data {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    g: Vec<bf16>,
    init: Option<Vec<f32>>,
}

impl Data {
    fn host(&self) -> HostInputs<'_> {
        HostInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            init_state: self.init.as_deref(),
        }
    }
}

fn data(c: &Case) -> Data {
    let p = &c.p;
    let mut r = rng(c.seed);
    let mut draw = |n: usize, lo: f32, hi: f32| -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(r.random_range(lo..hi)))
            .collect()
    };
    let q = draw(p.qk_len(), -1.0, 1.0);
    let k = draw(p.qk_len(), -1.0, 1.0);
    let v = draw(p.v_len(), -1.0, 1.0);
    let mut r = rng(c.seed ^ 0x9e37_79b9);
    let g = (0..p.qk_len())
        .map(|i| {
            bf16::from_f32(match c.decay {
                Decay::Gap => {
                    let token = i / (p.heads * p.dk) % p.seq_len;
                    if token % 16 == 8 { 0.0 } else { -20.0 }
                }
                Decay::Uniform(lo, hi) => r.random_range(lo..hi),
                Decay::Const(x) => x,
                Decay::Spiky => {
                    if r.random_range(0..4) == 0 {
                        -20.0
                    } else {
                        r.random_range(-0.1..0.0)
                    }
                }
            })
        })
        .collect();
    let init = c.init.then(|| {
        let mut r = rng(c.seed ^ 0x51ed);
        (0..p.state_len())
            .map(|_| r.random_range(-1.0..1.0))
            .collect()
    });
    Data { q, k, v, g, init }
}

fn main() {
    let mut s = Suite::new();
    // The baseline kernels (forced: the automatic choice is the pingpong on sm_90a).
    for mut c in cases() {
        let n = name(&c);
        let cc = c.clone();
        s.cpu(&format!("gla/cpu_chunked/{n}"), move || cpu_chunked(&cc));
        c.p.kernel = GlaKernel::Baseline;
        s.gpu(&format!("gla/gpu/{n}"), Needs::Gpu, move |g| run(g, &c));
    }
    // The warp-specialized pingpong kernels (sm_90a), every case of the baseline's suite.
    // (At dk = dv = 128 an item is half of the value columns.)
    for mut c in cases() {
        let n = name(&c);
        c.p.kernel = GlaKernel::Pingpong;
        s.gpu(&format!("gla/gpu_pingpong/{n}"), Needs::Hopper, move |g| {
            run(g, &c)
        });
    }
    s.gpu("gla/pingpong/state_round_trip", Needs::Hopper, |g| {
        state_round_trip(g, GlaKernel::Pingpong)
    });
    s.gpu("gla/pingpong/deterministic", Needs::Hopper, |g| {
        deterministic(g, GlaKernel::Pingpong)
    });
    s.gpu("gla/pingpong/diag_spiky", Needs::Hopper, |g| {
        diag_spiky_with(g, GlaKernel::Pingpong)
    });
    // The automatic choice: the kernels `GlaKernel::Auto` resolves to on this GPU (the
    // pingpong on sm_90a), on a few cases of the suite (every head-dimension pair, packed
    // sequences, split sequences).
    s.gpu("gla/auto", Needs::Gpu, auto_choice);
    for c in emulated_cases() {
        s.cpu(&format!("gla/emulated/{}", name(&c)), move || emulated(&c));
    }
    backward::register(&mut s);
    backward_kernels::register(&mut s);
    s.cpu("gla/segment_plan", segment_plan);
    s.cpu("gla/rejects_bad_problems", rejects_bad_problems);
    s.gpu("gla/rejects_bad_tensors", Needs::Gpu, rejects_bad_tensors);
    s.gpu("gla/state_round_trip", Needs::Gpu, |g| {
        state_round_trip(g, GlaKernel::Baseline)
    });
    s.gpu("gla/deterministic", Needs::Gpu, |g| {
        deterministic(g, GlaKernel::Baseline)
    });
    s.gpu("gla/diag_spiky", Needs::Gpu, |g| {
        diag_spiky_with(g, GlaKernel::Baseline)
    });
    s.cpu("gla/nonfinite/emulated", nonfinite_emulated);
    s.gpu("gla/nonfinite/gpu", Needs::Gpu, |g| {
        nonfinite_gpu(g, GlaKernel::Baseline)
    });
    // The pingpong kernels load whole TMA boxes, so the rows past a sequence's end hold the
    // next sequence's (here non-finite) tokens: they must not leak.
    s.gpu("gla/pingpong/nonfinite", Needs::Hopper, |g| {
        nonfinite_gpu(g, GlaKernel::Pingpong)
    });
    s.gpu("gla/sm_80_target", Needs::Gpu, |_| match portable_gpu() {
        None => {
            println!("the default target is already sm_80");
            Ok(())
        }
        Some(g) => {
            let mut c = case(2, 1000, 2, 128, 64, Decay::Uniform(-1.0, 0.0));
            c.p.segment_len = Some(128);
            run(g, &c)?;
            run(g, &case(1, 65, 2, 64, 128, Decay::Spiky))?;
            // `Auto` chose the baseline there (above); the pingpong kernels exist only in the
            // sm_90a PTX: a typed error here.
            c.p.kernel = GlaKernel::Pingpong;
            match gpu_forward(g, &c.p, &data(&c), true) {
                Err(Error::Unsupported { .. }) => {
                    println!("pingpong on the sm_80 target: Unsupported, as expected");
                    Ok(())
                }
                Err(e) => Err(format!("pingpong on sm_80: unexpected error {e}").into()),
                Ok(_) => Err("pingpong ran on the sm_80 target".into()),
            }
        }
    });
    s.run()
}

/// Compare against the recurrence; `what` names the result in the printed line.
fn compare(
    what: &str,
    c: &Case,
    exact: &reference::Exact,
    o: &[bf16],
    final_state: Option<&[f32]>,
) -> TestResult {
    let o_err = rel_l2(o.iter().map(|x| x.to_f64()), &exact.o);
    let s_err = final_state.map(|s| rel_l2(s.iter().map(|&x| x as f64), &exact.final_state));
    println!(
        "{what}: rel L2 error o {o_err:.3e}, final state {} (tol {TOL:.0e})",
        s_err.map_or("not asked".to_string(), |e| format!("{e:.3e}"))
    );
    if o_err > TOL {
        diagnose(&c.p, o, &exact.o);
    }
    ensure(o_err <= TOL, || {
        format!(
            "{what} ({}): o rel L2 error {o_err:.3e} > {TOL:.0e}",
            name(c)
        )
    })?;
    ensure(s_err.is_none_or(|e| e <= TOL), || {
        format!(
            "{what} ({}): final state rel L2 error {:.3e} > {TOL:.0e}",
            name(c),
            s_err.unwrap_or(f64::NAN)
        )
    })
}

/// On a failure, where the error is: the worst element, and the relative L2 error by token
/// position in its 16-token chunk, by value-column group of 16 (one warp each), by value column
/// within the group, and by eighth of the token rows (segments), to point at the mapping at
/// fault.
fn diagnose(p: &GlaProblem, got: &[bf16], want: &[f64]) {
    let (h_n, dv, rows) = (p.heads, p.dv, p.rows());
    // Sums of squared error and squared reference per bucket.
    let mut by_pos = vec![[0.0f64; 2]; 16];
    let mut by_warp = vec![[0.0f64; 2]; dv / 16];
    let mut by_col = vec![[0.0f64; 2]; 16];
    let mut by_eighth = vec![[0.0f64; 2]; 8];
    let mut worst = (0usize, -1.0f64);
    for (start, len) in p.sequences() {
        for i in 0..len {
            let t = start + i;
            for h in 0..h_n {
                for e in 0..dv {
                    let at = (t * h_n + h) * dv + e;
                    let (x, w) = (got[at].to_f64(), want[at]);
                    let d = if x.is_finite() {
                        (x - w) * (x - w)
                    } else {
                        f64::INFINITY
                    };
                    if d > worst.1 {
                        worst = (at, d);
                    }
                    for bucket in [
                        &mut by_pos[i % 16],
                        &mut by_warp[e / 16],
                        &mut by_col[e % 16],
                        &mut by_eighth[t * 8 / rows],
                    ] {
                        bucket[0] += d;
                        bucket[1] += w * w;
                    }
                }
            }
        }
    }
    let list = |v: &[[f64; 2]]| {
        v.iter()
            .map(|a| {
                if a[1] > 0.0 {
                    format!("{:.1e}", (a[0] / a[1]).sqrt())
                } else {
                    "-".to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let at = worst.0;
    println!(
        "  worst element: token row {}, head {}, value column {}: got {}, want {:.6}",
        at / dv / h_n,
        at / dv % h_n,
        at % dv,
        got[at],
        want[at]
    );
    println!("  rel L2 by token position in the chunk: {}", list(&by_pos));
    println!("  rel L2 by warp (value columns / 16): {}", list(&by_warp));
    println!("  rel L2 by value column % 16: {}", list(&by_col));
    println!("  rel L2 by eighth of the token rows: {}", list(&by_eighth));
}

/// Multiprocessors of the GPU the CPU runs plan for (an H100/H200).
const CPU_SMS: u32 = 132;

fn cpu_segments(p: &GlaProblem) -> kernels::Result<SegmentPlan> {
    // Without a GPU the automatic choice has no target: an H100/H200's (sm_90a, 132 SMs).
    p.segments(Target {
        arch: Arch::Sm90a,
        multiprocessors: CPU_SMS,
    })
}

fn cpu_chunked(c: &Case) -> TestResult {
    let d = data(c);
    let exact = gpu_ok(reference::recurrence(&c.p, &d.host()))?;
    let segments = gpu_ok(cpu_segments(&c.p))?;
    let got = gpu_ok(reference::chunked(&c.p, &d.host(), &segments))?;
    compare(
        &format!(
            "CPU chunked, {} segments (seed {})",
            segments.segments.len(),
            c.seed
        ),
        c,
        &exact,
        &got.o,
        Some(&got.final_state),
    )
}

fn fail(e: Error) -> kernel_tests::TestFailure {
    format!("{e}").into()
}

/// Run in the CPU emulator through the problem's plan (`GlaProblem::plan`, the launches of
/// `GlaSession::forward`, run by `GlaPlan::run`): host buffers with guard bands, outputs
/// and workspace poisoned with NaN. Also returns the buffers a kernel wrote outside of (their
/// guard bands changed).
fn emulator_forward(
    p: &GlaProblem,
    d: &Data,
    final_state: bool,
) -> kernels::Result<(Run, Vec<&'static str>)> {
    let (mut q, mut k, mut v, mut g) = (
        HostBuf::from_slice(&d.q),
        HostBuf::from_slice(&d.k),
        HostBuf::from_slice(&d.v),
        HostBuf::from_slice(&d.g),
    );
    let mut init = d.init.as_deref().map(HostBuf::from_slice);
    let mut o = HostBuf::filled(p.v_len(), bf16::NAN);
    let mut fs = final_state.then(|| HostBuf::filled(p.state_len(), f32::NAN));
    let tensors = GlaTensors {
        q: q.view(),
        k: k.view(),
        v: v.view(),
        g: g.view(),
        init_state: init.as_mut().map(|b| b.view()),
        o: o.view(),
        final_state: fs.as_mut().map(|b| b.view()),
    };
    // The emulator runs the baseline kernels (those of every target; `Auto` chooses them on
    // sm_80); without a GPU the automatic choice has no SM count: 132 (an H100/H200).
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: CPU_SMS,
    };
    let plan = p.plan(target, &tensors)?;
    let (seg_words, combine_words) = plan.segments.table_words();
    let mut segments = HostBuf::from_slice(&seg_words);
    let mut combine = HostBuf::from_slice(&combine_words);
    let (state, decay) = plan.workspace.unwrap_or((0, 0));
    let mut seg_init = HostBuf::filled(state, f32::NAN);
    let mut delta = HostBuf::filled(state, f32::NAN);
    let mut decay_log2 = HostBuf::filled(decay, f32::NAN);
    let workspace = GlaWorkspace {
        segments: segments.view(),
        split: plan.workspace.map(|_| GlaSplitWorkspace {
            combine: combine.view(),
            seg_init: seg_init.view(),
            delta: delta.view(),
            decay_log2: decay_log2.view(),
        }),
    };
    // SAFETY: every view is a distinct host buffer of the size the problem and plan need,
    // alive for the call; the emulator runs on host memory; the tables hold the plan's words.
    unsafe { plan.run(&Emulator, &workspace)? };
    let guards = [
        ("q", q.guards_intact()),
        ("k", k.guards_intact()),
        ("v", v.guards_intact()),
        ("g", g.guards_intact()),
        (
            "init_state",
            init.as_ref().is_none_or(|b| b.guards_intact()),
        ),
        ("o", o.guards_intact()),
        ("final_state", fs.as_ref().is_none_or(|b| b.guards_intact())),
        ("segment table", segments.guards_intact()),
        ("combination table", combine.guards_intact()),
        ("seg_init", seg_init.guards_intact()),
        ("delta", delta.guards_intact()),
        ("decay_log2", decay_log2.guards_intact()),
    ];
    let outside: Vec<&str> = guards.iter().filter(|g| !g.1).map(|g| g.0).collect();
    Ok((
        Run {
            o: o.to_vec(),
            final_state: fs.as_ref().map(|b| b.to_vec()),
            segments: plan.segments,
            kernel: plan.kernel,
        },
        outside,
    ))
}

fn emulated(c: &Case) -> TestResult {
    let d = data(c);
    let (r, outside) = emulator_forward(&c.p, &d, c.final_state).map_err(fail)?;
    let exact = gpu_ok(reference::recurrence(&c.p, &d.host()))?;
    let mirror = gpu_ok(reference::chunked(&c.p, &d.host(), &r.segments))?;
    let mirror_o: Vec<f64> = mirror.o.iter().map(|x| x.to_f64()).collect();
    println!(
        "  {}: rel L2 distance of o to the CPU run of the algorithm {:.3e}",
        name(c),
        rel_l2(r.o.iter().map(|x| x.to_f64()), &mirror_o)
    );
    let checked = compare(
        &format!(
            "emulated, {} segments (seed {})",
            r.segments.segments.len(),
            c.seed
        ),
        c,
        &exact,
        &r.o,
        r.final_state.as_deref(),
    );
    ensure(outside.is_empty(), || {
        format!("a kernel wrote outside these buffers (guard bands changed): {outside:?}")
    })?;
    checked
}

/// Upload, run on the GPU (outputs poisoned), download: (o, final state).
fn gpu_forward(g: &Gpu, p: &GlaProblem, d: &Data, final_state: bool) -> kernels::Result<Run> {
    let stream = g.stream()?;
    let (dq, dk, dv, dg) = (upload(&d.q)?, upload(&d.k)?, upload(&d.v)?, upload(&d.g)?);
    let dinit = d.init.as_deref().map(upload).transpose()?;
    let mut o = poisoned::<bf16>(p.v_len())?;
    let mut fs = if final_state {
        Some(poisoned::<f32>(p.state_len())?)
    } else {
        None
    };
    let mut session = GlaSession::new(g, p)?;
    session.forward(
        g,
        &stream,
        &GlaInputs {
            q: &dq,
            k: &dk,
            v: &dv,
            g: &dg,
            init_state: dinit.as_ref(),
        },
        &mut GlaOutputs {
            o: &mut o,
            final_state: fs.as_mut(),
        },
    )?;
    g.sync(&stream, "GLA forward")?;
    Ok(Run {
        o: download(&o)?,
        final_state: fs.as_ref().map(download).transpose()?,
        segments: session.segments().clone(),
        kernel: session.kernel(),
    })
}

struct Run {
    o: Vec<bf16>,
    final_state: Option<Vec<f32>>,
    segments: SegmentPlan,
    /// The kernels that ran (the problem's choice, `Auto` resolved).
    kernel: GlaKernel,
}

fn run(g: &Gpu, c: &Case) -> TestResult {
    run_checked(g, c).map(|_| ())
}

/// [`run`], returning the kernels that ran.
fn run_checked(g: &Gpu, c: &Case) -> Result<GlaKernel, kernel_tests::TestFailure> {
    let d = data(c);
    let r = gpu_ok(gpu_forward(g, &c.p, &d, c.final_state))?;
    let exact = gpu_ok(reference::recurrence(&c.p, &d.host()))?;
    // Diagnostic: distance to the CPU run of the same algorithm on the same segments.
    let mirror = gpu_ok(reference::chunked(&c.p, &d.host(), &r.segments))?;
    let mirror_o: Vec<f64> = mirror.o.iter().map(|x| x.to_f64()).collect();
    println!(
        "  {}: {:?} kernels, {} segments; rel L2 distance of o to the CPU run of the algorithm \
         {:.3e}",
        name(c),
        r.kernel,
        r.segments.segments.len(),
        rel_l2(r.o.iter().map(|x| x.to_f64()), &mirror_o)
    );
    compare(
        &format!("GPU {} (seed {})", g.arch(), c.seed),
        c,
        &exact,
        &r.o,
        r.final_state.as_deref(),
    )?;
    Ok(r.kernel)
}

/// `GlaKernel::Auto` on this GPU: the pingpong on sm_90a from `PINGPONG_MIN_PAIRS` (sequence,
/// head) pairs up, else the baseline (the session says which ran), within the tolerance on a
/// few cases of the suite on both sides of that bound.
fn auto_choice(g: &Gpu) -> TestResult {
    let slow = Decay::Uniform(-0.05, 0.0);
    let mut cases: Vec<Case> = [(64, 64), (128, 128), (64, 128), (128, 64)]
        .into_iter()
        .map(|(dk, dv)| case(2, 1000, 4, dk, dv, slow))
        .collect();
    cases.push(case(1, 1000, 2, 64, 64, slow));
    let mut c = case(1, 0, 2, 64, 64, slow);
    c.p = GlaProblem::varlen(vec![0, 1, 17, 333, 1333], 2, 64, 64);
    c.seed = 4545;
    cases.push(c);
    let mut c = case(1, 4096, 2, 128, 128, Decay::Spiky);
    c.init = false;
    cases.push(c);
    for c in &cases {
        ensure(c.p.kernel == GlaKernel::Auto, || {
            "not the automatic choice".into()
        })?;
        let want = if g.arch().has_hopper_kernels()
            && c.p.num_seqs() * c.p.heads >= kernels::gla::PINGPONG_MIN_PAIRS
        {
            GlaKernel::Pingpong
        } else {
            GlaKernel::Baseline
        };
        let ran = run_checked(g, c)?;
        ensure(ran == want, || {
            format!(
                "{}: Auto ran {ran:?} on {}, expected {want:?}",
                name(c),
                g.arch()
            )
        })?;
    }
    Ok(())
}

/// Chunk-channels (per sequence, head, chunk, key channel) whose cross-half factor
/// `2^{M_1 - M_0}` lies below `2^-126` (flushed by `ex2.approx.ftz`), and among them those whose
/// scores `(8, 7)` are of order 1 (`b_8 - b_7 > -1`, log2): where the former kernels lost whole
/// channels of the (half 1, half 0) scores. Chunks start at every 16th token of a sequence
/// (segments start at multiples of 32).
fn cross_half_underflows(p: &GlaProblem, g: &[bf16]) -> (usize, usize) {
    let floor2 = G_FLOOR * std::f32::consts::LOG2_E;
    let (mut all, mut harmful) = (0, 0);
    for (start, len) in p.sequences() {
        for h in 0..p.heads {
            for c0 in (0..len).step_by(16) {
                for d in 0..p.dk {
                    let mut b = [0.0f32; 16];
                    let mut acc = 0.0f32;
                    for (i, bi) in b.iter_mut().enumerate() {
                        if c0 + i < len {
                            let x = g[((start + c0 + i) * p.heads + h) * p.dk + d].to_f32();
                            acc += (x * std::f32::consts::LOG2_E).max(floor2);
                        }
                        *bi = acc;
                    }
                    let m0 = 0.5 * (b[0] + b[7]);
                    let m1 = 0.5 * (b[8] + b[15]);
                    if m1 - m0 < -126.0 {
                        all += 1;
                        if b[8] - b[7] > -1.0 {
                            harmful += 1;
                        }
                    }
                }
            }
        }
    }
    (all, harmful)
}

/// Diagnostic of the spiky-decay defect (o rel L2 ~1e-2 on the H200, concentrated on chunk
/// positions 8-9): runs the cases that showed it, on the default and (where different) the sm_80
/// kernels, and prints for each the error by chunk position against the f64 recurrence, the
/// distance to the CPU model of the algorithm (which flushes like `ex2.approx.ftz`) and how
/// many chunk-channels have a cross-half factor below `2^-126`. With the former kernels the
/// error at positions 8-9 was ~3e-2 (spiky) and ~0.8 (gap); fixed, every position is ~3e-3.
fn diag_spiky_with(g: &Gpu, kernel: GlaKernel) -> TestResult {
    let mut cases = vec![
        case(1, 65, 2, 64, 128, Decay::Spiky),
        case(1, 257, 3, 64, 128, Decay::Spiky),
        case(2, 333, 2, 128, 64, Decay::Spiky),
        case(2, 100, 2, 128, 64, Decay::Gap),
    ];
    let dk = if kernel == GlaKernel::Pingpong {
        64
    } else {
        128
    };
    let mut c = case(2, 1000, 2, dk, 128, Decay::Spiky);
    c.p.segment_len = Some(160);
    cases.push(c);
    for c in &mut cases {
        c.p.kernel = kernel;
    }
    let mut gpus = vec![g];
    if kernel != GlaKernel::Pingpong {
        gpus.extend(portable_gpu());
    }
    let mut worst = 0.0f64;
    for c in &cases {
        let d = data(c);
        let (all, harmful) = cross_half_underflows(&c.p, &d.g);
        println!(
            "{}: {all} chunk-channels with 2^(M1 - M0) < 2^-126, {harmful} of them with \
             order-1 scores (8, 7)",
            name(c)
        );
        let exact = gpu_ok(reference::recurrence(&c.p, &d.host()))?;
        for gpu in &gpus {
            let r = gpu_ok(gpu_forward(gpu, &c.p, &d, c.final_state))?;
            let mirror = gpu_ok(reference::chunked(&c.p, &d.host(), &r.segments))?;
            let mirror_o: Vec<f64> = mirror.o.iter().map(|x| x.to_f64()).collect();
            let o_err = rel_l2(r.o.iter().map(|x| x.to_f64()), &exact.o);
            println!(
                "  GPU {}: o rel L2 {o_err:.3e}, CPU model {:.3e}, GPU to CPU model {:.3e}",
                gpu.arch(),
                rel_l2(mirror_o.iter().copied(), &exact.o),
                rel_l2(r.o.iter().map(|x| x.to_f64()), &mirror_o)
            );
            diagnose(&c.p, &r.o, &exact.o);
            worst = worst.max(o_err);
        }
    }
    ensure(worst <= TOL, || {
        format!("worst o rel L2 error {worst:.3e} > {TOL:.0e}")
    })
}

/// Running two halves with the state carried equals running the whole (and both match the
/// recurrence): the final state of the first half is the initial state of the second.
fn state_round_trip(g: &Gpu, kernel: GlaKernel) -> TestResult {
    let big = if kernel == GlaKernel::Pingpong {
        (64, 128)
    } else {
        (128, 128)
    };
    for (dk, dv, t1, t2, seg) in [
        (big.0, big.1, 500, 500, None),
        (64, 128, 77, 300, Some(64)),
        (128, 64, 16, 1, None),
    ] {
        let heads = 2;
        let mut whole = case(1, t1 + t2, heads, dk, dv, Decay::Uniform(-0.05, 0.0));
        whole.p.segment_len = seg;
        whole.p.kernel = kernel;
        let d = data(&whole);
        let full = gpu_ok(gpu_forward(g, &whole.p, &d, true))?;
        let rows = |x: &[bf16], from: usize, to: usize, w: usize| x[from * w..to * w].to_vec();
        let (wk, wv) = (heads * dk, heads * dv);
        let mut p1 = GlaProblem::new(1, t1, heads, dk, dv).with_kernel(kernel);
        p1.segment_len = seg;
        let mut p2 = GlaProblem::new(1, t2, heads, dk, dv).with_kernel(kernel);
        p2.segment_len = seg;
        let first = Data {
            q: rows(&d.q, 0, t1, wk),
            k: rows(&d.k, 0, t1, wk),
            v: rows(&d.v, 0, t1, wv),
            g: rows(&d.g, 0, t1, wk),
            init: d.init.clone(),
        };
        let a = gpu_ok(gpu_forward(g, &p1, &first, true))?;
        let second = Data {
            q: rows(&d.q, t1, t1 + t2, wk),
            k: rows(&d.k, t1, t1 + t2, wk),
            v: rows(&d.v, t1, t1 + t2, wv),
            g: rows(&d.g, t1, t1 + t2, wk),
            init: a.final_state.clone(),
        };
        let b = gpu_ok(gpu_forward(g, &p2, &second, true))?;
        let joined: Vec<f64> = a.o.iter().chain(&b.o).map(|x| x.to_f64()).collect();
        let whole_o: Vec<f64> = full.o.iter().map(|x| x.to_f64()).collect();
        let whole_s: Vec<f64> = full
            .final_state
            .as_ref()
            .ok_or("final state missing")?
            .iter()
            .map(|&x| x as f64)
            .collect();
        let b_state = b.final_state.as_ref().ok_or("final state missing")?;
        let o_diff = rel_l2(joined, &whole_o);
        let s_diff = rel_l2(b_state.iter().map(|&x| x as f64), &whole_s);
        println!(
            "dk {dk} dv {dv}: halves {t1} + {t2} vs whole: rel L2 difference o {o_diff:.3e}, \
             final state {s_diff:.3e} (tol {TOL:.0e})"
        );
        ensure(o_diff <= TOL && s_diff <= TOL, || {
            format!("halves differ from the whole: o {o_diff:.3e}, state {s_diff:.3e}")
        })?;
        let exact = gpu_ok(reference::recurrence(&whole.p, &d.host()))?;
        let joined_o: Vec<bf16> = a.o.iter().chain(&b.o).copied().collect();
        compare(
            "halves joined",
            &whole,
            &exact,
            &joined_o,
            Some(b_state.as_slice()),
        )?;
    }
    Ok(())
}

fn deterministic(g: &Gpu, kernel: GlaKernel) -> TestResult {
    let dk = if kernel == GlaKernel::Pingpong {
        64
    } else {
        128
    };
    let mut c = case(2, 777, 3, dk, 128, Decay::Uniform(-0.5, 0.0));
    c.p.segment_len = Some(128);
    c.p.kernel = kernel;
    let d = data(&c);
    let a = gpu_ok(gpu_forward(g, &c.p, &d, true))?;
    let b = gpu_ok(gpu_forward(g, &c.p, &d, true))?;
    let same =
        a.o.iter()
            .zip(&b.o)
            .all(|(x, y)| x.to_bits() == y.to_bits())
            && a.final_state
                .iter()
                .flatten()
                .zip(b.final_state.iter().flatten())
                .all(|(x, y)| x.to_bits() == y.to_bits());
    ensure(same, || "two runs on the same inputs differ".into())
}

/// Every segment plan covers each sequence exactly, in order, with whole pipeline steps except
/// at the end, flags on the first and last segments, and the combination table naming exactly
/// the split sequences; the automatic plan also fills at most one wave of blocks.
fn segment_plan() -> TestResult {
    let problems = [
        GlaProblem::new(3, 1000, 2, 64, 64),
        GlaProblem::varlen(vec![0, 1, 33, 64, 1000, 1001], 2, 128, 64),
        GlaProblem::new(1, 31, 1, 64, 64),
        GlaProblem::new(4, 4096, 32, 64, 64),
        GlaProblem::new(1, 16384, 16, 128, 128),
    ];
    for p in problems {
        for seg in [32usize, 64, 96, 256, 4096, usize::MAX] {
            check_plan(&p, &gpu_ok(plan_segments(&p, seg))?)?;
        }
        for slots in [1usize, 132, 264, 396, 100_000] {
            let plan = gpu_ok(gla::plan_auto(&p, slots))?;
            check_plan(&p, &plan)?;
            let blocks = plan.segments.len() * p.heads;
            ensure(blocks <= slots.max(p.num_seqs() * p.heads), || {
                format!("{p:?}: {blocks} blocks for {slots} slots")
            })?;
            ensure(
                plan.segments
                    .iter()
                    .all(|s| s.flags & 2 != 0 || s.len as usize >= gla::MIN_AUTO_SEGMENT),
                || format!("{p:?}: a split segment shorter than the minimum"),
            )?;
        }
    }
    // The benchmark's configurations on an H100/H200 (132 SMs): one wave (of the baseline's
    // blocks, three per SM at D = 64 and one at D = 128, or of the pingpong's items, two per SM
    // at D = 64 and one (segment, head) per SM at D = 128).
    for (p, slots, want) in [
        (GlaProblem::new(4, 4096, 32, 64, 64), 3 * 132, 3 * 128),
        (GlaProblem::new(4, 4096, 32, 64, 64), 2 * 132, 2 * 128),
        (GlaProblem::new(2, 8192, 16, 128, 128), 132, 128),
        (GlaProblem::new(1, 16384, 16, 128, 128), 132, 128),
    ] {
        let blocks = gpu_ok(gla::plan_auto(&p, slots))?.segments.len() * p.heads;
        println!("{p:?}: {blocks} blocks for {slots} slots");
        ensure(blocks == want, || {
            format!("{blocks} blocks, expected {want}")
        })?;
    }
    Ok(())
}

fn check_plan(p: &GlaProblem, plan: &SegmentPlan) -> TestResult {
    let mut i = 0;
    for (n, (start, len)) in p.sequences().into_iter().enumerate() {
        let first = i;
        let mut at = start;
        while at < start + len {
            let s = plan.segments.get(i).ok_or("segment table too short")?;
            ensure(
                s.start as usize == at && s.seq as usize == n && s.len >= 1,
                || format!("segment {i} = {s:?}, expected start {at}, seq {n}"),
            )?;
            let last = at + s.len as usize == start + len;
            ensure(last || s.len % 32 == 0, || {
                format!("segment {i} = {s:?}: not a multiple of 32")
            })?;
            ensure(
                (s.flags & 1 != 0) == (i == first) && (s.flags & 2 != 0) == last,
                || format!("segment {i} = {s:?}: flags"),
            )?;
            at += s.len as usize;
            i += 1;
        }
        let count = i - first;
        let entry = plan.combine.iter().find(|e| e.seq as usize == n);
        ensure(
            match entry {
                None => count == 1,
                Some(e) => e.first as usize == first && e.count as usize == count,
            },
            || format!("sequence {n}: combine entry {entry:?}, {count} segments"),
        )?;
    }
    ensure(i == plan.segments.len(), || {
        "segments past the sequences".into()
    })
}

fn expect_err(what: &str, r: kernels::Result<()>, ok: impl Fn(&Error) -> bool) -> TestResult {
    match r {
        Err(e) if ok(&e) => {
            println!("{what}: {e}");
            Ok(())
        }
        other => Err(format!("{what}: expected a typed error, got {other:?}").into()),
    }
}

fn rejects_bad_problems() -> TestResult {
    let base = GlaProblem::new(2, 64, 2, 64, 64);
    let bad = |f: fn(&mut GlaProblem)| {
        let mut p = base.clone();
        f(&mut p);
        p.validate()
    };
    let unsupported = |e: &Error| matches!(e, Error::Unsupported { .. });
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument { .. });
    expect_err("dk 96", bad(|p| p.dk = 96), unsupported)?;
    expect_err("dv 256", bad(|p| p.dv = 256), unsupported)?;
    expect_err("batch 0", bad(|p| p.batch = 0), invalid)?;
    expect_err("seq_len 0", bad(|p| p.seq_len = 0), invalid)?;
    expect_err("heads 0", bad(|p| p.heads = 0), invalid)?;
    expect_err("scale NaN", bad(|p| p.scale = Some(f32::NAN)), invalid)?;
    expect_err("segment 33", bad(|p| p.segment_len = Some(33)), invalid)?;
    expect_err(
        "cu_seqlens with batch 2",
        bad(|p| p.cu_seqlens = Some(vec![0, 64])),
        invalid,
    )?;
    let varlen = |cu: Vec<usize>| GlaProblem::varlen(cu, 2, 64, 64).validate();
    expect_err("cu_seqlens not from 0", varlen(vec![1, 10]), invalid)?;
    expect_err("empty sequence", varlen(vec![0, 10, 10, 20]), invalid)?;
    let mut p = GlaProblem::varlen(vec![0, 10, 20], 2, 64, 64);
    p.seq_len = 30;
    expect_err("cu_seqlens end != seq_len", p.validate(), |e| {
        matches!(e, Error::ShapeMismatch { .. })
    })?;
    // Host inputs of the wrong size.
    let c = case(1, 40, 2, 64, 64, Decay::Const(0.0));
    let d = data(&c);
    let short = HostInputs {
        q: &d.q[1..],
        ..d.host()
    };
    expect_err(
        "short q",
        reference::recurrence(&c.p, &short).map(|_| ()),
        |e| matches!(e, Error::ShapeMismatch { .. }),
    )?;
    let wrong_init = vec![0.0f32; 3];
    let bad_init = HostInputs {
        init_state: Some(&wrong_init),
        ..d.host()
    };
    expect_err(
        "short initial state",
        reference::recurrence(&c.p, &bad_init).map(|_| ()),
        |e| matches!(e, Error::ShapeMismatch { .. }),
    )?;
    // Positive decays are allowed (documented: computed, without the stability guarantees).
    ensure(base.validate().is_ok() && G_FLOOR == -20.0, || {
        "the base problem must validate".into()
    })
}

fn rejects_bad_tensors(g: &Gpu) -> TestResult {
    let p = GlaProblem::new(1, 64, 2, 64, 128);
    let stream = gpu_ok(g.stream())?;
    let qk = gpu_ok(upload(&vec![bf16::ONE; p.qk_len()]))?;
    let vv = gpu_ok(upload(&vec![bf16::ONE; p.v_len()]))?;
    let short = gpu_ok(upload(&vec![bf16::ONE; p.qk_len() - 1]))?;
    let state_bad = gpu_ok(upload(&vec![0.0f32; p.state_len() + 1]))?;
    let mut o = gpu_ok(poisoned::<bf16>(p.v_len()))?;
    let mut o_short = gpu_ok(poisoned::<bf16>(p.v_len() - 8))?;
    let mut fs_bad = gpu_ok(poisoned::<f32>(p.state_len() - 1))?;
    let mut session = gpu_ok(GlaSession::new(g, &p))?;
    let shape = |e: &Error| matches!(e, Error::ShapeMismatch { .. });
    let inputs = |q, k, v, gg, init| GlaInputs {
        q,
        k,
        v,
        g: gg,
        init_state: init,
    };
    expect_err(
        "short k",
        session.forward(
            g,
            &stream,
            &inputs(&qk, &short, &vv, &qk, None),
            &mut GlaOutputs {
                o: &mut o,
                final_state: None,
            },
        ),
        shape,
    )?;
    expect_err(
        "v with dk elements",
        session.forward(
            g,
            &stream,
            &inputs(&qk, &qk, &qk, &qk, None),
            &mut GlaOutputs {
                o: &mut o,
                final_state: None,
            },
        ),
        shape,
    )?;
    expect_err(
        "short o",
        session.forward(
            g,
            &stream,
            &inputs(&qk, &qk, &vv, &qk, None),
            &mut GlaOutputs {
                o: &mut o_short,
                final_state: None,
            },
        ),
        shape,
    )?;
    expect_err(
        "initial state of the wrong size",
        session.forward(
            g,
            &stream,
            &inputs(&qk, &qk, &vv, &qk, Some(&state_bad)),
            &mut GlaOutputs {
                o: &mut o,
                final_state: None,
            },
        ),
        shape,
    )?;
    expect_err(
        "final state of the wrong size",
        session.forward(
            g,
            &stream,
            &inputs(&qk, &qk, &vv, &qk, None),
            &mut GlaOutputs {
                o: &mut o,
                final_state: Some(&mut fs_bad),
            },
        ),
        shape,
    )?;
    expect_err(
        "dk 96 session",
        GlaSession::new(g, &GlaProblem::new(1, 64, 2, 96, 64)).map(|_| ()),
        |e| matches!(e, Error::Unsupported { .. }),
    )?;
    // Nothing was launched by the rejected calls: o is still poisoned.
    gpu_ok(g.sync(&stream, "GLA rejected launches"))?;
    let o_host = gpu_ok(download(&o))?;
    ensure(o_host.iter().all(|x| x.is_nan()), || {
        "a rejected call wrote the output".into()
    })?;
    // gla::forward_sync validates the same way.
    expect_err(
        "forward_sync with a short q",
        gla::forward_sync(
            g,
            &stream,
            &p,
            &inputs(&short, &qk, &vv, &qk, None),
            &mut GlaOutputs {
                o: &mut o,
                final_state: None,
            },
        ),
        shape,
    )
}

// ---------------------------------------------------------------------------------------------
// NaN and Inf inputs (README, "Limits, NaN and Inf").

/// The input tensor that receives a non-finite value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tensor {
    Q,
    K,
    V,
    G,
    Init,
}

/// One non-finite element: tensor, sequence, head, token within the sequence (ignored for the
/// initial state), value.
#[derive(Clone, Copy, Debug)]
struct Poison {
    tensor: Tensor,
    seq: usize,
    head: usize,
    token: usize,
    value: f32,
}

/// The key channel and value column that receive the value.
const POISON_KEY: usize = 5;
const POISON_VALUE: usize = 7;

impl Poison {
    /// The flat index of the element in its tensor.
    fn index(&self, p: &GlaProblem) -> usize {
        let (start, _) = p.sequences()[self.seq];
        let row = (start + self.token) * p.heads + self.head;
        match self.tensor {
            Tensor::Q | Tensor::K | Tensor::G => row * p.dk + POISON_KEY,
            Tensor::V => row * p.dv + POISON_VALUE,
            Tensor::Init => {
                ((self.seq * p.heads + self.head) * p.dk + POISON_KEY) * p.dv + POISON_VALUE
            }
        }
    }

    /// `d` with the element set to `value`.
    fn apply(&self, p: &GlaProblem, d: &Data, value: f32) -> Data {
        let i = self.index(p);
        let mut d = Data {
            q: d.q.clone(),
            k: d.k.clone(),
            v: d.v.clone(),
            g: d.g.clone(),
            init: d.init.clone(),
        };
        let x = bf16::from_f32(value);
        match self.tensor {
            Tensor::Q => d.q[i] = x,
            Tensor::K => d.k[i] = x,
            Tensor::V => d.v[i] = x,
            Tensor::G => d.g[i] = x,
            Tensor::Init => d.init.as_mut().expect("cases with an initial state")[i] = value,
        }
        d
    }

    /// A log-decay the kernels' clamp reads as `G_FLOOR`: `max(g log2 e, G_FLOOR log2 e)` returns
    /// its non-NaN operand, so NaN and -Inf both become the floor.
    fn clamped(&self) -> bool {
        self.tensor == Tensor::G && (self.value.is_nan() || self.value == f32::NEG_INFINITY)
    }

    /// The first token (in the sequence) of the 16-token chunk that holds the element: outputs
    /// of this sequence and head before it must be untouched (0 for the initial state).
    fn first_touched(&self) -> usize {
        match self.tensor {
            Tensor::Init => 0,
            _ => self.token / 16 * 16,
        }
    }
}

/// The documented behaviour of the kernels on one non-finite input element (README, "Limits,
/// NaN and Inf"), checked on the outputs of `run` (the GPU or the emulator):
/// - NaN or -Inf in `g` is read as `G_FLOOR` (the clamp): every output and final state matches
///   the recurrence on the inputs with that element set to -20, within [`TOL`];
/// - otherwise (q, k, v, +Inf in g, the initial state): the outputs of every other (sequence,
///   head) and of the chunks of 16 tokens before the element's chunk, and the final states of
///   every other (sequence, head), are finite and match the recurrence within [`TOL`] (relative
///   L2 over them); every output and final-state element that the recurrence (on the poisoned
///   inputs) makes non-finite is non-finite, and there is at least one. Elements of the
///   element's chunk before it may be non-finite (the chunk's products multiply masked entries
///   by zero): counted, not required.
fn nonfinite_case(
    what: &str,
    c: &Case,
    poison: Poison,
    run: &dyn Fn(&GlaProblem, &Data) -> kernels::Result<Run>,
) -> TestResult {
    let p = &c.p;
    let clean = data(c);
    let d = poison.apply(p, &clean, poison.value);
    let r = gpu_ok(run(p, &d))?;
    let state = r.final_state.as_deref().ok_or("final state missing")?;
    let label = format!("{what} {poison:?}");
    if poison.clamped() {
        let floor = poison.apply(p, &clean, G_FLOOR);
        let exact = gpu_ok(reference::recurrence(p, &floor.host()))?;
        return compare(
            &format!("{label} (read as g = {G_FLOOR})"),
            c,
            &exact,
            &r.o,
            Some(state),
        );
    }
    let exact = gpu_ok(reference::recurrence(p, &d.host()))?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let (mut got_s, mut want_s) = (Vec::new(), Vec::new());
    let mut early = 0;
    for (n, (start, len)) in p.sequences().into_iter().enumerate() {
        for h in 0..p.heads {
            let hit = (n, h) == (poison.seq, poison.head);
            for i in 0..len {
                let row = &r.o[((start + i) * p.heads + h) * p.dv..][..p.dv];
                let at = ((start + i) * p.heads + h) * p.dv;
                if !hit || i < poison.first_touched() {
                    got.extend(row.iter().map(|x| x.to_f64()));
                    want.extend_from_slice(&exact.o[at..at + p.dv]);
                } else if i < poison.token && poison.tensor != Tensor::Init {
                    early += row.iter().filter(|x| !x.is_finite()).count();
                }
            }
            let at = (n * p.heads + h) * p.dk * p.dv;
            if !hit {
                got_s.extend(state[at..at + p.dk * p.dv].iter().map(|&x| x as f64));
                want_s.extend_from_slice(&exact.final_state[at..at + p.dk * p.dv]);
            }
        }
    }
    let finite = got.iter().chain(&got_s).all(|x| x.is_finite());
    let (err_o, err_s) = (rel_l2(got.iter().copied(), &want), rel_l2(got_s, &want_s));
    // Every output the recurrence makes non-finite is non-finite here.
    let mut nonfinite = 0;
    let mut missed = None;
    for (i, (x, w)) in r.o.iter().zip(&exact.o).enumerate() {
        if !w.is_finite() {
            nonfinite += 1;
            if x.is_finite() && missed.is_none() {
                missed = Some(format!("o[{i}] = {x}, reference {w}"));
            }
        }
    }
    for (i, (x, w)) in state.iter().zip(&exact.final_state).enumerate() {
        if !w.is_finite() {
            nonfinite += 1;
            if x.is_finite() && missed.is_none() {
                missed = Some(format!("final state[{i}] = {x}, reference {w}"));
            }
        }
    }
    println!(
        "{label}: untouched outputs ({} values) rel L2 {err_o:.3e}, other final states ({} \
         values) {err_s:.3e} (tol {TOL:.0e}), all finite: {finite}; {nonfinite} elements \
         non-finite in the reference, all non-finite here: {}; {early} non-finite outputs of \
         the chunk before the element",
        want.len(),
        want_s.len(),
        missed.is_none()
    );
    ensure(finite && err_o <= TOL && err_s <= TOL, || {
        format!(
            "{label}: untouched outputs rel L2 {err_o:.3e}, final states {err_s:.3e}, all \
             finite: {finite}"
        )
    })?;
    ensure(nonfinite > 0, || {
        format!("{label}: the reference has no non-finite output (the case checks nothing)")
    })?;
    match missed {
        Some(m) => Err(format!("{label}: finite where the reference is not: {m}").into()),
        None => Ok(()),
    }
}

/// Non-finite values in every input, in the middle of a split sequence and at the start of the
/// last sequence (right after a partial chunk of the previous one), packed sequences of 40, 67
/// and 43 tokens, two heads, Dk != Dv, with the automatic plan and with segments of 32 tokens
/// (state pass and combination); then non-finite scales are typed errors.
fn nonfinite_gpu(g: &Gpu, kernel: GlaKernel) -> TestResult {
    let mut c = case(1, 0, 2, 64, 128, Decay::Uniform(-1.0, 0.0));
    c.p = GlaProblem::varlen(vec![0, 40, 107, 150], 2, 64, 128).with_kernel(kernel);
    c.seed = 77;
    let values: [(Tensor, &[f32]); 5] = [
        (Tensor::Q, &[f32::NAN, f32::INFINITY]),
        (Tensor::K, &[f32::NAN, f32::NEG_INFINITY]),
        (Tensor::V, &[f32::NAN, f32::INFINITY]),
        (Tensor::G, &[f32::NAN, f32::NEG_INFINITY, f32::INFINITY]),
        (Tensor::Init, &[f32::NAN, f32::NEG_INFINITY]),
    ];
    let run = |p: &GlaProblem, d: &Data| gpu_forward(g, p, d, true);
    for seg in [None, Some(32)] {
        c.p.segment_len = seg;
        for (seq, head, token) in [(1, 1, 21), (2, 0, 0)] {
            for (tensor, bad) in values {
                for &value in bad {
                    let poison = Poison {
                        tensor,
                        seq,
                        head,
                        token,
                        value,
                    };
                    nonfinite_case(&format!("GPU {} seg {seg:?}", g.arch()), &c, poison, &run)?;
                }
            }
        }
    }
    // Non-finite scales: typed errors before anything is allocated or launched.
    for scale in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let p = GlaProblem::new(1, 64, 2, 64, 64).with_scale(scale);
        expect_err(
            &format!("scale {scale}"),
            GlaSession::new(g, &p).map(|_| ()),
            |e| matches!(e, Error::InvalidArgument { .. }),
        )?;
    }
    Ok(())
}

/// The same checks on the kernels' own code in the CPU emulator (small: two packed sequences of
/// 37 and 23 tokens, segments of 32): NaN in v of a split sequence, +Inf in k at the start of
/// the second sequence (after the first's partial chunk), NaN in g (read as -20). The GPU test
/// covers the rest; this one runs without a GPU, so CI checks the expectations themselves.
fn nonfinite_emulated() -> TestResult {
    let mut c = case(1, 0, 2, 64, 64, Decay::Uniform(-1.0, 0.0));
    c.p = GlaProblem::varlen(vec![0, 37, 60], 2, 64, 64).with_segment_len(32);
    c.seed = 78;
    let run = |p: &GlaProblem, d: &Data| -> kernels::Result<Run> {
        let (r, outside) = emulator_forward(p, d, true)?;
        if outside.is_empty() {
            Ok(r)
        } else {
            Err(Error::invalid(
                "emulated GLA",
                format!("a kernel wrote outside these buffers: {outside:?}"),
            ))
        }
    };
    for (tensor, seq, head, token, value) in [
        (Tensor::V, 0, 1, 20, f32::NAN),
        (Tensor::K, 1, 0, 0, f32::INFINITY),
        (Tensor::G, 0, 0, 3, f32::NAN),
    ] {
        let poison = Poison {
            tensor,
            seq,
            head,
            token,
            value,
        };
        nonfinite_case("emulated", &c, poison, &run)?;
    }
    Ok(())
}
