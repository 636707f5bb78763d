//! Smoke kernels against CPU references: each proves a group of device-layer primitives.

use kernel_tests::{F32_EPS, Needs, Suite, TestResult, check_close, ensure, gpu_ok, portable_gpu};
use kernels::data::{rng, uniform_bf16, uniform_f32};
use kernels::memory::upload;
use kernels::tensor_map::MapSwizzle;
use kernels::{Gpu, bf16};
use kernels_testing::smoke::{self, WGMMA_SMOKE_N};
use rand::Rng;

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
    s.gpu("numerics/default_target", Needs::Gpu, numerics);
    s.gpu(
        "numerics/sm_80_target",
        Needs::Gpu,
        |_| match portable_gpu() {
            Some(g) => numerics(g),
            None => {
                println!("the default target is already sm_80");
                Ok(())
            }
        },
    );
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

/// Whether `x` is a bf16 subnormal.
fn subnormal(x: bf16) -> bool {
    x.classify() == std::num::FpCategory::Subnormal
}

/// `2^e` as a bf16 (exact for e in [-133, 127]).
fn pow2_bf16(e: i32) -> bf16 {
    bf16::from_f64(2f64.powi(e))
}

/// The device's arithmetic on chosen values (`smoke_numerics`), printed next to exact values:
/// what the CPU emulator assumes (and the GLA kernels' stability argument relies on) is
/// asserted: `ex2.approx.ftz` within 2^-21 relative where the result is normal, round to nearest
/// even to bf16 in the normal range, exact products of operands `2^+-101` apart summed in f32,
/// and rows of an mma unaffected by infinities or NaNs in other rows. What the argument
/// tolerates either way (subnormal results of `ex2`, subnormal bf16 conversions and mma inputs,
/// the tensor cores' alignment of small products) is printed only.
fn numerics(g: &Gpu) -> TestResult {
    let x: Vec<f32> = vec![
        0.0,
        -0.5,
        -101.0,
        -115.4,
        -125.9,
        -126.0,
        -126.5,
        -130.0,
        -149.0,
        -202.0,
        101.0,
        2f32.powi(-127),
        1.5 * 2f32.powi(-128),
        2f32.powi(-133),
        2f32.powi(-140),
        1.0 + 2f32.powi(-8),
        3.0 * 2f32.powi(-9) + 1.0,
    ];
    // Probe 0: A[r][k] = a 2^{E_k}, B[k][n] = b 2^{-E_k} with E_k from -101 to 101: order-1
    // products of operands as far apart as the GLA operands.
    let e: [i32; 16] = [
        101, -101, 90, -90, 60, -60, 30, -30, 0, 100, -100, 75, -75, 45, -45, 15,
    ];
    let mut r = rng(11);
    let mut wide = smoke::MmaProbe {
        a: vec![bf16::ZERO; 256],
        b_t: vec![bf16::ZERO; 128],
        c: vec![0.0; 128],
    };
    for row in 0..16 {
        for (k, &ek) in e.iter().enumerate() {
            let v: f32 = r.random_range(0.5..1.0) * if (row + k) % 3 == 0 { -1.0 } else { 1.0 };
            wide.a[row * 16 + k] = bf16::from_f64(v as f64 * 2f64.powi(ek));
        }
    }
    for n in 0..8 {
        for (k, &ek) in e.iter().enumerate() {
            let v: f32 = r.random_range(0.5..1.0);
            wide.b_t[n * 16 + k] = bf16::from_f64(v as f64 * 2f64.powi(-ek));
        }
    }
    // Probe 1: bf16 subnormal B entries (2^-130, 2^-133, ...) times 2^100 in A, next to a
    // normal product of 2^-26: kept, the sums include the 2^-30 and 2^-33 terms; flushed, not.
    let mut sub = smoke::MmaProbe {
        a: vec![pow2_bf16(100); 256],
        b_t: vec![bf16::ZERO; 128],
        c: vec![0.0; 128],
    };
    for n in 0..8 {
        sub.b_t[n * 16] = pow2_bf16(-130);
        sub.b_t[n * 16 + 1] = pow2_bf16(-133);
        sub.b_t[n * 16 + 2] = pow2_bf16(-130 + n as i32);
        sub.b_t[n * 16 + 3] = pow2_bf16(-126);
    }
    // Probe 2: rows 0-7 overflow (2^100 x 2^100, mixed signs: inf and NaN), rows 8-15 are
    // ordinary; as the masked scores of the GLA kernels beside the kept ones.
    let mut ovf = smoke::MmaProbe {
        a: vec![bf16::ZERO; 256],
        b_t: vec![bf16::ZERO; 128],
        c: vec![0.0; 128],
    };
    for row in 0..16 {
        for k in 0..16 {
            ovf.a[row * 16 + k] = if row < 8 {
                pow2_bf16(100) * bf16::from_f32(if k % 2 == 0 { 1.0 } else { -1.0 })
            } else {
                bf16::from_f32(r.random_range(-1.0..1.0))
            };
        }
    }
    for n in 0..8 {
        for k in 0..16 {
            ovf.b_t[n * 16 + k] = if k < 4 {
                pow2_bf16(100)
            } else {
                bf16::from_f32(r.random_range(-1.0..1.0))
            };
        }
    }
    // Probe 3: the accumulator 1 plus products of 2^-20 .. 2^-35: how the tensor cores align
    // small products to a large accumulator (printed only).
    let mut align = smoke::MmaProbe {
        a: vec![bf16::ZERO; 256],
        b_t: vec![bf16::ZERO; 128],
        c: vec![1.0; 128],
    };
    for row in 0..16 {
        for k in 0..16 {
            align.a[row * 16 + k] = pow2_bf16(-20 - (row as i32 + k as i32) % 16);
        }
    }
    for n in 0..8 {
        for k in 0..16 {
            align.b_t[n * 16 + k] = bf16::from_f32(1.0 + n as f32 / 8.0);
        }
    }
    let probes = [wide, sub, ovf, align];
    let stream = gpu_ok(g.stream())?;
    let got = gpu_ok(smoke::numerics(g, &stream, &x, &probes))?;
    println!("device {}", g.arch());
    let mut ok = true;
    for (i, &xi) in x.iter().enumerate() {
        let want = 2f64.powf(xi as f64);
        let e2 = got.ex2[i];
        let normal = want >= 2f64.powi(-126) && want < f32::MAX as f64;
        let rel = (e2 as f64 - want).abs() / want;
        let cvt_want = bf16::from_f32(xi);
        println!(
            "  x = {xi:e}: ex2 {e2:e} (2^x = {want:e}{}), bf16 {:#06x} (round to nearest {:#06x}{})",
            if normal {
                format!(", rel err {rel:.1e}")
            } else if e2 == 0.0 {
                ", flushed".to_string()
            } else {
                ", kept subnormal".to_string()
            },
            got.bf16[i].to_bits(),
            cvt_want.to_bits(),
            if subnormal(cvt_want) {
                if got.bf16[i] == cvt_want {
                    ", subnormal kept"
                } else {
                    ", subnormal NOT kept"
                }
            } else {
                ""
            },
        );
        ok &= !normal || rel <= 2f64.powi(-21);
        ok &= subnormal(cvt_want) || got.bf16[i] == cvt_want;
    }
    let exact = |p: &smoke::MmaProbe, row: usize, n: usize, skip_sub: bool| -> (f64, f64) {
        let (mut s, mut abs) = (p.c[row * 8 + n] as f64, (p.c[row * 8 + n] as f64).abs());
        for k in 0..16 {
            let (a, b) = (p.a[row * 16 + k], p.b_t[n * 16 + k]);
            if skip_sub && (subnormal(a) || subnormal(b)) {
                continue;
            }
            let prod = a.to_f64() * b.to_f64();
            s += prod;
            abs += prod.abs();
        }
        (s, abs)
    };
    // Probe 0: every element within 16 f32 roundings of the sum of |products|.
    let mut worst = 0.0f64;
    for row in 0..16 {
        for n in 0..8 {
            let (want, abs) = exact(&probes[0], row, n, false);
            worst = worst.max((got.d[0][row * 8 + n] as f64 - want).abs() / abs);
        }
    }
    println!("  mma, operands 2^+-101 apart: worst |d - exact| / sum|a b| = {worst:.1e}");
    ok &= worst <= 16.0 * F32_EPS;
    for n in 0..3 {
        let d = got.d[1][n] as f64;
        let (with, _) = exact(&probes[1], 0, n, false);
        let (without, _) = exact(&probes[1], 0, n, true);
        println!(
            "  mma, bf16 subnormal inputs x 2^100 (column {n}): d = {d:e}, exact {with:e}, \
             without the subnormal products {without:e}: subnormal inputs {}",
            if (d - with).abs() <= (d - without).abs() {
                "kept"
            } else {
                "flushed"
            }
        );
    }
    let mut rows_ok = true;
    for row in 8..16 {
        for n in 0..8 {
            let (want, abs) = exact(&probes[2], row, n, false);
            let d = got.d[2][row * 8 + n] as f64;
            rows_ok &= d.is_finite() && (d - want).abs() <= 16.0 * F32_EPS * abs;
        }
    }
    println!(
        "  mma, rows 0-7 overflowing (d[0][0] = {}): rows 8-15 {}",
        got.d[2][0],
        if rows_ok { "exact" } else { "WRONG" }
    );
    ok &= rows_ok;
    for row in [0usize, 5, 15] {
        let (want, _) = exact(&probes[3], row, 1, false);
        let d = got.d[3][row * 8 + 1] as f64;
        println!(
            "  mma, 1 + small products (row {row}): d - exact = {:.2} x 2^-24",
            (d - want) / F32_EPS
        );
    }
    ensure(ok, || {
        "the device's arithmetic differs from what the emulator assumes (see above)".into()
    })
}
