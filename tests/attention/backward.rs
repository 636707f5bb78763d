//! Attention backward (`attention::backward`, the `mma.sync` kernels) against the f64 reference
//! `attention::reference::backward`.
//!
//! Inputs: Q, K, V, dO uniform in `[-1, 1)` (dLSE too where the case has it), O and LSE the f64
//! reference forward's (O rounded to the element type, LSE to f32), so that the backward is
//! tested on its own.
//!
//! Tolerance (FlashAttention's rule), per gradient G in dQ, dK, dV:
//! `max |G - ref| <= 2 max |G_naive - ref| + 1e-3 max |ref| + 1e-6`
//! (`attention::reference::backward_tolerance`), where `G_naive` is
//! `attention::naive_backward_same_precision` (the same computation in the input precision);
//! every element finite (outputs are poisoned with NaN before the run), and the dQ rows of rows
//! with no allowed key exactly 0.

use super::name as case_name;
use super::{Case, case, value_dim_case};
use kernel_abi::attention::hopper_bwd::{hopper_bwd_kernel, hopper_bwd_padded_kernel};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok};
use kernels::Arch;
use kernels::attention::reference::{
    AttentionGrads, backward as reference_backward, backward_tolerance, reference,
};
use kernels::attention::{
    self, AttentionBackwardTensors, AttentionElem, AttentionProblem, BackwardOptions,
    BackwardWorkspace, Dtype, HEAD_DIMS, Target, View, naive_backward_same_precision,
};
use kernels::data::rng;
use kernels::exec::OnStream;
use kernels::memory::{download, poisoned, upload};
use kernels::{Gpu, bf16, f16};
use kernels_testing::attention::{BackwardInputs, device_backward as device_backward_host};
use rand::Rng;

#[path = "backward_views.rs"]
mod views;
use views::{raw_api, strided_emulated, strided_views};

/// A backward case: the problem, whether the loss has an LSE term, which mode.
#[derive(Clone)]
struct BwdCase {
    c: Case,
    with_dlse: bool,
    deterministic: bool,
}

fn bwd_name(b: &BwdCase) -> String {
    format!(
        "{}{}_{}",
        case_name(&b.c),
        if b.with_dlse { "_dlse" } else { "" },
        if b.deterministic { "det" } else { "atomic" }
    )
}

/// The inputs of a case: Q, K, V, dO, dLSE, and the forward's O (element type) and LSE.
struct Inputs<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    d_o: Vec<T>,
    d_lse: Option<Vec<f32>>,
    o: Vec<T>,
    lse: Vec<f32>,
}

