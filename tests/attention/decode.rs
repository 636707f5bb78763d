//! Decoding over a paged KV cache (`attention::decode`, the `attention_decode_*` and
//! `attention_decode_combine_*` kernels) against the f64 reference (`attention::reference_decode`:
//! each sequence's keys gathered from its pages and attended as the dense reference does), with
//! the forward's tolerance: `max |O - ref| <= 2 max |O_naive - ref| + 1e-3` (`O_naive` the
//! same-precision naive computation on the gathered keys), LSE within `1e-3 max(1, |ref|)` and
//! `-inf` exactly where the reference has it (a context of 0, causal rows before the context).
//! Outputs are poisoned with NaN before the run, so every element must be written.
//!
//! The tables of every case have pages out of order, a page shared between sequences where
//! there are two, and contexts that are not a multiple of the page size.
//!
//! Names: `attention_decode/emulated/*` (the kernels' own code in the CPU emulator),
//! `attention_decode/gpu/*` (a GPU).

use kernel_tests::emu::{Emulator, HostBuf};
use kernel_tests::{Needs, Suite, TestResult, ensure, gpu_ok};
use kernels::attention::{
    self, AttentionDecodeProblem, AttentionDecodeTensors, AttentionElem, DecodeTables, Dtype, View,
};
use kernels::data::rng;
use kernels::memory::{download, poisoned, upload};
use kernels::{Gpu, bf16, f16};
use rand::Rng;
use rand::seq::SliceRandom;

