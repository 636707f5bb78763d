//! `attention-decode`: the decode step over a paged KV cache (`kernels::attention::decode`).

use super::{Elem, ints_i32};
use crate::tensors::{Data, Dim, Inputs, Outputs};
use crate::{CliError, Common, Job, Result, launch_timed};
use clap::Args;
use half::{bf16, f16};
use kernels::Gpu;
use kernels::attention::decode::MAX_SPLITS;
use kernels::attention::{
    self, AttentionDecodeProblem, AttentionDecodeTensors, Dtype, View, reference_decode_sinks,
};
use kernels::exec::OnStream;
use kernels::memory::{download, poisoned, upload};
use kernels::timing::Timings;
use safetensors::Dtype as St;

/// `kernels-cli attention-decode --help`.
pub const HELP_DECODE: &str = "\
Attention decode over a paged KV cache (FlashAttention's flash_attn_with_kvcache with a block \
table; split-KV): O = softmax(scale Q K^T + mask) V over each sequence's cached keys, and the \
row log-sum-exp (natural log); softmax and accumulation in f32.

Inputs (FlashAttention's layout, the head dimension last):
  q              bf16 or f16  [B, Sq, Hq, D]              Sq in 1..=16; D in {32, 48, .., 256}
  k_cache        same as q    [pages, page_size, Hkv, D]  page_size in 16..=256, a multiple of 16
  v_cache        same as q    [pages, page_size, Hkv, D]  Hq a multiple of Hkv (GQA)
  block_table    i32/i64      [B, max_pages]              page t of sequence b: block_table[b, t]
  cache_seqlens  i32/i64      [B]                         the context lengths L_b, each at most
                                                          max_pages x page_size
  sinks          f32          [Hq]                        optional: attention sinks (gpt-oss)

Outputs:
  o    dtype of q   [B, Sq, Hq, D]    (f64 with --reference)
  lse  f32          [B, Hq, Sq]       (f64 with --reference); -inf for a row with no key

Sequence b's keys and values 0 .. L_b are at slot j % page_size of page block_table[b, j / \
page_size] of the caches; pages may come in any order and be shared between sequences, and the \
entries past a context are not read (any value, e.g. -1). The tables are checked before \
anything runs: every page a context uses must be in 0 .. pages.

Query i of sequence b is the token at position L_b - Sq + i (bottom-right aligned, as \
`attention`): it attends every key j < L_b, or with --causal the keys j <= L_b - Sq + i. A \
row with no key (L_b = 0, or causal rows before the context) gets O = 0 and LSE = -inf (the sink with sinks). --softcap C caps every logit l as C tanh(l / C).

Each sequence's keys are split over --num-splits blocks (flash-decoding; default: \
FlashAttention's heuristic for this GPU and the longest context), whose partial results a \
second kernel combines. The mma.sync kernels, every GPU of compute capability >= 8.0.

--check compares with the f64 reference under the attention tests' tolerance rule \
(FlashAttention's): max |O - ref| <= 2 max |O_naive - ref| + 1e-3, where O_naive is the same \
computation in the input precision, and max |LSE - ref| <= 1e-3 max(1, max |ref|); it fails if \
one exceeds it.";

/// `kernels-cli attention-decode` options.
#[derive(Clone, Debug, Args)]
pub struct AttentionDecodeArgs {
    /// Input, output and mode.
    #[command(flatten)]
    pub common: Common,
    /// Causal masking among the new tokens, bottom-right aligned (query i of a sequence with
    /// L keys attends key j iff j <= L - Sq + i).
    #[arg(long)]
    pub causal: bool,
    /// Softmax scale (default 1 / sqrt(D)).
    #[arg(long)]
    pub scale: Option<f32>,
    /// Softcap: every logit l becomes C tanh(l / C) (default none).
    #[arg(long, value_name = "C")]
    pub softcap: Option<f32>,
    /// Blocks each sequence's keys are split over, 1 to 128 (GPU only; default: the heuristic
    /// for this GPU and the longest context; the reference is the same for all).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=MAX_SPLITS as i64)
    )]
    pub num_splits: Option<u32>,
}

/// The tensors `attention-decode` reads.
pub const TENSORS_DECODE: &[&str] = &[
    "q",
    "k_cache",
    "v_cache",
    "block_table",
    "cache_seqlens",
    "sinks",
];

