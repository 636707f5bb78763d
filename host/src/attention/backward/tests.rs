//! CPU tests of the backward's handles and plan (dense and over packed sequences): names and
//! tiles of every handle, grids, parameters and workspace sizes, every launch against each
//! target's PTX, and bad tensors and workspaces rejected with typed errors.

use super::*;
use crate::attention::{
    AttentionProblem, AttentionVarlenProblem, CuSeqlens, Dtype, Path, Target, View,
};
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::gpu::check_kernel_launch;
use crate::ptx::Arch;
use half::{bf16, f16};
use kernel_abi::attention::backward::{
    BWD_KERNELS, ROW_BLOCK, ROW_THREADS, bwd_kernels, bwd_tile_config, bwd_varlen_kernels,
    dq_tile_config,
};
use kernel_abi::attention::{HEAD_DIMS, UNBOUNDED};

/// The most dynamic shared memory a block may have on the GPUs the tests assume (H100, H200).
const MAX_SMEM: usize = 227 * 1024;

fn target(arch: Arch) -> Target {
    Target {
        arch,
        multiprocessors: 132,
    }
}

fn dev<'a, T>(addr: u64, len: usize) -> DevView<'a, T> {
    // SAFETY: only planned, never dereferenced.
    unsafe { DevView::from_raw(addr, len) }
}

/// Contiguous tensors of `p` at made-up, well-aligned, disjoint addresses.
fn tensors<'a, T>(p: &AttentionProblem, d_lse: bool) -> AttentionBackwardTensors<'a, T> {
    let qn = p.q_shape().iter().product();
    let kn = p.kv_shape().iter().product();
    let (vn, on) = (p.v_shape().iter().product(), p.o_shape().iter().product());
    let q = |i: u64| View::contiguous(dev(i << 40, qn), p.q_shape());
    let k = |i: u64| View::contiguous(dev(i << 40, kn), p.kv_shape());
    let v = |i: u64| View::contiguous(dev(i << 40, vn), p.v_shape());
    let o = |i: u64| View::contiguous(dev(i << 40, on), p.o_shape());
    AttentionBackwardTensors {
        q: q(1),
        k: k(2),
        v: v(3),
        o: o(4),
        d_o: o(5),
        lse: dev(6 << 40, p.lse_len()),
        d_lse: d_lse.then(|| dev(7 << 40, p.lse_len())),
        dq: q(8),
        dk: k(9),
        dv: v(10),
        sinks: None,
        d_sinks: None,
    }
}

fn plan(p: &AttentionProblem, deterministic: bool) -> Result<AttentionBackwardPlan> {
    plan_on(Arch::Sm90a, p, deterministic)
}

fn plan_on(arch: Arch, p: &AttentionProblem, deterministic: bool) -> Result<AttentionBackwardPlan> {
    let options = BackwardOptions { deterministic };
    match p.dtype {
        Dtype::Bf16 => p.plan_backward(target(arch), &tensors::<bf16>(p, true), options),
        Dtype::F16 => p.plan_backward(target(arch), &tensors::<f16>(p, true), options),
    }
}

/// A workspace of the plan's sizes at made-up addresses.
fn workspace<'a>(plan: &AttentionBackwardPlan) -> BackwardWorkspace<'a> {
    BackwardWorkspace {
        delta: dev(20 << 40, plan.delta_len()),
        dq_accum: (plan.dq_accum_len() > 0).then(|| dev(21 << 40, plan.dq_accum_len())),
    }
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Bf16 => "bf16",
        Dtype::F16 => "f16",
    }
}

