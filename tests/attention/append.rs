//! New keys and values appended to a paged KV cache (`attention::append_kv`, the
//! `attention_kv_append` kernel) against the host's append (`attention::reference_append`):
//! the whole caches must match bitwise (the new rows at their slots, every other element
//! untouched); then the decode step over the appended cache (contexts `cache_seqlens +
//! seq_new`) against the decode reference on the host's cache, with the decode tests'
//! tolerance. The tables have pages out of order, a page shared between two sequences' earlier
//! tokens, contexts that are not a multiple of the page size, a context of 0, and new tokens
//! that cross into a page of their own.
//!
//! Names: `attention_append/emulated/*` (the kernel's own code in the CPU emulator),
//! `attention_append/gpu/*` (a GPU), `attention_append/rejects_*` (typed errors).

use super::decode::{DecodeCase, bad_pages, compare, dcase, inputs, name};
use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok};
use kernels::attention::{
    self, AttentionElem, DecodeTables, Dtype, KvAppendProblem, KvAppendTensors, View,
};
use kernels::data::rng;
use kernels::exec::DevView;
use kernels::memory::{download, poisoned, upload};
use kernels::{Gpu, bf16, f16};
use rand::Rng;

/// A decode case with room for `seq_new` more tokens per sequence: `batch` more pages, the
/// table extended with unused pages for the new tokens' positions.
struct AppendCase {
    c: DecodeCase,
    seq_new: usize,
}

fn acase(
    lens: &[i32],
    seq_new: usize,
    hkv: usize,
    d: usize,
    page: usize,
    dtype: Dtype,
) -> AppendCase {
    let mut c = dcase(lens, seq_new, 2 * hkv, hkv, d, page, dtype, true, None);
    let longest = lens.iter().copied().max().unwrap_or(0) as usize + seq_new;
    c.p.num_pages += lens.len() * (seq_new.div_ceil(page) + 1);
    c.p.max_pages = c.p.max_pages.max(longest.div_ceil(page));
    AppendCase { c, seq_new }
}

fn aname(a: &AppendCase) -> String {
    format!("{}_new{}", name(&a.c), a.seq_new)
}

/// The decode case's inputs, the table extended with unused pages (in reverse order) for the
/// new tokens' positions, and the new keys and values (uniform in `[-1, 1)`).
#[allow(clippy::type_complexity)]
fn append_inputs<T: AttentionElem>(
    a: &AppendCase,
) -> ((Vec<T>, Vec<T>, Vec<T>, Vec<i32>), (Vec<T>, Vec<T>)) {
    let (q, k, v, mut table) = inputs::<T>(&a.c);
    let p = &a.c.p;
    let mut free: Vec<i32> = (0..p.num_pages as i32)
        .filter(|x| !table.contains(x))
        .collect();
    for (b, &len) in a.c.lens.iter().enumerate() {
        let (first, end) = (
            (len as usize).div_ceil(p.page_size),
            len as usize + a.seq_new,
        );
        for t in first..end.div_ceil(p.page_size) {
            table[b * p.max_pages + t] = free.pop().expect("spare pages");
        }
    }
    let mut r = rng(a.c.seed ^ 0xa99e);
    let n = p.batch * a.seq_new * p.heads_kv * p.head_dim;
    let mut draw = || -> Vec<T> {
        (0..n)
            .map(|_| T::from_f32(r.random_range(-1.0..1.0)))
            .collect()
    };
    ((q, k, v, table), (draw(), draw()))
}

fn problem(a: &AppendCase) -> KvAppendProblem {
    KvAppendProblem::new(&a.c.p, a.seq_new)
}

/// The caches after the host's append.
fn expected<T: AttentionElem>(
    a: &AppendCase,
    (k, v, table): (&[T], &[T], &[i32]),
    (kn, vn): (&[T], &[T]),
) -> (Vec<T>, Vec<T>) {
    let (mut k2, mut v2) = (k.to_vec(), v.to_vec());
    attention::reference_append(
        &problem(a),
        (kn, vn),
        (&mut k2, &mut v2),
        (table, &a.c.lens),
    );
    (k2, v2)
}

fn bitwise<T: AttentionElem>(what: &str, got: &[T], want: &[T]) -> TestResult {
    let bad = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_f32().to_bits() != b.to_f32().to_bits());
    ensure(bad.is_none(), || {
        format!(
            "{what}: element {} differs from the host's append",
            bad.unwrap_or(0)
        )
    })
}

