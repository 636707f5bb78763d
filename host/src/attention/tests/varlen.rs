//! Plans of the forward over packed sequences (both paths), their kernel handles, the raw
//! API's packed plan.

use super::*;

/// Contiguous packed tensors of `p` at made-up, well-aligned addresses.
fn varlen_tensors<'a, T>(p: &AttentionVarlenProblem) -> AttentionVarlenTensors<'a, T> {
    let n = |shape: [usize; 3]| shape.iter().product();
    AttentionVarlenTensors {
        q: View::packed_contiguous(dev(1 << 40, n(p.q_shape())), p.q_shape()),
        k: View::packed_contiguous(dev(2 << 40, n(p.kv_shape())), p.kv_shape()),
        v: View::packed_contiguous(dev(3 << 40, n(p.v_shape())), p.v_shape()),
        o: View::packed_contiguous(dev(4 << 40, n(p.o_shape())), p.o_shape()),
        lse: dev(5 << 40, p.lse_len()),
        cu_seqlens_q: dev(6 << 40, p.batch + 1),
        cu_seqlens_k: dev(7 << 40, p.batch + 1),
        sinks: p.sinks.then(|| dev(8 << 40, p.heads_q)),
        tile_counter: None,
    }
}

#[test]
fn varlen_handles_are_named_by_dtype_and_head_dim() {
    for k in &MMA_VARLEN_KERNELS {
        let want = format!(
            "attention_fwd_varlen_{}{}_d{}",
            if k.capsink { "capsink_" } else { "" },
            dtype_name(k.dtype),
            k.tiles.head_dim
        );
        assert_eq!(k.kernel.name, want);
        assert_eq!(Some(k.tiles), tile_config(k.tiles.head_dim));
    }
}

#[test]
fn varlen_plan_grid_parameters_and_launch() {
    let seqlens = CuSeqlens::from_lens(&[(17, 9), (0, 5), (300, 1), (40, 0)]).unwrap();
    assert_eq!((seqlens.total_q(), seqlens.total_k()), (357, 15));
    assert_eq!((seqlens.max_seqlen_q(), seqlens.max_seqlen_k()), (300, 9));
    for d in [64, 128, 256] {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            let p = AttentionVarlenProblem::new(&seqlens, 4, 2, d, dtype).causal();
            let plan = match dtype {
                Dtype::Bf16 => p.plan(target(Arch::Sm80), &varlen_tensors::<bf16>(&p)),
                Dtype::F16 => p.plan(target(Arch::Sm80), &varlen_tensors::<f16>(&p)),
            }
            .unwrap();
            let AttentionVarlenPlan::MmaSync {
                launch: Some(launch),
                ..
            } = &plan
            else {
                panic!("an mma.sync launch on sm_80")
            };
            let cfg = launch.config();
            assert_eq!(cfg.grid, (3, 4, 4), "300 rows in blocks of 128");
            let params = launch.params();
            assert_eq!((params.total_q, params.total_k), (357, 15));
            assert_eq!((params.base.seq_q, params.base.seq_k), (300, 9));
            assert_eq!(params.base.q_strides, [0, 4 * d as u64, d as u64]);
            assert_eq!(params.base.k_strides, [0, 2 * d as u64, d as u64]);
            assert_eq!(
                (params.base.window_left, params.base.window_right),
                (UNBOUNDED, 0)
            );
            assert_eq!(params.base.reverse_m, 1);
            assert_eq!(params.cu_seqlens_q as u64, 6 << 40);
            for arch in [Arch::Sm80, Arch::Sm90a] {
                check_kernel_launch(arch, &plan.kernel(), cfg, MAX_SMEM)
                    .unwrap_or_else(|e| panic!("{} ({arch}): {e}", plan.kernel().name));
            }
        }
    }
}

#[test]
fn varlen_without_query_rows_has_no_launch() {
    let seqlens = CuSeqlens::from_lens(&[(0, 5), (0, 0)]).unwrap();
    let p = AttentionVarlenProblem::new(&seqlens, 2, 2, 128, Dtype::Bf16);
    for target in [target(Arch::Sm80), target(Arch::Sm90a)] {
        let plan = p.plan(target, &varlen_tensors::<bf16>(&p)).unwrap();
        assert!(plan.config().is_none(), "{}", plan.kernel().name);
    }
}

