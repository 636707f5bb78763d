//! Family `smoke`: the smoke kernels (correctness and time) and the Hopper bf16 GEMM at large
//! sizes beside cuBLAS (through PyTorch, same inputs).

use crate::config;
use crate::harness::{Bench, Row, Tensor};
use half::bf16;
use kernels::Result;
use kernels::data::{rng, uniform_bf16, uniform_f32};
use kernels::gemm::{self, GemmProblem};
use kernels::memory::{download, poisoned, upload, zeroed};
use kernels_testing::smoke;
use rand::Rng;

/// Run the family.
pub fn run(b: &mut Bench) -> Result<()> {
    reduce(b)?;
    if b.gpu.arch().has_hopper_kernels() {
        wgmma(b)?;
        pingpong(b)?;
        let sizes: &[usize] = if b.quick { &[2048] } else { &[4096, 8192] };
        for &s in sizes {
            gemm_square(b, s)?;
        }
        b.run_peers();
    } else {
        b.note(format!(
            "{}: no sm_90a kernels; wgmma, ping-pong and GEMM rows skipped",
            b.gpu.arch()
        ));
    }
    Ok(())
}

fn reduce(b: &mut Bench) -> Result<()> {
    let n = if b.quick { 1 << 22 } else { 1 << 26 };
    let blocks = 4 * b.gpu.info().multiprocessors;
    let input = uniform_f32(&mut rng(1), n, -1.0, 1.0);
    let d_in = upload(&input)?;
    let mut partial = poisoned::<f32>(blocks as usize)?;
    let t = b.time(|| smoke::block_reduce_launch(&b.gpu, &b.stream, &d_in, &mut partial))?;
    let got = download(&partial)?;
    let want = smoke::block_reduce_reference(&input, blocks);
    let err = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (*g as f64 - w.0).abs())
        .fold(0.0, f64::max);
    b.push(
        Row::ours("block_reduce", config!("n": n, "blocks": blocks), &t)
            .bytes(4.0 * n as f64)
            .err(err),
    );
    Ok(())
}

fn wgmma(b: &mut Bench) -> Result<()> {
    let n = 256u32;
    let mut r = rng(2);
    let a = uniform_bf16(&mut r, 64 * 64, -1.0, 1.0);
    let bm = uniform_bf16(&mut r, n as usize * 64, -1.0, 1.0);
    let (da, db) = (upload(&a)?, upload(&bm)?);
    let mut c = poisoned::<f32>(64 * n as usize)?;
    let t = b.time(|| smoke::wgmma_tile_launch(&b.gpu, &b.stream, n, &da, &db, &mut c))?;
    let got = download(&c)?;
    let (want, _) = gemm::reference(&a, &bm, 64, n as usize, 64);
    let err = max_err(&got, &want);
    b.push(Row::ours("wgmma_tile", config!("m": 64, "n": n, "k": 64), &t).err(err));
    Ok(())
}

fn pingpong(b: &mut Bench) -> Result<()> {
    let tiles = if b.quick { 256u32 } else { 4096 };
    let elems = tiles as usize * 4096;
    let input = uniform_bf16(&mut rng(3), elems, -100.0, 100.0);
    let d_in = upload(&input)?;
    let mut out = poisoned::<f32>(elems)?;
    let mut order = poisoned::<u32>(tiles as usize)?;
    let mut counter = zeroed::<u32>(1)?;
    let t = b.time(|| {
        smoke::pingpong_launch(
            &b.gpu,
            &b.stream,
            &d_in,
            tiles,
            &mut out,
            &mut order,
            &mut counter,
        )
    })?;
    let got = download(&out)?;
    let want: Vec<f64> = smoke::pingpong_reference(&input, tiles)
        .iter()
        .map(|&x| x as f64)
        .collect();
    let err = max_err(&got, &want);
    // One block streams the tiles: this measures the ring's per-tile overhead, not bandwidth.
    b.push(
        Row::ours("pingpong_ring", config!("tiles": tiles, "stages": 3), &t)
            .bytes(6.0 * elems as f64)
            .err(err),
    );
    Ok(())
}

fn gemm_square(b: &mut Bench, s: usize) -> Result<()> {
    let p = GemmProblem { m: s, n: s, k: s };
    let mut r = rng(s as u64);
    let a = uniform_bf16(&mut r, s * s, -1.0, 1.0);
    let bm = uniform_bf16(&mut r, s * s, -1.0, 1.0);
    let (da, db) = (upload(&a)?, upload(&bm)?);
    let mut dc = poisoned::<bf16>(s * s)?;
    let t = b.time(|| gemm::gemm_bf16(&b.gpu, &b.stream, &p, &da, &db, &mut dc))?;
    let c = download(&dc)?;
    // Validate on 512 random entries against the f64 reference (the full product is too slow
    // on the CPU at these sizes); the peer row compares every entry with cuBLAS.
    let mut worst = 0.0f64;
    let mut excess = 0usize;
    for _ in 0..512 {
        let (i, j) = (r.random_range(0..s), r.random_range(0..s));
        let (mut want, mut abs) = (0.0f64, 0.0f64);
        for k in 0..s {
            let x = a[i * s + k].to_f64() * bm[j * s + k].to_f64();
            want += x;
            abs += x.abs();
        }
        let err = (c[i * s + j].to_f64() - want).abs();
        worst = worst.max(err);
        if err > gemm::tolerance(want, abs, s) {
            excess += 1;
        }
    }
    if excess > 0 {
        return Err(kernels::Error::invalid(
            "GEMM result",
            format!("{excess} of 512 sampled entries exceed the error bound at {s}^3"),
        ));
    }
    let cfg = config!("m": s, "n": s, "k": s, "dtype": "bf16");
    b.push(
        Row::ours("gemm_bf16", cfg.clone(), &t)
            .flops(p.flops())
            .err(worst),
    );
    b.case(
        "gemm_bf16",
        &cfg,
        config!("flops": p.flops()),
        &[
            ("a", Tensor::Bf16(&a, vec![s, s])),
            ("b", Tensor::Bf16(&bm, vec![s, s])),
            ("ours", Tensor::Bf16(&c, vec![s, s])),
        ],
    )
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(
            0.0,
            |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
        )
}