/// The append of `p` in the emulator on the caches `(k, v)` with the new tokens `(kn, vn)` and
/// the tables `(table, lens)` as the kernel reads them: the caches afterwards, and whether
/// their guards stayed intact (no write outside them).
#[allow(clippy::type_complexity)]
fn emulate<T: AttentionElem>(
    p: &KvAppendProblem,
    (k, v): (&[T], &[T]),
    (kn, vn): (&[T], &[T]),
    (table, lens): (&[i32], &[i32]),
) -> kernels::Result<(Vec<T>, Vec<T>, bool)> {
    let (mut dk, mut dv) = (HostBuf::from_slice(k), HostBuf::from_slice(v));
    let (mut dkn, mut dvn) = (HostBuf::from_slice(kn), HostBuf::from_slice(vn));
    let (mut dt, mut dl) = (HostBuf::from_slice(table), HostBuf::from_slice(lens));
    let cache = p.decode.cache_shape();
    let plan = p.plan(&KvAppendTensors {
        k_new: View::contiguous(dkn.view(), p.new_shape()),
        v_new: View::contiguous(dvn.view(), p.new_shape()),
        k_cache: View::contiguous(dk.view(), cache),
        v_cache: View::contiguous(dv.view(), cache),
        block_table: dt.view(),
        cache_seqlens: dl.view(),
    })?;
    // SAFETY: the views cover the host buffers (checked by the plan), which outlive the
    // (synchronous) emulated launch; the caches overlap nothing.
    unsafe { plan.run(&Emulator) }?;
    let intact = dk.guards_intact() && dv.guards_intact();
    Ok((dk.to_vec(), dv.to_vec(), intact))
}

fn emulated<T: AttentionElem>(a: &AppendCase) -> TestResult {
    let ((_, k, v, table), (kn, vn)) = append_inputs::<T>(a);
    let p = problem(a);
    let what = format!("emulated {} (seed {})", aname(a), a.c.seed);
    p.check_tables(&table, &a.c.lens)
        .map_err(|e| format!("{what}: {e}"))?;
    let (want_k, want_v) = expected(a, (&k, &v, &table), (&kn, &vn));
    let (gk, gv, intact) = emulate(&p, (&k, &v), (&kn, &vn), (&table, &a.c.lens))
        .map_err(|e| format!("{what}: {e}"))?;
    ensure(intact, || format!("{what}: a write outside a cache"))?;
    bitwise(&format!("{what}: K cache"), &gk, &want_k)?;
    bitwise(&format!("{what}: V cache"), &gv, &want_v)?;
    println!("{what}: caches bitwise equal to the host's append");
    Ok(())
}

/// Device tables the host cannot check: pages negative or past the cache, contexts negative,
/// past the table or leaving no room. The kernel clamps and skips: nothing written outside
/// the caches (guards).
fn emulated_clamps_bad_tables() -> TestResult {
    let a = acase(&[40, 61], 3, 2, 64, 16, Dtype::Bf16);
    let ((_, k, v, good), (kn, vn)) = append_inputs::<bf16>(&a);
    let p = problem(&a);
    let most = (a.c.p.max_pages * a.c.p.page_size) as i32;
    let bad_pages = bad_pages(&good);
    let cases = [
        (bad_pages.clone(), [40, 61]),
        (good.clone(), [-7, i32::MIN]),
        (good, [most - 1, i32::MAX]),
        (bad_pages, [i32::MAX, most]),
    ];
    for (table, lens) in &cases {
        let (_, _, intact) = emulate(&p, (&k, &v), (&kn, &vn), (table, lens))?;
        ensure(intact, || {
            format!("contexts {lens:?}: a write outside a cache")
        })?;
    }
    println!("4 adversarial tables: every write inside the caches");
    Ok(())
}

/// Append on the GPU (caches bitwise equal to the host's append), then decode over the
/// appended cache with contexts `cache_seqlens + seq_new` against the reference on the host's
/// cache.
fn gpu<T: AttentionElem>(g: &Gpu, a: &AppendCase) -> TestResult {
    let ((q, k, v, table), (kn, vn)) = append_inputs::<T>(a);
    let p = problem(a);
    let dp = &a.c.p;
    let new_lens: Vec<i32> = a.c.lens.iter().map(|&l| l + a.seq_new as i32).collect();
    // The caches after the append, then O and LSE of the decode step.
    type Outputs<T> = (Vec<T>, Vec<T>, Vec<T>, Vec<f32>);
    let out = (|| -> kernels::Result<Outputs<T>> {
        let stream = g.stream()?;
        let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
        let (dkn, dvn) = (upload(&kn)?, upload(&vn)?);
        let cache = dp.cache_shape();
        let (mut kv, mut vv) = (View::contiguous(&dk, cache), View::contiguous(&dv, cache));
        let (knv, vnv) = (
            View::contiguous(&dkn, p.new_shape()),
            View::contiguous(&dvn, p.new_shape()),
        );
        attention::append_kv(
            g,
            &stream,
            &p,
            &table,
            &a.c.lens,
            (&knv, &vnv),
            &mut kv,
            &mut vv,
        )?;
        let tables = DecodeTables::new(dp, &table, &new_lens)?;
        let dout = poisoned::<T>(q.len())?;
        let mut dlse = poisoned::<f32>(dp.lse_len())?;
        let mut ov = View::contiguous(&dout, dp.q_shape());
        let qv = View::contiguous(&dq, dp.q_shape());
        attention::decode(g, &stream, dp, &tables, &qv, &kv, &vv, &mut ov, &mut dlse)?;
        Ok((
            download(&dk)?,
            download(&dv)?,
            download(&dout)?,
            download(&dlse)?,
        ))
    })();
    let (gk, gv, o, lse) = gpu_ok(out)?;
    let what = format!("{} on {} (seed {})", aname(a), g.arch(), a.c.seed);
    let (want_k, want_v) = expected(a, (&k, &v, &table), (&kn, &vn));
    bitwise(&format!("{what}: K cache"), &gk, &want_k)?;
    bitwise(&format!("{what}: V cache"), &gv, &want_v)?;
    let mut c2 = a.c.clone();
    c2.lens = new_lens;
    compare(&what, &c2, (&q, &want_k, &want_v, &table), &o, &lse)
}

