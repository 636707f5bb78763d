//! The FP8 forward over raw tensors: the raw plan is the typed plan, and it refuses bad tensors
//! and workspaces.

use super::*;
use crate::raw::{ElemType, RawTensor};

/// Contiguous raw tensors of the FP8 forward of `p` (e4m3 Q, K, V; bf16 O; f32 LSE; the
/// workspace) at made-up, well-aligned addresses, each its own storage.
fn raw_fp8_tensors(p: &AttentionProblem) -> [RawTensor; 6] {
    [
        RawTensor::contiguous(1 << 40, ElemType::E4m3, &p.q_shape()),
        RawTensor::contiguous(2 << 40, ElemType::E4m3, &p.kv_shape()),
        RawTensor::contiguous(3 << 40, ElemType::E4m3, &p.kv_shape()),
        RawTensor::contiguous(4 << 40, ElemType::Bf16, &p.q_shape()),
        RawTensor::contiguous(5 << 40, ElemType::F32, &[p.batch, p.heads_q, p.seq_q]),
        RawTensor::contiguous(6 << 40, ElemType::E4m3, &[p.fp8_workspace_len()]),
    ]
}

fn plan_of(t: &[RawTensor; 6], options: &AttentionOptions) -> Result<(AttentionProblem, Fp8Plan)> {
    let [q, k, v, o, lse, workspace] = t;
    plan_fp8_raw(
        target(Arch::Sm90a),
        options,
        Fp8Scales::default(),
        &RawFp8Tensors {
            q,
            k,
            v,
            o,
            lse,
            workspace,
        },
    )
}

#[test]
fn the_raw_fp8_plan_is_the_typed_plan() {
    let p = AttentionProblem::new(2, 113, 203, 8, 2, 128, Dtype::Bf16).causal();
    let options = AttentionOptions {
        causal: true,
        ..AttentionOptions::default()
    };
    let t = raw_fp8_tensors(&p);
    let (problem, plan) = plan_of(&t, &options).unwrap();
    assert_eq!(problem, p);
    assert_eq!(plan.kernel.kernel.name, "attention_fwd_hopper_fp8_d128");
    assert_eq!(plan.params.o as u64, 4 << 40);
    assert_eq!(plan.params.lse as u64, 5 << 40);
    assert_eq!(plan.transpose.params().vt as u64, 6 << 40);
    assert_eq!(
        fp8_workspace_len_raw(&p.q_shape(), &p.kv_shape()).unwrap(),
        p.fp8_workspace_len()
    );
}

#[test]
fn the_raw_fp8_plan_refuses_bad_tensors_and_workspaces() {
    let p = AttentionProblem::new(1, 64, 64, 2, 2, 128, Dtype::Bf16);
    let options = AttentionOptions::default();
    let err = |t: &[RawTensor; 6]| plan_of(t, &options).err().expect("refused").to_string();
    // bf16 inputs: not the FP8 forward's.
    let mut t = raw_fp8_tensors(&p);
    for x in &mut t[..3] {
        x.dtype = ElemType::Bf16;
    }
    assert!(err(&t).contains("e4m3"), "{}", err(&t));
    // An f16 output.
    let mut t = raw_fp8_tensors(&p);
    t[3].dtype = ElemType::F16;
    assert!(err(&t).contains("O"), "{}", err(&t));
    // A workspace one byte short.
    let mut t = raw_fp8_tensors(&p);
    t[5] = RawTensor::contiguous(6 << 40, ElemType::E4m3, &[p.fp8_workspace_len() - 1]);
    assert!(err(&t).contains("workspace"), "{}", err(&t));
    // A workspace over V.
    let mut t = raw_fp8_tensors(&p);
    t[5] = RawTensor::contiguous(3 << 40, ElemType::E4m3, &[p.fp8_workspace_len()]);
    assert!(err(&t).contains("overlap"), "{}", err(&t));
    // A head dimension without FP8 kernels.
    let q = AttentionProblem::new(1, 64, 64, 2, 2, 64, Dtype::Bf16);
    assert!(
        err(&raw_fp8_tensors(&q)).contains("64"),
        "{}",
        err(&raw_fp8_tensors(&q))
    );
}
