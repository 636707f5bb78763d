//! The GLA backward kernels against the f64 backward (`gla::reference::backward`):
//! - `.../reverse/...`: the reverse pass alone (`GlaProblem::plan_reverse_pass`, kernels
//!   `gla_bwd_dhdv_dk*_dv*`): dv, the gradient of every sequence's initial state and the stored
//!   gradient at the end of every `G_BLOCK`-token block (`reference::reverse_sweep`, checked
//!   against `reference::backward` on the small cases);
//! - `.../full/...` (emulated) and `gpu/tc/...`: the whole backward as planned by default
//!   (`GlaProblem::plan_backward` in the emulator, `gla::backward` on the GPU: dq, dk, dg by
//!   the chunkwise `gla_bwd_dqkg_tc`); `.../token/...`: the same with the token-by-token
//!   `gla_bwd_dqkg` (`DqkgKernel::TokenByToken`). Each checks dq, dk, dv, dg and the initial
//!   states' gradient against
//!   `reference::backward`, each by its relative L2 error (dg also exactly 0 where
//!   `g < G_FLOOR`). dq, dk and dg accumulate in f32 from the bf16 inputs, G and the segment
//!   states (dq and dk stored in bf16; dg in f32, its sum free of the exactly cancelling
//!   diagonal terms, so it stays accurate where the decays are near the clamp).
//!
//! Tolerance: relative L2 error `||x - ref|| / ||ref|| <= TOL` (1e-2, the forward's: the
//! kernels round their operands (decayed q and k, the transposed scores, dO, G) to bf16, a
//! relative 2^-9 each, accumulate in f32 and store dv in bf16), separately for dv, the inner
//! block gradients (all blocks of all (sequence, head) pairs but each one's last, a copy of
//! dS_final), the last blocks and the initial-state gradients. Outputs and workspace are poisoned with NaN, so an unwritten element fails;
//! emulated runs also check the guard bands around every buffer.

use super::{Case, Data, Decay, TOL, case, data, name};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok};
use kernels::data::rng;
use kernels::exec::OnStream;
use kernels::gla::reference::{ExactInputs, OutputGrads, backward, rel_l2, reverse_sweep};
use kernels::gla::{
    DqkgKernel, G_BLOCK, GlaBackwardSplit, GlaBackwardTensors, GlaBackwardWorkspace, GlaGradients,
    GlaInputs, GlaOutputGrads, GlaProblem, GlaReverseTensors, SegmentPlan, Target, grad_slot,
};
use kernels::memory::{download, poisoned, upload};
use kernels::{Arch, Gpu, bf16};
use rand::Rng;

/// The gradients of the outputs: dO (bf16) and, where the case has a final state, dS_final.
struct OutGrads {
    d_o: Vec<bf16>,
    d_final: Option<Vec<f32>>,
}

fn out_grads(c: &Case) -> OutGrads {
    let p = &c.p;
    let mut r = rng(c.seed ^ 0x2545_f491);
    OutGrads {
        d_o: (0..p.v_len())
            .map(|_| bf16::from_f32(r.random_range(-1.0..1.0)))
            .collect(),
        d_final: c.final_state.then(|| {
            (0..p.state_len())
                .map(|_| r.random_range(-1.0..1.0))
                .collect()
        }),
    }
}

/// What the reverse pass wrote: dv, the initial-state gradients and the workspace's block
/// gradients.
struct ReverseRun {
    segments: SegmentPlan,
    d_v: Vec<bf16>,
    d_init: Vec<f32>,
    grad: Vec<f32>,
}

