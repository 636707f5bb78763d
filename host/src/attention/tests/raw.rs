//! Plans over raw tensors (the raw API): their launches, and their refusals of bad tensors and
//! workspaces.

use super::super::backward::BackwardLaunches;
use super::super::raw::workspace_views;
use super::*;
use crate::raw::{ElemType, RawTensor};

/// Contiguous raw tensors of `p` at made-up, well-aligned addresses, each its own storage.
fn raw_tensors(p: &AttentionProblem) -> [RawTensor; 5] {
    let e = match p.dtype {
        Dtype::Bf16 => ElemType::Bf16,
        Dtype::F16 => ElemType::F16,
    };
    [
        RawTensor::contiguous(1 << 40, e, &p.q_shape()),
        RawTensor::contiguous(2 << 40, e, &p.kv_shape()),
        RawTensor::contiguous(3 << 40, e, &p.v_shape()),
        RawTensor::contiguous(4 << 40, e, &p.o_shape()),
        RawTensor::contiguous(5 << 40, ElemType::F32, &[p.batch, p.heads_q, p.seq_q]),
    ]
}

fn plan_of(
    t: &[RawTensor; 5],
    options: &AttentionOptions,
    arch: Arch,
) -> Result<(AttentionProblem, AttentionPlan)> {
    let [q, k, v, o, lse] = t;
    plan_raw(
        target(arch),
        options,
        &RawAttentionTensors {
            q,
            k,
            v,
            o,
            lse,
            sinks: None,
            tile_counter: None,
        },
    )
}

fn options(p: &AttentionProblem) -> AttentionOptions {
    AttentionOptions {
        scale: p.scale,
        causal: p.causal,
        window: p.window,
        path: p.path,
        softcap: p.softcap,
    }
}

#[test]
fn the_raw_plan_is_the_typed_plan() {
    let problems = [
        AttentionProblem::new(2, 113, 203, 8, 2, 64, Dtype::Bf16).causal(),
        AttentionProblem::new(1, 1, 1, 4, 4, 128, Dtype::F16).window(Some(3), Some(0)),
        AttentionProblem::new(3, 239, 17, 6, 1, 256, Dtype::Bf16).path(Path::MmaSync),
    ];
    for p in problems {
        for arch in [Arch::Sm90a, Arch::Sm80] {
            let t = raw_tensors(&p);
            let (got, raw) = plan_of(&t, &options(&p), arch).unwrap();
            assert_eq!(got, p);
            let typed = plan(&p, arch, None).unwrap();
            assert_eq!(raw.kernel(), typed.kernel(), "{p:?} on {arch}");
            assert_eq!(raw.config(), typed.config(), "{p:?} on {arch}");
            check(&raw, arch);
        }
    }
}

#[test]
fn the_raw_tile_counter_is_checked_and_used() {
    let p = AttentionProblem::new(2, 113, 203, 8, 2, 64, Dtype::Bf16).causal();
    let [q, k, v, o, lse] = raw_tensors(&p);
    let with = |counter: &RawTensor| {
        plan_raw(
            target(Arch::Sm90a),
            &options(&p),
            &RawAttentionTensors {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lse,
                sinks: None,
                tile_counter: Some(counter),
            },
        )
    };
    let (_, plan) = with(&RawTensor::contiguous(6 << 40, ElemType::I32, &[1])).unwrap();
    assert_eq!(plan.kernel().name, "attention_fwd_hopper_bf16_d64_hdyn");
    check(&plan, Arch::Sm90a);
    for (what, counter) in [
        (
            "two elements",
            RawTensor::contiguous(6 << 40, ElemType::I32, &[2]),
        ),
        (
            "inside LSE",
            RawTensor::contiguous(5 << 40, ElemType::I32, &[1]),
        ),
        (
            "not int32",
            RawTensor::contiguous(6 << 40, ElemType::Bf16, &[1]),
        ),
    ] {
        let e = with(&counter).err();
        assert!(e.is_some(), "a tile counter {what} accepted");
        println!("tile counter {what}: {}", e.unwrap());
    }
}

