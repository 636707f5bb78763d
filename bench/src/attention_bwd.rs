//! Family `attention-backward`: `attention_bwd` (the backward alone, given O and LSE from
//! our forward) and `attention_fwd_bwd` (forward then backward, as a training step runs them),
//! each as `ours` (the library's default) and `ours-deterministic` (the deterministic option),
//! over D 64/128/256, S 1k..16k (B x S = 16k tokens, H x D = 2048), causal and not, beside the
//! peers of `bench/peers/attention.py` (SDPA flash and cuDNN, FA4 when installed) on the same
//! Q, K, V and dO. Each row records the plan's `path`: on a Hopper GPU the Hopper kernels (in
//! both modes; the deterministic one orders the dQ additions), else the `mma.sync` kernels (dQ
//! by f32 atomics by default). On a Hopper GPU the `mma.sync` kernels are also timed forced, as
//! tuning rows `ours-mma` and `ours-mma-deterministic`. V and O of their own head dimension
//! (the pairs of `VALUE_DIMS`, Hopper GPUs): rows with `dv` in their configuration beside
//! those of D, FLOPs counted with `D + D_v` as the forward's.
//!
//! FLOPs (FlashAttention's convention): the backward counts 2.5 forwards (`2.5 x 4 B H S^2 D`,
//! halved under causal masking), forward + backward 3.5.
//!
//! Validation: on 8 sampled dQ rows and 8 sampled dK/dV rows against f64 sums from the inputs
//! (dQ rows: exact, their softmax recomputed in f64; dK/dV rows: given our forward's O and LSE,
//! as the backward is); the largest error must stay within [`REL_BOUND`] of the largest sampled
//! gradient magnitude. `peak_extra_mib`: the device memory the call allocates beyond its inputs
//! (the workspace and the gradients; with the forward, O and LSE too).
//!
//! Focused runs: `KBENCH_ATTENTION_DIMS` and `KBENCH_ATTENTION_SEQS` restrict the grid as for
//! the forward.

use crate::config;
use crate::harness::{Bench, Row, Tensor};
use kernels::attention::{
    self, AttentionBackwardTensors, AttentionProblem, BackwardOptions, BackwardWorkspace, Dtype,
    Target, View,
};
use kernels::exec::OnStream;
use kernels::memory::{download, poisoned};
use kernels::{DeviceBuffer, Result, bf16};

/// Largest sampled error, relative to the largest sampled gradient magnitude, a row may have.
const REL_BOUND: f64 = 5e-2;

/// The backward's sequence lengths (the forward grid's from 1k up).
const SEQS: &[usize] = &[1024, 2048, 4096, 8192, 16384];

/// Host and device copies of the inputs shared by every configuration (flat, `ELEMS` each).
pub struct Shared<'a> {
    /// Q, K, V, dO on the host.
    pub host: [&'a [bf16]; 4],
    /// Q, K, V, dO on the device.
    pub dev: [&'a DeviceBuffer<bf16>; 4],
}

/// The backward rows over `dims` x `seqs` (the forward grid's, already restricted; sequences
/// below 1k are skipped), causal and not.
pub fn run(b: &mut Bench, x: &Shared<'_>, dims: &[usize], seqs: &[usize]) -> Result<()> {
    for &d in dims {
        for &s in seqs.iter().filter(|s| SEQS.contains(s)) {
            for causal in [false, true] {
                let mut p =
                    AttentionProblem::new(16384 / s, s, s, 2048 / d, 2048 / d, d, Dtype::Bf16);
                p.causal = causal;
                // V and O of their own head dimension (the Hopper kernels), beside the rows
                // of D: the pairs whose D the grid names, with D's heads.
                for (pd, vd) in kernel_abi::attention::VALUE_DIMS {
                    if pd as usize == d && b.gpu.arch().has_hopper_kernels() {
                        one(b, &p.clone().value_dim(vd as usize), x)?;
                    }
                }
                one(b, &p, x)?;
            }
        }
    }
    Ok(())
}

/// The bench's stream as an executor.
fn on_stream(b: &Bench) -> OnStream<'_> {
    OnStream {
        gpu: &b.gpu,
        stream: &b.stream,
    }
}

