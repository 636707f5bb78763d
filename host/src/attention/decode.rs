//! Decoding over a paged KV cache: the problem, its checks of the page table on the host, the
//! split of long contexts over blocks (flash-decoding) and the f64 reference, which is the
//! specification the decode kernels are checked against.
//!
//! Layout (FlashAttention's `flash_attn_with_kvcache` with a block table):
//! - Q `[batch, seq_q, heads_q, D]`: the `seq_q` (1 to [`MAX_DECODE_QUERIES`]) newest tokens of
//!   each sequence;
//! - the caches K, V `[num_pages, page_size, heads_kv, D]`;
//! - the block table `[batch, max_pages]` (i32): page `t` of sequence `b` is
//!   `block_table[b][t]`; entries past a sequence's context are not read (any value);
//! - `cache_seqlens [batch]` (i32): the context length `L_b` of each sequence, its keys `0 ..
//!   L_b` at slot `j % page_size` of page `block_table[b][j / page_size]`.
//!
//! Query `i` of sequence `b` is the token at position `L_b - seq_q + i` (bottom-right aligned, as
//! the forward's masks): without masking it attends every key `j < L_b`; causal, the keys `j <=
//! L_b - seq_q + i`. A row with no key (a context of 0, or causal rows before the context)
//! gets `O = 0` and `LSE = -inf`. Pages may come in any order and may be shared between
//! sequences (a common prefix).
//!
//! The family's three steps: an [`AttentionDecodeProblem`] (sizes and options) is planned on its
//! tensors ([`AttentionDecodeTensors`]) and a number of splits ([`AttentionDecodeProblem::
//! num_splits`], the heuristic) into an [`AttentionDecodePlan`] (pure), which runs on any
//! executor. [`decode`] does it on `cust` buffers with tables checked on the host and uploaded
//! once ([`DecodeTables`]). Kernels: `attention_decode_*` (the `mma.sync` kernel documented in
//! the kernel crate: a block per sequence, key/value head, 16 query rows and split) and, with
//! several splits, `attention_decode_combine_*`; every GPU of compute capability >= 8.0.

use super::plan::check_sinks;
use super::reference::{AttentionOutput, reference_f64_sinks};
use super::{AttentionElem, AttentionProblem, HEAD_DIMS, View};
use crate::attention::Dtype;
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec, OnStream};
use crate::gpu::{Gpu, LaunchConfig};
use crate::launch::Launch;
use crate::memory::upload;
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use kernel_abi::KernelDecl;
use kernel_abi::attention::decode::{
    AttentionDecodeCombineParams, AttentionDecodeParams, COMBINE_WARPS, DECODE_BLOCK_M,
    DECODE_BLOCK_N, DecodeKernel, decode_kernel,
};

/// The most query tokens per sequence of a decode step (speculative decoding drafts).
pub const MAX_DECODE_QUERIES: usize = 16;
/// The smallest and largest page sizes (tokens), multiples of [`PAGE_SIZE_STEP`].
pub const PAGE_SIZES: (usize, usize) = (16, 256);
/// Page sizes are multiples of this many tokens.
pub const PAGE_SIZE_STEP: usize = 16;
/// The most blocks one sequence's context is split over.
pub const MAX_SPLITS: usize = 128;

/// One decode step over a paged KV cache (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionDecodeProblem {
    /// Sequences.
    pub batch: usize,
    /// New query tokens per sequence (1 to [`MAX_DECODE_QUERIES`]).
    pub seq_q: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (divides `heads_q`).
    pub heads_kv: usize,
    /// Head dimension (one of [`HEAD_DIMS`]).
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Pages in the caches.
    pub num_pages: usize,
    /// Columns of the block table (the most pages a sequence may use).
    pub max_pages: usize,
    /// Element type of Q, the caches and O.
    pub dtype: Dtype,
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Causal masking among the new tokens (bottom-right aligned).
    pub causal: bool,
    /// Softcap, as [`AttentionProblem::softcap`].
    pub softcap: Option<f32>,
    /// Attention sinks, as [`AttentionProblem::sinks`] (`[heads_q]` f32 with the tensors).
    pub sinks: bool,
}

