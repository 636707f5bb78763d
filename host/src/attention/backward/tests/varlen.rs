//! The backward over packed sequences: plans, grids, workspaces, refusals; and the pairs of
//! a value head dimension of its own (dense and packed).

use super::*;

/// Contiguous packed tensors of `p` at made-up, well-aligned, disjoint addresses, with the
/// boundaries' device views.
fn varlen_tensors<'a, T>(
    p: &AttentionVarlenProblem,
    d_lse: bool,
) -> AttentionVarlenBackwardTensors<'a, T> {
    let qn = p.q_shape().iter().product();
    let kn = p.kv_shape().iter().product();
    let (vn, on) = (p.v_shape().iter().product(), p.o_shape().iter().product());
    let q = |i: u64| View::packed_contiguous(dev(i << 40, qn), p.q_shape());
    let k = |i: u64| View::packed_contiguous(dev(i << 40, kn), p.kv_shape());
    let v = |i: u64| View::packed_contiguous(dev(i << 40, vn), p.v_shape());
    let o = |i: u64| View::packed_contiguous(dev(i << 40, on), p.o_shape());
    AttentionVarlenBackwardTensors {
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
        cu_seqlens_q: dev(11 << 40, p.batch + 1),
        cu_seqlens_k: dev(12 << 40, p.batch + 1),
        sinks: None,
        d_sinks: None,
    }
}

/// The plan of `p` on an sm_80 GPU (the `mma.sync` kernels).
fn varlen_plan(
    p: &AttentionVarlenProblem,
    deterministic: bool,
) -> Result<AttentionVarlenBackwardPlan> {
    varlen_plan_on(Arch::Sm80, p, deterministic)
}

fn varlen_plan_on(
    arch: Arch,
    p: &AttentionVarlenProblem,
    deterministic: bool,
) -> Result<AttentionVarlenBackwardPlan> {
    let options = BackwardOptions { deterministic };
    let t = target(arch);
    match p.dtype {
        Dtype::Bf16 => p.plan_backward(t, &varlen_tensors::<bf16>(p, true), options),
        Dtype::F16 => p.plan_backward(t, &varlen_tensors::<f16>(p, true), options),
    }
}

fn varlen_workspace<'a>(plan: &AttentionVarlenBackwardPlan) -> BackwardWorkspace<'a> {
    BackwardWorkspace {
        delta: dev(20 << 40, plan.delta_len()),
        dq_accum: (plan.dq_accum_len() > 0).then(|| dev(21 << 40, plan.dq_accum_len())),
    }
}

fn varlen_problem(
    lens: &[(usize, usize)],
    hq: usize,
    hkv: usize,
    d: usize,
) -> AttentionVarlenProblem {
    let s = CuSeqlens::from_lens(lens).unwrap();
    AttentionVarlenProblem::new(&s, hq, hkv, d, Dtype::Bf16)
}

