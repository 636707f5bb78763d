//! `kernels-cli attention`, `attention-backward` and `attention-decode` in `--reference` mode
//! against the library's references called directly, and the inputs the GPU checks share.

use super::*;

pub(super) fn attention_inputs_bf16(
    p: &AttentionProblem,
    seed: u64,
) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
    let mut r = rng(seed);
    let nq: usize = p.q_shape().iter().product();
    let nk: usize = p.kv_shape().iter().product();
    let nv: usize = p.v_shape().iter().product();
    (
        uniform_bf16(&mut r, nq, -1.0, 1.0),
        uniform_bf16(&mut r, nk, -1.0, 1.0),
        uniform_bf16(&mut r, nv, -1.0, 1.0),
    )
}

pub(super) fn attention_bf16_causal() -> TestResult {
    let d = Dir::new("attention_bf16");
    // Sq > Sk under causal masking: the first Sq - Sk rows attend no key (O = 0, LSE = -inf).
    let p = AttentionProblem::new(2, 9, 6, 4, 2, 64, AttnDtype::Bf16).causal();
    let (q, k, v) = attention_inputs_bf16(&p, 11);
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", p.q_shape().to_vec(), V::Bf16(q.clone())),
            ("k", p.kv_shape().to_vec(), V::Bf16(k.clone())),
            ("v", p.kv_shape().to_vec(), V::Bf16(v.clone())),
        ],
    )?;
    let report =
        ok(&d.command("attention @in.safetensors -o @out.safetensors --reference --causal"))?;
    print!("{report}");
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = kernels::attention::reference(&p, &q, &k, &v);
    exact(&out, "o", Dtype::F64, &p.q_shape(), &want.o)?;
    exact(&out, "lse", Dtype::F64, &[2, 4, 9], &want.lse)?;
    ensure(out["lse"].values.contains(&f64::NEG_INFINITY), || {
        "expected rows with no allowed key (LSE = -inf)".into()
    })?;
    ensure(d.files() == ["in.safetensors", "out.safetensors"], || {
        format!("left in the directory: {:?}", d.files())
    })
}

/// Packed sequences (`cu_seqlens_q` i32, `cu_seqlens_k` i64): empty sequences, a sequence
/// without keys, causal per sequence, GQA; then the inputs' errors (one offset tensor alone,
/// offsets not ending at the rows, B > 1).
pub(super) fn attention_varlen() -> TestResult {
    use kernels::attention::{AttentionVarlenProblem, CuSeqlens};
    let d = Dir::new("attention_varlen");
    let lens = [(5, 3), (0, 4), (7, 7), (3, 0), (1, 10)];
    let seqlens = CuSeqlens::from_lens(&lens).map_err(|e| e.to_string())?;
    let p = AttentionVarlenProblem::new(&seqlens, 4, 2, 64, AttnDtype::Bf16).causal();
    let (tq, tk) = (p.total_q, p.total_k);
    let mut r = rng(13);
    let q = uniform_bf16(&mut r, tq * 4 * 64, -1.0, 1.0);
    let k = uniform_bf16(&mut r, tk * 2 * 64, -1.0, 1.0);
    let v = uniform_bf16(&mut r, tk * 2 * 64, -1.0, 1.0);
    let cu_k: Vec<i64> = seqlens.k().iter().map(|&x| x as i64).collect();
    let inputs = |cu_q: Option<Vec<i32>>, cu_k: Option<Vec<i64>>, b: usize| -> Vec<Named> {
        let mut t = vec![
            ("q", vec![b, tq / b, 4, 64], V::Bf16(q.clone())),
            ("k", vec![b, tk / b, 2, 64], V::Bf16(k.clone())),
            ("v", vec![b, tk / b, 2, 64], V::Bf16(v.clone())),
        ];
        if let Some(c) = cu_q {
            t.push(("cu_seqlens_q", vec![c.len()], V::I32(c)));
        }
        if let Some(c) = cu_k {
            t.push(("cu_seqlens_k", vec![c.len()], V::I64(c)));
        }
        t
    };
    write_inputs(
        &d.path("in.safetensors"),
        &inputs(Some(seqlens.q().to_vec()), Some(cu_k.clone()), 1),
    )?;
    let report =
        ok(&d.command("attention @in.safetensors -o @out.safetensors --reference --causal"))?;
    print!("{report}");
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = kernels::attention::reference_varlen(&p, &seqlens, &q, &k, &v);
    exact(&out, "o", Dtype::F64, &[1, tq, 4, 64], &want.o)?;
    exact(&out, "lse", Dtype::F64, &[4, tq], &want.lse)?;
    ensure(out["lse"].values.contains(&f64::NEG_INFINITY), || {
        "expected rows with no allowed key (LSE = -inf)".into()
    })?;
    let args = d.command("attention @bad.safetensors -o @out2.safetensors --reference");
    write_inputs(
        &d.path("bad.safetensors"),
        &inputs(Some(seqlens.q().to_vec()), None, 1),
    )?;
    fails(
        &d,
        &args,
        |e| matches!(e, CliError::MissingTensor { .. }),
        &["cu_seqlens_k"],
    )?;
    let mut short = seqlens.q().to_vec();
    *short.last_mut().expect("entries") -= 1;
    write_inputs(
        &d.path("bad.safetensors"),
        &inputs(Some(short), Some(cu_k.clone()), 1),
    )?;
    fails(
        &d,
        &args,
        |e| matches!(e, CliError::Value { .. }),
        &["cu_seqlens_q", "last offset"],
    )?;
    let mut decreasing = seqlens.q().to_vec();
    decreasing[2] = 0;
    decreasing[1] = 6;
    write_inputs(
        &d.path("bad.safetensors"),
        &inputs(Some(decreasing), Some(cu_k.clone()), 1),
    )?;
    fails(&d, &args, |_| true, &["cu_seqlens_q", "decreases"])?;
    // B = 2: q [2, 8, 4, 64].
    write_inputs(
        &d.path("bad.safetensors"),
        &inputs(Some(seqlens.q().to_vec()), Some(cu_k), 2),
    )?;
    fails(
        &d,
        &args,
        |e| matches!(e, CliError::Shape { .. }),
        &["B must be 1"],
    )
}