fn inputs<T: AttentionElem>(b: &BwdCase) -> Inputs<T> {
    let p = &b.c.p;
    let (q, k, v) = kernels_testing::attention::random_inputs::<T>(p, b.c.range, b.c.seed);
    let mut r = rng(b.c.seed ^ 0xd0d0);
    let d_o: Vec<T> = (0..p.o_shape().iter().product::<usize>())
        .map(|_| T::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let fwd = reference(p, &q, &k, &v);
    // dLSE of the rows with no allowed key: NaN and infinities, which must not reach any
    // gradient (such a row contributes nothing).
    let d_lse = b.with_dlse.then(|| {
        (0..p.lse_len())
            .map(|i| {
                let x = r.random_range(-1.0f32..1.0);
                if fwd.lse[i] == f64::NEG_INFINITY {
                    [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][i % 3]
                } else {
                    x
                }
            })
            .collect()
    });
    let o = fwd.o.iter().map(|&x| T::from_f32(x as f32)).collect();
    let lse = fwd.lse.iter().map(|&x| x as f32).collect();
    Inputs {
        q,
        k,
        v,
        d_o,
        d_lse,
        o,
        lse,
    }
}

/// The gradients against the reference with the tolerance of the module documentation.
fn compare<T: AttentionElem>(
    what: &str,
    p: &AttentionProblem,
    x: &Inputs<T>,
    dq: &[T],
    dk: &[T],
    dv: &[T],
) -> TestResult {
    let want = reference_backward(p, &x.q, &x.k, &x.v, &x.d_o, x.d_lse.as_deref());
    let naive = naive_backward_same_precision(p, &x.q, &x.k, &x.v, &x.d_o, x.d_lse.as_deref());
    let max_diff = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let wide = |x: &[T]| -> Vec<f64> { x.iter().map(|x| x.to_f32() as f64).collect() };
    let got = AttentionGrads {
        dq: wide(dq),
        dk: wide(dk),
        dv: wide(dv),
    };
    let mut line = String::new();
    let mut failures = Vec::new();
    for (name, g, w, n) in [
        ("dQ", &got.dq, &want.dq, &naive.dq),
        ("dK", &got.dk, &want.dk, &naive.dk),
        ("dV", &got.dv, &want.dv, &naive.dv),
    ] {
        if let Some(i) = g.iter().position(|x| !x.is_finite()) {
            return Err(format!("{what}: {name}[{i}] = {} (NaN: unwritten?)", g[i]).into());
        }
        let err = max_diff(g, w);
        let naive_err = max_diff(n, w);
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let tol = backward_tolerance(naive_err, scale);
        line.push_str(&format!(
            " {name} {err:.3e} (tol {tol:.3e} = 2 x naive {naive_err:.3e} + 1e-3 x {scale:.2e} \
             + 1e-6);"
        ));
        if err > tol {
            failures.push(format!("{name} max error {err:.3e} > {tol:.3e}"));
        }
    }
    // Rows with no allowed key: dQ exactly 0.
    let d = p.head_dim;
    let mut empty = 0;
    for b in 0..p.batch {
        for i in (0..p.seq_q).filter(|&i| (0..p.seq_k).all(|j| !p.allowed(i, j))) {
            for h in 0..p.heads_q {
                empty += 1;
                let start = ((b * p.seq_q + i) * p.heads_q + h) * d;
                ensure(got.dq[start..start + d].iter().all(|&x| x == 0.0), || {
                    format!("{what}: dQ row (b {b}, i {i}, h {h}) has no allowed key, not 0")
                })?;
            }
        }
    }
    // Keys no query may attend: dK and dV rows exactly 0.
    let mut unseen = 0;
    for b in 0..p.batch {
        for j in (0..p.seq_k).filter(|&j| (0..p.seq_q).all(|i| !p.allowed(i, j))) {
            for h in 0..p.heads_kv {
                unseen += 1;
                let row = |w: usize| ((b * p.seq_k + j) * p.heads_kv + h) * w;
                let zero = |g: &[f64], w: usize| g[row(w)..row(w) + w].iter().all(|&x| x == 0.0);
                ensure(zero(&got.dk, d) && zero(&got.dv, p.v_dim()), || {
                    format!("{what}: dK/dV row (b {b}, j {j}, h {h}) seen by no query, not 0")
                })?;
            }
        }
    }
    println!("{what}: max |G - ref|:{line} {empty} empty rows, {unseen} unseen keys");
    ensure(failures.is_empty(), || {
        format!("{what}: {}", failures.join("; "))
    })
}

/// The backward in the CPU emulator (the `mma.sync` kernels' own code), outputs poisoned.
fn run_emulated<T: AttentionElem>(b: &BwdCase) -> TestResult {
    let p = &b.c.p;
    let x = inputs::<T>(b);
    let what = format!("emulated backward {} (seed {})", bwd_name(b), b.c.seed);
    let (mut q, mut k, mut v, mut o, mut d_o) = (
        HostBuf::from_slice(&x.q),
        HostBuf::from_slice(&x.k),
        HostBuf::from_slice(&x.v),
        HostBuf::from_slice(&x.o),
        HostBuf::from_slice(&x.d_o),
    );
    let mut lse = HostBuf::from_slice(&x.lse);
    let mut d_lse = x.d_lse.as_ref().map(|d| HostBuf::from_slice(d));
    let nan = T::from_f32(f32::NAN);
    let mut dq = HostBuf::filled(x.q.len(), nan);
    let mut dk = HostBuf::filled(x.k.len(), nan);
    let mut dv = HostBuf::filled(x.v.len(), nan);
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let (vs, os) = (p.v_shape(), p.o_shape());
    let tensors = AttentionBackwardTensors {
        q: View::contiguous(q.view(), qs),
        k: View::contiguous(k.view(), ks),
        v: View::contiguous(v.view(), vs),
        o: View::contiguous(o.view(), os),
        d_o: View::contiguous(d_o.view(), os),
        lse: lse.view(),
        d_lse: d_lse.as_mut().map(|d| d.view()),
        dq: View::contiguous(dq.view(), qs),
        dk: View::contiguous(dk.view(), ks),
        dv: View::contiguous(dv.view(), vs),
        sinks: None,
        d_sinks: None,
    };
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 1,
    };
    let options = BackwardOptions {
        deterministic: b.deterministic,
    };
    let plan = p
        .plan_backward(target, &tensors, options)
        .map_err(|e| format!("{what}: {e}"))?;
    let mut delta = HostBuf::filled(plan.delta_len(), f32::NAN);
    let mut accum =
        (plan.dq_accum_len() > 0).then(|| HostBuf::filled(plan.dq_accum_len(), f32::NAN));
    let ws = BackwardWorkspace {
        delta: delta.view(),
        dq_accum: accum.as_mut().map(|a| a.view()),
    };
    // SAFETY: the views cover the host buffers (checked by the plan), which outlive the
    // (synchronous) emulated launches; the workspace is separate memory.
    unsafe { plan.run(&Emulator, &ws) }.map_err(|e| format!("{what}: {e}"))?;
    ensure(
        dq.guards_intact() && dk.guards_intact() && dv.guards_intact() && delta.guards_intact(),
        || format!("{what}: a write outside its buffer"),
    )?;
    compare(&what, p, &x, &dq.to_vec(), &dk.to_vec(), &dv.to_vec())
}

