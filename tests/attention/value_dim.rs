//! V and O of their own head dimension (the pairs of `kernel_abi::attention::VALUE_DIMS`): the
//! forward on both paths against the f64 reference (the dense tests' tolerance), in the CPU
//! emulator (`mma.sync`), and the plans' kernels and typed refusals.

use super::{Case, head_dim_cases, name, run, run_emulated, value_dim_case};
use kernel_tests::emu::HostBuf;
use kernel_tests::{Needs, Suite, TestResult, ensure};
use kernels::Arch;
use kernels::attention::{AttentionProblem, AttentionTensors, Dtype, Path, Target, View};
use kernels::{Error, bf16, f16};

/// Register the GPU cases (`attention/{hopper,mma}_value_dim/*`), the emulated ones
/// (`attention/emulated_value_dim/*`) and the plans (`attention/value_dim_plans`).
pub(super) fn register(s: &mut Suite) {
    for c in value_dim_cases() {
        for (path, needs, tag) in [
            (Path::Hopper, Needs::Hopper, "hopper"),
            (Path::MmaSync, Needs::Gpu, "mma"),
        ] {
            let mut c = c.clone();
            c.p.path = path;
            let n = format!("attention/{tag}_value_dim/{}", name(&c));
            s.gpu(&n, needs, move |g| match c.p.dtype {
                Dtype::Bf16 => run::<bf16>(g, &c),
                Dtype::F16 => run::<f16>(g, &c),
            });
        }
    }
    s.cpu("attention/value_dim_plans", value_dim_plans);
    for (d, dv) in kernel_abi::attention::VALUE_DIMS {
        for mut c in head_dim_cases(d as usize) {
            c.p = c.p.value_dim(dv as usize);
            let n = format!("attention/emulated_value_dim/{}", name(&c));
            s.cpu(&n, move || run_emulated(&c, "default"));
        }
    }
}

/// Problems whose V and O have a head dimension of their own, for each pair of
/// `VALUE_DIMS`: lengths from 1 to 1024 (one key step, partial steps, the ring's
/// wrap-around), causal and not, GQA and MQA, windows, rows with no allowed key, extreme logits,
/// many tiles per block of the persistent grid, f16.
fn value_dim_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (d, dv) in kernel_abi::attention::VALUE_DIMS {
        let (d, dv) = (d as usize, dv as usize);
        let pair = |b, sq, sk, hq, hkv, dtype| value_dim_case(b, sq, sk, (hq, hkv), (d, dv), dtype);
        for (sq, sk) in [
            (1, 1),
            (113, 203),
            (239, 1),
            (799, 3),
            (1023, 1024),
            (129, 389),
        ] {
            for causal in [false, true] {
                let b = if sq * sk < 100_000 { 2 } else { 1 };
                let mut c = pair(b, sq, sk, 4, 2, Dtype::Bf16);
                c.p.causal = causal;
                v.push(c);
            }
        }
        for hkv in [8, 1] {
            v.push(pair(2, 257, 300, 8, hkv, Dtype::Bf16));
        }
        let mut w = pair(1, 500, 700, 4, 4, Dtype::Bf16);
        w.p.window = (Some(64), Some(32));
        v.push(w);
        let mut m = pair(2, 300, 100, 2, 2, Dtype::Bf16); // 200 rows with no allowed key
        m.p.causal = true;
        v.push(m);
        let mut big = pair(1, 129, 257, 2, 2, Dtype::Bf16);
        big.p.scale = Some(10.0);
        big.range = 1e17;
        v.push(big);
        for causal in [false, true] {
            let mut c = pair(3, 1100, 1100, 8, 2, Dtype::Bf16); // 216 tiles
            c.p.causal = causal;
            v.push(c);
        }
        for causal in [false, true] {
            let mut c = pair(2, 113, 203, 4, 2, Dtype::F16);
            c.p.causal = causal;
            v.push(c);
        }
    }
    v
}

/// The plans of a value head dimension of its own: the Hopper kernel of the pair on sm_90a,
/// its `mma.sync` kernel on sm_80 or when asked; typed errors where no kernel has it (pairs not
/// built, a softcap, a tuning variant) and for an O of Q's head dimension.
fn value_dim_plans() -> TestResult {
    let p = AttentionProblem::new(1, 64, 64, 2, 2, 192, Dtype::Bf16).value_dim(128);
    let hopper = Target {
        arch: Arch::Sm90a,
        multiprocessors: 132,
    };
    let sm80 = Target {
        arch: Arch::Sm80,
        multiprocessors: 108,
    };
    let mut q = HostBuf::filled(64 * 2 * 192, bf16::ZERO);
    let mut k = HostBuf::filled(64 * 2 * 192, bf16::ZERO);
    let mut v = HostBuf::filled(64 * 2 * 128, bf16::ZERO);
    let mut o = HostBuf::filled(64 * 2 * 128, bf16::ZERO);
    let mut o192 = HostBuf::filled(64 * 2 * 192, bf16::ZERO);
    let mut lse = HostBuf::filled(2 * 64, 0.0f32);
    let t = AttentionTensors {
        q: View::contiguous(q.view(), p.q_shape()),
        k: View::contiguous(k.view(), p.kv_shape()),
        v: View::contiguous(v.view(), p.v_shape()),
        o: View::contiguous(o.view(), p.o_shape()),
        lse: lse.view(),
        sinks: None,
        tile_counter: None,
    };
    let mma = p.clone().path(Path::MmaSync);
    for (what, p, target, want) in [
        ("sm_90a", &p, hopper, "attention_fwd_hopper_bf16_d192_v128"),
        ("sm_80", &p, sm80, "attention_fwd_bf16_d192_v128"),
        (
            "mma.sync path",
            &mma,
            hopper,
            "attention_fwd_bf16_d192_v128",
        ),
    ] {
        let name = p.plan(target, &t, None).map(|plan| plan.kernel().name);
        println!("{what}: {name:?}");
        ensure(name.as_ref().is_ok_and(|n| *n == want), || {
            format!("(192, 128) on {what}: {name:?}, want {want}")
        })?;
    }
    let unsupported = |what: &str, r: kernels::Result<()>| -> TestResult {
        println!("{what}: {r:?}");
        ensure(matches!(r, Err(Error::Unsupported { .. })), || {
            format!("{what}: want an Unsupported error, got {r:?}")
        })
    };
    unsupported(
        "tuning variant",
        p.plan(hopper, &t, Some("hpp")).map(|_| ()),
    )?;
    unsupported("softcap", p.clone().softcap(30.0).validate())?;
    unsupported(
        "pair (128, 64)",
        AttentionProblem::new(1, 64, 64, 2, 2, 128, Dtype::Bf16)
            .value_dim(64)
            .validate(),
    )?;
    // O of Q's head dimension is a shape error.
    let wrong_o = AttentionTensors {
        o: View::contiguous(o192.view(), p.q_shape()),
        ..t
    };
    let r = p.plan(hopper, &wrong_o, None).map(|_| ());
    println!("O of D = 192: {r:?}");
    ensure(matches!(r, Err(Error::ShapeMismatch { .. })), || {
        format!("O of D = 192: want a shape error, got {r:?}")
    })
}
