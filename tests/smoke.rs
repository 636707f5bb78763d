//! Smoke kernels against CPU references: each proves a group of device-layer primitives.

use kernel_tests::{F32_EPS, Needs, Suite, TestResult, check_close, ensure, gpu_ok, portable_gpu};
use kernels::data::{rng, uniform_bf16, uniform_f32};
use kernels::memory::upload;
use kernels::smoke::{self, WGMMA_SMOKE_N};
use kernels::tensor_map::MapSwizzle;
use kernels::{Gpu, bf16};

fn main() {
    let mut s = Suite::new();
    for (n, blocks) in [
        (1usize, 1u32),
        (255, 1),
        (256, 3),
        (100_003, 7),
        ((1 << 20) + 17, 132),
    ] {
        s.gpu(
            &format!("block_reduce/n{n}_blocks{blocks}"),
            Needs::Gpu,
            move |g| block_reduce(g, n, blocks),
        );
    }
    s.gpu("mma_tile/default_target", Needs::Gpu, mma_tile);
    s.gpu(
        "mma_tile/sm_80_target",
        Needs::Gpu,
        |_| match portable_gpu() {
            Some(g) => mma_tile(g),
            None => {
                println!("the default target is already sm_80");
                Ok(())
            }
        },
    );
    let boxes = [(0, 0), (16, 40), (48, 90), (-8, -5), (72, 3)];
    for swizzle in [MapSwizzle::None, MapSwizzle::B128] {
        for (x, y) in boxes {
            s.gpu(
                &format!("tma_load/{swizzle:?}_x{x}_y{y}"),
                Needs::Hopper,
                move |g| tma_load(g, x, y, swizzle),
            );
        }
    }
    s.gpu("tma_load/rejects_unaligned_column", Needs::Gpu, |g| {
        let stream = gpu_ok(g.stream())?;
        let buf = gpu_ok(upload(&vec![bf16::ZERO; 100 * 80]))?;
        match smoke::tma_load(g, &stream, &buf, 100, 80, 70, 3, MapSwizzle::None) {
            Err(kernels::Error::InvalidArgument { .. }) => Ok(()),
            other => Err(format!("x = 70 (140 bytes) must be rejected, got {other:?}").into()),
        }
    });
    for n in WGMMA_SMOKE_N {
        s.gpu(&format!("wgmma_tile/n{n}"), Needs::Hopper, move |g| {
            wgmma_tile(g, n)
        });
    }
    s.gpu("wgmma_tile/mn_major_b", Needs::Hopper, wgmma_mn);
    for tiles in [1u32, 2, 3, 4, 5, 7, 1000] {
        s.gpu(&format!("pingpong/tiles{tiles}"), Needs::Hopper, move |g| {
            pingpong(g, tiles)
        });
    }
    s.run()
}

fn block_reduce(g: &Gpu, n: usize, blocks: u32) -> TestResult {
    let seed = 1000 + n as u64;
    let input = uniform_f32(&mut rng(seed), n, -1.0, 1.0);
    let stream = gpu_ok(g.stream())?;
    let buf = gpu_ok(upload(&input))?;
    let got = gpu_ok(smoke::block_reduce(g, &stream, &buf, blocks))?;
    let want = smoke::block_reduce_reference(&input, blocks);
    // Error bound of recursive summation: each partial is a serial sum of `terms` values per
    // thread then 8 levels of pairwise adds (5 shuffle, 3 block), so |err| <= (terms + 8) u
    // sum|x| (first order; u = 2^-24).
    let sums: Vec<f64> = want.iter().map(|w| w.0).collect();
    let per_thread = n.div_ceil(blocks as usize * 256);
    check_close(&format!("block sums (seed {seed})"), &got, &sums, |i| {
        (per_thread as f64 + 8.0) * F32_EPS * want[i].1 + 1e-30
    })
}

fn mma_tile(g: &Gpu) -> TestResult {
    let seed = 7;
    let mut r = rng(seed);
    let a = uniform_bf16(&mut r, 64 * 64, -1.0, 1.0);
    let b = uniform_bf16(&mut r, 64 * 64, -1.0, 1.0);
    let stream = gpu_ok(g.stream())?;
    let got = gpu_ok(smoke::mma_tile(
        g,
        &stream,
        &gpu_ok(upload(&a))?,
        &gpu_ok(upload(&b))?,
    ))?;
    let (want, abs) = smoke::matmul_nt_reference(&a, &b, 64, 64, 64);
    // Products of bf16 are exact in f32; 64 f32 additions: |err| <= 64 u sum|a b|.
    check_close(
        &format!("mma_tile on {} (seed {seed})", g.arch()),
        &got,
        &want,
        |i| 64.0 * F32_EPS * abs[i] + 1e-30,
    )
}