/// With a tile counter the Hopper grid is persistent: one block per multiprocessor, at most
/// one per tile; the `mma.sync` path ignores the counter; a counter of another length is
/// refused.
#[test]
fn varlen_hopper_tile_counter_makes_the_grid_persistent() {
    let lens: Vec<(usize, usize)> = (0..40).map(|i| (100 + 61 * i, 90 + 37 * i)).collect();
    let seqlens = CuSeqlens::from_lens(&lens).unwrap();
    let p = AttentionVarlenProblem::new(&seqlens, 8, 2, 128, Dtype::Bf16);
    let with = |counter: Option<DevView<'static, u32>>| AttentionVarlenTensors {
        tile_counter: counter,
        ..varlen_tensors::<bf16>(&p)
    };
    let hopper = |t: Target, counter| match p.plan(t, &with(counter)).unwrap() {
        AttentionVarlenPlan::Hopper(AttentionPlan::Hopper { grid, params, .. }) => (grid, params),
        _ => panic!("a Hopper plan on sm_90a"),
    };
    let (grid, params) = hopper(target(Arch::Sm90a), Some(dev(9 << 40, 1)));
    assert!(params.num_tiles > SMS);
    assert_eq!(grid, (SMS, 1, 1));
    assert_eq!(params.tile_counter as u64, 9 << 40);
    let few = Target {
        arch: Arch::Sm90a,
        multiprocessors: 100_000,
    };
    let (grid, _) = hopper(few, Some(dev(9 << 40, 1)));
    assert_eq!(grid, (params.num_tiles, 1, 1), "at most one block per tile");
    let (grid, params) = hopper(target(Arch::Sm90a), None);
    assert_eq!(
        (grid.0, params.tile_counter),
        (params.num_tiles, std::ptr::null_mut())
    );
    let mma = p
        .plan(target(Arch::Sm80), &with(Some(dev(9 << 40, 1))))
        .unwrap();
    assert!(!mma.is_hopper());
    let err = p
        .plan(target(Arch::Sm90a), &with(Some(dev(9 << 40, 2))))
        .err()
        .expect("a counter of 2 elements");
    assert!(err.to_string().contains("tile counter"), "{err}");
}

#[test]
fn varlen_hopper_plan_grid_parameters_and_maps() {
    let seqlens = CuSeqlens::from_lens(&[(17, 9), (0, 5), (300, 1), (40, 0)]).unwrap();
    for d in HEAD_DIMS.map(|d| d as usize) {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            let p = AttentionVarlenProblem::new(&seqlens, 4, 2, d, dtype).causal();
            let plan = match dtype {
                Dtype::Bf16 => p.plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&p)),
                Dtype::F16 => p.plan(target(Arch::Sm90a), &varlen_tensors::<f16>(&p)),
            }
            .unwrap();
            let AttentionVarlenPlan::Hopper(AttentionPlan::Hopper {
                kernel,
                grid,
                maps,
                params,
            }) = &plan
            else {
                panic!("a Hopper plan on sm_90a")
            };
            assert!(kernel.varlen && !kernel.capsink && kernel.dtype == dtype);
            assert_eq!(kernel.cfg.head_dim, d as u32);
            // Slots per head: floor(357 / 128) + 4 sequences = 6 (1 + 0 + 3 + 1 query blocks
            // and the empty sequence's slot).
            assert_eq!(*grid, (6 * 4, 1, 1), "one block per tile");
            assert!(params.tile_counter.is_null());
            assert_eq!((params.num_m_blocks, params.num_tiles), (6, 24));
            assert_eq!((params.total_q, params.total_k), (357, 15));
            assert_eq!((params.seq_q, params.seq_k, params.batch), (300, 9, 4));
            assert_eq!(
                (params.cu_seqlens_q as u64, params.cu_seqlens_k as u64),
                (6 << 40, 7 << 40)
            );
            assert_eq!(params.o_strides, [0, 4 * d as u64, d as u64]);
            assert_eq!((params.window_right, params.reverse_m), (0, 1));
            let dims = |m: &MapSpec| m.dims[..4].to_vec();
            assert_eq!(dims(&maps[0]), [d as u64, 4, 357, 1]);
            assert_eq!(dims(&maps[1]), [d as u64, 2, 15, 1]);
            check_kernel_launch(
                Arch::Sm90a,
                &plan.kernel(),
                &plan.config().unwrap(),
                MAX_SMEM,
            )
            .unwrap_or_else(|e| panic!("{}: {e}", plan.kernel().name));
        }
    }
    // Softcap and sinks: the varlen capsink kernel.
    let p = AttentionVarlenProblem::new(&seqlens, 4, 2, 128, Dtype::Bf16).softcap(5.0);
    let plan = p
        .plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&p))
        .unwrap();
    assert_eq!(
        plan.kernel().name,
        "attention_fwd_hopper_varlen_capsink_bf16_d128"
    );
}