/// Device buffers of a case's inputs and poisoned outputs.
struct DevCase<T: AttentionElem> {
    q: kernels::DeviceBuffer<T>,
    k: kernels::DeviceBuffer<T>,
    v: kernels::DeviceBuffer<T>,
    o: kernels::DeviceBuffer<T>,
    d_o: kernels::DeviceBuffer<T>,
    lse: kernels::DeviceBuffer<f32>,
    d_lse: Option<kernels::DeviceBuffer<f32>>,
}

fn dev_case<T: AttentionElem>(x: &Inputs<T>) -> kernels::Result<DevCase<T>> {
    Ok(DevCase {
        q: upload(&x.q)?,
        k: upload(&x.k)?,
        v: upload(&x.v)?,
        o: upload(&x.o)?,
        d_o: upload(&x.d_o)?,
        lse: upload(&x.lse)?,
        d_lse: x.d_lse.as_ref().map(|d| upload(d)).transpose()?,
    })
}

/// One backward on `stream` with contiguous tensors into fresh poisoned outputs.
fn device_backward<T: AttentionElem>(
    g: &Gpu,
    stream: &kernels::Stream,
    p: &AttentionProblem,
    d: &DevCase<T>,
    options: BackwardOptions,
) -> kernels::Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let (vs, os) = (p.v_shape(), p.o_shape());
    let (dq, dk, dv) = (
        poisoned::<T>(d.q.len())?,
        poisoned::<T>(d.k.len())?,
        poisoned::<T>(d.v.len())?,
    );
    attention::backward(
        g,
        stream,
        p,
        &View::contiguous(&d.q, qs),
        &View::contiguous(&d.k, ks),
        &View::contiguous(&d.v, vs),
        &View::contiguous(&d.o, os),
        &d.lse,
        &View::contiguous(&d.d_o, os),
        d.d_lse.as_ref(),
        &mut View::contiguous(&dq, qs),
        &mut View::contiguous(&dk, ks),
        &mut View::contiguous(&dv, vs),
        options,
    )?;
    Ok((download(&dq)?, download(&dk)?, download(&dv)?))
}