/// A decode step: the problem, each sequence's context, the splits (`None`: the heuristic).
#[derive(Clone, Debug)]
pub(super) struct DecodeCase {
    pub(super) p: AttentionDecodeProblem,
    pub(super) lens: Vec<i32>,
    splits: Option<usize>,
    pub(super) seed: u64,
    /// The sink logits of a problem with sinks.
    sinks: Option<Vec<f32>>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn dcase(
    lens: &[i32],
    seq_q: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    page: usize,
    dtype: Dtype,
    causal: bool,
    splits: Option<usize>,
) -> DecodeCase {
    let needed: usize = lens.iter().map(|&l| (l as usize).div_ceil(page)).sum();
    let longest = lens.iter().map(|&l| l as usize).max().unwrap_or(0);
    // Pages for every context, three spare ones, and room for one more page per sequence.
    let mut p = AttentionDecodeProblem::new(
        lens.len(),
        seq_q,
        hq,
        hkv,
        d,
        page,
        needed + 3,
        longest.div_ceil(page) + 1,
    );
    p.dtype = dtype;
    p.causal = causal;
    let seed = lens.iter().fold(
        (seq_q * 131 + hq * 17 + hkv * 5 + d + page * 7) as u64 + u64::from(causal),
        |s, &l| s * 31 + l as u64,
    ) * 4
        + splits.unwrap_or(0) as u64;
    DecodeCase {
        p,
        lens: lens.to_vec(),
        splits,
        seed,
        sinks: None,
    }
}

/// `c` with a softcap and sinks uniform in `sinks` (either optional; the capsink kernels).
fn capsink(mut c: DecodeCase, softcap: Option<f32>, sinks: Option<(f32, f32)>) -> DecodeCase {
    c.p.softcap = softcap;
    c.p.sinks = sinks.is_some();
    c.sinks = sinks.map(|(lo, hi)| {
        let mut r = rng(c.seed ^ 0x51_4b);
        (0..c.p.heads_q).map(|_| r.random_range(lo..hi)).collect()
    });
    c
}

pub(super) fn name(c: &DecodeCase) -> String {
    let p = &c.p;
    let lens: Vec<String> = c.lens.iter().map(|l| l.to_string()).collect();
    let mut s = format!(
        "{:?}_d{}_sq{}_h{}x{}_page{}_ctx{}",
        p.dtype,
        p.head_dim,
        p.seq_q,
        p.heads_q,
        p.heads_kv,
        p.page_size,
        lens.join("_")
    )
    .to_lowercase();
    if p.causal {
        s.push_str("_causal");
    }
    match c.splits {
        Some(n) => s.push_str(&format!("_splits{n}")),
        None => s.push_str("_auto"),
    }
    if let Some(sc) = p.softcap {
        s.push_str(&format!("_softcap{sc}"));
    }
    if c.sinks.is_some() {
        s.push_str("_sinks");
    }
    s
}

/// Q, the caches (uniform in `[-1, 1)`) and the block table: the pages of all sequences a
/// random permutation of the cache's, sequence 1's first page sequence 0's first (shared),
/// entries past a context -1 (never read).
pub(super) fn inputs<T: AttentionElem>(c: &DecodeCase) -> (Vec<T>, Vec<T>, Vec<T>, Vec<i32>) {
    let p = &c.p;
    let mut r = rng(c.seed);
    let mut draw = |n: usize| -> Vec<T> {
        (0..n)
            .map(|_| T::from_f32(r.random_range(-1.0..1.0)))
            .collect()
    };
    let q = draw(p.q_shape().iter().product());
    let cache: usize = p.cache_shape().iter().product();
    let (k, v) = (draw(cache), draw(cache));
    let mut order: Vec<i32> = (0..p.num_pages as i32).collect();
    order.shuffle(&mut r);
    let mut next = order.into_iter();
    let mut table = vec![-1i32; p.batch * p.max_pages];
    for (b, &len) in c.lens.iter().enumerate() {
        for t in 0..(len as usize).div_ceil(p.page_size) {
            table[b * p.max_pages + t] = next.next().expect("enough pages");
        }
    }
    if p.batch >= 2 && c.lens[0] > 0 && c.lens[1] > 0 {
        table[p.max_pages] = table[0];
    }
    (q, k, v, table)
}

/// Compare O `[batch, seq_q, heads_q, D]` and LSE `[batch, heads_q, seq_q]` with the
/// reference.
pub(super) fn compare<T: AttentionElem>(
    what: &str,
    c: &DecodeCase,
    (q, k, v, table): (&[T], &[T], &[T], &[i32]),
    o: &[T],
    lse: &[f32],
) -> TestResult {
    let p = &c.p;
    let sinks = c.sinks.as_deref();
    let want = attention::reference_decode_sinks(p, q, (k, v), (table, &c.lens), sinks);
    // The same-precision naive computation, sequence by sequence on the gathered keys.
    let (d, hkv, hq, sq) = (p.head_dim, p.heads_kv, p.heads_q, p.seq_q);
    let mut naive = Vec::new();
    for (b, &len) in c.lens.iter().enumerate() {
        let len = len as usize;
        let gather = |cache: &[T]| -> Vec<T> {
            (0..len)
                .flat_map(|j| {
                    let page = table[b * p.max_pages + j / p.page_size] as usize;
                    let at = (page * p.page_size + j % p.page_size) * hkv * d;
                    cache[at..at + hkv * d].to_vec()
                })
                .collect()
        };
        let qb = &q[b * sq * hq * d..(b + 1) * sq * hq * d];
        let out = attention::naive_same_precision_sinks(
            &p.sequence(len),
            qb,
            &gather(k),
            &gather(v),
            sinks,
        );
        naive.extend(out.o);
    }
    super::varlen::check_outputs(what, o, lse, &want, &naive)
}

/// Small cases for the emulator: one split and several (more splits than steps included), a
/// context of 0 and of 1, causal rows before the context, two row blocks (32 rows), every head
/// dimension, page sizes 16 to 64, f16.
fn emulated_cases() -> Vec<DecodeCase> {
    vec![
        dcase(&[40, 61], 1, 4, 2, 64, 16, Dtype::Bf16, false, Some(1)),
        dcase(&[40, 61], 1, 4, 2, 64, 16, Dtype::Bf16, false, Some(3)),
        dcase(&[0, 1, 70], 3, 8, 2, 128, 32, Dtype::Bf16, true, Some(2)),
        dcase(&[50], 16, 4, 2, 96, 16, Dtype::Bf16, true, Some(4)),
        dcase(&[130, 5], 2, 2, 1, 256, 64, Dtype::F16, false, Some(2)),
        dcase(&[97, 200], 1, 3, 1, 192, 48, Dtype::Bf16, false, Some(1)),
        // Softcap and sinks: the sinks join in the decode kernel (one split) and in the combine
        // kernel (several), a context of 0 (LSE = the sink), a sink far above the logits.
        capsink(
            dcase(&[40, 61], 1, 4, 2, 64, 16, Dtype::Bf16, false, Some(1)),
            Some(0.5),
            Some((-1.0, 2.0)),
        ),
        capsink(
            dcase(&[0, 1, 70], 3, 8, 2, 128, 32, Dtype::Bf16, true, Some(2)),
            Some(5.0),
            Some((-2.0, 2.0)),
        ),
        capsink(
            dcase(&[130, 5], 2, 2, 1, 256, 64, Dtype::F16, false, Some(3)),
            None,
            Some((30.0, 40.0)),
        ),
        capsink(
            dcase(&[50], 4, 4, 2, 96, 16, Dtype::Bf16, true, Some(1)),
            Some(1.0),
            None,
        ),
    ]
}

/// Run `c` in the emulator with `splits` splits on the tables `table`, `lens` as the kernel
/// reads them (possibly not `c`'s: the adversarial test). Returns O, LSE and whether every
/// buffer's guards stayed intact.
fn emulate<T: AttentionElem>(
    c: &DecodeCase,
    (q, k, v): (&[T], &[T], &[T]),
    (table, lens): (&[i32], &[i32]),
    splits: usize,
) -> Result<(Vec<T>, Vec<f32>, bool), String> {
    let p = &c.p;
    let (mut dq, mut dk, mut dv) = (
        HostBuf::from_slice(q),
        HostBuf::from_slice(k),
        HostBuf::from_slice(v),
    );
    let (mut dt, mut dl) = (HostBuf::from_slice(table), HostBuf::from_slice(lens));
    let mut o = HostBuf::filled(q.len(), T::from_f32(f32::NAN));
    let mut lse = HostBuf::filled(p.lse_len(), f32::NAN);
    let mut ws = HostBuf::filled(p.workspace_len(splits).max(1), f32::NAN);
    let mut ds = c.sinks.as_deref().map(HostBuf::from_slice);
    let tensors = AttentionDecodeTensors {
        q: View::contiguous(dq.view(), p.q_shape()),
        k_cache: View::contiguous(dk.view(), p.cache_shape()),
        v_cache: View::contiguous(dv.view(), p.cache_shape()),
        o: View::contiguous(o.view(), p.q_shape()),
        lse: lse.view(),
        block_table: dt.view(),
        cache_seqlens: dl.view(),
        workspace: ws.view(),
        sinks: ds.as_mut().map(|s| s.view()),
    };
    let plan = p.plan(&tensors, splits).map_err(|e| e.to_string())?;
    // SAFETY: the views cover the host buffers (checked by the plan), which outlive the
    // (synchronous) emulated launches; O, LSE and the workspace overlap nothing.
    unsafe { plan.run(&Emulator) }.map_err(|e| e.to_string())?;
    let intact = [dq.guards_intact(), dk.guards_intact(), dv.guards_intact()]
        .into_iter()
        .chain([dt.guards_intact(), dl.guards_intact(), ws.guards_intact()])
        .chain([o.guards_intact(), lse.guards_intact()])
        .all(|x| x);
    Ok((o.to_vec(), lse.to_vec(), intact))
}

fn run_emulated<T: AttentionElem>(c: &DecodeCase) -> TestResult {
    let (q, k, v, table) = inputs::<T>(c);
    let what = format!("emulated {} (seed {})", name(c), c.seed);
    c.p.check_tables(&table, &c.lens)
        .map_err(|e| format!("{what}: {e}"))?;
    let splits = c.splits.unwrap_or(1);
    let (o, lse, intact) =
        emulate(c, (&q, &k, &v), (&table, &c.lens), splits).map_err(|e| format!("{what}: {e}"))?;
    ensure(intact, || format!("{what}: a write outside its buffer"))?;
    compare(&what, c, (&q, &k, &v, &table), &o, &lse)
}

/// `table` with every third entry -5 and the next one `i32::MAX` (pages outside any cache).
pub(super) fn bad_pages(table: &[i32]) -> Vec<i32> {
    table
        .iter()
        .enumerate()
        .map(|(i, &x)| match i % 3 {
            0 => -5,
            1 => i32::MAX,
            _ => x,
        })
        .collect()
}

/// A causal case (2 sequences, GQA 4:2, D 64, pages of 16) with its inputs and four pairs of
/// (block table, contexts) whose contents the host cannot check when they are on the device:
/// pages negative or past the cache, contexts negative or past `max_pages x page_size`.
#[allow(clippy::type_complexity)]
fn adversarial_tables() -> (
    DecodeCase,
    (Vec<bf16>, Vec<bf16>, Vec<bf16>),
    [(Vec<i32>, [i32; 2]); 4],
) {
    let c = dcase(&[40, 61], 2, 4, 2, 64, 16, Dtype::Bf16, true, Some(2));
    let (q, k, v, good) = inputs::<bf16>(&c);
    let bad_pages = bad_pages(&good);
    let most = (c.p.max_pages * c.p.page_size) as i32;
    let cases = [
        (bad_pages.clone(), [40, 61]),
        (good.clone(), [-7, i32::MIN]),
        (good, [most + 1, i32::MAX]),
        (bad_pages, [i32::MAX, most]),
    ];
    (c, (q, k, v), cases)
}

/// Tables whose contents the host cannot check (on the device): pages negative or past the
/// cache, contexts negative or past `max_pages x page_size`. The kernel clamps them: nothing
/// is read outside the caches and the table (the emulator checks every `cp.async` source
/// against its buffers) and nothing written outside O, LSE and the workspace (guards).
fn emulated_clamps_bad_tables() -> TestResult {
    let (c, (q, k, v), cases) = adversarial_tables();
    for splits in [1, 3] {
        for (table, lens) in &cases {
            let (_, _, intact) = emulate(&c, (&q, &k, &v), (table, lens), splits)?;
            ensure(intact, || {
                format!("contexts {lens:?}, {splits} splits: a write outside its buffer")
            })?;
        }
    }
    println!("4 adversarial tables x 1 and 3 splits: every read inside the caches, guards intact");
    Ok(())
}

/// The adversarial tables of [`emulated_clamps_bad_tables`] on a GPU (device tables are never
/// checked by the host): every launch completes (run under compute-sanitizer memcheck, no
/// access outside the caches, the table and the outputs).
fn gpu_clamps_bad_tables(g: &Gpu) -> TestResult {
    let (c, (q, k, v), cases) = adversarial_tables();
    let p = &c.p;
    let out = (|| -> kernels::Result<usize> {
        let stream = g.stream()?;
        let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
        let mut runs = 0;
        for splits in [1, 3] {
            for (table, lens) in &cases {
                let (dt, dl) = (upload(table)?, upload(lens)?);
                let (o, lse) = (poisoned::<bf16>(q.len())?, poisoned::<f32>(p.lse_len())?);
                let ws = poisoned::<f32>(p.workspace_len(splits).max(1))?;
                let tensors = AttentionDecodeTensors {
                    q: View::contiguous(&dq, p.q_shape()),
                    k_cache: View::contiguous(&dk, p.cache_shape()),
                    v_cache: View::contiguous(&dv, p.cache_shape()),
                    o: View::contiguous(&o, p.q_shape()),
                    lse: (&lse).into(),
                    block_table: (&dt).into(),
                    cache_seqlens: (&dl).into(),
                    workspace: (&ws).into(),
                    sinks: None,
                };
                let plan = p.plan(&tensors, splits)?;
                // SAFETY: every buffer lives until the synchronization below; O, LSE and the
                // workspace overlap nothing.
                unsafe {
                    plan.run(&kernels::exec::OnStream {
                        gpu: g,
                        stream: &stream,
                    })?
                };
                g.sync(&stream, "attention decode on adversarial tables")?;
                runs += 1;
            }
        }
        Ok(runs)
    })();
    let runs = gpu_ok(out)?;
    println!("{runs} runs on adversarial tables completed");
    Ok(())
}

/// Larger cases for the GPU: every head dimension and dtype, causal and not, 1 to 16 query
/// tokens, page sizes 16 to 256, contexts from 0 to several thousand keys, multi-query heads;
/// the splits of the heuristic and explicit ones (up to 128, more than the steps of the
/// shorter contexts).
fn gpu_cases() -> Vec<DecodeCase> {
    let mut v = Vec::new();
    let lens = [1, 777, 0, 4099, 64, 1500];
    for d in super::head_dims() {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            for causal in [false, true] {
                v.push(dcase(&lens, 3, 8, 2, d, 64, dtype, causal, None));
            }
        }
    }
    for (sq, page, splits) in [
        (1, 16, Some(1)),
        (1, 256, Some(7)),
        (16, 32, Some(128)),
        (4, 48, None),
    ] {
        v.push(dcase(
            &[5000, 33, 2048],
            sq,
            32,
            8,
            128,
            page,
            Dtype::Bf16,
            true,
            splits,
        ));
    }
    // Softcap and sinks at every head dimension, one split and several (the heuristic).
    for d in super::head_dims() {
        for splits in [Some(1), None] {
            v.push(capsink(
                dcase(&lens, 3, 8, 2, d, 64, Dtype::Bf16, true, splits),
                Some(10.0),
                Some((-2.0, 3.0)),
            ));
        }
    }
    v.push(capsink(
        dcase(&[20000, 0], 1, 16, 2, 128, 64, Dtype::F16, false, None),
        Some(50.0),
        Some((-1.0, 1.0)),
    ));
    // Multi-query heads, one long context (the heuristic splits it over the GPU).
    v.push(dcase(&[20000], 1, 16, 1, 128, 64, Dtype::Bf16, false, None));
    v.push(dcase(
        &[3000, 9],
        16,
        8,
        8,
        64,
        16,
        Dtype::F16,
        true,
        Some(5),
    ));
    v
}

