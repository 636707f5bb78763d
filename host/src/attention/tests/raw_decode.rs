//! The decode step over a paged KV cache on raw tensors (the raw API): its plan is the typed
//! plan, its splits and workspace, and its refusals of bad tensors, workspaces and split counts.

use super::*;
use crate::attention::decode::MAX_SPLITS;
use crate::raw::{ElemType, RawTensor};

/// 3 sequences of 2 query tokens, GQA 8:2, D 128, pages of 16 tokens, 20 pages, 6 per
/// sequence.
fn problem() -> AttentionDecodeProblem {
    let mut p = AttentionDecodeProblem::new(3, 2, 8, 2, 128, 16, 20, 6);
    p.causal = true;
    p
}

/// Contiguous raw tensors of `p` with `splits` splits (Q, K cache, V cache, O, LSE, block
/// table, cache_seqlens, workspace) at made-up, well-aligned addresses, each its own storage.
fn raw_tensors(p: &AttentionDecodeProblem, splits: usize) -> [RawTensor; 8] {
    let e = match p.dtype {
        Dtype::Bf16 => ElemType::Bf16,
        Dtype::F16 => ElemType::F16,
    };
    [
        RawTensor::contiguous(1 << 40, e, &p.q_shape()),
        RawTensor::contiguous(2 << 40, e, &p.cache_shape()),
        RawTensor::contiguous(3 << 40, e, &p.cache_shape()),
        RawTensor::contiguous(4 << 40, e, &p.q_shape()),
        RawTensor::contiguous(5 << 40, ElemType::F32, &[p.batch, p.heads_q, p.seq_q]),
        RawTensor::contiguous(6 << 40, ElemType::I32, &[p.batch, p.max_pages]),
        RawTensor::contiguous(7 << 40, ElemType::I32, &[p.batch]),
        RawTensor::contiguous(8 << 40, ElemType::F32, &[p.workspace_len(splits)]),
    ]
}

fn plan_of(
    t: &[RawTensor; 8],
    options: &AttentionDecodeOptions,
    splits: usize,
) -> Result<(AttentionDecodeProblem, AttentionDecodePlan)> {
    let [
        q,
        k_cache,
        v_cache,
        o,
        lse,
        block_table,
        cache_seqlens,
        workspace,
    ] = t;
    plan_decode_raw(
        options,
        &RawAttentionDecodeTensors {
            q,
            k_cache,
            v_cache,
            o,
            lse,
            block_table,
            cache_seqlens,
            workspace,
            sinks: None,
        },
        splits,
    )
}

fn options(p: &AttentionDecodeProblem) -> AttentionDecodeOptions {
    AttentionDecodeOptions {
        scale: p.scale,
        causal: p.causal,
        softcap: p.softcap,
    }
}

/// The typed plan on views of the raw tensors' addresses.
fn typed_plan<T: AttentionElem>(
    p: &AttentionDecodeProblem,
    t: &[RawTensor; 8],
    splits: usize,
) -> AttentionDecodePlan {
    let view = |r: &RawTensor| {
        let shape: [usize; 4] = r.shape.clone().try_into().unwrap();
        View::contiguous(dev::<T>(r.ptr, r.storage_bytes / 2), shape)
    };
    let tensors = AttentionDecodeTensors {
        q: view(&t[0]),
        k_cache: view(&t[1]),
        v_cache: view(&t[2]),
        o: view(&t[3]),
        lse: dev(t[4].ptr, p.lse_len()),
        block_table: dev(t[5].ptr, p.batch * p.max_pages),
        cache_seqlens: dev(t[6].ptr, p.batch),
        workspace: dev(t[7].ptr, p.workspace_len(splits)),
        sinks: None,
    };
    p.plan(&tensors, splits).unwrap()
}