#[test]
fn varlen_grids_parameters_and_workspace_sizes() {
    let p = varlen_problem(&[(113, 20), (0, 203), (7, 0)], 8, 2, 128)
        .causal()
        .window(Some(40), None);
    let total_q = 120;
    // The tiled accumulator: per head floor(120 / 64) + 3 = 4 tiles of 64 rows.
    let tiled = 8 * 4 * 64 * 128;
    for deterministic in [false, true] {
        let plan = varlen_plan(&p, deterministic).unwrap();
        assert_eq!(plan.path(), BackwardPath::MmaSync);
        assert_eq!(plan.deterministic(), deterministic);
        assert_eq!(plan.delta_len(), 8 * total_q);
        let accum = if deterministic { tiled + 32 } else { tiled };
        assert_eq!(plan.dq_accum_len(), accum);
        let l = plan.launches(&varlen_workspace(&plan)).unwrap();
        let k = plan.kernels();
        assert!(k.pre.name.contains("_varlen_") && k.dq.name.contains("_varlen_"));
        let (pre, dkdv, dq) = (l.pre.unwrap(), l.dkdv.unwrap(), l.dq.unwrap());
        assert_eq!(pre.name(), k.pre.name);
        // Grids sized for the longest sequence.
        assert_eq!(pre.config().grid, (113u32.div_ceil(ROW_BLOCK), 8, 3));
        assert_eq!(dkdv.config().grid, (203u32.div_ceil(k.tiles.block_n), 2, 3));
        if deterministic {
            assert_eq!(dkdv.name(), k.dkdv.name);
            assert_eq!(dq.name(), k.dq.name);
            assert_eq!(
                dq.config().grid,
                (113u32.div_ceil(k.dq_tiles.block_m), 8, 3)
            );
            assert!(pre.params().base.dq_accum.is_null());
        } else {
            assert_eq!(dkdv.name(), k.dkdv_dq.name);
            assert_eq!(dq.name(), k.dq_convert.name);
            assert_eq!(pre.params().base.dq_accum as u64, 21 << 40);
        }
        let params = dkdv.params();
        assert_eq!(params.base.delta as u64, 20 << 40);
        assert_eq!(params.base.d_lse as u64, 7 << 40);
        assert_eq!(
            (params.cu_seqlens_q as u64, params.cu_seqlens_k as u64),
            (11 << 40, 12 << 40)
        );
        assert_eq!((params.total_q, params.total_k), (120, 223));
        assert_eq!((params.base.window_left, params.base.window_right), (40, 0));
        assert_eq!(
            (params.base.seq_q, params.base.seq_k, params.base.batch),
            (113, 203, 3)
        );
        assert_eq!(params.base.dq_strides[1..], [8 * 128, 128]);
    }
}

#[test]
fn varlen_launches_with_empty_grids_are_left_out() {
    // No query rows: only the dK/dV kernel (it writes dK = dV = 0).
    let p = varlen_problem(&[(0, 5), (0, 3)], 2, 1, 64);
    for deterministic in [false, true] {
        let plan = varlen_plan(&p, deterministic).unwrap();
        let l = plan.launches(&varlen_workspace(&plan)).unwrap();
        assert!(l.pre.is_none() && l.dq.is_none() && l.dkdv.is_some());
    }
    // No key rows: no dK/dV kernel; dQ = 0 from the other two.
    let p = varlen_problem(&[(4, 0), (9, 0)], 2, 1, 64);
    for deterministic in [false, true] {
        let plan = varlen_plan(&p, deterministic).unwrap();
        let l = plan.launches(&varlen_workspace(&plan)).unwrap();
        assert!(l.pre.is_some() && l.dq.is_some() && l.dkdv.is_none());
    }
}

#[test]
fn every_varlen_launch_passes_the_ptx_checks() {
    for arch in [Arch::Sm90a, Arch::Sm80] {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            for d in HEAD_DIMS {
                for deterministic in [false, true] {
                    let mut p = varlen_problem(&[(239, 17), (3, 80)], 4, 2, d as usize).causal();
                    p.dtype = dtype;
                    let plan = varlen_plan_on(arch, &p, deterministic).unwrap();
                    let hopper = arch == Arch::Sm90a;
                    assert_eq!(plan.path() == BackwardPath::Hopper, hopper);
                    let l = plan.launches(&varlen_workspace(&plan)).unwrap();
                    let dkdv = l.dkdv.unwrap();
                    assert_eq!(dkdv.name().contains("hopper_dkdvq_varlen"), hopper);
                    check_kernel_launch(arch, dkdv.kernel(), dkdv.config(), MAX_SMEM)
                        .unwrap_or_else(|e| panic!("{} ({arch}): {e}", dkdv.name()));
                    for launch in [l.pre, l.dq].into_iter().flatten() {
                        check_kernel_launch(arch, launch.kernel(), launch.config(), MAX_SMEM)
                            .unwrap_or_else(|e| panic!("{} ({arch}): {e}", launch.name()));
                    }
                }
            }
        }
    }
}

