//! Attention forward against the f64 reference.
//!
//! Tolerance (FlashAttention's rule): `max |O - ref| <= 2 * max |O_naive - ref| + 1e-3`, where
//! `O_naive` is a straightforward implementation in the input precision
//! (`attention::naive_same_precision`); LSE within `1e-3 * max(1, |ref|)` (absolute below 1,
//! relative above: LSE grows with the logits), and `-inf` exactly where the reference has it.
//!
//! The backward's tests (`attention_bwd/*`) are in `attention/backward.rs` (strided views and
//! the raw API in `attention/backward_views.rs`), the forward over
//! packed sequences (`attention_varlen/*`) in `attention/varlen.rs`, its backward
//! (`attention_varlen_bwd/*`) in `attention/varlen_bwd.rs`; decoding over a paged KV cache
//! (`attention_decode/*`) in `attention/decode.rs`; the softcap and sinks
//! (`attention_capsink/*`) in `attention/capsink.rs`, their backward
//! (`attention_capsink_bwd/*`) in `attention/capsink_bwd.rs`; the FP8 forward
//! (`attention_fp8/*`) in `attention/fp8.rs`; V and O of their own head dimension
//! (`attention/*value_dim*`) in `attention/value_dim.rs`.

use kernel_abi::attention::{Softmax, TUNING_VARIANTS};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok, portable_gpu};
use kernels::Arch;
use kernels::attention::{
    self, AttentionElem, AttentionProblem, AttentionTensors, Dtype, Path, Target, View,
};
use kernels::data::rng;
use kernels::memory::{download, download_range, poisoned, upload};
use kernels::{Error, Gpu, bf16, f16};
use kernels_testing::attention as testing;
use rand::Rng;

#[path = "attention/api.rs"]
mod api;
#[path = "attention/append.rs"]
mod append;
#[path = "attention/backward.rs"]
mod backward;
#[path = "attention/capsink.rs"]
mod capsink;
#[path = "attention/capsink_bwd.rs"]
mod capsink_bwd;
#[path = "attention/decode.rs"]
mod decode;
#[path = "attention/fp8.rs"]
mod fp8;
#[path = "attention/reference_fd.rs"]
mod reference_fd;
#[path = "attention/value_dim.rs"]
mod value_dim;
#[path = "attention/varlen.rs"]
mod varlen;
#[path = "attention/varlen_bwd.rs"]
mod varlen_bwd;

#[derive(Clone, Debug)]
struct Case {
    p: AttentionProblem,
    /// Inputs uniform in `[-range, range)`.
    range: f32,
    seed: u64,
}

fn case(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize, dtype: Dtype) -> Case {
    Case {
        p: AttentionProblem::new(b, sq, sk, hq, hkv, d, dtype),
        range: 1.0,
        seed: (b * 1_000_003 + sq * 7919 + sk * 131 + hq * 17 + hkv * 5 + d) as u64,
    }
}

/// [`case`] with V and O of head dimension `dv` (`(d, dv)` a pair of `VALUE_DIMS`), its seed
/// offset by `dv`.
fn value_dim_case(
    b: usize,
    sq: usize,
    sk: usize,
    (hq, hkv): (usize, usize),
    (d, dv): (usize, usize),
    dtype: Dtype,
) -> Case {
    let mut c = case(b, sq, sk, hq, hkv, d, dtype);
    c.p = c.p.value_dim(dv);
    c.seed = c.seed.wrapping_add(dv as u64);
    c
}