fn run_gpu<T: AttentionElem>(g: &Gpu, c: &DecodeCase) -> TestResult {
    let (q, k, v, table) = inputs::<T>(c);
    let p = &c.p;
    let out = (|| -> kernels::Result<(Vec<T>, Vec<f32>, usize)> {
        let stream = g.stream()?;
        let tables = DecodeTables::new(p, &table, &c.lens)?;
        let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
        let dout = poisoned::<T>(q.len())?;
        let mut dlse = poisoned::<f32>(p.lse_len())?;
        let (qv, kv, vv) = (
            View::contiguous(&dq, p.q_shape()),
            View::contiguous(&dk, p.cache_shape()),
            View::contiguous(&dv, p.cache_shape()),
        );
        let mut ov = View::contiguous(&dout, p.q_shape());
        let dsinks = c.sinks.as_deref().map(upload).transpose()?;
        let splits = match c.splits {
            None => {
                attention::decode_with_sinks(
                    g,
                    &stream,
                    p,
                    &tables,
                    (&qv, &kv, &vv),
                    &mut ov,
                    &mut dlse,
                    dsinks.as_ref(),
                )?;
                p.num_splits_on(tables.longest(), g.info())
            }
            Some(n) => {
                let ws = poisoned::<f32>(p.workspace_len(n).max(1))?;
                let (dt, dl) = (upload(&table)?, upload(&c.lens)?);
                let tensors = AttentionDecodeTensors {
                    q: qv,
                    k_cache: kv,
                    v_cache: vv,
                    o: ov,
                    lse: (&dlse).into(),
                    block_table: (&dt).into(),
                    cache_seqlens: (&dl).into(),
                    workspace: (&ws).into(),
                    sinks: dsinks.as_ref().map(Into::into),
                };
                let plan = p.plan(&tensors, n)?;
                // SAFETY: every buffer lives until the synchronization below; O, LSE and the
                // workspace overlap nothing.
                unsafe {
                    plan.run(&kernels::exec::OnStream {
                        gpu: g,
                        stream: &stream,
                    })?
                };
                g.sync(&stream, "attention decode")?;
                n
            }
        };
        Ok((download(&dout)?, download(&dlse)?, splits))
    })();
    let (o, lse, splits) = gpu_ok(out)?;
    compare(
        &format!(
            "{} ({splits} splits) on {} (seed {})",
            name(c),
            g.arch(),
            c.seed
        ),
        c,
        (&q, &k, &v, &table),
        &o,
        &lse,
    )
}

