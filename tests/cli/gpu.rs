//! The CLI on a GPU: every subcommand with --check, within bounds loose enough for any correct
//! kernel and far below what a layout or plumbing mistake gives.

use super::*;

pub(super) fn check_run(
    gpu: &'static Gpu,
    d: &Dir,
    args: &[String],
    bounds: &[(&str, f64)],
) -> Result<Report, TestFailure> {
    let report = cli_on(args, Some(gpu)).map_err(|e| format!("kernels-cli {}: {e}", line(args)))?;
    print!("{report}");
    for (name, bound) in bounds {
        let diff = report
            .diffs
            .iter()
            .find(|x| x.name == *name)
            .ok_or_else(|| format!("no --check row for {name}"))?;
        ensure(diff.nonfinite == 0 && diff.rel_l2 <= *bound, || {
            format!(
                "{name}: rel L2 {:.3e} (bound {bound:e}), {} non-finite",
                diff.rel_l2, diff.nonfinite
            )
        })?;
    }
    let out = read_outputs(&d.path("out.safetensors"))?;
    ensure(out.values().all(|o| o.dtype != Dtype::F64), || {
        "the GPU path wrote f64 outputs".into()
    })?;
    Ok(report)
}

pub(super) fn gpu_attention(gpu: &'static Gpu) -> TestResult {
    let d = Dir::new("gpu_attention");
    let p = AttentionProblem::new(2, 70, 90, 4, 2, 128, AttnDtype::Bf16).causal();
    let (q, k, v) = attention_inputs_bf16(&p, 51);
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", p.q_shape().to_vec(), V::Bf16(q)),
            ("k", p.kv_shape().to_vec(), V::Bf16(k)),
            ("v", p.kv_shape().to_vec(), V::Bf16(v)),
        ],
    )?;
    let args =
        d.command("attention @in.safetensors -o @out.safetensors --check --causal --repeat 2");
    let report = check_run(gpu, &d, &args, &[("o", 1e-2), ("lse", 1e-4)])?;
    ensure(
        report
            .timings
            .as_ref()
            .is_some_and(|t| t.samples_ms.len() == 2),
        || "--repeat 2 did not give 2 timed runs".into(),
    )
}

/// `attention --check` on e4m3 inputs with descales (the FP8 forward): `--check` holds O to the
/// FP8 rule (the job's tolerance), and the relative L2 error stays below FP8's few percent.
pub(super) fn gpu_attention_fp8(gpu: &'static Gpu) -> TestResult {
    let d = Dir::new("gpu_attention_fp8");
    let p = AttentionProblem::new(2, 70, 150, 4, 2, 128, AttnDtype::Bf16).causal();
    let mut r = kernels::data::rng(57);
    let mut e4m3 = |n: usize| -> Vec<u8> {
        kernels::data::uniform_f32(&mut r, n, -448.0, 448.0)
            .into_iter()
            .map(|x| kernels::attention::E4m3::from_f32(x).0)
            .collect()
    };
    let (qn, kn) = (p.q_shape().iter().product(), p.kv_shape().iter().product());
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", p.q_shape().to_vec(), V::E4m3(e4m3(qn))),
            ("k", p.kv_shape().to_vec(), V::E4m3(e4m3(kn))),
            ("v", p.kv_shape().to_vec(), V::E4m3(e4m3(kn))),
            ("q_descale", vec![1], V::F32(vec![1.0 / 448.0])),
            ("k_descale", vec![1], V::F32(vec![1.0 / 448.0])),
            ("v_descale", vec![1], V::F32(vec![0.01])),
        ],
    )?;
    let args = d.command("attention @in.safetensors -o @out.safetensors --check --causal");
    check_run(gpu, &d, &args, &[("o", 5e-2), ("lse", 1e-4)])?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    ensure(out.get("o").is_some_and(|o| o.dtype == Dtype::BF16), || {
        "the FP8 forward's o is not bf16".into()
    })
}