impl AttentionDecodeProblem {
    /// A problem without masking, bf16, the default scale (the sizes in the fields' order).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        seq_q: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        page_size: usize,
        num_pages: usize,
        max_pages: usize,
    ) -> AttentionDecodeProblem {
        AttentionDecodeProblem {
            batch,
            seq_q,
            heads_q,
            heads_kv,
            head_dim,
            page_size,
            num_pages,
            max_pages,
            dtype: Dtype::Bf16,
            scale: None,
            causal: false,
            softcap: None,
            sinks: false,
        }
    }

    /// Check the sizes and options (everything but the tables' contents).
    pub fn validate(&self) -> Result<()> {
        let dims = [
            ("batch", self.batch),
            ("seq_q", self.seq_q),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("num_pages", self.num_pages),
            ("max_pages", self.max_pages),
        ];
        for (what, v) in dims {
            if v == 0 {
                return Err(Error::invalid(what, "must be at least 1"));
            }
        }
        if self.seq_q > MAX_DECODE_QUERIES {
            return Err(Error::unsupported(
                format!("seq_q {}", self.seq_q),
                format!("a decode step takes 1 to {MAX_DECODE_QUERIES} query tokens per sequence"),
            ));
        }
        if !HEAD_DIMS.contains(&(self.head_dim as u32)) {
            return Err(Error::unsupported(
                format!("head dimension {}", self.head_dim),
                format!("supported: {HEAD_DIMS:?}"),
            ));
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(Error::invalid(
                "heads",
                format!(
                    "heads_q {} is not a multiple of heads_kv {}",
                    self.heads_q, self.heads_kv
                ),
            ));
        }
        let (lo, hi) = PAGE_SIZES;
        if self.page_size < lo
            || self.page_size > hi
            || !self.page_size.is_multiple_of(PAGE_SIZE_STEP)
        {
            return Err(Error::unsupported(
                format!("page size {}", self.page_size),
                format!("pages hold {lo} to {hi} tokens, a multiple of {PAGE_SIZE_STEP}"),
            ));
        }
        if let Some(s) = self.scale
            && !(s.is_finite() && s > 0.0)
        {
            return Err(Error::invalid(
                "scale",
                format!("{s} is not finite and positive"),
            ));
        }
        if let Some(c) = self.softcap
            && !(c.is_finite() && c > 0.0)
        {
            return Err(Error::invalid(
                "softcap",
                format!("{c} is not a positive finite number"),
            ));
        }
        // Element counts the kernels index with 32-bit row numbers.
        let cache_rows = self.num_pages.checked_mul(self.page_size);
        if cache_rows.is_none_or(|r| r.checked_mul(self.heads_kv).is_none_or(|x| x >= 1 << 31)) {
            return Err(Error::invalid(
                "cache",
                "num_pages x page_size x heads_kv must stay below 2^31",
            ));
        }
        if self
            .batch
            .checked_mul(self.max_pages)
            .is_none_or(|x| x >= 1 << 31)
        {
            return Err(Error::invalid(
                "block table",
                "batch x max_pages must stay below 2^31",
            ));
        }
        Ok(())
    }

    /// The softmax scale.
    pub fn softmax_scale(&self) -> f32 {
        self.scale
            .unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// Decode blocks a GPU of `multiprocessors` SMs with `smem_per_sm` bytes of shared memory
    /// each holds at once (its shared memory bounds the blocks per SM; at least one).
    pub fn resident_blocks(&self, multiprocessors: usize, smem_per_sm: usize) -> usize {
        let smem = decode_kernel(self.dtype, self.head_dim as u32, false)
            .map_or(usize::MAX, |k| k.cfg.smem_bytes())
            // The driver reserves 1 KiB of every block's shared memory.
            + 1024;
        multiprocessors * (smem_per_sm / smem).max(1)
    }

    /// [`num_splits`](Self::num_splits) on the GPU described by `info`.
    pub fn num_splits_on(&self, context: usize, info: &crate::gpu::DeviceInfo) -> usize {
        let slots = self.resident_blocks(
            info.multiprocessors as usize,
            info.shared_memory_per_multiprocessor,
        );
        self.num_splits(context, slots)
    }

    /// The most keys a sequence may have (`max_pages x page_size`).
    pub fn max_context(&self) -> usize {
        self.max_pages * self.page_size
    }

    /// Check the tables on the host: `cache_seqlens` has `batch` entries in `0 ..=`
    /// [`max_context`](Self::max_context); the block table has `batch x max_pages` entries and
    /// every page a sequence's context uses is in `0 .. num_pages` (the entries past it are
    /// not read). Returns the longest context.
    pub fn check_tables(&self, block_table: &[i32], cache_seqlens: &[i32]) -> Result<usize> {
        self.validate()?;
        if cache_seqlens.len() != self.batch {
            return Err(Error::invalid(
                "cache_seqlens",
                format!(
                    "{} entries for a batch of {}",
                    cache_seqlens.len(),
                    self.batch
                ),
            ));
        }
        if block_table.len() != self.batch * self.max_pages {
            return Err(Error::invalid(
                "block table",
                format!(
                    "{} entries, expected batch x max_pages = {} x {}",
                    block_table.len(),
                    self.batch,
                    self.max_pages
                ),
            ));
        }
        let mut longest = 0;
        for (b, &len) in cache_seqlens.iter().enumerate() {
            if len < 0 || len as usize > self.max_context() {
                return Err(Error::invalid(
                    "cache_seqlens",
                    format!(
                        "sequence {b} has {len} keys, outside 0 ..= max_pages x page_size = {}",
                        self.max_context()
                    ),
                ));
            }
            let pages = (len as usize).div_ceil(self.page_size);
            let row = &block_table[b * self.max_pages..][..self.max_pages];
            for (t, &page) in row[..pages].iter().enumerate() {
                if page < 0 || page as usize >= self.num_pages {
                    return Err(Error::invalid(
                        "block table",
                        format!(
                            "page {t} of sequence {b} is {page}, outside the cache's 0 .. {}",
                            self.num_pages
                        ),
                    ));
                }
            }
            longest = longest.max(len as usize);
        }
        Ok(longest)
    }

    /// Blocks each (sequence, key/value head) is split over for a longest context of
    /// `context` keys on a GPU that holds `slots` decode blocks at once
    /// ([`resident_blocks`](Self::resident_blocks)): 1 when the blocks of one split already
    /// fill most of the slots; else the fewest splits whose last wave is at least 85% as full
    /// as the best count's (FlashAttention's heuristic), at most [`MAX_SPLITS`] and at most one
    /// per 64-key step of the longest context.
    pub fn num_splits(&self, context: usize, slots: usize) -> usize {
        let group = self.heads_q / self.heads_kv.max(1);
        let row_blocks = (self.seq_q * group).div_ceil(DECODE_BLOCK_M as usize);
        let pairs = self.batch * self.heads_kv * row_blocks;
        let steps = context.div_ceil(DECODE_BLOCK_N as usize).max(1);
        let sms = slots.max(1);
        if pairs * 5 >= sms * 4 {
            return 1;
        }
        let most = MAX_SPLITS.min(sms).min(steps);
        let efficiency = |s: usize| {
            let waves = (pairs * s) as f64 / sms as f64;
            waves / waves.ceil()
        };
        let best = (1..=most).map(efficiency).fold(0.0, f64::max);
        (1..=most)
            .find(|&s| efficiency(s) >= 0.85 * best)
            .unwrap_or(1)
    }

    /// The dense problem of one sequence with a context of `context` keys (its keys gathered
    /// from the pages): what the reference computes for it.
    pub fn sequence(&self, context: usize) -> AttentionProblem {
        let mut p = AttentionProblem::new(
            1,
            self.seq_q,
            context,
            self.heads_q,
            self.heads_kv,
            self.head_dim,
            self.dtype,
        );
        p.scale = self.scale;
        p.causal = self.causal;
        p.softcap = self.softcap;
        p.sinks = self.sinks;
        p
    }
}