/// Emulated cases: every head-dimension pair at one token, partial chunks and blocks, several
/// blocks, decays near the clamp and spiky, packed sequences, no final-state gradient, split
/// sequences (segment boundaries inside and at the ends of 64-token blocks).
fn emulated_cases() -> Vec<Case> {
    let slow = Decay::Uniform(-0.5, 0.0);
    let mut v = Vec::new();
    for (dk, dv) in [(64, 64), (128, 128), (64, 128), (128, 64)] {
        v.push(case(2, 1, 2, dk, dv, slow));
    }
    v.push(case(1, 17, 2, 64, 64, Decay::Spiky));
    v.push(case(1, 65, 1, 128, 64, slow));
    v.push(case(1, 130, 1, 64, 128, Decay::Uniform(-20.5, -19.5)));
    v.push(case(1, 100, 1, 128, 128, Decay::Uniform(-3.0, 0.0)));
    let mut c = case(1, 64, 2, 64, 64, slow);
    c.final_state = false;
    v.push(c);
    // Without dS_final dv comes from the chunks' own outputs and the gradients from within
    // the sequence: the transposed scores matter most. Gap: -20 everywhere but 0 at position 8
    // of every chunk, so the cross-half factor 2^{M_1 - M_0} (2^-202) lies far below the
    // normal range while the scores (s = 7, t = 8) are of order 1.
    for d in [Decay::Gap, Decay::Spiky, Decay::Uniform(-3.0, 0.0)] {
        let mut c = case(1, 33, 1, 128, 64, d);
        c.final_state = false;
        v.push(c);
    }
    // Split sequences: segments of 32 (not a multiple of the 64-token blocks) and 64 tokens:
    // gla_bwd_states, gla_bwd_combine, then gla_bwd_dhdv from the segments' end gradients.
    for (dk, dv, seg) in [(64, 64, 32), (128, 128, 32), (64, 128, 64)] {
        let mut c = case(1, 150, 1, dk, dv, Decay::Uniform(-1.0, 0.0));
        c.p.segment_len = Some(seg);
        v.push(c);
    }
    let mut c = case(1, 97, 1, 128, 64, slow);
    c.p.segment_len = Some(32);
    c.final_state = false;
    v.push(c);
    let mut c = case(1, 0, 1, 64, 64, Decay::Spiky);
    c.p = GlaProblem::varlen(vec![0, 1, 17, 50, 130], 1, 64, 64);
    c.p.segment_len = Some(32);
    c.seed = 4343;
    v.push(c);
    let mut c = case(1, 0, 2, 64, 64, slow);
    c.p = GlaProblem::varlen(vec![0, 1, 17, 81, 150], 2, 64, 64);
    c.seed = 9191;
    v.push(c);
    let mut c = case(1, 0, 1, 64, 64, Decay::Spiky);
    c.p = GlaProblem::varlen(vec![0, 1, 2, 66], 1, 64, 64).with_scale(0.37);
    c.seed = 5150;
    v.push(c);
    // Segments of several G_BLOCK-token blocks (the last partial).
    v.push(case(1, 200, 1, 64, 64, Decay::Uniform(-1.0, 0.0)));
    v.push(case(1, 150, 2, 128, 128, Decay::Spiky));
    v.push(case(1, 130, 1, 64, 64, Decay::Uniform(-20.5, -19.5)));
    v
}

/// GPU cases: the forward's grid of lengths on every head-dimension pair, strong and mixed
/// decays, packed sequences, split sequences.
fn gpu_cases() -> Vec<Case> {
    let slow = Decay::Uniform(-0.05, 0.0);
    let mut v = Vec::new();
    for (dk, dv) in [(64, 64), (128, 128), (64, 128), (128, 64)] {
        for t in [1, 63, 64, 65, 1000] {
            v.push(case(2, t, 2, dk, dv, slow));
        }
    }
    v.push(case(1, 4096, 2, 128, 128, Decay::Uniform(-1.0, 0.0)));
    for d in [
        Decay::Const(-20.0),
        Decay::Const(-30.0),
        Decay::Spiky,
        Decay::Uniform(-20.5, -19.5),
        Decay::Uniform(-3.0, 0.0),
    ] {
        v.push(case(2, 300, 2, 64, 64, d));
    }
    let mut c = case(1, 0, 4, 128, 64, slow);
    c.p = GlaProblem::varlen(vec![0, 1, 64, 65, 700, 1000], 4, 128, 64);
    c.seed = 31337;
    v.push(c);
    let mut c = case(2, 200, 2, 64, 128, slow);
    c.final_state = false;
    v.push(c);
    // Explicit splits (the automatic one splits the 4096-token case above on any GPU).
    for (dk, dv, seg) in [(64, 64, 64), (128, 128, 96), (128, 64, 32)] {
        let mut c = case(1, 1000, 2, dk, dv, Decay::Uniform(-0.2, 0.0));
        c.p.segment_len = Some(seg);
        v.push(c);
    }
    v
}

