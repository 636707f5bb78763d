//! Attention backward over packed sequences (`attention::backward_varlen`, the
//! `attention_bwd_*_varlen_*` kernels) against the f64 reference per sequence
//! (`attention::reference::backward_varlen`).
//!
//! Inputs: Q, K, V, dO uniform in `[-1, 1)` (dLSE too where the case has it), O and LSE the f64
//! reference forward's per sequence (O rounded to the element type, LSE to f32).
//!
//! Tolerance (the dense backward's), per gradient G in dQ, dK, dV:
//! `max |G - ref| <= 2 max |G_naive - ref| + 1e-3 max |ref| + 1e-6`
//! (`attention::reference::backward_tolerance`), `G_naive` from
//! `attention::naive_backward_varlen_same_precision`; every element finite (outputs poisoned
//! with NaN before the run, so every element must be written), and the gradients of sequences
//! without keys (dQ) or without queries (dK, dV) exactly 0.
//!
//! Names: `attention_varlen_bwd/emulated/*` (the kernels' own code in the CPU emulator),
//! `attention_varlen_bwd/gpu/*` (a GPU).

use super::varlen::{VarlenCase, inputs as qkv_inputs, name, seqlens, vcase};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok};
use kernels::attention::reference::{backward_tolerance, backward_varlen as reference_backward};
use kernels::attention::{
    self, AttentionElem, AttentionVarlenBackwardTensors, BackwardOptions, BackwardWorkspace, Dtype,
    HEAD_DIMS, Target, View, naive_backward_varlen_same_precision, reference_varlen,
};
use kernels::data::rng;
use kernels::memory::{download, poisoned, upload};
use kernels::{Arch, Gpu, bf16, f16};
use rand::Rng;

/// A case: the packed batch, whether the loss has an LSE term, which mode.
#[derive(Clone)]
struct BwdCase {
    c: VarlenCase,
    with_dlse: bool,
    deterministic: bool,
}