/// The tensors of a decode step.
pub struct AttentionDecodeTensors<'a, T> {
    /// Q `[batch, seq_q, heads_q, D]`.
    pub q: View<'a, T>,
    /// The key cache `[num_pages, page_size, heads_kv, D]`.
    pub k_cache: View<'a, T>,
    /// The value cache, as the key cache.
    pub v_cache: View<'a, T>,
    /// O `[batch, seq_q, heads_q, D]` (written; must not overlap the inputs).
    pub o: View<'a, T>,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous (written).
    pub lse: DevView<'a, f32>,
    /// The block table `[batch, max_pages]` i32, contiguous.
    pub block_table: DevView<'a, i32>,
    /// `[batch]` i32 context lengths.
    pub cache_seqlens: DevView<'a, i32>,
    /// f32 scratch of at least [`AttentionDecodeProblem::workspace_len`] elements for the
    /// splits' partial results (may be empty with one split).
    pub workspace: DevView<'a, f32>,
    /// The sink logits `[heads_q]` f32, when the problem has sinks.
    pub sinks: Option<DevView<'a, f32>>,
}

impl<T> Clone for AttentionDecodeTensors<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for AttentionDecodeTensors<'_, T> {}

/// A planned decode step: the decode kernel's launch and, with several splits, the combine
/// kernel's.
pub struct AttentionDecodePlan {
    /// The kernels.
    pub kernel: &'static DecodeKernel,
    /// Splits of each sequence's keys.
    pub num_splits: usize,
    /// The decode launch: grid `(num_splits, heads_kv * row_blocks, batch)`.
    pub decode: Launch<AttentionDecodeParams>,
    /// The combine launch (several splits): grid `ceil(batch heads_q seq_q / COMBINE_WARPS)`.
    pub combine: Option<Launch<AttentionDecodeCombineParams>>,
}