pub fn register(s: &mut Suite) {
    for c in emulated_cases() {
        s.cpu(
            &format!("gla/backward/emulated/reverse/{}", name(&c)),
            move || check(&c, emulator_reverse),
        );
    }
    for c in gpu_cases() {
        s.gpu(
            &format!("gla/backward/gpu/reverse/{}", name(&c)),
            Needs::Gpu,
            move |g| check(&c, |p, d, o| gpu_reverse(g, p, d, o)),
        );
    }
    s.cpu(
        "gla/backward/reverse_rejects_bad_tensors",
        rejects_bad_tensors,
    );
    for c in emulated_full_cases() {
        s.cpu(
            &format!("gla/backward/emulated/full/{}", name(&c)),
            move || check_full(&c, |p, d, o| emulator_full(p, d, o, DqkgKernel::TensorCore)),
        );
    }
    // The token-by-token kernel, on the cases that stress it most (decays near the clamp,
    // split and packed sequences).
    for i in [6, 9, 13, 15] {
        let c = emulated_full_cases().swap_remove(i);
        s.cpu(
            &format!("gla/backward/emulated/token/{}", name(&c)),
            move || {
                check_full(&c, |p, d, o| {
                    emulator_full(p, d, o, DqkgKernel::TokenByToken)
                })
            },
        );
    }
    for (kind, dqkg) in [
        ("tc", DqkgKernel::TensorCore),
        ("token", DqkgKernel::TokenByToken),
    ] {
        for c in gpu_full_cases() {
            s.gpu(
                &format!("gla/backward/gpu/{kind}/{}", name(&c)),
                Needs::Gpu,
                move |g| check_full(&c, |p, d, o| gpu_full(g, p, d, o, dqkg)),
            );
        }
    }
}

/// Emulated cases of the whole backward: every head-dimension pair at one token, partial
/// steps, decays near the clamp, spiky and gapped, no initial state, no final-state gradient,
/// packed sequences (of one token too), split sequences (segments inside and at the ends of
/// 64-token blocks, with and without initial state and final-state gradient), another scale,
/// segments of several 64-token blocks.
fn emulated_full_cases() -> Vec<Case> {
    let slow = Decay::Uniform(-0.5, 0.0);
    let mut v = Vec::new();
    for (dk, dv) in [(64, 64), (128, 128), (64, 128), (128, 64)] {
        v.push(case(2, 1, 2, dk, dv, slow));
    }
    v.push(case(1, 17, 2, 64, 64, Decay::Spiky));
    v.push(case(1, 65, 1, 128, 64, slow));
    v.push(case(1, 40, 1, 64, 128, Decay::Uniform(-20.5, -19.5)));
    let mut c = case(1, 33, 1, 128, 64, Decay::Gap);
    c.final_state = false;
    v.push(c);
    let mut c = case(1, 50, 2, 64, 64, Decay::Uniform(-3.0, 0.0));
    c.init = false;
    v.push(c);
    for (dk, dv, t, seg) in [(64, 64, 150, 32), (128, 128, 70, 32), (64, 128, 150, 64)] {
        let mut c = case(1, t, 1, dk, dv, Decay::Uniform(-1.0, 0.0));
        c.p.segment_len = Some(seg);
        v.push(c);
    }
    let mut c = case(1, 97, 1, 128, 64, slow);
    c.p.segment_len = Some(32);
    c.final_state = false;
    c.init = false;
    v.push(c);
    let mut c = case(1, 0, 1, 64, 64, Decay::Spiky);
    c.p = GlaProblem::varlen(vec![0, 1, 17, 50, 130], 1, 64, 64);
    c.p.segment_len = Some(32);
    c.seed = 4343;
    v.push(c);
    let mut c = case(1, 0, 1, 64, 64, Decay::Spiky);
    c.p = GlaProblem::varlen(vec![0, 1, 2, 66], 1, 64, 64).with_scale(0.37);
    c.seed = 5150;
    v.push(c);
    // Segments of several G_BLOCK-token blocks (the last partial).
    v.push(case(1, 200, 1, 64, 64, Decay::Uniform(-1.0, 0.0)));
    v.push(case(1, 150, 2, 128, 128, Decay::Spiky));
    v.push(case(1, 130, 1, 64, 64, Decay::Uniform(-20.5, -19.5)));
    v
}