#[test]
fn the_raw_plan_takes_the_value_head_dimension_from_v() {
    let p = AttentionProblem::new(2, 113, 203, 8, 2, 192, Dtype::Bf16)
        .causal()
        .value_dim(128);
    let t = raw_tensors(&p);
    let (got, plan) = plan_of(&t, &options(&p), Arch::Sm90a).unwrap();
    assert_eq!(got, p);
    assert_eq!(plan.kernel().name, "attention_fwd_hopper_bf16_d192_v128");
    // K of another head dimension than Q's is K's shape error, whatever V's.
    let q64 = AttentionProblem::new(2, 113, 203, 8, 2, 64, Dtype::Bf16);
    let [q, _, _, o, lse] = raw_tensors(&q64);
    let [_, k, v, _, _] = raw_tensors(&AttentionProblem::new(2, 113, 203, 8, 2, 128, Dtype::Bf16));
    let e = plan_of(&[q, k, v, o, lse], &options(&q64), Arch::Sm90a).err();
    assert!(
        matches!(&e, Some(Error::ShapeMismatch { what, .. }) if what.contains("K shape")),
        "{e:?}"
    );
    // V of 128 beside Q, K of 64: no such pair.
    let [q, k, _, o, lse] = raw_tensors(&q64);
    let [_, _, v, _, _] = raw_tensors(&AttentionProblem::new(2, 113, 203, 8, 2, 128, Dtype::Bf16));
    let e = plan_of(&[q, k, v, o, lse], &options(&q64), Arch::Sm90a).err();
    assert!(matches!(e, Some(Error::Unsupported { .. })), "{e:?}");
}

#[test]
fn views_into_a_packed_qkv_and_storage_offsets() {
    // Q, K, V as views of one [b, s, 3, h, d] tensor (flash-attn's packed QKV), O at an
    // offset into a larger storage.
    let (b, s, h, d) = (2, 77, 4, 64);
    let p = AttentionProblem::new(b, s, s, h, h, d, Dtype::Bf16);
    let base = 1u64 << 40;
    let packed = |i: u64| RawTensor {
        ptr: base + i * (h * d * 2) as u64,
        dtype: ElemType::Bf16,
        shape: vec![b, s, h, d],
        strides: vec![(s * 3 * h * d) as i64, (3 * h * d) as i64, d as i64, 1],
        storage_ptr: base,
        storage_bytes: b * s * 3 * h * d * 2,
    };
    let mut t = raw_tensors(&p);
    t[0] = packed(0);
    t[1] = packed(1);
    t[2] = packed(2);
    t[3].storage_ptr -= 1024;
    t[3].storage_bytes += 1024;
    let (_, plan) = plan_of(&t, &AttentionOptions::default(), Arch::Sm80).unwrap();
    let AttentionPlan::MmaSync { launch, .. } = plan else {
        panic!("sm_80 plans the mma.sync path");
    };
    assert_eq!(launch.params().k as u64, base + (h * d * 2) as u64);
    assert_eq!(
        launch.params().q_strides,
        [(s * 3 * h * d) as u64, (3 * h * d) as u64, d as u64]
    );
    assert_eq!(launch.params().o as u64, 4 << 40);
}

#[test]
fn the_raw_plan_refuses_bad_tensors() {
    let p = AttentionProblem::new(2, 64, 64, 4, 2, 128, Dtype::Bf16);
    let good = raw_tensors(&p);
    let opts = AttentionOptions::default();
    let refuse = |edit: &dyn Fn(&mut [RawTensor; 5]), want: &str| {
        let mut t = good.clone();
        edit(&mut t);
        let e = plan_of(&t, &opts, Arch::Sm90a).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains(want), "want {want:?}, got: {e}");
    };
    refuse(&|t| t[0].dtype = ElemType::F32, "Q dtype F32");
    refuse(&|t| t[1].dtype = ElemType::F16, "K dtype");
    refuse(&|t| t[4].dtype = ElemType::Bf16, "LSE dtype");
    refuse(&|t| t[0].shape.pop().map_or((), drop), "Q rank");
    refuse(&|t| t[2].shape[0] = 3, "V shape");
    refuse(&|t| t[3].shape[2] = 2, "O shape");
    refuse(&|t| t[4].shape[2] = 63, "LSE shape");
    refuse(&|t| t[1].strides[3] = 2, "K head-dimension stride");
    refuse(&|t| t[1].strides[2] = -128, "stride -128");
    refuse(&|t| t[0].strides.pop().map_or((), drop), "Q stride count");
    refuse(&|t| t[0].ptr += 2, "Q start must be aligned to 16 bytes");
    refuse(&|t| t[0].ptr += 1, "Q offset in its storage");
    refuse(&|t| t[0].storage_bytes -= 2, "Q buffer");
    refuse(&|t| t[0].ptr -= 16, "before its storage");
    refuse(
        &|t| t[4].strides = vec![1, 2 * 64, 2],
        "LSE must be contiguous",
    );
    refuse(&|t| t[4].storage_bytes -= 4, "LSE storage");
    refuse(
        &|t| {
            t[3].ptr = t[0].ptr + 64;
            t[3].storage_ptr = t[0].ptr;
            t[3].storage_bytes = t[0].storage_bytes + 64;
        },
        "O: the output overlaps Q",
    );
    refuse(&|t| t[4].ptr = t[3].ptr, "O: the output overlaps LSE");
    refuse(&|t| t[3].strides[0] = 0, "must not share memory");
    refuse(&|t| t[0].shape[3] = 72, "head dimension 72");
    refuse(&|t| t[1].shape[2] = 3, "not a multiple of heads_kv");
    let e = plan_of(
        &good,
        &AttentionOptions {
            scale: Some(f32::NAN),
            ..opts
        },
        Arch::Sm90a,
    )
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

