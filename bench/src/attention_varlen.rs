//! `kbench attention-varlen`: the forward over packed sequences of mixed lengths
//! (`attention::forward_varlen`, rows `attention_varlen_fwd`: `ours`, the automatic path, and
//! `ours-mma`, the `mma.sync` path, on Hopper GPUs), 64 sequences with lengths uniform in
//! [128, 8192] (`--quick`: 8 in [128, 2048]), 16 heads, bf16, D 64 and 128, causal and not,
//! beside the equal-length forward of about the same work on the same device in the
//! same run (rows `attention_varlen_fwd` with implementation `ours-equal-length`, the automatic
//! path, and `ours-equal-length-mma` on Hopper GPUs: 64 sequences of the root mean square
//! length rounded to 128): the "within 10% of the equal-length forward" compares their
//! TFLOP/s.
//!
//! Training steps over the same batch (rows `attention_varlen_fwd_bwd`: the forward and
//! `AttentionVarlenBackwardPlan::run` with a workspace allocated once): `ours` (the automatic
//! path: the Hopper backward kernels on Hopper GPUs), `ours-deterministic`, `ours-mma` (the
//! `mma.sync` path on Hopper GPUs, its gradients' largest difference from `ours`'s recorded as
//! `diff_vs_mma`), and `ours-equal-length` (the dense forward and backward of the
//! equal-length batch); the peers run `backward()` of their output through autograd.
//!
//! FLOPs: the sum over the sequences of `4 heads L^2 D` (halved under causal masking), the dense
//! forward's convention per sequence; a forward and backward counts 3.5 times that
//! (FlashAttention's convention: the backward 2.5 times the forward). Two rows of the shortest and the longest sequence are
//! checked against the f64 reference (`max_err`). Peers (`bench/peers/attention_varlen.py`):
//! PyTorch SDPA on nested (jagged) tensors of the same lengths, which runs FlashAttention-2's
//! varlen kernel, and FlashAttention's `flash_attn_varlen_func` where installed; on inputs of
//! their own (timing only: each case carries the boundaries, not Q, K, V).

use crate::config;
use crate::harness::{Bench, Row, Tensor};
use kernels::DeviceBuffer;
use kernels::attention::{
    self, AttentionBackwardTensors, AttentionProblem, AttentionVarlenBackwardTensors,
    AttentionVarlenProblem, AttentionVarlenTensors, BackwardOptions, BackwardWorkspace, CuSeqlens,
    DeviceCuSeqlens, Dtype, Path, Target, View,
};
use kernels::data::{rng, uniform_bf16};
use kernels::exec::OnStream;
use kernels::memory::{download, poisoned, upload};
use kernels::{Result, bf16};
use rand::Rng;

const HEADS: usize = 16;

