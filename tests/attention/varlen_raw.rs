//! The packed forward's raw API (`forward_varlen_raw`) against the typed one, and what it
//! refuses.

use super::{compare, name, seqlens, vcase};
use kernel_tests::{TestResult, ensure, gpu_ok};
use kernels::attention::{self, CuSeqlens, Dtype, View};
use kernels::data::rng;
use kernels::memory::{download, download_range, poisoned, upload};
use kernels::{Gpu, bf16};
use rand::Rng;

/// The raw API (`forward_varlen_raw`: addresses, shapes, strides, a stream handle, the
/// boundaries as device tensors) on Q, K, V as views into one packed QKV tensor
/// `[total, hq + 2 hkv, D]` (FlashAttention's `qkv` layout) and an O at an offset into a larger
/// allocation: bitwise equal to the typed API on the same views; empty K/V tensors (a batch
/// without keys) at address 0 accepted; an int64 `cu_seqlens` refused.
pub(super) fn raw_api(g: &Gpu) -> TestResult {
    use kernels::raw::{ElemType, RawStream, RawTensor};
    let lens = [(77, 77), (0, 0), (1, 1), (300, 300), (129, 129)];
    let mut c = vcase(&lens, 8, 2, 128, Dtype::Bf16);
    c.p.causal = true;
    let p = c.p.clone();
    let s = seqlens(&c);
    let (hq, hkv, d, total) = (p.heads_q, p.heads_kv, p.head_dim, p.total_q);
    let width = hq + 2 * hkv;
    let mut r = rng(c.seed);
    let packed: Vec<bf16> = (0..total * width * d)
        .map(|_| bf16::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let strides = [width * d, d, 1];
    let o_offset = 1024;
    let out = (|| -> kernels::Result<_> {
        let stream = g.stream()?;
        let dp = upload(&packed)?;
        let mut dev_seqlens = s.upload()?;
        let typed_o = poisoned::<bf16>(total * hq * d)?;
        let mut typed_lse = poisoned::<f32>(p.lse_len())?;
        let qv = View::packed(&dp, 0, &p.q_shape(), &strides)?;
        let kv = View::packed(&dp, hq * d, &p.kv_shape(), &strides)?;
        let vv = View::packed(&dp, (hq + hkv) * d, &p.kv_shape(), &strides)?;
        let mut ov = View::packed_contiguous(&typed_o, p.q_shape());
        attention::forward_varlen(
            g,
            &stream,
            &p,
            &mut dev_seqlens,
            &qv,
            &kv,
            &vv,
            &mut ov,
            &mut typed_lse,
        )?;

        let raw_o = poisoned::<bf16>(o_offset + total * hq * d)?;
        let raw_lse = poisoned::<f32>(p.lse_len())?;
        let (cu_q, cu_k) = (upload(s.q())?, upload(s.k())?);
        let base = dp.as_device_ptr().as_raw();
        let view = |first: usize, shape: [usize; 3]| RawTensor {
            ptr: base + 2 * first as u64,
            dtype: ElemType::Bf16,
            shape: shape.to_vec(),
            strides: strides.iter().map(|&x| x as i64).collect(),
            storage_ptr: base,
            storage_bytes: packed.len() * 2,
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
        let lse = RawTensor::contiguous(
            raw_lse.as_device_ptr().as_raw(),
            ElemType::F32,
            &[hq, total],
        );
        let i32s = |b: &kernels::DeviceBuffer<i32>| {
            RawTensor::contiguous(b.as_device_ptr().as_raw(), ElemType::I32, &[b.len()])
        };
        let (cq, ck) = (i32s(&cu_q), i32s(&cu_k));
        let counters = upload(&[0i32; 2])?;
        let counter = RawTensor::contiguous(counters.as_device_ptr().as_raw(), ElemType::I32, &[1]);
        let options = attention::AttentionOptions {
            causal: true,
            ..Default::default()
        };
        // SAFETY: a live stream of the GPU's context (the device's primary context, as
        // `Gpu::new` retains it), kept until the end of this closure.
        let raw_stream = unsafe { RawStream::new(g.ordinal(), stream.as_inner() as u64) }?;
        let launch = |t: &attention::RawAttentionVarlenTensors<'_>| {
            // SAFETY: every tensor lies in live device buffers of this function, synchronized
            // below before the buffers drop (an empty tensor is never accessed); refused calls
            // launch nothing.
            unsafe {
                attention::forward_varlen_raw(
                    &raw_stream,
                    &options,
                    t,
                    p.max_seqlen_q,
                    p.max_seqlen_k,
                )
            }
        };
        let tensors = attention::RawAttentionVarlenTensors {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            cu_seqlens_q: &cq,
            cu_seqlens_k: &ck,
            sinks: None,
            tile_counter: Some(&counter),
        };
        launch(&tensors)?;
        // No keys at all: K and V empty at address 0, every row O = 0 and LSE = -inf.
        let no_keys = CuSeqlens::from_lens(&[(5, 0); 2]).expect("valid");
        let nk_q = upload(no_keys.q())?;
        let nk_k = upload(no_keys.k())?;
        let nk_o = poisoned::<bf16>(10 * hq * d)?;
        let nk_lse = poisoned::<f32>(10 * hq)?;
        let empty = RawTensor::contiguous(0, ElemType::Bf16, &[0, hkv, d]);
        let nk = (
            RawTensor::contiguous(base, ElemType::Bf16, &[10, hq, d]),
            RawTensor::contiguous(nk_o.as_device_ptr().as_raw(), ElemType::Bf16, &[10, hq, d]),
            RawTensor::contiguous(nk_lse.as_device_ptr().as_raw(), ElemType::F32, &[hq, 10]),
            i32s(&nk_q),
            i32s(&nk_k),
        );
        // SAFETY: as `launch`.
        unsafe {
            attention::forward_varlen_raw(
                &raw_stream,
                &options,
                &attention::RawAttentionVarlenTensors {
                    q: &nk.0,
                    k: &empty,
                    v: &empty,
                    o: &nk.1,
                    lse: &nk.2,
                    cu_seqlens_q: &nk.3,
                    cu_seqlens_k: &nk.4,
                    sinks: None,
                    tile_counter: None,
                },
                5,
                0,
            )
        }?;
        g.sync(&stream, "attention varlen forward (typed and raw)")?;
        let results = (
            download(&typed_o)?,
            download(&typed_lse)?,
            download_range(&raw_o, o_offset, total * hq * d)?,
            download(&raw_lse)?,
            download(&nk_o)?,
            download(&nk_lse)?,
        );
        let not_i32 = RawTensor {
            dtype: ElemType::F32,
            ..cq.clone()
        };
        let refused = launch(&attention::RawAttentionVarlenTensors {
            cu_seqlens_q: &not_i32,
            ..tensors
        });
        let two = RawTensor::contiguous(counters.as_device_ptr().as_raw(), ElemType::I32, &[2]);
        let refused_counter = launch(&attention::RawAttentionVarlenTensors {
            tile_counter: Some(&two),
            ..tensors
        });
        let overlapping =
            RawTensor::contiguous(raw_lse.as_device_ptr().as_raw(), ElemType::I32, &[1]);
        let refused_overlap = launch(&attention::RawAttentionVarlenTensors {
            tile_counter: Some(&overlapping),
            ..tensors
        });
        Ok((results, [refused, refused_counter, refused_overlap]))
    })();
    let ((typed_o, typed_lse, raw_o, raw_lse, nk_o, nk_lse), [refused, refused_counter, overlap]) =
        gpu_ok(out)?;
    ensure(raw_o == typed_o, || {
        "raw O differs from the typed API's".into()
    })?;
    ensure(
        raw_lse
            .iter()
            .zip(&typed_lse)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        || "raw LSE differs from the typed API's".into(),
    )?;
    ensure(nk_o.iter().all(|x| x.to_f32() == 0.0), || {
        "no keys: O must be 0".into()
    })?;
    ensure(nk_lse.iter().all(|x| *x == f32::NEG_INFINITY), || {
        "no keys: LSE must be -inf".into()
    })?;
    ensure(refused.is_err(), || {
        "a non-i32 cu_seqlens_q accepted".into()
    })?;
    ensure(refused_counter.is_err(), || {
        "a tile counter of 2 elements accepted".into()
    })?;
    ensure(overlap.is_err(), || {
        "a tile counter inside LSE accepted".into()
    })?;
    let qkv = |x: &[bf16]| x.to_vec();
    let q_rows: Vec<bf16> = (0..total)
        .flat_map(|i| qkv(&packed[i * width * d..(i * width + hq) * d]))
        .collect();
    let kv_rows = |first: usize| -> Vec<bf16> {
        (0..total)
            .flat_map(|i| qkv(&packed[(i * width + first) * d..(i * width + first + hkv) * d]))
            .collect()
    };
    compare(
        &format!("raw api {} (seed {})", name(&c), c.seed),
        &c,
        (&q_rows, &kv_rows(hq), &kv_rows(hq + hkv)),
        &raw_o,
        &raw_lse,
    )?;
    println!(
        "attention_varlen/raw_api: raw == typed bitwise; no keys gives O = 0, LSE = -inf; f32 cu_seqlens refused"
    );
    Ok(())
}