/// `attention --check` with a softcap and sinks: dense (the Hopper path on Hopper GPUs, then
/// the mma.sync path) and packed.
pub(super) fn gpu_attention_capsink(gpu: &'static Gpu) -> TestResult {
    let d = Dir::new("gpu_attention_capsink");
    let p = AttentionProblem::new(2, 70, 90, 4, 2, 128, AttnDtype::Bf16);
    let (q, k, v) = attention_inputs_bf16(&p, 54);
    let sinks = V::F32(vec![-1.0, 0.5, 2.0, 6.0]);
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", p.q_shape().to_vec(), V::Bf16(q)),
            ("k", p.kv_shape().to_vec(), V::Bf16(k)),
            ("v", p.kv_shape().to_vec(), V::Bf16(v)),
            ("sinks", vec![4], sinks.clone()),
        ],
    )?;
    for path in ["auto", "mma-sync"] {
        let args = d.command(&format!(
            "attention @in.safetensors -o @out.safetensors --check --causal --softcap 0.5 \
             --path {path}"
        ));
        check_run(gpu, &d, &args, &[("o", 1e-2), ("lse", 1e-4)])?;
    }
    let lens = [(70, 90), (0, 5), (9, 0), (130, 40)];
    let seqlens = kernels::attention::CuSeqlens::from_lens(&lens).map_err(|e| e.to_string())?;
    let (tq, tk) = (seqlens.total_q(), seqlens.total_k());
    let mut r = rng(55);
    write_inputs(
        &d.path("packed.safetensors"),
        &[
            (
                "q",
                vec![1, tq, 4, 64],
                V::Bf16(uniform_bf16(&mut r, tq * 256, -1.0, 1.0)),
            ),
            (
                "k",
                vec![1, tk, 2, 64],
                V::Bf16(uniform_bf16(&mut r, tk * 128, -1.0, 1.0)),
            ),
            (
                "v",
                vec![1, tk, 2, 64],
                V::Bf16(uniform_bf16(&mut r, tk * 128, -1.0, 1.0)),
            ),
            ("cu_seqlens_q", vec![5], V::I32(seqlens.q().to_vec())),
            ("cu_seqlens_k", vec![5], V::I32(seqlens.k().to_vec())),
            ("sinks", vec![4], sinks),
        ],
    )?;
    let args =
        d.command("attention @packed.safetensors -o @out.safetensors --check --causal --softcap 2");
    check_run(gpu, &d, &args, &[("o", 1e-2), ("lse", 1e-4)]).map(|_| ())
}

/// `attention --check` on packed sequences (`cu_seqlens_q`, `cu_seqlens_k`).
pub(super) fn gpu_attention_varlen(gpu: &'static Gpu) -> TestResult {
    use kernels::attention::CuSeqlens;
    let d = Dir::new("gpu_attention_varlen");
    let lens = [(70, 90), (0, 5), (1, 1), (130, 40), (9, 0)];
    let seqlens = CuSeqlens::from_lens(&lens).map_err(|e| e.to_string())?;
    let (tq, tk) = (seqlens.total_q(), seqlens.total_k());
    let mut r = rng(52);
    write_inputs(
        &d.path("in.safetensors"),
        &[
            (
                "q",
                vec![1, tq, 4, 128],
                V::Bf16(uniform_bf16(&mut r, tq * 4 * 128, -1.0, 1.0)),
            ),
            (
                "k",
                vec![1, tk, 2, 128],
                V::Bf16(uniform_bf16(&mut r, tk * 2 * 128, -1.0, 1.0)),
            ),
            (
                "v",
                vec![1, tk, 2, 128],
                V::Bf16(uniform_bf16(&mut r, tk * 2 * 128, -1.0, 1.0)),
            ),
            (
                "cu_seqlens_q",
                vec![lens.len() + 1],
                V::I32(seqlens.q().to_vec()),
            ),
            (
                "cu_seqlens_k",
                vec![lens.len() + 1],
                V::I32(seqlens.k().to_vec()),
            ),
        ],
    )?;
    let args =
        d.command("attention @in.safetensors -o @out.safetensors --check --causal --repeat 2");
    check_run(gpu, &d, &args, &[("o", 1e-2), ("lse", 1e-4)]).map(|_| ())
}

