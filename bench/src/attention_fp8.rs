//! Family `attention-fp8`: the FP8 forward (e4m3 Q, K, V with per-tensor descales, bf16 O;
//! Hopper only) over the forward's grid at D 128 and 256 (batch x seq = 16k tokens, heads x D
//! = 2048, seq 1k..16k, causal and not), beside the bf16 forward (`ours-bf16`, the Hopper
//! kernel) on the same values dequantized, in the same run. No peer on the GPU machine has an
//! FP8 attention forward (FlashAttention-3 is not installed there; SDPA has none).
//!
//! Rows (`kernel` = `attention_fwd`, config `dtype` = `e4m3`): `ours` (the transpose of V and
//! the forward, as a user calls it), `ours-{variant}` (the tuning variants of
//! `kernel_abi::attention::fp8::FP8_KERNELS`, likewise), `ours-kernel` (the default forward
//! launch alone, `V^T` prepared), `ours-bf16`; and `attention_fp8_vt` (the transpose alone, bytes read and written). FLOPs
//! `4 batch heads seq^2 D`, halved under causal masking. Errors: the largest difference from
//! the f64 reference on the dequantized inputs over 24 sampled rows.
//!
//! `KBENCH_ATTENTION_DIMS` / `KBENCH_ATTENTION_SEQS` restrict the grid as for `attention`.

use crate::attention::{only, sampled_error};
use crate::config;
use crate::harness::{Bench, Row};
use kernel_abi::attention::fp8::FP8_KERNELS;
use kernels::attention::{
    self, AttentionProblem, Dtype, E4m3, Fp8Scales, Fp8Tensors, Target, View,
};
use kernels::data::{rng, uniform_f32};
use kernels::exec::{Exec, OnStream};
use kernels::memory::{download, poisoned, upload};
use kernels::{Result, bf16};

/// Elements of each of Q, K, V, O.
const ELEMS: usize = 16384 * 2048;