/// Run the family.
pub fn run(b: &mut Bench) -> Result<()> {
    b.peers_from("attention_varlen");
    let (n, max_len, dims): (usize, usize, &[usize]) = if b.quick {
        (8, 2048, &[128])
    } else {
        (64, 8192, &[64, 128])
    };
    let mut r = rng(4242);
    let lens: Vec<usize> = (0..n).map(|_| r.random_range(128..=max_len)).collect();
    let total: usize = lens.iter().sum();
    let seqlens = CuSeqlens::from_lens(&lens.iter().map(|&l| (l, l)).collect::<Vec<_>>())?;
    let mut dev_seqlens = seqlens.upload()?;
    let sum_sq: f64 = lens.iter().map(|&l| (l * l) as f64).sum();
    let rms = (sum_sq / n as f64).sqrt();
    let eq_len = ((rms / 128.0).round() as usize).max(1) * 128;
    let cu: Vec<i64> = std::iter::once(0)
        .chain(lens.iter().scan(0i64, |acc, &l| {
            *acc += l as i64;
            Some(*acc)
        }))
        .collect();
    for &d in dims {
        let elems = total.max(n * eq_len) * HEADS * d;
        let q = uniform_bf16(&mut r, elems, -1.0, 1.0);
        let k = uniform_bf16(&mut r, elems, -1.0, 1.0);
        let v = uniform_bf16(&mut r, elems, -1.0, 1.0);
        let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
        for causal in [false, true] {
            let hopper = b.gpu.arch().has_hopper_kernels()
                && kernel_abi::attention::hopper_kernel(Dtype::Bf16, d as u32, None).is_some();
            let cfg = config!(
                "sequences": n, "min_len": 128, "max_len": max_len, "total": total,
                "heads": HEADS, "d": d, "causal": causal, "dtype": "bf16"
            );
            // Packed sequences, on each path; `ours-pertile`: the Hopper kernel with one block
            // per query tile (no tile counter), the grid the persistent one replaced.
            let packed_paths: &[(Path, &str)] = if hopper {
                &[
                    (Path::Auto, "ours"),
                    (Path::MmaSync, "ours-mma"),
                    (Path::Hopper, "ours-pertile"),
                ]
            } else {
                &[(Path::Auto, "ours")]
            };
            let mut flops = 0.0;
            for &(path, name) in packed_paths {
                let mut p = AttentionVarlenProblem::new(&seqlens, HEADS, HEADS, d, Dtype::Bf16);
                p.causal = causal;
                p.path = path;
                let shape = [total, HEADS, d];
                let out = poisoned::<bf16>(total * HEADS * d)?;
                let mut lse = poisoned::<f32>(p.lse_len())?;
                let mut ov = View::packed_contiguous(&out, shape);
                let (qv, kv, vv) = (
                    View::packed_contiguous(&dq, shape),
                    View::packed_contiguous(&dk, shape),
                    View::packed_contiguous(&dv, shape),
                );
                let t = if name == "ours-pertile" {
                    let (cu_q, cu_k) = dev_seqlens.device();
                    let tensors = AttentionVarlenTensors {
                        q: qv,
                        k: kv,
                        v: vv,
                        o: ov,
                        lse: (&lse).into(),
                        cu_seqlens_q: cu_q,
                        cu_seqlens_k: cu_k,
                        sinks: None,
                        tile_counter: None,
                    };
                    let plan = p.plan(Target::of(&b.gpu), &tensors)?;
                    let on = OnStream {
                        gpu: &b.gpu,
                        stream: &b.stream,
                    };
                    // SAFETY: the plan's tensors are live device buffers of this function, each
                    // run followed by the timing's synchronization before they are released;
                    // O and LSE are fresh memory that aliases nothing; no tile counter.
                    b.time(|| unsafe { plan.run(&on) })?
                } else {
                    b.time(|| {
                        attention::forward_varlen(
                            &b.gpu,
                            &b.stream,
                            &p,
                            &mut dev_seqlens,
                            &qv,
                            &kv,
                            &vv,
                            &mut ov,
                            &mut lse,
                        )
                    })?
                };
                let o = download(&out)?;
                flops = lens.iter().map(|&l| p.sequence(l, l).flops()).sum();
                let err = check_rows(&p, &seqlens, &lens, (&q, &k, &v), &o);
                if err > 2e-2 {
                    return Err(kernels::Error::invalid(
                        "attention varlen result",
                        format!("{name} D {d} causal {causal}: max error {err:.3e} exceeds 2e-2"),
                    ));
                }
                let mut row = Row::ours("attention_varlen_fwd", cfg.clone(), &t)
                    .flops(flops)
                    .err(err);
                row.implementation = name.to_string();
                b.push(row);
            }
            b.case(
                "attention_varlen_fwd",
                &cfg,
                config!("flops": flops),
                &[("cu_seqlens", Tensor::I64(&cu, vec![n + 1]))],
            )?;
            // Forward and backward of the packed batch, on each path and mode.
            let steps: &[(Path, bool, &str)] = if hopper {
                &[
                    (Path::Auto, false, "ours"),
                    (Path::Auto, true, "ours-deterministic"),
                    (Path::MmaSync, false, "ours-mma"),
                ]
            } else {
                &[
                    (Path::Auto, false, "ours"),
                    (Path::Auto, true, "ours-deterministic"),
                ]
            };
            let mut first: Option<Vec<Vec<bf16>>> = None;
            for &(path, deterministic, name) in steps {
                let mut p = AttentionVarlenProblem::new(&seqlens, HEADS, HEADS, d, Dtype::Bf16);
                p.causal = causal;
                p.path = path;
                let x = Packed {
                    q: &dq,
                    k: &dk,
                    v: &dv,
                    d_o: &dk,
                };
                let (t, grads, path_name) = packed_step(b, &p, &mut dev_seqlens, x, deterministic)?;
                let mut row =
                    Row::ours("attention_varlen_fwd_bwd", cfg.clone(), &t).flops(3.5 * flops);
                row.implementation = name.to_string();
                row.extra
                    .insert("path".into(), serde_json::json!(path_name));
                match &first {
                    None => first = Some(grads),
                    Some(f) => {
                        let diff = f
                            .iter()
                            .zip(&grads)
                            .flat_map(|(a, b)| a.iter().zip(b))
                            .map(|(a, b)| (a.to_f64() - b.to_f64()).abs())
                            .fold(
                                0.0f64,
                                |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
                            );
                        row.extra
                            .insert("diff_vs_ours".into(), serde_json::json!(diff));
                    }
                }
                b.push(row);
            }
            b.case_again(
                "attention_varlen_fwd_bwd",
                &cfg,
                config!("flops": 3.5 * flops),
            )?;
            // The equal-length forward of about the same work, on each path.
            let mut dense = AttentionProblem::new(n, eq_len, eq_len, HEADS, HEADS, d, Dtype::Bf16);
            dense.causal = causal;
            let paths: &[(Path, &str)] = if hopper {
                &[
                    (Path::Auto, "ours-equal-length"),
                    (Path::MmaSync, "ours-equal-length-mma"),
                ]
            } else {
                &[(Path::Auto, "ours-equal-length")]
            };
            for &(path, name) in paths {
                let dp = dense.clone().path(path);
                let out = poisoned::<bf16>(n * eq_len * HEADS * d)?;
                let mut lse = poisoned::<f32>(dp.lse_len())?;
                let mut ov = View::contiguous(&out, dp.q_shape());
                let (qv, kv, vv) = (
                    View::contiguous(&dq, dp.q_shape()),
                    View::contiguous(&dk, dp.kv_shape()),
                    View::contiguous(&dv, dp.kv_shape()),
                );
                let t = b.time(|| {
                    attention::forward(&b.gpu, &b.stream, &dp, &qv, &kv, &vv, &mut ov, &mut lse)
                })?;
                let mut row = Row::ours("attention_varlen_fwd", cfg.clone(), &t).flops(dp.flops());
                row.implementation = name.to_string();
                row.extra
                    .insert("equal_length".into(), serde_json::json!(eq_len));
                b.push(row);
            }
            // Forward and backward of the equal-length batch (the automatic path).
            let t = dense_step(b, &dense, (&dq, &dk, &dv))?;
            let mut row =
                Row::ours("attention_varlen_fwd_bwd", cfg.clone(), &t).flops(3.5 * dense.flops());
            row.implementation = "ours-equal-length".to_string();
            row.extra
                .insert("equal_length".into(), serde_json::json!(eq_len));
            b.push(row);
        }
    }
    b.run_peers();
    Ok(())
}