#[test]
fn varlen_value_dim_pairs_plan_their_hopper_kernels() {
    let seqlens = CuSeqlens::from_lens(&[(17, 9), (0, 5), (300, 1), (40, 0)]).unwrap();
    let p = AttentionVarlenProblem::new(&seqlens, 4, 2, 192, Dtype::Bf16)
        .causal()
        .value_dim(128);
    let plan = p
        .plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&p))
        .unwrap();
    assert_eq!(
        plan.kernel().name,
        "attention_fwd_hopper_varlen_bf16_d192_v128"
    );
    let AttentionVarlenPlan::Hopper(AttentionPlan::Hopper { maps, params, .. }) = &plan else {
        panic!("a Hopper plan on sm_90a")
    };
    assert_eq!(params.o_strides, [0, 4 * 128, 128]);
    assert_eq!(maps[2].dims[..4], [128, 2, 15, 1]);
    check_kernel_launch(
        Arch::Sm90a,
        &plan.kernel(),
        &plan.config().unwrap(),
        MAX_SMEM,
    )
    .unwrap();
    // On sm_80, or asked for: the pair's mma.sync kernel; an explicit Hopper path on sm_80 is
    // refused.
    let m = p.clone().path(Path::MmaSync);
    for (plan, arch) in [
        (
            p.plan(target(Arch::Sm80), &varlen_tensors::<bf16>(&p)),
            Arch::Sm80,
        ),
        (
            m.plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&m)),
            Arch::Sm90a,
        ),
    ] {
        let plan = plan.unwrap();
        assert_eq!(plan.kernel().name, "attention_fwd_varlen_bf16_d192_v128");
        check_kernel_launch(arch, &plan.kernel(), &plan.config().unwrap(), MAX_SMEM).unwrap();
    }
    let h = p.clone().path(Path::Hopper);
    let e = h
        .plan(target(Arch::Sm80), &varlen_tensors::<bf16>(&h))
        .err();
    assert!(matches!(e, Some(Error::Unsupported { .. })), "{e:?}");
    // No key row at all: a tensor map needs one, Auto takes mma.sync.
    let nokeys = CuSeqlens::from_lens(&[(5, 0), (7, 0)]).unwrap();
    let n = AttentionVarlenProblem::new(&nokeys, 4, 2, 192, Dtype::Bf16).value_dim(128);
    let plan = n
        .plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&n))
        .unwrap();
    assert_eq!(plan.kernel().name, "attention_fwd_varlen_bf16_d192_v128");
    // No query row: no launch.
    let empty = CuSeqlens::from_lens(&[(0, 5)]).unwrap();
    let e = AttentionVarlenProblem::new(&empty, 4, 2, 192, Dtype::Bf16).value_dim(128);
    let plan = e
        .plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&e))
        .unwrap();
    assert!(matches!(
        plan,
        AttentionVarlenPlan::MmaSync { launch: None, .. }
    ));
}