/// The tensors of a backward of `p` (Q, K, V, O, LSE, dO, dLSE, dQ, dK, dV) at made-up,
/// disjoint addresses, each its own storage.
fn raw_backward_tensors(p: &AttentionProblem) -> [RawTensor; 10] {
    let e = match p.dtype {
        Dtype::Bf16 => ElemType::Bf16,
        Dtype::F16 => ElemType::F16,
    };
    let lse = [p.batch, p.heads_q, p.seq_q];
    let t = |i: u64, e, shape: &[usize]| RawTensor::contiguous(i << 40, e, shape);
    [
        t(1, e, &p.q_shape()),
        t(2, e, &p.kv_shape()),
        t(3, e, &p.kv_shape()),
        t(4, e, &p.q_shape()),
        t(5, ElemType::F32, &lse),
        t(6, e, &p.q_shape()),
        t(7, ElemType::F32, &lse),
        t(8, e, &p.q_shape()),
        t(9, e, &p.kv_shape()),
        t(10, e, &p.kv_shape()),
    ]
}

fn backward_tensors(t: &[RawTensor; 10], d_lse: bool) -> RawAttentionBackwardTensors<'_> {
    let [q, k, v, o, lse, d_o, dl, dq, dk, dv] = t;
    RawAttentionBackwardTensors {
        q,
        k,
        v,
        o,
        lse,
        d_o,
        d_lse: d_lse.then_some(dl),
        dq,
        dk,
        dv,
        sinks: None,
        d_sinks: None,
    }
}

/// A workspace of `lens` at made-up addresses apart from the tensors.
fn raw_workspace(lens: BackwardWorkspaceLens) -> [RawTensor; 2] {
    [
        RawTensor::contiguous(20 << 40, ElemType::F32, &[lens.delta]),
        RawTensor::contiguous(21 << 40, ElemType::F32, &[lens.dq_accum]),
    ]
}

/// The launches of the typed backward plan on views of the raw tensors' addresses.
fn typed_launches<T: AttentionElem>(
    p: &AttentionProblem,
    t: &[RawTensor; 10],
    opts: BackwardOptions,
    ws: &BackwardWorkspace<'_>,
) -> BackwardLaunches {
    let size = std::mem::size_of::<T>();
    let view = |r: &RawTensor| {
        let shape: [usize; 4] = r.shape.clone().try_into().unwrap();
        View::contiguous(dev::<T>(r.ptr, r.storage_bytes / size), shape)
    };
    let flat = |r: &RawTensor| dev::<f32>(r.ptr, r.storage_bytes / 4);
    let typed = AttentionBackwardTensors {
        q: view(&t[0]),
        k: view(&t[1]),
        v: view(&t[2]),
        o: view(&t[3]),
        lse: flat(&t[4]),
        d_o: view(&t[5]),
        d_lse: Some(flat(&t[6])),
        dq: view(&t[7]),
        dk: view(&t[8]),
        dv: view(&t[9]),
        sinks: None,
        d_sinks: None,
    };
    let plan = p.plan_backward(target(Arch::Sm90a), &typed, opts).unwrap();
    plan.launches(ws).unwrap()
}

#[test]
fn the_raw_backward_plan_is_the_typed_plan() {
    let problems = [
        AttentionProblem::new(2, 113, 203, 8, 2, 64, Dtype::Bf16).causal(),
        AttentionProblem::new(1, 1, 1, 4, 4, 128, Dtype::F16).window(Some(3), Some(0)),
        AttentionProblem::new(3, 239, 17, 6, 1, 256, Dtype::Bf16),
    ];
    for p in problems {
        for deterministic in [false, true] {
            let opts = BackwardOptions { deterministic };
            let t = raw_backward_tensors(&p);
            let (got, raw) = plan_backward_raw(
                target(Arch::Sm90a),
                &options(&p),
                opts,
                &backward_tensors(&t, true),
            )
            .unwrap();
            assert_eq!(got, p);
            let lens =
                backward_workspace_lens(&p.q_shape(), &p.kv_shape(), t[0].dtype, opts).unwrap();
            assert_eq!(lens, p.backward_workspace_lens(opts));
            // The lens callers allocate before planning are the plan's, on either path.
            assert_eq!(
                (raw.delta_len(), raw.dq_accum_len()),
                (lens.delta, lens.dq_accum)
            );
            let w = raw_workspace(lens);
            let ws = RawBackwardWorkspace {
                delta: &w[0],
                dq_accum: Some(&w[1]),
            };
            let views = workspace_views(&raw, &backward_tensors(&t, true), &ws).unwrap();
            let got = raw.launches(&views).unwrap();
            let want = match p.dtype {
                Dtype::Bf16 => typed_launches::<bf16>(&p, &t, opts, &views),
                Dtype::F16 => typed_launches::<f16>(&p, &t, opts, &views),
            };
            let (a, b) = (&got.pre, &want.pre);
            assert_eq!(a.name(), b.name());
            assert_eq!(a.config(), b.config());
            assert_eq!(format!("{:?}", a.params()), format!("{:?}", b.params()));
            for (a, b) in [(&got.dkdv, &want.dkdv), (&got.dq, &want.dq)] {
                assert_eq!(a.name(), b.name());
                assert_eq!(a.config(), b.config());
                assert_eq!(format!("{:?}", a.params()), format!("{:?}", b.params()));
            }
        }
    }
}