/// Q, K, V and dO of a packed batch (`[total, heads, D]` from each buffer's start).
#[derive(Clone, Copy)]
struct Packed<'a> {
    q: &'a DeviceBuffer<bf16>,
    k: &'a DeviceBuffer<bf16>,
    v: &'a DeviceBuffer<bf16>,
    d_o: &'a DeviceBuffer<bf16>,
}

/// Time the forward and the planned backward of the packed problem `p` (workspace allocated
/// once); the gradients of the last run and the backward's path.
fn packed_step(
    b: &Bench,
    p: &AttentionVarlenProblem,
    seqlens: &mut DeviceCuSeqlens,
    x: Packed<'_>,
    deterministic: bool,
) -> Result<(kernels::timing::Timings, Vec<Vec<bf16>>, String)> {
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let (nq, nk) = (qs.iter().product(), ks.iter().product());
    let out = poisoned::<bf16>(nq)?;
    let mut lse = poisoned::<f32>(p.lse_len())?;
    let (dq, dk, dv) = (
        poisoned::<bf16>(nq)?,
        poisoned::<bf16>(nk)?,
        poisoned::<bf16>(nk)?,
    );
    let (qv, kv, vv) = (
        View::packed_contiguous(x.q, qs),
        View::packed_contiguous(x.k, ks),
        View::packed_contiguous(x.v, ks),
    );
    let (cu_q, cu_k) = seqlens.device();
    let tensors = AttentionVarlenBackwardTensors {
        q: qv,
        k: kv,
        v: vv,
        o: View::packed_contiguous(&out, qs),
        d_o: View::packed_contiguous(x.d_o, qs),
        lse: (&lse).into(),
        d_lse: None,
        dq: View::packed_contiguous(&dq, qs),
        dk: View::packed_contiguous(&dk, ks),
        dv: View::packed_contiguous(&dv, ks),
        cu_seqlens_q: cu_q,
        cu_seqlens_k: cu_k,
        sinks: None,
        d_sinks: None,
    };
    let plan = p.plan_backward(
        Target::of(&b.gpu),
        &tensors,
        BackwardOptions { deterministic },
    )?;
    let delta = poisoned::<f32>(plan.delta_len())?;
    let accum = (plan.dq_accum_len() > 0)
        .then(|| poisoned::<f32>(plan.dq_accum_len()))
        .transpose()?;
    let ws = BackwardWorkspace {
        delta: (&delta).into(),
        dq_accum: accum.as_ref().map(|a| a.into()),
    };
    let on = OnStream {
        gpu: &b.gpu,
        stream: &b.stream,
    };
    let mut ov = View::packed_contiguous(&out, qs);
    let t = b.time(|| {
        attention::forward_varlen(
            &b.gpu, &b.stream, p, seqlens, &qv, &kv, &vv, &mut ov, &mut lse,
        )?;
        // SAFETY: the plan's tensors and the workspace are live device buffers of this function,
        // each run followed by a synchronization (the timing's, or the one below) before they
        // are released; the forward before it on the same stream writes O and LSE at the
        // addresses the plan holds; the workspace is fresh memory that aliases none of them.
        unsafe { plan.run(&on, &ws) }
    })?;
    b.gpu
        .sync(&b.stream, "attention varlen forward and backward")?;
    let grads = vec![download(&dq)?, download(&dk)?, download(&dv)?];
    Ok((t, grads, format!("{:?}", plan.path()).to_lowercase()))
}