impl AttentionDecodeProblem {
    /// The element shape of Q and O: `[batch, seq_q, heads_q, D]`.
    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_q, self.heads_q, self.head_dim]
    }

    /// The element shape of each cache: `[num_pages, page_size, heads_kv, D]`.
    pub fn cache_shape(&self) -> [usize; 4] {
        [self.num_pages, self.page_size, self.heads_kv, self.head_dim]
    }

    /// Elements of LSE (`batch heads_q seq_q`).
    pub fn lse_len(&self) -> usize {
        self.batch * self.heads_q * self.seq_q
    }

    /// f32 elements of the scratch `num_splits` splits need: their partial outputs
    /// `[num_splits, batch, heads_q, seq_q, D]` and LSE `[num_splits, batch, heads_q, seq_q]`
    /// (none with one split).
    pub fn workspace_len(&self, num_splits: usize) -> usize {
        if num_splits <= 1 {
            0
        } else {
            num_splits * self.lse_len() * (self.head_dim + 1)
        }
    }

    /// Bytes one decode step reads at least: the K and V of every sequence's context
    /// (`contexts`; 16-bit elements), for the bandwidth the benchmark reports.
    pub fn kv_bytes(&self, contexts: &[i32]) -> f64 {
        let keys: f64 = contexts.iter().map(|&l| l.max(0) as f64).sum();
        2.0 * keys * (self.heads_kv * self.head_dim * 2) as f64
    }

    /// Plan the decode step on `tensors` with `num_splits` splits of each sequence's keys (1 to
    /// [`MAX_SPLITS`]; [`num_splits`](Self::num_splits) chooses one): validates the problem,
    /// the views (shapes, contiguous head dimension, 16-byte aligned starts and strides, in
    /// bounds), the tables' and LSE's lengths and the workspace. The tables' contents are
    /// device data: the kernel clamps them ([`DecodeTables`] checks them on the host).
    pub fn plan<T: AttentionElem>(
        &self,
        tensors: &AttentionDecodeTensors<'_, T>,
        num_splits: usize,
    ) -> Result<AttentionDecodePlan> {
        self.validate()?;
        if T::DTYPE != self.dtype {
            return Err(Error::invalid(
                "dtype",
                format!(
                    "the problem is {:?} but the tensors are {:?}",
                    self.dtype,
                    T::DTYPE
                ),
            ));
        }
        if num_splits == 0 || num_splits > MAX_SPLITS {
            return Err(Error::invalid(
                "num_splits",
                format!("{num_splits} is outside 1 ..= {MAX_SPLITS}"),
            ));
        }
        tensors.q.check("Q", self.q_shape())?;
        tensors.k_cache.check("K cache", self.cache_shape())?;
        tensors.v_cache.check("V cache", self.cache_shape())?;
        tensors.o.check("O", self.q_shape())?;
        tensors.o.check_distinct("O")?;
        let lens = [
            ("LSE", tensors.lse.len(), self.lse_len()),
            (
                "block table",
                tensors.block_table.len(),
                self.batch * self.max_pages,
            ),
            ("cache_seqlens", tensors.cache_seqlens.len(), self.batch),
        ];
        for (what, got, want) in lens {
            if got != want {
                return Err(Error::shape(what, format!("{want} elements"), got));
            }
        }
        let ws_len = self.workspace_len(num_splits);
        if tensors.workspace.len() < ws_len {
            return Err(Error::shape(
                "decode workspace",
                format!("at least {ws_len} f32 elements for {num_splits} splits"),
                tensors.workspace.len(),
            ));
        }
        if !tensors.workspace.addr().is_multiple_of(16) {
            return Err(Error::Misaligned {
                what: "decode workspace".into(),
                required: 16,
                actual: tensors.workspace.addr() % 16,
            });
        }
        let group = self.heads_q / self.heads_kv;
        let row_blocks = (self.seq_q * group).div_ceil(DECODE_BLOCK_M as usize);
        let grid_y = self.heads_kv * row_blocks;
        if grid_y > 65535 || self.batch > 65535 {
            return Err(Error::unsupported(
                format!("batch {} with {grid_y} row blocks", self.batch),
                "the decode grid takes at most 65535 sequences and 65535 key/value heads x \
                 row blocks",
            ));
        }
        check_sinks(self.sinks, self.heads_q, tensors.sinks.as_ref())?;
        let dense = self.sequence(1);
        let kernel = decode_kernel(self.dtype, self.head_dim as u32, dense.has_logit_options())
            .expect("validated");
        let (scale_log2, logits) = dense.logit_params(tensors.sinks.as_ref());
        let o_partial = tensors.workspace.addr();
        let lse_partial = o_partial + 4 * (num_splits * self.lse_len() * self.head_dim) as u64;
        let params = AttentionDecodeParams {
            q: tensors.q.ptr() as *const u16,
            k_cache: tensors.k_cache.ptr() as *const u16,
            v_cache: tensors.v_cache.ptr() as *const u16,
            o: tensors.o.ptr() as *mut u16,
            lse: tensors.lse.addr() as *mut f32,
            o_partial: if num_splits > 1 { o_partial } else { 0 } as *mut f32,
            lse_partial: if num_splits > 1 { lse_partial } else { 0 } as *mut f32,
            block_table: tensors.block_table.addr() as *const i32,
            cache_seqlens: tensors.cache_seqlens.addr() as *const i32,
            q_strides: tensors.q.strides3(),
            k_strides: tensors.k_cache.strides3(),
            v_strides: tensors.v_cache.strides3(),
            o_strides: tensors.o.strides3(),
            batch: self.batch as u32,
            seq_q: self.seq_q as u32,
            heads_q: self.heads_q as u32,
            heads_kv: self.heads_kv as u32,
            page_size: self.page_size as u32,
            num_pages: self.num_pages as u32,
            max_pages: self.max_pages as u32,
            num_splits: num_splits as u32,
            row_blocks: row_blocks as u32,
            scale_log2,
            causal: u32::from(self.causal),
            logits,
        };
        let decode = Launch::new(
            &kernel.kernel,
            (num_splits as u32, grid_y as u32, self.batch as u32),
            kernel.cfg,
            params,
        );
        let combine = (num_splits > 1).then(|| {
            let rows = self.lse_len() as u32;
            Launch::new(
                &kernel.combine,
                (rows.div_ceil(COMBINE_WARPS), 1, 1),
                (),
                AttentionDecodeCombineParams {
                    o_partial: o_partial as *const f32,
                    lse_partial: lse_partial as *const f32,
                    o: params.o,
                    lse: params.lse,
                    o_strides: params.o_strides,
                    batch: params.batch,
                    seq_q: params.seq_q,
                    heads_q: params.heads_q,
                    num_splits: params.num_splits,
                    logits,
                },
            )
        });
        Ok(AttentionDecodePlan {
            kernel,
            num_splits,
            decode,
            combine,
        })
    }
}

