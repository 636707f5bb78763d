//! NaN and Inf inputs, behaviour as documented in README.md ("NaN and Inf"). The GLA and mHC
//! kernels' behaviour is tested in their suites (`gla/nonfinite/*`, `mhc/nonfinite/*`), where
//! the emulator runs the same checks without a GPU.

use crate::run_attention;
use kernel_tests::{TestResult, check_close, ensure, gpu_ok};
use kernels::attention::{self, AttentionProblem, Dtype, Path};
use kernels::gla::{self, GlaProblem};
use kernels::semicrf::{self, SemiCrfProblem};
use kernels::{Error, Gpu, bf16};

pub fn semicrf_rejected() -> TestResult {
    let p = SemiCrfProblem::new(2, 8, 3, 2);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for which in 0..3 {
            let mut inp = kernels_testing::semicrf::random_inputs(&p, 3, false);
            match which {
                0 => inp.cumsum[5] = bad,
                1 => inp.dur[1] = bad,
                _ => inp.trans[2] = bad,
            }
            let e = inp
                .view()
                .validate(&p)
                .err()
                .ok_or("a non-finite score was accepted")?;
            ensure(matches!(e, Error::InvalidArgument { .. }), || {
                format!("{e}")
            })?;
        }
    }
    Ok(())
}

/// Non-finite scores on the GPU entry points: each rejects them with `InvalidArgument` before
/// anything is uploaded (so no kernel ever reads one), a score past a sequence's length (never
/// read) included; the same stream then computes valid inputs correctly (log Z within
/// `1e-4 max(1, |log Z|)` of the f64 reference).
pub fn semicrf_gpu_rejected(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let p = SemiCrfProblem::new(3, 40, 6, 4);
    let clean = kernels_testing::semicrf::random_inputs(&p, 13, true);
    let short = (0..p.batch)
        .find(|&b| (clean.lengths[b] as usize) < p.t)
        .unwrap_or(0);
    println!(
        "cumulative scores poisoned at position T of sequence {short} (length {}, T = {})",
        clean.lengths[short], p.t
    );
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for which in ["cumsum", "dur", "trans"] {
            let mut inp = kernels_testing::semicrf::random_inputs(&p, 13, true);
            match which {
                "cumsum" => inp.cumsum[(short * (p.t + 1) + p.t) * p.c + 1] = bad,
                "dur" => inp.dur[p.c + 2] = bad,
                _ => inp.trans[3] = bad,
            }
            let v = inp.view();
            let results = [
                (
                    "DeviceInputs::upload",
                    semicrf::DeviceInputs::upload(&p, &v).map(|_| ()),
                ),
                (
                    "log_partition",
                    semicrf::log_partition(g, &stream, &p, &v).map(|_| ()),
                ),
                (
                    "posterior",
                    semicrf::posterior(g, &stream, &p, &v, true).map(|_| ()),
                ),
                ("viterbi", semicrf::viterbi(g, &stream, &p, &v).map(|_| ())),
            ];
            for (what, r) in results {
                match r {
                    Err(Error::InvalidArgument { .. }) => {}
                    Err(e) => {
                        return Err(
                            format!("{bad} in {which}: {what}: unexpected error {e}").into()
                        );
                    }
                    Ok(()) => return Err(format!("{bad} in {which}: {what} accepted it").into()),
                }
            }
        }
        let mut inp = kernels_testing::semicrf::random_inputs(&p, 13, true);
        inp.trans[0] = bad;
        let e = semicrf::posterior(g, &stream, &p, &inp.view(), false)
            .err()
            .ok_or("accepted")?;
        println!("{bad}: every entry point rejects it, e.g. {e}");
    }
    let got = gpu_ok(semicrf::posterior(g, &stream, &p, &clean.view(), false))?;
    let want = semicrf::reference::posterior(&semicrf::reference::Model::new(&p, &clean.view()));
    let tol: Vec<f64> = want.log_z.iter().map(|w| 1e-4 * w.abs().max(1.0)).collect();
    check_close(
        "log Z after the rejected calls",
        &got.log_z,
        &want.log_z,
        |i| tol[i],
    )
}