#[test]
fn handles_are_named_by_role_dtype_and_head_dim() {
    assert_eq!(BWD_KERNELS.len(), 2 * HEAD_DIMS.len());
    for k in &BWD_KERNELS {
        let (dt, d) = (dtype_name(k.dtype), k.head_dim);
        assert_eq!(k.pre.name, format!("attention_bwd_pre_{dt}_d{d}"));
        assert_eq!(k.dkdv_dq.name, format!("attention_bwd_{dt}_d{d}"));
        assert_eq!(k.dkdv.name, format!("attention_bwd_dkdv_{dt}_d{d}"));
        assert_eq!(
            k.dq_convert.name,
            format!("attention_bwd_dq_convert_{dt}_d{d}")
        );
        assert_eq!(k.dq.name, format!("attention_bwd_dq_{dt}_d{d}"));
        assert_eq!(Some(k.tiles), bwd_tile_config(d));
        assert_eq!(Some(k.dq_tiles), dq_tile_config(d));
        assert_eq!(k.dkdv_dq.threads, k.tiles.threads());
        assert_eq!(k.dq.threads, k.dq_tiles.threads());
        assert_eq!(
            (k.pre.threads, k.dq_convert.threads),
            (ROW_THREADS, ROW_THREADS)
        );
        // The dQ kernel of the atomic mode has the dS^T tile; the deterministic dK/dV not.
        assert!(k.dkdv_dq.smem_bytes(k.tiles) > k.dkdv.smem_bytes(k.tiles));
        assert!(k.dkdv_dq.smem_bytes(k.tiles) <= MAX_SMEM);
        assert!(k.dq.smem_bytes(k.dq_tiles) <= MAX_SMEM);
    }
}

#[test]
fn grids_parameters_and_workspace_sizes() {
    let mut p = AttentionProblem::new(3, 113, 203, 8, 2, 128, Dtype::Bf16).causal();
    p.window = (Some(40), None);
    p.path = Path::MmaSync;
    for deterministic in [false, true] {
        let plan = plan(&p, deterministic).unwrap();
        assert_eq!(plan.path(), BackwardPath::MmaSync);
        assert_eq!(plan.deterministic(), deterministic);
        assert_eq!(plan.delta_len(), 3 * 8 * 113);
        // Rows rounded up to whole 64-row tiles (the Hopper path's layout; this path uses
        // the first 3 8 113 rows); in deterministic mode one counter per tile after them
        // (unused here).
        let accum = if deterministic {
            3 * 8 * 128 * 128 + 48
        } else {
            3 * 8 * 128 * 128
        };
        assert_eq!(plan.dq_accum_len(), accum);
        let ws = workspace(&plan);
        let l = plan.launches(&ws).unwrap();
        let k = plan.kernels();
        assert_eq!(l.pre.name(), k.pre.name);
        assert_eq!(l.pre.config().grid, (113u32.div_ceil(ROW_BLOCK), 8, 3));
        assert_eq!(
            l.dkdv.config().grid,
            (203u32.div_ceil(k.tiles.block_n), 2, 3)
        );
        if deterministic {
            assert_eq!(l.dkdv.name(), k.dkdv.name);
            assert_eq!(l.dq.name(), k.dq.name);
            assert_eq!(
                l.dq.config().grid,
                (113u32.div_ceil(k.dq_tiles.block_m), 8, 3)
            );
            assert!(l.pre.params().dq_accum.is_null());
            assert!(l.pre.params().dq_order.is_null());
        } else {
            assert_eq!(l.dkdv.name(), k.dkdv_dq.name);
            assert_eq!(l.dq.name(), k.dq_convert.name);
            assert_eq!(l.dq.config().grid, l.pre.config().grid);
            assert_eq!(l.pre.params().dq_accum as u64, 21 << 40);
        }
        let params = l.dkdv.params();
        assert_eq!(params.delta as u64, 20 << 40);
        assert_eq!(params.d_lse as u64, 7 << 40);
        assert_eq!((params.window_left, params.window_right), (40, 0));
        assert_eq!(
            (params.seq_q, params.seq_k, params.heads_q, params.heads_kv),
            (113, 203, 8, 2)
        );
        assert_eq!(params.dq_strides, [113 * 8 * 128, 8 * 128, 128]);
        let scale = 1.0 / (128f32).sqrt();
        assert_eq!(params.scale, scale);
        assert_eq!(params.scale_log2, scale * std::f32::consts::LOG2_E);
    }
    let p = AttentionProblem::new(1, 5, 7, 2, 2, 64, Dtype::F16);
    let l = plan(&p, false).unwrap();
    let params = l.launches(&workspace(&l)).unwrap().pre;
    assert_eq!(
        (params.params().window_left, params.params().window_right),
        (UNBOUNDED, UNBOUNDED)
    );
}

