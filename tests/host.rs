//! Tests that need no GPU: the PTX embedded in this build, host-side validation, references.

use kernel_abi::TensorMap;
use kernel_abi::semicrf;
use kernel_abi::smoke::*;
use kernel_tests::{Suite, TestResult, ensure};
use kernels::tensor_map::{MapDtype, MapSwizzle, TiledMap};
use kernels::{Arch, Error};
use std::mem::size_of;

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
    s.cpu("tensor_map/rejects_bad_maps", tensor_map_validation);
    s.cpu(
        "smoke/swizzle_reference_is_a_permutation",
        swizzle_permutation,
    );
    s.run()
}

/// The kernels the host launches, per target, with the parameter struct each takes.
fn expected_kernels(arch: Arch) -> Vec<(&'static str, usize)> {
    let mut k = vec![
        ("smoke_block_reduce", size_of::<ReduceParams>()),
        ("smoke_mma_tile", size_of::<MmaTileParams>()),
        ("semicrf_scan", size_of::<semicrf::ScanParams>()),
        ("semicrf_viterbi", size_of::<semicrf::ViterbiParams>()),
        ("semicrf_marginals", size_of::<semicrf::MarginalParams>()),
        ("semicrf_reduce", size_of::<semicrf::ReduceParams>()),
    ];
    let attention = size_of::<kernel_abi::attention::AttentionParams>();
    for dtype in ["bf16", "f16"] {
        for d in kernel_abi::attention::HEAD_DIMS {
            k.push((leak(format!("attention_fwd_{dtype}_d{d}")), attention));
        }
    }
    let gla = size_of::<kernel_abi::gla::GlaParams>();
    for dk in kernel_abi::gla::HEAD_DIMS {
        for dv in kernel_abi::gla::HEAD_DIMS {
            k.push((leak(format!("gla_fwd_dk{dk}_dv{dv}")), gla));
            k.push((leak(format!("gla_states_dk{dk}_dv{dv}")), gla));
        }
    }
    k.push(("gla_combine", size_of::<kernel_abi::gla::CombineParams>()));
    for (name, cfg) in kernel_abi::attention::TUNING_VARIANTS {
        k.push((
            leak(format!("attention_fwd_bf16_d{}_{name}", cfg.head_dim)),
            attention,
        ));
    }
    if arch.has_hopper_kernels() {
        k.extend([
            ("gemm_bf16_tn", size_of::<kernel_abi::gemm::GemmParams>()),
            ("smoke_tma_load", size_of::<TmaLoadParams>()),
            ("smoke_wgmma_n64", size_of::<WgmmaTileParams>()),
            ("smoke_wgmma_n128", size_of::<WgmmaTileParams>()),
            ("smoke_wgmma_n256", size_of::<WgmmaTileParams>()),
            ("smoke_wgmma_mn", size_of::<WgmmaMnParams>()),
            ("smoke_pingpong", size_of::<PingpongParams>()),
        ]);
    }
    k
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
        !Arch::Sm80.kernels().contains_key("smoke_wgmma_n64"),
        || "Hopper kernels must not be in the sm_80 PTX".into(),
    )
}

/// A kernel name for the expected-kernel table (test-only, a handful of small strings).
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn ptx_launch_bounds() -> TestResult {
    for d in kernel_abi::attention::HEAD_DIMS {
        let cfg = kernel_abi::attention::tile_config(d).ok_or("missing tile config")?;
        for arch in Arch::ALL {
            let name = format!("attention_fwd_bf16_d{d}");
            let info = arch.kernels().get(&name).ok_or(format!("{name} missing"))?;
            ensure(info.max_threads == Some(cfg.threads()), || {
                format!("{arch} {name}: .maxntid {:?}", info.max_threads)
            })?;
        }
    }
    for dk in kernel_abi::gla::HEAD_DIMS {
        for dv in kernel_abi::gla::HEAD_DIMS {
            let cfg = kernel_abi::gla::config(dk, dv).ok_or("missing GLA config")?;
            for kind in ["fwd", "states"] {
                let name = format!("gla_{kind}_dk{dk}_dv{dv}");
                for arch in Arch::ALL {
                    let info = arch.kernels().get(&name).ok_or(format!("{name} missing"))?;
                    ensure(info.max_threads == Some(cfg.threads()), || {
                        format!("{arch} {name}: .maxntid {:?}", info.max_threads)
                    })?;
                }
            }
        }
    }
    let bounds = [
        ("gla_combine", kernel_abi::gla::COMBINE_THREADS),
        ("smoke_block_reduce", REDUCE_THREADS),
        ("smoke_mma_tile", MMA_THREADS),
        ("smoke_pingpong", PINGPONG_THREADS),
        ("gemm_bf16_tn", kernel_abi::gemm::THREADS),
        ("semicrf_scan", semicrf::THREADS),
        ("semicrf_viterbi", semicrf::THREADS),
        ("semicrf_marginals", semicrf::THREADS),
        ("semicrf_reduce", semicrf::REDUCE_THREADS),
    ];
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
    for kernel in [
        "smoke_tma_load",
        "smoke_wgmma_n64",
        "smoke_pingpong",
        "gemm_bf16_tn",
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
    use kernels::smoke::swizzled_offset;
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