#[test]
fn bad_varlen_tensors_are_rejected() {
    let p = varlen_problem(&[(5, 9), (3, 4)], 2, 1, 64);
    let options = BackwardOptions::default();
    let good = varlen_tensors::<bf16>(&p, true);
    assert!(p.plan_backward(target(Arch::Sm80), &good, options).is_ok());
    let mut t = good;
    t.lse = dev(6 << 40, p.lse_len() - 1);
    assert!(matches!(
        p.plan_backward(target(Arch::Sm80), &t, options),
        Err(Error::ShapeMismatch { .. })
    ));
    let mut t = good;
    t.cu_seqlens_k = dev(12 << 40, p.batch);
    assert!(matches!(
        p.plan_backward(target(Arch::Sm80), &t, options),
        Err(Error::ShapeMismatch { .. })
    ));
    let mut t = good;
    t.dq = t.q;
    assert!(matches!(
        p.plan_backward(target(Arch::Sm80), &t, options),
        Err(Error::InvalidArgument { .. })
    ));
    let mut t = good;
    t.dv = t.dk;
    assert!(matches!(
        p.plan_backward(target(Arch::Sm80), &t, options),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        p.plan_backward(
            target(Arch::Sm80),
            &varlen_tensors::<f16>(&p, false),
            options
        ),
        Err(Error::InvalidArgument { .. })
    ));
    // A workspace of the wrong size.
    let plan = p.plan_backward(target(Arch::Sm80), &good, options).unwrap();
    let mut ws = varlen_workspace(&plan);
    ws.delta = dev(20 << 40, plan.delta_len() + 1);
    assert!(plan.launches(&ws).is_err());
}

/// Every head dimension of the forward has backward kernels on both layouts and both element
/// types; one the forward refuses is the forward's typed error.
#[test]
fn every_forward_head_dim_has_a_backward() {
    for d in HEAD_DIMS {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            assert!(bwd_kernels(dtype, d).is_some(), "{dtype:?} D {d}");
            assert!(bwd_varlen_kernels(dtype, d).is_some(), "{dtype:?} D {d}");
        }
        let p = AttentionProblem::new(1, 64, 64, 2, 1, d as usize, Dtype::Bf16);
        plan_on(Arch::Sm90a, &p, false).unwrap();
        varlen_plan(&varlen_problem(&[(5, 7), (9, 3)], 2, 1, d as usize), true).unwrap();
    }
    let p = AttentionProblem::new(1, 64, 64, 2, 1, 72, Dtype::Bf16);
    let e = plan_on(Arch::Sm90a, &p, false).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("head dimension 72"), "{e}");
}