/// Backward inputs of `p` (bf16): Q, K, V, dO and dLSE uniform, O and LSE the f64 forward's
/// rounded (dLSE of rows with no allowed key is NaN: it must reach no gradient); with `sinks`
/// (a problem with sinks) the forward's with them, and the sinks among the files.
#[allow(clippy::type_complexity)]
pub(super) fn attention_backward_inputs(
    p: &AttentionProblem,
    seed: u64,
    sinks: Option<&[f32]>,
) -> (Vec<Named>, [Vec<bf16>; 4], Vec<f32>) {
    let (q, k, v) = attention_inputs_bf16(p, seed);
    let mut r = rng(seed ^ 0xd0);
    let d_o = uniform_bf16(&mut r, p.o_shape().iter().product(), -1.0, 1.0);
    let fwd = match sinks {
        Some(s) => kernels::attention::reference_with_sinks(p, &q, &k, &v, s),
        None => kernels::attention::reference(p, &q, &k, &v),
    };
    let o: Vec<bf16> = fwd.o.iter().map(|&x| bf16::from_f64(x)).collect();
    let lse: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
    let d_lse: Vec<f32> = uniform_f32(&mut r, lse.len(), -1.0, 1.0)
        .into_iter()
        .zip(&lse)
        .map(|(g, &l)| if l == f32::NEG_INFINITY { f32::NAN } else { g })
        .collect();
    let (qs, ks, ls) = (
        p.q_shape().to_vec(),
        p.kv_shape().to_vec(),
        vec![p.batch, p.heads_q, p.seq_q],
    );
    let (vs, os) = (p.v_shape().to_vec(), p.o_shape().to_vec());
    let mut files = vec![
        ("q", qs, V::Bf16(q.clone())),
        ("k", ks, V::Bf16(k.clone())),
        ("v", vs, V::Bf16(v.clone())),
        ("o", os.clone(), V::Bf16(o)),
        ("lse", ls.clone(), V::F32(lse)),
        ("do", os, V::Bf16(d_o.clone())),
        ("dlse", ls, V::F32(d_lse.clone())),
    ];
    if let Some(s) = sinks {
        files.push(("sinks", vec![s.len()], V::F32(s.to_vec())));
    }
    (files, [q, k, v, d_o], d_lse)
}

