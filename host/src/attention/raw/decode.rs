//! The decode step over a paged KV cache on tensors this library does not own: the options, the
//! raw tensors, the splits and workspace ([`decode_workspace_len`]), the plan
//! ([`plan_decode_raw`]) and the launch ([`decode_raw`]), checked as the rest of [`super`]; the
//! append of new keys and values to the cache ([`plan_append_raw`], [`append_kv_raw`]).

use super::super::append::{KvAppendPlan, KvAppendProblem, KvAppendTensors};
use super::super::decode::{
    AttentionDecodePlan, AttentionDecodeProblem, AttentionDecodeTensors, MAX_SPLITS,
};
use super::super::problem::{AttentionElem, Dtype};
use super::{dtype_of, flat_view, sinks_view, view};
use crate::error::{Error, Result};
use crate::raw::{ElemType, RawElem, RawStream, RawTensor, check_disjoint};
use half::{bf16, f16};

/// The options of a decode step over a paged KV cache (the sizes come from the tensors).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionDecodeOptions {
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Causal masking among the new tokens (bottom-right aligned).
    pub causal: bool,
    /// Softcap (`softcap tanh(l / softcap)` on every logit `l`); `None` for none.
    pub softcap: Option<f32>,
}

/// The tensors of a raw decode step over a paged KV cache (the layouts of
/// [`AttentionDecodeTensors`]; the module `decode` documents them).
#[derive(Clone, Copy)]
pub struct RawAttentionDecodeTensors<'t> {
    /// Q `[batch, seq_q, heads_q, D]`, bf16 or f16.
    pub q: &'t RawTensor,
    /// The key cache `[num_pages, page_size, heads_kv, D]`, Q's type.
    pub k_cache: &'t RawTensor,
    /// The value cache, as the key cache.
    pub v_cache: &'t RawTensor,
    /// O, as Q (written).
    pub o: &'t RawTensor,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous (written).
    pub lse: &'t RawTensor,
    /// The block table `[batch, max_pages]` i32, contiguous.
    pub block_table: &'t RawTensor,
    /// The context lengths `[batch]` i32, contiguous.
    pub cache_seqlens: &'t RawTensor,
    /// The splits' scratch: a contiguous rank-1 f32 tensor of the length
    /// [`decode_workspace_len`] gives (empty with one split), 16-byte aligned (written).
    pub workspace: &'t RawTensor,
    /// Attention sinks: `[heads_q]` f32 logits, one per query head, or `None`.
    pub sinks: Option<&'t RawTensor>,
}

impl RawAttentionDecodeTensors<'_> {
    /// The inputs and the outputs (with the workspace), named.
    fn inputs_outputs(&self) -> [Vec<(&'static str, &RawTensor)>; 2] {
        let mut inputs = vec![
            ("Q", self.q),
            ("K cache", self.k_cache),
            ("V cache", self.v_cache),
            ("block table", self.block_table),
            ("cache_seqlens", self.cache_seqlens),
        ];
        inputs.extend(self.sinks.map(|s| ("sinks", s)));
        [
            inputs,
            vec![
                ("O", self.o),
                ("LSE", self.lse),
                ("decode workspace", self.workspace),
            ],
        ]
    }
}

impl AttentionDecodeProblem {
    /// The problem of Q of shape `q` (`[batch, seq_q, heads_q, D]`), caches of shape `k_cache`
    /// (`[num_pages, page_size, heads_kv, D]`; D is Q's, the caches' is checked against it with
    /// the tensors) and a block table of shape `block_table` (`[batch, max_pages]`; its batch is
    /// checked with the tensors), with `options`.
    pub fn from_shapes(
        q: &[usize],
        k_cache: &[usize],
        block_table: &[usize],
        dtype: Dtype,
        options: &AttentionDecodeOptions,
    ) -> Result<AttentionDecodeProblem> {
        let [batch, seq_q, heads_q, head_dim] =
            <[usize; 4]>::try_from(q).map_err(|_| Error::shape("Q rank", 4, q.len()))?;
        let [num_pages, page_size, heads_kv, _] = <[usize; 4]>::try_from(k_cache)
            .map_err(|_| Error::shape("K cache rank", 4, k_cache.len()))?;
        let [_, max_pages] = <[usize; 2]>::try_from(block_table)
            .map_err(|_| Error::shape("block table rank", 2, block_table.len()))?;
        Ok(AttentionDecodeProblem {
            batch,
            seq_q,
            heads_q,
            heads_kv,
            head_dim,
            page_size,
            num_pages,
            max_pages,
            dtype,
            scale: options.scale,
            causal: options.causal,
            softcap: options.softcap,
            sinks: false,
        })
    }
}