#[test]
fn varlen_hopper_path_needs_keys_and_sm90() {
    // No key row at all: Auto takes mma.sync, an explicit Hopper path is refused.
    let seqlens = CuSeqlens::from_lens(&[(17, 0), (3, 0)]).unwrap();
    let p = AttentionVarlenProblem::new(&seqlens, 2, 2, 128, Dtype::Bf16);
    let plan = p
        .plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&p))
        .unwrap();
    assert!(!plan.is_hopper(), "{}", plan.kernel().name);
    let e = p
        .clone()
        .path(Path::Hopper)
        .plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&p))
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("no key row"), "{e}");
    // An explicit Hopper path on sm_80 is refused; MmaSync on sm_90a is honoured.
    let seqlens = CuSeqlens::from_lens(&[(17, 9)]).unwrap();
    let p = AttentionVarlenProblem::new(&seqlens, 2, 2, 128, Dtype::Bf16);
    let e = p
        .clone()
        .path(Path::Hopper)
        .plan(target(Arch::Sm80), &varlen_tensors::<bf16>(&p))
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("sm_90a"), "{e}");
    let plan = p
        .clone()
        .path(Path::MmaSync)
        .plan(target(Arch::Sm90a), &varlen_tensors::<bf16>(&p))
        .unwrap();
    assert_eq!(plan.kernel().name, "attention_fwd_varlen_bf16_d128");
}

#[test]
fn varlen_hopper_handles_are_named_by_dtype_and_head_dim() {
    assert_eq!(HOPPER_VARLEN_KERNELS.len(), 2 * 2 * HEAD_DIMS.len());
    for k in &HOPPER_VARLEN_KERNELS {
        let want = format!(
            "attention_fwd_hopper_varlen_{}{}_d{}",
            if k.capsink { "capsink_" } else { "" },
            dtype_name(k.dtype),
            k.cfg.head_dim
        );
        assert_eq!(k.kernel.name, want);
        assert!(k.varlen && k.variant.is_none());
        assert_eq!(
            Some(k.cfg),
            kernel_abi::attention::hopper_varlen_config(k.cfg.head_dim)
        );
        let found = hopper_varlen_kernel(k.dtype, k.cfg.head_dim, k.capsink).unwrap();
        assert_eq!(found.kernel.name, k.kernel.name);
    }
}

#[test]
fn varlen_rejects_bad_boundaries_and_problems() {
    let bad = |r: Result<CuSeqlens>, what: &str| {
        let e = r.expect_err(what);
        assert!(e.to_string().contains(what), "{what}: {e}");
    };
    bad(CuSeqlens::new(&[0], &[0]), "at least one sequence");
    bad(CuSeqlens::new(&[1, 4], &[0, 4]), "starts at 1");
    bad(
        CuSeqlens::new(&[0, 4, 3], &[0, 4, 5]),
        "decreases at entry 2",
    );
    bad(CuSeqlens::new(&[0, 4], &[0, 4, 5]), "cu_seqlens_k length");
    bad(CuSeqlens::new(&[0, 1 << 30], &[0, 4]), "below 2^30");
    let seqlens = CuSeqlens::from_lens(&[(5, 5), (7, 3)]).unwrap();
    let p = AttentionVarlenProblem::new(&seqlens, 4, 2, 128, Dtype::Bf16);
    let rejects = |p: &AttentionVarlenProblem, what: &str| {
        let e = p
            .plan(target(Arch::Sm80), &varlen_tensors::<bf16>(p))
            .map(|_| ())
            .expect_err(what);
        assert!(e.to_string().contains(what), "{what}: {e}");
    };
    rejects(
        &AttentionVarlenProblem {
            max_seqlen_q: 5,
            ..p.clone()
        },
        "max_seqlen_q",
    );
    rejects(
        &AttentionVarlenProblem {
            max_seqlen_k: 13,
            ..p.clone()
        },
        "max_seqlen_k",
    );
    rejects(
        &AttentionVarlenProblem {
            head_dim: 72,
            ..p.clone()
        },
        "head dimension 72",
    );
    rejects(
        &AttentionVarlenProblem {
            heads_kv: 3,
            ..p.clone()
        },
        "heads",
    );
    rejects(&p.clone().path(Path::Hopper), "Hopper");
    let mut t = varlen_tensors::<bf16>(&p);
    t.lse = dev(5 << 40, p.lse_len() - 1);
    assert!(matches!(
        p.plan(target(Arch::Sm80), &t),
        Err(Error::ShapeMismatch { .. })
    ));
    let mut t = varlen_tensors::<bf16>(&p);
    t.cu_seqlens_k = dev(7 << 40, 2);
    assert!(p.plan(target(Arch::Sm80), &t).is_err());
    let mut t = varlen_tensors::<bf16>(&p);
    t.o = View::packed(dev(4 << 40, 12 * 4 * 128), 0, &[12, 4, 128], &[0, 128, 1]).unwrap();
    assert!(
        p.plan(target(Arch::Sm80), &t).is_err(),
        "O rows sharing memory"
    );
    let other = CuSeqlens::from_lens(&[(6, 5), (6, 3)]).unwrap();
    assert!(p.check_seqlens(&other).is_err());
    assert!(p.check_seqlens(&seqlens).is_ok());
}