/// Read and check the inputs of `attention-decode` (the tables' contents included), build the
/// problem.
pub fn decode_job(args: &AttentionDecodeArgs) -> Result<Box<dyn Job>> {
    let mut inp = Inputs::open(&args.common.input)?;
    let half = [St::BF16, St::F16];
    let q = inp.take(
        "q",
        &half,
        &[Dim::Var("B"), Dim::Var("Sq"), Dim::Var("Hq"), Dim::Var("D")],
    )?;
    let cache = [
        Dim::Var("pages"),
        Dim::Var("page_size"),
        Dim::Var("Hkv"),
        Dim::Var("D"),
    ];
    let k = inp.take("k_cache", &half, &cache)?;
    let v = inp.take("v_cache", &half, &cache)?;
    for (name, t) in [("k_cache", &k), ("v_cache", &v)] {
        if t.dtype() != q.dtype() {
            return Err(CliError::Dtype {
                name: name.to_string(),
                expected: format!(
                    "{} (the dtype of `q`)",
                    crate::tensors::dtype_name(q.dtype())
                ),
                got: crate::tensors::dtype_name(t.dtype()),
            });
        }
    }
    let ints = [St::I32, St::I64];
    let table = inp.take(
        "block_table",
        &ints,
        &[Dim::Var("B"), Dim::Var("max_pages")],
    )?;
    let lens = inp.take("cache_seqlens", &ints, &[Dim::Var("B")])?;
    let sinks = inp
        .take_opt("sinks", &[St::F32], &[Dim::Var("Hq")])?
        .map(|t| t.f32());
    inp.finish("attention-decode", TENSORS_DECODE, &[])?;
    let [b, sq, hq, d] = q.shape().try_into().expect("rank checked");
    let [pages, page_size, hkv, _] = k.shape().try_into().expect("rank checked");
    let [_, max_pages] = table.shape().try_into().expect("rank checked");
    let mut p = AttentionDecodeProblem::new(b, sq, hq, hkv, d, page_size, pages, max_pages);
    p.dtype = if q.dtype() == St::BF16 {
        Dtype::Bf16
    } else {
        Dtype::F16
    };
    p.causal = args.causal;
    p.scale = args.scale;
    p.softcap = args.softcap;
    p.sinks = sinks.is_some();
    let table = ints_i32("block_table", &table)?;
    let lens = ints_i32("cache_seqlens", &lens)?;
    // The checks `DecodeTables::new` makes, on the host before any GPU work (the reference reads
    // the caches through the tables too); validates the problem first.
    let longest = p.check_tables(&table, &lens)?;
    let num_splits = args.num_splits.map(|n| n as usize);
    Ok(match p.dtype {
        Dtype::Bf16 => Box::new(DecodeJob::<bf16> {
            q: q.bf16(),
            k: k.bf16(),
            v: v.bf16(),
            p,
            table,
            lens,
            longest,
            num_splits,
            sinks: sinks.clone(),
        }),
        Dtype::F16 => Box::new(DecodeJob::<f16> {
            q: q.f16(),
            k: k.f16(),
            v: v.f16(),
            p,
            table,
            lens,
            longest,
            num_splits,
            sinks: sinks.clone(),
        }),
    })
}

struct DecodeJob<T> {
    p: AttentionDecodeProblem,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    /// `[B, max_pages]`, checked.
    table: Vec<i32>,
    /// `[B]`, checked.
    lens: Vec<i32>,
    /// The longest context (the split heuristic's).
    longest: usize,
    /// `--num-splits`.
    num_splits: Option<usize>,
    /// The sink logits `[Hq]`, if given.
    sinks: Option<Vec<f32>>,
}

impl<T> DecodeJob<T> {
    /// LSE's shape: `[B, Hq, Sq]`.
    fn lse_shape(&self) -> [usize; 3] {
        [self.p.batch, self.p.heads_q, self.p.seq_q]
    }

    /// Sequence `b`'s first `len` rows of `cache`, gathered from its pages: `[len, Hkv, D]`.
    fn gather(&self, cache: &[T], b: usize, len: usize) -> Vec<T>
    where
        T: Copy,
    {
        let p = &self.p;
        let row = p.heads_kv * p.head_dim;
        (0..len)
            .flat_map(|j| {
                let page = self.table[b * p.max_pages + j / p.page_size] as usize;
                let at = (page * p.page_size + j % p.page_size) * row;
                cache[at..at + row].iter().copied()
            })
            .collect()
    }
}