/// GPU cases of the whole backward: the reverse pass's grid (lengths on every head-dimension
/// pair, strong, clamped and mixed decays, packed and split sequences), plus no initial state.
fn gpu_full_cases() -> Vec<Case> {
    let mut v: Vec<Case> = gpu_cases()
        .into_iter()
        .filter(|c| c.p.rows() < 4096)
        .collect();
    let mut c = case(1, 2048, 1, 128, 128, Decay::Uniform(-1.0, 0.0));
    c.init = false;
    v.push(c);
    let mut c = case(2, 300, 2, 128, 64, Decay::Spiky);
    c.init = false;
    c.final_state = false;
    v.push(c);
    let mut c = case(1, 0, 2, 64, 64, Decay::Uniform(-0.2, 0.0));
    c.p = GlaProblem::varlen(vec![0, 1, 64, 65, 700, 1000], 2, 64, 64);
    c.p.segment_len = Some(96);
    c.seed = 777;
    v.push(c);
    v
}

/// The gradients a whole backward wrote.
struct FullRun {
    segments: usize,
    d_q: Vec<bf16>,
    d_k: Vec<bf16>,
    d_v: Vec<bf16>,
    d_g: Vec<f32>,
    d_init: Vec<f32>,
}

/// Run the whole backward in the CPU emulator through its plan (`GlaProblem::plan_backward`):
/// host buffers with guard bands, outputs and workspace poisoned with NaN; fails if a kernel
/// wrote outside a buffer.
fn emulator_full(
    p: &GlaProblem,
    d: &Data,
    o: &OutGrads,
    dqkg: DqkgKernel,
) -> kernels::Result<FullRun> {
    let (mut q, mut k, mut v, mut g, mut d_o) = (
        HostBuf::from_slice(&d.q),
        HostBuf::from_slice(&d.k),
        HostBuf::from_slice(&d.v),
        HostBuf::from_slice(&d.g),
        HostBuf::from_slice(&o.d_o),
    );
    let mut init = d.init.as_deref().map(HostBuf::from_slice);
    let mut d_final = o.d_final.as_deref().map(HostBuf::from_slice);
    let mut d_q = HostBuf::filled(p.qk_len(), bf16::NAN);
    let mut d_k = HostBuf::filled(p.qk_len(), bf16::NAN);
    let mut d_v = HostBuf::filled(p.v_len(), bf16::NAN);
    let mut d_g = HostBuf::filled(p.qk_len(), f32::NAN);
    let mut d_init = HostBuf::filled(p.state_len(), f32::NAN);
    let tensors = GlaBackwardTensors {
        q: q.view(),
        k: k.view(),
        v: v.view(),
        g: g.view(),
        init_state: init.as_mut().map(|b| b.view()),
        d_o: d_o.view(),
        d_final_state: d_final.as_mut().map(|b| b.view()),
        d_q: d_q.view(),
        d_k: d_k.view(),
        d_v: d_v.view(),
        d_g: d_g.view(),
        d_init_state: d_init.view(),
    };
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 132,
    };
    let plan = p.plan_backward_with(target, &tensors, dqkg)?;
    let (words, combine_words) = plan.segments.table_words();
    let mut segments = HostBuf::from_slice(&words);
    let mut combine = HostBuf::from_slice(&combine_words);
    let mut grad = HostBuf::filled(plan.grad_len, f32::NAN);
    let (state, decay) = plan.workspace.unwrap_or((0, 0));
    let mut seg_end = HostBuf::filled(state, f32::NAN);
    let mut delta = HostBuf::filled(state, f32::NAN);
    let mut decay_log2 = HostBuf::filled(decay, f32::NAN);
    let mut seg_init = HostBuf::filled(plan.seg_init_len, f32::NAN);
    let workspace = GlaBackwardWorkspace {
        segments: segments.view(),
        grad: grad.view(),
        split: plan.workspace.map(|_| GlaBackwardSplit {
            combine: combine.view(),
            seg_end: seg_end.view(),
            delta: delta.view(),
            decay_log2: decay_log2.view(),
            seg_init: Some(seg_init.view()),
        }),
    };
    // SAFETY: every view is a distinct host buffer of the size the problem and plan need,
    // alive for the call; the emulator runs on host memory; the table holds the plan's words.
    unsafe { plan.run(&Emulator, &workspace)? };
    let intact = q.guards_intact()
        && k.guards_intact()
        && v.guards_intact()
        && g.guards_intact()
        && d_o.guards_intact()
        && init.as_ref().is_none_or(|b| b.guards_intact())
        && d_final.as_ref().is_none_or(|b| b.guards_intact())
        && d_q.guards_intact()
        && d_k.guards_intact()
        && d_v.guards_intact()
        && d_g.guards_intact()
        && d_init.guards_intact()
        && segments.guards_intact()
        && combine.guards_intact()
        && grad.guards_intact()
        && seg_end.guards_intact()
        && delta.guards_intact()
        && decay_log2.guards_intact()
        && seg_init.guards_intact();
    if !intact {
        return Err(kernels::Error::invalid(
            "emulated GLA backward",
            "a kernel wrote outside a buffer (guard bands changed)",
        ));
    }
    Ok(FullRun {
        segments: plan.segments.segments.len(),
        d_q: d_q.to_vec(),
        d_k: d_k.to_vec(),
        d_v: d_v.to_vec(),
        d_g: d_g.to_vec(),
        d_init: d_init.to_vec(),
    })
}

