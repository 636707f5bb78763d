//! Tests that need no GPU: the PTX embedded in this build, host-side validation, references.

use kernel_abi::TensorMap;
use kernel_abi::attention::{self, Dtype};
use kernel_abi::smoke::*;
use kernel_abi::{gla, semicrf};
use kernel_tests::{Suite, TestResult, ensure};
use kernels::tensor_map::{MapDtype, MapSwizzle, TiledMap};
use kernels::{Arch, Error};
use std::mem::size_of;

/// The kernels' f64 `exp` and `ln` (plain Rust over `fma`), compiled here from the same file.
#[path = "../gpu-kernels/src/arch/math64.rs"]
mod math64;

fn main() {
    let mut s = Suite::new();
    s.cpu(
        "ptx/kernels_and_parameter_sizes",
        ptx_kernels_and_parameter_sizes,
    );
    s.cpu("ptx/launch_bounds_match_abi", ptx_launch_bounds);
    s.cpu(
        "ptx/tensor_map_params_are_64_aligned",
        ptx_tensor_map_alignment,
    );
    s.cpu("ptx/arch_selection", arch_selection);
    s.cpu("arch/f64_exp_ln_accuracy", f64_exp_ln);
    s.cpu("tensor_map/rejects_bad_maps", tensor_map_validation);
    s.cpu(
        "smoke/swizzle_reference_is_a_permutation",
        swizzle_permutation,
    );
    s.run()
}

/// The `mma.sync` attention kernels: the default tiles of each dtype and head dimension, then
/// the tuning variants (bf16), each with the threads of its tile configuration.
fn attention_mma_kernels() -> Vec<(&'static str, u32)> {
    let mut k = Vec::new();
    for dtype in [Dtype::Bf16, Dtype::F16] {
        for d in attention::HEAD_DIMS {
            let kernel = attention::mma_kernel(dtype, d, None).expect("a default mma.sync kernel");
            let cfg = attention::tile_config(d).expect("a tile configuration");
            k.push((kernel.kernel.name, cfg.threads()));
        }
    }
    for (name, cfg) in attention::TUNING_VARIANTS {
        let kernel = attention::mma_kernel(Dtype::Bf16, cfg.head_dim, Some(name))
            .expect("a kernel for every tuning variant");
        k.push((kernel.kernel.name, cfg.threads()));
    }
    k
}

/// The Hopper attention kernels (sm_90a only): the default configuration of each dtype and head
/// dimension that has one (64, 128, 256), then the tuning variants (bf16).
fn attention_hopper_kernels() -> Vec<&'static str> {
    let mut k = Vec::new();
    for dtype in [Dtype::Bf16, Dtype::F16] {
        for d in attention::HEAD_DIMS {
            match attention::hopper_kernel(dtype, d, None) {
                Some(kernel) => k.push(kernel.kernel.name),
                None => panic!("no default Hopper kernel at D = {d}"),
            }
        }
    }
    for (name, cfg) in attention::HOPPER_VARIANTS {
        let kernel = attention::hopper_kernel(Dtype::Bf16, cfg.head_dim, Some(name))
            .expect("a kernel for every Hopper tuning variant");
        k.push(kernel.kernel.name);
    }
    k
}

/// The baseline GLA kernels `gla_fwd`, `gla_states` of every pair of head dimensions, with the
/// threads of its configuration.
fn gla_baseline_kernels() -> Vec<(&'static str, u32)> {
    let mut k = Vec::new();
    for dk in gla::HEAD_DIMS {
        for dv in gla::HEAD_DIMS {
            let (fwd, states) = gla::baseline_kernels(dk, dv).expect("GLA kernels");
            let threads = gla::config(dk, dv).expect("a GLA configuration").threads();
            k.push((fwd.name, threads));
            k.push((states.name, threads));
        }
    }
    k
}

