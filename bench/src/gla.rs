//! Family `gla`: the chunkwise GLA forward on the benchmark configurations, beside
//! flash-linear-attention's `chunk_gla` (fla-core 0.6.0, Triton) and a PyTorch chunked reference
//! on the same inputs (`bench/peers/gla.py`).
//!
//! Configurations: B = 4, H = 32, Dk = Dv = 64 at T = 1024, 2048, 4096, and
//! Dk = Dv = 128, H = 16 at T = 2048 (B = 8), T = 8192 (B = 2) and T = 16384 (B = 1); every one
//! holds at most `B T H D` = 2^25 elements per tensor, so one set of inputs serves them all (each
//! configuration takes prefixes). Log-decays are
//! `g = log(sigmoid(x))`, `x` uniform in `[-3, 3)` (fla's tests use `logsigmoid(randn)`), no
//! initial state, no final state (fla's defaults).
//!
//! Rows: `ours` (the library's automatic choice: kernels for the GPU, the pingpong on sm_90,
//! and segments for one wave of their blocks); the baseline forced, `ours-baseline` (automatic
//! segments), `ours-baseline-noseg` (one segment per sequence, no state pass),
//! `ours-baseline-split2x` (segments half as long as its automatic ones); on sm_90 the pingpong
//! forced, `ours-pingpong` (automatic segments), `ours-pingpong-noseg`,
//! `ours-pingpong-seg-base` (the baseline's automatic segment length). Each row records the
//! kernels that ran (`gla_kernel`; `kernel` is the operation, as in every row).
//! Work counts: FLOPs `4 B T H Dk Dv` (the recurrence's two rank-`Dk Dv` products per token and
//! head, the same for every implementation whatever its chunking), tokens/s `B T / time`, GB/s
//! over the minimum traffic (q, k, g, v read once, o written once, bf16).
//!
//! Training rows `gla_fwd_bwd` (`KBENCH_GLA_BWD=0` skips them): the forward and the backward
//! (every gradient) on the same configurations, beside fla's `chunk_gla` forward + backward
//! through autograd; FLOPs counted as 3 forwards; our gradients of one head checked against the
//! f64 backward.
//!
//! The automatic choice, checked beyond those six: on a Hopper GPU, rows `gla_fwd_choice` time
//! the baseline and the pingpong forced on small and uneven problems ([`CHOICE_CONFIGS`]: one
//! head, short sequences, Dk != Dv; no peers), to show where the choice stands when launch and
//! set-up costs dominate.
//!
//! Validation of our rows: the f64 recurrence on two (sequence, head) pairs per configuration,
//! relative L2 error of their outputs <= 1e-2.

use crate::config;
use crate::harness::{Bench, Row, Tensor};
use kernels::gla::reference::{self, ExactInputs, HostInputs, OutputGrads, rel_l2};
use kernels::gla::{
    GlaGradients, GlaInputs, GlaKernel, GlaOutputGrads, GlaOutputs, GlaProblem, GlaSession, Target,
};
use kernels::memory::{download, poisoned, upload};
use kernels::{Result, bf16};
use kernels_testing::gla::log_sigmoid_decays;

/// Elements of each input tensor (every configuration uses exactly this many).
const ELEMS: usize = 1 << 25;

/// The configurations `(B, T, H, D)` (Dk = Dv = D).
pub const CONFIGS: [(usize, usize, usize, usize); 6] = [
    (4, 1024, 32, 64),
    (4, 2048, 32, 64),
    (4, 4096, 32, 64),
    (8, 2048, 16, 128),
    (2, 8192, 16, 128),
    (1, 16384, 16, 128),
];

// Every configuration takes prefixes of the one set of inputs.
const _: () = {
    let mut i = 0;
    while i < CONFIGS.len() {
        let (b, t, h, d) = CONFIGS[i];
        assert!(b * t * h * d <= ELEMS);
        i += 1;
    }
};

/// Small and uneven configurations `(B, T, H, Dk, Dv)` of the `gla_fwd_choice` rows.
pub const CHOICE_CONFIGS: [(usize, usize, usize, usize, usize); 8] = [
    (1, 64, 1, 64, 64),
    (1, 100, 2, 128, 128),
    (1, 512, 4, 64, 128),
    (2, 1000, 8, 128, 64),
    (8, 128, 32, 64, 64),
    (1, 4096, 2, 128, 128),
    (16, 256, 16, 128, 128),
    (1, 32768, 4, 64, 64),
];