/// `num_splits` checked in `1 ..=` [`MAX_SPLITS`].
fn check_splits(num_splits: usize) -> Result<()> {
    if num_splits == 0 || num_splits > MAX_SPLITS {
        return Err(Error::invalid(
            "num_splits",
            format!("{num_splits} is outside 1 ..= {MAX_SPLITS}"),
        ));
    }
    Ok(())
}

/// The splits and the workspace of a decode step on Q of shape `q`, caches of shape `k_cache`
/// and a block table of shape `block_table` (as [`AttentionDecodeProblem::from_shapes`]) of
/// element type `dtype`, for a caller that allocates the workspace before launching
/// ([`decode_raw`]): `(num_splits, workspace_len)`. `num_splits` is the one given (1 to
/// [`MAX_SPLITS`]), or with 0 the heuristic's ([`AttentionDecodeProblem::num_splits`]) for a
/// GPU of `multiprocessors` SMs of `smem_per_sm` bytes of shared memory each (0 if unknown: one
/// block per SM; [`AttentionDecodeProblem::resident_blocks`]) and the longest context the
/// block table allows (`max_pages x page_size`: the tables' contents are device data, not
/// read); `workspace_len` is the f32
/// elements those splits need ([`AttentionDecodeProblem::workspace_len`], 0 with one split).
/// The problem is validated as the plan validates it.
pub fn decode_workspace_len(
    q: &[usize],
    k_cache: &[usize],
    block_table: &[usize],
    dtype: ElemType,
    num_splits: usize,
    multiprocessors: usize,
    smem_per_sm: usize,
) -> Result<(usize, usize)> {
    let problem = AttentionDecodeProblem::from_shapes(
        q,
        k_cache,
        block_table,
        dtype_of(dtype)?,
        &Default::default(),
    )?;
    problem.validate()?;
    let splits = match num_splits {
        0 => problem.num_splits(
            problem.max_context(),
            problem.resident_blocks(multiprocessors, smem_per_sm),
        ),
        n => {
            check_splits(n)?;
            n
        }
    };
    Ok((splits, problem.workspace_len(splits)))
}

/// Plan a decode step over a paged KV cache on raw tensors with `num_splits` splits (1 to
/// [`MAX_SPLITS`]) of each sequence's keys (pure: no driver call, no memory read): the problem
/// from the shapes of Q, the key cache and the block table, and `options`; the tensors' element
/// types, ranks and strides, every view inside its storage, the outputs and the workspace
/// apart from the inputs and each other, the workspace of exactly the splits' length
/// ([`decode_workspace_len`]), then the typed plan's checks ([`AttentionDecodeProblem::plan`]).
/// The tables' contents are device data: the kernel clamps them.
pub fn plan_decode_raw(
    options: &AttentionDecodeOptions,
    tensors: &RawAttentionDecodeTensors<'_>,
    num_splits: usize,
) -> Result<(AttentionDecodeProblem, AttentionDecodePlan)> {
    let dtype = dtype_of(tensors.q.dtype)?;
    let mut problem = AttentionDecodeProblem::from_shapes(
        &tensors.q.shape,
        &tensors.k_cache.shape,
        &tensors.block_table.shape,
        dtype,
        options,
    )?;
    problem.sinks = tensors.sinks.is_some();
    problem.validate()?;
    check_splits(num_splits)?;
    let [inputs, outputs] = tensors.inputs_outputs();
    check_disjoint(&inputs, &outputs)?;
    let plan = match dtype {
        Dtype::Bf16 => plan_decode_typed::<bf16>(&problem, tensors, num_splits),
        Dtype::F16 => plan_decode_typed::<f16>(&problem, tensors, num_splits),
    }?;
    Ok((problem, plan))
}