mod raw_varlen {
    use super::*;
    use crate::raw::{ElemType, RawTensor};

    /// Contiguous raw tensors of `p` at the addresses of `varlen_tensors`.
    fn raw_tensors(p: &AttentionVarlenProblem) -> [RawTensor; 7] {
        [
            RawTensor::contiguous(1 << 40, ElemType::Bf16, &p.q_shape()),
            RawTensor::contiguous(2 << 40, ElemType::Bf16, &p.kv_shape()),
            RawTensor::contiguous(3 << 40, ElemType::Bf16, &p.kv_shape()),
            RawTensor::contiguous(4 << 40, ElemType::Bf16, &p.q_shape()),
            RawTensor::contiguous(5 << 40, ElemType::F32, &[p.heads_q, p.total_q]),
            RawTensor::contiguous(6 << 40, ElemType::I32, &[p.batch + 1]),
            RawTensor::contiguous(7 << 40, ElemType::I32, &[p.batch + 1]),
        ]
    }

    fn plan_of(
        t: &[RawTensor; 7],
        options: &AttentionOptions,
        max: (usize, usize),
    ) -> Result<(AttentionVarlenProblem, AttentionVarlenPlan)> {
        let [q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k] = t;
        plan_varlen_raw(
            target(Arch::Sm80),
            options,
            &RawAttentionVarlenTensors {
                q,
                k,
                v,
                o,
                lse,
                cu_seqlens_q,
                cu_seqlens_k,
                sinks: None,
                tile_counter: None,
            },
            max.0,
            max.1,
        )
    }

    fn problem() -> AttentionVarlenProblem {
        let seqlens = CuSeqlens::from_lens(&[(17, 9), (0, 5), (300, 1), (40, 0)]).unwrap();
        AttentionVarlenProblem::new(&seqlens, 4, 2, 128, Dtype::Bf16).window(Some(7), Some(0))
    }

    #[test]
    fn the_raw_varlen_plan_is_the_typed_plan() {
        let p = problem();
        let options = AttentionOptions {
            window: p.window,
            ..Default::default()
        };
        let (rp, plan) = plan_of(&raw_tensors(&p), &options, (300, 9)).unwrap();
        assert_eq!(rp, p);
        let typed = p
            .plan(target(Arch::Sm80), &varlen_tensors::<bf16>(&p))
            .unwrap();
        let launch = |plan: AttentionVarlenPlan| match plan {
            AttentionVarlenPlan::MmaSync {
                launch: Some(l), ..
            } => l,
            _ => panic!("an mma.sync launch on sm_80"),
        };
        let (a, b) = (launch(plan), launch(typed));
        assert_eq!(a.config(), b.config());
        let bytes = |x: &kernel_abi::attention::AttentionVarlenParams| format!("{x:?}");
        assert_eq!(bytes(a.params()), bytes(b.params()));
    }

