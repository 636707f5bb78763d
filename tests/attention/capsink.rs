//! Softcap and attention sinks (the `capsink` kernels) against the f64 reference
//! (`attention::reference_with_sinks`, `attention::reference_varlen_with_sinks`), with the dense
//! tests' tolerance: `max |O - ref| <= 2 max |O_naive - ref| + 1e-3` (`O_naive` the
//! same-precision naive computation with the same softcap and sinks), LSE within
//! `1e-3 max(1, |ref|)` and `-inf` exactly where the reference has it; outputs poisoned with NaN
//! before the run, so every element must be written.
//!
//! Names: `attention_capsink/emulated/*` (the `mma.sync` kernels' own code in the CPU
//! emulator), `attention_capsink/{hopper,mma}/*` (a GPU), `attention_capsink/varlen_*` (packed
//! sequences: `varlen_emulated`, `varlen_{hopper,mma}` on a GPU), `attention_capsink/rejects_*`
//! (typed errors).

use super::varlen::{VarlenCase, check_outputs, seqlens, vcase};
use super::{Case, case, name};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok};
use kernels::attention::{
    self, AttentionElem, AttentionProblem, AttentionTensors, AttentionVarlenTensors, Dtype, Path,
    Target, View,
};
use kernels::data::rng;
use kernels::exec::{DevView, OnStream};
use kernels::memory::{download, poisoned, upload};
use kernels::{Arch, Error, Gpu, bf16, f16};
use rand::Rng;

/// A case with a softcap and/or sinks: `sinks` are the logits, or `None`.
#[derive(Clone, Debug)]
struct CapCase {
    c: Case,
    sinks: Option<Vec<f32>>,
}

/// Sinks of `heads` query heads uniform in `[lo, hi)` (seeded).
fn sink_values(heads: usize, (lo, hi): (f32, f32), seed: u64) -> Vec<f32> {
    let mut r = rng(seed ^ 0x51_4b);
    (0..heads).map(|_| r.random_range(lo..hi)).collect()
}

/// `c` with a softcap and sinks in `sinks` (a range), either optional.
fn with(mut c: Case, softcap: Option<f32>, sinks: Option<(f32, f32)>) -> CapCase {
    c.p.softcap = softcap;
    c.p.sinks = sinks.is_some();
    let sinks = sinks.map(|r| sink_values(c.p.heads_q, r, c.seed));
    CapCase { c, sinks }
}

fn cap_name(cc: &CapCase) -> String {
    let mut s = name(&cc.c);
    if let Some(c) = cc.c.p.softcap {
        s.push_str(&format!("_softcap{c}"));
    }
    if let Some(sinks) = &cc.sinks {
        let (lo, hi) = sinks
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        s.push_str(&format!("_sinks{lo:.0}..{hi:.0}"));
    }
    s
}

/// The dense cases: softcap alone (strongly capping: logits up to ~10 against a cap of 2 or
/// 5), sinks alone, both; masks with rows that have no allowed key (their LSE is the sink),
/// grouped-query heads, a sink far above every logit (O near 0, an LSE from the sink) and one of
/// -inf (no effect).
fn cases(d: usize) -> Vec<CapCase> {
    let mut v = Vec::new();
    let mut strong = case(2, 113, 203, 4, 2, d, Dtype::Bf16);
    strong.range = 3.0;
    v.push(with(strong.clone(), Some(2.0), None));
    v.push(with(strong.clone(), Some(5.0), Some((-3.0, 3.0))));
    v.push(with(
        case(1, 65, 100, 2, 1, d, Dtype::Bf16),
        None,
        Some((-1.0, 4.0)),
    ));
    let mut causal = case(1, 150, 100, 2, 2, d, Dtype::Bf16); // 50 rows with no allowed key
    causal.p.causal = true;
    v.push(with(causal.clone(), Some(10.0), Some((-2.0, 2.0))));
    let mut window = case(1, 140, 200, 2, 1, d, Dtype::Bf16);
    window.p.window = (Some(40), Some(8));
    v.push(with(window, Some(3.0), Some((0.0, 1.0))));
    v.push(with(
        case(1, 17, 9, 2, 1, d, Dtype::Bf16),
        None,
        Some((30.0, 40.0)),
    ));
    let mut neg = with(case(1, 17, 9, 2, 1, d, Dtype::Bf16), None, Some((0.0, 1.0)));
    neg.sinks = Some(vec![f32::NEG_INFINITY; 2]);
    v.push(neg);
    v
}