/// The kernels the host launches, per target, with the parameter struct each takes.
fn expected_kernels(arch: Arch) -> Vec<(&'static str, usize)> {
    let mut k: Vec<(&'static str, usize)> = vec![
        (SMOKE_BLOCK_REDUCE.name, size_of::<ReduceParams>()),
        (SMOKE_MMA_TILE.name, size_of::<MmaTileParams>()),
    ];
    k.extend(
        mhc_kernels()
            .into_iter()
            .map(|(name, params, _)| (name, params)),
    );
    k.extend([
        (semicrf::SEMICRF_SCAN.name, size_of::<semicrf::ScanParams>()),
        (
            semicrf::SEMICRF_VITERBI.name,
            size_of::<semicrf::ViterbiParams>(),
        ),
        (
            semicrf::SEMICRF_MARGINALS.name,
            size_of::<semicrf::MarginalParams>(),
        ),
        (
            semicrf::SEMICRF_REDUCE.name,
            size_of::<semicrf::ReduceParams>(),
        ),
    ]);
    let params = size_of::<attention::AttentionParams>();
    k.extend(
        attention_mma_kernels()
            .into_iter()
            .map(|(n, _)| (n, params)),
    );
    if arch.has_hopper_kernels() {
        let params = size_of::<attention::HopperParams>();
        k.extend(attention_hopper_kernels().into_iter().map(|n| (n, params)));
    }
    let params = size_of::<gla::GlaParams>();
    k.extend(gla_baseline_kernels().into_iter().map(|(n, _)| (n, params)));
    k.push((gla::GLA_COMBINE.name, size_of::<gla::CombineParams>()));
    if arch.has_hopper_kernels() {
        k.extend([
            (
                kernel_abi::gemm::GEMM_BF16_TN.name,
                size_of::<kernel_abi::gemm::GemmParams>(),
            ),
            (SMOKE_TMA_LOAD.name, size_of::<TmaLoadParams>()),
            (SMOKE_WGMMA_N64.name, size_of::<WgmmaTileParams>()),
            (SMOKE_WGMMA_N128.name, size_of::<WgmmaTileParams>()),
            (SMOKE_WGMMA_N256.name, size_of::<WgmmaTileParams>()),
            (SMOKE_WGMMA_MN.name, size_of::<WgmmaMnParams>()),
            (SMOKE_PINGPONG.name, size_of::<PingpongParams>()),
        ]);
    }
    k
}

/// The mHC kernels (portable: in every target), with their parameter struct and block size.
fn mhc_kernels() -> Vec<(&'static str, usize, u32)> {
    kernel_abi::mhc::KERNELS
        .iter()
        .map(|k| (k.name, k.param_bytes, k.threads))
        .collect()
}

fn ptx_kernels_and_parameter_sizes() -> TestResult {
    for arch in Arch::ALL {
        let kernels = arch.kernels();
        for (name, bytes) in expected_kernels(arch) {
            let info = kernels
                .get(name)
                .ok_or(format!("{name} missing from the {arch} PTX"))?;
            ensure(info.params == [bytes], || {
                format!(
                    "{arch} {name}: PTX params {:?}, host struct {bytes} bytes",
                    info.params
                )
            })?;
        }
        println!(
            "{arch}: {} kernels, all expected ones present",
            kernels.len()
        );
    }
    ensure(
        !Arch::Sm80.kernels().contains_key(SMOKE_WGMMA_N64.name),
        || "Hopper kernels must not be in the sm_80 PTX".into(),
    )
}