/// Attention with one non-finite element in key `j0` of batch 0, head 0: the output rows that
/// may attend `j0` are non-finite (NaN), every other row is finite; the reference defines it.
fn poisoned_key_case(bad: f32) -> (AttentionProblem, Vec<bf16>, Vec<bf16>, Vec<bf16>, usize) {
    let p = AttentionProblem::new(2, 70, 90, 2, 1, 64, Dtype::Bf16).causal();
    let mut r = kernels::data::rng(11);
    let q = kernels::data::uniform_bf16(&mut r, 2 * 70 * 2 * 64, -1.0, 1.0);
    let mut k = kernels::data::uniform_bf16(&mut r, 2 * 90 * 64, -1.0, 1.0);
    let v = kernels::data::uniform_bf16(&mut r, 2 * 90 * 64, -1.0, 1.0);
    let j0 = 50;
    k[j0 * 64 + 3] = bf16::from_f32(bad);
    (p, q, k, v, j0)
}

pub fn attention_reference() -> TestResult {
    let (p, q, k, v, j0) = poisoned_key_case(f32::NAN);
    let want = attention::reference(&p, &q, &k, &v);
    for b in 0..2 {
        for i in 0..p.seq_q {
            for h in 0..2 {
                let row = &want.o[((b * p.seq_q + i) * 2 + h) * 64..][..64];
                let bad = b == 0 && p.allowed(i, j0);
                ensure(row.iter().all(|x| x.is_nan() == bad), || {
                    format!("row b{b} i{i} h{h}: NaN expected {bad}")
                })?;
            }
        }
    }
    Ok(())
}

pub fn attention_gpu(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    for bad in [f32::NAN, f32::INFINITY] {
        for path in [Path::MmaSync, Path::Hopper] {
            if path == Path::Hopper && !g.arch().has_hopper_kernels() {
                continue;
            }
            let (p, q, k, v, _) = poisoned_key_case(bad);
            let p = p.path(path);
            let want = attention::reference(&p, &q, &k, &v);
            let (o, lse) = gpu_ok(run_attention(g, &stream, &p, &q, &k, &v))?;
            let mut finite = 0;
            for (i, (x, w)) in o.iter().zip(&want.o).enumerate() {
                let x = x.to_f32() as f64;
                if w.is_finite() {
                    ensure((x - w).abs() <= 1e-2 * w.abs() + 1e-2, || {
                        format!("{bad} {path:?}: O[{i}] = {x}, reference {w}")
                    })?;
                    finite += 1;
                } else {
                    ensure(!x.is_finite(), || {
                        format!("{bad} {path:?}: O[{i}] = {x}, reference {w} (non-finite)")
                    })?;
                }
            }
            for (i, (x, w)) in lse.iter().zip(&want.lse).enumerate() {
                ensure(x.is_finite() == w.is_finite(), || {
                    format!("{bad} {path:?}: LSE[{i}] = {x}, reference {w}")
                })?;
            }
            println!(
                "{bad} in K, {path:?}: {finite} finite outputs match, the others are non-finite as in the reference"
            );
        }
    }
    Ok(())
}

pub fn gla_reference() -> TestResult {
    // A NaN in v at token t0 of sequence 0 reaches o of that sequence from t0 on (through the
    // state), and nothing else.
    let p = GlaProblem::varlen(vec![0, 40, 70], 2, 64, 64);
    let mut r = kernels::data::rng(5);
    let q = kernels::data::uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let k = kernels::data::uniform_bf16(&mut r, p.qk_len(), -1.0, 1.0);
    let mut v = kernels::data::uniform_bf16(&mut r, p.v_len(), -1.0, 1.0);
    let g = kernels::data::uniform_bf16(&mut r, p.qk_len(), -1.0, -0.01);
    let t0 = 17;
    v[(t0 * 2) * 64] = bf16::from_f32(f32::NAN);
    let inp = gla::reference::HostInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        init_state: None,
    };
    let out = gla::reference::recurrence(&p, &inp).map_err(|e| format!("{e}"))?;
    for t in 0..70 {
        for h in 0..2 {
            let row = &out.o[(t * 2 + h) * 64..][..64];
            let nan = row.iter().any(|x| x.is_nan());
            let expect = t >= t0 && t < 40 && h == 0;
            ensure(nan == expect, || {
                format!("token {t} head {h}: NaN {nan}, expected {expect}")
            })?;
        }
    }
    Ok(())
}
