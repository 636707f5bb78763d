//! Family `attention`: the forward pass over the benchmark grid (batch x seq = 16k tokens,
//! heads x D = 2048, seq 512..16k, D 64/128/256, causal and not) plus B = 16, H = 16,
//! S = 2048, D = 64 causal, beside PyTorch SDPA with the FLASH (FlashAttention-2) and CUDNN
//! backends on the same inputs.
//!
//! FLOPs: `4 batch heads seq_q seq_k D`, halved under causal masking (`2 ... (D + D_v)` where V
//! has a head dimension `D_v` of its own: the rows with `dv` in their configuration, run beside
//! those of D for each pair of `VALUE_DIMS` whose D the grid names, `ours-mma` too on Hopper).
//!
//! Family `attention-backward` ([`run_backward`]): the backward rows (`attention_bwd`,
//! `attention_fwd_bwd`) of [`crate::attention_bwd`] over the same grid, its own results file.
//!
//! Focused runs (environment, comma-separated lists): `KBENCH_ATTENTION_DIMS` (any of the
//! library's head dimensions: 96 and 192 run only when named) and `KBENCH_ATTENTION_SEQS` set
//! the grid, the backward's too (the peers follow it; B = 16,
//! S = 2048 runs only when both allow it), `KBENCH_ATTENTION_VARIANTS` names the tuning variants
//! to time (default: all of `TUNING_VARIANTS` and, on Hopper GPUs, `HOPPER_VARIANTS`, at S = 4k,
//! 8k, 16k, or at the lengths `KBENCH_ATTENTION_SEQS` names). Every forward gets a tile counter
//! (which short causal problems and the dynamic grid's variant draw their tiles from) but with
//! `KBENCH_ATTENTION_TILE_COUNTER=0`: then short causal problems run one block per query tile,
//! for a comparison of the two grids within one run.

use crate::attention_bwd;
use crate::config;
use crate::harness::{Bench, Row, Tensor};
use kernel_abi::attention::{HOPPER_VARIANTS, HopperGrid, TUNING_VARIANTS};
use kernels::attention::{self, AttentionProblem, Dtype, Path, View};
use kernels::data::{rng, uniform_bf16};
use kernels::memory::{download, poisoned, upload};
use kernels::{Result, bf16};

/// Elements of each of Q, K, V, O (the same for every configuration of the grid).
const ELEMS: usize = 16384 * 2048;