fn ptx_launch_bounds() -> TestResult {
    let mut bounds: Vec<(&'static str, u32)> = vec![
        (gla::GLA_COMBINE.name, gla::COMBINE_THREADS),
        (SMOKE_BLOCK_REDUCE.name, REDUCE_THREADS),
        (SMOKE_MMA_TILE.name, MMA_THREADS),
        (SMOKE_PINGPONG.name, PINGPONG_THREADS),
        (
            kernel_abi::gemm::GEMM_BF16_TN.name,
            kernel_abi::gemm::THREADS,
        ),
        (semicrf::SEMICRF_SCAN.name, semicrf::THREADS),
        (semicrf::SEMICRF_VITERBI.name, semicrf::THREADS),
        (semicrf::SEMICRF_MARGINALS.name, semicrf::THREADS),
        (semicrf::SEMICRF_REDUCE.name, semicrf::REDUCE_THREADS),
    ];
    bounds.extend(attention_mma_kernels());
    bounds.extend(
        attention_hopper_kernels()
            .into_iter()
            .map(|n| (n, attention::HOPPER_THREADS)),
    );
    bounds.extend(gla_baseline_kernels());
    bounds.extend(
        mhc_kernels()
            .into_iter()
            .map(|(name, _, threads)| (name, threads)),
    );
    for (name, threads) in bounds {
        for arch in Arch::ALL {
            if let Some(info) = arch.kernels().get(name) {
                ensure(info.max_threads == Some(threads), || {
                    format!(
                        "{arch} {name}: .maxntid {:?}, expected {threads}",
                        info.max_threads
                    )
                })?;
            }
        }
    }
    Ok(())
}

fn ptx_tensor_map_alignment() -> TestResult {
    let ptx = Arch::Sm90a.ptx();
    let hopper = |dtype, d| {
        attention::hopper_kernel(dtype, d, None)
            .expect("a default Hopper kernel")
            .kernel
            .name
    };
    for kernel in [
        SMOKE_TMA_LOAD.name,
        SMOKE_WGMMA_N64.name,
        SMOKE_WGMMA_MN.name,
        SMOKE_PINGPONG.name,
        kernel_abi::gemm::GEMM_BF16_TN.name,
        hopper(Dtype::Bf16, 128),
        hopper(Dtype::F16, 256),
    ] {
        let decl = format!(".param .align 64 .b8 {kernel}_param_0[");
        ensure(ptx.contains(&decl), || {
            format!("{kernel}: parameter not declared .align 64")
        })?;
    }
    ensure(size_of::<TensorMap>() == 128, || {
        "TensorMap is not 128 bytes".into()
    })
}

fn arch_selection() -> TestResult {
    ensure(Arch::for_device(9, 0) == Some(Arch::Sm90a), || {
        "9.0 -> sm_90a".into()
    })?;
    ensure(Arch::for_device(8, 0) == Some(Arch::Sm80), || {
        "8.0 -> sm_80".into()
    })?;
    ensure(Arch::for_device(8, 9) == Some(Arch::Sm80), || {
        "8.9 -> sm_80".into()
    })?;
    ensure(Arch::for_device(10, 0) == Some(Arch::Sm80), || {
        "10.0 -> sm_80 (sm_90a is 9.0-only)".into()
    })?;
    ensure(Arch::for_device(7, 5).is_none(), || {
        "7.5 has no target".into()
    })
}

fn tensor_map_validation() -> TestResult {
    let ok = TiledMap {
        address: 0x1000,
        dtype: MapDtype::Bf16,
        dims: &[64, 64],
        strides_bytes: &[128],
        box_dims: &[64, 64],
        swizzle: MapSwizzle::B128,
    };
    let cases: Vec<(&str, TiledMap)> = vec![
        (
            "misaligned base",
            TiledMap {
                address: 0x1008,
                ..ok.clone()
            },
        ),
        (
            "misaligned stride",
            TiledMap {
                strides_bytes: &[120],
                ..ok.clone()
            },
        ),
        (
            "box over 256",
            TiledMap {
                box_dims: &[64, 512],
                ..ok.clone()
            },
        ),
        (
            "inner box past swizzle span",
            TiledMap {
                box_dims: &[128, 64],
                ..ok.clone()
            },
        ),
        (
            "rank mismatch",
            TiledMap {
                strides_bytes: &[],
                ..ok.clone()
            },
        ),
        (
            "zero extent",
            TiledMap {
                dims: &[64, 0],
                ..ok.clone()
            },
        ),
        (
            "inner box not 16 bytes",
            TiledMap {
                box_dims: &[4, 64],
                swizzle: MapSwizzle::None,
                ..ok.clone()
            },
        ),
    ];
    for (what, map) in cases {
        match map.encode() {
            Err(Error::InvalidArgument { .. } | Error::Misaligned { .. }) => {}
            other => {
                return Err(format!("{what}: expected a validation error, got {other:?}").into());
            }
        }
    }
    Ok(())
}