/// Typed errors before any launch: no room for the new tokens, a page of a new token outside
/// the cache, new tokens of the wrong shape, a cache overlapping the new tokens, zero new
/// tokens.
fn rejects_bad_inputs() -> TestResult {
    let a = acase(&[40, 61], 3, 2, 64, 16, Dtype::Bf16);
    let ((_, k, _, table), (kn, _)) = append_inputs::<bf16>(&a);
    let p = problem(&a);
    let most = (a.c.p.max_pages * a.c.p.page_size) as i32;
    let refuse = |r: kernels::Result<()>, what: &str| -> TestResult {
        let e = r.err().ok_or_else(|| format!("{what}: accepted"))?;
        ensure(e.to_string().contains(what), || format!("{what}: {e}"))?;
        println!("refused: {e}");
        Ok(())
    };
    let too_many = KvAppendProblem::new(&a.c.p, (most - 61 + 1) as usize);
    refuse(too_many.check_tables(&table, &a.c.lens), "no room")?;
    // Five new tokens take sequence 1 (61 keys) into page 4, which its table row lacks.
    let five = KvAppendProblem::new(&a.c.p, 5);
    refuse(five.check_tables(&table, &a.c.lens), "new tokens")?;
    refuse(KvAppendProblem::new(&a.c.p, 0).validate(), "seq_new")?;
    // Views at made-up addresses: only planned, never run.
    let dev = |addr: u64, len: usize| {
        // SAFETY: only planned, never dereferenced.
        unsafe { DevView::<bf16>::from_raw(addr, len) }
    };
    let devi = |addr: u64, len: usize| {
        // SAFETY: as above.
        unsafe { DevView::<i32>::from_raw(addr, len) }
    };
    let cache = a.c.p.cache_shape();
    let (nc, nn) = (k.len(), kn.len());
    let kc = View::contiguous(dev(1 << 40, nc), cache);
    let vc = View::contiguous(dev(2 << 40, nc), cache);
    let knv = View::contiguous(dev(3 << 40, nn), p.new_shape());
    let vnv = View::contiguous(dev(4 << 40, nn), p.new_shape());
    let tensors = |k_new, v_new, v_cache| KvAppendTensors {
        k_new,
        v_new,
        k_cache: kc,
        v_cache,
        block_table: devi(5 << 40, table.len()),
        cache_seqlens: devi(6 << 40, a.c.lens.len()),
    };
    ensure(p.plan(&tensors(knv, vnv, vc)).is_ok(), || {
        "the well-formed tensors are refused".to_string()
    })?;
    let mut shape = p.new_shape();
    shape[1] -= 1;
    let short = View::contiguous(dev(3 << 40, nn), shape);
    refuse(p.plan(&tensors(short, vnv, vc)).map(|_| ()), "new K")?;
    // The new values inside the key cache.
    let inside = View::contiguous(dev(1 << 40, nn), p.new_shape());
    refuse(p.plan(&tensors(knv, inside, vc)).map(|_| ()), "overlaps")?;
    refuse(p.plan(&tensors(knv, vnv, kc)).map(|_| ()), "overlaps")?;
    Ok(())
}

pub(super) fn register(s: &mut Suite) {
    let cases = [
        acase(&[40, 61, 0, 17], 3, 2, 128, 16, Dtype::Bf16),
        acase(&[5, 64], 1, 1, 64, 64, Dtype::F16),
        acase(&[100, 0, 33], 16, 4, 256, 32, Dtype::Bf16),
        acase(&[1, 47], 2, 2, 96, 16, Dtype::F16),
    ];
    for a in cases {
        let n = format!("attention_append/emulated/{}", aname(&a));
        let a2 = AppendCase {
            c: a.c.clone(),
            seq_new: a.seq_new,
        };
        s.cpu(&n, move || match a.c.p.dtype {
            Dtype::Bf16 => emulated::<bf16>(&a),
            Dtype::F16 => emulated::<f16>(&a),
        });
        let n = format!("attention_append/gpu/{}", aname(&a2));
        s.gpu(&n, Needs::Gpu, move |g| match a2.c.p.dtype {
            Dtype::Bf16 => gpu::<bf16>(g, &a2),
            Dtype::F16 => gpu::<f16>(g, &a2),
        });
    }
    s.cpu(
        "attention_append/emulated/clamps_bad_tables",
        emulated_clamps_bad_tables,
    );
    s.cpu("attention_append/rejects_bad_inputs", rejects_bad_inputs);
}
