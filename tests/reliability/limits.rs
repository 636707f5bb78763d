//! Element counts above 2^31 (accepted, the kernels use 64-bit offsets, or a typed error), the
//! largest head dimension and sequence lengths; no allocation.

use crate::HOPPER_MAX_SMEM;
use crate::props::{attention_plan, semicrf_launches, semicrf_passes};
use kernel_tests::{TestResult, ensure};
use kernels::attention::{AttentionProblem, Dtype, Path};
use kernels::gla::GlaProblem;
use kernels::gpu::check_kernel_launch;
use kernels::mhc::MhcProblem;
use kernels::semicrf::SemiCrfProblem;
use kernels::{Arch, Error, LaunchConfig};

pub fn attention() -> TestResult {
    // 2^14 x 2^11 x 32 x 128 = 2^37 elements of Q: accepted (the kernels form offsets in 64 bits
    // from 64-bit strides), LSE has 2^30 entries (< 2^32).
    let big = AttentionProblem::new(16, 1 << 14, 1 << 14, 32 * 128, 32, 256, Dtype::Bf16);
    let q_elems: u128 = big.q_shape().iter().map(|&x| x as u128).product();
    ensure(q_elems > 1 << 31, || "not above 2^31".into())?;
    big.validate().map_err(|e| format!("{e}"))?;
    // Both paths' launches (the `mma.sync` path planned for sm_80), on the sm_90a PTX.
    for (arch, path, hopper) in [
        (Arch::Sm80, Path::Auto, false),
        (Arch::Sm90a, Path::Hopper, true),
    ] {
        let plan = attention_plan(&big.clone().path(path), arch).map_err(|e| format!("{e}"))?;
        ensure(plan.is_hopper() == hopper, || {
            format!("{path:?} planned {}", plan.kernel().name)
        })?;
        check_kernel_launch(Arch::Sm90a, &plan.kernel(), &plan.config(), HOPPER_MAX_SMEM)
            .map_err(|e| format!("{e}"))?;
    }
    // The longest sequences: seq < 2^30 each; LSE entries batch * heads * seq_q < 2^32.
    let long =
        AttentionProblem::new(1, (1 << 30) - 1, (1 << 30) - 1, 2, 1, 256, Dtype::Bf16).causal();
    long.validate().map_err(|e| format!("{e}"))?;
    let plan = attention_plan(&long, Arch::Sm80).map_err(|e| format!("{e}"))?;
    check_kernel_launch(Arch::Sm80, &plan.kernel(), &plan.config(), HOPPER_MAX_SMEM)
        .map_err(|e| format!("{e}"))?;
    for (p, what) in [
        (
            AttentionProblem::new(1, 1 << 30, 1, 1, 1, 64, Dtype::Bf16),
            "seq_q = 2^30",
        ),
        (
            AttentionProblem::new(64, 1 << 22, 1, 1024, 1, 64, Dtype::Bf16),
            "LSE of 2^38 entries",
        ),
        (
            AttentionProblem::new(1, 1, 1, 1, 1, 512, Dtype::Bf16),
            "head_dim 512",
        ),
        (
            AttentionProblem::new(70_000, 1, 1, 1, 1, 64, Dtype::Bf16),
            "batch above the grid",
        ),
    ] {
        let e = p
            .validate()
            .err()
            .ok_or_else(|| format!("{what}: accepted"))?;
        ensure(
            matches!(e, Error::Unsupported { .. } | Error::InvalidArgument { .. }),
            || format!("{what}: {e}"),
        )?;
        println!("{what}: {e}");
    }
    Ok(())
}

