//! CPU tests of the handles and the plan: every handle against the PTX of each architecture,
//! the path and kernel chosen for each option, grids, parameters and tensor maps.

use super::*;
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::gpu::check_kernel_launch;
use crate::ptx::Arch;
use crate::tensor_map::MapSpec;
use half::{bf16, f16};
use kernel_abi::attention::backward::BWD_KERNEL_COUNT;
use kernel_abi::attention::{
    HOPPER_BLOCK_M, HOPPER_KERNELS, HOPPER_LONG_KEYS_VARIANT, HOPPER_VALUE_DIM_KERNELS,
    HOPPER_VARIANTS, HOPPER_VARLEN_KERNELS, HopperGrid, KERNELS, MMA_KERNELS,
    MMA_VALUE_DIM_KERNELS, MMA_VARLEN_KERNELS, TUNING_VARIANTS, UNBOUNDED, VALUE_DIMS,
    hopper_bwd::HOPPER_BWD_KERNEL_COUNT, hopper_config, hopper_varlen_kernel, tile_config,
};

/// The most dynamic shared memory a block may have on the GPUs the tests assume (H100, H200).
const MAX_SMEM: usize = 227 * 1024;
/// Multiprocessors of the target in these tests.
const SMS: u32 = 132;

fn target(arch: Arch) -> Target {
    Target {
        arch,
        multiprocessors: SMS,
    }
}

fn dev<'a, T>(addr: u64, len: usize) -> DevView<'a, T> {
    // SAFETY: only planned, never dereferenced.
    unsafe { DevView::from_raw(addr, len) }
}

/// Contiguous tensors of `p` at made-up, well-aligned addresses.
fn tensors<'a, T>(p: &AttentionProblem) -> AttentionTensors<'a, T> {
    let n = |shape: [usize; 4]| shape.iter().product();
    AttentionTensors {
        q: View::contiguous(dev(1 << 40, n(p.q_shape())), p.q_shape()),
        k: View::contiguous(dev(2 << 40, n(p.kv_shape())), p.kv_shape()),
        v: View::contiguous(dev(3 << 40, n(p.v_shape())), p.v_shape()),
        o: View::contiguous(dev(4 << 40, n(p.o_shape())), p.o_shape()),
        lse: dev(5 << 40, p.lse_len()),
        sinks: p.sinks.then(|| dev(6 << 40, p.heads_q)),
        tile_counter: None,
    }
}

fn plan(p: &AttentionProblem, arch: Arch, variant: Option<&str>) -> Result<AttentionPlan> {
    plan_with_counter(p, arch, variant, None)
}

/// [`plan`] with the tile counter `counter` (address, length).
fn plan_with_counter(
    p: &AttentionProblem,
    arch: Arch,
    variant: Option<&str>,
    counter: Option<(u64, usize)>,
) -> Result<AttentionPlan> {
    let counter = counter.map(|(addr, len)| dev(addr, len));
    match p.dtype {
        Dtype::Bf16 => {
            let t = AttentionTensors {
                tile_counter: counter,
                ..tensors::<bf16>(p)
            };
            p.plan(target(arch), &t, variant)
        }
        Dtype::F16 => {
            let t = AttentionTensors {
                tile_counter: counter,
                ..tensors::<f16>(p)
            };
            p.plan(target(arch), &t, variant)
        }
    }
}

/// The plan's launch passes the checks against the PTX of `arch` and the device limits.
fn check(plan: &AttentionPlan, arch: Arch) {
    check_kernel_launch(arch, &plan.kernel(), &plan.config(), MAX_SMEM)
        .unwrap_or_else(|e| panic!("{}: {e}", plan.kernel().name));
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Bf16 => "bf16",
        Dtype::F16 => "f16",
    }
}