/// Two backward passes of the same problem at once, on two streams (each with its own outputs
/// and workspace), through the plan.
#[allow(clippy::type_complexity)]
fn concurrent_backward<T: AttentionElem>(
    g: &Gpu,
    p: &AttentionProblem,
    d: &DevCase<T>,
    options: BackwardOptions,
) -> kernels::Result<Vec<(Vec<T>, Vec<T>, Vec<T>)>> {
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let (vs, os) = (p.v_shape(), p.o_shape());
    let streams = [g.stream()?, g.stream()?];
    let mut outs = Vec::new();
    for _ in 0..2 {
        outs.push((
            poisoned::<T>(d.q.len())?,
            poisoned::<T>(d.k.len())?,
            poisoned::<T>(d.v.len())?,
        ));
    }
    let mut workspaces = Vec::new();
    for (stream, (dq, dk, dv)) in streams.iter().zip(&outs) {
        let tensors = AttentionBackwardTensors {
            q: View::contiguous(&d.q, qs),
            k: View::contiguous(&d.k, ks),
            v: View::contiguous(&d.v, vs),
            o: View::contiguous(&d.o, os),
            d_o: View::contiguous(&d.d_o, os),
            lse: (&d.lse).into(),
            d_lse: d.d_lse.as_ref().map(|x| x.into()),
            dq: View::contiguous(dq, qs),
            dk: View::contiguous(dk, ks),
            dv: View::contiguous(dv, vs),
            sinks: None,
            d_sinks: None,
        };
        let plan = p.plan_backward(Target::of(g), &tensors, options)?;
        let delta = poisoned::<f32>(plan.delta_len())?;
        let accum = (plan.dq_accum_len() > 0)
            .then(|| poisoned::<f32>(plan.dq_accum_len()))
            .transpose()?;
        let ws = BackwardWorkspace {
            delta: (&delta).into(),
            dq_accum: accum.as_ref().map(|a| a.into()),
        };
        // SAFETY: every buffer lives until both streams are synchronized below; the outputs
        // and workspaces of the two runs are distinct allocations.
        unsafe { plan.run(&OnStream { gpu: g, stream }, &ws) }?;
        workspaces.push((delta, accum));
    }
    for stream in &streams {
        g.sync(stream, "attention backward on two streams")?;
    }
    drop(workspaces);
    outs.iter()
        .map(|(dq, dk, dv)| Ok((download(dq)?, download(dk)?, download(dv)?)))
        .collect()
}

fn run_gpu<T: AttentionElem>(g: &Gpu, b: &BwdCase) -> TestResult {
    let p = &b.c.p;
    let x = inputs::<T>(b);
    let what = format!(
        "backward {} on {} (seed {})",
        bwd_name(b),
        g.arch(),
        b.c.seed
    );
    let host = BackwardInputs {
        q: &x.q,
        k: &x.k,
        v: &x.v,
        o: &x.o,
        lse: &x.lse,
        d_o: &x.d_o,
        d_lse: x.d_lse.as_deref(),
    };
    let options = BackwardOptions {
        deterministic: b.deterministic,
    };
    let (dq, dk, dv) = gpu_ok(device_backward_host(g, p, &host, options))?;
    compare(&what, p, &x, &dq, &dk, &dv)
}

/// Deterministic mode: 20 runs on one stream and 2 on a second stream give bitwise identical
/// gradients (and they match the reference), on a small causal GQA problem and on four with many
/// key blocks per head adding into each dQ tile (D 64 and 128, the ordered dK/dV/dQ kernel on
/// Hopper; D 256 and 160, the ordered wide kernel, 64 keys per block: 24 and 18 key blocks).
/// The default mode's runs on the same inputs are compared too, and how many differ is
/// printed: where they differ, the order is what the deterministic mode fixes.
fn deterministic_bitwise(g: &Gpu) -> TestResult {
    let mut small = case(2, 300, 257, 4, 2, 128, Dtype::Bf16);
    small.p.causal = true;
    let mut long = case(1, 1000, 2048, 8, 2, 64, Dtype::Bf16);
    long.p.window = (Some(700), None);
    let wide = case(1, 513, 1536, 4, 4, 128, Dtype::F16);
    let mut d256 = case(1, 700, 1536, 4, 2, 256, Dtype::Bf16);
    d256.p.causal = true;
    let mut d160 = case(1, 300, 1100, 2, 1, 160, Dtype::F16);
    d160.p.window = (Some(500), Some(64));
    for c in [small, long, wide, d256, d160] {
        let b = BwdCase {
            c,
            with_dlse: true,
            deterministic: true,
        };
        match b.c.p.dtype {
            Dtype::Bf16 => bitwise_runs::<bf16>(g, &b)?,
            Dtype::F16 => bitwise_runs::<f16>(g, &b)?,
        }
    }
    Ok(())
}