pub fn semicrf() -> TestResult {
    // B (T + 1) C K above 2^31: accepted (64-bit offsets in every kernel).
    let p = SemiCrfProblem::new(64, 100_000, 32, 24);
    ensure((p.batch * (p.t + 1) * p.c * p.k) as u64 > 1 << 31, || {
        "not above 2^31".into()
    })?;
    p.validate().map_err(|e| format!("{e}"))?;
    // Every launch of every pass, on the sm_90a PTX.
    for tensors in semicrf_passes(&p) {
        let plan = p.plan(&tensors).map_err(|e| format!("{e}"))?;
        for (kernel, cfg) in semicrf_launches(&plan) {
            check_kernel_launch(Arch::Sm90a, kernel, cfg, HOPPER_MAX_SMEM)
                .map_err(|e| format!("{e}"))?;
        }
    }
    let m = p.memory();
    ensure(m.marginals as u64 > 1 << 31, || {
        "marginals not above 2^31 bytes".into()
    })?;
    for (p, what) in [
        (
            SemiCrfProblem::new(1, (u32::MAX / 2) as usize, 4, 4),
            "T = 2^31",
        ),
        (
            SemiCrfProblem::new(65_536, 10, 4, 4),
            "batch above the grid",
        ),
        (
            SemiCrfProblem::new(1, 10, 70_000, 1),
            "K above 16-bit backpointers",
        ),
        (
            SemiCrfProblem::new(1, 10, 4000, 64),
            "K C over the shared-memory budget",
        ),
    ] {
        let e = p
            .validate()
            .err()
            .ok_or_else(|| format!("{what}: accepted"))?;
        ensure(
            matches!(e, Error::Unsupported { .. } | Error::InvalidArgument { .. }),
            || format!("{what}: {e}"),
        )?;
        println!("{what}: {e}");
    }
    Ok(())
}

pub fn gla() -> TestResult {
    // rows * heads just below 2^31 at dk = dv = 128: 2^37 elements of q, accepted (64-bit
    // offsets); the tables are not built (they would be large, not invalid).
    let p = GlaProblem::new(1, (1 << 31) / 64 - 1, 64, 128, 128);
    ensure(p.qk_len() as u64 > 1 << 31, || "not above 2^31".into())?;
    p.validate().map_err(|e| format!("{e}"))?;
    for (p, what) in [
        (
            GlaProblem::new(1, 1 << 25, 64, 64, 64),
            "rows * heads = 2^31",
        ),
        // A product that wraps usize must not pass the limit.
        (
            GlaProblem::new(1 << 32, 1 << 32, 1, 64, 64),
            "batch * seq_len = 2^64",
        ),
        (
            GlaProblem::new(1, 64, 70_000, 64, 64),
            "heads above the grid",
        ),
        (GlaProblem::new(1, 64, 1, 256, 64), "dk = 256"),
    ] {
        let e = p
            .validate()
            .err()
            .ok_or_else(|| format!("{what}: accepted"))?;
        ensure(matches!(e, Error::Unsupported { .. }), || {
            format!("{what}: {e}")
        })?;
        println!("{what}: {e}");
    }
    // An overlapped launch (programmatic dependent launch) needs sm_90a code: the same launch
    // of a baseline kernel passes on sm_80 without it and is refused with it.
    let (fwd, _) = kernel_abi::gla::baseline_kernels(64, 64).ok_or("no (64, 64) baseline")?;
    let cfg = LaunchConfig::new((1, 1, 1), fwd.threads, fwd.smem_bytes(()));
    check_kernel_launch(Arch::Sm80, &fwd.info(), &cfg, HOPPER_MAX_SMEM)
        .map_err(|e| format!("{e}"))?;
    let e = check_kernel_launch(
        Arch::Sm80,
        &fwd.info(),
        &cfg.overlapping_previous(),
        HOPPER_MAX_SMEM,
    )
    .err()
    .ok_or("an overlapped sm_80 launch: accepted")?;
    ensure(matches!(e, Error::InvalidLaunch { .. }), || format!("{e}"))?;
    println!("overlapped sm_80 launch: {e}");
    Ok(())
}

pub fn mhc() -> TestResult {
    // T n C = 2^40 (the limit) with T = 2^20 tokens: 2^40 elements of x, accepted.
    let p = MhcProblem::new(1 << 10, 1 << 10, 4, 1 << 18);
    p.validate().map_err(|e| format!("{e}"))?;
    let plan = p.layout();
    ensure(plan.part_w > 0 && plan.dh == p.tokens() * p.m(), || {
        format!("{plan:?}")
    })?;
    for (p, what) in [
        (
            MhcProblem::new(1 << 11, 1 << 10, 4, 1 << 18),
            "T n C = 2^41",
        ),
        // A token count that wraps usize must not pass the limit.
        (
            MhcProblem::new(1 << 33, 1 << 31, 4, 64),
            "batch * seq = 2^64",
        ),
        (MhcProblem::new(1, 1 << 31, 4, 64), "T = 2^31"),
    ] {
        let e = p
            .validate()
            .err()
            .ok_or_else(|| format!("{what}: accepted"))?;
        ensure(matches!(e, Error::Unsupported { .. }), || {
            format!("{what}: {e}")
        })?;
        println!("{what}: {e}");
    }
    Ok(())
}
