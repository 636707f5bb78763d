//! The forward's API around the kernels: strided views into a packed QKV buffer, the raw API
//! against the typed one, two streams at once, repeated runs bitwise equal, the typed refusals
//! of bad problems and tensors, and the mask convention against the reference.

use super::*;

/// Q, K, V as strided views into one packed `[b, s, 3, h, d]` buffer.
pub(super) fn packed_qkv(g: &Gpu) -> TestResult {
    let (b, s, h, d) = (2, 300, 4, 64);
    let p = AttentionProblem::new(b, s, s, h, h, d, Dtype::Bf16).causal();
    let mut r = rng(77);
    let packed: Vec<bf16> = (0..b * s * 3 * h * d)
        .map(|_| bf16::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let unpack = |which: usize| -> Vec<bf16> {
        let mut out = Vec::with_capacity(b * s * h * d);
        for bi in 0..b {
            for si in 0..s {
                let start = ((bi * s + si) * 3 + which) * h * d;
                out.extend_from_slice(&packed[start..start + h * d]);
            }
        }
        out
    };
    let (q, k, v) = (unpack(0), unpack(1), unpack(2));
    let strides = [s * 3 * h * d, 3 * h * d, d, 1];
    let shape = [b, s, h, d];
    let out = (|| -> kernels::Result<(Vec<bf16>, Vec<f32>)> {
        let stream = g.stream()?;
        let dp = upload(&packed)?;
        let dout = poisoned::<bf16>(b * s * h * d)?;
        let mut dlse = poisoned::<f32>(p.lse_len())?;
        let qv = View::new(&dp, 0, &shape, &strides)?;
        let kv = View::new(&dp, h * d, &shape, &strides)?;
        let vv = View::new(&dp, 2 * h * d, &shape, &strides)?;
        let mut ov = View::contiguous(&dout, shape);
        attention::forward(g, &stream, &p, &qv, &kv, &vv, &mut ov, &mut dlse)?;
        g.sync(&stream, "attention forward")?;
        Ok((download(&dout)?, download(&dlse)?))
    })();
    let (o, lse) = gpu_ok(out)?;
    let c = Case {
        p,
        range: 1.0,
        seed: 77,
    };
    compare("packed qkv views", &c, &q, &k, &v, &o, &lse)
}

/// The raw API (`forward_raw`: addresses, shapes, strides, a stream handle; the kernels loaded
/// into the device's primary context by `kernels::raw`) on packed-QKV views and an O at an
/// offset into a larger allocation: bitwise equal to the typed API, and memory the driver does
/// not know, or a storage longer than its allocation, refused.
pub(super) fn raw_api(g: &Gpu) -> TestResult {
    use kernels::raw::{ElemType, RawStream, RawTensor};
    let (b, s, hq, hkv, d) = (2, 333, 8, 2, 128);
    let p = AttentionProblem::new(b, s, s, hq, hkv, d, Dtype::Bf16).causal();
    let mut r = rng(78);
    let width = hq + 2 * hkv;
    let packed: Vec<bf16> = (0..b * s * width * d)
        .map(|_| bf16::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let strides = [s * width * d, width * d, d, 1];
    let raw_strides: Vec<i64> = strides.iter().map(|&x| x as i64).collect();
    let o_offset = 1024;
    let out = (|| -> kernels::Result<_> {
        let stream = g.stream()?;
        let dp = upload(&packed)?;
        let typed_o = poisoned::<bf16>(b * s * hq * d)?;
        let mut typed_lse = poisoned::<f32>(p.lse_len())?;
        let qv = View::new(&dp, 0, &p.q_shape(), &strides)?;
        let kv = View::new(&dp, hq * d, &p.kv_shape(), &strides)?;
        let vv = View::new(&dp, (hq + hkv) * d, &p.kv_shape(), &strides)?;
        let mut ov = View::contiguous(&typed_o, p.q_shape());
        attention::forward(g, &stream, &p, &qv, &kv, &vv, &mut ov, &mut typed_lse)?;

        let raw_o = poisoned::<bf16>(o_offset + b * s * hq * d)?;
        let raw_lse = poisoned::<f32>(p.lse_len())?;
        let base = dp.as_device_ptr().as_raw();
        let packed_bytes = packed.len() * 2;
        let view = |first: usize, shape: [usize; 4]| RawTensor {
            ptr: base + 2 * first as u64,
            dtype: ElemType::Bf16,
            shape: shape.to_vec(),
            strides: raw_strides.clone(),
            storage_ptr: base,
            storage_bytes: packed_bytes,
        };
        let (q, k, v) = (
            view(0, p.q_shape()),
            view(hq * d, p.kv_shape()),
            view((hq + hkv) * d, p.kv_shape()),
        );
        let o_base = raw_o.as_device_ptr().as_raw();
        let o = RawTensor {
            ptr: o_base + 2 * o_offset as u64,
            storage_ptr: o_base,
            storage_bytes: raw_o.len() * 2,
            ..RawTensor::contiguous(0, ElemType::Bf16, &p.q_shape())
        };
        let lse =
            RawTensor::contiguous(raw_lse.as_device_ptr().as_raw(), ElemType::F32, &[b, hq, s]);
        let options = attention::AttentionOptions {
            causal: true,
            ..Default::default()
        };
        // SAFETY: a live stream of the GPU's context (the device's primary context, as
        // `Gpu::new` retains it), kept until the end of this closure.
        let raw_stream = unsafe { RawStream::new(g.ordinal(), stream.as_inner() as u64) }?;
        let launch = |o: &RawTensor| {
            let tensors = attention::RawAttentionTensors {
                q: &q,
                k: &k,
                v: &v,
                o,
                lse: &lse,
                sinks: None,
                tile_counter: None,
            };
            // SAFETY: Q, K, V, LSE and the good O lie in live device buffers of this function,
            // synchronized below before the buffers drop; the bad O's are refused before any
            // launch (the test's assertion).
            unsafe { attention::forward_raw(&raw_stream, &options, &tensors) }
        };
        launch(&o)?;
        g.sync(&stream, "attention forward (typed and raw)")?;
        let results = (
            download(&typed_o)?,
            download(&typed_lse)?,
            download_range(&raw_o, o_offset, b * s * hq * d)?,
            download(&raw_lse)?,
        );
        // Memory the driver does not know (a host vector), and a storage past its allocation.
        let host = vec![bf16::ZERO; b * s * hq * d];
        let host_o = RawTensor::contiguous(host.as_ptr() as u64, ElemType::Bf16, &p.q_shape());
        let longer = RawTensor {
            storage_bytes: o.storage_bytes + 4096,
            ..o.clone()
        };
        let refused = [&host_o, &longer].map(launch);
        Ok((results, refused))
    })();
    let ((typed_o, typed_lse, raw_o, raw_lse), refused) = gpu_ok(out)?;
    ensure(raw_o == typed_o, || {
        "raw O differs from the typed API's".into()
    })?;
    let same_lse = raw_lse
        .iter()
        .zip(&typed_lse)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    ensure(same_lse, || "raw LSE differs from the typed API's".into())?;
    let [host, longer] = refused;
    ensure(
        matches!(&host, Err(Error::InvalidArgument { reason, .. }) if reason.contains("not device memory")),
        || format!("a host pointer as O: {host:?}"),
    )?;
    ensure(
        matches!(&longer, Err(Error::ShapeMismatch { what, .. }) if what == "O storage"),
        || format!("a storage past its allocation: {longer:?}"),
    )?;
    println!(
        "attention/raw_api: raw == typed bitwise; host memory and an overlong storage refused"
    );
    Ok(())
}

/// Two different problems launched on two streams at once give the same results as alone.
pub(super) fn concurrent_streams(g: &Gpu) -> TestResult {
    let mut a = case(2, 1000, 1200, 8, 2, 128, Dtype::Bf16);
    a.p.causal = true;
    let b = case(3, 700, 500, 4, 4, 64, Dtype::Bf16);
    let (qa, ka, va) = inputs::<bf16>(&a);
    let (qb, kb, vb) = inputs::<bf16>(&b);
    let alone_a = gpu_ok(gpu_forward(g, &a.p, &qa, &ka, &va))?;
    let alone_b = gpu_ok(gpu_forward(g, &b.p, &qb, &kb, &vb))?;
    let together = (|| -> kernels::Result<_> {
        let (sa, sb) = (g.stream()?, g.stream()?);
        let dev = |q: &[bf16], k: &[bf16], v: &[bf16]| -> kernels::Result<_> {
            Ok((upload(q)?, upload(k)?, upload(v)?))
        };
        let (da, db) = (dev(&qa, &ka, &va)?, dev(&qb, &kb, &vb)?);
        let (oa, ob) = (poisoned::<bf16>(qa.len())?, poisoned::<bf16>(qb.len())?);
        let (mut la, mut lb) = (
            poisoned::<f32>(a.p.lse_len())?,
            poisoned::<f32>(b.p.lse_len())?,
        );
        for _ in 0..3 {
            let mut ova = View::contiguous(&oa, a.p.q_shape());
            let mut ovb = View::contiguous(&ob, b.p.q_shape());
            attention::forward(
                g,
                &sa,
                &a.p,
                &View::contiguous(&da.0, a.p.q_shape()),
                &View::contiguous(&da.1, a.p.kv_shape()),
                &View::contiguous(&da.2, a.p.kv_shape()),
                &mut ova,
                &mut la,
            )?;
            attention::forward(
                g,
                &sb,
                &b.p,
                &View::contiguous(&db.0, b.p.q_shape()),
                &View::contiguous(&db.1, b.p.kv_shape()),
                &View::contiguous(&db.2, b.p.kv_shape()),
                &mut ovb,
                &mut lb,
            )?;
        }
        g.sync(&sa, "attention on stream a")?;
        g.sync(&sb, "attention on stream b")?;
        Ok((
            download(&oa)?,
            download(&la)?,
            download(&ob)?,
            download(&lb)?,
        ))
    })();
    let (oa, la, ob, lb) = gpu_ok(together)?;
    let same = |x: &[bf16], y: &[bf16]| x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits());
    let same_f = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits());
    ensure(same(&oa, &alone_a.0) && same_f(&la, &alone_a.1), || {
        "stream a differs from its lone run".into()
    })?;
    ensure(same(&ob, &alone_b.0) && same_f(&lb, &alone_b.1), || {
        "stream b differs from its lone run".into()
    })
}