/// Larger GPU cases at head dimension `d`: many key steps, causal and windowed, f16.
fn gpu_cases(d: usize) -> Vec<CapCase> {
    let mut v = cases(d);
    let mut long = case(2, 1023, 1024, 4, 2, d, Dtype::Bf16);
    long.range = 2.0;
    v.push(with(long.clone(), Some(4.0), Some((-2.0, 2.0))));
    long.p.causal = true;
    v.push(with(long, Some(30.0), Some((-1.0, 1.0))));
    let mut f = case(2, 257, 300, 8, 2, d, Dtype::F16);
    f.p.window = (Some(100), Some(0));
    v.push(with(f, Some(50.0), Some((-2.0, 2.0))));
    v
}

pub(super) fn register(s: &mut Suite) {
    for d in super::head_dims() {
        // The emulator runs one OS thread per GPU thread: the smaller cases only, at the
        // dimensions of the full lists.
        for cc in cases(d)
            .into_iter()
            .filter(|cc| super::FULL_CASE_DIMS.contains(&d) && (d <= 128 || cc.c.p.seq_q < 100))
        {
            let n = format!("attention_capsink/emulated/{}", cap_name(&cc));
            s.cpu(&n, move || run_emulated(&cc));
        }
        for cc in gpu_cases(d) {
            for (path, needs, tag) in [
                (Path::Hopper, Needs::Hopper, "hopper"),
                (Path::MmaSync, Needs::Gpu, "mma"),
            ] {
                let mut cc = cc.clone();
                cc.c.p.path = path;
                let n = format!("attention_capsink/{tag}/{}", cap_name(&cc));
                s.gpu(&n, needs, move |g| match cc.c.p.dtype {
                    Dtype::Bf16 => run_gpu::<bf16>(g, &cc),
                    Dtype::F16 => run_gpu::<f16>(g, &cc),
                });
            }
        }
    }
    for (d, softcap) in [(128, Some(3.0)), (64, None)] {
        let lens = [(0, 5), (17, 0), (70, 45), (1, 1), (130, 200)];
        let mut vc = vcase(&lens, 4, 2, d, Dtype::Bf16);
        vc.p.causal = true;
        vc.p.softcap = softcap;
        vc.p.sinks = true;
        let sinks = sink_values(4, (-2.0, 2.0), vc.seed);
        let n = format!(
            "attention_capsink/varlen_emulated/{}",
            super::varlen::name(&vc)
        );
        for (path, needs, tag) in [
            (Path::Hopper, Needs::Hopper, "hopper"),
            (Path::MmaSync, Needs::Gpu, "mma"),
        ] {
            let (mut vc, sinks) = (vc.clone(), sinks.clone());
            vc.p.path = path;
            let n = format!(
                "attention_capsink/varlen_{tag}/{}",
                super::varlen::name(&vc)
            );
            s.gpu(&n, needs, move |g| run_varlen(&vc, &sinks, Some(g)));
        }
        s.cpu(&n, move || run_varlen(&vc, &sinks, None));
    }
    s.cpu("attention_capsink/rejects_bad_options", rejects_bad_options);
}

fn check_dense<T: AttentionElem>(
    what: &str,
    cc: &CapCase,
    (q, k, v): (&[T], &[T], &[T]),
    o: &[T],
    lse: &[f32],
) -> TestResult {
    let p = &cc.c.p;
    let (want, naive) = match &cc.sinks {
        Some(s) => (
            attention::reference_with_sinks(p, q, k, v, s),
            attention::naive_same_precision_sinks(p, q, k, v, Some(s)),
        ),
        None => (
            attention::reference(p, q, k, v),
            attention::naive_same_precision(p, q, k, v),
        ),
    };
    check_outputs(what, o, lse, &want, &naive.o)
}