fn name(c: &Case) -> String {
    let p = &c.p;
    let mut s = format!(
        "{:?}_d{}_b{}_sq{}_sk{}_h{}x{}",
        p.dtype, p.head_dim, p.batch, p.seq_q, p.seq_k, p.heads_q, p.heads_kv
    )
    .to_lowercase();
    if p.has_value_dim() {
        s.push_str(&format!("_v{}", p.v_dim()));
    }
    if p.causal {
        s.push_str("_causal");
    }
    if p.window != (None, None) {
        s.push_str(
            &format!("_win{:?}_{:?}", p.window.0, p.window.1)
                .replace("Some(", "")
                .replace(')', "")
                .replace("None", "inf"),
        );
    }
    if let Some(sc) = p.scale {
        s.push_str(&format!("_scale{sc}"));
    }
    if c.range != 1.0 {
        s.push_str(&format!("_range{:e}", c.range));
    }
    s
}

/// The head dimensions with the full GPU case lists (those each tile configuration was measured
/// at); the other multiples of 16 of [`kernels::attention::HEAD_DIMS`] take shorter lists.
pub(crate) const FULL_CASE_DIMS: [usize; 5] = [64, 96, 128, 192, 256];

/// `HEAD_DIMS` as sizes.
pub(crate) fn head_dims() -> impl Iterator<Item = usize> {
    kernels::attention::HEAD_DIMS
        .into_iter()
        .map(|d| d as usize)
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for d in head_dims() {
        let shapes: &[(usize, usize)] = if FULL_CASE_DIMS.contains(&d) {
            &[(1, 1), (113, 203), (239, 1), (799, 3), (1023, 1024)]
        } else {
            &[(1, 1), (113, 203), (1023, 1024)]
        };
        for &(sq, sk) in shapes {
            for causal in [false, true] {
                let b = if sq * sk < 100_000 { 2 } else { 1 };
                let mut c = case(b, sq, sk, 4, 2, d, Dtype::Bf16);
                c.p.causal = causal;
                v.push(c);
            }
        }
    }
    for causal in [false, true] {
        let mut c = case(1, 2048, 2048, 2, 2, 128, Dtype::Bf16);
        c.p.causal = causal;
        v.push(c);
    }
    // Grouped-query and multi-query attention.
    for hkv in [8, 2, 1] {
        v.push(case(2, 257, 300, 8, hkv, 128, Dtype::Bf16));
    }
    // Sliding windows, and rows with no allowed key.
    let mut w = case(1, 500, 700, 4, 4, 64, Dtype::Bf16);
    w.p.window = (Some(64), Some(32));
    v.push(w);
    let mut w = case(2, 300, 300, 2, 1, 128, Dtype::Bf16);
    w.p.window = (Some(100), None);
    v.push(w);
    let mut w = case(1, 256, 256, 2, 2, 256, Dtype::Bf16);
    w.p.window = (Some(17), Some(0));
    v.push(w);
    let mut m = case(2, 300, 100, 2, 2, 64, Dtype::Bf16); // causal, seq_q > seq_k: 200 empty rows
    m.p.causal = true;
    v.push(m);
    let mut m = case(1, 200, 180, 2, 2, 128, Dtype::Bf16); // window entirely left of some rows
    m.p.window = (Some(0), Some(0));
    v.push(m);
    // Extreme logits: scale 10 with inputs up to 1e17 (logits near 1e36), and tiny inputs.
    let mut big = case(1, 129, 257, 2, 2, 64, Dtype::Bf16);
    big.p.scale = Some(10.0);
    big.range = 1e17;
    v.push(big);
    let mut small = case(1, 129, 257, 2, 2, 128, Dtype::Bf16);
    small.range = 1e-20;
    v.push(small);
    // Causal past the dynamic grid's bound (seq_k * D = 2^19): one block per query tile, in key
    // steps of 192 (D = 64 from 8192 keys on).
    let mut long_keys = case(1, 129, 8192, 2, 1, 64, Dtype::Bf16);
    long_keys.p.causal = true;
    v.push(long_keys);
    // f16 (causal ones on the dynamic grid, D = 64 and 128; D = 64 on 8200 keys in steps of
    // 192, the last one partial).
    for (d, sq, sk, causal) in [
        (64, 1023, 1024, false),
        (64, 200, 8200, false),
        (64, 700, 700, true),
        (128, 113, 203, true),
        (128, 1023, 1024, true),
        (256, 239, 1, false),
    ] {
        let mut c = case(2, sq, sk, 4, 2, d, Dtype::F16);
        c.p.causal = causal;
        v.push(c);
    }
    v
}