impl AttentionDecodePlan {
    /// What the decode kernel's handle declares.
    pub fn kernel(&self) -> KernelDecl {
        self.kernel.kernel.info()
    }

    /// Grid, block and shared memory of the decode launch.
    pub fn config(&self) -> LaunchConfig {
        *self.decode.config()
    }

    /// Run the plan (asynchronous on a stream: synchronize before reading O and LSE, or
    /// releasing the workspace).
    ///
    /// # Safety
    /// The tensors the plan was made for are live memory of `exec` for the whole run; O, LSE
    /// and the workspace overlap neither each other nor the inputs.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        // SAFETY: the plan checked every view against its memory (shapes, strides, alignment,
        // bounds), the lengths of LSE and the tables, the workspace's size for the splits and
        // its alignment, and validated the sizes; the kernel clamps the tables' contents into
        // the cache and the block table; the grids are the ones the kernels document; on one
        // executor the combine runs after the decode kernel wrote every split; the memory is
        // live and the outputs alias nothing (the caller's contract).
        unsafe {
            exec.launch(&self.decode)?;
            if let Some(c) = &self.combine {
                exec.launch(c)?;
            }
        }
        Ok(())
    }
}

/// A decode step's tables checked on the host ([`AttentionDecodeProblem::check_tables`]) and
/// uploaded, with their longest context (for the split heuristic).
pub struct DecodeTables {
    block_table: DeviceBuffer<i32>,
    cache_seqlens: DeviceBuffer<i32>,
    longest: usize,
    problem: AttentionDecodeProblem,
}