/// V, O and dO of their own head dimension (the pairs of `VALUE_DIMS`, the Hopper kernels):
/// lengths from 1 to 1100 (one key block, partial blocks, many key blocks per dQ tile), causal
/// and not, GQA and MQA, a window, rows with no allowed key, a scale of its own, f16.
fn value_dim_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (d, dv) in kernel_abi::attention::VALUE_DIMS {
        let (d, dv) = (d as usize, dv as usize);
        let pair = |b, sq, sk, hq, hkv, dtype| value_dim_case(b, sq, sk, (hq, hkv), (d, dv), dtype);
        for (sq, sk) in [(1, 1), (113, 203), (239, 1), (1023, 1024)] {
            for causal in [false, true] {
                let mut c = pair(
                    if sq * sk < 100_000 { 2 } else { 1 },
                    sq,
                    sk,
                    4,
                    2,
                    Dtype::Bf16,
                );
                c.p.causal = causal;
                v.push(c);
            }
        }
        v.push(pair(2, 257, 300, 8, 1, Dtype::Bf16));
        let mut w = pair(1, 500, 700, 4, 4, Dtype::Bf16);
        w.p.window = (Some(64), Some(32));
        v.push(w);
        let mut m = pair(2, 300, 100, 2, 2, Dtype::Bf16); // 200 rows with no allowed key
        m.p.causal = true;
        v.push(m);
        let mut sc = pair(1, 129, 257, 2, 2, Dtype::Bf16);
        sc.p.scale = Some(0.3);
        v.push(sc);
        let mut f = pair(2, 113, 203, 4, 2, Dtype::F16);
        f.p.causal = true;
        v.push(f);
        v.push(pair(1, 1100, 1100, 4, 2, Dtype::F16));
    }
    v
}

/// The deterministic mode of a pair: bitwise identical gradients over 20 runs on one stream and
/// 2 on a second (as [`deterministic_bitwise`]), 18 key blocks adding into each dQ tile.
fn value_dim_bitwise(g: &Gpu) -> TestResult {
    for (d, dv) in kernel_abi::attention::VALUE_DIMS {
        let mut c = case(1, 700, 1100, 4, 2, d as usize, Dtype::Bf16);
        c.p = c.p.value_dim(dv as usize);
        c.p.causal = true;
        let b = BwdCase {
            c,
            with_dlse: true,
            deterministic: true,
        };
        bitwise_runs::<bf16>(g, &b)?;
    }
    Ok(())
}

fn bitwise_runs<T: AttentionElem>(g: &Gpu, b: &BwdCase) -> TestResult {
    let x = inputs::<T>(b);
    let runs_of = |deterministic: bool| {
        let options = BackwardOptions { deterministic };
        // The stream first: it makes the GPU's context current on this thread.
        let s1 = g.stream()?;
        let d = dev_case(&x)?;
        let mut runs = Vec::new();
        for _ in 0..20 {
            runs.push(device_backward(g, &s1, &b.c.p, &d, options)?);
        }
        runs.extend(concurrent_backward(g, &b.c.p, &d, options)?);
        Ok::<_, kernels::Error>(runs)
    };
    let runs = gpu_ok(runs_of(true))?;
    let atomic = gpu_ok(runs_of(false))?;
    let bits = |x: &[T]| x.iter().map(|v| v.to_f32().to_bits()).collect::<Vec<_>>();
    let same = |r: &(Vec<T>, Vec<T>, Vec<T>), s: &(Vec<T>, Vec<T>, Vec<T>)| {
        bits(&r.0) == bits(&s.0) && bits(&r.1) == bits(&s.1) && bits(&r.2) == bits(&s.2)
    };
    let what = format!("deterministic backward {}", bwd_name(b));
    for (i, r) in runs.iter().enumerate().skip(1) {
        ensure(same(r, &runs[0]), || {
            format!("{what}: run {i} differs from run 0")
        })?;
    }
    let differ = atomic
        .iter()
        .skip(1)
        .filter(|r| !same(r, &atomic[0]))
        .count();
    println!(
        "{what}: 22 runs (20 in turn on one stream, 2 at once on two streams) bitwise \
         identical; the default mode: {differ} of 21 runs differ from its first"
    );
    compare(&what, &b.c.p, &x, &runs[0].0, &runs[0].1, &runs[0].2)
}

/// A backward case.
fn bc(c: Case, with_dlse: bool, deterministic: bool) -> BwdCase {
    BwdCase {
        c,
        with_dlse,
        deterministic,
    }
}