fn bwd_name(b: &BwdCase) -> String {
    format!(
        "{}{}_{}",
        name(&b.c),
        if b.with_dlse { "_dlse" } else { "" },
        if b.deterministic { "det" } else { "atomic" }
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

fn inputs<T: AttentionElem>(b: &BwdCase) -> Inputs<T> {
    let c = &b.c;
    let (q, k, v) = qkv_inputs::<T>(c);
    let mut r = rng(c.seed ^ 0xd0d0);
    let d_o: Vec<T> = (0..c.p.o_shape().iter().product::<usize>())
        .map(|_| T::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let fwd = reference_varlen(&c.p, &seqlens(c), &q, &k, &v);
    // dLSE of rows with no allowed key: NaN and infinities, which must reach no gradient.
    let d_lse = b.with_dlse.then(|| {
        (0..c.p.lse_len())
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

/// The gradients against the reference with the tolerance of the module documentation.
fn compare<T: AttentionElem>(
    what: &str,
    c: &VarlenCase,
    x: &Inputs<T>,
    dq: &[T],
    dk: &[T],
    dv: &[T],
) -> TestResult {
    let (p, s) = (&c.p, seqlens(c));
    let want = reference_backward(p, &s, &x.q, &x.k, &x.v, &x.d_o, x.d_lse.as_deref());
    let naive =
        naive_backward_varlen_same_precision(p, &s, &x.q, &x.k, &x.v, &x.d_o, x.d_lse.as_deref());
    let max_diff = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let wide = |x: &[T]| -> Vec<f64> { x.iter().map(|x| x.to_f32() as f64).collect() };
    let got = [wide(dq), wide(dk), wide(dv)];
    let mut line = String::new();
    let mut failures = Vec::new();
    for (i, (name, w, n)) in [
        ("dQ", &want.dq, &naive.dq),
        ("dK", &want.dk, &naive.dk),
        ("dV", &want.dv, &naive.dv),
    ]
    .into_iter()
    .enumerate()
    {
        let g = &got[i];
        if let Some(j) = g.iter().position(|x| !x.is_finite()) {
            return Err(format!("{what}: {name}[{j}] = {} (NaN: unwritten?)", g[j]).into());
        }
        let err = max_diff(g, w);
        let naive_err = max_diff(n, w);
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let tol = backward_tolerance(naive_err, scale);
        line.push_str(&format!(
            " {name} {err:.3e} (tol {tol:.3e}, naive {naive_err:.3e}, max |ref| {scale:.2e});"
        ));
        if err > tol {
            failures.push(format!("{name} max error {err:.3e} > {tol:.3e}"));
        }
    }
    // Sequences without keys: dQ exactly 0; without queries: dK, dV exactly 0.
    let (qrow, krow) = (p.heads_q * p.head_dim, p.heads_kv * p.head_dim);
    let vrow = p.heads_kv * p.v_dim();
    for b in 0..s.batch() {
        if s.seq_k(b) == 0 {
            let rows = s.q_start(b) * qrow..(s.q_start(b) + s.seq_q(b)) * qrow;
            ensure(got[0][rows].iter().all(|&x| x == 0.0), || {
                format!("{what}: dQ of sequence {b} (no keys) not 0")
            })?;
        }
        if s.seq_q(b) == 0 {
            let rows = |w: usize| s.k_start(b) * w..(s.k_start(b) + s.seq_k(b)) * w;
            ensure(
                got[1][rows(krow)].iter().all(|&x| x == 0.0)
                    && got[2][rows(vrow)].iter().all(|&x| x == 0.0),
                || format!("{what}: dK/dV of sequence {b} (no queries) not 0"),
            )?;
        }
    }
    println!("{what}: max |G - ref|:{line}");
    ensure(failures.is_empty(), || {
        format!("{what}: {}", failures.join("; "))
    })
}

/// The backward in the CPU emulator (the kernels' own code), outputs and workspace poisoned.
fn emulate<T: AttentionElem>(b: &BwdCase, x: &Inputs<T>) -> Result<[Vec<T>; 3], String> {
    let p = &b.c.p;
    let s = seqlens(&b.c);
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
        sinks: None,
        d_sinks: None,
    };
    let options = BackwardOptions {
        deterministic: b.deterministic,
    };
    // The emulator runs the portable kernels: an sm_80 target.
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 132,
    };
    let plan = p
        .plan_backward(target, &tensors, options)
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
    unsafe { plan.run(&Emulator, &ws) }.map_err(|e| e.to_string())?;
    let intact = [&dq, &dk, &dv].iter().all(|b| b.guards_intact())
        && delta.guards_intact()
        && accum.as_ref().is_none_or(|a| a.guards_intact());
    if !intact {
        return Err("a write outside its buffer".into());
    }
    Ok([dq.to_vec(), dk.to_vec(), dv.to_vec()])
}

fn run_emulated<T: AttentionElem>(b: &BwdCase) -> TestResult {
    let x = inputs::<T>(b);
    let what = format!("emulated backward {} (seed {})", bwd_name(b), b.c.seed);
    let [dq, dk, dv] = emulate(b, &x).map_err(|e| format!("{what}: {e}"))?;
    compare(&what, &b.c, &x, &dq, &dk, &dv)
}

/// Small cases for the emulator: empty sequences (no query rows, no key rows; batches without
/// any), length 1,
/// `seq_q != seq_k` per sequence, a sequence over more than one key and query block, causal,
/// windows, grouped-query heads, D = 64 / 128 / 256, f16, both modes.
fn emulated_cases() -> Vec<BwdCase> {
    let bc = |c: VarlenCase, with_dlse: bool, deterministic: bool| BwdCase {
        c,
        with_dlse,
        deterministic,
    };
    let mut v = Vec::new();
    let lens = [(5, 9), (0, 4), (1, 1), (3, 0), (20, 13)];
    v.push(bc(vcase(&lens, 2, 1, 64, Dtype::Bf16), true, false));
    v.push(bc(vcase(&lens, 2, 1, 64, Dtype::Bf16), false, true));
    let mut c = vcase(&[(70, 33), (17, 80)], 2, 2, 128, Dtype::Bf16);
    c.p.causal = true;
    v.push(bc(c.clone(), true, false));
    v.push(bc(c, false, true));
    let mut c = vcase(&[(40, 70), (1, 9), (0, 0)], 4, 2, 64, Dtype::F16);
    c.p.window = (Some(16), Some(4));
    v.push(bc(c.clone(), false, false));
    v.push(bc(c, true, true));
    v.push(bc(
        vcase(&[(9, 17), (2, 3)], 2, 1, 256, Dtype::Bf16),
        false,
        false,
    ));
    // No query row at all (only the dK/dV kernel runs), no key row at all (no dK/dV kernel).
    v.push(bc(
        vcase(&[(0, 9), (0, 70)], 2, 1, 64, Dtype::Bf16),
        false,
        false,
    ));
    v.push(bc(
        vcase(&[(4, 0), (9, 0)], 2, 1, 64, Dtype::Bf16),
        true,
        false,
    ));
    v.push(bc(
        vcase(&[(4, 0), (9, 0)], 2, 1, 64, Dtype::Bf16),
        false,
        true,
    ));
    // Dimensions with an odd number of k-slices or dQ tiles per warp (80, 160, 240).
    let mut c = vcase(&[(30, 45), (0, 3), (17, 9)], 2, 1, 80, Dtype::Bf16);
    c.p.causal = true;
    v.push(bc(c, true, false));
    v.push(bc(
        vcase(&[(9, 17), (21, 5)], 2, 2, 160, Dtype::F16),
        false,
        true,
    ));
    v.push(bc(
        vcase(&[(13, 30), (1, 0), (25, 25)], 2, 1, 240, Dtype::Bf16),
        true,
        true,
    ));
    v
}

/// The GPU grid: dtype x D x mask x GQA on batches with empty, short and long sequences (the
/// dimensions past 64, 96, 128, 192 and 256 on one batch, bf16).
fn gpu_cases() -> Vec<BwdCase> {
    let mut v = Vec::new();
    for d in HEAD_DIMS.map(|d| d as usize) {
        if super::FULL_CASE_DIMS.contains(&d) {
            continue;
        }
        for mask in 0..3 {
            let mut c = vcase(
                &[(113, 203), (0, 7), (1, 1), (239, 17)],
                4,
                2,
                d,
                Dtype::Bf16,
            );
            match mask {
                1 => c.p.causal = true,
                2 => c.p.window = (Some(40), Some(7)),
                _ => {}
            }
            v.push(BwdCase {
                c,
                with_dlse: mask == 0,
                deterministic: mask == 2,
            });
        }
    }
    let batches: [&[(usize, usize)]; 3] = [
        &[(113, 203), (0, 7), (1, 1), (239, 17), (5, 0)],
        &[(300, 300), (64, 64), (129, 65)],
        &[(1, 1)],
    ];
    for dtype in [Dtype::Bf16, Dtype::F16] {
        for d in super::FULL_CASE_DIMS {
            for (bi, lens) in batches.iter().enumerate() {
                for mask in 0..3 {
                    let (hq, hkv) = if mask == 1 { (4, 2) } else { (2, 2) };
                    let mut c = vcase(lens, hq, hkv, d, dtype);
                    match mask {
                        1 => c.p.causal = true,
                        2 => c.p.window = (Some(40), Some(7)),
                        _ => {}
                    }
                    v.push(BwdCase {
                        c,
                        with_dlse: bi == 0,
                        deterministic: mask == 2,
                    });
                }
            }
        }
    }
    v
}

/// The backward on a GPU (`attention::backward_varlen`), outputs poisoned.
fn gpu_grads<T: AttentionElem>(
    g: &Gpu,
    b: &BwdCase,
    x: &Inputs<T>,
) -> kernels::Result<[Vec<T>; 3]> {
    let p = &b.c.p;
    let stream = g.stream()?;
    let seqlens = seqlens(&b.c).upload()?;
    let (q, k, v, o, d_o) = (
        upload(&x.q)?,
        upload(&x.k)?,
        upload(&x.v)?,
        upload(&x.o)?,
        upload(&x.d_o)?,
    );
    let lse = upload(&x.lse)?;
    let d_lse = x.d_lse.as_ref().map(|d| upload(d)).transpose()?;
    let (dq, dk, dv) = (
        poisoned::<T>(x.q.len())?,
        poisoned::<T>(x.k.len())?,
        poisoned::<T>(x.v.len())?,
    );
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let (vs, os) = (p.v_shape(), p.o_shape());
    let (mut dqv, mut dkv, mut dvv) = (
        View::packed_contiguous(&dq, qs),
        View::packed_contiguous(&dk, ks),
        View::packed_contiguous(&dv, vs),
    );
    attention::backward_varlen(
        g,
        &stream,
        p,
        &seqlens,
        &View::packed_contiguous(&q, qs),
        &View::packed_contiguous(&k, ks),
        &View::packed_contiguous(&v, vs),
        &View::packed_contiguous(&o, os),
        &lse,
        &View::packed_contiguous(&d_o, os),
        d_lse.as_ref(),
        &mut dqv,
        &mut dkv,
        &mut dvv,
        BackwardOptions {
            deterministic: b.deterministic,
        },
    )?;
    Ok([download(&dq)?, download(&dk)?, download(&dv)?])
}

fn run_gpu<T: AttentionElem>(g: &Gpu, b: &BwdCase) -> TestResult {
    let x = inputs::<T>(b);
    let [dq, dk, dv] = gpu_ok(gpu_grads(g, b, &x))?;
    let what = format!("{} on {} (seed {})", bwd_name(b), g.arch(), b.c.seed);
    compare(&what, &b.c, &x, &dq, &dk, &dv)
}

/// The deterministic mode gives bitwise the same gradients over repeated runs (on a batch
/// with every kind of sequence, causal, grouped-query heads; at D 128 and, on the wide
/// kernel's order, D 256 with a window; the automatic path: the Hopper kernels on sm_90a).
fn gpu_deterministic_bitwise(g: &Gpu) -> TestResult {
    let lens = [(300, 200), (0, 5), (77, 77), (1, 40), (260, 700)];
    let mut c = vcase(&lens, 4, 2, 128, Dtype::Bf16);
    c.p.causal = true;
    deterministic_bitwise_case(g, c)?;
    let mut c = vcase(&lens, 4, 1, 256, Dtype::Bf16);
    c.p.window = (Some(150), Some(20));
    deterministic_bitwise_case(g, c)
}

fn deterministic_bitwise_case(g: &Gpu, c: VarlenCase) -> TestResult {
    let b = BwdCase {
        c,
        with_dlse: true,
        deterministic: true,
    };
    let x = inputs::<bf16>(&b);
    let first = gpu_ok(gpu_grads(g, &b, &x))?;
    for run in 1..5 {
        let again = gpu_ok(gpu_grads(g, &b, &x))?;
        for (i, name) in ["dQ", "dK", "dV"].iter().enumerate() {
            ensure(
                first[i]
                    .iter()
                    .zip(&again[i])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                || format!("{name} of run {run} differs bitwise from run 0"),
            )?;
        }
    }
    let [dq, dk, dv] = &first;
    compare(
        &format!("deterministic {} on {}", bwd_name(&b), g.arch()),
        &b.c,
        &x,
        dq,
        dk,
        dv,
    )?;
    println!(
        "deterministic backward over packed sequences {}: 5 runs bitwise equal",
        bwd_name(&b)
    );
    Ok(())
}

/// Contradictory boundaries (out of order, out of range, past the totals and the stated
/// longest lengths) on the Hopper kernels in both modes: the launches complete (in
/// deterministic mode the blocks, finding boundaries out of order, add without waiting on one
/// another) and write nothing outside dQ, dK, dV and the workspace (guard elements after each,
/// poisoned before the run, intact after).
fn gpu_hopper_clamps_bad_boundaries(g: &Gpu) -> TestResult {
    use kernels::exec::{DevView, OnStream};
    let mut c = vcase(&[(300, 200), (10, 10), (200, 300)], 2, 1, 128, Dtype::Bf16);
    c.p.path = attention::Path::Hopper;
    let b = BwdCase {
        c,
        with_dlse: false,
        deterministic: false,
    };
    let x = inputs::<bf16>(&b);
    let p = &b.c.p;
    const GUARD: usize = 4096;
    // Totals 510 and 510, longest lengths 300 and 300. The last set gives the first and the
    // third sequence the same rows (and overlapping accumulator tiles).
    let bad: [(&[i32], &[i32]); 4] = [
        (&[0, 5000, -7, 510], &[0, 450, 300, 450]),
        (&[-100, 20, 60, 100_000], &[50, 10, i32::MAX, i32::MIN]),
        (&[510, 510, 510, 510], &[0, 0, 0, 0]),
        (&[0, 300, 0, 300], &[0, 200, 0, 200]),
    ];
    for (cu_q, cu_k) in bad {
        for deterministic in [false, true] {
            let what = format!("cu_seqlens {cu_q:?} / {cu_k:?}, deterministic {deterministic}");
            let out = (|| -> kernels::Result<bool> {
                let stream = g.stream()?;
                let (q, k, v, o, d_o) = (
                    upload(&x.q)?,
                    upload(&x.k)?,
                    upload(&x.v)?,
                    upload(&x.o)?,
                    upload(&x.d_o)?,
                );
                let lse = upload(&x.lse)?;
                let (cq, ck) = (upload(cu_q)?, upload(cu_k)?);
                let (qs, ks) = (p.q_shape(), p.kv_shape());
                let guarded = |n: usize| poisoned::<bf16>(n + GUARD);
                let (dq, dk, dv) = (
                    guarded(x.q.len())?,
                    guarded(x.k.len())?,
                    guarded(x.k.len())?,
                );
                // SAFETY: prefixes of the guarded buffers, which outlive the run.
                let prefix = |b: &kernels::DeviceBuffer<bf16>, n: usize| unsafe {
                    DevView::<bf16>::from_raw(DevView::from(b).addr(), n)
                };
                let tensors = AttentionVarlenBackwardTensors {
                    q: View::packed_contiguous(&q, qs),
                    k: View::packed_contiguous(&k, ks),
                    v: View::packed_contiguous(&v, ks),
                    o: View::packed_contiguous(&o, qs),
                    d_o: View::packed_contiguous(&d_o, qs),
                    lse: (&lse).into(),
                    d_lse: None,
                    dq: View::packed_contiguous(prefix(&dq, x.q.len()), qs),
                    dk: View::packed_contiguous(prefix(&dk, x.k.len()), ks),
                    dv: View::packed_contiguous(prefix(&dv, x.k.len()), ks),
                    cu_seqlens_q: (&cq).into(),
                    cu_seqlens_k: (&ck).into(),
                    sinks: None,
                    d_sinks: None,
                };
                let plan =
                    p.plan_backward(Target::of(g), &tensors, BackwardOptions { deterministic })?;
                let delta = poisoned::<f32>(plan.delta_len() + GUARD)?;
                let accum = poisoned::<f32>(plan.dq_accum_len() + GUARD)?;
                // SAFETY: prefixes of the guarded workspace buffers, which outlive the run.
                let ws = unsafe {
                    BackwardWorkspace {
                        delta: DevView::from_raw(DevView::from(&delta).addr(), plan.delta_len()),
                        dq_accum: Some(DevView::from_raw(
                            DevView::from(&accum).addr(),
                            plan.dq_accum_len(),
                        )),
                    }
                };
                // SAFETY: the buffers live until the synchronization below; the outputs and
                // the workspace are fresh and apart from the inputs.
                unsafe {
                    plan.run(
                        &OnStream {
                            gpu: g,
                            stream: &stream,
                        },
                        &ws,
                    )
                }?;
                g.sync(&stream, "attention varlen backward (bad boundaries)")?;
                let tail_bf16 =
                    |b: &kernels::DeviceBuffer<bf16>, n: usize| -> kernels::Result<bool> {
                        Ok(download(b)?[n..].iter().all(|x| x.to_bits() == 0xffff))
                    };
                let tail_f32 =
                    |b: &kernels::DeviceBuffer<f32>, n: usize| -> kernels::Result<bool> {
                        Ok(download(b)?[n..].iter().all(|x| x.to_bits() == u32::MAX))
                    };
                Ok(tail_bf16(&dq, x.q.len())?
                    && tail_bf16(&dk, x.k.len())?
                    && tail_bf16(&dv, x.k.len())?
                    && tail_f32(&delta, plan.delta_len())?
                    && tail_f32(&accum, plan.dq_accum_len())?)
            })();
            let intact = gpu_ok(out)?;
            ensure(intact, || {
                format!("{what}: a write past dQ, dK, dV or the workspace")
            })?;
        }
    }
    println!(
        "4 sets of contradictory boundaries, both modes, on the Hopper kernels: completed, \
         guards intact"
    );
    Ok(())
}

/// The raw API (`backward_varlen_raw`: addresses, shapes, strides, a stream handle, the
/// boundaries and the workspace as device tensors) gives bitwise the typed API's gradients
/// (deterministic mode, so that both are reproducible).
fn gpu_raw_api(g: &Gpu) -> TestResult {
    use kernels::raw::{ElemType, RawStream, RawTensor};
    let mut c = vcase(
        &[(77, 50), (0, 3), (1, 1), (130, 200)],
        4,
        2,
        64,
        Dtype::Bf16,
    );
    c.p.causal = true;
    let b = BwdCase {
        c,
        with_dlse: true,
        deterministic: true,
    };
    let x = inputs::<bf16>(&b);
    let typed = gpu_ok(gpu_grads(g, &b, &x))?;
    let p = &b.c.p;
    let raw = (|| -> kernels::Result<[Vec<bf16>; 3]> {
        let stream = g.stream()?;
        let s = seqlens(&b.c);
        let (q, k, v, o, d_o) = (
            upload(&x.q)?,
            upload(&x.k)?,
            upload(&x.v)?,
            upload(&x.o)?,
            upload(&x.d_o)?,
        );
        let (lse, d_lse) = (
            upload(&x.lse)?,
            upload(x.d_lse.as_ref().expect("with dLSE"))?,
        );
        let (cu_q, cu_k) = (upload(s.q())?, upload(s.k())?);
        let (dq, dk, dv) = (
            poisoned::<bf16>(x.q.len())?,
            poisoned::<bf16>(x.k.len())?,
            poisoned::<bf16>(x.k.len())?,
        );
        let lens = attention::backward_varlen_workspace_lens(
            &p.q_shape(),
            &p.kv_shape(),
            p.batch,
            p.max_seqlen_q,
            p.max_seqlen_k,
            ElemType::Bf16,
            BackwardOptions {
                deterministic: true,
            },
        )?;
        let delta = poisoned::<f32>(lens.delta)?;
        let accum = poisoned::<f32>(lens.dq_accum)?;
        let t = |buf: &kernels::DeviceBuffer<bf16>, shape: [usize; 3]| {
            RawTensor::contiguous(buf.as_device_ptr().as_raw(), ElemType::Bf16, &shape)
        };
        let (qs, ks) = (p.q_shape(), p.kv_shape());
        let lse_shape = [p.heads_q, p.total_q];
        let tensors = attention::RawAttentionVarlenBackwardTensors {
            q: &t(&q, qs),
            k: &t(&k, ks),
            v: &t(&v, ks),
            o: &t(&o, qs),
            lse: &RawTensor::contiguous(lse.as_device_ptr().as_raw(), ElemType::F32, &lse_shape),
            d_o: &t(&d_o, qs),
            d_lse: Some(&RawTensor::contiguous(
                d_lse.as_device_ptr().as_raw(),
                ElemType::F32,
                &lse_shape,
            )),
            dq: &t(&dq, qs),
            dk: &t(&dk, ks),
            dv: &t(&dv, ks),
            cu_seqlens_q: &RawTensor::contiguous(
                cu_q.as_device_ptr().as_raw(),
                ElemType::I32,
                &[cu_q.len()],
            ),
            cu_seqlens_k: &RawTensor::contiguous(
                cu_k.as_device_ptr().as_raw(),
                ElemType::I32,
                &[cu_k.len()],
            ),
            sinks: None,
            d_sinks: None,
        };
        let ws = kernels::attention::RawBackwardWorkspace {
            delta: &RawTensor::contiguous(
                delta.as_device_ptr().as_raw(),
                ElemType::F32,
                &[delta.len()],
            ),
            dq_accum: Some(&RawTensor::contiguous(
                accum.as_device_ptr().as_raw(),
                ElemType::F32,
                &[accum.len()],
            )),
        };
        let options = attention::AttentionOptions {
            causal: true,
            ..Default::default()
        };
        // SAFETY: a live stream of the GPU's context (the device's primary context, as
        // `Gpu::new` retains it), kept until the end of this closure.
        let raw_stream = unsafe { RawStream::new(g.ordinal(), stream.as_inner() as u64) }?;
        // SAFETY: every tensor and the workspace lie in live device buffers of this closure,
        // synchronized below before the buffers drop.
        unsafe {
            attention::backward_varlen_raw(
                &raw_stream,
                &options,
                BackwardOptions {
                    deterministic: true,
                },
                &tensors,
                &ws,
                p.max_seqlen_q,
                p.max_seqlen_k,
            )
        }?;
        g.sync(&stream, "attention varlen backward (raw)")?;
        Ok([download(&dq)?, download(&dk)?, download(&dv)?])
    })();
    let raw = gpu_ok(raw)?;
    for (i, name) in ["dQ", "dK", "dV"].iter().enumerate() {
        ensure(
            raw[i]
                .iter()
                .zip(&typed[i])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            || format!("raw {name} differs bitwise from the typed API's"),
        )?;
    }
    let [dq, dk, dv] = &raw;
    compare(
        &format!("raw {} on {}", bwd_name(&b), g.arch()),
        &b.c,
        &x,
        dq,
        dk,
        dv,
    )
}

pub fn register(s: &mut Suite) {
    for b in emulated_cases() {
        let n = format!("attention_varlen_bwd/emulated/{}", bwd_name(&b));
        s.cpu(&n, move || match b.c.p.dtype {
            Dtype::Bf16 => run_emulated::<bf16>(&b),
            Dtype::F16 => run_emulated::<f16>(&b),
        });
    }
    s.gpu("attention_varlen_bwd/gpu/raw_api", Needs::Gpu, gpu_raw_api);
    s.gpu(
        "attention_varlen_bwd/gpu/hopper_clamps_bad_boundaries",
        Needs::Hopper,
        gpu_hopper_clamps_bad_boundaries,
    );
    s.gpu(
        "attention_varlen_bwd/gpu/deterministic_bitwise",
        Needs::Gpu,
        gpu_deterministic_bitwise,
    );
    for b in gpu_cases() {
        // The automatic path (the Hopper dK/dV/dQ kernel over packed sequences on sm_90a) and,
        // for the bf16 cases, the mma.sync kernels forced (`_mma`): both paths are tested on a
        // Hopper GPU.
        let mut paths = vec![attention::Path::Auto];
        if b.c.p.dtype == Dtype::Bf16 {
            paths.push(attention::Path::MmaSync);
        }
        for path in paths {
            let mut b = b.clone();
            b.c.p.path = path;
            let mma = if path == attention::Path::MmaSync {
                "_mma"
            } else {
                ""
            };
            let n = format!("attention_varlen_bwd/gpu/{}{mma}", bwd_name(&b));
            s.gpu(&n, Needs::Gpu, move |g| match b.c.p.dtype {
                Dtype::Bf16 => run_gpu::<bf16>(g, &b),
                Dtype::F16 => run_gpu::<f16>(g, &b),
            });
        }
    }
    for b in value_dim_cases() {
        let n = format!("attention_varlen_bwd/hopper_value_dim/{}", bwd_name(&b));
        s.gpu(&n, Needs::Hopper, move |g| match b.c.p.dtype {
            Dtype::Bf16 => run_gpu::<bf16>(g, &b),
            Dtype::F16 => run_gpu::<f16>(g, &b),
        });
    }
}

/// V, O and dO of their own head dimension (the pairs of `VALUE_DIMS`; the Hopper kernels):
/// batches with empty, short and long sequences, every mask, GQA, both modes, f16.
fn value_dim_cases() -> Vec<BwdCase> {
    let mut v = Vec::new();
    for (d, dv) in kernel_abi::attention::VALUE_DIMS {
        let (d, dv) = (d as usize, dv as usize);
        let batches: [&[(usize, usize)]; 2] = [
            &[(113, 203), (0, 7), (1, 1), (239, 17), (5, 0)],
            &[(300, 300), (64, 64), (129, 65), (700, 1000)],
        ];
        for (bi, lens) in batches.iter().enumerate() {
            for mask in 0..3 {
                for deterministic in [false, true] {
                    let (hq, hkv) = if mask == 1 { (4, 2) } else { (2, 2) };
                    let dtype = if mask == 2 { Dtype::F16 } else { Dtype::Bf16 };
                    let mut c = vcase(lens, hq, hkv, d, dtype);
                    c.p = c.p.value_dim(dv);
                    c.seed = c.seed.wrapping_add(dv as u64);
                    match mask {
                        1 => c.p.causal = true,
                        2 => c.p.window = (Some(40), Some(7)),
                        _ => {}
                    }
                    v.push(BwdCase {
                        c,
                        with_dlse: bi == 0,
                        deterministic,
                    });
                }
            }
        }
    }
    v
}