#[test]
fn the_hopper_path_where_it_exists() {
    let mut p = AttentionProblem::new(3, 113, 203, 8, 2, 128, Dtype::Bf16).causal();
    for deterministic in [false, true] {
        // Auto on sm_90a: the dK/dV/dQ kernel and the conversion of its tiled accumulator
        // (one block per 64-row tile), in deterministic mode with the counters of its order
        // after the accumulator (3 8 2 tiles, rounded up to a multiple of 4).
        let plan = plan(&p, deterministic).unwrap();
        assert_eq!(plan.path(), BackwardPath::Hopper);
        assert_eq!(plan.deterministic(), deterministic);
        let l = plan.launches(&workspace(&plan)).unwrap();
        let k = plan.kernels();
        assert!(matches!(l.dkdv, BwdLaunch::Hopper(_)));
        assert_eq!(l.dkdv.config().grid, (203u32.div_ceil(128), 2, 3));
        assert_eq!(l.dkdv.name(), "attention_bwd_hopper_dkdvq_bf16_d128");
        assert_eq!(l.dq.name(), "attention_bwd_hopper_dq_convert_bf16_d128");
        assert!(matches!(l.dq, BwdLaunch::MmaSync(_)));
        assert_eq!(l.dq.config().grid, (113u32.div_ceil(64), 8, 3));
        assert_eq!(l.dq.config().block, (128, 1, 1));
        assert_eq!(l.pre.params().dq_accum as u64, 21 << 40);
        assert_eq!(l.dkdv.params().dq_accum as u64, 21 << 40);
        assert_eq!(l.pre.params().dq_accum_tiled, 128);
        assert_eq!(l.pre.params().head_dim, 128);
        let accum = 3 * 8 * 128 * 128;
        if deterministic {
            assert_eq!(plan.dq_accum_len(), accum + 48);
            let order = (21u64 << 40) + 4 * accum as u64;
            assert_eq!(l.pre.params().dq_order as u64, order);
            assert_eq!(l.dkdv.params().dq_order as u64, order);
        } else {
            assert_eq!(plan.dq_accum_len(), accum);
            assert!(l.pre.params().dq_order.is_null());
            assert!(l.dkdv.params().dq_order.is_null());
        }
        // Causal: the grid keeps its order. Without a right bound the ordered mode interleaves
        // every (head, sequence) pair of this small grid (2 key blocks of 6 pairs on 132 SMs);
        // the default never does.
        let group = |plan: &AttentionBackwardPlan| {
            let l = plan.launches(&workspace(plan)).unwrap();
            let BwdLaunch::Hopper(h) = &l.dkdv else {
                unreachable!()
            };
            h.params().order_group
        };
        assert_eq!(group(&plan), 1);
        let mut full = p.clone();
        full.causal = false;
        assert_eq!(
            group(&self::plan(&full, deterministic).unwrap()),
            if deterministic { 6 } else { 1 }
        );
        full.window = (Some(40), None);
        assert_eq!(
            group(&self::plan(&full, deterministic).unwrap()),
            if deterministic { 6 } else { 1 }
        );
        full.window = (None, Some(40));
        assert_eq!(group(&self::plan(&full, deterministic).unwrap()), 1);
        assert_eq!(l.pre.name(), k.pre.name);
        assert_eq!(l.dkdv.params().delta as u64, 20 << 40);
        // sm_80 has no Hopper kernels.
        let plan = plan_on(Arch::Sm80, &p, deterministic).unwrap();
        assert_eq!(plan.path(), BackwardPath::MmaSync);
    }
    // D = 96: the Hopper dK/dV and dQ kernels in either mode (no dK/dV/dQ kernel).
    let q = AttentionProblem::new(2, 100, 300, 4, 2, 96, Dtype::F16);
    for deterministic in [false, true] {
        let plan = plan(&q, deterministic).unwrap();
        assert_eq!(plan.path(), BackwardPath::Hopper);
        let l = plan.launches(&workspace(&plan)).unwrap();
        assert_eq!(l.dkdv.name(), "attention_bwd_hopper_dkdv_f16_d96");
        assert_eq!(l.dq.name(), "attention_bwd_hopper_dq_f16_d96");
        assert_eq!(l.pre.params().dq_accum_tiled, 0);
        // No accumulator for the preprocess to zero, even where the workspace has one.
        assert!(l.pre.params().dq_accum.is_null());
    }
    // D = 256: the wide dK/dV/dQ kernel (64 keys per block) and the conversion in both modes;
    // deterministic, with the counters of its order after the tiled accumulator.
    for path in [Path::Auto, Path::Hopper] {
        let mut q = AttentionProblem::new(2, 100, 130, 4, 2, 256, Dtype::F16).causal();
        q.path = path;
        let pl = plan(&q, false).unwrap();
        assert_eq!(pl.path(), BackwardPath::Hopper);
        let l = pl.launches(&workspace(&pl)).unwrap();
        assert_eq!(l.dkdv.name(), "attention_bwd_hopper_dkdvq_f16_d256");
        assert_eq!(l.dkdv.config().grid, (130u32.div_ceil(64), 2, 2));
        assert_eq!(l.dq.name(), "attention_bwd_hopper_dq_convert_f16_d256");
        assert_eq!(l.dq.config().grid, (100u32.div_ceil(64), 4, 2));
        assert_eq!(l.pre.params().dq_accum_tiled, 256);
        assert_eq!(pl.dq_accum_len(), 2 * 4 * 128 * 256);
        let mut softcap = q.clone();
        softcap.softcap = Some(30.0);
        let pl = plan(&softcap, false).unwrap();
        let l = pl.launches(&workspace(&pl)).unwrap();
        assert_eq!(l.dkdv.name(), "attention_bwd_hopper_dkdvq_softcap_f16_d256");
        assert_eq!(l.dq.name(), "attention_bwd_hopper_dq_convert_f16_d256");
        let det = plan(&q, true).unwrap();
        assert_eq!(det.path(), BackwardPath::Hopper);
        assert_eq!(det.dq_accum_len(), 2 * 4 * 128 * 256 + 2 * 4 * 2);
        let ws = workspace(&det);
        let l = det.launches(&ws).unwrap();
        assert_eq!(l.dkdv.name(), "attention_bwd_hopper_dkdvq_f16_d256");
        assert_eq!(l.dq.name(), "attention_bwd_hopper_dq_convert_f16_d256");
        let p = l.pre.params();
        assert_eq!(p.dq_accum_tiled, 256);
        assert_eq!(p.dq_accum as u64, 21 << 40);
        assert_eq!(p.dq_order as u64, (21 << 40) + 4 * 2 * 4 * 128 * 256);
        assert_eq!(l.dkdv.params().dq_order, p.dq_order);
    }
    // D = 32, 48, 80, 112: the dK/dV and dQ kernels of the next Hopper dimension on
    // zero-padded columns, in either mode (no accumulator), storing the tensors' columns.
    for (d, kd) in [(32, 64), (48, 64), (80, 96), (112, 128)] {
        for (softcap, infix) in [(None, ""), (Some(20.0), "softcap_")] {
            let mut q = AttentionProblem::new(2, 100, 300, 4, 2, d, Dtype::Bf16).causal();
            q.softcap = softcap;
            for deterministic in [false, true] {
                let plan = plan(&q, deterministic).unwrap();
                assert_eq!(plan.path(), BackwardPath::Hopper, "D {d}");
                let l = plan.launches(&workspace(&plan)).unwrap();
                let dkdv = format!("attention_bwd_hopper_dkdv_{infix}bf16_d{kd}");
                let dq = format!("attention_bwd_hopper_dq_{infix}bf16_d{kd}");
                assert_eq!((l.dkdv.name(), l.dq.name()), (dkdv.as_str(), dq.as_str()));
                let (BwdLaunch::Hopper(a), BwdLaunch::Hopper(b)) = (&l.dkdv, &l.dq) else {
                    panic!("Hopper launches at D {d}");
                };
                assert_eq!(
                    (a.params().base.head_dim, b.params().base.head_dim),
                    (d as u32, d as u32)
                );
                assert!(l.pre.params().dq_accum.is_null());
                assert_eq!(l.pre.name(), plan.kernels().pre.name);
                assert_eq!(plan.kernels().tiles.head_dim, d as u32);
            }
            let mut m = q.clone();
            m.path = Path::MmaSync;
            assert_eq!(plan(&m, false).unwrap().path(), BackwardPath::MmaSync);
        }
    }
    // D = 144 to 240: the D 256 dK/dV/dQ kernel on zero-padded columns in both modes, its
    // accumulator rows 256 wide (the workspace sized so whatever the path), in deterministic
    // mode with the counters of its order after them.
    for d in [144, 160, 176, 192, 208, 224, 240] {
        for (softcap, infix) in [(None, ""), (Some(20.0), "softcap_")] {
            let mut q = AttentionProblem::new(2, 100, 130, 4, 2, d, Dtype::F16).causal();
            q.softcap = softcap;
            let pl = plan(&q, false).unwrap();
            assert_eq!(pl.path(), BackwardPath::Hopper, "D {d}");
            let l = pl.launches(&workspace(&pl)).unwrap();
            let main = format!("attention_bwd_hopper_dkdvq_{infix}f16_d256");
            assert_eq!(l.dkdv.name(), main);
            assert_eq!(l.dq.name(), "attention_bwd_hopper_dq_convert_f16_d256");
            assert_eq!(l.pre.name(), pl.kernels().pre.name);
            assert_eq!(pl.kernels().tiles.head_dim, d as u32);
            let p = l.pre.params();
            assert_eq!((p.dq_accum_tiled, p.head_dim), (256, d as u32));
            assert_eq!(l.dq.params().head_dim, d as u32);
            assert_eq!(pl.dq_accum_len(), 2 * 4 * 128 * 256);
            let det = plan(&q, true).unwrap();
            assert_eq!(det.path(), BackwardPath::Hopper);
            assert_eq!(det.dq_accum_len(), 2 * 4 * 128 * 256 + 2 * 4 * 2);
            let l = det.launches(&workspace(&det)).unwrap();
            assert_eq!(l.dkdv.name(), main);
            let p = l.pre.params();
            assert_eq!((p.dq_accum_tiled, p.head_dim), (256, d as u32));
            assert_eq!(p.dq_order as u64, (21 << 40) + 4 * 2 * 4 * 128 * 256);
        }
    }
    p.path = Path::MmaSync;
    assert_eq!(plan(&p, false).unwrap().path(), BackwardPath::MmaSync);
    p.path = Path::Hopper;
    assert_eq!(plan(&p, false).unwrap().path(), BackwardPath::Hopper);
    let err = plan_on(Arch::Sm80, &p, false)
        .err()
        .expect("no Hopper kernels on sm_80");
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn every_launch_passes_the_ptx_checks() {
    for arch in [Arch::Sm90a, Arch::Sm80] {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            for d in HEAD_DIMS {
                for deterministic in [false, true] {
                    let p = AttentionProblem::new(2, 239, 17, 4, 2, d as usize, dtype).causal();
                    let plan = plan_on(arch, &p, deterministic).unwrap();
                    let l = plan.launches(&workspace(&plan)).unwrap();
                    for (kernel, cfg) in [
                        (l.pre.kernel(), l.pre.config()),
                        (l.dkdv.kernel(), l.dkdv.config()),
                        (l.dq.kernel(), l.dq.config()),
                    ] {
                        check_kernel_launch(arch, kernel, cfg, MAX_SMEM)
                            .unwrap_or_else(|e| panic!("{} ({arch}): {e}", kernel.name));
                    }
                }
            }
        }
    }
}