/// `attention-backward --check` (the tests' tolerance rule: the run fails past it) with dLSE,
/// atomic dQ with `--repeat 2`, then `--deterministic`; then with a softcap and sinks, in
/// both modes; on a Hopper GPU V, O and dO of 128 beside Q and K of 192, in both modes.
pub(super) fn gpu_attention_backward(gpu: &'static Gpu) -> TestResult {
    let d = Dir::new("gpu_attention_backward");
    let p = AttentionProblem::new(2, 70, 90, 4, 2, 128, AttnDtype::Bf16).causal();
    let (files, _, _) = attention_backward_inputs(&p, 53, None);
    write_inputs(&d.path("in.safetensors"), &files)?;
    let bounds = [("dq", 1e-2), ("dk", 1e-2), ("dv", 1e-2)];
    let args = d.command(
        "attention-backward @in.safetensors -o @out.safetensors --check --causal --repeat 2",
    );
    let report = check_run(gpu, &d, &args, &bounds)?;
    ensure(
        report
            .timings
            .as_ref()
            .is_some_and(|t| t.samples_ms.len() == 2),
        || "--repeat 2 did not give 2 timed runs".into(),
    )?;
    let args = d.command(
        "attention-backward @in.safetensors -o @out.safetensors --check --causal --deterministic",
    );
    check_run(gpu, &d, &args, &bounds)?;
    // A softcap and sinks: their gradient `dsinks` checked too.
    let p = p.softcap(10.0).with_sinks();
    let sinks = [0.5f32, -1.0, 2.0, 0.0];
    let (files, _, _) = attention_backward_inputs(&p, 54, Some(&sinks));
    write_inputs(&d.path("in.safetensors"), &files)?;
    let bounds = [("dq", 1e-2), ("dk", 1e-2), ("dv", 1e-2), ("dsinks", 1e-1)];
    for mode in ["", " --deterministic"] {
        let args = d.command(&format!(
            "attention-backward @in.safetensors -o @out.safetensors --check --causal \
             --softcap 10{mode}"
        ));
        check_run(gpu, &d, &args, &bounds)?;
    }
    // V, O and dO of head dimension 128 beside Q and K of 192 (the Hopper kernels), both modes.
    if gpu.arch().has_hopper_kernels() {
        let p = AttentionProblem::new(2, 70, 90, 4, 2, 192, AttnDtype::Bf16)
            .value_dim(128)
            .causal();
        let (files, _, _) = attention_backward_inputs(&p, 55, None);
        write_inputs(&d.path("in.safetensors"), &files)?;
        let bounds = [("dq", 1e-2), ("dk", 1e-2), ("dv", 1e-2)];
        for mode in ["", " --deterministic"] {
            let args = d.command(&format!(
                "attention-backward @in.safetensors -o @out.safetensors --check --causal{mode}"
            ));
            check_run(gpu, &d, &args, &bounds)?;
        }
    }
    Ok(())
}

