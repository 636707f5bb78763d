//! The attention backward through its other interfaces (`attention_bwd/strided_views_*`,
//! `attention_bwd/raw_api`, `attention_bwd/emulated/strided_views_*`): tensors as strided
//! views of packed buffers, and the raw API on addresses, against the contiguous typed runs
//! and the f64 reference (the tolerance of the parent module).

use super::*;

/// Q, K, V, O, dO as strided views of one packed `[b, s, 5, h, d]` buffer; dQ, dK, dV as views
/// of one packed `[b, s, 3, h, d]` output (MHA, `seq_q = seq_k`): the plan must accept the
/// interleaved, non-overlapping outputs, and the results match the contiguous run's.
pub(super) fn strided_views(g: &Gpu, deterministic: bool) -> TestResult {
    let (bs, s, h, d) = (2, 150, 3, 64);
    let mut c = case(bs, s, s, h, h, d, Dtype::Bf16);
    c.p.causal = true;
    let b = BwdCase {
        c,
        with_dlse: false,
        deterministic,
    };
    let p = b.c.p.clone();
    let x = inputs::<bf16>(&b);
    let row = h * d;
    let dims = (bs, s, row);
    let packed = pack(&[&x.q, &x.k, &x.v, &x.o, &x.d_o], dims);
    let shape = [bs, s, h, d];
    let out = (|| -> kernels::Result<Vec<bf16>> {
        let stream = g.stream()?;
        let dp = upload(&packed)?;
        let lse = upload(&x.lse)?;
        let grads = poisoned::<bf16>(bs * s * 3 * row)?;
        let in_strides = [s * 5 * row, 5 * row, d, 1];
        let out_strides = [s * 3 * row, 3 * row, d, 1];
        let view = |i: usize| View::new(&dp, i * row, &shape, &in_strides);
        let out = |i: usize| View::new(&grads, i * row, &shape, &out_strides);
        attention::backward(
            g,
            &stream,
            &p,
            &view(0)?,
            &view(1)?,
            &view(2)?,
            &view(3)?,
            &lse,
            &view(4)?,
            None,
            &mut out(0)?,
            &mut out(1)?,
            &mut out(2)?,
            BackwardOptions { deterministic },
        )?;
        download(&grads)
    })();
    let grads = gpu_ok(out)?;
    compare(
        &format!("strided views ({})", bwd_name(&b)),
        &p,
        &x,
        &unpack(&grads, 3, 0, dims),
        &unpack(&grads, 3, 1, dims),
        &unpack(&grads, 3, 2, dims),
    )
}