/// Run the whole backward on the GPU through `gla::backward_with` (outputs poisoned).
fn gpu_full(
    gpu: &Gpu,
    p: &GlaProblem,
    d: &Data,
    o: &OutGrads,
    dqkg: DqkgKernel,
) -> kernels::Result<FullRun> {
    let stream = gpu.stream()?;
    let (q, k, v, g) = (upload(&d.q)?, upload(&d.k)?, upload(&d.v)?, upload(&d.g)?);
    let init = d.init.as_deref().map(upload).transpose()?;
    let d_o = upload(&o.d_o)?;
    let d_final = o.d_final.as_deref().map(upload).transpose()?;
    let mut d_q = poisoned::<bf16>(p.qk_len())?;
    let mut d_k = poisoned::<bf16>(p.qk_len())?;
    let mut d_v = poisoned::<bf16>(p.v_len())?;
    let mut d_g = poisoned::<f32>(p.qk_len())?;
    let mut d_init = poisoned::<f32>(p.state_len())?;
    kernels::gla::backward_with(
        gpu,
        &stream,
        p,
        &GlaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            init_state: init.as_ref(),
        },
        &GlaOutputGrads {
            d_o: &d_o,
            d_final_state: d_final.as_ref(),
        },
        &mut GlaGradients {
            d_q: &mut d_q,
            d_k: &mut d_k,
            d_v: &mut d_v,
            d_g: &mut d_g,
            d_init_state: &mut d_init,
        },
        dqkg,
    )?;
    Ok(FullRun {
        segments: p.backward_segments(Target::of(gpu))?.segments.len(),
        d_q: download(&d_q)?,
        d_k: download(&d_k)?,
        d_v: download(&d_v)?,
        d_g: download(&d_g)?,
        d_init: download(&d_init)?,
    })
}

/// Run the whole backward with `run` and compare every gradient with the f64 backward
/// (relative L2 each, `TOL`; dg compared where `g >= G_FLOOR` and required to be exactly 0
/// elsewhere).
fn check_full(
    c: &Case,
    run: impl FnOnce(&GlaProblem, &Data, &OutGrads) -> kernels::Result<FullRun>,
) -> TestResult {
    let p = &c.p;
    let d = data(c);
    let o = out_grads(c);
    let got = gpu_ok(run(p, &d, &o))?;
    let x = ExactInputs::from_host(&d.host());
    let d_o: Vec<f64> = o.d_o.iter().map(|v| v.to_f64()).collect();
    let d_final: Option<Vec<f64>> = o
        .d_final
        .as_ref()
        .map(|f| f.iter().map(|&v| v as f64).collect());
    let dy = OutputGrads {
        d_o: &d_o,
        d_final_state: d_final.as_deref(),
    };
    let want = gpu_ok(backward(p, &x, &dy))?;
    let b = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let eq = rel_l2(b(&got.d_q), &want.dq);
    let ek = rel_l2(b(&got.d_k), &want.dk);
    let ev = rel_l2(b(&got.d_v), &want.dv);
    let eg = rel_l2(got.d_g.iter().map(|&v| v as f64), &want.dg);
    let ei = rel_l2(got.d_init.iter().map(|&v| v as f64), &want.d_init_state);
    let clamped_nonzero =
        d.g.iter()
            .zip(&got.d_g)
            .filter(|(g, dg)| g.to_f32() < kernels::gla::G_FLOOR && **dg != 0.0)
            .count();
    println!(
        "  {}: rel L2 of dq {eq:.3e}, dk {ek:.3e}, dv {ev:.3e}, dg {eg:.3e}, dS_0 {ei:.3e} \
         ({} segments, seed {})",
        name(c),
        got.segments,
        c.seed
    );
    ensure(clamped_nonzero == 0, || {
        format!("{clamped_nonzero} elements of dg nonzero where g < G_FLOOR")
    })?;
    ensure(
        eq <= TOL && ek <= TOL && ev <= TOL && eg <= TOL && ei <= TOL,
        || {
            format!(
                "{}: rel L2 dq {eq:e}, dk {ek:e}, dv {ev:e}, dg {eg:e}, dS_0 {ei:e} > {TOL:e} \
                 (seed {})",
                name(c),
                c.seed
            )
        },
    )
}