#[test]
fn every_entry_of_the_ptx_has_its_handle() {
    for arch in [Arch::Sm90a, Arch::Sm80] {
        for name in arch.kernels().keys() {
            if name.starts_with("attention_") {
                assert!(
                    KERNELS.iter().any(|k| k.name == name),
                    "{name} ({arch}) has no handle"
                );
            }
        }
        for k in KERNELS {
            let hopper = k.name.starts_with("attention_fwd_hopper_")
                || k.name.starts_with("attention_bwd_hopper_");
            if hopper && arch == Arch::Sm80 {
                assert!(arch.kernels().get(k.name).is_none(), "{} on sm_80", k.name);
                continue;
            }
            // The entry, its parameter size and launch bounds (a one-block launch).
            let cfg = crate::gpu::LaunchConfig::new((1, 1, 1), k.threads, 0);
            check_kernel_launch(arch, k, &cfg, MAX_SMEM)
                .unwrap_or_else(|e| panic!("{} ({arch}): {e}", k.name));
        }
    }
    assert_eq!(
        KERNELS.len(),
        // Defaults and capsink kernels: mma.sync and Hopper at every head dimension, two
        // element types each.
        2 * (2 * HEAD_DIMS.len())
            + 2 * (2 * HEAD_DIMS.len())
            + TUNING_VARIANTS.len()
            + HOPPER_VARIANTS.len()
            + kernel_abi::attention::HOPPER_F16_VARIANTS
            + BWD_KERNEL_COUNT
            + MMA_VARLEN_KERNELS.len()
            + HOPPER_VARLEN_KERNELS.len()
            + HOPPER_VALUE_DIM_KERNELS.len()
            + MMA_VALUE_DIM_KERNELS.len()
            + kernel_abi::attention::MMA_VARLEN_VALUE_DIM_KERNELS.len()
            + HOPPER_BWD_KERNEL_COUNT
            + kernel_abi::attention::decode::DECODE_KERNEL_COUNT
            + kernel_abi::attention::fp8::FP8_KERNEL_COUNT
    );
}

#[test]
fn handles_are_named_by_dtype_head_dim_and_variant() {
    for k in &MMA_KERNELS {
        let mut want = format!(
            "attention_fwd_{}{}_d{}",
            if k.capsink { "capsink_" } else { "" },
            dtype_name(k.dtype),
            k.tiles.head_dim
        );
        match k.variant {
            None => assert_eq!(Some(k.tiles), tile_config(k.tiles.head_dim)),
            Some(v) => {
                want = format!("{want}_{v}");
                assert!(TUNING_VARIANTS.contains(&(v, k.tiles)));
            }
        }
        assert_eq!(k.kernel.name, want);
        assert_eq!(
            (k.kernel.threads, k.kernel.min_blocks),
            (k.tiles.threads(), k.tiles.blocks_per_sm)
        );
        assert_eq!(k.kernel.smem_bytes(k.tiles), k.tiles.smem_bytes());
    }
    for k in &HOPPER_KERNELS {
        let mut want = format!(
            "attention_fwd_hopper_{}{}_d{}",
            if k.capsink { "capsink_" } else { "" },
            dtype_name(k.dtype),
            k.cfg.head_dim
        );
        match k.variant {
            None => assert_eq!(Some(k.cfg), hopper_config(k.cfg.head_dim)),
            Some(v) => {
                want = format!("{want}_{v}");
                assert!(HOPPER_VARIANTS.contains(&(v, k.cfg)));
            }
        }
        assert_eq!(k.kernel.name, want);
        assert_eq!(k.kernel.smem_bytes(k.cfg), k.cfg.smem_bytes());
    }
}

#[test]
fn the_path_follows_the_arch_and_the_option() {
    for dtype in [Dtype::Bf16, Dtype::F16] {
        for d in [64, 128, 256] {
            let p = AttentionProblem::new(2, 113, 203, 4, 2, d, dtype);
            let want = |hopper: bool| {
                let dt = dtype_name(dtype);
                if hopper {
                    format!("attention_fwd_hopper_{dt}_d{d}")
                } else {
                    format!("attention_fwd_{dt}_d{d}")
                }
            };
            // Auto: Hopper where the arch has it.
            let h = plan(&p, Arch::Sm90a, None).unwrap();
            assert!(h.is_hopper());
            assert_eq!(h.kernel().name, want(true));
            check(&h, Arch::Sm90a);
            let m = plan(&p, Arch::Sm80, None).unwrap();
            assert!(!m.is_hopper());
            assert_eq!(m.kernel().name, want(false));
            check(&m, Arch::Sm80);
            // Forced paths.
            let m = plan(&p.clone().path(Path::MmaSync), Arch::Sm90a, None).unwrap();
            assert_eq!(m.kernel().name, want(false));
            check(&m, Arch::Sm90a);
            let h = plan(&p.clone().path(Path::Hopper), Arch::Sm90a, None).unwrap();
            assert_eq!(h.kernel().name, want(true));
            assert!(matches!(
                plan(&p.clone().path(Path::Hopper), Arch::Sm80, None),
                Err(Error::Unsupported { .. })
            ));
        }
    }
}

