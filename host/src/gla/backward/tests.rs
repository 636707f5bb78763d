//! Plan tests of the GLA backward: launches, grids, workspaces, refused tensors.

use super::*;
use crate::gpu::check_kernel_launch;
use crate::ptx::Arch;

fn view<'a, T>(addr: u64, len: usize) -> DevView<'a, T> {
    // SAFETY: only planned, never dereferenced.
    unsafe { DevView::from_raw(addr, len) }
}

fn tensors<'a>(p: &GlaProblem) -> GlaReverseTensors<'a> {
    GlaReverseTensors {
        q: view(1 << 30, p.qk_len()),
        k: view(2 << 30, p.qk_len()),
        g: view(3 << 30, p.qk_len()),
        d_o: view(4 << 30, p.v_len()),
        d_final_state: Some(view(5 << 30, p.state_len())),
        d_init_state: view(6 << 30, p.state_len()),
        d_v: view(7 << 30, p.v_len()),
    }
}

/// The plan's launches on a made-up workspace, each checked against every target's PTX.
fn checked_names(plan: &GlaBackwardPlan) -> Vec<&'static str> {
    let (seg, comb) = plan.segments.table_words();
    let ws = GlaBackwardWorkspace {
        segments: view(8 << 30, seg.len()),
        grad: view(9 << 30, plan.grad_len),
        split: plan.workspace.map(|(state, decay)| GlaBackwardSplit {
            combine: view(10 << 30, comb.len()),
            seg_end: view(11 << 30, state),
            delta: view(12 << 30, state),
            decay_log2: view(13 << 30, decay),
            seg_init: (plan.seg_init_len > 0).then(|| view(14 << 30, plan.seg_init_len)),
        }),
    };
    let launches = plan.launches(&ws).unwrap();
    for l in &launches {
        for arch in Arch::ALL {
            check_kernel_launch(arch, l.kernel(), l.config(), 227 * 1024)
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
    }
    launches.iter().map(|l| l.kernel().name).collect()
}

#[test]
fn one_launch_without_a_split_three_with() {
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 132,
    };
    let p = GlaProblem::new(4, 100, 8, 64, 128);
    let plan = p.plan_reverse_pass(target, &tensors(&p)).unwrap();
    assert!(plan.workspace.is_none());
    assert_eq!(checked_names(&plan), ["gla_bwd_dhdv_dk64_dv128"]);
    assert_eq!(plan.grad_len, grad_slots(400, 4) * 8 * 64 * 128);

    let p = GlaProblem::new(1, 1000, 2, 128, 64).with_segment_len(64);
    let plan = p.plan_reverse_pass(target, &tensors(&p)).unwrap();
    assert_eq!(plan.segments.segments.len(), 16);
    assert_eq!(plan.workspace, Some((16 * 2 * 128 * 64, 16 * 2 * 128)));
    assert_eq!(
        checked_names(&plan),
        [
            "gla_bwd_states_dk128_dv64",
            "gla_bwd_combine",
            "gla_bwd_dhdv_dk128_dv64"
        ]
    );
}

fn full_tensors<'a>(p: &GlaProblem) -> GlaBackwardTensors<'a> {
    let r = tensors(p);
    GlaBackwardTensors {
        q: r.q,
        k: r.k,
        v: view(15 << 30, p.v_len()),
        g: r.g,
        init_state: Some(view(16 << 30, p.state_len())),
        d_o: r.d_o,
        d_final_state: r.d_final_state,
        d_q: view(17 << 30, p.qk_len()),
        d_k: view(18 << 30, p.qk_len()),
        d_v: r.d_v,
        d_g: view(19 << 30, p.qk_len()),
        d_init_state: r.d_init_state,
    }
}