impl DecodeTables {
    /// Check the tables for `problem` and upload them.
    pub fn new(
        problem: &AttentionDecodeProblem,
        block_table: &[i32],
        cache_seqlens: &[i32],
    ) -> Result<DecodeTables> {
        let longest = problem.check_tables(block_table, cache_seqlens)?;
        Ok(DecodeTables {
            block_table: upload(block_table)?,
            cache_seqlens: upload(cache_seqlens)?,
            longest,
            problem: problem.clone(),
        })
    }

    /// The longest context of the batch.
    pub fn longest(&self) -> usize {
        self.longest
    }
}

/// One decode step on `stream`: O (`[batch, seq_q, heads_q, D]`) into `o` and LSE `[batch,
/// heads_q, seq_q]` into `lse`, the splits chosen by [`AttentionDecodeProblem::num_splits_on`] for
/// this GPU and the tables' longest context; their workspace is allocated here, and the call
/// returns once the kernels finished (so that it can be freed). `tables` must have been made
/// for `problem`.
#[allow(clippy::too_many_arguments)]
pub fn decode<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionDecodeProblem,
    tables: &DecodeTables,
    q: &View<T>,
    k_cache: &View<T>,
    v_cache: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
) -> Result<()> {
    decode_with_sinks(
        gpu,
        stream,
        problem,
        tables,
        (q, k_cache, v_cache),
        o,
        lse,
        None,
    )
}

/// [`decode`] of a problem with attention sinks ([`AttentionDecodeProblem::sinks`]): their
/// logits `[heads_q]` f32 in `sinks` (`None` for a problem without).
#[allow(clippy::too_many_arguments)]
pub fn decode_with_sinks<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionDecodeProblem,
    tables: &DecodeTables,
    (q, k_cache, v_cache): (&View<T>, &View<T>, &View<T>),
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
    sinks: Option<&DeviceBuffer<f32>>,
) -> Result<()> {
    if tables.problem != *problem {
        return Err(Error::invalid(
            "decode tables",
            "made for another problem (check them with this one: DecodeTables::new)",
        ));
    }
    let splits = problem.num_splits_on(tables.longest, gpu.info());
    let workspace = crate::memory::poisoned::<f32>(problem.workspace_len(splits).max(1))?;
    let tensors = AttentionDecodeTensors {
        q: *q,
        k_cache: *k_cache,
        v_cache: *v_cache,
        o: *o,
        lse: (&*lse).into(),
        block_table: (&tables.block_table).into(),
        cache_seqlens: (&tables.cache_seqlens).into(),
        workspace: (&workspace).into(),
        sinks: sinks.map(Into::into),
    };
    let plan = problem.plan(&tensors, splits)?;
    // SAFETY: the views, tables, `lse` and the workspace are borrowed for the whole call, which
    // waits for the kernels before the workspace is dropped; `o` and `lse` are borrowed
    // mutably (the caller keeps O apart from the inputs, as documented).
    unsafe { plan.run(&OnStream { gpu, stream })? };
    gpu.sync(stream, "attention decode")
}

/// The f64 reference of a decode step: O `[batch, seq_q, heads_q, D]` and LSE `[batch,
/// heads_q, seq_q]`, each sequence's keys gathered from its pages and attended as the dense
/// forward's reference does (the tables must pass [`AttentionDecodeProblem::check_tables`]).
pub fn reference_decode<T: AttentionElem>(
    p: &AttentionDecodeProblem,
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    block_table: &[i32],
    cache_seqlens: &[i32],
) -> AttentionOutput {
    reference_decode_sinks(p, q, (k_cache, v_cache), (block_table, cache_seqlens), None)
}