/// `attention-decode --check` (the attention tests' tolerance rule: the run fails past it):
/// bf16, 4 new tokens, GQA 8:2, D 128, pages of 64 out of order with one shared, an empty
/// context, causal, the heuristic's splits with `--repeat 2`; then f16 with `--num-splits 1`
/// (no combine) and `--num-splits 7`; then a softcap and sinks with one split and seven.
pub(super) fn gpu_attention_decode(gpu: &'static Gpu) -> TestResult {
    let d = Dir::new("gpu_attention_decode");
    let lens = [700i32, 0, 1000];
    let (page, num_pages, max_pages) = (64, 30, 16);
    // Pages in the order (7 t + 3) mod 30 (7 is prime to 30: no page twice); sequence 2's first
    // page is sequence 0's (shared); entries past a context -1.
    let mut next = (0..num_pages).map(|t| ((7 * t + 3) % num_pages) as i32);
    let mut table = vec![-1i32; lens.len() * max_pages];
    for (b, &len) in lens.iter().enumerate() {
        for t in 0..(len as usize).div_ceil(page) {
            table[b * max_pages + t] = next.next().ok_or("not enough pages")?;
        }
    }
    table[2 * max_pages] = table[0];
    let sink_runs = [
        "--softcap 2 --num-splits 1",
        "--softcap 2 --num-splits 7 --causal",
    ];
    for (dtype, seed, runs, sinks) in [
        (AttnDtype::Bf16, 54, &["--causal --repeat 2"][..], false),
        (
            AttnDtype::F16,
            55,
            &["--num-splits 1", "--num-splits 7"][..],
            false,
        ),
        // Softcap and sinks: the sinks join in the decode kernel, then in the combine kernel.
        (AttnDtype::Bf16, 56, &sink_runs[..], true),
    ] {
        let mut p =
            AttentionDecodeProblem::new(lens.len(), 4, 8, 2, 128, page, num_pages, max_pages);
        p.dtype = dtype;
        let mut tensors =
            decode_tensors(&p, decode_inputs(&p, seed), &table, V::I32(lens.to_vec()));
        if sinks {
            let values = (0..8).map(|h| h as f32 * 0.5 - 1.0).collect();
            tensors.push(("sinks", vec![8], V::F32(values)));
        }
        write_inputs(&d.path("in.safetensors"), &tensors)?;
        for extra in runs {
            let args = d.command(&format!(
                "attention-decode @in.safetensors -o @out.safetensors --check {extra}"
            ));
            let report = check_run(gpu, &d, &args, &[("o", 1e-2), ("lse", 1e-4)])?;
            let text = report.to_string();
            ensure(
                text.contains("o: max abs") && text.contains("lse: max abs"),
                || format!("no tolerance lines in the report: {text}"),
            )?;
            if extra.contains("--repeat 2") {
                ensure(
                    report
                        .timings
                        .as_ref()
                        .is_some_and(|t| t.samples_ms.len() == 2),
                    || "--repeat 2 did not give 2 timed runs".into(),
                )?;
                ensure(text.contains("median"), || {
                    format!("no median in the report: {text}")
                })?;
            }
        }
    }
    Ok(())
}

pub(super) fn gpu_gla(gpu: &'static Gpu) -> TestResult {
    gpu_gla_with(gpu, "gpu_gla", "")
}

/// `--kernel baseline` and `--kernel pingpong` on the same inputs (a Hopper GPU runs both).
pub(super) fn gpu_gla_kernels(gpu: &'static Gpu) -> TestResult {
    gpu_gla_with(gpu, "gpu_gla_baseline", " --kernel baseline")?;
    gpu_gla_with(gpu, "gpu_gla_pingpong", " --kernel pingpong")
}

/// `gla --check` (with `extra` options) on packed sequences with initial states.
pub(super) fn gpu_gla_with(gpu: &'static Gpu, dir: &str, extra: &str) -> TestResult {
    let d = Dir::new(dir);
    let cu = vec![0usize, 40, 100];
    let p = GlaProblem::varlen(cu.clone(), 2, 64, 64);
    let mut r = rng(52);
    let qk = vec![1, 100, 2, 64];
    write_inputs(
        &d.path("in.safetensors"),
        &[
            (
                "q",
                qk.clone(),
                V::Bf16(uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0)),
            ),
            (
                "k",
                qk.clone(),
                V::Bf16(uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0)),
            ),
            (
                "g",
                qk.clone(),
                V::Bf16(uniform_bf16(&mut r, p.qk_len(), -0.5, 0.0)),
            ),
            ("v", qk, V::Bf16(uniform_bf16(&mut r, p.v_len(), -1.0, 1.0))),
            (
                "initial_state",
                vec![2, 2, 64, 64],
                V::F32(uniform_f32(&mut r, p.state_len(), -1.0, 1.0)),
            ),
            (
                "cu_seqlens",
                vec![3],
                V::I64(cu.iter().map(|&x| x as i64).collect()),
            ),
        ],
    )?;
    check_run(
        gpu,
        &d,
        &d.command(&format!(
            "gla @in.safetensors -o @out.safetensors --check{extra}"
        )),
        &[("o", 2e-2), ("final_state", 1e-2)],
    )
    .map(|_| ())
}