/// MiB of `n` elements of `T`.
fn mib<T>(n: usize) -> f64 {
    (n * std::mem::size_of::<T>()) as f64 / 1048576.0
}

fn one(b: &mut Bench, p: &AttentionProblem, x: &Shared<'_>) -> Result<()> {
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let (vs, os) = (p.v_shape(), p.o_shape());
    let nq: usize = qs.iter().product();
    let nk: usize = ks.iter().product();
    let (nv, no): (usize, usize) = (vs.iter().product(), os.iter().product());
    let [dq_in, dk_in, dv_in, ddo_in] = x.dev;
    let (qv, kv, vv) = (
        View::contiguous(dq_in, qs),
        View::contiguous(dk_in, ks),
        View::contiguous(dv_in, vs),
    );
    let out = poisoned::<bf16>(no)?;
    let mut lse = poisoned::<f32>(p.lse_len())?;
    attention::forward(
        &b.gpu,
        &b.stream,
        p,
        &qv,
        &kv,
        &vv,
        &mut View::contiguous(&out, os),
        &mut lse,
    )?;
    b.gpu.sync(&b.stream, "attention forward")?;
    let (o_host, lse_host) = (download(&out)?, download(&lse)?);
    let mut cfg = config!(
        "batch": p.batch, "seq": p.seq_q, "heads": p.heads_q, "d": p.head_dim,
        "causal": p.causal, "dtype": "bf16"
    );
    if p.has_value_dim() {
        cfg.insert("dv".into(), serde_json::json!(p.v_dim()));
    }
    let (dq, dk, dv) = (
        poisoned::<bf16>(nq)?,
        poisoned::<bf16>(nk)?,
        poisoned::<bf16>(nv)?,
    );
    let mut variants = vec![
        (attention::Path::Auto, false, "ours"),
        (attention::Path::Auto, true, "ours-deterministic"),
    ];
    // "ours-mma" only where the automatic choice is another path (a Hopper backward kernel, of
    // the head dimension or padded).
    let (dtype, d) = (kernel_abi::attention::Dtype::Bf16, p.head_dim as u32);
    let hopper = kernel_abi::attention::hopper_bwd::hopper_bwd_kernel(dtype, d, false)
        .or_else(|| kernel_abi::attention::hopper_bwd::hopper_bwd_padded_kernel(dtype, d, false));
    // (The pairs of `VALUE_DIMS` have the Hopper kernels only.)
    if b.gpu.arch().has_hopper_kernels() && hopper.is_some() && !p.has_value_dim() {
        variants.extend([
            (attention::Path::MmaSync, false, "ours-mma"),
            (attention::Path::MmaSync, true, "ours-mma-deterministic"),
        ]);
    }
    for (path, deterministic, impl_name) in variants {
        let options = BackwardOptions { deterministic };
        let mut p = p.clone();
        p.path = path;
        let p = &p;
        let plan = {
            let tensors = AttentionBackwardTensors {
                q: qv,
                k: kv,
                v: vv,
                o: View::contiguous(&out, os),
                d_o: View::contiguous(ddo_in, os),
                lse: (&lse).into(),
                d_lse: None,
                dq: View::contiguous(&dq, qs),
                dk: View::contiguous(&dk, ks),
                dv: View::contiguous(&dv, vs),
                sinks: None,
                d_sinks: None,
            };
            p.plan_backward(Target::of(&b.gpu), &tensors, options)?
        };
        let delta = poisoned::<f32>(plan.delta_len())?;
        let accum = (plan.dq_accum_len() > 0)
            .then(|| poisoned::<f32>(plan.dq_accum_len()))
            .transpose()?;
        let ws = BackwardWorkspace {
            delta: (&delta).into(),
            dq_accum: accum.as_ref().map(|a| a.into()),
        };
        // SAFETY: the plan's tensors (the shared inputs, `out`, `lse`, the gradients) and the
        // workspace are live device buffers for the whole function, and every run is followed
        // by a synchronization (the timing's, or the one below) before they are released; the
        // workspace is fresh memory that aliases none of them.
        let t_bwd = b.time(|| unsafe { plan.run(&on_stream(b), &ws) })?;
        b.gpu.sync(&b.stream, "attention backward")?;
        let got = [download(&dq)?, download(&dk)?, download(&dv)?];
        let (err, rel) = check(p, x.host, &o_host, &lse_host, &got)?;
        let path_name = format!("{:?}", plan.path()).to_lowercase();
        let ws_mib = mib::<f32>(plan.delta_len() + plan.dq_accum_len());
        let grads_mib = mib::<bf16>(nq + nk + nv);
        let mut row = Row::ours("attention_bwd", cfg.clone(), &t_bwd)
            .flops(2.5 * p.flops())
            .err(err);
        row.implementation = impl_name.to_string();
        row.extra
            .insert("max_err_rel".into(), serde_json::json!(rel));
        row.extra.insert(
            "peak_extra_mib".into(),
            serde_json::json!(ws_mib + grads_mib),
        );
        row.extra
            .insert("path".into(), serde_json::json!(path_name));
        b.push(row);
        let t_step = {
            let mut ov = View::contiguous(&out, os);
            b.time(|| {
                attention::forward(&b.gpu, &b.stream, p, &qv, &kv, &vv, &mut ov, &mut lse)?;
                // SAFETY: as above; the forward before it on the same stream rewrites O and
                // LSE at the addresses the plan holds.
                unsafe { plan.run(&on_stream(b), &ws) }
            })?
        };
        b.gpu.sync(&b.stream, "attention forward and backward")?;
        let mut row = Row::ours("attention_fwd_bwd", cfg.clone(), &t_step)
            .flops(3.5 * p.flops())
            .err(err);
        row.implementation = impl_name.to_string();
        row.extra
            .insert("max_err_rel".into(), serde_json::json!(rel));
        let fwd_mib = mib::<bf16>(no) + mib::<f32>(p.lse_len());
        row.extra.insert(
            "peak_extra_mib".into(),
            serde_json::json!(ws_mib + grads_mib + fwd_mib),
        );
        row.extra
            .insert("path".into(), serde_json::json!(path_name));
        b.push(row);
        if impl_name == "ours" {
            let tensors = [
                ("dq", Tensor::Bf16(&got[0], qs.to_vec())),
                ("dk", Tensor::Bf16(&got[1], ks.to_vec())),
                ("dv", Tensor::Bf16(&got[2], vs.to_vec())),
            ];
            b.case(
                "attention_bwd",
                &cfg,
                config!("flops": 2.5 * p.flops()),
                &tensors,
            )?;
            b.case_again("attention_fwd_bwd", &cfg, config!("flops": 3.5 * p.flops()))?;
        }
    }
    Ok(())
}