fn tma_load(g: &Gpu, x: i32, y: i32, swizzle: MapSwizzle) -> TestResult {
    let (rows, cols) = (100u64, 80u64);
    let tensor = uniform_bf16(&mut rng(11), (rows * cols) as usize, -4.0, 4.0);
    let stream = gpu_ok(g.stream())?;
    let buf = gpu_ok(upload(&tensor))?;
    let got = gpu_ok(smoke::tma_load(g, &stream, &buf, rows, cols, x, y, swizzle))?;
    let want = smoke::tma_load_reference(&tensor, rows as i64, cols as i64, x, y, swizzle);
    let mismatches = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    let first = got.iter().zip(&want).position(|(a, b)| a != b);
    println!(
        "tma box ({x}, {y}) {swizzle:?}: {mismatches} of {} words differ",
        want.len()
    );
    ensure(mismatches == 0, || {
        let i = first.unwrap_or(0);
        format!(
            "{mismatches} words differ; first at word {i}: got {:#06x}, want {:#06x}",
            got[i], want[i]
        )
    })
}

fn wgmma_tile(g: &Gpu, n: u32) -> TestResult {
    let seed = 20 + n as u64;
    let mut r = rng(seed);
    let a = uniform_bf16(&mut r, 64 * 64, -1.0, 1.0);
    let b = uniform_bf16(&mut r, n as usize * 64, -1.0, 1.0);
    let stream = gpu_ok(g.stream())?;
    let got = gpu_ok(smoke::wgmma_tile(
        g,
        &stream,
        n,
        &gpu_ok(upload(&a))?,
        &gpu_ok(upload(&b))?,
    ))?;
    let (want, abs) = smoke::matmul_nt_reference(&a, &b, 64, n as usize, 64);
    check_close(
        &format!("wgmma m64n{n}k64 (seed {seed})"),
        &got,
        &want,
        |i| 64.0 * F32_EPS * abs[i] + 1e-30,
    )
}

fn wgmma_mn(g: &Gpu) -> TestResult {
    let seed = 41;
    let mut r = rng(seed);
    let a = uniform_bf16(&mut r, 64 * 64, -1.0, 1.0);
    let b = uniform_bf16(&mut r, 64 * 128, -1.0, 1.0);
    let stream = gpu_ok(g.stream())?;
    let got = gpu_ok(smoke::wgmma_mn(
        g,
        &stream,
        &gpu_ok(upload(&a))?,
        &gpu_ok(upload(&b))?,
    ))?;
    let (want, abs) = smoke::matmul_nn_reference(&a, &b, 64, 128, 64);
    check_close(
        &format!("wgmma m64n128k64, MN-major B (seed {seed})"),
        &got,
        &want,
        |i| 64.0 * F32_EPS * abs[i] + 1e-30,
    )
}

fn pingpong(g: &Gpu, tiles: u32) -> TestResult {
    let seed = 30 + tiles as u64;
    let input: Vec<bf16> = uniform_bf16(&mut rng(seed), tiles as usize * 4096, -100.0, 100.0);
    let stream = gpu_ok(g.stream())?;
    let got = gpu_ok(smoke::pingpong(g, &stream, &gpu_ok(upload(&input))?, tiles))?;
    let want = smoke::pingpong_reference(&input, tiles);
    let wrong = got
        .out
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    println!(
        "pingpong {tiles} tiles: {wrong} of {} outputs differ",
        want.len()
    );
    ensure(wrong == 0, || {
        format!("{wrong} outputs differ from 2 x + t")
    })?;
    let misordered: Vec<(usize, u32)> = got
        .order
        .iter()
        .enumerate()
        .filter(|(t, o)| **o as usize != *t)
        .map(|(t, o)| (t, *o))
        .take(5)
        .collect();
    ensure(misordered.is_empty(), || {
        format!("ordered section not entered in tile order: (tile, ticket) {misordered:?}")
    })
}