/// The `mma.sync` capsink kernel in the CPU emulator.
fn run_emulated(cc: &CapCase) -> TestResult {
    let p = &cc.c.p;
    let (q, k, v) = super::inputs::<bf16>(&cc.c);
    let (mut dq, mut dk, mut dv) = (
        HostBuf::from_slice(&q),
        HostBuf::from_slice(&k),
        HostBuf::from_slice(&v),
    );
    let mut o = HostBuf::filled(q.len(), bf16::NAN);
    let mut lse = HostBuf::filled(p.lse_len(), f32::NAN);
    let mut sinks = cc.sinks.as_deref().map(HostBuf::from_slice);
    let tensors = AttentionTensors {
        q: View::contiguous(dq.view(), p.q_shape()),
        k: View::contiguous(dk.view(), p.kv_shape()),
        v: View::contiguous(dv.view(), p.kv_shape()),
        o: View::contiguous(o.view(), p.q_shape()),
        lse: lse.view(),
        sinks: sinks.as_mut().map(|s| s.view()),
        tile_counter: None,
    };
    let what = format!("emulated {} (seed {})", cap_name(cc), cc.c.seed);
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 1,
    };
    let plan = p
        .plan(target, &tensors, None)
        .map_err(|e| format!("{what}: {e}"))?;
    ensure(plan.kernel().name.contains("capsink"), || {
        format!("{what}: planned {}", plan.kernel().name)
    })?;
    // SAFETY: the views cover the host buffers (checked by the plan), which outlive the
    // (synchronous) emulated launch; O and LSE overlap nothing.
    unsafe { plan.run(&Emulator) }.map_err(|e| format!("{what}: {e}"))?;
    ensure(o.guards_intact() && lse.guards_intact(), || {
        format!("{what}: a write outside its buffer")
    })?;
    check_dense(&what, cc, (&q, &k, &v), &o.to_vec(), &lse.to_vec())
}

/// The capsink kernel of the case's path on the GPU.
fn run_gpu<T: AttentionElem>(g: &Gpu, cc: &CapCase) -> TestResult {
    let p = &cc.c.p;
    let (q, k, v) = super::inputs::<T>(&cc.c);
    let what = format!("{} (seed {})", cap_name(cc), cc.c.seed);
    let out = (|| -> kernels::Result<(Vec<T>, Vec<f32>, String)> {
        let stream = g.stream()?;
        let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
        let dout = poisoned::<T>(q.len())?;
        let dlse = poisoned::<f32>(p.lse_len())?;
        let dsinks = cc.sinks.as_deref().map(upload).transpose()?;
        let tensors = AttentionTensors {
            q: View::contiguous(&dq, p.q_shape()),
            k: View::contiguous(&dk, p.kv_shape()),
            v: View::contiguous(&dv, p.kv_shape()),
            o: View::contiguous(&dout, p.q_shape()),
            lse: (&dlse).into(),
            sinks: dsinks.as_ref().map(DevView::from),
            tile_counter: None,
        };
        let plan = p.plan(Target::of(g), &tensors, None)?;
        let kernel = plan.kernel().name.to_string();
        // SAFETY: the buffers live until the synchronization below; O and LSE are fresh.
        unsafe {
            plan.run(&OnStream {
                gpu: g,
                stream: &stream,
            })
        }?;
        g.sync(&stream, "attention capsink forward")?;
        Ok((download(&dout)?, download(&dlse)?, kernel))
    })();
    let (o, lse, kernel) = gpu_ok(out)?;
    ensure(kernel.contains("capsink"), || {
        format!("{what}: planned {kernel}")
    })?;
    check_dense(&format!("{kernel}: {what}"), cc, (&q, &k, &v), &o, &lse)
}