/// Time the forward and the planned backward of the dense problem `p` (the automatic path;
/// workspace allocated once) on Q, K, V from the buffers' starts, dO = K.
fn dense_step(
    b: &Bench,
    p: &AttentionProblem,
    (q, k, v): (
        &DeviceBuffer<bf16>,
        &DeviceBuffer<bf16>,
        &DeviceBuffer<bf16>,
    ),
) -> Result<kernels::timing::Timings> {
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let (nq, nk) = (qs.iter().product(), ks.iter().product());
    let out = poisoned::<bf16>(nq)?;
    let mut lse = poisoned::<f32>(p.lse_len())?;
    let (dq, dk, dv) = (
        poisoned::<bf16>(nq)?,
        poisoned::<bf16>(nk)?,
        poisoned::<bf16>(nk)?,
    );
    let (qv, kv, vv) = (
        View::contiguous(q, qs),
        View::contiguous(k, ks),
        View::contiguous(v, ks),
    );
    let tensors = AttentionBackwardTensors {
        q: qv,
        k: kv,
        v: vv,
        o: View::contiguous(&out, qs),
        d_o: View::contiguous(k, qs),
        lse: (&lse).into(),
        d_lse: None,
        dq: View::contiguous(&dq, qs),
        dk: View::contiguous(&dk, ks),
        dv: View::contiguous(&dv, ks),
        sinks: None,
        d_sinks: None,
    };
    let plan = p.plan_backward(Target::of(&b.gpu), &tensors, BackwardOptions::default())?;
    let delta = poisoned::<f32>(plan.delta_len())?;
    let accum = (plan.dq_accum_len() > 0)
        .then(|| poisoned::<f32>(plan.dq_accum_len()))
        .transpose()?;
    let ws = BackwardWorkspace {
        delta: (&delta).into(),
        dq_accum: accum.as_ref().map(|a| a.into()),
    };
    let on = OnStream {
        gpu: &b.gpu,
        stream: &b.stream,
    };
    let mut ov = View::contiguous(&out, qs);
    let t = b.time(|| {
        attention::forward(&b.gpu, &b.stream, p, &qv, &kv, &vv, &mut ov, &mut lse)?;
        // SAFETY: as in `packed_step`.
        unsafe { plan.run(&on, &ws) }
    })?;
    b.gpu.sync(&b.stream, "attention forward and backward")?;
    Ok(t)
}

/// The largest error of a few rows of the shortest and the longest sequence against the f64
/// reference of their own dense problems.
fn check_rows(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    lens: &[usize],
    (q, k, v): (&[bf16], &[bf16], &[bf16]),
    o: &[bf16],
) -> f64 {
    let row = p.heads_q * p.head_dim;
    let pick = |better: fn(usize, usize) -> bool| {
        (0..lens.len())
            .reduce(|a, i| if better(lens[i], lens[a]) { i } else { a })
            .expect("sequences")
    };
    let mut err = 0.0f64;
    for s in [pick(|a, b| a < b), pick(|a, b| a > b)] {
        let (len, q0) = (seqlens.seq_q(s), seqlens.q_start(s));
        let sp = p.sequence(len, len);
        let range = q0 * row..(q0 + len) * row;
        let rows: Vec<(usize, usize, usize)> = (0..4)
            .map(|i| (0, (i * 7919 + 3) % len, (i * 5) % p.heads_q))
            .collect();
        let want =
            attention::reference_rows(&sp, &q[range.clone()], &k[range.clone()], &v[range], &rows);
        for ((_, i, h), (ref_o, _)) in rows.iter().zip(&want) {
            let start = ((q0 + i) * p.heads_q + h) * p.head_dim;
            for (x, y) in o[start..start + p.head_dim].iter().zip(ref_o) {
                let e = (x.to_f64() - y).abs();
                err = if e.is_nan() {
                    f64::INFINITY
                } else {
                    err.max(e)
                };
            }
        }
    }
    err
}
