//! CPU tests of the plan: splits, grids and scratch sizes of awkward problems, the kernel of
//! each `n` and variant, the checks of the tensors, and every launch against the PTX.

use super::*;
use crate::error::{Error, Result};
use crate::gpu::{LaunchConfig, check_kernel_launch};
use crate::ptx::Arch;
use half::bf16;
use kernel_abi::mhc as abi;
use std::cell::Cell;

/// Made-up device addresses, one distinct 256-aligned range per view (never dereferenced).
struct Addresses(Cell<u64>);

impl Addresses {
    fn new() -> Self {
        Addresses(Cell::new(1 << 32))
    }

    fn view<'a, T>(&self, len: usize) -> DevView<'a, T> {
        let addr = self.0.get();
        self.0
            .set(addr + (len * std::mem::size_of::<T>()).next_multiple_of(256) as u64 + 256);
        // SAFETY: only planned, never dereferenced.
        unsafe { DevView::from_raw(addr, len) }
    }
}

/// Views of every tensor of `p` (made-up addresses, right sizes).
struct Tensors<'a> {
    weights: RawWeights<'a>,
    x: DevView<'a, bf16>,
    y: DevView<'a, bf16>,
    d_xin: DevView<'a, bf16>,
    d_xnext: DevView<'a, bf16>,
    x_in: DevView<'a, bf16>,
    x_next: DevView<'a, bf16>,
    scratch: RawScratch<'a>,
    coeffs: RawCoefficients<'a>,
    grads: RawGradients<'a>,
}

fn tensors<'a>(p: &MhcProblem, a: &Addresses) -> Tensors<'a> {
    let plan = p.layout();
    let (t, n, c, k, m) = (p.tokens(), p.n, p.c, p.k(), p.m());
    Tensors {
        weights: RawWeights {
            phi: a.view(k * m),
            gamma: p.gamma.then(|| a.view(k)),
            alpha: a.view(3),
            bias: a.view(m),
        },
        x: a.view(t * k),
        y: a.view(t * c),
        d_xin: a.view(t * c),
        d_xnext: a.view(t * k),
        x_in: a.view(t * c),
        x_next: a.view(t * k),
        scratch: RawScratch {
            packed_f1: a.view(plan.packed_f1),
            packed_b2: a.view(plan.packed_b2),
            part_proj: a.view(plan.part_proj),
            part_sumsq: a.view(plan.part_sumsq),
            dh: a.view(plan.dh),
            u: a.view(plan.u),
            xcoef: a.view(t),
            part_coef: a.view(plan.part_coef),
            part_w: a.view(plan.part_w),
        },
        coeffs: RawCoefficients {
            h_pre: a.view(t * n),
            h_post: a.view(t * n),
            h_res: a.view(t * n * n),
            hproj: a.view(t * m),
            rms: a.view(t),
        },
        grads: RawGradients {
            dx: a.view(t * k),
            dy: a.view(t * c),
            dphi: a.view(k * m),
            dgamma: p.gamma.then(|| a.view(k)),
            dalpha: a.view(3),
            dbias: a.view(m),
        },
    }
}

/// The launches of the three passes on `t`, planned by [`MhcProblem::plan`].
fn passes(p: &MhcProblem, t: &Tensors) -> Result<(MhcForwardPre, MhcForwardPost, MhcBackward)> {
    let pre = p.plan(&MhcTensors::ForwardPre {
        weights: t.weights,
        x: t.x,
        scratch: t.scratch,
        coeffs: t.coeffs,
        x_in: t.x_in,
    })?;
    let post = p.plan(&MhcTensors::ForwardPost {
        x: t.x,
        y: t.y,
        coeffs: t.coeffs,
        x_next: t.x_next,
    })?;
    let bwd = p.plan(&MhcTensors::Backward {
        weights: t.weights,
        x: t.x,
        y: t.y,
        coeffs: t.coeffs,
        d_xin: t.d_xin,
        d_xnext: t.d_xnext,
        scratch: t.scratch,
        grads: t.grads,
    })?;
    match (pre, post, bwd) {
        (MhcPlan::ForwardPre(pre), MhcPlan::ForwardPost(post), MhcPlan::Backward(bwd)) => {
            Ok((pre, post, bwd))
        }
        other => panic!("each pass planned as another: {other:?}"),
    }
}