#[test]
fn the_raw_backward_refuses_bad_tensors_and_workspaces() {
    let p = AttentionProblem::new(2, 64, 64, 4, 2, 128, Dtype::Bf16);
    let good = raw_backward_tensors(&p);
    let opts = BackwardOptions::default();
    let lens = p.backward_workspace_lens(opts);
    let good_ws = raw_workspace(lens);
    let run = |t: &[RawTensor; 10], w: &[RawTensor; 2], accum: bool| -> Result<()> {
        let tensors = backward_tensors(t, true);
        // sm_80: the mma.sync path, whose atomics need the accumulator.
        let (_, plan) = plan_backward_raw(
            target(Arch::Sm80),
            &AttentionOptions::default(),
            opts,
            &tensors,
        )?;
        let ws = RawBackwardWorkspace {
            delta: &w[0],
            dq_accum: accum.then_some(&w[1]),
        };
        workspace_views(&plan, &tensors, &ws).map(|_| ())
    };
    run(&good, &good_ws, true).unwrap();
    let refuse = |edit: &dyn Fn(&mut [RawTensor; 10]), want: &str| {
        let mut t = good.clone();
        edit(&mut t);
        let e = run(&t, &good_ws, true).unwrap_err();
        assert!(e.to_string().contains(want), "want {want:?}, got: {e}");
    };
    refuse(&|t| t[5].shape[1] = 63, "dO shape");
    refuse(&|t| t[5].dtype = ElemType::F16, "dO dtype");
    refuse(&|t| t[6].dtype = ElemType::Bf16, "dLSE dtype");
    refuse(&|t| t[6].shape[2] = 63, "dLSE shape");
    refuse(
        &|t| t[6].strides = vec![1, 2 * 64, 2],
        "dLSE must be contiguous",
    );
    refuse(&|t| t[4].storage_bytes -= 4, "LSE storage");
    refuse(&|t| t[7].ptr = t[0].ptr, "dQ");
    refuse(&|t| t[9].shape[2] = 4, "dV shape");
    refuse(&|t| t[8].strides[3] = 2, "dK head-dimension stride");
    refuse(&|t| t[0].shape[3] = 72, "head dimension 72");
    refuse(&|t| t[7].strides[0] = 0, "must not share memory");
    refuse(&|t| t[8].strides[1] = 8, "must not share memory");
    // An input may be an expanded view (elements sharing memory), as torch's gradients are.
    let mut t = good.clone();
    t[5].strides = vec![0, 0, 0, 1];
    run(&t, &good_ws, true).unwrap();
    let refuse_ws = |edit: &dyn Fn(&mut [RawTensor; 2]), accum: bool, want: &str| {
        let mut w = good_ws.clone();
        edit(&mut w);
        let e = run(&good, &w, accum).unwrap_err();
        assert!(e.to_string().contains(want), "want {want:?}, got: {e}");
    };
    refuse_ws(&|_| (), false, "the dQ accumulator is required");
    refuse_ws(
        &|w| w[0].shape[0] -= 1,
        true,
        "backward workspace delta shape",
    );
    refuse_ws(
        &|w| w[1].dtype = ElemType::Bf16,
        true,
        "dQ accumulator dtype",
    );
    refuse_ws(
        &|w| {
            w[1].ptr += 4;
            w[1].storage_bytes += 4;
            w[1].shape[0] -= 1;
        },
        true,
        "dQ accumulator shape",
    );
    refuse_ws(
        &|w| {
            w[1].ptr += 4;
            w[1].storage_ptr = w[1].ptr;
        },
        true,
        "dQ accumulator must be aligned to 16 bytes",
    );
    refuse_ws(
        &|w| {
            w[0].ptr = good[7].ptr;
            w[0].storage_ptr = w[0].ptr;
        },
        true,
        "backward workspace delta: the output overlaps dQ",
    );
    refuse_ws(
        &|w| {
            w[1].ptr = w[0].ptr;
            w[1].storage_ptr = w[0].ptr;
        },
        true,
        "overlaps",
    );
}
