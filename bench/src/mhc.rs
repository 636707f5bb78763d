//! Family `mhc`: the mHC forward and backward at B = 4, S = 4096, n = 4, C = 4096 (x is 512 MB),
//! beside PyTorch eager and `torch.compile` of the same equations on the same inputs
//! (`bench/peers/mhc.py`), with the measured device copy bandwidth in the same run.
//!
//! Bytes are the least each pass must move (bf16 activations; the f32 weights and coefficients
//! are below 0.1% and not counted), per token:
//! - forward: `x` read for `x_in`, read again for `x_next` (which needs `y`, the layer applied to
//!   `x_in`), `y` read, `x_in` and `x_next` written: `2 (3 n C + 2 C)`;
//! - backward: `x`, `y`, `d_xin`, `d_xnext` read, `dx`, `dy` written: `2 (3 n C + 3 C)`.
//!
//! The copy row moves `2 |x|` (read and write). Rows carry `pct_of_copy` (achieved GB/s over
//! the copy's).

use crate::config;
use crate::harness::{Bench, Row, Tensor};
use kernels::memory::{copy_async, zeroed};
use kernels::mhc::MhcProblem;
use kernels::mhc::reference::MhcData;
use kernels::{Error, Result};
use kernels_testing::mhc::MhcDeviceRun;
use serde_json::json;

/// The benchmark shape (and a small one for `--quick`).
pub fn problem(quick: bool) -> MhcProblem {
    if quick {
        MhcProblem::new(1, 1024, 4, 1024)
    } else {
        MhcProblem::new(4, 4096, 4, 4096)
    }
}