/// Run the family.
pub fn run(b: &mut Bench) -> Result<()> {
    let mut r = kernels::data::rng(2025);
    let draw = |r: &mut rand::rngs::StdRng| kernels::data::uniform_bf16(r, ELEMS, -1.0, 1.0);
    let (q, k, v) = (draw(&mut r), draw(&mut r), draw(&mut r));
    let g = log_sigmoid_decays(&mut r, ELEMS);
    let d_o = kernels::data::uniform_bf16(&mut r, ELEMS, -1.0, 1.0);
    // One write: the file is replaced, never appended to.
    b.shared(&[
        ("q", Tensor::Bf16(&q, vec![ELEMS])),
        ("k", Tensor::Bf16(&k, vec![ELEMS])),
        ("v", Tensor::Bf16(&v, vec![ELEMS])),
        ("g", Tensor::Bf16(&g, vec![ELEMS])),
        ("do", Tensor::Bf16(&d_o, vec![ELEMS])),
    ])?;
    let quick: &[(usize, usize, usize, usize)] = &[(4, 1024, 32, 64), (1, 16384, 16, 128)];
    let configs = if b.quick { quick } else { &CONFIGS };
    for &(batch, t, heads, d) in configs {
        let p = GlaProblem::new(batch, t, heads, d, d);
        p.validate()?;
        let host = HostInputs {
            q: &q[..p.qk_len()],
            k: &k[..p.qk_len()],
            v: &v[..p.v_len()],
            g: &g[..p.qk_len()],
            init_state: None,
        };
        // The baseline: its automatic split, no split, and twice as many segments as its
        // automatic choice (two waves of blocks instead of one), to see where the balance lies.
        let longest = p
            .clone()
            .with_kernel(GlaKernel::Baseline)
            .segments(Target::of(&b.gpu))?
            .segments
            .iter()
            .map(|s| s.len)
            .max()
            .unwrap_or(1) as usize;
        let half = (longest / 2).div_ceil(32).max(1) * 32;
        let mut o_auto = None;
        let mut variants = vec![
            (None, None, GlaKernel::Auto),
            (Some("baseline"), None, GlaKernel::Baseline),
            (
                Some("baseline-noseg"),
                Some(usize::MAX),
                GlaKernel::Baseline,
            ),
            (Some("baseline-split2x"), Some(half), GlaKernel::Baseline),
        ];
        if b.gpu.arch().has_hopper_kernels()
            && p.clone()
                .with_kernel(GlaKernel::Pingpong)
                .validate()
                .is_ok()
        {
            // The warp-specialized pingpong kernels: automatic split (for one block per SM
            // with two items each), no split, and the baseline's automatic split.
            let base_longest = longest.div_ceil(32) * 32;
            variants.extend([
                (Some("pingpong"), None, GlaKernel::Pingpong),
                (
                    Some("pingpong-noseg"),
                    Some(usize::MAX),
                    GlaKernel::Pingpong,
                ),
                (
                    Some("pingpong-seg-base"),
                    Some(base_longest),
                    GlaKernel::Pingpong,
                ),
            ]);
        }
        for (variant, segment, kernel) in variants {
            let mut pv = p.clone().with_kernel(kernel);
            pv.segment_len = segment;
            let o = one(b, &pv, &host, variant, "gla_fwd")?;
            if variant.is_none() {
                o_auto = Some(o);
            }
        }
        let o = o_auto.expect("the automatic variant ran");
        let cfg = config!("B": batch, "T": t, "H": heads, "dk": d, "dv": d, "dtype": "bf16");
        b.case(
            "gla_fwd",
            &cfg,
            config!("flops": p.flops(), "tokens": p.rows(), "bytes": p.min_bytes(false, false)),
            &[("ours", Tensor::Bf16(&o, vec![batch, t, heads, d]))],
        )?;
    }
    if std::env::var_os("KBENCH_GLA_BWD").is_none_or(|v| v != "0") {
        for &(batch, t, heads, d) in configs {
            let p = GlaProblem::new(batch, t, heads, d, d);
            let host = HostInputs {
                q: &q[..p.qk_len()],
                k: &k[..p.qk_len()],
                v: &v[..p.v_len()],
                g: &g[..p.qk_len()],
                init_state: None,
            };
            fwd_bwd(b, &p, &host, &d_o[..p.v_len()])?;
        }
    }
    if !b.quick && b.gpu.arch().has_hopper_kernels() {
        for (batch, t, heads, dk, dv) in CHOICE_CONFIGS {
            let p = GlaProblem::new(batch, t, heads, dk, dv);
            p.validate()?;
            let host = HostInputs {
                q: &q[..p.qk_len()],
                k: &k[..p.qk_len()],
                v: &v[..p.v_len()],
                g: &g[..p.qk_len()],
                init_state: None,
            };
            for (variant, kernel) in [
                ("baseline", GlaKernel::Baseline),
                ("pingpong", GlaKernel::Pingpong),
            ] {
                let pv = p.clone().with_kernel(kernel);
                one(b, &pv, &host, Some(variant), "gla_fwd_choice")?;
            }
        }
    }
    b.run_peers();
    Ok(())
}