/// `gla-backward --check` on packed sequences with initial states and a final-state gradient:
/// every gradient within the GLA tests' bound (rel L2 1e-2).
pub(super) fn gpu_gla_backward(gpu: &'static Gpu) -> TestResult {
    let d = Dir::new("gpu_gla_backward");
    let cu = vec![0usize, 40, 100];
    let p = GlaProblem::varlen(cu.clone(), 2, 64, 128);
    let mut r = rng(54);
    let (qk, vs, st) = (
        vec![1, 100, 2, 64],
        vec![1, 100, 2, 128],
        vec![2, 2, 64, 128],
    );
    let mut bf = |n: usize, lo: f32, hi: f32| V::Bf16(uniform_bf16(&mut r, n, lo, hi));
    let (q, k, g) = (
        bf(p.qk_len(), -1.0, 1.0),
        bf(p.qk_len(), -1.0, 1.0),
        bf(p.qk_len(), -0.5, 0.0),
    );
    let (v, d_o) = (bf(p.v_len(), -1.0, 1.0), bf(p.v_len(), -1.0, 1.0));
    let mut r = rng(55);
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", qk.clone(), q),
            ("k", qk.clone(), k),
            ("g", qk, g),
            ("v", vs.clone(), v),
            ("d_o", vs, d_o),
            (
                "initial_state",
                st.clone(),
                V::F32(uniform_f32(&mut r, p.state_len(), -1.0, 1.0)),
            ),
            (
                "d_final_state",
                st,
                V::F32(uniform_f32(&mut r, p.state_len(), -1.0, 1.0)),
            ),
            (
                "cu_seqlens",
                vec![3],
                V::I64(cu.iter().map(|&x| x as i64).collect()),
            ),
        ],
    )?;
    check_run(
        gpu,
        &d,
        &d.command("gla-backward @in.safetensors -o @out.safetensors --check"),
        &[
            ("d_q", 1e-2),
            ("d_k", 1e-2),
            ("d_v", 1e-2),
            ("d_g", 1e-2),
            ("d_initial_state", 1e-2),
        ],
    )
    .map(|_| ())
}

pub(super) fn gpu_semicrf(gpu: &'static Gpu) -> TestResult {
    let d = Dir::new("gpu_semicrf");
    let p = SemiCrfProblem::new(3, 40, 5, 4);
    let inp = kernels_testing::semicrf::random_inputs(&p, 53, true);
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("cumsum", vec![3, 41, 4], V::F32(inp.cumsum)),
            ("dur", vec![5, 4], V::F32(inp.dur)),
            ("trans", vec![4, 4], V::F32(inp.trans)),
            (
                "lengths",
                vec![3],
                V::I64(inp.lengths.iter().map(|&l| l as i64).collect()),
            ),
        ],
    )?;
    check_run(
        gpu,
        &d,
        &d.command("semicrf @in.safetensors -o @out.safetensors --check --viterbi"),
        &[
            ("log_z", 1e-6),
            ("viterbi_score", 1e-5),
            ("viterbi_count", 0.0),
            ("viterbi_start", 0.0),
            ("viterbi_dur", 0.0),
            ("viterbi_label", 0.0),
        ],
    )?;
    check_run(
        gpu,
        &d,
        &d.command("semicrf-backward @in.safetensors -o @out.safetensors --check --marginals"),
        &[
            ("log_z", 1e-6),
            ("grad_cumsum", 1e-4),
            ("grad_dur", 1e-4),
            ("grad_trans", 1e-4),
            ("marginals", 1e-4),
        ],
    )
    .map(|_| ())
}

pub(super) fn gpu_mhc(gpu: &'static Gpu) -> TestResult {
    let d = Dir::new("gpu_mhc");
    let p = MhcProblem::new(2, 64, 4, 64).with_gamma(true);
    let data = MhcData::random(&p, 54);
    write_inputs(&d.path("in.safetensors"), &mhc_tensors(&data, true, true))?;
    check_run(
        gpu,
        &d,
        &d.command("mhc @in.safetensors -o @out.safetensors --check"),
        &[
            ("x_in", 1e-2),
            ("x_next", 1e-2),
            ("h_pre", 1e-3),
            ("h_post", 1e-3),
            ("h_res", 1e-3),
            ("hproj", 1e-3),
            ("rms", 1e-4),
        ],
    )?;
    check_run(
        gpu,
        &d,
        &d.command("mhc-backward @in.safetensors -o @out.safetensors --check"),
        &[
            ("dx", 2e-2),
            ("dy", 2e-2),
            ("dphi", 1e-2),
            ("dgamma", 1e-2),
            ("dalpha", 1e-2),
            ("dbias", 1e-2),
        ],
    )
    .map(|_| ())
}
