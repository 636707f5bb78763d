//! Offsets past 2^31 elements on the GPU: attention and GLA with their data placed beyond
//! 2^31 elements into large buffers.

use kernel_tests::{TestResult, ensure, gpu_ok, racecheck_size};
use kernels::attention::{self, AttentionProblem, Dtype, Path, View};
use kernels::gla::{self, GlaKernel, GlaProblem};
use kernels::memory::{download, poisoned};
use kernels::{Gpu, bf16};

/// Offsets past 2^31 elements: batch 1 of Q, K, V and O starts `2^31 + 1024` elements into its
/// buffer (a strided view; batch 0 at 0, nothing read in between), so every address of batch 1
/// needs 64-bit offsets. Both paths against the f64 reference; 17 GB of device memory. Under
/// racecheck (`KERNELS_SANITIZER=racecheck`) batch 1 starts right after batch 0 instead
/// ([`racecheck_size`]): the same kernels on the same tiles, without 17 GB to shadow.
pub fn attention_gpu(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let base = AttentionProblem::new(2, 300, 300, 2, 1, 128, Dtype::Bf16).causal();
    let bs = racecheck_size(
        "batch stride (elements)",
        (1usize << 31) + 1024,
        300 * 256 + 1024,
    );
    let mut r = kernels::data::rng(77);
    let q = kernels::data::uniform_bf16(&mut r, 2 * 300 * 2 * 128, -1.0, 1.0);
    let k = kernels::data::uniform_bf16(&mut r, 2 * 300 * 128, -1.0, 1.0);
    let v = kernels::data::uniform_bf16(&mut r, 2 * 300 * 128, -1.0, 1.0);
    let want = attention::reference(&base, &q, &k, &v);
    // A buffer holding batch b of `host` (contiguous batches of `per` elements) at `b * bs`.
    let spread = |host: &[bf16]| -> kernels::Result<kernels::DeviceBuffer<bf16>> {
        let per = host.len() / 2;
        let mut buf = poisoned::<bf16>(bs + per)?;
        kernels::memory::upload_at(&mut buf, 0, &host[..per])?;
        kernels::memory::upload_at(&mut buf, bs, &host[per..])?;
        Ok(buf)
    };
    let (dq, dk, dv) = (
        gpu_ok(spread(&q))?,
        gpu_ok(spread(&k))?,
        gpu_ok(spread(&v))?,
    );
    let (qs, kvs) = ([bs, 256, 128, 1], [bs, 128, 128, 1]);
    for path in [Path::MmaSync, Path::Hopper] {
        if path == Path::Hopper && !g.arch().has_hopper_kernels() {
            continue;
        }
        let p = base.clone().path(path);
        let o_buf = gpu_ok(poisoned::<bf16>(bs + 300 * 256))?;
        let mut lse = gpu_ok(poisoned::<f32>(p.lse_len()))?;
        {
            let view = |b, shape: [usize; 4], st: [usize; 4]| View::new(b, 0, &shape, &st);
            let mut o = gpu_ok(view(&o_buf, p.q_shape(), qs))?;
            gpu_ok(attention::forward(
                g,
                &stream,
                &p,
                &gpu_ok(view(&dq, p.q_shape(), qs))?,
                &gpu_ok(view(&dk, p.kv_shape(), kvs))?,
                &gpu_ok(view(&dv, p.kv_shape(), kvs))?,
                &mut o,
                &mut lse,
            ))?;
        }
        gpu_ok(g.sync(&stream, "attention (large offsets)"))?;
        let per = 300 * 256;
        let mut o = gpu_ok(kernels::memory::download_range(&o_buf, 0, per))?;
        o.extend(gpu_ok(kernels::memory::download_range(&o_buf, bs, per))?);
        let lse = gpu_ok(download(&lse))?;
        let err_o = o
            .iter()
            .zip(&want.o)
            .map(|(x, w)| (x.to_f32() as f64 - w).abs())
            .fold(0.0, f64::max);
        let err_lse = lse
            .iter()
            .zip(&want.lse)
            .map(|(x, w)| (*x as f64 - w).abs())
            .fold(0.0, f64::max);
        println!(
            "{path:?}, batch 1 at element {bs}: max |O - ref| = {err_o:.3e}, max |LSE - ref| = {err_lse:.3e}"
        );
        ensure(err_o <= 1e-2 && err_lse <= 1e-3, || {
            format!("{path:?}: O error {err_o:.3e} (tol 1e-2), LSE error {err_lse:.3e} (tol 1e-3)")
        })?;
    }
    Ok(())
}