fn is_invalid(r: Result<AttentionBackwardPlan>) -> bool {
    matches!(r, Err(Error::InvalidArgument { .. }))
}

#[test]
fn bad_tensors_are_rejected() {
    let p = AttentionProblem::new(1, 64, 64, 2, 2, 64, Dtype::Bf16);
    let good = tensors::<bf16>(&p, false);
    let opts = BackwardOptions::default();
    let plan = |t: &AttentionBackwardTensors<bf16>| p.plan_backward(target(Arch::Sm80), t, opts);
    assert!(plan(&good).is_ok());
    // Outputs aliasing an input or each other.
    assert!(is_invalid(plan(&AttentionBackwardTensors {
        dq: good.q,
        ..good
    })));
    assert!(is_invalid(plan(&AttentionBackwardTensors {
        dk: good.dv,
        ..good
    })));
    assert!(is_invalid(plan(&AttentionBackwardTensors {
        dv: good.d_o,
        ..good
    })));
    let partial = View::contiguous(dev::<bf16>((1 << 40) + 1024, 64 * 2 * 64), p.q_shape());
    assert!(is_invalid(plan(&AttentionBackwardTensors {
        dq: partial,
        ..good
    })));
    // dK over LSE's bytes.
    let lse_alias = View::contiguous(dev::<bf16>(6 << 40, 64 * 2 * 64), p.kv_shape());
    assert!(is_invalid(plan(&AttentionBackwardTensors {
        dk: lse_alias,
        ..good
    })));
    // Interleaved, disjoint views of one packed buffer are accepted; overlapping ones are not.
    let (s, h, d) = (64, 2, 64);
    let packed = dev::<bf16>(30 << 40, s * 3 * h * d);
    let strides = [s * 3 * h * d, 3 * h * d, d, 1];
    let view = |i: usize| View::new(packed, i * h * d, &p.q_shape(), &strides).unwrap();
    let interleaved = AttentionBackwardTensors {
        dq: view(0),
        dk: view(1),
        dv: view(2),
        ..good
    };
    assert!(plan(&interleaved).is_ok());
    let shifted = View::new(packed, h * d - 8, &p.q_shape(), &strides).unwrap();
    assert!(is_invalid(plan(&AttentionBackwardTensors {
        dk: shifted,
        ..interleaved
    })));
    // Shapes, lengths, alignment, dtype.
    let wrong = View::contiguous(dev::<bf16>(11 << 40, 64 * 2 * 64), [1, 64, 4, 32]);
    assert!(matches!(
        plan(&AttentionBackwardTensors { d_o: wrong, ..good }),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        plan(&AttentionBackwardTensors {
            d_lse: Some(dev(12 << 40, 3)),
            ..good
        }),
        Err(Error::ShapeMismatch { .. })
    ));
    let misaligned = View::new(
        dev::<bf16>(13 << 40, 64 * 2 * 64 + 8),
        1,
        &p.q_shape(),
        &[8192, 128, 64, 1],
    )
    .unwrap();
    assert!(matches!(
        plan(&AttentionBackwardTensors {
            dv: misaligned,
            ..good
        }),
        Err(Error::Misaligned { .. })
    ));
    let h16 = tensors::<f16>(&p, false);
    assert!(is_invalid(p.plan_backward(target(Arch::Sm80), &h16, opts)));
    // Problems.
    let mut bad = p.clone();
    bad.head_dim = 72;
    assert!(matches!(
        bad.plan_backward(target(Arch::Sm80), &good, opts),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn bad_workspaces_are_rejected() {
    // The mma.sync path (dQ by atomics needs the accumulator).
    let mut p = AttentionProblem::new(1, 64, 64, 2, 2, 64, Dtype::Bf16);
    p.path = Path::MmaSync;
    let atomic = plan(&p, false).unwrap();
    let good = workspace(&atomic);
    assert!(atomic.launches(&good).is_ok());
    let no_accum = BackwardWorkspace {
        dq_accum: None,
        ..good
    };
    assert!(matches!(
        atomic.launches(&no_accum),
        Err(Error::InvalidArgument { .. })
    ));
    let short = BackwardWorkspace {
        delta: dev(20 << 40, 3),
        ..good
    };
    assert!(matches!(
        atomic.launches(&short),
        Err(Error::ShapeMismatch { .. })
    ));
    let odd = BackwardWorkspace {
        dq_accum: Some(dev(21 << 40 | 4, atomic.dq_accum_len())),
        ..good
    };
    assert!(matches!(
        atomic.launches(&odd),
        Err(Error::Misaligned { .. })
    ));
    let overlap = BackwardWorkspace {
        dq_accum: Some(dev(20 << 40, atomic.dq_accum_len())),
        ..good
    };
    assert!(matches!(
        atomic.launches(&overlap),
        Err(Error::InvalidArgument { .. })
    ));
    // The deterministic plan's workspace: the accumulator and the counters of its order (one
    // tile: rounded up to 4), required as in the default mode whatever the path; the
    // mma.sync path's kernels get neither.
    let det = plan(&p, true).unwrap();
    assert_eq!(det.dq_accum_len(), atomic.dq_accum_len() + 4);
    assert!(matches!(
        det.launches(&no_accum),
        Err(Error::InvalidArgument { .. })
    ));
    let l = det.launches(&workspace(&det)).unwrap();
    assert!(l.dkdv.params().dq_accum.is_null() && l.dkdv.params().dq_order.is_null());
}

mod varlen;
