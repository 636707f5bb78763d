//! Attention forward over packed sequences (`attention::forward_varlen`, the
//! `attention_fwd_varlen_*` kernels) against the f64 reference per sequence
//! (`attention::reference_varlen`), with the dense tests' tolerance: `max |O - ref| <=
//! 2 max |O_naive - ref| + 1e-3` (`O_naive` the same-precision naive computation per sequence),
//! LSE within `1e-3 max(1, |ref|)` and `-inf` exactly where the reference has it (rows with no
//! allowed key, sequences without keys); outputs poisoned with NaN before the run, so every
//! element must be written.
//!
//! Names: `attention_varlen/emulated/*` (the `mma.sync` kernels' own code in the CPU emulator),
//! `attention_varlen/{hopper,mma}/*` (a GPU, each path named), `attention_varlen/gpu/*` (a GPU,
//! the automatic choice).

use super::{Case, case};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok};
use kernels::attention::{
    self, AttentionElem, AttentionTensors, AttentionVarlenProblem, AttentionVarlenTensors,
    CuSeqlens, Dtype, Path, Target, View,
};
use kernels::data::rng;
use kernels::memory::{download, poisoned, upload};
use kernels::{Arch, Gpu, bf16, f16};
use rand::Rng;

#[path = "varlen_raw.rs"]
mod raw;
use raw::raw_api;

/// A packed batch: each sequence's `(seq_q, seq_k)`, the heads, the options.
#[derive(Clone, Debug)]
pub(super) struct VarlenCase {
    pub(super) lens: Vec<(usize, usize)>,
    pub(super) p: AttentionVarlenProblem,
    pub(super) seed: u64,
}

pub(super) fn vcase(
    lens: &[(usize, usize)],
    hq: usize,
    hkv: usize,
    d: usize,
    dtype: Dtype,
) -> VarlenCase {
    let seqlens = CuSeqlens::from_lens(lens).expect("valid lengths");
    let seed = lens
        .iter()
        .fold((hq * 17 + hkv * 5 + d) as u64, |s, &(a, b)| {
            // Wrapping: the seed of long lists (the release build's value, also in debug).
            s.wrapping_mul(31).wrapping_add((a * 7919 + b) as u64)
        });
    VarlenCase {
        lens: lens.to_vec(),
        p: AttentionVarlenProblem::new(&seqlens, hq, hkv, d, dtype),
        seed,
    }
}