/// Run the pass in the CPU emulator through its plan: host buffers with guard bands, outputs and
/// workspace poisoned with NaN; fails if a kernel wrote outside a buffer.
fn emulator_reverse(p: &GlaProblem, d: &Data, o: &OutGrads) -> kernels::Result<ReverseRun> {
    let (mut q, mut k, mut g, mut d_o) = (
        HostBuf::from_slice(&d.q),
        HostBuf::from_slice(&d.k),
        HostBuf::from_slice(&d.g),
        HostBuf::from_slice(&o.d_o),
    );
    let mut d_final = o.d_final.as_deref().map(HostBuf::from_slice);
    let mut d_init = HostBuf::filled(p.state_len(), f32::NAN);
    let mut d_v = HostBuf::filled(p.v_len(), bf16::NAN);
    let tensors = GlaReverseTensors {
        q: q.view(),
        k: k.view(),
        g: g.view(),
        d_o: d_o.view(),
        d_final_state: d_final.as_mut().map(|b| b.view()),
        d_init_state: d_init.view(),
        d_v: d_v.view(),
    };
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 132,
    };
    let plan = p.plan_reverse_pass(target, &tensors)?;
    let (words, combine_words) = plan.segments.table_words();
    let mut segments = HostBuf::from_slice(&words);
    let mut combine = HostBuf::from_slice(&combine_words);
    let mut grad = HostBuf::filled(plan.grad_len, f32::NAN);
    let (state, decay) = plan.workspace.unwrap_or((0, 0));
    let mut seg_end = HostBuf::filled(state, f32::NAN);
    let mut delta = HostBuf::filled(state, f32::NAN);
    let mut decay_log2 = HostBuf::filled(decay, f32::NAN);
    let workspace = GlaBackwardWorkspace {
        segments: segments.view(),
        grad: grad.view(),
        split: plan.workspace.map(|_| GlaBackwardSplit {
            combine: combine.view(),
            seg_end: seg_end.view(),
            delta: delta.view(),
            decay_log2: decay_log2.view(),
            seg_init: None,
        }),
    };
    // SAFETY: every view is a distinct host buffer of the size the problem and plan need,
    // alive for the call; the emulator runs on host memory; the table holds the plan's words.
    unsafe { plan.run(&Emulator, &workspace)? };
    let intact = q.guards_intact()
        && k.guards_intact()
        && g.guards_intact()
        && d_v.guards_intact()
        && d_o.guards_intact()
        && d_final.as_ref().is_none_or(|b| b.guards_intact())
        && d_init.guards_intact()
        && segments.guards_intact()
        && combine.guards_intact()
        && seg_end.guards_intact()
        && delta.guards_intact()
        && decay_log2.guards_intact()
        && grad.guards_intact();
    if !intact {
        return Err(kernels::Error::invalid(
            "emulated GLA backward",
            "a kernel wrote outside a buffer (guard bands changed)",
        ));
    }
    Ok(ReverseRun {
        segments: plan.segments,
        d_v: d_v.to_vec(),
        d_init: d_init.to_vec(),
        grad: grad.to_vec(),
    })
}