/// Run the family.
pub fn run(b: &mut Bench) -> Result<()> {
    let p = problem(b.quick);
    let (bsz, s, n, c) = (p.batch, p.seq, p.n, p.c);
    let (t, k, m) = (p.tokens(), p.k(), p.m());
    eprintln!("kbench mhc: generating inputs (T = {t}, n C = {k})");
    let data = MhcData::random(&p, 42);
    let mut run = MhcDeviceRun::upload(&data)?;

    // Copy bandwidth on the same device, in the same run.
    let mut copy = zeroed(run.x.len())?;
    let tc = b.time(|| copy_async(&b.stream, &mut copy, &run.x))?;
    drop(copy);
    let copy_bytes = 2.0 * run.x.len() as f64 * 2.0;
    let copy_row = Row::ours("memcpy_dtod", config!("bytes": copy_bytes), &tc).bytes(copy_bytes);
    let copy_gbps = copy_row.gbps.unwrap_or(f64::NAN);
    b.push(copy_row);

    // One validated run (sampled tokens against the f64 reference; the GPU tests check every
    // output, and the peers' rows record their difference from every output of ours).
    run.forward(&b.gpu, &b.stream)?;
    run.backward(&b.gpu, &b.stream)?;
    b.gpu.sync(&b.stream, "mhc forward and backward")?;
    let out = run.download()?;
    let tokens = kernels_testing::mhc::sample_tokens(&p, 64);
    let cmp = kernels_testing::mhc::compare(&data, &out, Some(&tokens));
    if !cmp.ok() {
        return Err(Error::invalid(
            "mHC result",
            format!(
                "out of tolerance on sampled tokens: {}",
                cmp.failures().join("; ")
            ),
        ));
    }
    let err = |names: &[&str]| names.iter().map(|n| cmp.get(n).max_err).fold(0.0, f64::max);
    let fwd_err = err(&["x_in", "x_next"]);
    let bwd_err = err(&["dx", "dy"]);

    let cfg =
        config!("B": bsz, "S": s, "n": n, "C": c, "t_max": p.sinkhorn_iters, "gamma": p.gamma);
    let (fwd_bytes, bwd_bytes) = (p.forward_bytes(), p.backward_bytes());
    let pre_bytes = 2.0 * (k + c) as f64 * t as f64;
    let post_bytes = 2.0 * (2 * k + c) as f64 * t as f64;
    let push =
        |b: &mut Bench, kernel: &str, ms: &kernels::timing::Timings, bytes: f64, err: f64| {
            let mut row = Row::ours(kernel, cfg.clone(), ms).bytes(bytes).err(err);
            let pct = 100.0 * row.gbps.unwrap_or(0.0) / copy_gbps;
            row.extra
                .insert("pct_of_copy".into(), json!((pct * 10.0).round() / 10.0));
            b.push(row);
        };
    let tp = b.time(|| run.forward_pre(&b.gpu, &b.stream))?;
    push(
        b,
        "mhc_fwd_pre",
        &tp,
        pre_bytes,
        err(&["x_in", "h_pre", "h_post", "h_res"]),
    );
    let tq = b.time(|| run.forward_post(&b.gpu, &b.stream))?;
    push(b, "mhc_fwd_post", &tq, post_bytes, err(&["x_next"]));
    let tf = b.time(|| run.forward(&b.gpu, &b.stream))?;
    push(b, "mhc_fwd", &tf, fwd_bytes, fwd_err);
    let tb = b.time(|| run.backward(&b.gpu, &b.stream))?;
    push(b, "mhc_bwd", &tb, bwd_bytes, bwd_err);
    let ta = b.time(|| {
        run.forward(&b.gpu, &b.stream)?;
        run.backward(&b.gpu, &b.stream)
    })?;
    push(
        b,
        "mhc_fwd_bwd",
        &ta,
        fwd_bytes + bwd_bytes,
        fwd_err.max(bwd_err),
    );
    // Tuning variants of the projection's pipeline (same inputs; validated like the default).
    for variant in kernel_abi::mhc::PROJ_VARIANTS {
        let name = variant.name;
        if variant.n as usize != n {
            continue;
        }
        run.problem.proj_variant = Some(name);
        run.workspace = kernels::mhc::MhcWorkspace::new(&run.problem)?;
        run.forward(&b.gpu, &b.stream)?;
        b.gpu.sync(&b.stream, "mhc forward (variant)")?;
        let vout = run.download()?;
        let vcmp = kernels_testing::mhc::compare(&data, &vout, Some(&tokens));
        if !vcmp.ok() {
            return Err(Error::invalid(
                "mHC result (projection variant)",
                format!("{name}: {}", vcmp.failures().join("; ")),
            ));
        }
        let verr = ["x_in", "x_next"]
            .iter()
            .map(|n| vcmp.get(n).max_err)
            .fold(0.0, f64::max);
        for (kernel, pre) in [("mhc_fwd_pre", true), ("mhc_fwd", false)] {
            let t = b.time(|| {
                run.forward_pre(&b.gpu, &b.stream)?;
                if !pre {
                    run.forward_post(&b.gpu, &b.stream)?;
                }
                Ok(())
            })?;
            let bytes = if pre { pre_bytes } else { fwd_bytes };
            let mut row = Row::ours(kernel, cfg.clone(), &t).bytes(bytes).err(verr);
            row.implementation = format!("ours-{name}");
            let pct = 100.0 * row.gbps.unwrap_or(0.0) / copy_gbps;
            row.extra
                .insert("pct_of_copy".into(), json!((pct * 10.0).round() / 10.0));
            b.push(row);
        }
    }
    run.problem.proj_variant = None;
    b.note(format!(
        "bytes per pass (bf16 activations, least each must move): forward {:.3} GB, backward {:.3} GB; \
         copy bandwidth measured as 2 |x| / time of a {:.0} MB device copy",
        fwd_bytes / 1e9,
        bwd_bytes / 1e9,
        run.x.len() as f64 * 2.0 / 1e6
    ));

    // The peers compute on the same inputs and compare with every output of ours.
    let act = vec![bsz, s, n, c];
    let tok = vec![bsz, s, c];
    let mut tensors = vec![
        ("x", Tensor::Bf16(&data.x, act.clone())),
        ("y", Tensor::Bf16(&data.y, tok.clone())),
        ("phi", Tensor::F32(&data.phi, vec![k, m])),
        ("alpha", Tensor::F32(&data.alpha, vec![3])),
        ("bias", Tensor::F32(&data.bias, vec![m])),
        ("d_xin", Tensor::Bf16(&data.d_xin, tok.clone())),
        ("d_xnext", Tensor::Bf16(&data.d_xnext, act.clone())),
        ("ours_x_in", Tensor::Bf16(&out.x_in, tok.clone())),
        ("ours_x_next", Tensor::Bf16(&out.x_next, act.clone())),
        ("ours_dx", Tensor::Bf16(&out.dx, act.clone())),
        ("ours_dy", Tensor::Bf16(&out.dy, tok)),
        ("ours_dphi", Tensor::F32(&out.dphi, vec![k, m])),
        ("ours_dalpha", Tensor::F32(&out.dalpha, vec![3])),
        ("ours_dbias", Tensor::F32(&out.dbias, vec![m])),
    ];
    if let (Some(g), Some(dg)) = (&data.gamma, &out.dgamma) {
        tensors.push(("gamma", Tensor::F32(g, vec![k])));
        tensors.push(("ours_dgamma", Tensor::F32(dg, vec![k])));
    }
    let counts = config!(
        "fwd_bytes": fwd_bytes,
        "bwd_bytes": bwd_bytes,
        "copy_gbps": copy_gbps,
        "eps": p.eps,
        "projection_flops": p.projection_flops()
    );
    drop(run);
    b.case("mhc", &cfg, counts, &tensors)?;
    b.run_peers();
    Ok(())
}