fn plan_decode_typed<T: AttentionElem + RawElem>(
    problem: &AttentionDecodeProblem,
    t: &RawAttentionDecodeTensors<'_>,
    num_splits: usize,
) -> Result<AttentionDecodePlan> {
    let ws_len = problem.workspace_len(num_splits);
    problem.plan::<T>(
        &AttentionDecodeTensors {
            q: view("Q", t.q)?,
            k_cache: view("K cache", t.k_cache)?,
            v_cache: view("V cache", t.v_cache)?,
            o: view("O", t.o)?,
            lse: flat_view(
                "LSE",
                t.lse,
                &[problem.batch, problem.heads_q, problem.seq_q],
            )?,
            block_table: flat_view(
                "block table",
                t.block_table,
                &[problem.batch, problem.max_pages],
            )?,
            cache_seqlens: flat_view("cache_seqlens", t.cache_seqlens, &[problem.batch])?,
            workspace: t
                .workspace
                .contiguous_view("decode workspace", &[ws_len], 16)?,
            sinks: t
                .sinks
                .map(|s| sinks_view(problem.heads_q, s))
                .transpose()?,
        },
        num_splits,
    )
}

/// Launch a decode step over a paged KV cache on `stream` (asynchronous), FlashAttention's
/// `flash_attn_with_kvcache` with a block table: O and LSE written from Q, the caches and the
/// tables, with `num_splits` splits of each sequence's keys and the caller's workspace of their
/// length (both from [`decode_workspace_len`]). Checks as [`plan_decode_raw`], and that every
/// non-empty tensor's storage is device memory of the stream's device inside one allocation.
/// The host reads neither table (no synchronization).
///
/// # Safety
/// Each tensor's storage is memory the caller owns, live until the launches have completed on
/// `stream`; nothing else writes Q, the caches or the tables, or accesses O, LSE and the
/// workspace, until then. The tables should hold what the module `decode` documents (contexts
/// in `0 ..= max_pages x page_size`, the pages a context uses in `0 .. num_pages`): other
/// contents cannot make the kernels access memory outside the tensors (they clamp them), but
/// leave O and LSE meaningless.
pub unsafe fn decode_raw(
    stream: &RawStream,
    options: &AttentionDecodeOptions,
    tensors: &RawAttentionDecodeTensors<'_>,
    num_splits: usize,
) -> Result<()> {
    let gpu = stream.gpu();
    let (_, plan) = plan_decode_raw(options, tensors, num_splits)?;
    let [inputs, outputs] = tensors.inputs_outputs();
    for (what, t) in inputs.iter().chain(&outputs) {
        // An empty tensor (the workspace of one split: a framework may give it any address) is
        // never accessed.
        if t.shape.iter().product::<usize>() > 0 {
            t.check_memory(what, gpu)?;
        }
    }
    // SAFETY: the plan checked every view against its storage, the tables' and LSE's lengths,
    // the workspace's length for the splits and its alignment; the outputs and the workspace
    // overlap neither the inputs nor each other (checked); the non-empty storage is device
    // memory of the stream's device inside one allocation (checked above; an empty workspace
    // is never accessed: one split has no partial results), live and not accessed by others
    // until the launches complete (the caller's contract); the kernel clamps the tables'
    // contents into the caches and the block table.
    unsafe { plan.run(stream) }
}

/// The tensors of a raw append of new keys and values to a paged KV cache (the layouts of
/// [`KvAppendTensors`]).
#[derive(Clone, Copy)]
pub struct RawKvAppendTensors<'t> {
    /// New keys `[batch, seq_new, heads_kv, D]`, bf16 or f16.
    pub k_new: &'t RawTensor,
    /// New values, as the new keys.
    pub v_new: &'t RawTensor,
    /// The key cache `[num_pages, page_size, heads_kv, D]`, the new keys' type (written).
    pub k_cache: &'t RawTensor,
    /// The value cache, as the key cache (written).
    pub v_cache: &'t RawTensor,
    /// The block table `[batch, max_pages]` i32, contiguous.
    pub block_table: &'t RawTensor,
    /// The context lengths before the new tokens `[batch]` i32, contiguous.
    pub cache_seqlens: &'t RawTensor,
}

