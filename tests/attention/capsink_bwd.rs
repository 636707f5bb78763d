//! Attention backward with a softcap and sinks (the `attention_bwd_*softcap*` kernels, the
//! dsinks kernels) against the f64 reference `attention::reference::backward_sinks` (checked
//! against finite differences in `reference_fd.rs`).
//!
//! Inputs: Q, K, V, dO uniform in `[-1, 1)` (dLSE too where the case has it), the sinks
//! uniform in the case's range, O and LSE the f64 reference forward's with the same softcap and
//! sinks (O rounded to the element type, LSE to f32).
//!
//! Tolerance (the backward's rule), per gradient G in dQ, dK, dV and the sinks' gradient:
//! `max |G - ref| <= 2 max |G_naive - ref| + 1e-3 max |ref| + 1e-6`
//! (`attention::reference::backward_tolerance`), `G_naive` from
//! `attention::naive_backward_same_precision_sinks`; every element finite (outputs poisoned
//! with NaN before the run).
//!
//! Names: `attention_capsink_bwd/emulated/*` (the `mma.sync` kernels' own code in the CPU
//! emulator), `attention_capsink_bwd/{auto,mma}/*` (a GPU, the plan's path or the `mma.sync`
//! path), `attention_capsink_bwd/varlen/*` (packed sequences on a GPU; `varlen_emulated/*` in
//! the emulator),
//! `attention_capsink_bwd/deterministic_bitwise`.

use super::varlen::{VarlenCase, seqlens, vcase};
use super::{Case, case, name};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok};
use kernels::attention::reference::{
    AttentionGrads, backward_sinks, backward_tolerance, backward_varlen_sinks,
};
use kernels::attention::{
    self, AttentionBackwardTensors, AttentionElem, AttentionVarlenBackwardTensors,
    AttentionVarlenProblem, BackwardOptions, BackwardWorkspace, CuSeqlens, Dtype, HEAD_DIMS, Path,
    Target, View, naive_backward_same_precision_sinks, naive_backward_varlen_same_precision_sinks,
};
use kernels::data::rng;
use kernels::exec::OnStream;
use kernels::memory::{download, poisoned, upload};
use kernels::{Arch, Gpu, bf16, f16};
use rand::Rng;

/// A case: the problem (with its softcap and sinks), the sink values, whether the loss has an
/// LSE term, which mode.
#[derive(Clone)]
struct CapBwdCase {
    c: Case,
    sinks: Option<Vec<f32>>,
    with_dlse: bool,
    deterministic: bool,
}

/// Sink values of `heads` heads uniform in `[lo, hi)`.
fn sink_values(heads: usize, (lo, hi): (f32, f32), seed: u64) -> Vec<f32> {
    let mut r = rng(seed ^ 0x51_4b);
    (0..heads).map(|_| r.random_range(lo..hi)).collect()
}

fn cb(
    mut c: Case,
    softcap: Option<f32>,
    sinks: Option<(f32, f32)>,
    with_dlse: bool,
    deterministic: bool,
) -> CapBwdCase {
    c.p.softcap = softcap;
    c.p.sinks = sinks.is_some();
    let sinks = sinks.map(|r| sink_values(c.p.heads_q, r, c.seed));
    CapBwdCase {
        c,
        sinks,
        with_dlse,
        deterministic,
    }
}

/// The options part of a case's name.
fn options_name(softcap: Option<f32>, sinks: Option<&[f32]>, dlse: bool, det: bool) -> String {
    let mut s = String::new();
    if let Some(c) = softcap {
        s.push_str(&format!("_softcap{c}"));
    }
    match sinks {
        Some([]) => s.push_str("_sinks"),
        Some(sinks) => {
            let max = sinks.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            s.push_str(&format!("_sinks{max:.0}"));
        }
        None => {}
    }
    if dlse {
        s.push_str("_dlse");
    }
    s.push_str(if det { "_det" } else { "_atomic" });
    s
}