    #[test]
    fn the_raw_varlen_plan_refuses_bad_tensors() {
        let p = problem();
        let options = AttentionOptions::default();
        let refuse = |f: &dyn Fn(&mut [RawTensor; 7]), max: (usize, usize), what: &str| {
            let mut t = raw_tensors(&p);
            f(&mut t);
            let e = plan_of(&t, &options, max).map(|_| ()).expect_err(what);
            assert!(e.to_string().contains(what), "{what}: {e}");
        };
        let ok = (300, 9);
        refuse(&|t| t[5].dtype = ElemType::F32, ok, "cu_seqlens_q dtype");
        refuse(
            &|t| t[6] = RawTensor::contiguous(7 << 40, ElemType::I32, &[4]),
            ok,
            "cu_seqlens_k",
        );
        refuse(
            &|t| t[5] = RawTensor::contiguous(6 << 40, ElemType::I32, &[5, 1]),
            ok,
            "cu_seqlens_q rank",
        );
        refuse(
            &|t| t[4] = RawTensor::contiguous(5 << 40, ElemType::F32, &[357, 4]),
            ok,
            "LSE shape",
        );
        refuse(
            &|t| t[0] = RawTensor::contiguous(1 << 40, ElemType::Bf16, &[1, 357, 4, 128]),
            ok,
            "Q rank",
        );
        refuse(&|t| t[3].ptr = t[5].ptr, ok, "overlaps cu_seqlens_q");
        refuse(&|_| {}, (80, 9), "max_seqlen_q");
        refuse(&|_| {}, (300, 2), "max_seqlen_k");
        refuse(&|_| {}, (400, 9), "max_seqlen_q");
        // A larger maximum than the contents' is possible (blocks past each end exit).
        let (_, plan) = plan_of(&raw_tensors(&p), &options, (357, 15)).unwrap();
        assert_eq!(plan.config().unwrap().grid, (3, 4, 4));
    }

    #[test]
    fn the_raw_varlen_backward_workspace_lens_are_the_plans() {
        let p = problem();
        let options = AttentionOptions {
            window: p.window,
            ..Default::default()
        };
        let [q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k] = &raw_tensors(&p);
        let grads = [
            RawTensor::contiguous(8 << 40, ElemType::Bf16, &p.q_shape()),
            RawTensor::contiguous(9 << 40, ElemType::Bf16, &p.q_shape()),
            RawTensor::contiguous(10 << 40, ElemType::Bf16, &p.kv_shape()),
            RawTensor::contiguous(11 << 40, ElemType::Bf16, &p.kv_shape()),
        ];
        let [d_o, dq, dk, dv] = &grads;
        let tensors = RawAttentionVarlenBackwardTensors {
            q,
            k,
            v,
            o,
            lse,
            d_o,
            d_lse: None,
            dq,
            dk,
            dv,
            cu_seqlens_q,
            cu_seqlens_k,
            sinks: None,
            d_sinks: None,
        };
        for deterministic in [false, true] {
            let opts = BackwardOptions { deterministic };
            let lens = backward_varlen_workspace_lens(
                &p.q_shape(),
                &p.kv_shape(),
                p.batch,
                p.max_seqlen_q,
                p.max_seqlen_k,
                ElemType::Bf16,
                opts,
            )
            .unwrap();
            assert_eq!(lens, p.backward_workspace_lens(opts));
            let (rp, plan) = plan_backward_varlen_raw(
                target(Arch::Sm90a),
                &options,
                opts,
                &tensors,
                p.max_seqlen_q,
                p.max_seqlen_k,
            )
            .unwrap();
            assert_eq!(rp, p);
            assert_eq!(
                (plan.delta_len(), plan.dq_accum_len()),
                (lens.delta, lens.dq_accum)
            );
        }
        let lens = |q: &[usize], max_q: usize, dtype: ElemType| {
            backward_varlen_workspace_lens(
                q,
                &p.kv_shape(),
                p.batch,
                max_q,
                p.max_seqlen_k,
                dtype,
                BackwardOptions::default(),
            )
            .map(|_| ())
            .unwrap_err()
            .to_string()
        };
        let e = lens(&p.q_shape(), 80, ElemType::Bf16);
        assert!(e.contains("max_seqlen_q"), "{e}");
        let e = lens(&[1, 357, 4, 128], 300, ElemType::Bf16);
        assert!(e.contains("Q rank"), "{e}");
        let e = lens(&p.q_shape(), 300, ElemType::F32);
        assert!(e.contains("Q dtype"), "{e}");
    }
}