#[test]
fn the_tiled_accumulator_is_a_permutation_of_each_tile() {
    use kernel_abi::attention::hopper_bwd::{
        HOPPER_DQ_TILE_ROWS, dq_accum_tile_base, dq_tile_position, dq_tile_vector,
    };
    for d in [64u32, 128, 256] {
        let rows = HOPPER_DQ_TILE_ROWS;
        let mut seen = vec![0u8; (rows * d) as usize];
        for c in 0..2 {
            for v in 0..d / 16 {
                for tid in 0..128 {
                    let at = dq_tile_vector(d, c, v, tid);
                    assert_eq!(at % 4, 0);
                    let (row, col) = dq_tile_position(d, at / 4);
                    // The wgmma accumulator layout of thread `tid`'s registers 4 v .. 4 v + 4.
                    let (w, lane) = (tid / 32, tid % 32);
                    assert_eq!(row, 16 * w + lane / 4);
                    assert_eq!(col, c * d / 2 + 8 * v + 2 * (lane % 4));
                    for (r, k) in [
                        (row, col),
                        (row, col + 1),
                        (row + 8, col),
                        (row + 8, col + 1),
                    ] {
                        seen[(r * d + k) as usize] += 1;
                    }
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "D = {d}: not a permutation");
    }
    // Tiles of whole 64-row blocks per (sequence, head): 113 rows take 128.
    assert_eq!(dq_accum_tile_base(0, 1, 8, 113, 0, 128), 128 * 128);
    assert_eq!(
        dq_accum_tile_base(2, 0, 8, 113, 64, 128),
        (16 * 128 + 64) * 128
    );
}

#[test]
fn varlen_hopper_plan_kernels_grids_and_accumulator() {
    // D 96 has no dK/dV/dQ kernel of its own: the D 128 one, on zero-padded columns.
    for (d, kernel_d) in [(64, 64), (96, 128), (128, 128), (160, 256), (256, 256)] {
        let p = varlen_problem(&[(113, 20), (0, 203), (7, 0)], 8, 2, d).causal();
        for deterministic in [false, true] {
            let plan = varlen_plan_on(Arch::Sm90a, &p, deterministic).unwrap();
            assert_eq!(plan.path(), BackwardPath::Hopper);
            // floor(120 / 64) + 3 tiles of 64 rows per head, as wide as the kernel's head.
            let tiled = 8 * 4 * 64 * kernel_d;
            let accum = if deterministic { tiled + 32 } else { tiled };
            assert_eq!(plan.dq_accum_len(), accum, "D {d}");
            let ws = varlen_workspace(&plan);
            let l = plan.launches(&ws).unwrap();
            let (pre, dkdv, dq) = (l.pre.unwrap(), l.dkdv.unwrap(), l.dq.unwrap());
            let suffix = format!("_d{kernel_d}");
            assert!(
                dkdv.name()
                    .starts_with("attention_bwd_hopper_dkdvq_varlen_bf16")
            );
            assert!(dkdv.name().ends_with(&suffix), "{}", dkdv.name());
            assert!(
                dq.name()
                    .starts_with("attention_bwd_hopper_dq_convert_varlen_bf16")
            );
            assert!(dq.name().ends_with(&suffix), "{}", dq.name());
            let block_n = if kernel_d == 256 { 64 } else { 128 };
            assert_eq!(dkdv.config().grid, (203u32.div_ceil(block_n), 2, 3));
            assert_eq!(dq.config().grid, (113u32.div_ceil(ROW_BLOCK), 8, 3));
            assert_eq!(pre.config().grid, dq.config().grid);
            let params = dkdv.params();
            assert_eq!(params.base.dq_accum_tiled, kernel_d as u32);
            assert_eq!(params.base.head_dim, d as u32);
            assert_eq!(params.base.dq_accum as u64, 21 << 40);
            assert_eq!((params.total_q, params.total_k), (120, 223));
            let order = params.base.dq_order as u64;
            if deterministic {
                assert_eq!(order, (21 << 40) + 4 * tiled as u64);
            } else {
                assert_eq!(order, 0);
            }
            // Causal: the grid keeps its order (its interleaving: `order_group`'s tests).
            let VarlenBwdLaunch::Hopper(h) = &dkdv else {
                unreachable!()
            };
            assert_eq!(h.params().order_group, 1);
            assert_eq!(pre.params().base.dq_order as u64, order);
            assert_eq!(dq.params().base.dq_accum as u64, 21 << 40);
        }
    }
    // Without a causal mask the ordered mode interleaves the 6 (head, sequence) pairs of the
    // grid's 2 key blocks each.
    let p = varlen_problem(&[(113, 20), (0, 203), (7, 0)], 8, 2, 128);
    for deterministic in [false, true] {
        let plan = varlen_plan_on(Arch::Sm90a, &p, deterministic).unwrap();
        let l = plan.launches(&varlen_workspace(&plan)).unwrap();
        let Some(VarlenBwdLaunch::Hopper(h)) = &l.dkdv else {
            unreachable!()
        };
        assert_eq!(h.params().order_group, if deterministic { 6 } else { 1 });
    }
}

#[test]
fn varlen_hopper_plan_falls_back_or_refuses() {
    // No key row: a tensor map needs one. Auto takes mma.sync, Hopper refuses.
    let p = varlen_problem(&[(4, 0), (9, 0)], 2, 1, 64);
    let plan = varlen_plan_on(Arch::Sm90a, &p, false).unwrap();
    assert_eq!(plan.path(), BackwardPath::MmaSync);
    let e = varlen_plan_on(Arch::Sm90a, &p.clone().path(Path::Hopper), false)
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    // Path::Hopper on a GPU without the kernels; Path::MmaSync on one with them.
    let p = varlen_problem(&[(5, 9), (3, 4)], 2, 1, 64);
    let e = varlen_plan_on(Arch::Sm80, &p.clone().path(Path::Hopper), false)
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    let plan = varlen_plan_on(Arch::Sm90a, &p.clone().path(Path::MmaSync), true).unwrap();
    assert_eq!(plan.path(), BackwardPath::MmaSync);
    // The workspace is the same whatever the path.
    let hopper = varlen_plan_on(Arch::Sm90a, &p, true).unwrap();
    assert_eq!(hopper.path(), BackwardPath::Hopper);
    assert_eq!(
        (plan.delta_len(), plan.dq_accum_len()),
        (hopper.delta_len(), hopper.dq_accum_len())
    );
}

/// V and O of their own head dimension (192, 128): the Hopper dK/dV/dQ kernel of D 256 on
/// zero-padded columns in both modes, dense and packed, its preprocess the D_v one (it reads O
/// and dO), dV's 128 columns in the parameters, the workspace of D 192; typed errors where only
/// the `mma.sync` kernels could run (sm_80, `Path::MmaSync`, an empty packed batch).
#[test]
fn backward_of_a_value_head_dimension_of_its_own() {
    let p = AttentionProblem::new(1, 64, 64, 2, 2, 192, Dtype::Bf16).value_dim(128);
    let d192 = AttentionProblem::new(1, 64, 64, 2, 2, 192, Dtype::Bf16);
    for deterministic in [false, true] {
        let plan = plan(&p, deterministic).unwrap();
        assert_eq!(plan.path(), BackwardPath::Hopper);
        let l = plan.launches(&workspace(&plan)).unwrap();
        assert!(l.dkdv.name().contains("dkdvq") && l.dkdv.name().ends_with("_d256"));
        assert_eq!(l.pre.name(), "attention_bwd_pre_bf16_d128");
        let params = l.dkdv.params();
        assert_eq!((params.head_dim, params.value_dim), (192, 128));
        assert_eq!(params.dq_accum_tiled, 256);
        let same = plan_on(Arch::Sm90a, &d192, deterministic).unwrap();
        assert_eq!(
            (plan.delta_len(), plan.dq_accum_len()),
            (same.delta_len(), same.dq_accum_len())
        );
    }
    // Without a pair, dV's columns are the head dimension's.
    let l = plan(&d192, false).unwrap();
    let l = l.launches(&workspace(&l)).unwrap();
    assert_eq!(
        (l.dkdv.params().head_dim, l.dkdv.params().value_dim),
        (192, 192)
    );
    for (what, e) in [
        ("sm_80", plan_on(Arch::Sm80, &p, false).err()),
        ("mma.sync", plan(&p.clone().path(Path::MmaSync), true).err()),
    ] {
        assert!(
            matches!(e, Some(Error::Unsupported { .. })),
            "{what}: {e:?}"
        );
    }
    let v = varlen_problem(&[(5, 7), (64, 64)], 2, 2, 192).value_dim(128);
    for deterministic in [false, true] {
        let plan = varlen_plan_on(Arch::Sm90a, &v, deterministic).unwrap();
        assert_eq!(plan.path(), BackwardPath::Hopper);
        let l = plan.launches(&varlen_workspace(&plan)).unwrap();
        assert!(l.pre.unwrap().name().contains("_d128"));
        let VarlenBwdLaunch::Hopper(h) = l.dkdv.unwrap() else {
            panic!("the packed pair's dK/dV launch is the Hopper kernel's")
        };
        assert_eq!(
            (h.params().base.head_dim, h.params().base.value_dim),
            (192, 128)
        );
    }
    for (what, e) in [
        ("packed sm_80", varlen_plan_on(Arch::Sm80, &v, false).err()),
        (
            "packed mma.sync",
            varlen_plan_on(Arch::Sm90a, &v.clone().path(Path::MmaSync), false).err(),
        ),
        (
            "packed without keys",
            varlen_plan_on(
                Arch::Sm90a,
                &varlen_problem(&[(5, 0), (3, 0)], 2, 2, 192).value_dim(128),
                false,
            )
            .err(),
        ),
    ] {
        assert!(
            matches!(e, Some(Error::Unsupported { .. })),
            "{what}: {e:?}"
        );
    }
}