pub(super) fn deterministic(g: &Gpu) -> TestResult {
    let mut c = case(2, 777, 1111, 4, 2, 128, Dtype::Bf16);
    c.p.causal = true;
    let (q, k, v) = inputs::<bf16>(&c);
    let first = gpu_ok(gpu_forward(g, &c.p, &q, &k, &v))?;
    let second = gpu_ok(gpu_forward(g, &c.p, &q, &k, &v))?;
    let same_o = first
        .0
        .iter()
        .zip(&second.0)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    let same_lse = first
        .1
        .iter()
        .zip(&second.1)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    ensure(same_o && same_lse, || {
        "two runs on the same inputs differ".into()
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

pub(super) fn rejects_bad_problems() -> TestResult {
    let base = AttentionProblem::new(1, 16, 16, 4, 2, 64, Dtype::Bf16);
    let bad = |f: fn(&mut AttentionProblem)| {
        let mut p = base.clone();
        f(&mut p);
        p.validate()
    };
    expect_err("head dim 72", bad(|p| p.head_dim = 72), |e| {
        matches!(e, Error::Unsupported { .. })
    })?;
    expect_err("heads 4 vs 3", bad(|p| p.heads_kv = 3), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    expect_err("seq_q 0", bad(|p| p.seq_q = 0), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    expect_err("batch 0", bad(|p| p.batch = 0), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    expect_err("scale NaN", bad(|p| p.scale = Some(f32::NAN)), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    expect_err("scale -1", bad(|p| p.scale = Some(-1.0)), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })
}

pub(super) fn rejects_bad_tensors(g: &Gpu) -> TestResult {
    let p = AttentionProblem::new(1, 64, 64, 2, 2, 64, Dtype::Bf16);
    let n = 64 * 2 * 64;
    let stream = gpu_ok(g.stream())?;
    let buf = gpu_ok(upload(&vec![bf16::ONE; n + 64]))?;
    let hbuf = gpu_ok(upload(&vec![f16::ONE; n]))?;
    let out = gpu_ok(poisoned::<bf16>(n))?;
    let mut lse = gpu_ok(poisoned::<f32>(p.lse_len()))?;
    let shape = p.q_shape();
    let good = || View::contiguous(&buf, shape);
    let mut o = View::contiguous(&out, shape);
    let run = |q: &View<bf16>, o: &mut View<bf16>, lse: &mut kernels::DeviceBuffer<f32>| {
        attention::forward(g, &stream, &p, q, &good(), &good(), o, lse)
    };
    expect_err(
        "wrong rank",
        View::new(&buf, 0, &[64, 2, 64], &[128, 64, 1]).map(|_| ()),
        |e| matches!(e, Error::ShapeMismatch { .. }),
    )?;
    let strided = gpu_ok(View::new(&buf, 0, &shape, &[n, 128, 64, 2]))?;
    expect_err(
        "non-contiguous head dim",
        run(&strided, &mut o, &mut lse),
        |e| matches!(e, Error::Unsupported { .. }),
    )?;
    let shifted = gpu_ok(View::new(&buf, 1, &shape, &[n, 128, 64, 1]))?;
    expect_err("misaligned start", run(&shifted, &mut o, &mut lse), |e| {
        matches!(e, Error::Misaligned { .. })
    })?;
    let odd = gpu_ok(View::new(&buf, 0, &shape, &[n, 132, 64, 1]))?;
    expect_err("misaligned stride", run(&odd, &mut o, &mut lse), |e| {
        matches!(e, Error::Misaligned { .. })
    })?;
    let wrong_shape = View::contiguous(&buf, [1, 64, 4, 32]);
    expect_err("wrong shape", run(&wrong_shape, &mut o, &mut lse), |e| {
        matches!(e, Error::ShapeMismatch { .. })
    })?;
    let overrun = gpu_ok(View::new(&buf, 128, &shape, &[n, 128, 64, 1]))?;
    expect_err(
        "view past the buffer",
        run(&overrun, &mut o, &mut lse),
        |e| matches!(e, Error::ShapeMismatch { .. }),
    )?;
    let mut short_lse = gpu_ok(poisoned::<f32>(3))?;
    expect_err("short LSE", run(&good(), &mut o, &mut short_lse), |e| {
        matches!(e, Error::ShapeMismatch { .. })
    })?;
    let hq = View::contiguous(&hbuf, shape);
    let r = attention::forward(
        g,
        &stream,
        &p,
        &hq,
        &hq,
        &hq,
        &mut View::contiguous(&hbuf, shape),
        &mut lse,
    );
    expect_err("f16 tensors for a bf16 problem", r, |e| {
        matches!(e, Error::InvalidArgument { .. })
    })
}

pub(super) fn mask_convention() -> TestResult {
    // Bottom-right alignment: with seq_q = 2, seq_k = 5, causal, query 0 sees keys 0..=3.
    let p = AttentionProblem::new(1, 2, 5, 1, 1, 64, Dtype::Bf16).causal();
    ensure(
        p.allowed(0, 3) && !p.allowed(0, 4) && p.allowed(1, 4),
        || "causal diagonal not bottom-right".into(),
    )?;
    // seq_q > seq_k: the first seq_q - seq_k rows see nothing.
    let p = AttentionProblem::new(1, 5, 2, 1, 1, 64, Dtype::Bf16).causal();
    ensure(
        !p.allowed(2, 0) && p.allowed(3, 0) && !p.allowed(3, 1),
        || "rows above the diagonal must be empty".into(),
    )?;
    let p = AttentionProblem::new(1, 4, 4, 1, 1, 64, Dtype::Bf16).window(Some(1), Some(1));
    ensure(
        !p.allowed(2, 0) && p.allowed(2, 1) && p.allowed(2, 3) && !p.allowed(0, 2),
        || "window".into(),
    )
}
