//! The negative controls (`gpu-kernels/src/negative.rs`): kernels with a deliberate race or
//! aliasing that the checks must catch. The sanitizer passes of `bundle/run.sh` leave these
//! tests out; `bundle/reliability.sh` runs them under racecheck and expects hazards.

use crate::gla_backward::{self, Kernels};
use kernel_abi::smoke::{NEGATIVE_BLOCK_REDUCE_NO_BARRIER, ReduceParams, SMOKE_BLOCK_REDUCE};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{TestResult, check_close, ensure, gpu_ok};
use kernels::Arch;
use kernels::attention::reference::{self as attention_reference, AttentionGrads};
use kernels::attention::{
    self, AttentionBackwardPlan, AttentionBackwardTensors, AttentionProblem, BackwardOptions,
    BackwardWorkspace, Dtype, Target, View,
};
use kernels::exec::OnStream;
use kernels::gla::GlaProblem;
use kernels::memory::{download, poisoned, upload};
use kernels::mhc::Exec;
use kernels::semicrf::{self, SemiCrfProblem};
use kernels::{Gpu, Kernel, Launch, bf16};

pub fn emulated_reduce_barrier_hazard() -> TestResult {
    // The emulator finds the missing barrier whatever the order its threads run in, and the
    // correct kernel (same body, with the barrier) passes on the same input.
    let blocks = 3u32;
    let threads = kernel_abi::smoke::REDUCE_THREADS;
    let data: Vec<f32> = (0..blocks * threads * 2)
        .map(|i| (i % 17) as f32 - 8.0)
        .collect();
    let run = |kernel: &Kernel<ReduceParams>| -> Result<Vec<f32>, String> {
        let mut input = HostBuf::from_slice(&data);
        let mut partial = HostBuf::filled(blocks as usize, f32::NAN);
        let params = kernel_abi::smoke::ReduceParams {
            input: input.view().addr() as *const f32,
            partial: partial.view().addr() as *mut f32,
            n: data.len() as u32,
        };
        let launch = Launch::new(kernel, (blocks, 1, 1), (), params);
        // SAFETY: input holds n f32 and partial one per block, as the kernel requires.
        unsafe { Emulator.launch(&launch) }.map_err(|e| e.to_string())?;
        Ok(partial.to_vec())
    };
    let good = run(&SMOKE_BLOCK_REDUCE).map_err(|e| format!("the correct kernel failed: {e}"))?;
    let want = kernels_testing::smoke::block_reduce_reference(&data, blocks);
    for (b, (x, w)) in good.iter().zip(&want).enumerate() {
        ensure((*x as f64 - w.0).abs() <= 1e-4 * w.1.max(1.0), || {
            format!("block {b}: {x} vs {}", w.0)
        })?;
    }
    let err = run(&NEGATIVE_BLOCK_REDUCE_NO_BARRIER)
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

pub fn reduce_no_barrier_wrong(g: &'static Gpu) -> TestResult {
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

pub fn reduce_no_barrier_racecheck_target(g: &'static Gpu) -> TestResult {
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

pub fn semicrf_aliased_wrong(g: &'static Gpu) -> TestResult {
    // Eight segments per sequence: the aliased kernel loses the counts of the odd ones.
    let p = SemiCrfProblem::new(2, 60, 4, 3).with_checkpoint(8);
    let inp = kernels_testing::semicrf::random_inputs(&p, 21, false);
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

/// The attention backward case of the `dS^T` barrier control: bf16, D = 64 (the kernel the
/// control replaces), two key blocks, two query heads per key/value head and two query blocks
/// each (four steps per block), a causal mask; its inputs (Q, K, V, dO uniform in `[-1, 1)`, O
/// and LSE the f64 reference forward's) and reference gradients.
struct BwdControlCase {
    p: AttentionProblem,
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    o: Vec<bf16>,
    lse: Vec<f32>,
    d_o: Vec<bf16>,
    want: AttentionGrads,
    naive: AttentionGrads,
}

fn bwd_control_case() -> BwdControlCase {
    let mut p = AttentionProblem::new(1, 60, 70, 2, 1, 64, Dtype::Bf16);
    p.causal = true;
    // The control replaces the mma.sync dK/dV kernel: that path on every GPU.
    p.path = attention::Path::MmaSync;
    bwd_case(p)
}

/// The attention backward case of the Hopper ring control: bf16, D = 256 (the kernel the
/// control replaces), 300 query rows and keys, two query heads per key/value head, causal: 5
/// blocks of 64 keys with up to 10 steps each, so each stage of the 2-stage ring is refilled.
fn hopper_control_case() -> BwdControlCase {
    let mut p = AttentionProblem::new(1, 300, 300, 4, 2, 256, Dtype::Bf16);
    p.causal = true;
    p.path = attention::Path::Hopper;
    bwd_case(p)
}

/// Inputs of `p` (Q, K, V, dO uniform in `[-1, 1)`, O and LSE the f64 reference forward's) and
/// its reference gradients.
fn bwd_case(p: AttentionProblem) -> BwdControlCase {
    let (q, k, v) = kernels_testing::attention::random_inputs::<bf16>(&p, 1.0, 31);
    let mut r = kernels::data::rng(32);
    let d_o = kernels::data::uniform_bf16(&mut r, q.len(), -1.0, 1.0);
    let fwd = attention::reference(&p, &q, &k, &v);
    let o = fwd.o.iter().map(|&x| bf16::from_f64(x)).collect();
    let lse = fwd.lse.iter().map(|&x| x as f32).collect();
    let want = attention_reference::backward(&p, &q, &k, &v, &d_o, None);
    let naive = attention::naive_backward_same_precision(&p, &q, &k, &v, &d_o, None);
    BwdControlCase {
        p,
        q,
        k,
        v,
        o,
        lse,
        d_o,
        want,
        naive,
    }
}

/// `max |got - want|` of each of dQ, dK, dV against the reference (infinite for a NaN), and the
/// backward tests' tolerance (`attention::reference::backward_tolerance`).
fn bwd_errors(c: &BwdControlCase, got: [&[bf16]; 3]) -> [(&'static str, f64, f64); 3] {
    let max_diff = |a: &mut dyn Iterator<Item = (f64, f64)>| {
        a.map(|(x, y)| {
            let d = (x - y).abs();
            if d.is_nan() { f64::INFINITY } else { d }
        })
        .fold(0.0, f64::max)
    };
    let refs = [
        ("dQ", &c.want.dq, &c.naive.dq),
        ("dK", &c.want.dk, &c.naive.dk),
        ("dV", &c.want.dv, &c.naive.dv),
    ];
    core::array::from_fn(|i| {
        let (name, w, n) = refs[i];
        let err = max_diff(&mut got[i].iter().map(|x| x.to_f64()).zip(w.iter().copied()));
        let naive = max_diff(&mut n.iter().copied().zip(w.iter().copied()));
        let max_ref = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let tol = attention_reference::backward_tolerance(naive, max_ref);
        (name, err, tol)
    })
}

/// Run `plan` (the library's kernels) or, with `negative`, the `dS^T` barrier control on `exec`.
///
/// # Safety
/// As for `AttentionBackwardPlan::run`.
unsafe fn run_bwd(
    plan: &AttentionBackwardPlan,
    exec: &impl Exec,
    ws: &BackwardWorkspace<'_>,
    negative: bool,
) -> kernels::Result<()> {
    // SAFETY: forwarded to the caller.
    unsafe {
        if negative {
            kernels::negative::attention_backward_no_ds_barrier_run(plan, exec, ws)
        } else {
            plan.run(exec, ws)
        }
    }
}

pub fn emulated_attention_bwd_ds_barrier_hazard() -> TestResult {
    // The emulator finds the missing barrier whatever the order its threads run in, and the
    // correct kernel (same body, with the barrier) passes the reference check on the same input.
    let c = bwd_control_case();
    let p = &c.p;
    let run = |negative: bool, deterministic: bool| -> Result<[Vec<bf16>; 3], String> {
        let (mut q, mut k, mut v, mut o, mut d_o) = (
            HostBuf::from_slice(&c.q),
            HostBuf::from_slice(&c.k),
            HostBuf::from_slice(&c.v),
            HostBuf::from_slice(&c.o),
            HostBuf::from_slice(&c.d_o),
        );
        let mut lse = HostBuf::from_slice(&c.lse);
        let nan = bf16::from_f32(f32::NAN);
        let mut dq = HostBuf::filled(c.q.len(), nan);
        let mut dk = HostBuf::filled(c.k.len(), nan);
        let mut dv = HostBuf::filled(c.k.len(), nan);
        let (qs, ks) = (p.q_shape(), p.kv_shape());
        let tensors = AttentionBackwardTensors {
            q: View::contiguous(q.view(), qs),
            k: View::contiguous(k.view(), ks),
            v: View::contiguous(v.view(), ks),
            o: View::contiguous(o.view(), qs),
            d_o: View::contiguous(d_o.view(), qs),
            lse: lse.view(),
            d_lse: None,
            dq: View::contiguous(dq.view(), qs),
            dk: View::contiguous(dk.view(), ks),
            dv: View::contiguous(dv.view(), ks),
            sinks: None,
            d_sinks: None,
        };
        let target = Target {
            arch: Arch::Sm80,
            multiprocessors: 1,
        };
        let plan = p
            .plan_backward(target, &tensors, BackwardOptions { deterministic })
            .map_err(|e| e.to_string())?;
        let mut delta = HostBuf::filled(plan.delta_len(), f32::NAN);
        let mut accum =
            (plan.dq_accum_len() > 0).then(|| HostBuf::filled(plan.dq_accum_len(), f32::NAN));
        let ws = BackwardWorkspace {
            delta: delta.view(),
            dq_accum: accum.as_mut().map(|a| a.view()),
        };
        // SAFETY: the views cover the host buffers (checked by the plan), which outlive the
        // (synchronous) emulated launches; the workspace is separate memory.
        unsafe { run_bwd(&plan, &Emulator, &ws, negative) }.map_err(|e| e.to_string())?;
        Ok([dq.to_vec(), dk.to_vec(), dv.to_vec()])
    };
    let [dq, dk, dv] = run(false, false).map_err(|e| format!("the correct kernels failed: {e}"))?;
    for (name, err, tol) in bwd_errors(&c, [&dq, &dk, &dv]) {
        println!(
            "emulated attention_bwd_bf16_d64: {name} max error {err:.3e} (tolerance {tol:.3e})"
        );
        ensure(err <= tol, || {
            format!("the correct kernels: {name} max error {err:.3e} > tolerance {tol:.3e}")
        })?;
    }
    let err = run(true, false)
        .err()
        .ok_or("the emulator did not report the missing dS^T barrier")?;
    ensure(err.contains("hazard"), || {
        format!("unexpected failure: {err}")
    })?;
    println!("emulator: {err}");
    // A plan without the kernel the control replaces is a typed error, before any launch.
    let err = run(true, true)
        .err()
        .ok_or("the control ran on a deterministic plan")?;
    ensure(err.contains("replaces attention_bwd_bf16_d64"), || {
        format!("unexpected failure: {err}")
    })
}

pub fn attention_bwd_no_ds_barrier_racecheck_target(g: &'static Gpu) -> TestResult {
    // One small backward with the control for racecheck (bundle/reliability.sh expects hazards
    // here). The test checks what the race leaves alone: dK and dV (which never read the dS^T
    // tile) within the tolerance (every element written: the outputs are poisoned with NaN);
    // dQ's error is printed only.
    let c = bwd_control_case();
    let [dq, dk, dv] = gpu_ok(device_bwd(g, &c, |plan, exec, ws| {
        // SAFETY: `device_bwd` keeps the plan's buffers and workspace alive (apart, as the plan
        // checked) until the stream is synchronized after this launch.
        unsafe { run_bwd(plan, exec, ws, true) }
    }))?;
    let [(_, dq_err, _), dk_check, dv_check] = bwd_errors(&c, [&dq, &dk, &dv]);
    println!("negative_attention_bwd_no_ds_barrier: dQ max error {dq_err:.3e} (racy, not checked)");
    for (name, err, tol) in [dk_check, dv_check] {
        println!(
            "negative_attention_bwd_no_ds_barrier: {name} max error {err:.3e} (tolerance {tol:.3e})"
        );
        ensure(err <= tol, || {
            format!("{name} max error {err:.3e} > tolerance {tol:.3e}")
        })?;
    }
    Ok(())
}

/// The backward of `c` on `g` (bf16 inputs uploaded, outputs and workspace poisoned with NaN,
/// its default options) launched by `launch` on a stream: dQ, dK, dV once it has completed.
/// `launch` receives the plan, the stream and the workspace, all live until it returns and the
/// stream is synchronized.
fn device_bwd(
    g: &'static Gpu,
    c: &BwdControlCase,
    launch: impl Fn(
        &AttentionBackwardPlan,
        &OnStream<'_>,
        &BackwardWorkspace<'_>,
    ) -> kernels::Result<()>,
) -> kernels::Result<[Vec<bf16>; 3]> {
    let p = &c.p;
    let stream = g.stream()?;
    let (q, k, v, o, d_o) = (
        upload(&c.q)?,
        upload(&c.k)?,
        upload(&c.v)?,
        upload(&c.o)?,
        upload(&c.d_o)?,
    );
    let lse = upload(&c.lse)?;
    let (dq, dk, dv) = (
        poisoned::<bf16>(c.q.len())?,
        poisoned::<bf16>(c.k.len())?,
        poisoned::<bf16>(c.k.len())?,
    );
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let tensors = AttentionBackwardTensors {
        q: View::contiguous(&q, qs),
        k: View::contiguous(&k, ks),
        v: View::contiguous(&v, ks),
        o: View::contiguous(&o, qs),
        d_o: View::contiguous(&d_o, qs),
        lse: (&lse).into(),
        d_lse: None,
        dq: View::contiguous(&dq, qs),
        dk: View::contiguous(&dk, ks),
        dv: View::contiguous(&dv, ks),
        sinks: None,
        d_sinks: None,
    };
    let plan = p.plan_backward(Target::of(g), &tensors, BackwardOptions::default())?;
    let delta = poisoned::<f32>(plan.delta_len())?;
    let accum = poisoned::<f32>(plan.dq_accum_len())?;
    let ws = BackwardWorkspace {
        delta: (&delta).into(),
        dq_accum: Some((&accum).into()),
    };
    let exec = OnStream {
        gpu: g,
        stream: &stream,
    };
    launch(&plan, &exec, &ws)?;
    g.sync(&stream, "attention backward (negative control)")?;
    Ok([download(&dq)?, download(&dk)?, download(&dv)?])
}

/// The backward of `c` on `g` through the plan's kernels or, with `negative`, the Hopper ring
/// control in place of its dK/dV/dQ kernel: dQ, dK, dV.
fn hopper_bwd_run(
    g: &'static Gpu,
    c: &BwdControlCase,
    negative: bool,
) -> kernels::Result<[Vec<bf16>; 3]> {
    device_bwd(g, c, |plan, exec, ws| {
        // SAFETY: `device_bwd` keeps the plan's buffers and workspace alive (apart, as the plan
        // checked) until the stream is synchronized after this launch.
        unsafe {
            if negative {
                kernels::negative::attention_backward_hopper_early_empty_run(plan, exec, ws)
            } else {
                plan.run(exec, ws)
            }
        }
    })
}

pub fn attention_bwd_hopper_early_empty_racecheck_target(g: &'static Gpu) -> TestResult {
    // One small backward with the control for racecheck (bundle/reliability.sh expects hazards
    // here). Every gradient may be wrong (the refills race with every read of the stage), so
    // the test checks what does not depend on the timing: the kernel it replaces passes the
    // reference check on the same inputs, the control writes every element (the outputs are
    // poisoned with NaN and the inputs keep every value finite), and a plan without the kernel
    // it replaces is a typed error. The control's errors are printed.
    let c = hopper_control_case();
    let good = gpu_ok(hopper_bwd_run(g, &c, false))?;
    for (name, err, tol) in bwd_errors(&c, [&good[0], &good[1], &good[2]]) {
        ensure(err <= tol, || {
            format!("the replaced kernel: {name} max error {err:.3e} > tolerance {tol:.3e}")
        })?;
    }
    let bad = gpu_ok(hopper_bwd_run(g, &c, true))?;
    for (name, err, _) in bwd_errors(&c, [&bad[0], &bad[1], &bad[2]]) {
        println!("negative_attention_bwd_hopper_early_empty: {name} max error {err:.3e} (racy)");
        ensure(err.is_finite(), || {
            format!("{name}: an element left unwritten or not finite")
        })?;
    }
    let mut other = hopper_control_case();
    other.p.softcap = Some(20.0);
    let err = hopper_bwd_run(g, &other, true)
        .err()
        .ok_or("the control ran in place of the softcap kernel")?
        .to_string();
    ensure(
        err.contains("replaces attention_bwd_hopper_dkdvq_bf16_d256"),
        || format!("unexpected failure: {err}"),
    )
}

/// A case of the GLA backward's carry-barrier control: Dk = Dv = 64 (the kernel the control
/// replaces), initial states and dS_final, decays uniform in `[-1, 0)`.
fn gla_control_case(p: GlaProblem, seed: u64) -> (gla_backward::Case, gla_backward::Data) {
    let c = gla_backward::Case {
        p,
        init: true,
        d_final: true,
        decay: gla_backward::Decay::Uniform(-1.0, 0.0),
        seed,
    };
    let d = gla_backward::Data::random(&c);
    (c, d)
}

pub fn emulated_gla_bwd_carry_barrier_hazard() -> TestResult {
    // The emulator finds the missing barrier whatever the order its threads run in, and the
    // correct kernels (same body, with the barrier) pass the reference check on the same input.
    // One sequence of 150 tokens in one segment: three 64-token blocks in the carry pass.
    let (c, d) = gla_control_case(
        GlaProblem::new(1, 150, 1, 64, 64).with_segment_len(usize::MAX),
        41,
    );
    let want = gpu_ok(d.reference(&c.p))?;
    let got = gpu_ok(gla_backward::emulated(&c.p, &d, Kernels::Library))?;
    let e = gla_backward::Errors::of(&d, &got, &want);
    println!("emulated gla_bwd_dqkg_tc_dk64_dv64: {e}");
    ensure(e.ok(), || format!("the correct kernels: {e}"))?;
    let err = gla_backward::emulated(&c.p, &d, Kernels::NoCarryBarrier)
        .err()
        .ok_or("the emulator did not report the missing carry barrier")?
        .to_string();
    ensure(err.contains("hazard"), || {
        format!("unexpected failure: {err}")
    })?;
    println!("emulator: {err}");
    // A plan without the kernel the control replaces is a typed error, before any launch.
    let (c, d) = gla_control_case(GlaProblem::new(1, 20, 1, 128, 64), 42);
    let err = gla_backward::emulated(&c.p, &d, Kernels::NoCarryBarrier)
        .err()
        .ok_or("the control ran on a Dk = 128 plan")?
        .to_string();
    ensure(err.contains("replaces gla_bwd_dqkg_tc_dk64_dv64"), || {
        format!("unexpected failure: {err}")
    })
}

pub fn gla_bwd_no_carry_barrier_racecheck_target(g: &'static Gpu) -> TestResult {
    // One small backward with the control for racecheck (bundle/reliability.sh expects hazards
    // here). The test checks what the race leaves alone: dq, dk, dv and the initial states'
    // gradient within the tolerance (every element written: the outputs are poisoned); dg's
    // error is printed only.
    let (c, d) = gla_control_case(
        GlaProblem::new(1, 150, 1, 64, 64).with_segment_len(usize::MAX),
        43,
    );
    let want = gpu_ok(d.reference(&c.p))?;
    let got = gpu_ok(gla_backward::on_gpu(g, &c.p, &d, Kernels::NoCarryBarrier))?;
    let e = gla_backward::Errors::of(&d, &got, &want);
    println!("negative_gla_bwd_no_carry_barrier: {e} (dg racy, not checked)");
    let others = [("dq", e.dq), ("dk", e.dk), ("dv", e.dv), ("dS_0", e.d_init)];
    for (name, err) in others {
        ensure(err <= gla_backward::TOL, || {
            format!(
                "{name} rel L2 {err:.3e} > tolerance {:.0e}",
                gla_backward::TOL
            )
        })?;
    }
    Ok(())
}
