//! New keys and values appended to a paged KV cache before a decode step (FlashInfer's
//! `append_paged_kv_cache`; the `k`, `v` arguments of FlashAttention's
//! `flash_attn_with_kvcache`): token `t` of sequence `b` is written at position
//! `cache_seqlens[b] + t` of that sequence's pages. The context lengths are not changed: the
//! decode step that follows passes `cache_seqlens[b] + seq_new`.
//!
//! The same three steps as the other plans: a [`KvAppendProblem`] (the decode problem's cache
//! and the number of new tokens) planned on its tensors ([`KvAppendTensors`]) into a
//! [`KvAppendPlan`] (pure), which runs on any executor; [`append_kv`] checks the tables on the
//! host, uploads them and runs it on `cust` buffers. The kernel (`attention_kv_append`) copies
//! 16-bit elements whatever their type, so one kernel serves bf16 and f16 and every head
//! dimension.

use super::backward::plan::views_overlap;
use super::decode::AttentionDecodeProblem;
use super::{AttentionElem, View};
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec, OnStream};
use crate::gpu::Gpu;
use crate::launch::Launch;
use crate::memory::upload;
use cust::stream::Stream;
use kernel_abi::attention::decode::{
    APPEND_CHUNK, APPEND_THREADS, KV_APPEND_KERNEL, KvAppendParams,
};

/// Appending `seq_new` tokens' keys and values per sequence to the cache of a decode problem.
#[derive(Clone, Debug, PartialEq)]
pub struct KvAppendProblem {
    /// The decode problem whose cache receives the tokens (its batch, key/value heads, head
    /// dimension, element type, page size, pages and block-table columns).
    pub decode: AttentionDecodeProblem,
    /// New tokens per sequence (at least 1).
    pub seq_new: usize,
}

impl KvAppendProblem {
    /// `seq_new` new tokens per sequence for the cache of `decode`.
    pub fn new(decode: &AttentionDecodeProblem, seq_new: usize) -> Self {
        KvAppendProblem {
            decode: decode.clone(),
            seq_new,
        }
    }

    /// The shape of the new keys and values: `[batch, seq_new, heads_kv, D]`.
    pub fn new_shape(&self) -> [usize; 4] {
        let d = &self.decode;
        [d.batch, self.seq_new, d.heads_kv, d.head_dim]
    }

    /// Check the sizes (the decode problem's, and room for the new tokens in a sequence).
    pub fn validate(&self) -> Result<()> {
        self.decode.validate()?;
        let context = self.decode.max_context();
        if self.seq_new == 0 || self.seq_new > context {
            return Err(Error::invalid(
                "seq_new",
                format!(
                    "{} new tokens: a sequence holds 1 ..= max_pages x page_size = {context}",
                    self.seq_new
                ),
            ));
        }
        // Threads: one per 16-byte chunk, the grid's x below 2^31 blocks.
        let chunks = self
            .new_shape()
            .iter()
            .map(|&x| x as u128)
            .product::<u128>()
            / APPEND_CHUNK as u128;
        if chunks.div_ceil(APPEND_THREADS as u128) >= 1 << 31 {
            return Err(Error::unsupported(
                "new tokens",
                "batch x seq_new x heads_kv x head_dim / 8 must stay below 2^38",
            ));
        }
        Ok(())
    }