/// Run the family: the forward over the grid, and the tuning variants.
pub fn run(b: &mut Bench) -> Result<()> {
    let mut r = rng(2024);
    let q = uniform_bf16(&mut r, ELEMS, -1.0, 1.0);
    let k = uniform_bf16(&mut r, ELEMS, -1.0, 1.0);
    let v = uniform_bf16(&mut r, ELEMS, -1.0, 1.0);
    let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
    b.shared(&[
        ("q", Tensor::Bf16(&q, vec![ELEMS])),
        ("k", Tensor::Bf16(&k, vec![ELEMS])),
        ("v", Tensor::Bf16(&v, vec![ELEMS])),
    ])?;
    let (dims, seqs) = grid(b.quick)?;
    let variants = std::env::var("KBENCH_ATTENTION_VARIANTS").ok();
    let variants: Vec<&str> = match &variants {
        Some(list) => list.split(',').map(str::trim).collect(),
        None => TUNING_VARIANTS
            .iter()
            .map(|(n, _)| *n)
            .chain(
                HOPPER_VARIANTS
                    .iter()
                    // A capped grid ("hgrid3") exists for the tests, not for timing.
                    .filter(|(_, c)| !matches!(c.grid, HopperGrid::Blocks(_)))
                    .map(|(n, _)| *n),
            )
            .collect(),
    };
    if let Some(v) = variants.iter().find(|v| {
        !TUNING_VARIANTS.iter().any(|(n, _)| n == *v)
            && !HOPPER_VARIANTS.iter().any(|(n, _)| n == *v)
    }) {
        return Err(kernels::Error::invalid(
            "KBENCH_ATTENTION_VARIANTS",
            format!("no tuning variant named {v:?}"),
        ));
    }
    let mut configs = Vec::new();
    for &d in &dims {
        for &s in &seqs {
            for causal in [false, true] {
                configs.push((16384 / s, s, 2048 / d, d, causal));
            }
        }
    }
    // B = 16, H = 16, S = 2048, D = 64, causal: 16 * 2048 * 16 * 64
    // elements, exactly ELEMS.
    if dims.contains(&64) && seqs.contains(&2048) {
        configs.push((16, 2048, 16, 64, true));
    }
    for (batch, s, h, d, causal) in configs {
        let mut p = AttentionProblem::new(batch, s, s, h, h, d, Dtype::Bf16);
        p.causal = causal;
        // V and O of their own head dimension (Hopper only), beside the rows of D and D_v: the
        // pairs whose D the grid names, with D's heads.
        for (pd, vd) in kernel_abi::attention::VALUE_DIMS {
            if pd as usize == d {
                let mut pair = p.clone().value_dim(vd as usize);
                one(b, &pair, &q, &k, &v, (&dq, &dk, &dv), None)?;
                if b.gpu.arch().has_hopper_kernels() {
                    pair.path = Path::MmaSync;
                    one(b, &pair, &q, &k, &v, (&dq, &dk, &dv), Some("mma"))?;
                }
            }
        }
        // "ours": the automatic choice (the Hopper path on Hopper GPUs); "ours-mma": the
        // mma.sync tensor-core path on the same inputs.
        one(b, &p, &q, &k, &v, (&dq, &dk, &dv), None)?;
        let hopper = kernel_abi::attention::hopper_kernel(Dtype::Bf16, d as u32, None);
        if b.gpu.arch().has_hopper_kernels() && hopper.is_some() {
            p.path = Path::MmaSync;
            one(b, &p, &q, &k, &v, (&dq, &dk, &dv), Some("mma"))?;
        }
    }
    // The tuning variants of the tile table, on a few configurations of the same grid.
    let tuning_seqs: &[usize] = if b.quick {
        &[2048]
    } else {
        &[4096, 8192, 16384]
    };
    // (any of the grid's lengths when named)
    let tuning_seqs = only("KBENCH_ATTENTION_SEQS", tuning_seqs, &seqs)?;
    let hopper = b.gpu.arch().has_hopper_kernels();
    let tiles = TUNING_VARIANTS.iter().map(|(n, c)| (*n, c.head_dim));
    let hoppers = HOPPER_VARIANTS
        .iter()
        .filter(|_| hopper)
        .map(|(n, c)| (*n, c.head_dim));
    for (name, d) in tiles.chain(hoppers) {
        let d = d as usize;
        if !variants.contains(&name) || !dims.contains(&d) {
            continue;
        }
        for &s in &tuning_seqs {
            for causal in [false, true] {
                let mut p =
                    AttentionProblem::new(16384 / s, s, s, 2048 / d, 2048 / d, d, Dtype::Bf16);
                p.causal = causal;
                one(b, &p, &q, &k, &v, (&dq, &dk, &dv), Some(name))?;
            }
        }
    }
    b.run_peers();
    Ok(())
}

/// Run the family `attention-backward`: the backward rows of [`attention_bwd`] over the same
/// grid (from 1k), on the same Q, K, V as the forward's, with the forward's peers.
pub fn run_backward(b: &mut Bench) -> Result<()> {
    b.peers_from("attention");
    let mut r = rng(2024);
    let q = uniform_bf16(&mut r, ELEMS, -1.0, 1.0);
    let k = uniform_bf16(&mut r, ELEMS, -1.0, 1.0);
    let v = uniform_bf16(&mut r, ELEMS, -1.0, 1.0);
    let d_o = uniform_bf16(&mut r, ELEMS, -1.0, 1.0);
    b.shared(&[
        ("q", Tensor::Bf16(&q, vec![ELEMS])),
        ("k", Tensor::Bf16(&k, vec![ELEMS])),
        ("v", Tensor::Bf16(&v, vec![ELEMS])),
        ("do", Tensor::Bf16(&d_o, vec![ELEMS])),
    ])?;
    let (dims, seqs) = grid(b.quick)?;
    let (dq, dk, dv, ddo) = (upload(&q)?, upload(&k)?, upload(&v)?, upload(&d_o)?);
    let x = attention_bwd::Shared {
        host: [&q, &k, &v, &d_o],
        dev: [&dq, &dk, &dv, &ddo],
    };
    attention_bwd::run(b, &x, &dims, &seqs)?;
    b.run_peers();
    Ok(())
}

/// Head dimensions and sequence lengths of the grid (`--quick`: fewer), restricted by
/// `KBENCH_ATTENTION_DIMS` and `KBENCH_ATTENTION_SEQS`.
fn grid(quick: bool) -> Result<(Vec<usize>, Vec<usize>)> {
    let seqs: &[usize] = if quick {
        &[512, 2048]
    } else {
        &[512, 1024, 2048, 4096, 8192, 16384]
    };
    let dims: &[usize] = if quick { &[128] } else { &[64, 128, 256] };
    // Every head dimension the library has may be asked for (96 and 192 are not in the default
    // grid).
    let every_dim: Vec<usize> = kernels::attention::HEAD_DIMS
        .iter()
        .map(|&d| d as usize)
        .collect();
    Ok((
        only("KBENCH_ATTENTION_DIMS", dims, &every_dim)?,
        only("KBENCH_ATTENTION_SEQS", seqs, seqs)?,
    ))
}

