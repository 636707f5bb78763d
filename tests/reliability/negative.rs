//! The negative controls (`gpu-kernels/src/negative.rs`): kernels with a deliberate race or
//! aliasing that the checks must catch. The sanitizer passes of `bundle/run.sh` leave these
//! tests out; `bundle/reliability.sh` runs them under racecheck and expects hazards.

use kernel_abi::smoke::{NEGATIVE_BLOCK_REDUCE_NO_BARRIER, ReduceParams, SMOKE_BLOCK_REDUCE};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{TestResult, check_close, ensure, gpu_ok};
use kernels::memory::{download, poisoned, upload};
use kernels::mhc::Exec;
use kernels::semicrf::{self, SemiCrfProblem};
use kernels::{Gpu, Kernel, Launch};

pub fn emulated_reduce_barrier_hazard() -> TestResult {
    // The emulator finds the missing barrier whatever the order its threads run in, and the
    // correct kernel (same body, with the barrier) passes on the same input.
    let blocks = 3u32;
    let threads = kernel_abi::smoke::REDUCE_THREADS;
    let data: Vec<f32> = (0..blocks * threads * 2)
        .map(|i| (i % 17) as f32 - 8.0)
        .collect();
    let run = |kernel: &Kernel<ReduceParams>| -> Result<Vec<f32>, String> {
        let mut input = HostBuf::from_slice(&data);
        let mut partial = HostBuf::filled(blocks as usize, f32::NAN);
        let params = kernel_abi::smoke::ReduceParams {
            input: input.view().addr() as *const f32,
            partial: partial.view().addr() as *mut f32,
            n: data.len() as u32,
        };
        let launch = Launch::new(kernel, (blocks, 1, 1), (), params);
        // SAFETY: input holds n f32 and partial one per block, as the kernel requires.
        unsafe { Emulator.launch(&launch) }.map_err(|e| e.to_string())?;
        Ok(partial.to_vec())
    };
    let good = run(&SMOKE_BLOCK_REDUCE).map_err(|e| format!("the correct kernel failed: {e}"))?;
    let want = kernels_testing::smoke::block_reduce_reference(&data, blocks);
    for (b, (x, w)) in good.iter().zip(&want).enumerate() {
        ensure((*x as f64 - w.0).abs() <= 1e-4 * w.1.max(1.0), || {
            format!("block {b}: {x} vs {}", w.0)
        })?;
    }
    let err = run(&NEGATIVE_BLOCK_REDUCE_NO_BARRIER)
        .err()
        .ok_or("the emulator did not report the missing barrier")?;
    ensure(err.contains("hazard"), || {
        format!("unexpected failure: {err}")
    })?;
    println!("emulator: {err}");
    Ok(())
}

/// `|x - w| <= tol` (false for NaN).
fn within(x: f64, w: f64, tol: f64) -> bool {
    (x - w).abs() <= tol
}

/// Per-block sums of fresh inputs by `launch`; the number of blocks whose sum is wrong.
fn wrong_blocks(
    g: &Gpu,
    stream: &kernels::Stream,
    seed: u64,
    launch: impl Fn(&kernels::DeviceBuffer<f32>, &mut kernels::DeviceBuffer<f32>) -> kernels::Result<()>,
) -> kernels::Result<usize> {
    const BLOCKS: usize = 1024;
    let n = BLOCKS * kernel_abi::smoke::REDUCE_THREADS as usize * 4;
    let mut r = kernels::data::rng(seed);
    let data = kernels::data::uniform_f32(&mut r, n, 1.0, 2.0);
    let input = upload(&data)?;
    let mut partial = poisoned::<f32>(BLOCKS)?;
    launch(&input, &mut partial)?;
    g.sync(stream, "block reduce")?;
    let got = download(&partial)?;
    let want = kernels_testing::smoke::block_reduce_reference(&data, BLOCKS as u32);
    Ok(got
        .iter()
        .zip(&want)
        .filter(|(x, w)| !within(**x as f64, w.0, 1e-4 * w.1))
        .count())
}