/// Every launch of the passes: its handle's facts and its configuration.
fn launches(
    (pre, post, bwd): &(MhcForwardPre, MhcForwardPost, MhcBackward),
) -> Vec<(kernel_abi::KernelDecl, LaunchConfig)> {
    fn one<P: Copy>(l: &crate::launch::Launch<P>) -> (kernel_abi::KernelDecl, LaunchConfig) {
        (*l.kernel(), *l.config())
    }
    vec![
        one(&pre.prep),
        one(&pre.proj),
        one(&pre.coeff),
        one(&pre.pre),
        one(&post.post),
        one(&bwd.prep),
        one(&bwd.dh),
        one(&bwd.coeff),
        one(&bwd.dx),
        one(&bwd.wgrad),
        one(&bwd.finalize),
    ]
}

#[test]
fn plan_splits_and_sizes_of_awkward_problems() {
    // (problem, variant), then token blocks, chunks per split, projection splits, K tiles,
    // tokens per split, weight-gradient splits, coefficient blocks.
    type Case = ((usize, usize, usize, usize), Option<&'static str>, [u32; 7]);
    let cases: [Case; 5] = [
        // The benchmark shape: 128 token blocks, 2 K splits; 64 K tiles, 4 token splits.
        ((4, 4096, 4, 4096), None, [128, 256, 2, 64, 4096, 4, 1024]),
        // Its 3-stage variant aims for 384 blocks: 3 K splits of 171 chunks.
        (
            (4, 4096, 4, 4096),
            Some("c2s3"),
            [128, 171, 3, 64, 4096, 4, 1024],
        ),
        // One token.
        ((1, 1, 4, 8), None, [1, 1, 1, 1, 32, 1, 1]),
        // No size a multiple of any tile: 999 tokens, K = 4000 (125 chunks).
        ((3, 333, 4, 1000), None, [8, 4, 32, 16, 64, 16, 63]),
        // n = 8: 128 K rows per weight-gradient block.
        ((1, 17, 8, 8), None, [1, 1, 2, 1, 32, 1, 2]),
    ];
    for ((b, s, n, c), variant, want) in cases {
        let p = MhcProblem {
            proj_variant: variant,
            ..MhcProblem::new(b, s, n, c)
        };
        p.validate().unwrap();
        let plan = p.layout();
        let got = [
            plan.token_blocks,
            plan.chunks_per_split,
            plan.proj_splits,
            plan.k_tiles,
            plan.tokens_per_split,
            plan.w_splits,
            plan.coef_blocks,
        ];
        assert_eq!(got, want, "{p:?}");
        let (t, k, m) = (p.tokens(), p.k(), p.m());
        let (n32, k32) = (n as u32, k as u32);
        assert_eq!(plan.packed_f1, abi::f1_words(n32, k32) as usize);
        assert_eq!(plan.packed_b2, abi::b2_words(n32, c as u32) as usize);
        assert_eq!(plan.part_proj, plan.proj_splits as usize * t * m);
        assert_eq!(plan.part_sumsq, plan.proj_splits as usize * t);
        assert_eq!(plan.u, t * abi::m16_of(n32) as usize);
        assert_eq!(plan.part_w, plan.w_splits as usize * k * m);
        assert_eq!(
            plan.part_coef,
            plan.coef_blocks as usize * abi::COEF_PARTIAL as usize
        );
        // The splits cover every chunk of K and every token.
        assert!(plan.chunks_per_split * plan.proj_splits >= abi::f1_chunks(k32));
        assert!(plan.tokens_per_split * plan.w_splits >= t as u32);
    }
}

#[test]
fn launches_use_the_kernels_of_n_and_the_variant() {
    for n in 2..=8 {
        let p = MhcProblem::new(2, 37, n, 24).with_gamma(n % 2 == 0);
        let a = Addresses::new();
        let t = tensors(&p, &a);
        let passes = passes(&p, &t).unwrap();
        let names: Vec<&str> = launches(&passes).iter().map(|(k, _)| k.name).collect();
        let want = [
            "mhc_prep".to_string(),
            format!("mhc_fwd_proj_n{n}"),
            "mhc_fwd_coeff".to_string(),
            format!("mhc_fwd_pre_n{n}"),
            format!("mhc_fwd_post_n{n}"),
            "mhc_prep".to_string(),
            format!("mhc_bwd_dh_n{n}"),
            "mhc_bwd_coeff".to_string(),
            format!("mhc_bwd_dx_n{n}"),
            format!("mhc_bwd_wgrad_n{n}"),
            format!("mhc_bwd_finalize_n{n}"),
        ];
        assert_eq!(names, want);
    }
    for v in abi::PROJ_VARIANTS {
        let p = MhcProblem {
            proj_variant: Some(v.name),
            ..MhcProblem::new(1, 300, v.n as usize, 64)
        };
        let a = Addresses::new();
        let t = tensors(&p, &a);
        let pre = passes(&p, &t).unwrap().0;
        assert_eq!(pre.proj.name(), v.kernel.name);
        assert_eq!(pre.proj.config().shared_mem_bytes, v.config.smem_bytes(v.n));
    }
}

#[test]
fn launches_carry_the_tensors_and_grids() {
    let p = MhcProblem::new(3, 333, 4, 1000)
        .with_gamma(true)
        .with_iters(7);
    let a = Addresses::new();
    let t = tensors(&p, &a);
    let (pre, post, bwd) = passes(&p, &t).unwrap();
    let plan = p.layout();
    let (tokens, c) = (p.tokens() as u32, p.c as u32);
    assert_eq!(
        pre.proj.config().grid,
        (plan.token_blocks, plan.proj_splits, 1)
    );
    assert_eq!(pre.proj.params().x as u64, t.x.addr());
    assert_eq!(pre.proj.params().chunks_per_split, plan.chunks_per_split);
    assert_eq!(pre.coeff.config().grid, (tokens.div_ceil(16), 1, 1));
    assert_eq!(pre.coeff.params().splits, plan.proj_splits);
    assert_eq!(pre.coeff.params().iters, 7);
    assert_eq!(
        pre.pre.config().grid,
        ((tokens * c / 8).div_ceil(256), 1, 1)
    );
    assert_eq!(pre.pre.params().x_in as u64, t.x_in.addr());
    assert_eq!(post.post.params().x_next as u64, t.x_next.addr());
    assert_eq!(
        pre.prep.params().gamma as u64,
        t.weights.gamma.unwrap().addr()
    );
    assert_eq!(
        bwd.coeff.config().shared_mem_bytes,
        abi::bwd_coeff_smem_bytes(7)
    );
    assert_eq!(bwd.wgrad.config().grid, (plan.k_tiles, plan.w_splits, 1));
    assert_eq!(bwd.wgrad.params().tokens_per_split, plan.tokens_per_split);
    assert_eq!(
        bwd.finalize.config().grid,
        (abi::finalize_blocks(4, 4000), 1, 1)
    );
    assert_eq!(
        bwd.finalize.params().dgamma as u64,
        t.grads.dgamma.unwrap().addr()
    );
    // Without gamma, its pointers are null.
    let p = MhcProblem::new(1, 5, 2, 8);
    let t = tensors(&p, &a);
    let (pre, _, bwd) = passes(&p, &t).unwrap();
    assert!(pre.prep.params().gamma.is_null());
    assert!(bwd.finalize.params().gamma.is_null() && bwd.finalize.params().dgamma.is_null());
}

#[test]
fn every_launch_passes_the_ptx_checks() {
    let mut problems: Vec<MhcProblem> = (2..=8)
        .map(|n| MhcProblem::new(1, 70, n, 56).with_gamma(true))
        .collect();
    problems.extend([
        MhcProblem::new(1, 1, 4, 8),
        MhcProblem::new(3, 333, 4, 1000).with_iters(100),
        MhcProblem::new(4, 4096, 4, 4096).with_iters(1),
    ]);
    // The tuning variants need Hopper's shared memory.
    let variants = abi::PROJ_VARIANTS.iter().map(|v| MhcProblem {
        proj_variant: Some(v.name),
        ..MhcProblem::new(2, 512, v.n as usize, 1000)
    });
    for (arch, max_smem, problems) in [
        (
            Arch::Sm90a,
            227 * 1024,
            problems.iter().copied().chain(variants).collect(),
        ),
        (Arch::Sm80, 163 * 1024, problems.clone()),
    ] {
        for p in problems {
            let a = Addresses::new();
            let t = tensors(&p, &a);
            for (kernel, cfg) in launches(&passes(&p, &t).unwrap()) {
                check_kernel_launch(arch, &kernel, &cfg, max_smem)
                    .unwrap_or_else(|e| panic!("{arch} {p:?}: {e}"));
            }
        }
    }
}

#[test]
fn the_kernel_table_matches_the_ptx() {
    for arch in Arch::ALL {
        for k in abi::KERNELS {
            let info = arch.kernels().get(k.name).unwrap_or_else(|| {
                panic!("{} missing from the {arch} PTX", k.name);
            });
            assert_eq!(info.params, [k.param_bytes], "{arch} {}", k.name);
            assert_eq!(info.max_threads, Some(k.threads), "{arch} {}", k.name);
            assert_eq!(info.min_blocks, Some(k.min_blocks), "{arch} {}", k.name);
        }
    }
}

#[test]
fn launches_check_the_problem_and_the_tensors() {
    let p = MhcProblem::new(1, 4, 4, 16);
    let a = Addresses::new();
    let plan = p.layout();
    let t = tensors(&p, &a);
    let pre = |t: &Tensors| plan.forward_pre(&t.weights, t.x, &t.scratch, &t.coeffs, t.x_in);

    let mut bad = tensors(&p, &a);
    bad.x = a.view(p.tokens() * p.k() - 1);
    assert!(matches!(pre(&bad), Err(Error::ShapeMismatch { .. })));

    let mut bad = tensors(&p, &a);
    // SAFETY: only planned, never dereferenced.
    bad.x = unsafe { DevView::from_raw(t.x.addr() + 2, t.x.len()) };
    assert!(matches!(pre(&bad), Err(Error::Misaligned { .. })));

    let mut bad = tensors(&p, &a);
    bad.weights.gamma = Some(a.view(p.k()));
    assert!(matches!(pre(&bad), Err(Error::InvalidArgument { .. })));

    // A workspace of another problem.
    let other = tensors(&MhcProblem::new(1, 4, 4, 24), &a);
    let mut bad = tensors(&p, &a);
    bad.scratch = other.scratch;
    assert!(matches!(pre(&bad), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(
        plan.backward(
            &t.weights,
            t.x,
            t.y,
            &t.coeffs,
            t.d_xin,
            t.d_xnext,
            &bad.scratch,
            &t.grads
        ),
        Err(Error::ShapeMismatch { .. })
    ));

    // dgamma without gamma.
    let mut bad = tensors(&p, &a);
    bad.grads.dgamma = Some(a.view(p.k()));
    assert!(matches!(
        plan.backward(
            &t.weights, t.x, t.y, &t.coeffs, t.d_xin, t.d_xnext, &t.scratch, &bad.grads
        ),
        Err(Error::InvalidArgument { .. })
    ));

    // An invalid problem is refused by its plan's launches.
    let p = MhcProblem::new(1, 4, 9, 16);
    assert!(matches!(
        passes(&p, &tensors(&MhcProblem::new(1, 4, 8, 16), &a)),
        Err(Error::Unsupported { .. })
    ));
    assert!(MhcProblem::new(1, 4, 9, 16).proj_kernel().is_none());
}