pub(super) fn attention_backward_reference() -> TestResult {
    let d = Dir::new("attention_backward");
    // Sq > Sk under causal masking: rows with no allowed key (their dLSE is NaN).
    let p = AttentionProblem::new(2, 9, 6, 4, 2, 64, AttnDtype::Bf16).causal();
    let (files, [q, k, v, d_o], d_lse) = attention_backward_inputs(&p, 12, None);
    write_inputs(&d.path("in.safetensors"), &files)?;
    let report = ok(
        &d.command("attention-backward @in.safetensors -o @out.safetensors --reference --causal")
    )?;
    print!("{report}");
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = kernels::attention::reference::backward(&p, &q, &k, &v, &d_o, Some(&d_lse));
    exact(&out, "dq", Dtype::F64, &p.q_shape(), &want.dq)?;
    exact(&out, "dk", Dtype::F64, &p.kv_shape(), &want.dk)?;
    exact(&out, "dv", Dtype::F64, &p.kv_shape(), &want.dv)?;
    ensure(want.dq.iter().all(|x| x.is_finite()), || {
        "the reference's dQ is not finite".into()
    })?;
    // V, O and dO of head dimension 128 beside Q and K of 192: dV of 128.
    let pair = AttentionProblem::new(1, 5, 7, 2, 1, 192, AttnDtype::Bf16)
        .value_dim(128)
        .causal();
    let (files, [q, k, v, d_o], d_lse) = attention_backward_inputs(&pair, 14, None);
    write_inputs(&d.path("in.safetensors"), &files)?;
    ok(&d.command("attention-backward @in.safetensors -o @out.safetensors --reference --causal"))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = kernels::attention::reference::backward(&pair, &q, &k, &v, &d_o, Some(&d_lse));
    exact(&out, "dq", Dtype::F64, &pair.q_shape(), &want.dq)?;
    exact(&out, "dk", Dtype::F64, &pair.kv_shape(), &want.dk)?;
    exact(&out, "dv", Dtype::F64, &pair.v_shape(), &want.dv)?;
    // A softcap and sinks: the reference's gradients through both, and the sinks'.
    let p = p.softcap(3.0).with_sinks();
    let sinks = [1.0f32, -0.5, 0.25, 2.0];
    let (files, [q, k, v, d_o], d_lse) = attention_backward_inputs(&p, 13, Some(&sinks));
    write_inputs(&d.path("in.safetensors"), &files)?;
    ok(&d.command(
        "attention-backward @in.safetensors -o @out.safetensors --reference --causal --softcap 3",
    ))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let (want, ds) = kernels::attention::reference::backward_sinks(
        &p,
        &q,
        &k,
        &v,
        &d_o,
        Some(&d_lse),
        Some(&sinks),
    );
    exact(&out, "dq", Dtype::F64, &p.q_shape(), &want.dq)?;
    exact(&out, "dk", Dtype::F64, &p.kv_shape(), &want.dk)?;
    exact(&out, "dv", Dtype::F64, &p.kv_shape(), &want.dv)?;
    exact(
        &out,
        "dsinks",
        Dtype::F64,
        &[4],
        &ds.ok_or("no sinks' gradient")?,
    )?;
    ensure(d.files() == ["in.safetensors", "out.safetensors"], || {
        format!("left in the directory: {:?}", d.files())
    })
}

pub(super) fn attention_f16_window() -> TestResult {
    let d = Dir::new("attention_f16");
    let p = AttentionProblem::new(1, 7, 7, 2, 1, 128, AttnDtype::F16)
        .window(Some(2), Some(1))
        .scale(0.3);
    let mut r = rng(12);
    let nq: usize = p.q_shape().iter().product();
    let nk: usize = p.kv_shape().iter().product();
    let (q, k, v) = (
        uniform_f16(&mut r, nq, -1.0, 1.0),
        uniform_f16(&mut r, nk, -1.0, 1.0),
        uniform_f16(&mut r, nk, -1.0, 1.0),
    );
    write_inputs(
        &d.path("in.safetensors"),
        &[
            ("q", p.q_shape().to_vec(), V::F16(q.clone())),
            ("k", p.kv_shape().to_vec(), V::F16(k.clone())),
            ("v", p.kv_shape().to_vec(), V::F16(v.clone())),
        ],
    )?;
    ok(&d.command(
        "attention @in.safetensors --output @out.safetensors --reference \
         --window-left 2 --window-right 1 --scale 0.3",
    ))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = kernels::attention::reference(&p, &q, &k, &v);
    exact(&out, "o", Dtype::F64, &p.q_shape(), &want.o)?;
    exact(&out, "lse", Dtype::F64, &[1, 2, 7], &want.lse)
}

/// Q and the caches of a decode step, uniform in `[-1, 1)`, in `p`'s dtype.
pub(super) fn decode_inputs(p: &AttentionDecodeProblem, seed: u64) -> [V; 3] {
    let mut r = rng(seed);
    let nq: usize = p.q_shape().iter().product();
    let nc: usize = p.cache_shape().iter().product();
    let mut draw = |n| match p.dtype {
        AttnDtype::Bf16 => V::Bf16(uniform_bf16(&mut r, n, -1.0, 1.0)),
        AttnDtype::F16 => V::F16(uniform_f16(&mut r, n, -1.0, 1.0)),
    };
    [draw(nq), draw(nc), draw(nc)]
}

/// The input file of a decode step: Q, the caches, the block table (i32) and the context
/// lengths (`lens`, i32 or i64).
pub(super) fn decode_tensors(
    p: &AttentionDecodeProblem,
    [q, k, v]: [V; 3],
    table: &[i32],
    lens: V,
) -> Vec<Named> {
    vec![
        ("q", p.q_shape().to_vec(), q),
        ("k_cache", p.cache_shape().to_vec(), k),
        ("v_cache", p.cache_shape().to_vec(), v),
        (
            "block_table",
            vec![p.batch, p.max_pages],
            V::I32(table.to_vec()),
        ),
        ("cache_seqlens", vec![p.batch], lens),
    ]
}