/// Small problems for the emulator (one OS thread per GPU thread): every D with backward kernels,
/// bf16 and f16, causal, window, GQA 2:1, `seq_q != seq_k`, odd lengths, rows with no allowed
/// key.
fn emulated_cases() -> Vec<(Case, bool)> {
    let mut v = Vec::new();
    v.push((case(1, 17, 33, 2, 1, 64, Dtype::Bf16), true));
    let mut c = case(1, 33, 17, 2, 2, 128, Dtype::Bf16); // causal, 16 rows with no key
    c.p.causal = true;
    v.push((c, true));
    let mut c = case(1, 70, 90, 2, 1, 64, Dtype::F16);
    c.p.window = (Some(16), Some(8));
    v.push((c, false));
    let mut c = case(1, 65, 130, 1, 1, 128, Dtype::F16);
    c.p.causal = true;
    v.push((c, true));
    let mut c = case(1, 40, 30, 2, 1, 128, Dtype::Bf16); // diag i - 10: rows 0..10 empty
    c.p.window = (Some(0), Some(0));
    v.push((c, true));
    v.push((case(1, 17, 20, 2, 1, 256, Dtype::Bf16), true));
    // D 96 and 192 (the row kernels' lanes past D / 8, the dQ pass of two n8 tiles).
    let mut c = case(1, 40, 33, 2, 1, 96, Dtype::Bf16);
    c.p.causal = true;
    v.push((c, true));
    v.push((case(1, 33, 40, 2, 2, 96, Dtype::F16), false));
    v.push((case(1, 17, 20, 2, 1, 192, Dtype::Bf16), true));
    v.push((case(1, 20, 17, 1, 1, 192, Dtype::F16), false));
    // Many steps per block: 2 query heads x 4 query blocks for each key block.
    let mut c = case(1, 100, 70, 4, 2, 64, Dtype::Bf16);
    c.p.window = (Some(50), None);
    v.push((c, false));
    // The other dimensions: an odd number of k-slices (48, 80, 112), dK/dV warps of an odd
    // number of column pairs and a dQ pass of one or three n8 tiles (48, 80, 112, 160, 224).
    v.push((case(1, 19, 35, 2, 1, 32, Dtype::Bf16), true));
    let mut c = case(1, 37, 21, 2, 2, 48, Dtype::F16);
    c.p.causal = true;
    v.push((c, false));
    let mut c = case(1, 45, 70, 4, 2, 80, Dtype::Bf16);
    c.p.window = (Some(20), Some(5));
    v.push((c, true));
    v.push((case(1, 33, 17, 2, 1, 112, Dtype::F16), true));
    let mut c = case(1, 21, 40, 2, 1, 160, Dtype::Bf16);
    c.p.causal = true;
    v.push((c, false));
    v.push((case(1, 17, 19, 2, 2, 224, Dtype::F16), true));
    // Halves of D of an odd number of n8 tiles, dQ column groups of unequal widths (144, 176,
    // 208, 240; 240 with steps of 16 keys in the dQ kernel).
    v.push((case(1, 23, 31, 2, 1, 144, Dtype::Bf16), true));
    let mut c = case(1, 35, 19, 2, 2, 176, Dtype::F16);
    c.p.window = (Some(9), Some(2));
    v.push((c, false));
    let mut c = case(1, 18, 33, 2, 1, 208, Dtype::Bf16);
    c.p.causal = true;
    v.push((c, true));
    v.push((case(1, 29, 45, 2, 1, 240, Dtype::F16), false));
    v
}