/// Offsets past 2^31 elements in GLA: packed sequences `[0, N0)` (poisoned content, not
/// checked) and `[N0, N0 + 300)` with `64 N0 > 2^31`, one head, Dk = Dv = 64: the second
/// sequence against the f64 recurrence, on the baseline and (sm_90a) the automatic choice, the
/// pingpong. 22 GB of device memory. Under racecheck the first
/// sequence has 1000 tokens instead ([`racecheck_size`]): the kernels walk 33.5 million tokens
/// of it otherwise, each chunk with the same shared-memory protocol.
pub fn gla_gpu(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    let (len, d) = (300usize, 64usize);
    let n0 = racecheck_size(
        "tokens before the checked sequence",
        (1usize << 31) / 64 + 1000,
        1000,
    );
    let p = GlaProblem::varlen(vec![0, n0, n0 + len], 1, d, d);
    let small = GlaProblem::varlen(vec![0, len], 1, d, d);
    let mut r = kernels::data::rng(78);
    let q = kernels::data::uniform_bf16(&mut r, len * d, -1.0, 1.0);
    let k = kernels::data::uniform_bf16(&mut r, len * d, -1.0, 1.0);
    let v = kernels::data::uniform_bf16(&mut r, len * d, -1.0, 1.0);
    let gd = kernels::data::uniform_bf16(&mut r, len * d, -1.0, 0.0);
    let want = gpu_ok(gla::reference::recurrence(
        &small,
        &gla::reference::HostInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &gd,
            init_state: None,
        },
    ))?;
    let place = |host: &[bf16]| -> kernels::Result<kernels::DeviceBuffer<bf16>> {
        let mut buf = poisoned::<bf16>((n0 + len) * d)?;
        kernels::memory::upload_at(&mut buf, n0 * d, host)?;
        Ok(buf)
    };
    let (dq, dk, dv, dg) = (
        gpu_ok(place(&q))?,
        gpu_ok(place(&k))?,
        gpu_ok(place(&v))?,
        gpu_ok(place(&gd))?,
    );
    // The baseline, and on sm_90a also the pingpong (forced: with two (sequence, head) pairs
    // the automatic choice is the baseline), on the same inputs; each into a fresh poisoned
    // output.
    let mut choices = vec![GlaKernel::Baseline];
    if g.arch().has_hopper_kernels() {
        choices.push(GlaKernel::Pingpong);
    }
    for kernel in choices {
        let p = p.clone().with_kernel(kernel);
        let mut o = gpu_ok(poisoned::<bf16>((n0 + len) * d))?;
        let mut fin = gpu_ok(poisoned::<f32>(p.state_len()))?;
        let mut session = gpu_ok(gla::GlaSession::new(g, &p))?;
        gpu_ok(session.forward(
            g,
            &stream,
            &gla::GlaInputs {
                q: &dq,
                k: &dk,
                v: &dv,
                g: &dg,
                init_state: None,
            },
            &mut gla::GlaOutputs {
                o: &mut o,
                final_state: Some(&mut fin),
            },
        ))?;
        gpu_ok(g.sync(&stream, "gla (large offsets)"))?;
        let got = gpu_ok(kernels::memory::download_range(&o, n0 * d, len * d))?;
        let state = gpu_ok(kernels::memory::download_range(&fin, d * d, d * d))?;
        let err_o = gla::reference::rel_l2(got.iter().map(|x| x.to_f32() as f64), &want.o);
        let err_s = gla::reference::rel_l2(state.iter().map(|x| *x as f64), &want.final_state);
        println!(
            "{:?} kernels: sequence 2 at element {}: rel L2 o {err_o:.3e}, final state \
             {err_s:.3e} (tol 1e-2)",
            session.kernel(),
            n0 * d
        );
        ensure(err_o <= 1e-2 && err_s <= 1e-2, || {
            format!(
                "{:?} kernels: o rel L2 {err_o:.3e}, final state {err_s:.3e} (tol 1e-2)",
                session.kernel()
            )
        })?;
    }
    Ok(())
}