fn cb_name(b: &CapBwdCase) -> String {
    name(&b.c)
        + &options_name(
            b.c.p.softcap,
            b.sinks.as_deref(),
            b.with_dlse,
            b.deterministic,
        )
}

/// Q, K, V, dO, dLSE, and the forward's O (element type) and LSE.
struct Inputs<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    d_o: Vec<T>,
    d_lse: Option<Vec<f32>>,
    o: Vec<T>,
    lse: Vec<f32>,
}

/// dO and dLSE for the forward `fwd` (dLSE NaN or infinite on rows whose LSE is -inf: such a
/// row contributes nothing).
fn loss_grads<T: AttentionElem>(
    seed: u64,
    n: usize,
    lse: &[f64],
    with_dlse: bool,
) -> (Vec<T>, Option<Vec<f32>>) {
    let mut r = rng(seed ^ 0xd0d0);
    let d_o = (0..n)
        .map(|_| T::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let d_lse = with_dlse.then(|| {
        lse.iter()
            .enumerate()
            .map(|(i, &l)| {
                let x = r.random_range(-1.0f32..1.0);
                if l == f64::NEG_INFINITY {
                    [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][i % 3]
                } else {
                    x
                }
            })
            .collect()
    });
    (d_o, d_lse)
}

fn inputs<T: AttentionElem>(b: &CapBwdCase) -> Inputs<T> {
    let p = &b.c.p;
    let (q, k, v) = super::inputs::<T>(&b.c);
    let fwd = match &b.sinks {
        Some(s) => attention::reference_with_sinks(p, &q, &k, &v, s),
        None => attention::reference(p, &q, &k, &v),
    };
    let (d_o, d_lse) = loss_grads::<T>(b.c.seed, q.len(), &fwd.lse, b.with_dlse);
    Inputs {
        o: fwd.o.iter().map(|&x| T::from_f32(x as f32)).collect(),
        lse: fwd.lse.iter().map(|&x| x as f32).collect(),
        q,
        k,
        v,
        d_o,
        d_lse,
    }
}

/// A kernel's gradients: dQ, dK, dV, the sinks'.
type GotGrads<'a, T> = (&'a [T], &'a [T], &'a [T], Option<&'a [f32]>);
/// A reference's gradients: dQ, dK, dV, the sinks'.
type RefGrads = (AttentionGrads, Option<Vec<f64>>);

/// The gradients `got` (dQ, dK, dV, and the sinks') against the reference `want` with the
/// tolerance of the module documentation from `naive`.
fn check_grads<T: AttentionElem>(
    what: &str,
    got: GotGrads<'_, T>,
    want: &RefGrads,
    naive: &RefGrads,
) -> TestResult {
    let wide = |x: &[T]| -> Vec<f64> { x.iter().map(|x| x.to_f32() as f64).collect() };
    let ds: Option<Vec<f64>> = got.3.map(|d| d.iter().map(|&x| x as f64).collect());
    ensure(ds.is_some() == want.1.is_some(), || {
        format!("{what}: the sinks' gradient given without sinks or missing")
    })?;
    let max_diff = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let mut rows = vec![
        ("dQ", wide(got.0), &want.0.dq, &naive.0.dq),
        ("dK", wide(got.1), &want.0.dk, &naive.0.dk),
        ("dV", wide(got.2), &want.0.dv, &naive.0.dv),
    ];
    if let (Some(ds), Some(w), Some(n)) = (ds, &want.1, &naive.1) {
        rows.push(("dsinks", ds, w, n));
    }
    let mut line = String::new();
    let mut failures = Vec::new();
    for (name, g, w, n) in rows {
        if let Some(i) = g.iter().position(|x| !x.is_finite()) {
            return Err(format!("{what}: {name}[{i}] = {} (NaN: unwritten?)", g[i]).into());
        }
        let err = max_diff(&g, w);
        let naive_err = max_diff(n, w);
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let tol = backward_tolerance(naive_err, scale);
        line.push_str(&format!(" {name} {err:.3e} (tol {tol:.3e});"));
        if err > tol {
            failures.push(format!("{name} max error {err:.3e} > {tol:.3e}"));
        }
    }
    println!("{what}: max |G - ref|:{line}");
    ensure(failures.is_empty(), || {
        format!("{what}: {}", failures.join("; "))
    })
}

fn compare<T: AttentionElem>(
    what: &str,
    b: &CapBwdCase,
    x: &Inputs<T>,
    got: GotGrads<'_, T>,
) -> TestResult {
    let p = &b.c.p;
    let (dl, sinks) = (x.d_lse.as_deref(), b.sinks.as_deref());
    let want = backward_sinks(p, &x.q, &x.k, &x.v, &x.d_o, dl, sinks);
    let naive = naive_backward_same_precision_sinks(p, &x.q, &x.k, &x.v, &x.d_o, dl, sinks);
    check_grads(what, got, &want, &naive)
}

/// The backward in the CPU emulator (the `mma.sync` kernels and the dsinks kernel), outputs
/// poisoned.
fn run_emulated<T: AttentionElem>(b: &CapBwdCase) -> TestResult {
    let p = &b.c.p;
    let x = inputs::<T>(b);
    let what = format!("emulated {} (seed {})", cb_name(b), b.c.seed);
    let (mut q, mut k, mut v, mut o, mut d_o) = (
        HostBuf::from_slice(&x.q),
        HostBuf::from_slice(&x.k),
        HostBuf::from_slice(&x.v),
        HostBuf::from_slice(&x.o),
        HostBuf::from_slice(&x.d_o),
    );
    let mut lse = HostBuf::from_slice(&x.lse);
    let mut d_lse = x.d_lse.as_ref().map(|d| HostBuf::from_slice(d));
    let mut sinks = b.sinks.as_deref().map(HostBuf::from_slice);
    let mut d_sinks = b.sinks.as_ref().map(|s| HostBuf::filled(s.len(), f32::NAN));
    let nan = T::from_f32(f32::NAN);
    let mut dq = HostBuf::filled(x.q.len(), nan);
    let mut dk = HostBuf::filled(x.k.len(), nan);
    let mut dv = HostBuf::filled(x.k.len(), nan);
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let tensors = AttentionBackwardTensors {
        q: View::contiguous(q.view(), qs),
        k: View::contiguous(k.view(), ks),
        v: View::contiguous(v.view(), ks),
        o: View::contiguous(o.view(), qs),
        d_o: View::contiguous(d_o.view(), qs),
        lse: lse.view(),
        d_lse: d_lse.as_mut().map(|d| d.view()),
        dq: View::contiguous(dq.view(), qs),
        dk: View::contiguous(dk.view(), ks),
        dv: View::contiguous(dv.view(), ks),
        sinks: sinks.as_mut().map(|s| s.view()),
        d_sinks: d_sinks.as_mut().map(|s| s.view()),
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
    let guards = d_sinks.as_ref().is_none_or(|d| d.guards_intact());
    ensure(
        guards && dq.guards_intact() && dk.guards_intact() && dv.guards_intact(),
        || format!("{what}: a write outside its buffer"),
    )?;
    let ds = d_sinks.as_ref().map(|d| d.to_vec());
    compare(
        &what,
        b,
        &x,
        (&dq.to_vec(), &dk.to_vec(), &dv.to_vec(), ds.as_deref()),
    )
}

/// Gradients of one GPU run: dQ, dK, dV, the sinks'.
type Grads<T> = (Vec<T>, Vec<T>, Vec<T>, Option<Vec<f32>>);

/// The backward on a GPU through the plan on `path`, outputs poisoned; also the dK/dV
/// kernel's name.
fn gpu_grads<T: AttentionElem>(
    g: &Gpu,
    b: &CapBwdCase,
    x: &Inputs<T>,
    path: Path,
) -> kernels::Result<(Grads<T>, String)> {
    let p = b.c.p.clone().path(path);
    let stream = g.stream()?;
    let (q, k, v, o, d_o) = (
        upload(&x.q)?,
        upload(&x.k)?,
        upload(&x.v)?,
        upload(&x.o)?,
        upload(&x.d_o)?,
    );
    let lse = upload(&x.lse)?;
    let d_lse = x.d_lse.as_ref().map(|d| upload(d)).transpose()?;
    let sinks = b.sinks.as_ref().map(|s| upload(s)).transpose()?;
    let d_sinks = b
        .sinks
        .as_ref()
        .map(|s| poisoned::<f32>(s.len()))
        .transpose()?;
    let (dq, dk, dv) = (
        poisoned::<T>(x.q.len())?,
        poisoned::<T>(x.k.len())?,
        poisoned::<T>(x.k.len())?,
    );
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let tensors = AttentionBackwardTensors {
        q: View::contiguous(&q, qs),
        k: View::contiguous(&k, ks),
        v: View::contiguous(&v, ks),
        o: View::contiguous(&o, qs),
        d_o: View::contiguous(&d_o, qs),
        lse: (&lse).into(),
        d_lse: d_lse.as_ref().map(|d| d.into()),
        dq: View::contiguous(&dq, qs),
        dk: View::contiguous(&dk, ks),
        dv: View::contiguous(&dv, ks),
        sinks: sinks.as_ref().map(|s| s.into()),
        d_sinks: d_sinks.as_ref().map(|s| s.into()),
    };
    let options = BackwardOptions {
        deterministic: b.deterministic,
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
    let kernel = plan.launches(&ws)?.dkdv.name().to_string();
    // SAFETY: every buffer lives until the synchronization below; the outputs and the
    // workspace are fresh allocations.
    unsafe {
        plan.run(
            &OnStream {
                gpu: g,
                stream: &stream,
            },
            &ws,
        )
    }?;
    g.sync(&stream, "attention backward with a softcap or sinks")?;
    let ds = d_sinks.as_ref().map(download).transpose()?;
    Ok(((download(&dq)?, download(&dk)?, download(&dv)?, ds), kernel))
}

fn run_gpu<T: AttentionElem>(g: &Gpu, b: &CapBwdCase, path: Path) -> TestResult {
    let x = inputs::<T>(b);
    let ((dq, dk, dv, ds), kernel) = gpu_ok(gpu_grads(g, b, &x, path))?;
    let what = format!("{} [{kernel}] (seed {})", cb_name(b), b.c.seed);
    // A softcap takes the softcap kernels on every path.
    ensure(
        b.c.p.softcap.is_none() || kernel.contains("softcap"),
        || format!("{what}: a softcap on {kernel}"),
    )?;
    compare(&what, b, &x, (&dq, &dk, &dv, ds.as_deref()))
}

/// Deterministic mode with a softcap and sinks: 10 runs give bitwise identical gradients, the
/// sinks' included (their kernel sums in a fixed order in either mode), at D 128 and 256 (on
/// Hopper the ordered dK/dV/dQ kernel and the ordered wide kernel).
fn deterministic_bitwise(g: &Gpu) -> TestResult {
    for d in [128, 256] {
        let mut c = case(2, 300, 257, 4, 2, d, Dtype::Bf16);
        c.p.causal = true;
        let b = cb(c, Some(20.0), Some((-1.0, 2.0)), true, true);
        bitwise_runs(g, &b)?;
    }
    Ok(())
}

fn bitwise_runs(g: &Gpu, b: &CapBwdCase) -> TestResult {
    let x = inputs::<bf16>(b);
    let (first, kernel) = gpu_ok(gpu_grads(g, b, &x, Path::Auto))?;
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let fbits = |v: &Option<Vec<f32>>| {
        v.as_ref()
            .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
    };
    for run in 1..10 {
        let (again, _) = gpu_ok(gpu_grads(g, b, &x, Path::Auto))?;
        ensure(
            bits(&again.0) == bits(&first.0)
                && bits(&again.1) == bits(&first.1)
                && bits(&again.2) == bits(&first.2)
                && fbits(&again.3) == fbits(&first.3),
            || format!("deterministic [{kernel}]: run {run} differs from run 0"),
        )?;
    }
    println!("deterministic [{kernel}]: 10 runs bitwise identical (dQ, dK, dV, dsinks)");
    compare(
        "deterministic",
        b,
        &x,
        (&first.0, &first.1, &first.2, first.3.as_deref()),
    )
}

/// A packed case with a softcap and sinks: its problem and lengths, the inputs, the forward's O
/// and LSE (the f64 reference's, rounded), the sink values, the case's name.
struct VarlenInputs<T> {
    p: AttentionVarlenProblem,
    s: CuSeqlens,
    x: Inputs<T>,
    sinks: Option<Vec<f32>>,
    what: String,
}

fn varlen_inputs<T: AttentionElem>(
    c: &VarlenCase,
    softcap: Option<f32>,
    sinks: bool,
    deterministic: bool,
) -> VarlenInputs<T> {
    let mut p = c.p.clone();
    p.softcap = softcap;
    p.sinks = sinks;
    let s = seqlens(c);
    let (q, k, v) = super::varlen::inputs::<T>(c);
    let sink_vals = sinks.then(|| sink_values(p.heads_q, (-1.0, 3.0), c.seed));
    let fwd = match &sink_vals {
        Some(sv) => attention::reference_varlen_with_sinks(&p, &s, &q, &k, &v, sv),
        None => attention::reference_varlen(&p, &s, &q, &k, &v),
    };
    let (d_o, d_lse) = loss_grads::<T>(c.seed, q.len(), &fwd.lse, true);
    let what = format!(
        "{}{}",
        super::varlen::name(c),
        options_name(softcap, sink_vals.as_deref(), true, deterministic)
    );
    VarlenInputs {
        x: Inputs {
            o: fwd.o.iter().map(|&x| T::from_f32(x as f32)).collect(),
            lse: fwd.lse.iter().map(|&x| x as f32).collect(),
            q,
            k,
            v,
            d_o,
            d_lse,
        },
        p,
        s,
        sinks: sink_vals,
        what,
    }
}

/// The gradients of a packed case against the references per sequence.
fn check_varlen<T: AttentionElem>(vi: &VarlenInputs<T>, what: &str, got: Grads<T>) -> TestResult {
    let (x, dl, sv) = (&vi.x, vi.x.d_lse.as_deref(), vi.sinks.as_deref());
    let (p, s) = (&vi.p, &vi.s);
    let want = backward_varlen_sinks(p, s, &x.q, &x.k, &x.v, &x.d_o, dl, sv);
    let naive = naive_backward_varlen_same_precision_sinks(p, s, &x.q, &x.k, &x.v, &x.d_o, dl, sv);
    let (dq, dk, dv, ds) = got;
    check_grads(what, (&dq, &dk, &dv, ds.as_deref()), &want, &naive)
}

/// Packed sequences (one empty, one of a single row) with a softcap and sinks, on a GPU.
fn run_varlen<T: AttentionElem>(
    g: &Gpu,
    c: &VarlenCase,
    softcap: Option<f32>,
    sinks: bool,
    deterministic: bool,
) -> TestResult {
    let vi = varlen_inputs::<T>(c, softcap, sinks, deterministic);
    let (p, s, x) = (&vi.p, &vi.s, &vi.x);
    let run = || -> kernels::Result<Grads<T>> {
        let stream = g.stream()?;
        let dev_s = s.upload()?;
        let (dq_, dk_, dv_) = (
            poisoned::<T>(x.q.len())?,
            poisoned::<T>(x.k.len())?,
            poisoned::<T>(x.k.len())?,
        );
        let (qs, ks) = (p.q_shape(), p.kv_shape());
        let (qb, kb, vb, ob, dob) = (
            upload(&x.q)?,
            upload(&x.k)?,
            upload(&x.v)?,
            upload(&x.o)?,
            upload(&x.d_o)?,
        );
        let (lb, dlb) = (
            upload(&x.lse)?,
            x.d_lse.as_ref().map(|d| upload(d)).transpose()?,
        );
        let (mut dqv, mut dkv, mut dvv) = (
            View::packed_contiguous(&dq_, qs),
            View::packed_contiguous(&dk_, ks),
            View::packed_contiguous(&dv_, ks),
        );
        let options = BackwardOptions { deterministic };
        let pk = |b| View::packed_contiguous(b, qs);
        let pv = |b| View::packed_contiguous(b, ks);
        let mut ds = None;
        match &vi.sinks {
            Some(sv) => {
                let sb = upload(sv)?;
                let mut dsb = poisoned::<f32>(sv.len())?;
                attention::backward_varlen_with_sinks(
                    g,
                    &stream,
                    p,
                    &dev_s,
                    &pk(&qb),
                    &pv(&kb),
                    &pv(&vb),
                    &pk(&ob),
                    &lb,
                    &pk(&dob),
                    dlb.as_ref(),
                    &mut dqv,
                    &mut dkv,
                    &mut dvv,
                    &sb,
                    &mut dsb,
                    options,
                )?;
                ds = Some(download(&dsb)?);
            }
            None => attention::backward_varlen(
                g,
                &stream,
                p,
                &dev_s,
                &pk(&qb),
                &pv(&kb),
                &pv(&vb),
                &pk(&ob),
                &lb,
                &pk(&dob),
                dlb.as_ref(),
                &mut dqv,
                &mut dkv,
                &mut dvv,
                options,
            )?,
        }
        Ok((download(&dq_)?, download(&dk_)?, download(&dv_)?, ds))
    };
    let got = gpu_ok(run())?;
    check_varlen(&vi, &vi.what, got)
}

/// A packed case in the CPU emulator (the `_varlen_` softcap kernels and
/// `attention_bwd_dsinks_varlen`), outputs and workspace poisoned.
fn run_varlen_emulated<T: AttentionElem>(
    c: &VarlenCase,
    softcap: Option<f32>,
    sinks: bool,
    deterministic: bool,
) -> TestResult {
    let vi = varlen_inputs::<T>(c, softcap, sinks, deterministic);
    let (p, s, x) = (&vi.p, &vi.s, &vi.x);
    let what = format!("emulated {}", vi.what);
    let (mut q, mut k, mut v, mut o, mut d_o) = (
        HostBuf::from_slice(&x.q),
        HostBuf::from_slice(&x.k),
        HostBuf::from_slice(&x.v),
        HostBuf::from_slice(&x.o),
        HostBuf::from_slice(&x.d_o),
    );
    let mut lse = HostBuf::from_slice(&x.lse);
    let mut d_lse = x.d_lse.as_ref().map(|d| HostBuf::from_slice(d));
    let (mut cq, mut ck) = (HostBuf::from_slice(s.q()), HostBuf::from_slice(s.k()));
    let mut sinks_b = vi.sinks.as_deref().map(HostBuf::from_slice);
    let mut d_sinks = vi
        .sinks
        .as_ref()
        .map(|sv| HostBuf::filled(sv.len(), f32::NAN));
    let nan = T::from_f32(f32::NAN);
    let mut dq = HostBuf::filled(x.q.len(), nan);
    let mut dk = HostBuf::filled(x.k.len(), nan);
    let mut dv = HostBuf::filled(x.k.len(), nan);
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let tensors = AttentionVarlenBackwardTensors {
        q: View::packed_contiguous(q.view(), qs),
        k: View::packed_contiguous(k.view(), ks),
        v: View::packed_contiguous(v.view(), ks),
        o: View::packed_contiguous(o.view(), qs),
        d_o: View::packed_contiguous(d_o.view(), qs),
        lse: lse.view(),
        d_lse: d_lse.as_mut().map(|d| d.view()),
        dq: View::packed_contiguous(dq.view(), qs),
        dk: View::packed_contiguous(dk.view(), ks),
        dv: View::packed_contiguous(dv.view(), ks),
        cu_seqlens_q: cq.view(),
        cu_seqlens_k: ck.view(),
        sinks: sinks_b.as_mut().map(|b| b.view()),
        d_sinks: d_sinks.as_mut().map(|b| b.view()),
    };
    // The emulator runs the portable kernels: an sm_80 target.
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 132,
    };
    let plan = p
        .plan_backward(target, &tensors, BackwardOptions { deterministic })
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
    let intact = [&dq, &dk, &dv].iter().all(|b| b.guards_intact())
        && d_sinks.as_ref().is_none_or(|d| d.guards_intact())
        && delta.guards_intact();
    ensure(intact, || format!("{what}: a write outside its buffer"))?;
    let ds = d_sinks.as_ref().map(|d| d.to_vec());
    check_varlen(&vi, &what, (dq.to_vec(), dk.to_vec(), dv.to_vec(), ds))
}

/// Small problems for the emulator: D 64 and 128, bf16 and f16, causal, a window leaving rows
/// without keys, GQA, a softcap alone, sinks alone, both; a sink far above the logits.
fn emulated_cases() -> Vec<CapBwdCase> {
    let mut v = Vec::new();
    for det in [false, true] {
        v.push(cb(
            case(1, 17, 33, 2, 1, 64, Dtype::Bf16),
            Some(5.0),
            None,
            true,
            det,
        ));
        let mut c = case(1, 33, 17, 2, 2, 128, Dtype::Bf16); // causal, 16 rows with no key
        c.p.causal = true;
        v.push(cb(c, None, Some((-1.0, 2.0)), true, det));
        let mut c = case(1, 40, 30, 4, 2, 64, Dtype::F16); // diag i - 10: rows 0..10 empty
        c.p.window = (Some(0), Some(0));
        v.push(cb(c, Some(2.0), Some((-2.0, 1.0)), det, det));
    }
    v.push(cb(
        case(1, 20, 45, 2, 1, 64, Dtype::Bf16),
        Some(30.0),
        Some((6.0, 8.0)),
        true,
        false,
    ));
    // A dimension with odd k-slice and dQ tile counts (112).
    let mut c = case(1, 29, 41, 2, 1, 112, Dtype::F16);
    c.p.window = (Some(12), Some(3));
    v.push(cb(c, Some(10.0), Some((-1.0, 2.0)), true, false));
    // Inputs in [-3, 3) (logits of several units), causal with rows without keys.
    for seed in 0..4 {
        let mut c = case(1, 90, 60, 4, 4, 128, Dtype::Bf16);
        c.p.causal = true;
        c.range = 3.0;
        c.seed += seed;
        v.push(cb(c, Some(30.0), Some((-1.0, 3.0)), false, false));
    }
    v
}

/// The GPU grid: dtype x D x options x mask x mode (the dimensions past 64, 96, 128, 192 and
/// 256 in bf16, with both options).
fn gpu_cases() -> Vec<CapBwdCase> {
    let mut v = Vec::new();
    for d in HEAD_DIMS.map(|d| d as usize) {
        if super::FULL_CASE_DIMS.contains(&d) {
            continue;
        }
        for mask in 0..3 {
            let (sq, sk) = [(113, 203), (239, 130), (300, 300)][mask];
            let mut c = case(1 + (sq < 200) as usize, sq, sk, 4, 2, d, Dtype::Bf16);
            match mask {
                1 => c.p.causal = true,
                2 => c.p.window = (Some(40), Some(7)),
                _ => {}
            }
            v.push(cb(c, Some(5.0), Some((-2.0, 2.0)), mask != 1, mask == 2));
        }
    }
    for dtype in [Dtype::Bf16, Dtype::F16] {
        for d in super::FULL_CASE_DIMS {
            for (softcap, sinks) in [
                (Some(20.0), None),
                (None, Some((-1.0, 3.0))),
                (Some(5.0), Some((-2.0, 2.0))),
            ] {
                for mask in 0..3 {
                    let (sq, sk) = [(113, 203), (239, 130), (300, 300)][mask];
                    let mut c = case(1 + (sq < 200) as usize, sq, sk, 4, 2, d, dtype);
                    match mask {
                        1 => c.p.causal = true,
                        2 => c.p.window = (Some(40), Some(7)),
                        _ => {}
                    }
                    v.push(cb(c, softcap, sinks, mask != 1, mask == 2));
                }
            }
        }
    }
    // A sink above every logit; a longer causal problem.
    v.push(cb(
        case(2, 128, 200, 4, 1, 128, Dtype::Bf16),
        Some(50.0),
        Some((8.0, 10.0)),
        true,
        false,
    ));
    let mut c = case(1, 1023, 1024, 2, 1, 128, Dtype::Bf16);
    c.p.causal = true;
    v.push(cb(c, Some(30.0), Some((0.0, 1.0)), true, false));
    v
}

pub fn register(s: &mut Suite) {
    for b in emulated_cases() {
        let n = format!("attention_capsink_bwd/emulated/{}", cb_name(&b));
        s.cpu(&n, move || match b.c.p.dtype {
            Dtype::Bf16 => run_emulated::<bf16>(&b),
            Dtype::F16 => run_emulated::<f16>(&b),
        });
    }
    for b in gpu_cases() {
        for (pn, path) in [("auto", Path::Auto), ("mma", Path::MmaSync)] {
            let n = format!("attention_capsink_bwd/{pn}/{}", cb_name(&b));
            let b = b.clone();
            s.gpu(&n, Needs::Gpu, move |g| match b.c.p.dtype {
                Dtype::Bf16 => run_gpu::<bf16>(g, &b, path),
                Dtype::F16 => run_gpu::<f16>(g, &b, path),
            });
        }
    }
    s.gpu(
        "attention_capsink_bwd/deterministic_bitwise",
        Needs::Gpu,
        deterministic_bitwise,
    );
    // Packed sequences in the emulator: an empty one, one without keys, one of a single row.
    let small = [(0, 3), (5, 0), (1, 1), (20, 33), (40, 17)];
    for (softcap, sinks, det) in [(Some(5.0), true, false), (None, true, true)] {
        let mut c = vcase(&small, 4, 2, 64, Dtype::Bf16);
        c.p.causal = true;
        let n = format!(
            "attention_capsink_bwd/varlen_emulated/{}{}",
            super::varlen::name(&c),
            options_name(softcap, sinks.then_some(&[][..]), true, det)
        );
        s.cpu(&n, move || {
            run_varlen_emulated::<bf16>(&c, softcap, sinks, det)
        });
    }
    let lens = [(0, 5), (1, 1), (70, 130), (200, 150), (33, 0)];
    for (d, dtype) in [(64, Dtype::Bf16), (128, Dtype::F16), (256, Dtype::Bf16)] {
        for (softcap, sinks) in [(Some(10.0), false), (None, true), (Some(5.0), true)] {
            // The automatic path (the Hopper kernels on sm_90a) and the mma.sync kernels
            // forced (`varlen_mma`).
            for (det, (pn, path)) in [false, true].into_iter().flat_map(|det| {
                [("varlen", Path::Auto), ("varlen_mma", Path::MmaSync)].map(|x| (det, x))
            }) {
                let mut c = vcase(&lens, 4, 2, d, dtype);
                c.p.causal = d == 128;
                c.p.path = path;
                let n = format!(
                    "attention_capsink_bwd/{pn}/{}{}",
                    super::varlen::name(&c),
                    options_name(softcap, sinks.then_some(&[][..]), true, det)
                );
                s.gpu(&n, Needs::Gpu, move |g| match c.p.dtype {
                    Dtype::Bf16 => run_varlen::<bf16>(g, &c, softcap, sinks, det),
                    Dtype::F16 => run_varlen::<f16>(g, &c, softcap, sinks, det),
                });
            }
        }
    }
}