fn swizzle_permutation() -> TestResult {
    use kernels_testing::smoke::swizzled_offset;
    for sw in [
        MapSwizzle::None,
        MapSwizzle::B32,
        MapSwizzle::B64,
        MapSwizzle::B128,
    ] {
        let mut seen = vec![false; 8192];
        for o in (0..8192).step_by(2) {
            let s = swizzled_offset(o, sw);
            ensure(s < 8192 && !seen[s], || {
                format!("{sw:?}: offset {o} maps to {s} twice")
            })?;
            seen[s] = true;
        }
    }
    ensure(swizzled_offset(128 + 16, MapSwizzle::B128) == 128, || {
        "row 1 chunk 1 -> chunk 0".into()
    })
}

/// `arch::math64::{exp, ln}` against the standard library: within 4 ulp-sized relative errors
/// (2^-50) over their ranges, and the special values.
fn f64_exp_ln() -> TestResult {
    let mut rng = kernels::data::rng(64);
    let rel = |got: f64, want: f64| ((got - want) / want).abs();
    let (mut worst_exp, mut worst_ln) = (0.0f64, 0.0f64);
    for i in 0..200_000 {
        let u = kernels::data::uniform_f32(&mut rng, 2, 0.0, 1.0);
        let (a, b) = (u[0] as f64, u[1] as f64 * 1e-7);
        // exp: the scans' arguments are x - max <= 0, mostly within [-40, 0]; cover the range.
        let x = if i % 4 == 0 {
            -708.0 * a
        } else {
            -40.0 * a + 2.0 * b - 1e-7
        };
        worst_exp = worst_exp.max(rel(math64::exp(x), x.exp()));
        // ln: sums of exponentials are in [1, K]; cover (0, inf) too.
        let y = if i % 4 == 0 {
            (a * 1400.0 - 700.0).exp()
        } else {
            1.0 + 64.0 * a + b
        };
        if (y.ln()).abs() > 1e-300 {
            worst_ln = worst_ln.max(rel(math64::ln(y), y.ln()));
        }
    }
    for x in [
        0.0, -1e-300, 1e-10, -0.5, 0.5, -1.0, 1.0, 700.0, -700.0, -708.0,
    ] {
        worst_exp = worst_exp.max(rel(math64::exp(x), x.exp()));
    }
    for y in [
        f64::MIN_POSITIVE,
        5e-324,
        1e-310,
        0.5,
        2.0,
        std::f64::consts::SQRT_2,
        1e300,
    ] {
        worst_ln = worst_ln.max(rel(math64::ln(y), y.ln()));
    }
    println!("exp: max relative error {worst_exp:.3e}; ln: {worst_ln:.3e}");
    let tol = 2f64.powi(-50);
    ensure(worst_exp <= tol && worst_ln <= tol, || {
        format!("exp {worst_exp:.3e}, ln {worst_ln:.3e} > {tol:.3e}")
    })?;
    ensure(
        math64::exp(f64::NEG_INFINITY) == 0.0
            && math64::exp(-800.0) == 0.0
            && math64::exp(800.0) == f64::INFINITY
            && math64::exp(f64::NAN).is_nan()
            && math64::exp(0.0) == 1.0
            && math64::ln(0.0) == f64::NEG_INFINITY
            && math64::ln(-1.0).is_nan()
            && math64::ln(f64::NAN).is_nan()
            && math64::ln(f64::INFINITY) == f64::INFINITY
            && math64::ln(1.0) == 0.0,
        || "special values".into(),
    )
}