/// The GPU grid: dtype x D x mask x GQA x odd lengths x mode, and the extra checks.
fn gpu_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in [Dtype::Bf16, Dtype::F16] {
        for d in super::FULL_CASE_DIMS {
            for (sq, sk) in [(1, 1), (113, 203), (239, 17), (300, 300)] {
                for mask in 0..3 {
                    for (hq, hkv) in [(2, 2), (4, 2)] {
                        let mut c = case(1 + (sq < 200) as usize, sq, sk, hq, hkv, d, dtype);
                        match mask {
                            1 => c.p.causal = true,
                            2 => c.p.window = (Some(40), Some(7)),
                            _ => {}
                        }
                        v.push(c);
                    }
                }
            }
        }
    }
    // The other dimensions with backward kernels: both dtypes, two shapes, each mask.
    for d in HEAD_DIMS.map(|d| d as usize) {
        if super::FULL_CASE_DIMS.contains(&d) {
            continue;
        }
        for dtype in [Dtype::Bf16, Dtype::F16] {
            for (sq, sk) in [(113, 203), (239, 17)] {
                for mask in 0..3 {
                    let mut c = case(1 + (sq < 200) as usize, sq, sk, 4, 2, d, dtype);
                    match mask {
                        1 => c.p.causal = true,
                        2 => c.p.window = (Some(40), Some(7)),
                        _ => {}
                    }
                    v.push(c);
                }
            }
        }
    }
    // Rows with no allowed key (causal with seq_q > seq_k), MQA, a longer causal problem.
    let mut c = case(2, 300, 100, 4, 1, 128, Dtype::Bf16);
    c.p.causal = true;
    v.push(c);
    let mut c = case(1, 1023, 1024, 2, 1, 128, Dtype::Bf16);
    c.p.causal = true;
    v.push(c);
    v
}

pub fn register(s: &mut Suite) {
    for (c, with_dlse) in emulated_cases() {
        for deterministic in [false, true] {
            let b = bc(c.clone(), with_dlse, deterministic);
            let n = format!("attention_bwd/emulated/{}", bwd_name(&b));
            s.cpu(&n, move || match b.c.p.dtype {
                Dtype::Bf16 => run_emulated::<bf16>(&b),
                Dtype::F16 => run_emulated::<f16>(&b),
            });
        }
    }
    for deterministic in [false, true] {
        let n = format!(
            "attention_bwd/emulated/strided_views_{}",
            if deterministic { "det" } else { "atomic" }
        );
        s.cpu(&n, move || strided_emulated(deterministic));
    }
    for (i, c) in gpu_cases().into_iter().enumerate() {
        // The automatic path (the Hopper kernels on sm_90a at D 64, 96, 128, by default 256,
        // padded at 32, 48, 80, 112 and by default at 144 to 240) and, for the bf16 cases it
        // would take, the mma.sync kernels forced (`_mma`): both paths are tested on a Hopper
        // GPU.
        let mut paths = vec![attention::Path::Auto];
        let d = c.p.head_dim as u32;
        let hopper = hopper_bwd_kernel(c.p.dtype, d, false).is_some()
            || hopper_bwd_padded_kernel(c.p.dtype, d, false).is_some();
        if c.p.dtype == Dtype::Bf16 && hopper {
            paths.push(attention::Path::MmaSync);
        }
        for path in paths {
            for deterministic in [false, true] {
                let mut b = bc(c.clone(), i % 2 == 0, deterministic);
                b.c.p.path = path;
                let mma = if path == attention::Path::MmaSync {
                    "_mma"
                } else {
                    ""
                };
                let n = format!("attention_bwd/gpu/{}{mma}", bwd_name(&b));
                s.gpu(&n, Needs::Gpu, move |g| match b.c.p.dtype {
                    Dtype::Bf16 => run_gpu::<bf16>(g, &b),
                    Dtype::F16 => run_gpu::<f16>(g, &b),
                });
            }
        }
    }
    s.gpu(
        "attention_bwd/deterministic_bitwise",
        Needs::Gpu,
        deterministic_bitwise,
    );
    for (i, c) in value_dim_cases().into_iter().enumerate() {
        for deterministic in [false, true] {
            let b = bc(c.clone(), i % 2 == 0, deterministic);
            let n = format!("attention_bwd/hopper_value_dim/{}", bwd_name(&b));
            s.gpu(&n, Needs::Hopper, move |g| match b.c.p.dtype {
                Dtype::Bf16 => run_gpu::<bf16>(g, &b),
                Dtype::F16 => run_gpu::<f16>(g, &b),
            });
        }
    }
    s.gpu(
        "attention_bwd/hopper_value_dim/deterministic_bitwise",
        Needs::Hopper,
        value_dim_bitwise,
    );
    s.gpu("attention_bwd/raw_api", Needs::Gpu, raw_api);
    for deterministic in [false, true] {
        let n = format!(
            "attention_bwd/strided_views_{}",
            if deterministic { "det" } else { "atomic" }
        );
        s.gpu(&n, Needs::Gpu, move |g| strided_views(g, deterministic));
    }
}