/// Run the pass on the GPU (outputs and workspace poisoned).
fn gpu_reverse(gpu: &Gpu, p: &GlaProblem, d: &Data, o: &OutGrads) -> kernels::Result<ReverseRun> {
    let stream = gpu.stream()?;
    let (q, k, g, d_o) = (upload(&d.q)?, upload(&d.k)?, upload(&d.g)?, upload(&o.d_o)?);
    let d_final = o.d_final.as_deref().map(upload).transpose()?;
    let mut d_init = poisoned::<f32>(p.state_len())?;
    let mut d_v = poisoned::<bf16>(p.v_len())?;
    let tensors = GlaReverseTensors {
        q: (&q).into(),
        k: (&k).into(),
        g: (&g).into(),
        d_o: (&d_o).into(),
        d_final_state: d_final.as_ref().map(|b| b.into()),
        d_init_state: (&mut d_init).into(),
        d_v: (&mut d_v).into(),
    };
    let plan = p.plan_reverse_pass(Target::of(gpu), &tensors)?;
    let (words, combine_words) = plan.segments.table_words();
    let segments = upload(&words)?;
    let mut grad = poisoned::<f32>(plan.grad_len)?;
    let mut split = match plan.workspace {
        Some((state, decay)) => Some((
            upload(&combine_words)?,
            poisoned::<f32>(state)?,
            poisoned::<f32>(state)?,
            poisoned::<f32>(decay)?,
        )),
        None => None,
    };
    let workspace = GlaBackwardWorkspace {
        segments: (&segments).into(),
        grad: (&mut grad).into(),
        split: split.as_mut().map(|(c, e, d, l)| GlaBackwardSplit {
            combine: (&*c).into(),
            seg_end: e.into(),
            delta: d.into(),
            decay_log2: l.into(),
            seg_init: None,
        }),
    };
    // SAFETY: every view is a live allocation of this GPU's context, of the size the plan
    // checked; the table holds the plan's words; nothing else touches them until the sync.
    unsafe {
        plan.run(
            &OnStream {
                gpu,
                stream: &stream,
            },
            &workspace,
        )?
    };
    gpu.sync(&stream, "GLA backward reverse pass")?;
    Ok(ReverseRun {
        segments: plan.segments.clone(),
        d_v: download(&d_v)?,
        d_init: download(&d_init)?,
        grad: download(&grad)?,
    })
}

/// Run the pass with `run` and compare with the f64 reference.
fn check(
    c: &Case,
    run: impl FnOnce(&GlaProblem, &Data, &OutGrads) -> kernels::Result<ReverseRun>,
) -> TestResult {
    let p = &c.p;
    let d = data(c);
    let o = out_grads(c);
    let got = gpu_ok(run(p, &d, &o))?;
    let x = ExactInputs::from_host(&d.host());
    let d_o: Vec<f64> = o.d_o.iter().map(|v| v.to_f64()).collect();
    let d_final: Option<Vec<f64>> = o
        .d_final
        .as_ref()
        .map(|f| f.iter().map(|&v| v as f64).collect());
    let dy = OutputGrads {
        d_o: &d_o,
        d_final_state: d_final.as_deref(),
    };
    let (sz, heads) = (p.dk * p.dv, p.heads);
    // Inner blocks (accumulated by the kernel) apart from each sequence's last (a copy of
    // dS_final), so that the copies do not dilute the error.
    let (mut want_g, mut got_g) = (Vec::new(), Vec::new());
    let (mut want_last, mut got_last) = (Vec::new(), Vec::new());
    let mut want_init = vec![0.0f64; p.state_len()];
    let mut want_dv = vec![0.0f64; p.v_len()];
    // The stored gradients: block j of segment `slot` (sequence `seq`, from row `start`) ends
    // at token `start + min(64 (j + 1), len) - 1`, in slot `grad_slot(start, slot, j)`.
    let seqs = p.sequences();
    let mut stored: Vec<Vec<(usize, usize)>> = vec![Vec::new(); seqs.len()];
    for (slot, seg) in got.segments.segments.iter().enumerate() {
        let (start, len) = (seg.start as usize, seg.len as usize);
        for j in 0..len.div_ceil(G_BLOCK as usize) {
            let end = start + (G_BLOCK as usize * (j + 1)).min(len) - 1;
            let at = grad_slot(seg.start, slot as u32, j as u32) as usize;
            stored[seg.seq as usize].push((end - seqs[seg.seq as usize].0, at));
        }
    }
    for (n, &(start, len)) in seqs.iter().enumerate() {
        let ends: Vec<usize> = stored[n].iter().map(|e| e.0).collect();
        for h in 0..heads {
            let sweep = gpu_ok(reverse_sweep(p, &x, &dy, n, h, &ends))?;
            for i in 0..len {
                let at = ((start + i) * heads + h) * p.dv;
                want_dv[at..at + p.dv].copy_from_slice(&sweep.dv[i * p.dv..(i + 1) * p.dv]);
            }
            for (&(end, slot), want) in stored[n].iter().zip(&sweep.at_ends) {
                let at = (slot * heads + h) * sz;
                let got_b = got.grad[at..at + sz].iter().map(|&v| v as f64);
                if end + 1 < len {
                    want_g.extend_from_slice(want);
                    got_g.extend(got_b);
                } else {
                    want_last.extend_from_slice(want);
                    got_last.extend(got_b);
                }
            }
            let at = (n * heads + h) * sz;
            want_init[at..at + sz].copy_from_slice(&sweep.d_init_state);
        }
    }
    // The reference's own gradients are the same (small cases only: it stores every state).
    if p.rows() <= 512 {
        let full = gpu_ok(backward(p, &x, &dy))?;
        let e0 = rel_l2(full.d_init_state.iter().copied(), &want_init);
        let ev = rel_l2(full.dv.iter().copied(), &want_dv);
        ensure(e0 <= 1e-12 && ev <= 1e-12, || {
            format!("reverse_sweep differs from backward: dS_0 {e0:e}, dv {ev:e}")
        })?;
    }
    let ev = rel_l2(got.d_v.iter().map(|v| v.to_f64()), &want_dv);
    let eg = rel_l2(got_g.iter().copied(), &want_g);
    let el = rel_l2(got_last.iter().copied(), &want_last);
    let ei = rel_l2(got.d_init.iter().map(|&v| v as f64), &want_init);
    println!(
        "  {}: rel L2 of dv {ev:.3e}, of the inner block gradients {eg:.3e} ({} blocks), of \
         the last blocks {el:.3e}, of dS_0 {ei:.3e} ({} segments, seed {})",
        name(c),
        want_g.len() / sz,
        got.segments.segments.len(),
        c.seed
    );
    ensure(ev <= TOL && eg <= TOL && el <= TOL && ei <= TOL, || {
        format!(
            "{}: rel L2 dv {ev:e}, inner block gradients {eg:e}, last blocks {el:e}, \
             initial-state gradients {ei:e} > {TOL:e} (seed {})",
            name(c),
            c.seed
        )
    })
}