/// `attention-decode --reference` against `attention::reference_decode` called directly, twice:
/// bf16, one new token, pages out of order, a page shared between sequences, an empty context
/// (its rows O = 0, LSE = -inf) and contexts not a multiple of the page; then f16, three new
/// tokens, causal (the first row of a 2-key context sees no key), `--scale`, i64 lengths.
pub(super) fn attention_decode() -> TestResult {
    use kernels::attention::reference_decode;
    let d = Dir::new("attention_decode");
    // B 3, Sq 1, Hq 4, Hkv 2, D 64, pages of 16, 5 pages, 3 per sequence (48 keys at most).
    let mut p = AttentionDecodeProblem::new(3, 1, 4, 2, 64, 16, 5, 3);
    let lens = [37, 0, 29];
    let table = [3, 0, 4, -1, -1, -1, 3, 1, -1];
    let inputs = decode_inputs(&p, 14);
    let (q, k, v) = match &inputs {
        [V::Bf16(q), V::Bf16(k), V::Bf16(v)] => (q.clone(), k.clone(), v.clone()),
        _ => unreachable!("bf16 inputs"),
    };
    write_inputs(
        &d.path("in.safetensors"),
        &decode_tensors(&p, inputs, &table, V::I32(lens.to_vec())),
    )?;
    let report =
        ok(&d.command("attention-decode @in.safetensors -o @out.safetensors --reference"))?;
    print!("{report}");
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = reference_decode(&p, &q, &k, &v, &table, &lens);
    exact(&out, "o", Dtype::F64, &[3, 1, 4, 64], &want.o)?;
    exact(&out, "lse", Dtype::F64, &[3, 4, 1], &want.lse)?;
    // LSE [B, Hq, Sq]: finite where the context has keys, -inf (and O = 0) where it has none.
    for (b, &len) in lens.iter().enumerate() {
        let lse = &out["lse"].values[b * 4..(b + 1) * 4];
        let o = &out["o"].values[b * 4 * 64..(b + 1) * 4 * 64];
        if len > 0 {
            ensure(lse.iter().all(|x| x.is_finite()), || {
                format!("sequence {b} ({len} keys): LSE {lse:?} not finite")
            })?;
        } else {
            ensure(
                lse.iter().all(|&x| x == f64::NEG_INFINITY) && o.iter().all(|&x| x == 0.0),
                || format!("sequence {b} (no key): LSE {lse:?}, O not all 0"),
            )?;
        }
    }
    ensure(d.files() == ["in.safetensors", "out.safetensors"], || {
        format!("left in the directory: {:?}", d.files())
    })?;

    // f16, Sq 3, causal, scale 0.2; B 2 with contexts of 2 and 48 keys.
    p = AttentionDecodeProblem::new(2, 3, 4, 2, 64, 16, 5, 3);
    p.dtype = AttnDtype::F16;
    p.causal = true;
    p.scale = Some(0.2);
    let lens = [2i32, 48];
    let table = [2, -7, 99, 1, 4, 0];
    let inputs = decode_inputs(&p, 15);
    let (q, k, v) = match &inputs {
        [V::F16(q), V::F16(k), V::F16(v)] => (q.clone(), k.clone(), v.clone()),
        _ => unreachable!("f16 inputs"),
    };
    let lens64 = V::I64(lens.iter().map(|&l| l as i64).collect());
    write_inputs(
        &d.path("in.safetensors"),
        &decode_tensors(&p, inputs, &table, lens64),
    )?;
    ok(&d.command(
        "attention-decode @in.safetensors -o @out.safetensors --reference --causal --scale 0.2",
    ))?;
    let out = read_outputs(&d.path("out.safetensors"))?;
    let want = reference_decode(&p, &q, &k, &v, &table, &lens);
    exact(&out, "o", Dtype::F64, &[2, 3, 4, 64], &want.o)?;
    exact(&out, "lse", Dtype::F64, &[2, 4, 3], &want.lse)?;
    // Query i of a sequence of L keys sees keys 0 ..= L - 3 + i: none for i = 0 when L = 2.
    for (at, &x) in out["lse"].values.iter().enumerate() {
        let (b, i) = (at / 12, at % 3);
        let has_key = lens[b] as i64 - 3 + i as i64 >= 0;
        ensure(x.is_finite() == has_key, || {
            format!("LSE[{at}] = {x} (sequence {b}, query {i}): expected a key: {has_key}")
        })?;
    }
    Ok(())
}