#[test]
fn the_raw_decode_plan_is_the_typed_plan() {
    let mut f16_problem = AttentionDecodeProblem::new(1, 1, 4, 4, 64, 256, 3, 2);
    f16_problem.dtype = Dtype::F16;
    f16_problem.scale = Some(0.3);
    for p in [problem(), f16_problem] {
        for splits in [1, 3] {
            let t = raw_tensors(&p, splits);
            let (got, raw) = plan_of(&t, &options(&p), splits).unwrap();
            assert_eq!(got, p);
            let typed = match p.dtype {
                Dtype::Bf16 => typed_plan::<bf16>(&p, &t, splits),
                Dtype::F16 => typed_plan::<f16>(&p, &t, splits),
            };
            assert_eq!(raw.num_splits, splits);
            assert_eq!(raw.kernel(), typed.kernel());
            assert_eq!(raw.config(), typed.config());
            let debug = |x: &dyn std::fmt::Debug| format!("{x:?}");
            assert_eq!(
                debug(raw.decode.params()),
                debug(typed.decode.params()),
                "{p:?}"
            );
            assert_eq!(raw.combine.is_some(), splits > 1);
            if let (Some(a), Some(b)) = (&raw.combine, &typed.combine) {
                assert_eq!(a.config(), b.config());
                assert_eq!(debug(a.params()), debug(b.params()));
            }
        }
    }
}

#[test]
fn the_raw_decode_splits_and_workspace() {
    let p = problem();
    let lens = |splits: usize, sms: usize| {
        decode_workspace_len(
            &p.q_shape(),
            &p.cache_shape(),
            &[p.batch, p.max_pages],
            ElemType::Bf16,
            splits,
            sms,
            228 * 1024,
        )
    };
    // 0: the heuristic on the longest context the block table allows (6 pages of 16), with the
    // blocks an SM of 228 KiB holds.
    for sms in [1, 8, 132] {
        let want = p.num_splits(p.max_context(), p.resident_blocks(sms, 228 * 1024));
        assert_eq!(lens(0, sms).unwrap(), (want, p.workspace_len(want)));
    }
    assert_eq!(
        lens(0, 132).unwrap().0,
        2,
        "one split per 64-key step of the longest context (96 keys)"
    );
    assert_eq!(lens(1, 132).unwrap(), (1, 0));
    assert_eq!(lens(3, 132).unwrap(), (3, p.workspace_len(3)));
    assert_eq!(lens(MAX_SPLITS, 132).unwrap().0, MAX_SPLITS);
    let e = lens(MAX_SPLITS + 1, 132).unwrap_err().to_string();
    assert!(e.contains("num_splits: 129 is outside"), "{e}");
    let refuse = |q: &[usize], k: &[usize], table: &[usize], dtype, want: &str| {
        let e = decode_workspace_len(q, k, table, dtype, 0, 132, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "want {want:?}, got: {e}");
    };
    let (q, k, table) = (p.q_shape(), p.cache_shape(), [p.batch, p.max_pages]);
    refuse(&q, &k, &table, ElemType::F32, "Q dtype F32");
    refuse(&q[..3], &k, &table, ElemType::Bf16, "Q rank");
    refuse(&q, &k[..3], &table, ElemType::Bf16, "K cache rank");
    refuse(&q, &k, &table[..1], ElemType::Bf16, "block table rank");
    refuse(&q, &[20, 8, 2, 128], &table, ElemType::Bf16, "page size 8");
    refuse(&[3, 17, 8, 128], &k, &table, ElemType::Bf16, "seq_q 17");
}