pub fn reduce_no_barrier_wrong(g: &'static Gpu) -> TestResult {
    let stream = gpu_ok(g.stream())?;
    // The correct kernel on the same inputs: no wrong block (the check is sound).
    let good = gpu_ok(wrong_blocks(g, &stream, 1, |i, p| {
        kernels_testing::smoke::block_reduce_launch(g, &stream, i, p)
    }))?;
    ensure(good == 0, || {
        format!("smoke_block_reduce: {good} wrong blocks")
    })?;
    // The race shows as wrong sums in some launch (warp 0 reads a slot before its warp wrote
    // it: a stale sum of the previous launch's input, or garbage).
    const TRIALS: u64 = 300;
    for trial in 0..TRIALS {
        let wrong = gpu_ok(wrong_blocks(g, &stream, 100 + trial, |i, p| {
            kernels_testing::negative::block_reduce_no_barrier_launch(g, &stream, i, p)
        }))?;
        if wrong > 0 {
            println!(
                "missing barrier caught by the reference check in trial {trial}: {wrong} of 1024 blocks wrong"
            );
            return Ok(());
        }
    }
    Err(format!(
        "the reference check never caught the missing barrier in {TRIALS} launches (racecheck \
         must still report it: bundle/reliability.sh)"
    )
    .into())
}

pub fn reduce_no_barrier_racecheck_target(g: &'static Gpu) -> TestResult {
    // One small launch for racecheck (bundle/reliability.sh expects hazards here); the test
    // itself checks that every block wrote its sum.
    let stream = gpu_ok(g.stream())?;
    let data = vec![1.0f32; 4 * kernel_abi::smoke::REDUCE_THREADS as usize];
    let input = gpu_ok(upload(&data))?;
    let mut partial = gpu_ok(poisoned::<f32>(4))?;
    gpu_ok(kernels_testing::negative::block_reduce_no_barrier_launch(
        g,
        &stream,
        &input,
        &mut partial,
    ))?;
    gpu_ok(g.sync(&stream, "negative block reduce"))?;
    let got = gpu_ok(download(&partial))?;
    ensure(
        got.iter().all(|x| !x.is_nan() || x.to_bits() != u32::MAX),
        || format!("unwritten partial sums: {got:?}"),
    )
}

pub fn semicrf_aliased_wrong(g: &'static Gpu) -> TestResult {
    // Eight segments per sequence: the aliased kernel loses the counts of the odd ones.
    let p = SemiCrfProblem::new(2, 60, 4, 3).with_checkpoint(8);
    let inp = kernels_testing::semicrf::random_inputs(&p, 21, false);
    let want = semicrf::reference::posterior(&semicrf::reference::Model::new(&p, &inp.view()));
    let stream = gpu_ok(g.stream())?;
    let dev = gpu_ok(semicrf::DeviceInputs::upload(&p, &inp.view()))?;
    let run = |aliased: bool| -> kernels::Result<(Vec<f32>, Vec<f32>)> {
        let mut st = semicrf::ForwardState::new(&p)?;
        let mut gr = semicrf::Gradients::new(&p, false)?;
        if aliased {
            kernels::negative::semicrf_forward_backward_aliased_launch(
                g, &stream, &p, &dev, &mut st, &mut gr,
            )?;
        } else {
            semicrf::forward_backward_launch(g, &stream, &p, &dev, &mut st, &mut gr)?;
        }
        g.sync(&stream, "semicrf")?;
        Ok((download(&gr.grad_dur)?, download(&gr.grad_trans)?))
    };
    let tol = |w: &[f64]| w.iter().map(|x| 1e-4 * x.abs() + 1e-6).collect::<Vec<_>>();
    let (td, tt) = (tol(&want.grad_dur), tol(&want.grad_trans));
    // The correct kernel passes the check the aliased one must fail.
    let (d, t) = gpu_ok(run(false))?;
    check_close("semicrf_marginals ddur", &d, &want.grad_dur, |i| td[i])?;
    check_close("semicrf_marginals dtrans", &t, &want.grad_trans, |i| tt[i])?;
    let (d, t) = gpu_ok(run(true))?;
    let caught = check_close("aliased ddur", &d, &want.grad_dur, |i| td[i]).is_err()
        || check_close("aliased dtrans", &t, &want.grad_trans, |i| tt[i]).is_err();
    ensure(caught, || {
        "the reference check did not catch the aliased workspaces".into()
    })
}