/// Bad tensors get typed errors from the plan.
fn rejects_bad_tensors() -> TestResult {
    let p = GlaProblem::new(1, 40, 2, 64, 64);
    let qk = || HostBuf::filled(p.qk_len(), bf16::ZERO);
    let (mut q, mut k, mut g) = (qk(), qk(), qk());
    let mut d_o = HostBuf::filled(p.v_len(), bf16::ZERO);
    let mut d_v = HostBuf::filled(p.v_len(), bf16::ZERO);
    let mut short_o = HostBuf::filled(p.v_len() - 1, bf16::ZERO);
    let mut short_v = HostBuf::filled(p.v_len() - 1, bf16::ZERO);
    let mut d_init = HostBuf::filled(p.state_len(), 0.0f32);
    let mut d_init_short = HostBuf::filled(p.state_len() - 1, 0.0f32);
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 132,
    };
    let good = GlaReverseTensors {
        q: q.view(),
        k: k.view(),
        g: g.view(),
        d_o: d_o.view(),
        d_final_state: None,
        d_init_state: d_init.view(),
        d_v: d_v.view(),
    };
    for (what, bad) in [
        (
            "a short dO",
            GlaReverseTensors {
                d_o: short_o.view(),
                ..good
            },
        ),
        (
            "a short dv",
            GlaReverseTensors {
                d_v: short_v.view(),
                ..good
            },
        ),
        (
            "a short initial-state gradient",
            GlaReverseTensors {
                d_init_state: d_init_short.view(),
                ..good
            },
        ),
    ] {
        ensure(p.plan_reverse_pass(target, &bad).is_err(), || {
            format!("{what} was accepted")
        })?;
    }
    let plan = gpu_ok(p.plan_reverse_pass(target, &good))?;
    let (words, _) = plan.segments.table_words();
    let mut segments = HostBuf::from_slice(&words);
    let mut grad = HostBuf::filled(plan.grad_len - 1, 0.0f32);
    let ws = GlaBackwardWorkspace {
        segments: segments.view(),
        grad: grad.view(),
        split: None,
    };
    ensure(plan.launches(&ws).is_err(), || {
        "a short workspace was accepted".to_string()
    })
}