pub(super) fn name(c: &VarlenCase) -> String {
    let p = &c.p;
    let lens = if c.lens.len() > 8 {
        format!("{}seqs", c.lens.len())
    } else {
        let lens: Vec<String> = c.lens.iter().map(|(a, b)| format!("{a}x{b}")).collect();
        lens.join("_")
    };
    let mut s = format!(
        "{:?}_d{}_h{}x{}_lens{lens}",
        p.dtype, p.head_dim, p.heads_q, p.heads_kv
    )
    .to_lowercase();
    if p.v_dim() != p.head_dim {
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
    s
}

pub(super) fn seqlens(c: &VarlenCase) -> CuSeqlens {
    CuSeqlens::from_lens(&c.lens).expect("valid lengths")
}

/// Packed Q, K, V uniform in `[-1, 1)`.
pub(super) fn inputs<T: AttentionElem>(c: &VarlenCase) -> (Vec<T>, Vec<T>, Vec<T>) {
    let mut r = rng(c.seed);
    let mut draw = |n: usize| -> Vec<T> {
        (0..n)
            .map(|_| T::from_f32(r.random_range(-1.0..1.0)))
            .collect()
    };
    let p = &c.p;
    let qn = p.q_shape().iter().product();
    let kn = p.kv_shape().iter().product();
    let vn = p.v_shape().iter().product();
    (draw(qn), draw(kn), draw(vn))
}

/// Small cases for the emulator (D = 128 unless noted): empty sequences (no query rows, no key
/// rows), length 1, `seq_q != seq_k`, a sequence over one query block (130 > 128 rows), odd
/// lengths, every mask, grouped-query heads, the other head dimensions, f16, and the pairs of
/// head dimensions of V and O of their own.
fn emulated_cases() -> Vec<VarlenCase> {
    let mixed = [(17, 9), (0, 5), (1, 1), (40, 0), (130, 70)];
    let mut v = vec![vcase(&mixed, 2, 1, 128, Dtype::Bf16)];
    let mut c = vcase(&mixed, 2, 1, 128, Dtype::Bf16);
    c.p.causal = true;
    v.push(c);
    let mut c = vcase(&[(50, 80), (129, 129), (3, 200)], 1, 1, 128, Dtype::Bf16);
    c.p.window = (Some(20), Some(3));
    v.push(c);
    let mut c = vcase(
        &[(33, 65), (7, 7), (0, 0), (65, 33)],
        4,
        2,
        128,
        Dtype::Bf16,
    );
    c.p.causal = true;
    v.push(c);
    let mut c = vcase(&[(19, 45), (70, 3)], 2, 2, 64, Dtype::Bf16);
    c.p.window = (Some(8), None);
    v.push(c);
    v.push(vcase(&[(5, 33), (21, 1)], 2, 1, 256, Dtype::Bf16));
    let mut c = vcase(&[(31, 31), (2, 90)], 2, 2, 128, Dtype::F16);
    c.p.causal = true;
    v.push(c);
    // V and O of their own head dimension (the pairs of `VALUE_DIMS`).
    for (d, dv) in kernel_abi::attention::VALUE_DIMS {
        let mut c = vcase(&mixed, 2, 1, d as usize, Dtype::Bf16);
        c.p = c.p.value_dim(dv as usize).causal();
        v.push(c);
    }
    v
}

/// Larger cases for the GPU: every head dimension and dtype, long and empty sequences, every
/// mask, grouped-query and multi-query heads.
fn gpu_cases() -> Vec<VarlenCase> {
    let mut v = Vec::new();
    let lens = [
        (1, 1),
        (113, 203),
        (0, 17),
        (239, 1),
        (1023, 1024),
        (64, 0),
        (799, 3),
    ];
    for d in super::head_dims() {
        let dtypes: &[Dtype] = if super::FULL_CASE_DIMS.contains(&d) {
            &[Dtype::Bf16, Dtype::F16]
        } else {
            &[Dtype::Bf16]
        };
        for &dtype in dtypes {
            for causal in [false, true] {
                let mut c = vcase(&lens, 4, 2, d, dtype);
                c.p.causal = causal;
                v.push(c);
            }
        }
    }
    for hkv in [8, 2, 1] {
        v.push(vcase(
            &[(257, 300), (300, 257), (5, 5)],
            8,
            hkv,
            128,
            Dtype::Bf16,
        ));
    }
    let mut c = vcase(&[(500, 700), (700, 500), (33, 1)], 4, 4, 64, Dtype::Bf16);
    c.p.window = (Some(64), Some(32));
    v.push(c);
    let mut c = vcase(&[(256, 256), (300, 100), (1, 400)], 2, 2, 256, Dtype::Bf16);
    c.p.window = (Some(17), Some(0));
    v.push(c);
    // Many short sequences (a training batch of documents).
    let mut c = vcase(&many_short(), 4, 1, 128, Dtype::Bf16);
    c.p.causal = true;
    v.push(c);
    // 2500 sequences of 0 to 100 rows: the Hopper kernels' search for a block's sequence
    // takes three rounds of 32 (module docs of their scheduler).
    let lots: Vec<(usize, usize)> = (0..2500).map(|i| ((i * 37) % 101, (i * 53) % 97)).collect();
    let mut c = vcase(&lots, 2, 1, 64, Dtype::Bf16);
    c.p.causal = true;
    v.push(c);
    v
}

/// 64 sequences of 1 to 97 query and 1 to 89 key rows (a training batch of short documents).
fn many_short() -> Vec<(usize, usize)> {
    (0..64)
        .map(|i| (1 + (i * 37) % 97, 1 + (i * 53) % 89))
        .collect()
}

/// Compare O `[total_q, heads_q, D]` and LSE `[heads_q, total_q]` with the reference.
fn compare<T: AttentionElem>(
    what: &str,
    c: &VarlenCase,
    (q, k, v): (&[T], &[T], &[T]),
    o: &[T],
    lse: &[f32],
) -> TestResult {
    let s = seqlens(c);
    let want = attention::reference_varlen(&c.p, &s, q, k, v);
    let naive = attention::naive_varlen_same_precision(&c.p, &s, q, k, v);
    check_outputs(what, o, lse, &want, &naive.o)
}

/// Check O (every element finite, `max |O - ref| <= 2 max |O_naive - ref| + 1e-3`) and LSE
/// (`-inf` exactly where the reference has it, else within `1e-3 max(1, |ref|)`) against the
/// reference `want` and the same-precision naive O `naive_o`; prints the measured errors.
pub(super) fn check_outputs<T: AttentionElem>(
    what: &str,
    o: &[T],
    lse: &[f32],
    want: &attention::reference::AttentionOutput,
    naive_o: &[f64],
) -> TestResult {
    let max_diff = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let naive_err = max_diff(naive_o, &want.o);
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
        lse_err = lse_err.max((g as f64 - w).abs() / w.abs().max(1.0));
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

/// The plan's kernels run on: sm_80 (the emulator runs the `mma.sync` kernels).
const EMULATED: Target = Target {
    arch: Arch::Sm80,
    multiprocessors: 1,
};

/// Outputs of an emulated run: O, LSE, and whether every buffer's guards stayed intact.
type EmulatedOut<T> = (Vec<T>, Vec<f32>, bool);

/// Run the packed forward of `c` in the emulator on `(q, k, v)` with the boundaries `cu_q`,
/// `cu_k` as the kernel reads them (possibly not `c`'s: the clamping test).
fn emulate<T: AttentionElem>(
    c: &VarlenCase,
    (q, k, v): (&[T], &[T], &[T]),
    (cu_q, cu_k): (&[i32], &[i32]),
) -> Result<EmulatedOut<T>, String> {
    let p = &c.p;
    let (mut dq, mut dk, mut dv) = (
        HostBuf::from_slice(q),
        HostBuf::from_slice(k),
        HostBuf::from_slice(v),
    );
    let (mut cq, mut ck) = (HostBuf::from_slice(cu_q), HostBuf::from_slice(cu_k));
    let mut o = HostBuf::filled(p.o_shape().iter().product(), T::from_f32(f32::NAN));
    let mut lse = HostBuf::filled(p.lse_len(), f32::NAN);
    let tensors = AttentionVarlenTensors {
        q: View::packed_contiguous(dq.view(), p.q_shape()),
        k: View::packed_contiguous(dk.view(), p.kv_shape()),
        v: View::packed_contiguous(dv.view(), p.v_shape()),
        o: View::packed_contiguous(o.view(), p.o_shape()),
        lse: lse.view(),
        cu_seqlens_q: cq.view(),
        cu_seqlens_k: ck.view(),
        sinks: None,
        tile_counter: None,
    };
    let target = Target {
        arch: Arch::Sm80,
        multiprocessors: 1,
    };
    let plan = p.plan(target, &tensors).map_err(|e| e.to_string())?;
    // SAFETY: the views cover the host buffers (checked by the plan), which outlive the
    // (synchronous) emulated launch; O and LSE overlap nothing.
    unsafe { plan.run(&Emulator) }.map_err(|e| e.to_string())?;
    let intact = [dq.guards_intact(), dk.guards_intact(), dv.guards_intact()]
        .into_iter()
        .chain([cq.guards_intact(), ck.guards_intact()])
        .chain([o.guards_intact(), lse.guards_intact()])
        .all(|x| x);
    Ok((o.to_vec(), lse.to_vec(), intact))
}

fn run_emulated<T: AttentionElem>(c: &VarlenCase) -> TestResult {
    let (q, k, v) = inputs::<T>(c);
    let s = seqlens(c);
    let what = format!("emulated {} (seed {})", name(c), c.seed);
    let (o, lse, intact) =
        emulate(c, (&q, &k, &v), (s.q(), s.k())).map_err(|e| format!("{what}: {e}"))?;
    ensure(intact, || format!("{what}: a write outside its buffer"))?;
    compare(&what, c, (&q, &k, &v), &o, &lse)
}

/// Sequences of equal lengths, packed, give bitwise the dense kernel's outputs (the same body
/// on the other layout; LSE transposed from `[batch, heads, seq]` to `[heads, batch seq]`).
fn emulated_matches_dense() -> TestResult {
    let (b, sq, sk, hq, hkv, d) = (3, 70, 45, 2, 1, 128);
    let mut c = vcase(&vec![(sq, sk); b], hq, hkv, d, Dtype::Bf16);
    c.p.causal = true;
    let (q, k, v) = inputs::<bf16>(&c);
    let s = seqlens(&c);
    let (o, lse, intact) = emulate(&c, (&q, &k, &v), (s.q(), s.k()))?;
    ensure(intact, || "packed: a write outside its buffer".to_string())?;
    let dense: Case = {
        let mut dc = case(b, sq, sk, hq, hkv, d, Dtype::Bf16);
        dc.p.causal = true;
        dc
    };
    let p = &dense.p;
    let (mut dq, mut dk, mut dv) = (
        HostBuf::from_slice(&q),
        HostBuf::from_slice(&k),
        HostBuf::from_slice(&v),
    );
    let mut od = HostBuf::filled(q.len(), bf16::NAN);
    let mut lsed = HostBuf::filled(p.lse_len(), f32::NAN);
    let tensors = AttentionTensors {
        q: View::contiguous(dq.view(), p.q_shape()),
        k: View::contiguous(dk.view(), p.kv_shape()),
        v: View::contiguous(dv.view(), p.kv_shape()),
        o: View::contiguous(od.view(), p.q_shape()),
        lse: lsed.view(),
        sinks: None,
        tile_counter: None,
    };
    let plan = p
        .plan(EMULATED, &tensors, None)
        .map_err(|e| e.to_string())?;
    // SAFETY: as in `emulate`.
    unsafe { plan.run(&Emulator) }.map_err(|e| e.to_string())?;
    let (od, lsed) = (od.to_vec(), lsed.to_vec());
    ensure(
        o.iter().zip(&od).all(|(a, b)| a.to_bits() == b.to_bits()),
        || "packed O differs from the dense kernel's".to_string(),
    )?;
    for bi in 0..b {
        for h in 0..hq {
            for i in 0..sq {
                let packed = lse[h * b * sq + bi * sq + i];
                let dense = lsed[(bi * hq + h) * sq + i];
                ensure(packed.to_bits() == dense.to_bits(), || {
                    format!("LSE of sequence {bi}, head {h}, row {i}: {packed} vs {dense}")
                })?;
            }
        }
    }
    println!(
        "packed == dense bitwise: O {} elements, LSE {}",
        o.len(),
        lse.len()
    );
    Ok(())
}

/// Boundaries whose contents contradict the sizes (decreasing, negative, past the totals: what
/// the raw API cannot check without reading device memory) make the kernel clamp: nothing is
/// written outside O and LSE, nothing read outside the inputs (the emulator's buffers are
/// bounds-checked on writes; reads are clamped by construction, see `seq.rs`).
fn emulated_clamps_bad_boundaries() -> TestResult {
    let c = vcase(&[(20, 30), (40, 10), (5, 5)], 2, 1, 128, Dtype::Bf16);
    let (q, k, v) = inputs::<bf16>(&c);
    // total_q = 65, total_k = 45.
    let bad: [(&[i32], &[i32]); 3] = [
        (&[0, 500, -7, 65], &[0, 45, 30, 45]),
        (&[-100, 20, 60, 1000], &[50, 10, i32::MAX, i32::MIN]),
        (&[65, 65, 65, 65], &[0, 0, 0, 0]),
    ];
    for (cu_q, cu_k) in bad {
        let (_, _, intact) = emulate(&c, (&q, &k, &v), (cu_q, cu_k))?;
        ensure(intact, || {
            format!("cu_seqlens {cu_q:?} / {cu_k:?}: a write outside its buffer")
        })?;
    }
    println!("3 sets of contradictory boundaries: every buffer's guards intact");
    Ok(())
}

/// The boundary sets of [`emulated_clamps_bad_boundaries`] on the Hopper kernel, on both grids
/// (persistent with a tile counter, one block per tile): O and LSE views followed by 4096
/// poisoned guard elements each, which must stay untouched (run under compute-sanitizer
/// memcheck, nothing outside the tensors is read either).
fn hopper_clamps_bad_boundaries(g: &Gpu) -> TestResult {
    use kernels::exec::{DevView, OnStream};
    let mut c = vcase(&[(20, 30), (40, 10), (5, 5)], 2, 1, 128, Dtype::Bf16);
    c.p.path = Path::Hopper;
    let (q, k, v) = inputs::<bf16>(&c);
    let p = &c.p;
    const GUARD: usize = 4096;
    let bad: [(&[i32], &[i32]); 3] = [
        (&[0, 500, -7, 65], &[0, 45, 30, 45]),
        (&[-100, 20, 60, 1000], &[50, 10, i32::MAX, i32::MIN]),
        (&[65, 65, 65, 65], &[0, 0, 0, 0]),
    ];
    for ((cu_q, cu_k), persistent) in bad.iter().flat_map(|b| [(*b, true), (*b, false)]) {
        let what = format!("cu_seqlens {cu_q:?} / {cu_k:?} (persistent grid: {persistent})");
        let out = (|| -> kernels::Result<(Vec<bf16>, Vec<f32>)> {
            let stream = g.stream()?;
            let counter = upload(&[0u32])?;
            let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
            let (cq, ck) = (upload(cu_q)?, upload(cu_k)?);
            let dout = poisoned::<bf16>(q.len() + GUARD)?;
            let dlse = poisoned::<f32>(p.lse_len() + GUARD)?;
            // SAFETY: a prefix of `dlse`, which outlives the run.
            let lse = unsafe { DevView::<f32>::from_raw(DevView::from(&dlse).addr(), p.lse_len()) };
            let [rows, h, d] = p.q_shape();
            let tensors = AttentionVarlenTensors {
                q: View::packed_contiguous(&dq, p.q_shape()),
                k: View::packed_contiguous(&dk, p.kv_shape()),
                v: View::packed_contiguous(&dv, p.kv_shape()),
                o: View::packed(&dout, 0, &[rows, h, d], &[h * d, d, 1])?,
                lse,
                cu_seqlens_q: (&cq).into(),
                cu_seqlens_k: (&ck).into(),
                sinks: None,
                tile_counter: persistent.then(|| (&counter).into()),
            };
            let plan = p.plan(Target::of(g), &tensors)?;
            // SAFETY: the buffers live until the synchronization below; O and LSE are fresh;
            // the tile counter is zero and this launch's only.
            unsafe {
                plan.run(&OnStream {
                    gpu: g,
                    stream: &stream,
                })
            }?;
            g.sync(&stream, "attention varlen forward (bad boundaries)")?;
            Ok((download(&dout)?, download(&dlse)?))
        })();
        let (o, lse) = gpu_ok(out)?;
        let o_guard = o[q.len()..].iter().all(|x| x.to_bits() == 0xffff);
        let lse_guard = lse[p.lse_len()..].iter().all(|x| x.to_bits() == u32::MAX);
        ensure(o_guard && lse_guard, || {
            format!("{what}: a write past O ({o_guard}) or LSE ({lse_guard})")
        })?;
    }
    println!(
        "3 sets of contradictory boundaries on the Hopper kernel, both grids: guards of O and \
         LSE intact"
    );
    Ok(())
}

/// The forward of `c` through [`attention::forward_varlen`] twice (on the Hopper path a
/// persistent grid drawing its tiles from the boundaries' tile counter: the second run finds it
/// zero again), through a plan without a tile counter (one block per tile) and through a plan
/// of three blocks drawing every tile (the handoff ring wraps many times): the four O and LSE
/// bitwise equal, the first against the f64 reference.
fn run_gpu<T: AttentionElem>(g: &Gpu, c: &VarlenCase) -> TestResult {
    let (q, k, v) = inputs::<T>(c);
    let out = (|| -> kernels::Result<Vec<(Vec<T>, Vec<f32>)>> {
        let p = &c.p;
        let stream = g.stream()?;
        let mut seqlens = seqlens(c).upload()?;
        let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
        let (qv, kv, vv) = (
            View::packed_contiguous(&dq, p.q_shape()),
            View::packed_contiguous(&dk, p.kv_shape()),
            View::packed_contiguous(&dv, p.v_shape()),
        );
        let mut runs = Vec::new();
        let counter = upload(&[0u32])?;
        for run in 0..4 {
            let dout = poisoned::<T>(p.o_shape().iter().product())?;
            let mut dlse = poisoned::<f32>(p.lse_len())?;
            let mut ov = View::packed_contiguous(&dout, p.o_shape());
            if run >= 2 {
                let (cu_q, cu_k) = seqlens.device();
                let tensors = AttentionVarlenTensors {
                    q: qv,
                    k: kv,
                    v: vv,
                    o: ov,
                    lse: (&dlse).into(),
                    cu_seqlens_q: cu_q,
                    cu_seqlens_k: cu_k,
                    sinks: None,
                    tile_counter: (run == 3).then(|| (&counter).into()),
                };
                let target = Target {
                    multiprocessors: 3,
                    ..Target::of(g)
                };
                let plan = p.plan(target, &tensors)?;
                // SAFETY: the buffers live until the synchronization below; O and LSE are
                // fresh; the tile counter (run 3) is zero and this launch's only.
                unsafe {
                    plan.run(&kernels::exec::OnStream {
                        gpu: g,
                        stream: &stream,
                    })
                }?;
            } else {
                attention::forward_varlen(
                    g,
                    &stream,
                    p,
                    &mut seqlens,
                    &qv,
                    &kv,
                    &vv,
                    &mut ov,
                    &mut dlse,
                )?;
            }
            g.sync(&stream, "attention varlen forward")?;
            runs.push((download(&dout)?, download(&dlse)?));
        }
        Ok(runs)
    })();
    let runs = gpu_ok(out)?;
    let bits = |(o, lse): &(Vec<T>, Vec<f32>)| -> (Vec<u32>, Vec<u32>) {
        (
            o.iter().map(|x| x.to_f32().to_bits()).collect(),
            lse.iter().map(|x| x.to_bits()).collect(),
        )
    };
    let same: Vec<bool> = runs[1..]
        .iter()
        .map(|r| bits(r) == bits(&runs[0]))
        .collect();
    ensure(same.iter().all(|&x| x), || {
        format!(
            "{}: runs equal to the first (again, one block per tile, three blocks): {same:?}",
            name(c)
        )
    })?;
    let (o, lse) = &runs[0];
    compare(
        &format!("{} on {} (seed {})", name(c), g.arch(), c.seed),
        c,
        (&q, &k, &v),
        o,
        lse,
    )
}

/// The backward reference over packed sequences of equal lengths is bitwise the dense
/// reference's (dLSE transposed from `[batch, heads, seq]` to `[heads, batch seq]`); with
/// sequences without query or key rows, their gradients are exactly 0.
fn reference_backward_matches_dense() -> TestResult {
    use kernels::attention::reference::{backward, backward_varlen};
    let (b, sq, sk, hq, hkv, d) = (3, 11, 7, 4, 2, 64);
    let mut c = vcase(&vec![(sq, sk); b], hq, hkv, d, Dtype::Bf16);
    c.p.causal = true;
    let (q, k, v) = inputs::<bf16>(&c);
    let mut r = rng(c.seed + 1);
    let d_o: Vec<bf16> = (0..q.len())
        .map(|_| bf16::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let dense_dlse: Vec<f32> = (0..b * hq * sq)
        .map(|_| r.random_range(-1.0..1.0))
        .collect();
    let mut packed_dlse = vec![0.0f32; dense_dlse.len()];
    for bi in 0..b {
        for h in 0..hq {
            for i in 0..sq {
                packed_dlse[h * b * sq + bi * sq + i] = dense_dlse[(bi * hq + h) * sq + i];
            }
        }
    }
    let mut dense = case(b, sq, sk, hq, hkv, d, Dtype::Bf16).p;
    dense.causal = true;
    let want = backward(&dense, &q, &k, &v, &d_o, Some(&dense_dlse));
    let got = backward_varlen(&c.p, &seqlens(&c), &q, &k, &v, &d_o, Some(&packed_dlse));
    for (name, g, w) in [
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        ensure(
            g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
            || format!("{name}: packed differs from dense"),
        )?;
    }
    // A sequence without keys (dQ = 0) and one without queries (dK = dV = 0).
    let c = vcase(&[(4, 5), (3, 0), (0, 6)], 2, 1, 64, Dtype::Bf16);
    let (q, k, v) = inputs::<bf16>(&c);
    let g = backward_varlen(&c.p, &seqlens(&c), &q, &k, &v, &q, None);
    let row = 2 * 64;
    ensure(g.dq[4 * row..].iter().all(|x| *x == 0.0), || {
        "dQ of a sequence without keys".into()
    })?;
    ensure(g.dq[..4 * row].iter().any(|x| *x != 0.0), || {
        "dQ of sequence 0 is 0".into()
    })?;
    let krow = 64;
    ensure(
        g.dk[5 * krow..]
            .iter()
            .chain(&g.dv[5 * krow..])
            .all(|x| *x == 0.0),
        || "dK, dV of a sequence without queries".into(),
    )?;
    println!("backward reference: packed == dense bitwise; empty sequences give zero gradients");
    Ok(())
}

pub fn register(s: &mut Suite) {
    s.cpu(
        "attention_varlen/reference/backward_matches_dense",
        reference_backward_matches_dense,
    );
    for c in emulated_cases() {
        let n = format!("attention_varlen/emulated/{}", name(&c));
        s.cpu(&n, move || match c.p.dtype {
            Dtype::Bf16 => run_emulated::<bf16>(&c),
            Dtype::F16 => run_emulated::<f16>(&c),
        });
    }
    s.cpu(
        "attention_varlen/emulated/matches_dense_bitwise",
        emulated_matches_dense,
    );
    s.cpu(
        "attention_varlen/emulated/clamps_bad_boundaries",
        emulated_clamps_bad_boundaries,
    );
    s.gpu("attention_varlen/gpu/raw_api", Needs::Gpu, raw_api);
    s.gpu(
        "attention_varlen/hopper/clamps_bad_boundaries",
        Needs::Hopper,
        hopper_clamps_bad_boundaries,
    );
    // V and O of their own head dimension (`VALUE_DIMS`), both paths: empty sequences,
    // lengths of 1, over one query block, GQA, causal and windows, many short sequences.
    for (d, dv) in kernel_abi::attention::VALUE_DIMS {
        let (d, dv) = (d as usize, dv as usize);
        let lens = [
            (1, 1),
            (113, 203),
            (0, 17),
            (239, 1),
            (1023, 1024),
            (64, 0),
            (799, 3),
        ];
        let mut cs = Vec::new();
        for dtype in [Dtype::Bf16, Dtype::F16] {
            for causal in [false, true] {
                let mut c = vcase(&lens, 4, 2, d, dtype);
                c.p.causal = causal;
                cs.push(c);
            }
        }
        let mut c = vcase(&[(500, 700), (700, 500), (33, 1)], 8, 1, d, Dtype::Bf16);
        c.p.window = (Some(64), Some(32));
        cs.push(c);
        let mut c = vcase(&many_short(), 4, 1, d, Dtype::Bf16);
        c.p.causal = true;
        cs.push(c);
        for c in cs {
            for (path, needs, tag) in [
                (Path::Hopper, Needs::Hopper, "hopper"),
                (Path::MmaSync, Needs::Gpu, "mma"),
            ] {
                let mut c = c.clone();
                c.p = c.p.value_dim(dv).path(path);
                c.seed = c.seed.wrapping_add(dv as u64);
                let n = format!("attention_varlen/{tag}_value_dim/{}", name(&c));
                s.gpu(&n, needs, move |g| match c.p.dtype {
                    Dtype::Bf16 => run_gpu::<bf16>(g, &c),
                    Dtype::F16 => run_gpu::<f16>(g, &c),
                });
            }
        }
    }
    for c in gpu_cases() {
        for (path, needs, tag) in [
            (Path::Hopper, Needs::Hopper, "hopper"),
            (Path::MmaSync, Needs::Gpu, "mma"),
        ] {
            let mut c = c.clone();
            c.p.path = path;
            let n = format!("attention_varlen/{tag}/{}", name(&c));
            s.gpu(&n, needs, move |g| match c.p.dtype {
                Dtype::Bf16 => run_gpu::<bf16>(g, &c),
                Dtype::F16 => run_gpu::<f16>(g, &c),
            });
        }
    }
}