    /// Check the tables on the host: their lengths, and for every sequence room for the new
    /// tokens (`cache_seqlens[b] + seq_new <= max_pages x page_size`) in pages of the cache.
    pub fn check_tables(&self, block_table: &[i32], cache_seqlens: &[i32]) -> Result<()> {
        self.validate()?;
        let d = &self.decode;
        d.check_tables(block_table, cache_seqlens)?;
        for (b, &len) in cache_seqlens.iter().enumerate() {
            if len as usize + self.seq_new > d.max_context() {
                return Err(Error::invalid(
                    "cache_seqlens",
                    format!(
                        "sequence {b} has {len} keys: no room for {} more in max_pages x \
                         page_size = {}",
                        self.seq_new,
                        d.max_context()
                    ),
                ));
            }
        }
        for (b, &len) in cache_seqlens.iter().enumerate() {
            let (start, end) = (len as usize, len as usize + self.seq_new);
            let row = &block_table[b * d.max_pages..][..d.max_pages];
            let first = start / d.page_size;
            for (t, &page) in row[..end.div_ceil(d.page_size)]
                .iter()
                .enumerate()
                .skip(first)
            {
                if page < 0 || page as usize >= d.num_pages {
                    return Err(Error::invalid(
                        "block table",
                        format!(
                            "page {t} of sequence {b} (new tokens) is {page}, outside the \
                             cache's 0 .. {}",
                            d.num_pages
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Plan the append on `tensors`: validates the problem, the views (the new keys and values
    /// `[batch, seq_new, heads_kv, D]`, the caches), the tables' lengths, and that the caches
    /// overlap neither each other nor the new tokens. The tables' contents are device data: the
    /// kernel clamps them (`KvAppendParams`).
    pub fn plan<T: AttentionElem>(&self, tensors: &KvAppendTensors<'_, T>) -> Result<KvAppendPlan> {
        self.validate()?;
        let d = &self.decode;
        if T::DTYPE != d.dtype {
            return Err(Error::invalid(
                "dtype",
                format!(
                    "the problem is {:?} but the tensors are {:?}",
                    d.dtype,
                    T::DTYPE
                ),
            ));
        }
        tensors.k_new.check("new K", self.new_shape())?;
        tensors.v_new.check("new V", self.new_shape())?;
        tensors.k_cache.check("K cache", d.cache_shape())?;
        tensors.v_cache.check("V cache", d.cache_shape())?;
        for (what, cache) in [("K cache", &tensors.k_cache), ("V cache", &tensors.v_cache)] {
            cache.check_distinct(what)?;
            for (other, view) in [("new K", &tensors.k_new), ("new V", &tensors.v_new)] {
                if views_overlap(cache, view) {
                    return Err(Error::invalid(
                        what,
                        format!("overlaps {other} (the cache is written)"),
                    ));
                }
            }
        }
        if views_overlap(&tensors.k_cache, &tensors.v_cache) {
            return Err(Error::invalid("V cache", "overlaps the K cache"));
        }
        for (what, got, want) in [
            (
                "block table",
                tensors.block_table.len(),
                d.batch * d.max_pages,
            ),
            ("cache_seqlens", tensors.cache_seqlens.len(), d.batch),
        ] {
            if got != want {
                return Err(Error::shape(what, format!("{want} elements"), got));
            }
        }
        let params = KvAppendParams {
            k_new: tensors.k_new.ptr() as *const u16,
            v_new: tensors.v_new.ptr() as *const u16,
            k_cache: tensors.k_cache.ptr() as *mut u16,
            v_cache: tensors.v_cache.ptr() as *mut u16,
            block_table: tensors.block_table.addr() as *const i32,
            cache_seqlens: tensors.cache_seqlens.addr() as *const i32,
            k_new_strides: tensors.k_new.strides3(),
            v_new_strides: tensors.v_new.strides3(),
            k_strides: tensors.k_cache.strides3(),
            v_strides: tensors.v_cache.strides3(),
            batch: d.batch as u32,
            seq_new: self.seq_new as u32,
            heads_kv: d.heads_kv as u32,
            head_dim: d.head_dim as u32,
            page_size: d.page_size as u32,
            num_pages: d.num_pages as u32,
            max_pages: d.max_pages as u32,
        };
        let chunks = self.new_shape().iter().product::<usize>() / APPEND_CHUNK as usize;
        let blocks = chunks.div_ceil(APPEND_THREADS as usize) as u32;
        Ok(KvAppendPlan {
            launch: Launch::new(&KV_APPEND_KERNEL, (blocks, 1, 1), (), params),
        })
    }
}

/// The tensors of an append.
pub struct KvAppendTensors<'a, T> {
    /// New keys `[batch, seq_new, heads_kv, D]`.
    pub k_new: View<'a, T>,
    /// New values, as the new keys.
    pub v_new: View<'a, T>,
    /// The key cache `[num_pages, page_size, heads_kv, D]` (written).
    pub k_cache: View<'a, T>,
    /// The value cache, as the key cache (written).
    pub v_cache: View<'a, T>,
    /// The block table `[batch, max_pages]` i32, contiguous.
    pub block_table: DevView<'a, i32>,
    /// `[batch]` i32 context lengths before the new tokens.
    pub cache_seqlens: DevView<'a, i32>,
}

/// A planned append: one launch of `attention_kv_append`.
pub struct KvAppendPlan {
    /// The launch: grid `ceil(batch seq_new heads_kv D / (8 x 128))` blocks of 128 threads.
    pub launch: Launch<KvAppendParams>,
}

impl KvAppendPlan {
    /// Run the plan (asynchronous on a stream).
    ///
    /// # Safety
    /// The tensors the plan was made for are live memory of `exec` for the whole run, and
    /// nothing else accesses the caches' written slots meanwhile.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        // SAFETY: the plan checked every view against its memory, the tables' lengths, the
        // caches apart from the new tokens and each other; the kernel clamps the tables'
        // contents, so every write is inside the caches (the caller's contract for the rest).
        unsafe { exec.launch(&self.launch) }
    }
}

/// Append the new keys and values on `stream` and wait for it: the tables are checked on the
/// host ([`KvAppendProblem::check_tables`]) and uploaded here. The caches must not overlap each
/// other or the new tokens (checked).
#[allow(clippy::too_many_arguments)]
pub fn append_kv<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &KvAppendProblem,
    block_table: &[i32],
    cache_seqlens: &[i32],
    (k_new, v_new): (&View<T>, &View<T>),
    k_cache: &mut View<T>,
    v_cache: &mut View<T>,
) -> Result<()> {
    problem.check_tables(block_table, cache_seqlens)?;
    let (table, lens) = (upload(block_table)?, upload(cache_seqlens)?);
    let plan = problem.plan(&KvAppendTensors {
        k_new: *k_new,
        v_new: *v_new,
        k_cache: *k_cache,
        v_cache: *v_cache,
        block_table: (&table).into(),
        cache_seqlens: (&lens).into(),
    })?;
    // SAFETY: the views and the uploaded tables live for the whole call, which waits for the
    // kernel before the tables are dropped; the caches are borrowed mutably.
    unsafe { plan.run(&OnStream { gpu, stream })? };
    gpu.sync(stream, "attention kv append")
}

/// The append on the host: `k_cache`, `v_cache` (`[num_pages, page_size, heads_kv, D]`,
/// contiguous) with the new tokens (`[batch, seq_new, heads_kv, D]`, contiguous) written at
/// their positions (the tables must pass [`KvAppendProblem::check_tables`]): the reference the
/// kernel is checked against.
pub fn reference_append<T: Copy>(
    p: &KvAppendProblem,
    (k_new, v_new): (&[T], &[T]),
    (k_cache, v_cache): (&mut [T], &mut [T]),
    (block_table, cache_seqlens): (&[i32], &[i32]),
) {
    let d = &p.decode;
    let row = d.head_dim;
    for b in 0..d.batch {
        for t in 0..p.seq_new {
            let pos = cache_seqlens[b] as usize + t;
            let page = block_table[b * d.max_pages + pos / d.page_size] as usize;
            let slot = pos % d.page_size;
            for h in 0..d.heads_kv {
                let src = ((b * p.seq_new + t) * d.heads_kv + h) * row;
                let dst = ((page * d.page_size + slot) * d.heads_kv + h) * row;
                k_cache[dst..dst + row].copy_from_slice(&k_new[src..src + row]);
                v_cache[dst..dst + row].copy_from_slice(&v_new[src..src + row]);
            }
        }
    }
}