/// Sampled positions `(batch, row, head)`: `n` spread over the three.
fn samples(n: usize, batch: usize, seq: usize, heads: usize) -> Vec<(usize, usize, usize)> {
    (0..n)
        .map(|i| {
            (
                (i * 7) % batch,
                (i * 104_729 + i * i * 31) % seq,
                (i * 5) % heads,
            )
        })
        .collect()
}

/// The largest absolute error of the sampled gradient values (dQ rows, dK and dV rows), and
/// that error relative to the largest sampled magnitude; an error past [`REL_BOUND`].
fn check(
    p: &AttentionProblem,
    [q, k, v, d_o]: [&[bf16]; 4],
    o: &[bf16],
    lse: &[f32],
    [dq, dk, dv]: &[Vec<bf16>; 3],
) -> Result<(f64, f64)> {
    let (d, e) = (p.head_dim, p.v_dim());
    let group = p.heads_q / p.heads_kv;
    let scale = p.softmax_scale() as f64;
    // Rows of width `w` (D for Q, K, dQ, dK; D_v for V, O, dO, dV).
    let qrow = |t: &[bf16], w: usize, b: usize, i: usize, h: usize| -> Vec<f64> {
        let s = ((b * p.seq_q + i) * p.heads_q + h) * w;
        t[s..s + w].iter().map(|x| x.to_f64()).collect()
    };
    let krow = |t: &[bf16], w: usize, b: usize, j: usize, h: usize| -> Vec<f64> {
        let s = ((b * p.seq_k + j) * p.heads_kv + h) * w;
        t[s..s + w].iter().map(|x| x.to_f64()).collect()
    };
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let (mut err, mut top) = (0.0f64, 0.0f64);
    let mut note = |got: &[bf16], want: &[f64]| {
        for (g, w) in got.iter().zip(want) {
            let e = (g.to_f64() - w).abs();
            err = if e.is_nan() {
                f64::INFINITY
            } else {
                err.max(e)
            };
            top = top.max(w.abs());
        }
    };
    // dQ rows: the softmax recomputed in f64.
    for (b, i, h) in samples(8, p.batch, p.seq_q, p.heads_q) {
        let hk = h / group;
        let (qi, doi) = (qrow(q, d, b, i, h), qrow(d_o, e, b, i, h));
        let keys: Vec<usize> = (0..p.seq_k).filter(|&j| p.allowed(i, j)).collect();
        let s: Vec<f64> = keys
            .iter()
            .map(|&j| scale * dot(&qi, &krow(k, d, b, j, hk)))
            .collect();
        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = s.iter().map(|x| (x - max).exp()).sum();
        let probs: Vec<f64> = s.iter().map(|x| (x - max).exp() / sum).collect();
        let dps: Vec<f64> = keys
            .iter()
            .map(|&j| dot(&doi, &krow(v, e, b, j, hk)))
            .collect();
        let delta: f64 = probs.iter().zip(&dps).map(|(a, b)| a * b).sum();
        let mut want = vec![0.0; d];
        for ((&j, pj), dpj) in keys.iter().zip(&probs).zip(&dps) {
            let kj = krow(k, d, b, j, hk);
            for (w, kc) in want.iter_mut().zip(&kj) {
                *w += scale * pj * (dpj - delta) * kc;
            }
        }
        let start = ((b * p.seq_q + i) * p.heads_q + h) * d;
        note(&dq[start..start + d], &want);
    }
    // dK and dV rows: over every query row of every query head of the group, with P and delta
    // from our forward's LSE and O.
    for (b, j, hk) in samples(8, p.batch, p.seq_k, p.heads_kv) {
        let (kj, vj) = (krow(k, d, b, j, hk), krow(v, e, b, j, hk));
        let (mut want_k, mut want_v) = (vec![0.0; d], vec![0.0; e]);
        for h in hk * group..(hk + 1) * group {
            for i in (0..p.seq_q).filter(|&i| p.allowed(i, j)) {
                let qi = qrow(q, d, b, i, h);
                let (doi, oi) = (qrow(d_o, e, b, i, h), qrow(o, e, b, i, h));
                let pij =
                    (scale * dot(&qi, &kj) - lse[(b * p.heads_q + h) * p.seq_q + i] as f64).exp();
                let ds = pij * (dot(&doi, &vj) - dot(&doi, &oi));
                for c in 0..d {
                    want_k[c] += scale * ds * qi[c];
                }
                for c in 0..e {
                    want_v[c] += pij * doi[c];
                }
            }
        }
        let row = |w: usize| ((b * p.seq_k + j) * p.heads_kv + hk) * w;
        note(&dk[row(d)..row(d) + d], &want_k);
        note(&dv[row(e)..row(e) + e], &want_v);
    }
    let rel = err / top.max(f64::MIN_POSITIVE);
    if rel.is_nan() || rel > REL_BOUND {
        return Err(kernels::Error::invalid(
            "attention backward result",
            format!(
                "{p:?}: max error {err:.3e} on sampled gradients is {rel:.2e} of their largest \
                 magnitude {top:.3e}, past {REL_BOUND:e}"
            ),
        ));
    }
    Ok((err, rel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::attention::reference::{backward, reference};
    use kernels::data::{rng, uniform_bf16};

    /// The sampled check accepts the f64 reference's gradients (rounded to bf16) and rejects
    /// them with dK and dV swapped, on a causal problem with several batches and heads.
    #[test]
    fn check_accepts_the_reference_and_rejects_a_swap() {
        let mut p = AttentionProblem::new(3, 70, 70, 4, 2, 64, Dtype::Bf16);
        p.causal = true;
        let n = 3 * 70 * 4 * 64;
        let nk = n / 2;
        let mut r = rng(5);
        let q = uniform_bf16(&mut r, n, -1.0, 1.0);
        let k = uniform_bf16(&mut r, nk, -1.0, 1.0);
        let v = uniform_bf16(&mut r, nk, -1.0, 1.0);
        let d_o = uniform_bf16(&mut r, n, -1.0, 1.0);
        let fwd = reference(&p, &q, &k, &v);
        let o: Vec<bf16> = fwd.o.iter().map(|&x| bf16::from_f64(x)).collect();
        let lse: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
        let g = backward(&p, &q, &k, &v, &d_o, None);
        let round = |x: &[f64]| -> Vec<bf16> { x.iter().map(|&x| bf16::from_f64(x)).collect() };
        let host = [&q[..], &k[..], &v[..], &d_o[..]];
        let good = [round(&g.dq), round(&g.dk), round(&g.dv)];
        let (err, rel) = check(&p, host, &o, &lse, &good).expect("the reference passes");
        println!("reference: max error {err:.3e}, relative {rel:.3e}");
        assert!(rel < 1e-2);
        let swapped = [round(&g.dq), round(&g.dv), round(&g.dk)];
        assert!(check(&p, host, &o, &lse, &swapped).is_err());
    }

    /// The same with V, O and dO of their own head dimension (192, 128): the reference passes,
    /// dV with its columns rotated does not.
    #[test]
    fn check_takes_a_value_head_dimension() {
        let p = AttentionProblem::new(2, 40, 50, 4, 2, 192, Dtype::Bf16)
            .value_dim(128)
            .causal();
        let n = |s: [usize; 4]| s.iter().product::<usize>();
        let mut r = rng(6);
        let q = uniform_bf16(&mut r, n(p.q_shape()), -1.0, 1.0);
        let k = uniform_bf16(&mut r, n(p.kv_shape()), -1.0, 1.0);
        let v = uniform_bf16(&mut r, n(p.v_shape()), -1.0, 1.0);
        let d_o = uniform_bf16(&mut r, n(p.o_shape()), -1.0, 1.0);
        let fwd = reference(&p, &q, &k, &v);
        let o: Vec<bf16> = fwd.o.iter().map(|&x| bf16::from_f64(x)).collect();
        let lse: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
        let g = backward(&p, &q, &k, &v, &d_o, None);
        let round = |x: &[f64]| -> Vec<bf16> { x.iter().map(|&x| bf16::from_f64(x)).collect() };
        let host = [&q[..], &k[..], &v[..], &d_o[..]];
        let good = [round(&g.dq), round(&g.dk), round(&g.dv)];
        let (_, rel) = check(&p, host, &o, &lse, &good).expect("the reference passes");
        assert!(rel < 1e-2);
        let mut dv = g.dv.clone();
        dv.rotate_left(1);
        let bad = [round(&g.dq), round(&g.dk), round(&dv)];
        assert!(check(&p, host, &o, &lse, &bad).is_err());
    }
}