/// [`reference_decode`] with the sink logits `sinks` (`Some` exactly when the problem has
/// sinks).
pub fn reference_decode_sinks<T: AttentionElem>(
    p: &AttentionDecodeProblem,
    q: &[T],
    (k_cache, v_cache): (&[T], &[T]),
    (block_table, cache_seqlens): (&[i32], &[i32]),
    sinks: Option<&[f32]>,
) -> AttentionOutput {
    let sinks: Option<Vec<f64>> = sinks.map(|s| s.iter().map(|&x| x as f64).collect());
    let (d, hq, hkv, sq) = (p.head_dim, p.heads_q, p.heads_kv, p.seq_q);
    let wide = |x: &[T]| x.iter().map(|e| e.to_f32() as f64).collect::<Vec<f64>>();
    let mut o = Vec::with_capacity(p.batch * sq * hq * d);
    let mut lse = Vec::with_capacity(p.batch * hq * sq);
    for (b, &len) in cache_seqlens.iter().enumerate() {
        let len = len as usize;
        // Sequence b's keys and values, contiguous `[len, heads_kv, D]`.
        let (mut k, mut v) = (
            Vec::with_capacity(len * hkv * d),
            Vec::with_capacity(len * hkv * d),
        );
        for j in 0..len {
            let page = block_table[b * p.max_pages + j / p.page_size] as usize;
            let at = (page * p.page_size + j % p.page_size) * hkv * d;
            k.extend(k_cache[at..at + hkv * d].iter().map(|e| e.to_f32() as f64));
            v.extend(v_cache[at..at + hkv * d].iter().map(|e| e.to_f32() as f64));
        }
        let qb = wide(&q[b * sq * hq * d..(b + 1) * sq * hq * d]);
        let out = reference_f64_sinks(&p.sequence(len), &qb, &k, &v, sinks.as_deref());
        o.extend(out.o);
        lse.extend(out.lse);
    }
    AttentionOutput { o, lse }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::reference::reference;
    use half::bf16;

    fn random(n: usize, seed: u64) -> Vec<bf16> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                bf16::from_f64((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
            })
            .collect()
    }

    fn problem() -> AttentionDecodeProblem {
        // 2 sequences, 3 query tokens, GQA 4:2, D 64, pages of 16, 9 pages, 4 per sequence.
        AttentionDecodeProblem::new(2, 3, 4, 2, 64, 16, 9, 4)
    }

    #[test]
    fn bad_problems_are_typed_errors() {
        let ok = problem();
        ok.validate().unwrap();
        type Edit = dyn Fn(&mut AttentionDecodeProblem);
        let cases: [(&Edit, &str); 8] = [
            (&|p| p.seq_q = 0, "seq_q"),
            (&|p| p.seq_q = 17, "seq_q 17"),
            (&|p| p.page_size = 8, "page size 8"),
            (&|p| p.page_size = 24, "page size 24"),
            (&|p| p.page_size = 512, "page size 512"),
            (&|p| p.heads_q = 3, "heads_q 3"),
            (&|p| p.head_dim = 72, "head dimension 72"),
            (&|p| p.scale = Some(f32::NAN), "scale"),
        ];
        for (edit, want) in cases {
            let mut p = ok.clone();
            edit(&mut p);
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(want), "want {want:?}, got: {e}");
        }
    }

    #[test]
    fn bad_tables_are_typed_errors() {
        let p = problem();
        let table = [0, 1, 2, -1, 5, 3, 8, 7];
        assert_eq!(p.check_tables(&table, &[40, 64]).unwrap(), 64);
        // Entries past a context are not read: -1 there is fine.
        assert_eq!(p.check_tables(&table, &[48, 0]).unwrap(), 48);
        let cases: [(&[i32], &[i32], &str); 5] = [
            (&table, &[40], "cache_seqlens"),
            (&table[..7], &[40, 64], "block table"),
            (&table, &[-1, 64], "sequence 0 has -1 keys"),
            (&table, &[65, 64], "sequence 0 has 65 keys"),
            (&table, &[49, 64], "page 3 of sequence 0 is -1"),
        ];
        for (t, lens, want) in cases {
            let e = p.check_tables(t, lens).unwrap_err().to_string();
            assert!(e.contains(want), "want {want:?}, got: {e}");
        }
        let mut small = p.clone();
        small.num_pages = 8;
        let e = small
            .check_tables(&table, &[16, 64])
            .unwrap_err()
            .to_string();
        assert!(e.contains("page 2 of sequence 1 is 8"), "{e}");
    }

    /// The paged reference equals the dense reference on the same keys, whatever the pages'
    /// order, with pages shared between sequences and contexts not a multiple of the page.
    #[test]
    fn reference_is_the_dense_reference_on_gathered_keys() {
        for causal in [false, true] {
            let mut p = problem();
            p.causal = causal;
            let (d, hkv, hq, sq) = (p.head_dim, p.heads_kv, p.heads_q, p.seq_q);
            let cache_len = p.num_pages * p.page_size * hkv * d;
            let (kc, vc) = (random(cache_len, 1), random(cache_len, 2));
            let q = random(p.batch * sq * hq * d, 3);
            // Sequence 0: pages 4, 0, 7 (40 keys); sequence 1: pages 4, 0 shared, then 2, 6
            // (61 keys).
            let table = [4, 0, 7, -1, 4, 0, 2, 6];
            let lens = [40, 61];
            p.check_tables(&table, &lens).unwrap();
            let got = reference_decode(&p, &q, &kc, &vc, &table, &lens);
            for (b, &len) in lens.iter().enumerate() {
                let len = len as usize;
                let gather = |c: &[bf16]| -> Vec<bf16> {
                    (0..len)
                        .flat_map(|j| {
                            let page = table[b * p.max_pages + j / p.page_size] as usize;
                            let at = (page * p.page_size + j % p.page_size) * hkv * d;
                            c[at..at + hkv * d].to_vec()
                        })
                        .collect()
                };
                let dense = p.sequence(len);
                let want = reference(
                    &dense,
                    &q[b * sq * hq * d..(b + 1) * sq * hq * d],
                    &gather(&kc),
                    &gather(&vc),
                );
                assert_eq!(&got.o[b * sq * hq * d..(b + 1) * sq * hq * d], &want.o[..]);
                assert_eq!(&got.lse[b * hq * sq..(b + 1) * hq * sq], &want.lse[..]);
            }
        }
    }

    #[test]
    fn empty_contexts_and_causal_rows_before_the_context_have_no_key() {
        let mut p = problem();
        p.causal = true;
        let (d, hkv, hq, sq) = (p.head_dim, p.heads_kv, p.heads_q, p.seq_q);
        let cache_len = p.num_pages * p.page_size * hkv * d;
        let (kc, vc) = (random(cache_len, 4), random(cache_len, 5));
        let q = random(p.batch * sq * hq * d, 6);
        // Sequence 0: no keys; sequence 1: one key, so its first two causal rows see none.
        let table = [0, 0, 0, 0, 1, 0, 0, 0];
        let out = reference_decode(&p, &q, &kc, &vc, &table, &[0, 1]);
        for h in 0..hq {
            for i in 0..sq {
                let (l0, l1) = (out.lse[h * sq + i], out.lse[(hq + h) * sq + i]);
                assert_eq!(l0, f64::NEG_INFINITY);
                assert_eq!(l1 == f64::NEG_INFINITY, i < 2, "row {i} of head {h}: {l1}");
            }
        }
        assert!(out.o[..sq * hq * d].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn splits_fill_the_gpu_without_empty_blocks() {
        let sms = 132;
        // Enough (sequence, head) pairs: no split.
        let many = AttentionDecodeProblem::new(64, 1, 32, 8, 128, 64, 4096, 1024);
        assert_eq!(many.num_splits(65536, sms), 1);
        // One sequence with 8 heads and a long context: the context spread over the GPU.
        let one = AttentionDecodeProblem::new(1, 1, 32, 8, 128, 64, 4096, 1024);
        let s = one.num_splits(65536, sms);
        assert!(s > 1 && 8 * s <= 2 * sms, "{s} splits");
        // Never more splits than pages of the longest context, never more than MAX_SPLITS.
        assert_eq!(one.num_splits(100, sms), 2);
        assert_eq!(one.num_splits(0, sms), 1);
        let wide = AttentionDecodeProblem::new(1, 1, 1, 1, 128, 16, 1 << 16, 1 << 14);
        assert!(wide.num_splits(1 << 18, 1000) <= MAX_SPLITS);
    }
}