/// Every head dimension has a Hopper kernel (one that is not a multiple of 64 with its last
/// column block partly zero-filled): Auto takes it on sm_90a and the `mma.sync` kernel on sm_80.
#[test]
fn every_head_dim_has_a_hopper_kernel() {
    for d in HEAD_DIMS {
        let p = AttentionProblem::new(1, 40, 40, 2, 1, d as usize, Dtype::Bf16);
        let h = plan(&p, Arch::Sm90a, None).unwrap();
        assert!(h.is_hopper());
        assert_eq!(h.kernel().name, format!("attention_fwd_hopper_bf16_d{d}"));
        let m = plan(&p, Arch::Sm80, None).unwrap();
        assert_eq!(m.kernel().name, format!("attention_fwd_bf16_d{d}"));
    }
}

#[test]
fn strides_no_tensor_map_takes_fall_back_to_mma_sync() {
    // A batch stride of 2^40 bytes: a valid view, beyond what a tensor map describes.
    let p = AttentionProblem::new(2, 64, 64, 1, 1, 64, Dtype::Bf16);
    let mut t = tensors::<bf16>(&p);
    let stride = 1usize << 39;
    t.k = View::new(
        dev(2 << 40, 2 * stride),
        0,
        &p.kv_shape(),
        &[stride, 64, 64, 1],
    )
    .unwrap();
    let m = p.plan(target(Arch::Sm90a), &t, None).unwrap();
    assert_eq!(m.kernel().name, "attention_fwd_bf16_d64");
    let AttentionPlan::MmaSync { launch, .. } = &m else {
        panic!("not the mma.sync path")
    };
    assert_eq!(launch.params().k_strides, [stride as u64, 64, 64]);
    assert!(matches!(
        p.clone()
            .path(Path::Hopper)
            .plan(target(Arch::Sm90a), &t, None),
        Err(Error::Misaligned { .. })
    ));
}