fn main() {
    let mut s = Suite::new();
    // Every case on both paths: the Hopper path (TMA + wgmma, Hopper GPUs) and the mma.sync
    // tensor-core path (every GPU; also what Auto picks elsewhere).
    for c in cases() {
        for (path, needs, tag) in [
            (Path::Hopper, Needs::Hopper, "hopper"),
            (Path::MmaSync, Needs::Gpu, "mma"),
        ] {
            let mut c = c.clone();
            c.p.path = path;
            let n = format!("attention/{tag}/{}", name(&c));
            s.gpu(&n, needs, move |g| match c.p.dtype {
                Dtype::Bf16 => run::<bf16>(g, &c),
                Dtype::F16 => run::<f16>(g, &c),
            });
        }
    }
    value_dim::register(&mut s);
    // Hopper pipeline stress: K/V of 1, 2, 3 ring tiles and partial tiles (wrap-around of the
    // 2-stage ring), every head dimension.
    for d in [64usize, 128, 256] {
        let bn = kernel_abi::attention::hopper_config(d as u32).map_or(64, |c| c.block_n as usize);
        for sk in [1, bn, 2 * bn, 3 * bn, 3 * bn + 5, 7 * bn + 1] {
            let mut c = case(1, 129, sk, 2, 1, d, Dtype::Bf16);
            c.p.path = Path::Hopper;
            let n = format!("attention/hopper_ring/{}", name(&c));
            s.gpu(&n, Needs::Hopper, move |g| run::<bf16>(g, &c));
        }
    }
    // More tiles than multiprocessors (216 tiles): the default grid (persistent without a
    // mask; under causal masking, given the tests' tile counter, the dynamic grid: tiles of
    // different lengths drawn at run time), and the static persistent grid under causal
    // masking ("hstatic": blocks take 1 or 2).
    for causal in [false, true] {
        let mut c = case(3, 1100, 1100, 8, 2, 128, Dtype::Bf16);
        c.p.causal = causal;
        c.p.path = Path::Hopper;
        let n = format!("attention/hopper_persistent/{}", name(&c));
        let c2 = c.clone();
        s.gpu(&n, Needs::Hopper, move |g| run::<bf16>(g, &c));
        if causal {
            let n = format!("attention/hopper_persistent/hstatic_{}", name(&c2));
            s.gpu(&n, Needs::Hopper, move |g| run_variant(g, &c2, "hstatic"));
        }
    }
    s.gpu(
        "attention/concurrent_streams",
        Needs::Gpu,
        api::concurrent_streams,
    );
    s.gpu(
        "attention/sm_80_target",
        Needs::Gpu,
        |_| match portable_gpu() {
            None => {
                println!("the default target is already sm_80");
                Ok(())
            }
            Some(g) => {
                let mut c = case(1, 1023, 1024, 4, 1, 128, Dtype::Bf16);
                c.p.causal = true;
                run::<bf16>(g, &c)?;
                run::<bf16>(g, &case(2, 113, 203, 4, 2, 64, Dtype::Bf16))
            }
        },
    );
    for (variant, cfg) in kernel_abi::attention::TUNING_VARIANTS {
        let d = cfg.head_dim as usize;
        let mut causal = case(2, 1023, 1024, 4, 2, d, Dtype::Bf16);
        causal.p.causal = true;
        let mut window = case(1, 500, 700, 4, 4, d, Dtype::Bf16);
        window.p.window = (Some(64), Some(32));
        let plain = case(2, 113, 203, 4, 2, d, Dtype::Bf16);
        let one_step = case(1, 17, 9, 2, 1, d, Dtype::Bf16);
        let mut cs = vec![causal, window, plain, one_step];
        if cfg.softmax != Softmax::Scaled {
            // The folded softmax's two paths: huge maxima (scaled first) and, with logits spread
            // widely, lazy rescales after the first step.
            let mut big = case(1, 129, 257, 2, 2, d, Dtype::Bf16);
            big.p.scale = Some(10.0);
            big.range = 1e17;
            let mut spread = case(1, 64, 1024, 2, 1, d, Dtype::Bf16);
            spread.range = 8.0;
            cs.extend([big, spread]);
        }
        for c in cs {
            let n = format!("attention/variant_{variant}/{}", name(&c));
            s.gpu(&n, Needs::Gpu, move |g| run_variant(g, &c, variant));
        }
    }
    // The Hopper path's tuning variants: masks, GQA, one step, the ring's wrap-around (K/V of
    // 1, 2, 3 tiles and partial ones) and, for the folded softmax, huge and widely spread
    // logits.
    for (variant, cfg) in kernel_abi::attention::HOPPER_VARIANTS {
        let d = cfg.head_dim as usize;
        let bn = cfg.block_n as usize;
        let mut causal = case(2, 1023, 1024, 4, 2, d, Dtype::Bf16);
        causal.p.causal = true;
        let mut window = case(1, 500, 700, 4, 4, d, Dtype::Bf16);
        window.p.window = (Some(64), Some(32));
        let mut cs = vec![
            causal,
            window,
            case(2, 113, 203, 4, 2, d, Dtype::Bf16),
            case(1, 17, 9, 2, 1, d, Dtype::Bf16),
        ];
        for sk in [1, bn, 2 * bn, 3 * bn + 5, 7 * bn + 1] {
            cs.push(case(1, 129, sk, 2, 1, d, Dtype::Bf16));
        }
        // Bottom-right causal with seq_q > seq_k: the first tiles have no key step at all.
        let mut empty_tiles = case(2, 700, 300, 2, 1, d, Dtype::Bf16);
        empty_tiles.p.causal = true;
        cs.push(empty_tiles);
        if cfg.softmax != Softmax::Scaled {
            let mut big = case(1, 129, 257, 2, 2, d, Dtype::Bf16);
            big.p.scale = Some(10.0);
            big.range = 1e17;
            let mut spread = case(1, 64, 1024, 2, 1, d, Dtype::Bf16);
            spread.range = 8.0;
            cs.extend([big, spread]);
        }
        for c in cs {
            let n = format!("attention/hopper_variant_{variant}/{}", name(&c));
            s.gpu(&n, Needs::Hopper, move |g| run_variant(g, &c, variant));
        }
    }
    // The D = 128 default kernel and the variants with another softmax mode, in the CPU
    // emulator (the kernels' own code over the emulated device layer): one step and many,
    // every kind of mask, rows with no allowed key, extreme logits, and logits spread widely
    // enough that the lazy rescale both skips and rescales after the first step.
    let emulated = std::iter::once("default").chain(
        TUNING_VARIANTS
            .iter()
            .filter(|(_, c)| c.softmax != Softmax::Scaled)
            .map(|(n, _)| *n),
    );
    for variant in emulated {
        for c in emulated_cases() {
            let n = format!("attention/emulated_{variant}/{}", name(&c));
            s.cpu(&n, move || run_emulated(&c, variant));
        }
    }
    // Head dimensions other than 64, 128 and 256 (each takes the tiles of the next of those):
    // the default tiles in the emulator, causal and windowed, odd lengths (f16 in the backward
    // cases). One of each kind of tile load: chunks per row dividing the threads (32), not
    // dividing them (48, 96, 192), and a last round of copies only partly full (80, 144, 240).
    for d in [32, 48, 80, 96, 144, 192, 240] {
        for c in head_dim_cases(d) {
            let n = format!("attention/emulated_d{d}/{}", name(&c));
            s.cpu(&n, move || run_emulated(&c, "default"));
        }
    }
    s.gpu("attention/packed_qkv_views", Needs::Gpu, api::packed_qkv);
    s.gpu("attention/deterministic", Needs::Gpu, api::deterministic);
    s.gpu("attention/raw_api", Needs::Gpu, api::raw_api);
    s.cpu("attention/rejects_bad_problems", api::rejects_bad_problems);
    s.gpu(
        "attention/rejects_bad_tensors",
        Needs::Gpu,
        api::rejects_bad_tensors,
    );
    s.cpu("attention/mask_convention", api::mask_convention);
    reference_fd::register(&mut s);
    backward::register(&mut s);
    varlen::register(&mut s);
    varlen_bwd::register(&mut s);
    decode::register(&mut s);
    append::register(&mut s);
    capsink::register(&mut s);
    capsink_bwd::register(&mut s);
    fp8::register(&mut s);
    s.run()
}