/// `default`, or the comma-separated values of the environment variable `var` when set (each
/// one of `all`).
pub(crate) fn only(var: &str, default: &[usize], all: &[usize]) -> Result<Vec<usize>> {
    let Ok(list) = std::env::var(var) else {
        return Ok(default.to_vec());
    };
    let mut keep = Vec::new();
    for item in list.split(',') {
        let v: usize = item
            .trim()
            .parse()
            .map_err(|_| kernels::Error::invalid(var, format!("{item:?} is not a number")))?;
        if !all.contains(&v) {
            return Err(kernels::Error::invalid(
                var,
                format!("{v} is not one of {all:?}"),
            ));
        }
        keep.push(v);
    }
    Ok(keep)
}

fn one(
    b: &mut Bench,
    p: &AttentionProblem,
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
    dev: (
        &kernels::DeviceBuffer<bf16>,
        &kernels::DeviceBuffer<bf16>,
        &kernels::DeviceBuffer<bf16>,
    ),
    variant: Option<&str>,
) -> Result<()> {
    let (qv, kv, vv) = (
        View::contiguous(dev.0, p.q_shape()),
        View::contiguous(dev.1, p.kv_shape()),
        View::contiguous(dev.2, p.v_shape()),
    );
    let out = poisoned::<bf16>(ELEMS)?;
    let mut lse = poisoned::<f32>(p.lse_len())?;
    let mut ov = View::contiguous(&out, p.o_shape());
    // "mma" names the path (set in `p`), not a tile variant of it.
    let tile_variant = variant.filter(|v| *v != "mma");
    // A tile counter (zero, left zero by every launch), which short causal problems and the
    // dynamic grid's variant draw their tiles from.
    let counted = std::env::var("KBENCH_ATTENTION_TILE_COUNTER").map_or(true, |v| v != "0");
    let counter = counted.then(|| upload(&[0u32])).transpose()?;
    let t = b.time(|| match &counter {
        Some(counter) => kernels_testing::attention::forward_with_counter(
            &b.gpu,
            &b.stream,
            p,
            (qv, kv, vv),
            (&mut ov, &mut lse),
            tile_variant,
            counter,
        ),
        None => attention::forward_variant(
            &b.gpu,
            &b.stream,
            p,
            &qv,
            &kv,
            &vv,
            &mut ov,
            &mut lse,
            tile_variant,
        ),
    })?;
    let o = download(&out)?;
    let err = sampled_error(p, q, k, v, &o);
    if err > 2e-2 {
        return Err(kernels::Error::invalid(
            "attention result",
            format!("{p:?}: max error {err:.3e} on sampled rows exceeds 2e-2"),
        ));
    }
    let mut cfg = config!(
        "batch": p.batch, "seq": p.seq_q, "heads": p.heads_q, "d": p.head_dim,
        "causal": p.causal, "dtype": "bf16"
    );
    if p.has_value_dim() {
        cfg.insert("dv".into(), serde_json::json!(p.v_dim()));
    }
    let mut row = Row::ours("attention_fwd", cfg.clone(), &t)
        .flops(p.flops())
        .err(err);
    if let Some(v) = variant {
        row.implementation = format!("ours-{v}");
        b.push(row);
        return Ok(());
    }
    b.push(row);
    b.case(
        "attention_fwd",
        &cfg,
        config!("flops": p.flops()),
        &[(
            "ours",
            // The output buffer holds `ELEMS`; H x D is below 2048 where D does not divide it.
            Tensor::Bf16(
                &o[..p.o_shape().iter().product::<usize>()],
                p.o_shape().to_vec(),
            ),
        )],
    )
}

/// The largest difference of O (`o`, contiguous) from the f64 reference over 24 rows spread over
/// batch, sequence and heads (NaN counts as infinite).
pub(crate) fn sampled_error(
    p: &AttentionProblem,
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
    o: &[bf16],
) -> f64 {
    let rows: Vec<(usize, usize, usize)> = (0..24)
        .map(|i| {
            (
                (i * 7) % p.batch,
                (i * 104_729 + i * i * 31) % p.seq_q,
                (i * 5) % p.heads_q,
            )
        })
        .collect();
    let want = attention::reference_rows(p, q, k, v, &rows);
    let mut err = 0.0f64;
    for ((bi, i, h), (ref_o, _)) in rows.iter().zip(&want) {
        let dv = p.v_dim();
        let start = ((bi * p.seq_q + i) * p.heads_q + h) * dv;
        for (x, y) in o[start..start + dv].iter().zip(ref_o) {
            let e = (x.to_f64() - y).abs();
            err = if e.is_nan() {
                f64::INFINITY
            } else {
                err.max(e)
            };
        }
    }
    err
}