#[test]
fn tuning_variants_by_name() {
    for (name, cfg) in TUNING_VARIANTS {
        let d = cfg.head_dim as usize;
        let p = AttentionProblem::new(1, 100, 300, 2, 1, d, Dtype::Bf16);
        for arch in [Arch::Sm90a, Arch::Sm80] {
            // The variant's own path, whatever `path` says.
            for path in [Path::Auto, Path::Hopper] {
                let m = plan(&p.clone().path(path), arch, Some(name)).unwrap();
                let AttentionPlan::MmaSync { kernel, .. } = &m else {
                    panic!("{name}: not the mma.sync path")
                };
                assert_eq!((kernel.variant, kernel.tiles), (Some(name), cfg));
                check(&m, arch);
            }
        }
        let f16 = AttentionProblem::new(1, 100, 300, 2, 1, d, Dtype::F16);
        assert!(matches!(
            plan(&f16, Arch::Sm90a, Some(name)),
            Err(Error::Unsupported { .. })
        ));
        let other_d = AttentionProblem::new(1, 100, 300, 2, 1, 64, Dtype::Bf16);
        assert!(matches!(
            plan(&other_d, Arch::Sm90a, Some(name)),
            Err(Error::Unsupported { .. })
        ));
    }
    for (name, cfg) in HOPPER_VARIANTS {
        let d = cfg.head_dim as usize;
        let p = AttentionProblem::new(1, 100, 300, 2, 1, d, Dtype::Bf16);
        let h = plan(&p.clone().path(Path::MmaSync), Arch::Sm90a, Some(name)).unwrap();
        let AttentionPlan::Hopper { kernel, .. } = &h else {
            panic!("{name}: not the Hopper path")
        };
        assert_eq!((kernel.variant, kernel.cfg), (Some(name), cfg));
        check(&h, Arch::Sm90a);
        assert!(matches!(
            plan(&p, Arch::Sm80, Some(name)),
            Err(Error::Unsupported { .. })
        ));
        // In f16 only the variants the plan picks by the problem are built: the dynamic grid
        // and the long key steps.
        let f16 = AttentionProblem::new(1, 100, 300, 2, 1, d, Dtype::F16);
        let picked = cfg.grid == HopperGrid::Dynamic || name == HOPPER_LONG_KEYS_VARIANT;
        match plan(&f16, Arch::Sm90a, Some(name)) {
            Ok(AttentionPlan::Hopper { kernel, .. }) if picked => {
                assert_eq!((kernel.dtype, kernel.cfg), (Dtype::F16, cfg));
            }
            Err(Error::Unsupported { .. }) if !picked => {}
            _ => panic!("{name} (D {d}) in f16"),
        }
    }
    let p = AttentionProblem::new(1, 100, 300, 2, 1, 128, Dtype::Bf16);
    assert!(matches!(
        plan(&p, Arch::Sm90a, Some("nonesuch")),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn mma_sync_grid_and_parameters() {
    // Awkward sizes: GQA, a window, seq_q not a multiple of the tile.
    let p = AttentionProblem::new(3, 239, 1000, 8, 2, 128, Dtype::F16)
        .window(Some(17), None)
        .scale(0.5);
    let m = plan(&p, Arch::Sm80, None).unwrap();
    let AttentionPlan::MmaSync { kernel, launch } = &m else {
        panic!("not the mma.sync path")
    };
    let tiles = kernel.tiles;
    assert_eq!(launch.config().grid, (239u32.div_ceil(tiles.block_m), 8, 3));
    assert_eq!(launch.config().block, (tiles.threads(), 1, 1));
    assert_eq!(launch.config().shared_mem_bytes, tiles.smem_bytes());
    let a = launch.params();
    assert_eq!(a.q as u64, 1 << 40);
    assert_eq!(a.o as u64, 4 << 40);
    assert_eq!(a.lse as u64, 5 << 40);
    assert_eq!(a.q_strides, [239 * 8 * 128, 8 * 128, 128]);
    assert_eq!(a.k_strides, [1000 * 2 * 128, 2 * 128, 128]);
    assert_eq!(
        (a.batch, a.seq_q, a.seq_k, a.heads_q, a.heads_kv),
        (3, 239, 1000, 8, 2)
    );
    assert_eq!(a.scale_log2, 0.5 * std::f32::consts::LOG2_E);
    assert_eq!((a.window_left, a.window_right), (17, UNBOUNDED));
    assert_eq!((a.num_m_blocks, a.reverse_m), (launch.config().grid.0, 0));
    check(&m, Arch::Sm80);
    // Causal: right window 0, query blocks walked from the last; the smallest problem.
    let p = AttentionProblem::new(1, 1, 1, 1, 1, 64, Dtype::Bf16).causal();
    let m = plan(&p, Arch::Sm80, None).unwrap();
    let AttentionPlan::MmaSync { launch, .. } = &m else {
        panic!("not the mma.sync path")
    };
    assert_eq!(launch.config().grid, (1, 1, 1));
    let a = launch.params();
    assert_eq!(
        (a.window_left, a.window_right, a.reverse_m),
        (UNBOUNDED, 0, 1)
    );
    assert_eq!(a.scale_log2, 0.125 * std::f32::consts::LOG2_E);
}

#[test]
fn hopper_grid_maps_and_parameters() {
    // 216 tiles: persistent (one block per SM) without a mask, one block per tile with one.
    let p = AttentionProblem::new(3, 1100, 1100, 8, 2, 128, Dtype::Bf16);
    let tiles = 1100u32.div_ceil(HOPPER_BLOCK_M) * 8 * 3;
    assert_eq!(tiles, 216);
    let grid = |p: &AttentionProblem, variant| match plan(p, Arch::Sm90a, variant).unwrap() {
        AttentionPlan::Hopper { grid, params, .. } => {
            assert_eq!(params.num_tiles, tiles);
            grid
        }
        AttentionPlan::MmaSync { .. } => panic!("not the Hopper path"),
    };
    let causal = p.clone().causal();
    let window = p.clone().window(Some(5), Some(5));
    assert_eq!(hopper_config(128).unwrap().grid, HopperGrid::Auto);
    assert_eq!(grid(&p, None), (SMS, 1, 1));
    assert_eq!(grid(&causal, None), (tiles, 1, 1));
    assert_eq!(grid(&window, None), (tiles, 1, 1));
    assert_eq!(grid(&causal, Some("hstatic")), (SMS, 1, 1));
    assert_eq!(grid(&p, Some("hnp")), (tiles, 1, 1));
    assert_eq!(grid(&p, Some("hgrid3")), (3, 1, 1));
    assert_eq!(grid(&causal, Some("hdyn")), (SMS, 1, 1));
    assert_eq!(grid(&window, Some("hdyn")), (SMS, 1, 1));
    // Fewer tiles than multiprocessors: one block per tile.
    let small = AttentionProblem::new(1, 129, 5, 2, 1, 64, Dtype::Bf16);
    let AttentionPlan::Hopper { grid, .. } = plan(&small, Arch::Sm90a, None).unwrap() else {
        panic!("not the Hopper path")
    };
    assert_eq!(grid, (4, 1, 1));

    // With a tile counter, short causal problems take the dynamic grid (either dtype, D = 64
    // and 128), which gets the counter; other problems and kernels leave it unused.
    let counted = |p: &AttentionProblem, arch, variant| match plan_with_counter(
        p,
        arch,
        variant,
        Some((9 << 40, 1)),
    )
    .unwrap()
    {
        AttentionPlan::Hopper {
            kernel,
            grid,
            params,
            ..
        } => Some((kernel.kernel.info().name, grid, params.tile_counter as u64)),
        AttentionPlan::MmaSync { .. } => None,
    };
    assert!(causal.prefers_dynamic_grid());
    assert_eq!(
        counted(&causal, Arch::Sm90a, None),
        Some(("attention_fwd_hopper_bf16_d128_hdyn", (SMS, 1, 1), 9 << 40))
    );
    let f16_short = AttentionProblem::new(2, 1000, 1000, 4, 4, 64, Dtype::F16).causal();
    assert_eq!(
        counted(&f16_short, Arch::Sm90a, None),
        Some(("attention_fwd_hopper_f16_d64_hdyn", (64, 1, 1), 9 << 40))
    );
    assert_eq!(
        counted(&causal, Arch::Sm90a, Some("hdyn")),
        Some(("attention_fwd_hopper_bf16_d128_hdyn", (SMS, 1, 1), 9 << 40))
    );
    // The bound: seq_k * D below 2^19.
    let long = AttentionProblem::new(1, 4096, 4096, 2, 2, 128, Dtype::Bf16).causal();
    assert!(!long.prefers_dynamic_grid());
    let longer_d64 = AttentionProblem::new(1, 4095, 4095, 2, 2, 64, Dtype::Bf16).causal();
    assert!(longer_d64.prefers_dynamic_grid());
    let d256 = AttentionProblem::new(1, 1000, 1000, 2, 2, 256, Dtype::Bf16).causal();
    for (p, variant, kernel) in [
        (&p, None, "attention_fwd_hopper_bf16_d128"),
        (&window, None, "attention_fwd_hopper_bf16_d128"),
        (&long, None, "attention_fwd_hopper_bf16_d128"),
        (&d256, None, "attention_fwd_hopper_bf16_d256"),
        (
            &causal,
            Some("hstatic"),
            "attention_fwd_hopper_bf16_d128_hstatic",
        ),
    ] {
        let (name, _, counter) = counted(p, Arch::Sm90a, variant).unwrap();
        assert_eq!((name, counter), (kernel, 0), "{p:?} {variant:?}");
    }
    assert_eq!(counted(&causal, Arch::Sm80, None), None);
    // Long keys at D = 64: steps of 192 keys (either dtype, with a counter or not, any mask);
    // fewer keys or another head dimension: the default.
    for (p, kernel) in [
        (
            AttentionProblem::new(1, 300, 8192, 2, 1, 64, Dtype::Bf16),
            "attention_fwd_hopper_bf16_d64_hn192",
        ),
        (
            AttentionProblem::new(1, 8192, 8192, 2, 1, 64, Dtype::F16).causal(),
            "attention_fwd_hopper_f16_d64_hn192",
        ),
        (
            AttentionProblem::new(1, 300, 8191, 2, 1, 64, Dtype::Bf16),
            "attention_fwd_hopper_bf16_d64",
        ),
        (
            AttentionProblem::new(1, 300, 8191, 2, 1, 64, Dtype::Bf16).causal(),
            "attention_fwd_hopper_bf16_d64_hdyn",
        ),
        (
            AttentionProblem::new(1, 300, 9000, 2, 1, 128, Dtype::Bf16),
            "attention_fwd_hopper_bf16_d128",
        ),
    ] {
        assert_eq!(counted(&p, Arch::Sm90a, None).unwrap().0, kernel, "{p:?}");
        let h = plan(&p, Arch::Sm90a, None).unwrap();
        let want = if kernel.ends_with("_hdyn") {
            "attention_fwd_hopper_bf16_d64"
        } else {
            kernel
        };
        assert_eq!(h.kernel().name, want, "{p:?} without a counter");
        check(&h, Arch::Sm90a);
    }
    // Without a counter the dynamic grid's kernel takes its tiles in a static round-robin.
    let AttentionPlan::Hopper { params, .. } = plan(&causal, Arch::Sm90a, Some("hdyn")).unwrap()
    else {
        panic!("not the Hopper path")
    };
    assert!(params.tile_counter.is_null());
    let dynamic = plan_with_counter(&causal, Arch::Sm90a, None, Some((9 << 40, 1))).unwrap();
    check(&dynamic, Arch::Sm90a);
    // A counter of another length or alignment is refused, whatever the problem.
    for (p, counter) in [
        (&causal, (10 << 40, 2)),
        (&p, (10 << 40, 0)),
        (&causal, ((10 << 40) + 2, 1)),
    ] {
        let Err(err) = plan_with_counter(p, Arch::Sm90a, None, Some(counter)) else {
            panic!("counter {counter:?} accepted");
        };
        assert!(err.to_string().contains("tile counter"), "{err}");
    }

    let h = plan(&causal, Arch::Sm90a, None).unwrap();
    check(&h, Arch::Sm90a);
    let AttentionPlan::Hopper {
        kernel,
        maps,
        params,
        ..
    } = &h
    else {
        panic!("not the Hopper path")
    };
    let bn = kernel.cfg.block_n;
    assert_eq!(maps[0].address, 1 << 40);
    assert_eq!(maps[0].dims[..4], [128, 8, 1100, 3]);
    assert_eq!(
        maps[0].strides_bytes[..3],
        [2 * 128, 2 * 8 * 128, 2 * 1100 * 8 * 128]
    );
    assert_eq!(maps[0].box_dims[..4], [64, 1, HOPPER_BLOCK_M, 1]);
    assert_eq!(maps[1].address, 2 << 40);
    assert_eq!(maps[1].dims[..4], [128, 2, 1100, 3]);
    assert_eq!(maps[1].box_dims[..4], [64, 1, bn, 1]);
    assert_eq!(maps[2].address, 3 << 40);
    assert_eq!(maps[2].box_dims[..4], [64, 1, bn, 1]);
    assert_eq!(params.o as u64, 4 << 40);
    assert_eq!(params.lse as u64, 5 << 40);
    assert_eq!(params.o_strides, [1100 * 8 * 128, 8 * 128, 128]);
    assert_eq!(
        (params.num_m_blocks, params.reverse_m, params.window_right),
        (9, 1, 0)
    );
    assert_eq!(params.tmap_q, kernel_abi::TensorMap::ZEROED);
}

#[test]
fn the_plan_refuses_bad_tensors() {
    let p = AttentionProblem::new(2, 64, 80, 2, 1, 64, Dtype::Bf16);
    // The element type of the tensors.
    assert!(matches!(
        p.plan(target(Arch::Sm90a), &tensors::<f16>(&p), None),
        Err(Error::InvalidArgument { .. })
    ));
    // LSE's length.
    let mut t = tensors::<bf16>(&p);
    t.lse = dev(5 << 40, p.lse_len() - 1);
    assert!(matches!(
        p.plan(target(Arch::Sm90a), &t, None),
        Err(Error::ShapeMismatch { .. })
    ));
    // O's shape, a misaligned start of V, a view past its memory.
    let mut t = tensors::<bf16>(&p);
    t.o = View::contiguous(dev(4 << 40, 1 << 20), p.kv_shape());
    assert!(matches!(
        p.plan(target(Arch::Sm90a), &t, None),
        Err(Error::ShapeMismatch { .. })
    ));
    let kn: usize = p.kv_shape().iter().product();
    let mut t = tensors::<bf16>(&p);
    t.v = View::new(
        dev(3 << 40, kn + 1),
        1,
        &p.kv_shape(),
        &contiguous_strides(p.kv_shape()),
    )
    .unwrap();
    assert!(matches!(
        p.plan(target(Arch::Sm80), &t, None),
        Err(Error::Misaligned { .. })
    ));
    let mut t = tensors::<bf16>(&p);
    t.q = View::contiguous(dev(1 << 40, 8), p.q_shape());
    assert!(matches!(
        p.plan(target(Arch::Sm80), &t, None),
        Err(Error::ShapeMismatch { .. })
    ));
}

mod raw;
mod raw_decode;
mod raw_fp8;

#[test]
fn softcap_and_sinks_take_the_capsink_kernels_with_their_parameters() {
    let p = AttentionProblem::new(1, 300, 300, 4, 2, 128, Dtype::Bf16)
        .softcap(30.0)
        .with_sinks();
    let scale = p.softmax_scale();
    let hopper = plan(&p, Arch::Sm90a, None).unwrap();
    assert_eq!(
        hopper.kernel().name,
        "attention_fwd_hopper_capsink_bf16_d128"
    );
    let AttentionPlan::Hopper { params, .. } = &hopper else {
        panic!("a Hopper plan")
    };
    assert_eq!(params.scale_log2, 30.0 * std::f32::consts::LOG2_E);
    assert_eq!(params.logits.softcap_scale, scale / 30.0);
    assert_eq!(params.logits.sinks as u64, 6 << 40);
    let mma = plan(&p.clone().path(Path::MmaSync), Arch::Sm90a, None).unwrap();
    assert_eq!(mma.kernel().name, "attention_fwd_capsink_bf16_d128");
    let sinks_only = AttentionProblem::new(1, 30, 30, 4, 2, 64, Dtype::F16).with_sinks();
    let AttentionPlan::MmaSync { launch, .. } = plan(&sinks_only, Arch::Sm80, None).unwrap() else {
        panic!("an mma.sync plan on sm_80")
    };
    assert_eq!(launch.kernel().name, "attention_fwd_capsink_f16_d64");
    let params = launch.params();
    assert_eq!(params.logits.softcap_scale, 0.0);
    assert_eq!(params.scale_log2, 0.125 * std::f32::consts::LOG2_E);
    // Without either: the default kernels, the options zero.
    let plain = plan(
        &AttentionProblem::new(1, 30, 30, 4, 2, 64, Dtype::F16),
        Arch::Sm80,
        None,
    );
    let AttentionPlan::MmaSync { launch, .. } = plain.unwrap() else {
        panic!("an mma.sync plan on sm_80")
    };
    assert_eq!(launch.kernel().name, "attention_fwd_f16_d64");
    assert!(launch.params().logits.sinks.is_null());
}

mod varlen;

#[test]
fn value_dim_pairs_plan_their_hopper_kernels() {
    for (d, dv) in VALUE_DIMS {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            for causal in [false, true] {
                let mut p = AttentionProblem::new(2, 1000, 1100, 8, 2, d as usize, dtype)
                    .value_dim(dv as usize);
                p.causal = causal;
                let plan = plan(&p, Arch::Sm90a, None).unwrap();
                check(&plan, Arch::Sm90a);
                let AttentionPlan::Hopper {
                    kernel,
                    maps,
                    params,
                    ..
                } = &plan
                else {
                    panic!("({d}, {dv}) not on the Hopper path");
                };
                let dt = dtype_name(dtype);
                assert_eq!(
                    kernel.kernel.name,
                    format!("attention_fwd_hopper_{dt}_d{d}_v{dv}")
                );
                assert_eq!((kernel.cfg.head_dim, kernel.cfg.value_dim), (d, dv));
                assert!(kernel.cfg.smem_bytes() <= MAX_SMEM);
                // V's map spans D_v columns in boxes of `block_n` rows; O's strides are D_v's.
                assert_eq!(maps[2].dims[..4], [dv as u64, 2, 1100, 2]);
                assert_eq!(maps[1].dims[..4], [d as u64, 2, 1100, 2]);
                assert_eq!(maps[2].box_dims[2], kernel.cfg.block_n);
                assert_eq!(
                    params.o_strides,
                    [1000 * 8 * dv as u64, 8 * dv as u64, dv as u64]
                );
                assert_eq!(
                    p.flops(),
                    2.0 * 16.0 * 1000.0 * 1100.0 * (d + dv) as f64 / if causal { 2.0 } else { 1.0 }
                );
            }
        }
    }
    // The mma.sync path: on sm_80, or asked for.
    for (d, dv) in VALUE_DIMS {
        for (arch, path) in [(Arch::Sm80, Path::Auto), (Arch::Sm90a, Path::MmaSync)] {
            let p = AttentionProblem::new(2, 1000, 1100, 8, 2, d as usize, Dtype::F16)
                .value_dim(dv as usize)
                .path(path);
            let plan = plan(&p, arch, None).unwrap();
            check(&plan, arch);
            let AttentionPlan::MmaSync { kernel, launch } = &plan else {
                panic!("({d}, {dv}) on {arch} with {path:?}: not the mma.sync path");
            };
            assert_eq!(kernel.kernel.name, format!("attention_fwd_f16_d{d}_v{dv}"));
            assert_eq!((kernel.tiles.head_dim, kernel.tiles.value_dim), (d, dv));
            assert_eq!(
                launch.params().o_strides,
                [1000 * 8 * dv as u64, 8 * dv as u64, dv as u64]
            );
        }
    }
    for k in &MMA_VALUE_DIM_KERNELS {
        let (d, dv) = (k.tiles.head_dim, k.tiles.value_dim);
        assert_eq!(
            k.kernel.name,
            format!("attention_fwd_{}_d{d}_v{dv}", dtype_name(k.dtype))
        );
        assert_eq!(
            Some(k.tiles),
            kernel_abi::attention::mma_value_config(d, dv)
        );
        assert_eq!(k.kernel.smem_bytes(k.tiles), k.tiles.smem_bytes());
        assert!(k.tiles.smem_bytes() * k.tiles.blocks_per_sm as usize <= 228 * 1024);
    }
    for k in &HOPPER_VALUE_DIM_KERNELS {
        let (d, dv) = (k.cfg.head_dim, k.cfg.value_dim);
        let want = format!(
            "attention_fwd_hopper_{}{}_d{d}_v{dv}",
            if k.varlen { "varlen_" } else { "" },
            dtype_name(k.dtype)
        );
        assert_eq!(k.kernel.name, want);
        assert_eq!(
            Some(k.cfg),
            kernel_abi::attention::hopper_value_config(d, dv)
        );
        assert!(VALUE_DIMS.contains(&(d, dv)) && d != dv);
    }
}