fn inputs<T: AttentionElem>(c: &Case) -> (Vec<T>, Vec<T>, Vec<T>) {
    testing::random_inputs(&c.p, c.range, c.seed)
}

/// Run on the GPU with contiguous tensors; returns O and LSE.
fn gpu_forward<T: AttentionElem>(
    g: &Gpu,
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> kernels::Result<(Vec<T>, Vec<f32>)> {
    testing::device_forward(g, p, (q, k, v), None)
}

fn compare<T: AttentionElem>(
    what: &str,
    c: &Case,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[f32],
) -> TestResult {
    let want = attention::reference(&c.p, q, k, v);
    let naive = attention::naive_same_precision(&c.p, q, k, v);
    let max_diff = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let naive_err = max_diff(&naive.o, &want.o);
    let tol = 2.0 * naive_err + 1e-3;
    let got: Vec<f64> = o.iter().map(|x| x.to_f32() as f64).collect();
    ensure(got.iter().all(|x| x.is_finite()), || {
        format!("{what}: O has NaN or inf (or an unwritten element)")
    })?;
    let err = max_diff(&got, &want.o);
    let mut lse_err = 0.0f64;
    for (i, (&g, &w)) in lse.iter().zip(&want.lse).enumerate() {
        if w == f64::NEG_INFINITY {
            ensure(g == f32::NEG_INFINITY, || {
                format!("{what}: LSE[{i}] = {g}, the row has no allowed key")
            })?;
            continue;
        }
        ensure(g.is_finite(), || {
            format!("{what}: LSE[{i}] = {g}, want {w}")
        })?;
        let e = (g as f64 - w).abs() / w.abs().max(1.0);
        lse_err = lse_err.max(e);
    }
    let empty_rows = want.lse.iter().filter(|x| **x == f64::NEG_INFINITY).count();
    println!(
        "{what}: max |O - ref| = {err:.3e} (tol {tol:.3e} = 2 x naive {naive_err:.3e} + 1e-3), LSE rel err {lse_err:.3e}, {empty_rows} empty rows"
    );
    ensure(err <= tol, || {
        format!("{what}: max |O - ref| {err:.3e} > {tol:.3e}")
    })?;
    ensure(lse_err <= 1e-3, || {
        format!("{what}: LSE error {lse_err:.3e} > 1e-3")
    })
}

/// Small bf16 problems at D = 128 for the emulator (one OS thread per GPU thread).
fn emulated_cases() -> Vec<Case> {
    let d = 128;
    let mut v = vec![
        case(1, 17, 9, 2, 1, d, Dtype::Bf16),
        case(1, 113, 203, 2, 1, d, Dtype::Bf16),
    ];
    let mut causal = case(1, 150, 100, 1, 1, d, Dtype::Bf16); // 50 rows with no allowed key
    causal.p.causal = true;
    v.push(causal);
    let mut window = case(1, 140, 200, 1, 1, d, Dtype::Bf16);
    window.p.window = (Some(40), Some(8));
    v.push(window);
    let mut big = case(1, 65, 100, 1, 1, d, Dtype::Bf16);
    big.p.scale = Some(10.0);
    big.range = 1e17;
    v.push(big);
    let mut small = case(1, 65, 100, 1, 1, d, Dtype::Bf16);
    small.range = 1e-20;
    v.push(small);
    let mut spread = case(1, 64, 256, 1, 1, d, Dtype::Bf16);
    spread.range = 8.0;
    v.push(spread);
    v
}

/// Small problems at head dimension `d` for the emulator (bf16, as `run_emulated` takes).
fn head_dim_cases(d: usize) -> Vec<Case> {
    let mut v = vec![case(1, 17, 9, 2, 1, d, Dtype::Bf16)];
    let mut causal = case(1, 70, 50, 2, 2, d, Dtype::Bf16); // 20 rows with no allowed key
    causal.p.causal = true;
    v.push(causal);
    let mut window = case(1, 65, 100, 1, 1, d, Dtype::Bf16);
    window.p.window = (Some(20), Some(5));
    v.push(window);
    v
}

/// The `mma.sync` kernel (`variant` "default" or a tuning variant) in the CPU emulator, against
/// the reference with the GPU tests' tolerance; every output element must be written.
fn run_emulated(c: &Case, variant: &str) -> TestResult {
    let (q, k, v) = inputs::<bf16>(c);
    let p = &c.p;
    let (mut dq, mut dk, mut dv) = (
        HostBuf::from_slice(&q),
        HostBuf::from_slice(&k),
        HostBuf::from_slice(&v),
    );
    let mut o = HostBuf::filled(p.o_shape().iter().product(), bf16::NAN);
    let mut lse = HostBuf::filled(p.lse_len(), f32::NAN);
    let tensors = AttentionTensors {
        q: View::contiguous(dq.view(), p.q_shape()),
        k: View::contiguous(dk.view(), p.kv_shape()),
        v: View::contiguous(dv.view(), p.v_shape()),
        o: View::contiguous(o.view(), p.o_shape()),
        lse: lse.view(),
        sinks: None,
        tile_counter: None,
    };
    let what = format!("emulated {variant}: {} (seed {})", name(c), c.seed);
    // The mma.sync path: what the plan picks for sm_80 (the emulator runs those kernels).
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 1,
    };
    let launched = p
        .plan(target, &tensors, Some(variant).filter(|v| *v != "default"))
        .and_then(|plan| {
            // SAFETY: the views cover the host buffers (checked by the plan), which outlive
            // the (synchronous) emulated launch; O and LSE overlap nothing.
            unsafe { plan.run(&Emulator) }
        });
    launched.map_err(|e| format!("{what}: {e}"))?;
    ensure(
        dq.guards_intact() && o.guards_intact() && lse.guards_intact(),
        || format!("{what}: a write outside its buffer"),
    )?;
    let (o, lse) = (o.to_vec(), lse.to_vec());
    compare(&what, c, &q, &k, &v, &o, &lse)
}

/// A tuning variant of the tile table (bf16), against the same reference and tolerance.
fn run_variant(g: &Gpu, c: &Case, variant: &str) -> TestResult {
    let (q, k, v) = inputs::<bf16>(c);
    let p = &c.p;
    let out = testing::device_forward(g, p, (&q, &k, &v), Some(variant));
    let (o, lse) = gpu_ok(out)?;
    compare(
        &format!("variant {variant}: {} (seed {})", name(c), c.seed),
        c,
        &q,
        &k,
        &v,
        &o,
        &lse,
    )
}

fn run<T: AttentionElem>(g: &Gpu, c: &Case) -> TestResult {
    let (q, k, v) = inputs::<T>(c);
    let (o, lse) = gpu_ok(gpu_forward(g, &c.p, &q, &k, &v))?;
    compare(
        &format!("{} on {} (seed {})", name(c), g.arch(), c.seed),
        c,
        &q,
        &k,
        &v,
        &o,
        &lse,
    )
}