/// Packed sequences with sinks (and a softcap): in the emulator (`g` `None`) or on the GPU.
fn run_varlen(vc: &VarlenCase, sinks: &[f32], g: Option<&Gpu>) -> TestResult {
    let p = &vc.p;
    let s = seqlens(vc);
    let (q, k, v) = super::varlen::inputs::<bf16>(vc);
    let what = format!("{} (seed {})", super::varlen::name(vc), vc.seed);
    let (o, lse) = match g {
        None => {
            let (mut dq, mut dk, mut dv) = (
                HostBuf::from_slice(&q),
                HostBuf::from_slice(&k),
                HostBuf::from_slice(&v),
            );
            let (mut cq, mut ck) = (HostBuf::from_slice(s.q()), HostBuf::from_slice(s.k()));
            let mut o = HostBuf::filled(q.len(), bf16::NAN);
            let mut lse = HostBuf::filled(p.lse_len(), f32::NAN);
            let mut ds = HostBuf::from_slice(sinks);
            let tensors = AttentionVarlenTensors {
                q: View::packed_contiguous(dq.view(), p.q_shape()),
                k: View::packed_contiguous(dk.view(), p.kv_shape()),
                v: View::packed_contiguous(dv.view(), p.kv_shape()),
                o: View::packed_contiguous(o.view(), p.q_shape()),
                lse: lse.view(),
                cu_seqlens_q: cq.view(),
                cu_seqlens_k: ck.view(),
                sinks: Some(ds.view()),
                tile_counter: None,
            };
            let target = Target {
                arch: Arch::Sm80,
                multiprocessors: 1,
            };
            let plan = p
                .plan(target, &tensors)
                .map_err(|e| format!("{what}: {e}"))?;
            // SAFETY: as in `run_emulated`.
            unsafe { plan.run(&Emulator) }.map_err(|e| format!("{what}: {e}"))?;
            ensure(o.guards_intact() && lse.guards_intact(), || {
                format!("{what}: a write outside its buffer")
            })?;
            (o.to_vec(), lse.to_vec())
        }
        Some(g) => {
            let out = (|| -> kernels::Result<(Vec<bf16>, Vec<f32>, String)> {
                let stream = g.stream()?;
                let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
                let (cq, ck, ds) = (upload(s.q())?, upload(s.k())?, upload(sinks)?);
                let counter = upload(&[0u32])?;
                let dout = poisoned::<bf16>(q.len())?;
                let dlse = poisoned::<f32>(p.lse_len())?;
                let tensors = AttentionVarlenTensors {
                    q: View::packed_contiguous(&dq, p.q_shape()),
                    k: View::packed_contiguous(&dk, p.kv_shape()),
                    v: View::packed_contiguous(&dv, p.kv_shape()),
                    o: View::packed_contiguous(&dout, p.q_shape()),
                    lse: (&dlse).into(),
                    cu_seqlens_q: (&cq).into(),
                    cu_seqlens_k: (&ck).into(),
                    sinks: Some((&ds).into()),
                    tile_counter: Some((&counter).into()),
                };
                let plan = p.plan(Target::of(g), &tensors)?;
                let kernel = plan.kernel().name.to_string();
                // SAFETY: the buffers live until the synchronization below; the tile counter
                // is zero and this launch's only.
                unsafe {
                    plan.run(&OnStream {
                        gpu: g,
                        stream: &stream,
                    })
                }?;
                g.sync(&stream, "attention varlen capsink forward")?;
                Ok((download(&dout)?, download(&dlse)?, kernel))
            })();
            let (o, lse, kernel) = gpu_ok(out)?;
            let hopper = p.path == Path::Hopper;
            ensure(
                kernel.contains("capsink") && kernel.contains("hopper") == hopper,
                || format!("{what}: planned {kernel} for {:?}", p.path),
            )?;
            (o, lse)
        }
    };
    let want = attention::reference_varlen_with_sinks(p, &s, &q, &k, &v, sinks);
    let naive = attention::naive_varlen_same_precision_sinks(p, &s, &q, &k, &v, Some(sinks));
    check_outputs(&what, &o, &lse, &want, &naive.o)
}