/// Run the family.
pub fn run(b: &mut Bench) -> Result<()> {
    if !b.gpu.arch().has_hopper_kernels() {
        b.note("the FP8 forward runs on Hopper GPUs only: no rows");
        return Ok(());
    }
    // Descales of 2^-8 (inputs in [-1, 1) times 256 rounded to e4m3): the dequantized values
    // are exact in bf16, so the bf16 kernel and the reference see exactly the FP8 inputs.
    let mut r = rng(2025);
    let mut quantized = || -> Vec<E4m3> {
        uniform_f32(&mut r, ELEMS, -1.0, 1.0)
            .into_iter()
            .map(|x| E4m3::from_f32(x * 256.0))
            .collect()
    };
    let (q8, k8, v8) = (quantized(), quantized(), quantized());
    let scales = Fp8Scales {
        q: 1.0 / 256.0,
        k: 1.0 / 256.0,
        v: 1.0 / 256.0,
    };
    let deq = |x: &[E4m3]| -> Vec<bf16> {
        x.iter()
            .map(|e| bf16::from_f32(e.to_f32() / 256.0))
            .collect()
    };
    let (qb, kb, vb) = (deq(&q8), deq(&k8), deq(&v8));
    let (dq8, dk8, dv8) = (upload(&q8)?, upload(&k8)?, upload(&v8)?);
    let (dqb, dkb, dvb) = (upload(&qb)?, upload(&kb)?, upload(&vb)?);
    let dims = only("KBENCH_ATTENTION_DIMS", &[128, 256], &[128, 256])?;
    const SEQS: [usize; 5] = [1024, 2048, 4096, 8192, 16384];
    let seqs = only(
        "KBENCH_ATTENTION_SEQS",
        if b.quick { &[2048] } else { &SEQS },
        &SEQS,
    )?;
    let out = poisoned::<bf16>(ELEMS)?;
    let ws = poisoned::<E4m3>(ELEMS)?;
    for &d in &dims {
        for &s in &seqs {
            for causal in [false, true] {
                let mut p =
                    AttentionProblem::new(16384 / s, s, s, 2048 / d, 2048 / d, d, Dtype::Bf16);
                p.causal = causal;
                let cfg = config!(
                    "batch": p.batch, "seq": p.seq_q, "heads": p.heads_q, "d": p.head_dim,
                    "causal": p.causal, "dtype": "e4m3"
                );
                let lse = poisoned::<f32>(p.lse_len())?;
                let tensors = Fp8Tensors {
                    q: View::contiguous(&dq8, p.q_shape()),
                    k: View::contiguous(&dk8, p.kv_shape()),
                    v: View::contiguous(&dv8, p.kv_shape()),
                    o: View::contiguous(&out, p.q_shape()),
                    lse: (&lse).into(),
                    workspace: (&ws).into(),
                };
                let plan = p.plan_fp8(Target::of(&b.gpu), &tensors, scales)?;
                // SAFETY: every buffer outlives the timed runs; O, LSE and the workspace are
                // distinct from the inputs and each other.
                let t = b.time(|| unsafe {
                    plan.run(&OnStream {
                        gpu: &b.gpu,
                        stream: &b.stream,
                    })
                })?;
                let o = download(&out)?;
                let err = sampled_error(&p, &qb, &kb, &vb, &o);
                b.push(
                    Row::ours("attention_fwd", cfg.clone(), &t)
                        .flops(p.flops())
                        .err(err),
                );
                // The tuning variants, as a user would call them (transpose included).
                for k in FP8_KERNELS.iter().filter(|k| k.cfg.head_dim == d as u32) {
                    let Some(variant) = k.variant else { continue };
                    let vplan =
                        p.plan_fp8_variant(Target::of(&b.gpu), &tensors, scales, Some(variant))?;
                    // SAFETY: as above.
                    let tv = b.time(|| unsafe {
                        vplan.run(&OnStream {
                            gpu: &b.gpu,
                            stream: &b.stream,
                        })
                    })?;
                    let o = download(&out)?;
                    let verr = sampled_error(&p, &qb, &kb, &vb, &o);
                    let mut row = Row::ours("attention_fwd", cfg.clone(), &tv)
                        .flops(p.flops())
                        .err(verr);
                    row.implementation = format!("ours-{variant}");
                    b.push(row);
                }
                let forward = plan.forward_launch()?;
                // SAFETY: as above; `V^T` was written by the runs above.
                let tk = b.time(|| unsafe {
                    OnStream {
                        gpu: &b.gpu,
                        stream: &b.stream,
                    }
                    .launch(&forward)
                })?;
                let mut row = Row::ours("attention_fwd", cfg.clone(), &tk)
                    .flops(p.flops())
                    .err(err);
                row.implementation = "ours-kernel".into();
                b.push(row);
                // SAFETY: as above.
                let tt = b.time(|| unsafe {
                    OnStream {
                        gpu: &b.gpu,
                        stream: &b.stream,
                    }
                    .launch(&plan.transpose)
                })?;
                let bytes = 2.0 * (p.batch * p.seq_k * p.heads_kv * p.head_dim) as f64;
                b.push(Row::ours("attention_fp8_vt", cfg.clone(), &tt).bytes(bytes));
                // The bf16 forward on the dequantized values.
                let mut lse16 = poisoned::<f32>(p.lse_len())?;
                let mut o16 = View::contiguous(&out, p.q_shape());
                let (qv, kv, vv) = (
                    View::contiguous(&dqb, p.q_shape()),
                    View::contiguous(&dkb, p.kv_shape()),
                    View::contiguous(&dvb, p.kv_shape()),
                );
                let t16 = b.time(|| {
                    attention::forward(&b.gpu, &b.stream, &p, &qv, &kv, &vv, &mut o16, &mut lse16)
                })?;
                let o = download(&out)?;
                let err16 = sampled_error(&p, &qb, &kb, &vb, &o);
                let mut row = Row::ours("attention_fwd", cfg, &t16)
                    .flops(p.flops())
                    .err(err16);
                row.implementation = "ours-bf16".into();
                b.push(row);
            }
        }
    }
    Ok(())
}