impl<T: Elem> Job for DecodeJob<T> {
    fn gpu(&self, gpu: &Gpu, repeat: Option<u32>) -> Result<(Outputs, Option<Timings>)> {
        let p = &self.p;
        // `attention::decode`'s choice unless given; planned once here (no allocation or
        // synchronization inside the timed runs).
        let splits = self
            .num_splits
            .unwrap_or_else(|| p.num_splits_on(self.longest, gpu.info()));
        let stream = gpu.stream()?;
        let (q, k, v) = (upload(&self.q)?, upload(&self.k)?, upload(&self.v)?);
        let (table, lens) = (upload(&self.table)?, upload(&self.lens)?);
        let o = poisoned::<T>(self.q.len())?;
        let lse = poisoned::<f32>(p.lse_len())?;
        let workspace = poisoned::<f32>(p.workspace_len(splits).max(1))?;
        let sinks = self.sinks.as_deref().map(upload).transpose()?;
        let timings = {
            let tensors = AttentionDecodeTensors {
                q: View::contiguous(&q, p.q_shape()),
                k_cache: View::contiguous(&k, p.cache_shape()),
                v_cache: View::contiguous(&v, p.cache_shape()),
                o: View::contiguous(&o, p.q_shape()),
                lse: (&lse).into(),
                block_table: (&table).into(),
                cache_seqlens: (&lens).into(),
                workspace: (&workspace).into(),
                sinks: sinks.as_ref().map(Into::into),
            };
            let plan = p.plan(&tensors, splits)?;
            let exec = OnStream {
                gpu,
                stream: &stream,
            };
            launch_timed(gpu, &stream, repeat, "attention decode", || {
                // SAFETY: every buffer of `tensors` lives until after `launch_timed`
                // synchronized the stream; O, LSE and the workspace are buffers of their own,
                // overlapping nothing.
                unsafe { plan.run(&exec) }
            })?
        };
        let mut out = Outputs::default();
        out.push("o", &p.q_shape(), T::data(download(&o)?));
        out.push("lse", &self.lse_shape(), Data::F32(download(&lse)?));
        Ok((out, timings))
    }

    fn reference(&self) -> Result<Outputs> {
        let p = &self.p;
        let r = reference_decode_sinks(
            p,
            &self.q,
            (&self.k, &self.v),
            (&self.table, &self.lens),
            self.sinks.as_deref(),
        );
        let mut out = Outputs::default();
        out.push("o", &p.q_shape(), Data::F64(r.o));
        out.push("lse", &self.lse_shape(), Data::F64(r.lse));
        Ok(out)
    }

    /// The attention tests' rule: O within `2 max |O_naive - ref| + 1e-3` (`O_naive` the
    /// same-precision naive forward on each sequence's gathered keys), LSE within `1e-3 max(1,
    /// max |ref|)` (the tests' relative bound `1e-3 max(1, |ref|)` at the largest LSE; equal
    /// infinities, rows without keys, count as exact).
    fn tolerances(&self, want: &Outputs) -> Result<Vec<(String, f64)>> {
        let p = &self.p;
        let rows = p.seq_q * p.heads_q * p.head_dim;
        let mut naive = Vec::with_capacity(self.q.len());
        for (b, &len) in self.lens.iter().enumerate() {
            let len = len as usize;
            let (k, v) = (self.gather(&self.k, b, len), self.gather(&self.v, b, len));
            let qb = &self.q[b * rows..(b + 1) * rows];
            let sinks = self.sinks.as_deref();
            let seq = p.sequence(len);
            naive.extend(attention::naive_same_precision_sinks(&seq, qb, &k, &v, sinks).o);
        }
        let get = |name: &str| -> Result<Vec<f64>> {
            Ok(want
                .get(name)
                .ok_or_else(|| CliError::Internal(format!("the reference has no `{name}`")))?
                .data
                .to_f64())
        };
        let o = get("o")?;
        let naive_err = naive
            .iter()
            .zip(&o)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        let max_lse = get("lse")?
            .iter()
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, x| m.max(x.abs()));
        Ok(vec![
            ("o".to_string(), 2.0 * naive_err + 1e-3),
            ("lse".to_string(), 1e-3 * max_lse.max(1.0)),
        ])
    }
}