impl RawKvAppendTensors<'_> {
    /// The inputs and the outputs (the caches), named.
    fn inputs_outputs(&self) -> [Vec<(&'static str, &RawTensor)>; 2] {
        [
            vec![
                ("new K", self.k_new),
                ("new V", self.v_new),
                ("block table", self.block_table),
                ("cache_seqlens", self.cache_seqlens),
            ],
            vec![("K cache", self.k_cache), ("V cache", self.v_cache)],
        ]
    }
}

/// Plan an append of new keys and values to a paged KV cache on raw tensors (pure: no driver
/// call, no memory read): the problem from the shapes of the new keys (`[batch, seq_new,
/// heads_kv, D]`), the key cache and the block table; the tensors' element types, ranks and
/// strides, every view inside its storage, the caches apart from the other tensors and each
/// other, then the typed plan's checks ([`KvAppendProblem::plan`]). The tables' contents are
/// device data: the kernel clamps them.
pub fn plan_append_raw(
    tensors: &RawKvAppendTensors<'_>,
) -> Result<(KvAppendProblem, KvAppendPlan)> {
    let dtype = dtype_of(tensors.k_new.dtype)?;
    let [batch, seq_new, heads_kv, head_dim] = <[usize; 4]>::try_from(&tensors.k_new.shape[..])
        .map_err(|_| Error::shape("new K rank", 4, tensors.k_new.shape.len()))?;
    // The decode problem of one query token per key/value head: only its cache's sizes matter.
    let decode = AttentionDecodeProblem::from_shapes(
        &[batch, 1, heads_kv, head_dim],
        &tensors.k_cache.shape,
        &tensors.block_table.shape,
        dtype,
        &Default::default(),
    )?;
    let problem = KvAppendProblem::new(&decode, seq_new);
    problem.validate()?;
    let [inputs, outputs] = tensors.inputs_outputs();
    check_disjoint(&inputs, &outputs)?;
    let plan = match dtype {
        Dtype::Bf16 => plan_append_typed::<bf16>(&problem, tensors),
        Dtype::F16 => plan_append_typed::<f16>(&problem, tensors),
    }?;
    Ok((problem, plan))
}

fn plan_append_typed<T: AttentionElem + RawElem>(
    problem: &KvAppendProblem,
    t: &RawKvAppendTensors<'_>,
) -> Result<KvAppendPlan> {
    let d = &problem.decode;
    problem.plan::<T>(&KvAppendTensors {
        k_new: view("new K", t.k_new)?,
        v_new: view("new V", t.v_new)?,
        k_cache: view("K cache", t.k_cache)?,
        v_cache: view("V cache", t.v_cache)?,
        block_table: flat_view("block table", t.block_table, &[d.batch, d.max_pages])?,
        cache_seqlens: flat_view("cache_seqlens", t.cache_seqlens, &[d.batch])?,
    })
}

/// Append new keys and values to a paged KV cache on `stream` (asynchronous), the `k`, `v` of
/// FlashAttention's `flash_attn_with_kvcache`: token `t` of sequence `b` written at position
/// `cache_seqlens[b] + t` (the lengths are not changed; the decode step that follows passes
/// `cache_seqlens + seq_new`). Checks as [`plan_append_raw`], and that every tensor's storage
/// is device memory of the stream's device inside one allocation. The host reads neither table.
///
/// # Safety
/// Each tensor's storage is memory the caller owns, live until the launch has completed on
/// `stream`; nothing else accesses the caches or writes the other tensors until then. The
/// tables should give every sequence room for the new tokens in pages of the cache: other
/// contents cannot make the kernel write outside the caches (it clamps them and skips what
/// does not fit), but leave those tokens unwritten.
pub unsafe fn append_kv_raw(stream: &RawStream, tensors: &RawKvAppendTensors<'_>) -> Result<()> {
    let gpu = stream.gpu();
    let (_, plan) = plan_append_raw(tensors)?;
    let [inputs, outputs] = tensors.inputs_outputs();
    for (what, t) in inputs.iter().chain(&outputs) {
        t.check_memory(what, gpu)?;
    }
    // SAFETY: the plan checked every view against its storage, the tables' lengths, the caches
    // apart from the other tensors and each other; the storage is device memory of the stream's
    // device inside one allocation (checked above), live and not accessed by others until the
    // launch completes (the caller's contract); the kernel clamps the tables' contents.
    unsafe { plan.run(stream) }
}