#[test]
fn the_raw_decode_plan_refuses_bad_tensors() {
    let p = problem();
    let opts = options(&p);
    let splits = 3;
    let good = raw_tensors(&p, splits);
    plan_of(&good, &opts, splits).unwrap();
    let refuse = |edit: &dyn Fn(&mut [RawTensor; 8]), splits: usize, want: &str| {
        let mut t = good.clone();
        edit(&mut t);
        let e = plan_of(&t, &opts, splits).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains(want), "want {want:?}, got: {e}");
    };
    refuse(&|t| t[0].dtype = ElemType::F32, splits, "Q dtype F32");
    refuse(&|t| t[1].dtype = ElemType::F16, splits, "K cache dtype");
    refuse(&|t| t[2].dtype = ElemType::F16, splits, "V cache dtype");
    refuse(&|t| t[5].dtype = ElemType::F32, splits, "block table dtype");
    refuse(
        &|t| t[6].dtype = ElemType::F32,
        splits,
        "cache_seqlens dtype",
    );
    refuse(&|t| t[4].dtype = ElemType::Bf16, splits, "LSE dtype");
    refuse(
        &|t| t[7].dtype = ElemType::Bf16,
        splits,
        "decode workspace dtype",
    );
    refuse(&|t| t[0].shape.truncate(3), splits, "Q rank");
    refuse(&|t| t[1].shape.truncate(3), splits, "K cache rank");
    refuse(&|t| t[2].shape.truncate(3), splits, "V cache rank");
    refuse(
        &|t| t[5] = RawTensor::contiguous(6 << 40, ElemType::I32, &[18]),
        splits,
        "block table rank",
    );
    refuse(
        &|t| t[6] = RawTensor::contiguous(7 << 40, ElemType::I32, &[3, 1]),
        splits,
        "cache_seqlens rank",
    );
    refuse(
        &|t| t[5] = RawTensor::contiguous(6 << 40, ElemType::I32, &[2, 6]),
        splits,
        "block table shape",
    );
    refuse(
        &|t| t[6] = RawTensor::contiguous(7 << 40, ElemType::I32, &[4]),
        splits,
        "cache_seqlens shape",
    );
    refuse(
        &|t| t[2] = RawTensor::contiguous(3 << 40, ElemType::Bf16, &[20, 16, 2, 64]),
        splits,
        "V cache shape",
    );
    refuse(
        &|t| t[3] = RawTensor::contiguous(4 << 40, ElemType::Bf16, &[3, 1, 8, 128]),
        splits,
        "O shape",
    );
    refuse(
        &|t| t[4] = RawTensor::contiguous(5 << 40, ElemType::F32, &[3, 2, 8]),
        splits,
        "LSE shape",
    );
    refuse(
        &|t| t[1] = RawTensor::contiguous(2 << 40, ElemType::Bf16, &[20, 8, 2, 128]),
        splits,
        "page size 8",
    );
    refuse(
        &|t| t[1] = RawTensor::contiguous(2 << 40, ElemType::Bf16, &[20, 16, 3, 128]),
        splits,
        "not a multiple of heads_kv",
    );
    refuse(
        &|t| {
            t[0] = RawTensor::contiguous(1 << 40, ElemType::Bf16, &[3, 17, 8, 128]);
            t[3] = RawTensor::contiguous(4 << 40, ElemType::Bf16, &[3, 17, 8, 128]);
        },
        splits,
        "seq_q 17",
    );
    refuse(
        &|t| t[1].strides[3] = 2,
        splits,
        "K cache head-dimension stride",
    );
    refuse(
        &|t| t[0].ptr += 2,
        splits,
        "Q start must be aligned to 16 bytes",
    );
    refuse(&|t| t[2].storage_bytes -= 2, splits, "V cache buffer");
    refuse(
        &|t| t[5].strides = vec![1, 3],
        splits,
        "block table must be contiguous",
    );
    refuse(
        &|t| t[6].storage_bytes -= 4,
        splits,
        "cache_seqlens storage",
    );
    // The workspace: exactly the splits' length, 16-byte aligned.
    refuse(&|t| t[7].shape[0] -= 1, splits, "decode workspace shape");
    refuse(&|_| (), 2, "decode workspace shape");
    refuse(&|_| (), 1, "decode workspace shape");
    refuse(
        &|t| {
            t[7].ptr += 4;
            t[7].storage_ptr = t[7].ptr;
        },
        splits,
        "decode workspace start must be aligned to 16 bytes",
    );
    refuse(&|_| (), 0, "num_splits: 0 is outside");
    refuse(&|_| (), MAX_SPLITS + 1, "num_splits: 129 is outside");
    // Outputs and the workspace apart from the inputs and each other.
    refuse(
        &|t| {
            t[3].ptr = t[1].ptr;
            t[3].storage_ptr = t[1].ptr;
        },
        splits,
        "O: the output overlaps K cache",
    );
    refuse(
        &|t| {
            t[7].ptr = t[5].ptr;
            t[7].storage_ptr = t[5].ptr;
        },
        splits,
        "decode workspace: the output overlaps block table",
    );
    refuse(&|t| t[4].ptr = t[7].ptr, splits, "LSE: the output overlaps");
    refuse(&|t| t[3].strides[0] = 0, splits, "must not share memory");
    let e = plan_of(
        &good,
        &AttentionDecodeOptions {
            scale: Some(-1.0),
            ..opts
        },
        splits,
    )
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    // One split: an empty workspace at any (here a null) address is fine.
    let mut t = raw_tensors(&p, 1);
    t[7] = RawTensor::contiguous(0, ElemType::F32, &[0]);
    let (_, plan) = plan_of(&t, &opts, 1).unwrap();
    assert!(plan.combine.is_none());
    assert_eq!(plan.decode.params().o_partial as u64, 0);
}