/// Typed errors: a softcap that is not a positive finite number, sinks missing, unexpected, of
/// the wrong length; a tuning variant with a softcap; the backward's sinks and their gradient
/// not given together or of the wrong length. The backward's kernels for a softcap (on both
/// paths) and for sinks.
fn rejects_bad_options() -> TestResult {
    let base = AttentionProblem::new(1, 16, 16, 4, 2, 64, Dtype::Bf16);
    for c in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let p = base.clone().softcap(c);
        ensure(
            matches!(p.validate(), Err(Error::InvalidArgument { .. })),
            || format!("softcap {c} accepted: {:?}", p.validate()),
        )?;
    }
    let dev = |addr: u64, len: usize| {
        // SAFETY: only planned, never dereferenced.
        unsafe { DevView::<bf16>::from_raw(addr, len) }
    };
    let devf = |addr: u64, len: usize| {
        // SAFETY: only planned, never dereferenced.
        unsafe { DevView::<f32>::from_raw(addr, len) }
    };
    let target = Target {
        arch: Arch::Sm90a,
        multiprocessors: 132,
    };
    let plan = |p: &AttentionProblem, sinks: Option<usize>, variant: Option<&str>| {
        let (qn, kn) = (p.q_shape().iter().product(), p.kv_shape().iter().product());
        let t = AttentionTensors {
            q: View::contiguous(dev(1 << 40, qn), p.q_shape()),
            k: View::contiguous(dev(2 << 40, kn), p.kv_shape()),
            v: View::contiguous(dev(3 << 40, kn), p.kv_shape()),
            o: View::contiguous(dev(4 << 40, qn), p.q_shape()),
            lse: devf(5 << 40, p.lse_len()),
            sinks: sinks.map(|n| devf(6 << 40, n)),
            tile_counter: None,
        };
        p.plan(target, &t, variant)
            .map(|plan| plan.kernel().name.to_string())
    };
    let sinky = base.clone().with_sinks();
    for (what, r) in [
        ("sinks missing", plan(&sinky, None, None)),
        ("sinks unexpected", plan(&base, Some(4), None)),
        ("sinks of 3 heads", plan(&sinky, Some(3), None)),
        (
            "variant with a softcap",
            plan(&base.clone().softcap(5.0), None, Some("hpp64")),
        ),
    ] {
        ensure(r.is_err(), || format!("{what}: planned {r:?}"))?;
        println!("{what}: {}", r.unwrap_err());
    }
    let ok = plan(&sinky.clone().softcap(5.0), Some(4), None).map_err(|e| e.to_string())?;
    ensure(ok == "attention_fwd_hopper_capsink_bf16_d64", || {
        format!("planned {ok}")
    })?;
    // The backward: the softcap kernels on the mma.sync path (the Hopper kernels have no
    // softcap form), sinks and their gradient present exactly together.
    let bwd = |p: &AttentionProblem, sinks: Option<usize>, d_sinks: Option<usize>| {
        let (qn, kn) = (p.q_shape().iter().product(), p.kv_shape().iter().product());
        let view = |a: u64, n: usize, shape| View::contiguous(dev(a << 40, n), shape);
        let t = attention::AttentionBackwardTensors {
            q: view(1, qn, p.q_shape()),
            k: view(2, kn, p.kv_shape()),
            v: view(3, kn, p.kv_shape()),
            o: view(4, qn, p.q_shape()),
            d_o: view(5, qn, p.q_shape()),
            lse: devf(6 << 40, p.lse_len()),
            d_lse: None,
            dq: view(7, qn, p.q_shape()),
            dk: view(8, kn, p.kv_shape()),
            dv: view(9, kn, p.kv_shape()),
            sinks: sinks.map(|n| devf(10 << 40, n)),
            d_sinks: d_sinks.map(|n| devf(11 << 40, n)),
        };
        p.plan_backward(target, &t, Default::default())
    };
    let ws_of = |plan: &attention::AttentionBackwardPlan| attention::BackwardWorkspace {
        delta: devf(12 << 40, plan.delta_len()),
        dq_accum: Some(devf(13 << 40, plan.dq_accum_len())),
    };
    let capped = base.clone().softcap(5.0);
    for (what, r) in [
        (
            "backward sinks missing",
            bwd(&sinky, None, Some(4)).map(|_| ()),
        ),
        (
            "backward dsinks missing",
            bwd(&sinky, Some(4), None).map(|_| ()),
        ),
        (
            "backward dsinks of 3 heads",
            bwd(&sinky, Some(4), Some(3)).map(|_| ()),
        ),
        (
            "backward dsinks unexpected",
            bwd(&base, None, Some(4)).map(|_| ()),
        ),
    ] {
        ensure(r.is_err(), || format!("{what}: planned"))?;
        println!("{what}: {}", r.unwrap_err());
    }
    for (p, want) in [
        (
            capped.clone(),
            "attention_bwd_hopper_dkdvq_softcap_bf16_d64",
        ),
        (
            capped.clone().path(Path::MmaSync),
            "attention_bwd_softcap_bf16_d64",
        ),
    ] {
        let plan = bwd(&p, None, None).map_err(|e| e.to_string())?;
        let name = plan.launches(&ws_of(&plan))?.dkdv.name();
        ensure(name == want, || format!("softcap backward planned {name}"))?;
    }
    let plan = bwd(&sinky, Some(4), Some(4)).map_err(|e| e.to_string())?;
    let launches = plan.launches(&ws_of(&plan))?;
    ensure(
        launches.dsinks.as_ref().map(|l| l.name()) == Some("attention_bwd_dsinks")
            && launches.dkdv.name() == "attention_bwd_hopper_dkdvq_bf16_d64",
        || format!("sinks backward planned {}", launches.dkdv.name()),
    )?;
    Ok(())
}