/// The forward and backward of `p` as a training step runs them (the automatic forward, then
/// the session's backward: every gradient, its workspace kept across calls), timed together; the
/// gradients of the first (sequence, head) checked against the f64 backward (relative L2 of
/// dq, dk, dv and dg, each <= 1e-2); a `gla_fwd_bwd` row and a peer case with our gradients.
///
/// FLOPs: 3 forwards (`12 B T H Dk Dv`: the backward's state-gradient walk, dq, dk and dv
/// contractions count as two forwards, the convention of dense training), so TFLOP/s compare
/// across implementations of the same step.
fn fwd_bwd(b: &mut Bench, p: &GlaProblem, host: &HostInputs, d_o: &[bf16]) -> Result<()> {
    let (dq, dk, dv, dg, ddo) = (
        upload(host.q)?,
        upload(host.k)?,
        upload(host.v)?,
        upload(host.g)?,
        upload(d_o)?,
    );
    let mut o = poisoned::<bf16>(p.v_len())?;
    let mut grad_q = poisoned::<bf16>(p.qk_len())?;
    let mut grad_k = poisoned::<bf16>(p.qk_len())?;
    let mut grad_v = poisoned::<bf16>(p.v_len())?;
    let mut grad_g = poisoned::<f32>(p.qk_len())?;
    let mut grad_s0 = poisoned::<f32>(p.state_len())?;
    let mut session = GlaSession::new(&b.gpu, p)?;
    let inputs = GlaInputs {
        q: &dq,
        k: &dk,
        v: &dv,
        g: &dg,
        init_state: None,
    };
    let t = {
        let (gpu, stream) = (&b.gpu, &b.stream);
        b.time(|| {
            session.forward(
                gpu,
                stream,
                &inputs,
                &mut GlaOutputs {
                    o: &mut o,
                    final_state: None,
                },
            )?;
            session.backward(
                gpu,
                stream,
                &inputs,
                &GlaOutputGrads {
                    d_o: &ddo,
                    d_final_state: None,
                },
                &mut GlaGradients {
                    d_q: &mut grad_q,
                    d_k: &mut grad_k,
                    d_v: &mut grad_v,
                    d_g: &mut grad_g,
                    d_init_state: &mut grad_s0,
                },
            )
        })?
    };
    let got = (
        download(&grad_q)?,
        download(&grad_k)?,
        download(&grad_v)?,
        download(&grad_g)?,
    );
    // Sequence 0, head 0 against the f64 backward of that head alone.
    let (start, len) = p.sequences()[0];
    let one = GlaProblem::new(1, len, 1, p.dk, p.dv);
    let gather = |x: &[bf16], d: usize| -> Vec<f64> {
        (0..len)
            .flat_map(|i| {
                let at = (start + i) * p.heads * d;
                x[at..at + d].iter().map(|e| e.to_f64())
            })
            .collect()
    };
    let gather32 = |x: &[f32], d: usize| -> Vec<f64> {
        (0..len)
            .flat_map(|i| {
                let at = (start + i) * p.heads * d;
                x[at..at + d].iter().map(|&e| e as f64)
            })
            .collect()
    };
    let exact = ExactInputs {
        q: gather(host.q, p.dk),
        k: gather(host.k, p.dk),
        v: gather(host.v, p.dv),
        g: gather(host.g, p.dk),
        init_state: None,
    };
    let d_o64 = gather(d_o, p.dv);
    let want = reference::backward(
        &one,
        &exact,
        &OutputGrads {
            d_o: &d_o64,
            d_final_state: None,
        },
    )?;
    let errs = [
        ("dq", rel_l2(gather(&got.0, p.dk), &want.dq)),
        ("dk", rel_l2(gather(&got.1, p.dk), &want.dk)),
        ("dv", rel_l2(gather(&got.2, p.dv), &want.dv)),
        ("dg", rel_l2(gather32(&got.3, p.dk), &want.dg)),
    ];
    let err = errs.iter().map(|e| e.1).fold(0.0, f64::max);
    let valid = err <= 1e-2;
    if !valid {
        b.note(format!(
            "MISMATCH: gla_fwd_bwd ours on {p:?}: relative L2 errors {errs:?} (bound 1e-2)"
        ));
    }
    let cfg = config!(
        "B": p.batch, "T": p.seq_len, "H": p.heads, "dk": p.dk, "dv": p.dv, "dtype": "bf16"
    );
    let flops = 3.0 * p.flops();
    let mut row = Row::ours("gla_fwd_bwd", cfg.clone(), &t)
        .flops(flops)
        .err(err);
    row.extra.insert(
        "tokens_per_s".into(),
        serde_json::json!(p.rows() as f64 / (row.median_ms * 1e-3)),
    );
    for (name, e) in errs {
        row.extra
            .insert(format!("rel_l2_{name}"), serde_json::json!(e));
    }
    row.extra.insert(
        "gla_kernel".into(),
        serde_json::json!(format!("{:?}", session.kernel()).to_lowercase()),
    );
    row.extra.insert("valid".into(), serde_json::json!(valid));
    b.push(row);
    let (bt, h) = (p.batch * p.seq_len, p.heads);
    b.case(
        "gla_fwd_bwd",
        &cfg,
        config!("flops": flops, "tokens": p.rows(), "bytes": p.min_bytes(false, false)),
        &[
            (
                "ours_dq",
                Tensor::Bf16(&got.0, vec![p.batch, p.seq_len, h, p.dk]),
            ),
            (
                "ours_dk",
                Tensor::Bf16(&got.1, vec![p.batch, p.seq_len, h, p.dk]),
            ),
            (
                "ours_dv",
                Tensor::Bf16(&got.2, vec![p.batch, p.seq_len, h, p.dv]),
            ),
            (
                "ours_dg",
                Tensor::F32(&got.3, vec![bt / p.seq_len, p.seq_len, h, p.dk]),
            ),
        ],
    )?;
    Ok(())
}