#[test]
fn the_whole_backward_adds_the_forward_states_when_split_and_dqkg() {
    let target = Target {
        arch: Arch::Sm90a,
        multiprocessors: 132,
    };
    let p = GlaProblem::new(2, 77, 4, 128, 128);
    let plan = p.plan_backward(target, &full_tensors(&p)).unwrap();
    assert_eq!(plan.seg_init_len, 0);
    assert_eq!(
        checked_names(&plan),
        ["gla_bwd_dhdv_dk128_dv128", "gla_bwd_dqkg_tc_dk128_dv128"]
    );
    let launches = plan
        .launches(&GlaBackwardWorkspace {
            segments: view(8 << 30, 4 * plan.segments.segments.len()),
            grad: view(9 << 30, plan.grad_len),
            split: None,
        })
        .unwrap();
    let dqkg = launches[1].config();
    assert_eq!(dqkg.grid, (2, 4, 1));
    assert_eq!(
        dqkg.shared_mem_bytes,
        kernel_abi::gla::backward::tc_smem_bytes(128, 128)
    );
    // The token-by-token kernel on request.
    let plan = p
        .plan_backward_with(target, &full_tensors(&p), DqkgKernel::TokenByToken)
        .unwrap();
    assert_eq!(
        checked_names(&plan),
        ["gla_bwd_dhdv_dk128_dv128", "gla_bwd_dqkg_dk128_dv128"]
    );
    let launches = plan
        .launches(&GlaBackwardWorkspace {
            segments: view(8 << 30, 4 * plan.segments.segments.len()),
            grad: view(9 << 30, plan.grad_len),
            split: None,
        })
        .unwrap();
    assert_eq!(
        launches[1].config().shared_mem_bytes,
        kernel_abi::gla::backward::dqkg_smem_bytes(128, 128)
    );

    let p = GlaProblem::new(1, 300, 2, 64, 128).with_segment_len(64);
    let plan = p.plan_backward(target, &full_tensors(&p)).unwrap();
    assert_eq!(plan.segments.segments.len(), 5);
    assert_eq!(plan.workspace, Some((5 * 2 * 64 * 128, 5 * 2 * 64)));
    assert_eq!(plan.seg_init_len, 5 * 2 * 64 * 128);
    assert_eq!(
        checked_names(&plan),
        [
            "gla_bwd_states_dk64_dv128",
            "gla_bwd_combine",
            "gla_bwd_dhdv_dk64_dv128",
            "gla_states_dk64_dv128",
            "gla_combine",
            "gla_bwd_dqkg_tc_dk64_dv128",
        ]
    );
    // A split plan without seg_init is refused.
    let (seg, comb) = plan.segments.table_words();
    let (state, decay) = plan.workspace.unwrap();
    let ws = GlaBackwardWorkspace {
        segments: view(8 << 30, seg.len()),
        grad: view(9 << 30, plan.grad_len),
        split: Some(GlaBackwardSplit {
            combine: view(10 << 30, comb.len()),
            seg_end: view(11 << 30, state),
            delta: view(12 << 30, state),
            decay_log2: view(13 << 30, decay),
            seg_init: None,
        }),
    };
    assert!(plan.launches(&ws).is_err());
    // Short gradients are refused.
    let mut t = full_tensors(&p);
    t.d_g = view(19 << 30, p.qk_len() - 1);
    assert!(p.plan_backward(target, &t).is_err());
    let mut t = full_tensors(&p);
    t.v = view(15 << 30, p.v_len() - 1);
    assert!(p.plan_backward(target, &t).is_err());
}

#[test]
fn rejects_a_missing_split_workspace() {
    let target = Target {
        arch: Arch::Sm90a,
        multiprocessors: 132,
    };
    let p = GlaProblem::new(1, 200, 1, 64, 64).with_segment_len(32);
    let plan = p.plan_reverse_pass(target, &tensors(&p)).unwrap();
    let (seg, _) = plan.segments.table_words();
    let ws = GlaBackwardWorkspace {
        segments: view(8 << 30, seg.len()),
        grad: view(9 << 30, plan.grad_len),
        split: None,
    };
    assert!(plan.launches(&ws).is_err());
}
