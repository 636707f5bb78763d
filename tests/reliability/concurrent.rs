//! All four families on several streams at once, bitwise equal to sequential runs.

use kernel_tests::{TestResult, ensure, gpu_ok};
use kernels::attention::{self, AttentionProblem, Dtype, View};
use kernels::gla::{self, GlaProblem};
use kernels::memory::{download, poisoned, upload};
use kernels::mhc::{self, MhcProblem};
use kernels::semicrf::{self, SemiCrfProblem};
use kernels::{Gpu, bf16};

/// Every family's outputs as bits.
type Bits = Vec<Vec<u32>>;

fn bits_f32(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn bits_bf16(x: &[bf16]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits() as u32).collect()
}

pub fn four_families_bitwise(g: &'static Gpu) -> TestResult {
    // Uploads need the context current on this (test) thread.
    gpu_ok(g.bind())?;
    // Inputs and device buffers of each family, prepared once; `launch` enqueues a family's
    // work on a stream (no synchronization); `collect` downloads its outputs.
    let att = AttentionProblem::new(2, 300, 300, 4, 2, 128, Dtype::Bf16).causal();
    let mut r = kernels::data::rng(31);
    let aq = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        2 * 300 * 4 * 128,
        -1.0,
        1.0,
    )))?;
    let ak = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        2 * 300 * 2 * 128,
        -1.0,
        1.0,
    )))?;
    let av = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        2 * 300 * 2 * 128,
        -1.0,
        1.0,
    )))?;
    let crf = SemiCrfProblem::new(4, 500, 8, 6);
    let crf_in = kernels_testing::semicrf::random_inputs(&crf, 32, true);
    let crf_dev = gpu_ok(semicrf::DeviceInputs::upload(&crf, &crf_in.view()))?;
    let gp = GlaProblem::new(2, 1000, 4, 64, 64).with_segment_len(256);
    let gq = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        gp.qk_len(),
        -1.0,
        1.0,
    )))?;
    let gk = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        gp.qk_len(),
        -1.0,
        1.0,
    )))?;
    let gv = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        gp.v_len(),
        -1.0,
        1.0,
    )))?;
    let gg = gpu_ok(upload(&kernels::data::uniform_bf16(
        &mut r,
        gp.qk_len(),
        -1.0,
        -0.01,
    )))?;
    let mp = MhcProblem::new(2, 256, 4, 256);
    let mdata = mhc::reference::MhcData::random(&mp, 33);

    let run_all = |streams: &[kernels::Stream]| -> kernels::Result<(Bits, kernels_testing::mhc::MhcHostOutputs)> {
        let st = |i: usize| &streams[i % streams.len()];
        // Attention.
        let ao = poisoned::<bf16>(2 * 300 * 4 * 128)?;
        let mut alse = poisoned::<f32>(att.lse_len())?;
        {
            let mut o = View::contiguous(&ao, att.q_shape());
            attention::forward(
                g,
                st(0),
                &att,
                &View::contiguous(&aq, att.q_shape()),
                &View::contiguous(&ak, att.kv_shape()),
                &View::contiguous(&av, att.kv_shape()),
                &mut o,
                &mut alse,
            )?;
        }
        // Semi-CRF.
        let mut cst = semicrf::ForwardState::new(&crf)?;
        let mut cgr = semicrf::Gradients::new(&crf, true)?;
        semicrf::forward_backward_launch(g, st(1), &crf, &crf_dev, &mut cst, &mut cgr)?;
        // GLA.
        let mut session = gla::GlaSession::new(g, &gp)?;
        let mut go = poisoned::<bf16>(gp.v_len())?;
        let mut gfin = poisoned::<f32>(gp.state_len())?;
        session.forward(
            g,
            st(2),
            &gla::GlaInputs {
                q: &gq,
                k: &gk,
                v: &gv,
                g: &gg,
                init_state: None,
            },
            &mut gla::GlaOutputs {
                o: &mut go,
                final_state: Some(&mut gfin),
            },
        )?;
        // mHC.
        let mut m = kernels_testing::mhc::MhcDeviceRun::upload(&mdata)?;
        m.forward(g, st(3))?;
        m.backward(g, st(3))?;
        for s in streams {
            g.sync(s, "concurrent families")?;
        }
        let bits = vec![
            bits_bf16(&download(&ao)?),
            bits_f32(&download(&alse)?),
            bits_f32(&download(cst.log_z())?),
            bits_f32(&download(&cgr.grad_cumsum)?),
            bits_f32(&download(&cgr.grad_dur)?),
            bits_f32(&download(&cgr.grad_trans)?),
            bits_f32(&download(cgr.marginals.as_ref().expect("asked for"))?),
            bits_bf16(&download(&go)?),
            bits_f32(&download(&gfin)?),
        ];
        Ok((bits, m.download()?))
    };
    let one = vec![gpu_ok(g.stream())?];
    let sequential = gpu_ok(run_all(&one))?;
    let streams: Vec<kernels::Stream> = (0..4)
        .map(|_| g.stream())
        .collect::<kernels::Result<_>>()
        .map_err(|e| format!("{e}"))?;
    for round in 0..3 {
        let concurrent = gpu_ok(run_all(&streams))?;
        for (i, (a, b)) in sequential.0.iter().zip(&concurrent.0).enumerate() {
            ensure(a == b, || {
                format!("round {round}: output {i} differs between sequential and concurrent runs")
            })?;
        }
        ensure(sequential.1.same_bits(&concurrent.1), || {
            format!("round {round}: mHC outputs differ between sequential and concurrent runs")
        })?;
    }
    println!("four families on four streams, 3 rounds: bitwise equal to the sequential run");
    Ok(())
}