/// Time one variant on `p`, validate it, push its row; returns its output.
fn one(
    b: &mut Bench,
    p: &GlaProblem,
    host: &HostInputs,
    variant: Option<&str>,
    kernel_name: &str,
) -> Result<Vec<bf16>> {
    // The configuration's inputs: prefixes of the shared tensors.
    let (dq, dk, dv, dg) = (
        upload(host.q)?,
        upload(host.k)?,
        upload(host.v)?,
        upload(host.g)?,
    );
    let mut o = poisoned::<bf16>(p.v_len())?;
    let mut session = GlaSession::new(&b.gpu, p)?;
    let segments = session.segments().segments.len();
    let inputs = GlaInputs {
        q: &dq,
        k: &dk,
        v: &dv,
        g: &dg,
        init_state: None,
    };
    let t = {
        let (gpu, stream) = (&b.gpu, &b.stream);
        b.time(|| {
            session.forward(
                gpu,
                stream,
                &inputs,
                &mut GlaOutputs {
                    o: &mut o,
                    final_state: None,
                },
            )
        })?
    };
    let out = download(&o)?;
    let mut err = 0.0f64;
    for (seq, head) in [(0usize, 0usize), (p.batch - 1, p.heads - 1)] {
        let (want, _) = reference::recurrence_head(p, host, seq, head)?;
        let (start, len) = p.sequences()[seq];
        let got = (0..len).flat_map(|i| {
            let at = ((start + i) * p.heads + head) * p.dv;
            out[at..at + p.dv].iter().map(|x| x.to_f64())
        });
        err = err.max(rel_l2(got, &want));
    }
    // A wrong result is recorded (row marked invalid, and a note), not fatal, so that the
    // other rows and the peers of the run are kept.
    let valid = err <= 1e-2;
    if !valid {
        b.note(format!(
            "MISMATCH: ours-{} on {p:?}: relative L2 error {err:.3e} on sampled heads exceeds 1e-2",
            variant.unwrap_or("auto")
        ));
    }
    let cfg = config!(
        "B": p.batch, "T": p.seq_len, "H": p.heads, "dk": p.dk, "dv": p.dv, "dtype": "bf16"
    );
    let mut row = Row::ours(kernel_name, cfg, &t)
        .flops(p.flops())
        .bytes(p.min_bytes(false, false))
        .err(err);
    row.extra.insert(
        "tokens_per_s".into(),
        serde_json::json!(p.rows() as f64 / (row.median_ms * 1e-3)),
    );
    row.extra
        .insert("segments".into(), serde_json::json!(segments));
    row.extra.insert(
        "gla_kernel".into(),
        serde_json::json!(format!("{:?}", session.kernel()).to_lowercase()),
    );
    row.extra.insert(
        "longest_segment".into(),
        serde_json::json!(session.segments().segments.iter().map(|s| s.len).max()),
    );
    row.extra
        .insert("rel_l2_err".into(), serde_json::json!(err));
    row.extra.insert("valid".into(), serde_json::json!(valid));
    if let Some(v) = variant {
        row.implementation = format!("ours-{v}");
    }
    b.push(row);
    Ok(out)
}