/// The raw API (`backward_raw`: addresses, shapes, strides, a stream handle, a workspace the
/// caller allocates of `backward_workspace_lens`) in both modes, with dLSE and grouped-query
/// heads: bitwise equal to the typed API in deterministic mode, within the tolerance in the
/// atomic one; a workspace overlapping dQ, one too short, and one in host memory refused.
pub(super) fn raw_api(g: &Gpu) -> TestResult {
    use kernels::raw::{ElemType, RawStream, RawTensor};
    let mut c = case(2, 201, 333, 8, 2, 128, Dtype::Bf16);
    c.p.causal = true;
    let b = BwdCase {
        c,
        with_dlse: true,
        deterministic: true,
    };
    let p = b.c.p.clone();
    let x = inputs::<bf16>(&b);
    let out = (|| -> kernels::Result<_> {
        // The stream first: it makes the GPU's context current on this thread, which the
        // uploads need.
        let stream = g.stream()?;
        let d = dev_case(&x)?;
        let det = BackwardOptions {
            deterministic: true,
        };
        let typed = device_backward(g, &stream, &p, &d, det)?;
        // SAFETY: a live stream of the GPU's context (the device's primary context, as
        // `Gpu::new` retains it), kept until the end of this closure.
        let raw_stream = unsafe { RawStream::new(g.ordinal(), stream.as_inner() as u64) }?;
        let (qs, ks) = (p.q_shape(), p.kv_shape());
        let lse_shape = [p.batch, p.heads_q, p.seq_q];
        let t = |buf: &kernels::DeviceBuffer<bf16>, shape: &[usize]| {
            RawTensor::contiguous(buf.as_device_ptr().as_raw(), ElemType::Bf16, shape)
        };
        let f = |buf: &kernels::DeviceBuffer<f32>, shape: &[usize]| {
            RawTensor::contiguous(buf.as_device_ptr().as_raw(), ElemType::F32, shape)
        };
        let (q, k, v, o, d_o) = (
            t(&d.q, &qs),
            t(&d.k, &ks),
            t(&d.v, &ks),
            t(&d.o, &qs),
            t(&d.d_o, &qs),
        );
        let lse = f(&d.lse, &lse_shape);
        let d_lse = d.d_lse.as_ref().map(|dl| f(dl, &lse_shape));
        let options = attention::AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let mut results = Vec::new();
        let mut refused = Vec::new();
        for deterministic in [true, false] {
            let opts = BackwardOptions { deterministic };
            let lens = attention::backward_workspace_lens(&qs, &ks, ElemType::Bf16, opts)?;
            let (dq, dk, dv) = (
                poisoned::<bf16>(d.q.len())?,
                poisoned::<bf16>(d.k.len())?,
                poisoned::<bf16>(d.k.len())?,
            );
            let delta = poisoned::<f32>(lens.delta)?;
            let accum = poisoned::<f32>(lens.dq_accum.max(1))?;
            let (rdq, rdk, rdv) = (t(&dq, &qs), t(&dk, &ks), t(&dv, &ks));
            let rdelta = f(&delta, &[lens.delta]);
            let raccum = f(&accum, &[lens.dq_accum]);
            let tensors = attention::RawAttentionBackwardTensors {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lse,
                d_o: &d_o,
                d_lse: d_lse.as_ref(),
                dq: &rdq,
                dk: &rdk,
                dv: &rdv,
                sinks: None,
                d_sinks: None,
            };
            let launch = |delta: &RawTensor| {
                let ws = attention::RawBackwardWorkspace {
                    delta,
                    dq_accum: Some(&raccum),
                };
                // SAFETY: every tensor and the good workspace lie in live device buffers of
                // this closure, synchronized below before they drop; the bad workspaces are
                // refused before any launch (the test's assertion).
                unsafe { attention::backward_raw(&raw_stream, &options, opts, &tensors, &ws) }
            };
            launch(&rdelta)?;
            g.sync(&stream, "attention backward (raw)")?;
            results.push((download(&dq)?, download(&dk)?, download(&dv)?));
            if deterministic {
                let host = vec![0f32; lens.delta];
                let host_delta =
                    RawTensor::contiguous(host.as_ptr() as u64, ElemType::F32, &[lens.delta]);
                let short = f(&delta, &[lens.delta - 1]);
                let on_dq = RawTensor::contiguous(rdq.ptr, ElemType::F32, &[lens.delta]);
                refused = [&host_delta, &short, &on_dq]
                    .map(launch)
                    .into_iter()
                    .collect();
            }
        }
        Ok((typed, results, refused))
    })();
    let (typed, results, refused) = gpu_ok(out)?;
    let bits = |x: &[bf16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let det = &results[0];
    ensure(
        bits(&det.0) == bits(&typed.0)
            && bits(&det.1) == bits(&typed.1)
            && bits(&det.2) == bits(&typed.2),
        || "raw deterministic gradients differ from the typed API's".into(),
    )?;
    let want = [
        "not device memory",
        "backward workspace delta shape",
        "backward workspace delta: the output overlaps dQ",
    ];
    for (r, want) in refused.iter().zip(want) {
        ensure(matches!(r, Err(e) if e.to_string().contains(want)), || {
            format!("a bad workspace ({want}): {r:?}")
        })?;
    }
    println!("attention_bwd/raw_api: deterministic raw == typed bitwise; 3 bad workspaces refused");
    let atomic = &results[1];
    compare(
        &format!("raw API, atomic ({})", bwd_name(&b)),
        &p,
        &x,
        &atomic.0,
        &atomic.1,
        &atomic.2,
    )
}

/// Packs row-major `[b, s, h, d]` tensors into one `[b, s, n, h, d]` buffer.
fn pack<T: Copy + Default>(tensors: &[&[T]], (bs, s, row): (usize, usize, usize)) -> Vec<T> {
    let n = tensors.len();
    let mut packed = vec![T::default(); bs * s * n * row];
    for (which, t) in tensors.iter().enumerate() {
        for i in 0..bs * s {
            let dst = (i * n + which) * row;
            packed[dst..dst + row].copy_from_slice(&t[i * row..(i + 1) * row]);
        }
    }
    packed
}

/// Tensor `which` of a packed `[b, s, n, h, d]` buffer, row-major `[b, s, h, d]`.
fn unpack<T: Copy>(
    packed: &[T],
    n: usize,
    which: usize,
    (bs, s, row): (usize, usize, usize),
) -> Vec<T> {
    let mut v = Vec::with_capacity(bs * s * row);
    for i in 0..bs * s {
        let start = (i * n + which) * row;
        v.extend_from_slice(&packed[start..start + row]);
    }
    v
}

/// [`strided_views`] in the emulator: every kernel reads and writes through its own strides
/// (each tensor's differ from the others' in use).
pub(super) fn strided_emulated(deterministic: bool) -> TestResult {
    let (bs, s, h, d) = (1, 40, 2, 64);
    let mut c = case(bs, s, s, h, h, d, Dtype::Bf16);
    c.p.causal = true;
    let b = BwdCase {
        c,
        with_dlse: true,
        deterministic,
    };
    let p = b.c.p.clone();
    let x = inputs::<bf16>(&b);
    let dims = (bs, s, h * d);
    let mut packed = HostBuf::from_slice(&pack(&[&x.q, &x.k, &x.v, &x.o, &x.d_o], dims));
    let mut grads = HostBuf::filled(bs * s * 3 * h * d, bf16::NAN);
    let mut lse = HostBuf::from_slice(&x.lse);
    let mut d_lse = HostBuf::from_slice(x.d_lse.as_deref().expect("the case has dLSE"));
    let shape = [bs, s, h, d];
    let in_strides = [s * 5 * h * d, 5 * h * d, d, 1];
    let out_strides = [s * 3 * h * d, 3 * h * d, d, 1];
    let (pv, gv) = (packed.view(), grads.view());
    let view = |buf, i: usize, st: &[usize; 4]| View::new(buf, i * h * d, &shape, st);
    let what = format!("emulated strided views ({})", bwd_name(&b));
    let launched = (|| -> kernels::Result<()> {
        let tensors = AttentionBackwardTensors {
            q: view(pv, 0, &in_strides)?,
            k: view(pv, 1, &in_strides)?,
            v: view(pv, 2, &in_strides)?,
            o: view(pv, 3, &in_strides)?,
            d_o: view(pv, 4, &in_strides)?,
            lse: lse.view(),
            d_lse: Some(d_lse.view()),
            dq: view(gv, 0, &out_strides)?,
            dk: view(gv, 1, &out_strides)?,
            dv: view(gv, 2, &out_strides)?,
            sinks: None,
            d_sinks: None,
        };
        let target = Target {
            arch: Arch::Sm80,
            multiprocessors: 1,
        };
        let plan = p.plan_backward(target, &tensors, BackwardOptions { deterministic })?;
        let mut delta = HostBuf::filled(plan.delta_len(), f32::NAN);
        let mut accum =
            (plan.dq_accum_len() > 0).then(|| HostBuf::filled(plan.dq_accum_len(), f32::NAN));
        let ws = BackwardWorkspace {
            delta: delta.view(),
            dq_accum: accum.as_mut().map(|a| a.view()),
        };
        // SAFETY: the views cover the host buffers (checked by the plan), which outlive the
        // (synchronous) emulated launches; the workspace is separate memory.
        unsafe { plan.run(&Emulator, &ws) }
    })();
    launched.map_err(|e| format!("{what}: {e}"))?;
    ensure(grads.guards_intact(), || {
        format!("{what}: a write outside its buffer")
    })?;
    let g = grads.to_vec();
    let (dq, dk, dv) = (
        unpack(&g, 3, 0, dims),
        unpack(&g, 3, 1, dims),
        unpack(&g, 3, 2, dims),
    );
    compare(&what, &p, &x, &dq, &dk, &dv)
}