/// Bad problems and tensors are typed errors before any launch: a workspace too small for the
/// splits, splits out of range, tables of the wrong length, a cache of the wrong shape, tables
/// made for another problem.
fn rejects_bad_tensors(g: &Gpu) -> TestResult {
    let c = dcase(&[40, 61], 1, 4, 2, 64, 16, Dtype::Bf16, false, Some(2));
    let p = &c.p;
    let (q, k, v, table) = inputs::<bf16>(&c);
    let errors = (|| -> kernels::Result<Vec<String>> {
        g.bind()?;
        let (dq, dk, dv) = (upload(&q)?, upload(&k)?, upload(&v)?);
        let (dt, dl) = (upload(&table)?, upload(&c.lens)?);
        let (out, lse) = (poisoned::<bf16>(q.len())?, poisoned::<f32>(p.lse_len())?);
        let ws = poisoned::<f32>(p.workspace_len(2))?;
        let good = AttentionDecodeTensors {
            q: View::contiguous(&dq, p.q_shape()),
            k_cache: View::contiguous(&dk, p.cache_shape()),
            v_cache: View::contiguous(&dv, p.cache_shape()),
            o: View::contiguous(&out, p.q_shape()),
            lse: (&lse).into(),
            block_table: (&dt).into(),
            cache_seqlens: (&dl).into(),
            workspace: (&ws).into(),
            sinks: None,
        };
        p.plan(&good, 2)?;
        let mut errors = Vec::new();
        let mut expect = |r: kernels::Result<attention::AttentionDecodePlan>, want: &str| match r {
            Ok(_) => errors.push(format!("accepted: want an error naming {want:?}")),
            Err(e) if !e.to_string().contains(want) => {
                errors.push(format!("want {want:?}, got: {e}"))
            }
            Err(_) => {}
        };
        expect(p.plan(&good, 3), "decode workspace");
        expect(p.plan(&good, 0), "num_splits");
        expect(p.plan(&good, 129), "num_splits");
        let short = AttentionDecodeTensors {
            // SAFETY: the first 3 elements of the uploaded table (nothing is launched).
            block_table: unsafe {
                kernels::exec::DevView::from_raw(dt.as_device_ptr().as_raw(), 3)
            },
            ..good
        };
        expect(p.plan(&short, 2), "block table");
        let wrong = AttentionDecodeTensors {
            k_cache: View::contiguous(&dk, [p.num_pages, p.page_size / 2, p.heads_kv * 2, 64]),
            ..good
        };
        expect(p.plan(&wrong, 2), "K cache shape");
        let stream = g.stream()?;
        let tables = DecodeTables::new(p, &table, &c.lens)?;
        let mut other = p.clone();
        other.causal = true;
        let mut ov = View::contiguous(&out, p.q_shape());
        let mut lse2 = poisoned::<f32>(p.lse_len())?;
        match attention::decode(
            g,
            &stream,
            &other,
            &tables,
            &good.q,
            &good.k_cache,
            &good.v_cache,
            &mut ov,
            &mut lse2,
        ) {
            Ok(()) => errors.push("tables of another problem accepted".into()),
            Err(e) if !e.to_string().contains("decode tables") => {
                errors.push(format!("want \"decode tables\", got: {e}"))
            }
            Err(_) => {}
        }
        Ok(errors)
    })();
    let errors = gpu_ok(errors)?;
    ensure(errors.is_empty(), || errors.join("; "))?;
    println!("7 bad plans and calls refused with typed errors");
    Ok(())
}

pub fn register(s: &mut Suite) {
    for c in emulated_cases() {
        let n = format!("attention_decode/emulated/{}", name(&c));
        s.cpu(&n, move || match c.p.dtype {
            Dtype::Bf16 => run_emulated::<bf16>(&c),
            Dtype::F16 => run_emulated::<f16>(&c),
        });
    }
    s.cpu(
        "attention_decode/emulated/clamps_bad_tables",
        emulated_clamps_bad_tables,
    );
    s.gpu(
        "attention_decode/gpu/clamps_bad_tables",
        Needs::Gpu,
        gpu_clamps_bad_tables,
    );
    s.gpu(
        "attention_decode/gpu/rejects_bad_tensors",
        Needs::Gpu,
        rejects_bad_tensors,
    );
    for c in gpu_cases() {
        let n = format!("attention_decode/gpu/{}", name(&c));
        s.gpu(&n, Needs::Gpu, move |g| match c.p.dtype {
            Dtype::Bf16 => run_gpu::<bf16>(g, &c),
            Dtype::F16 => run_gpu::<f16>(g, &c),
        });
    }
}
