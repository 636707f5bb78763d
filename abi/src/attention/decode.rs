//! Decoding over a paged KV cache (FlashAttention's `flash_attn_with_kvcache` with a block
//! table): the parameters, tile shape and handles of the split-KV decode kernel and of the
//! kernel that combines its splits.

use super::{Dtype, LogitOptions, M_TILE};
use crate::{Kernel, KernelDecl, SMEM_ALIGN, WARP_SIZE};

/// Warps of a decode block: they share the block's query rows and split each step's keys
/// ([`DECODE_BLOCK_N`] / this many keys per warp).
pub const DECODE_WARPS: u32 = 4;
/// Threads of a decode block.
pub const DECODE_THREADS: u32 = DECODE_WARPS * WARP_SIZE;
/// Keys per pipeline step (one 16-key slice per warp). Page sizes are multiples of 16, so a
/// warp's slice always lies in one page.
pub const DECODE_BLOCK_N: u32 = DECODE_WARPS * 16;
/// Query rows of a block: one m16 tile, the rows `(query token, head of the group)` of one
/// key/value head in that order (row `r` is token `r / group`, head `r % group` of the group).
pub const DECODE_BLOCK_M: u32 = M_TILE;
/// Warps of a combine block, one output row each.
pub const COMBINE_WARPS: u32 = 4;
/// Threads of a combine block.
pub const COMBINE_THREADS: u32 = COMBINE_WARPS * WARP_SIZE;

/// The shared-memory layout of a decode kernel for one head dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeConfig {
    /// Head dimension D.
    pub head_dim: u32,
    /// Stages of the K/V `cp.async` ring.
    pub stages: u32,
}

/// The decode configuration of head dimension `d`: three stages up to D = 128 (two blocks per
/// SM on an H100), two above (within the 163 KiB of an sm_80 GPU).
pub const fn decode_config(d: u32) -> DecodeConfig {
    DecodeConfig {
        head_dim: d,
        stages: if d <= 128 { 3 } else { 2 },
    }
}

impl DecodeConfig {
    /// Bytes of one row of a tile in shared memory (`D` 16-bit elements and 16 bytes of
    /// padding, as the forward's tiles).
    pub const fn row_bytes(&self) -> u32 {
        self.head_dim * 2 + 16
    }

    /// Offset of the Q tile (`[DECODE_BLOCK_M, D]`).
    pub const fn q_offset(&self) -> u32 {
        0
    }

    /// Offset of stage `s`'s K tile (`[DECODE_BLOCK_N, D]`).
    pub const fn k_offset(&self, s: u32) -> u32 {
        DECODE_BLOCK_M * self.row_bytes() + 2 * s * DECODE_BLOCK_N * self.row_bytes()
    }

    /// Offset of stage `s`'s V tile.
    pub const fn v_offset(&self, s: u32) -> u32 {
        self.k_offset(s) + DECODE_BLOCK_N * self.row_bytes()
    }

    /// Floats of a row of the warps' partial outputs in the epilogue (`D` and 4 of padding, so
    /// the 8 rows a warp's quad groups write fall in different banks).
    pub const fn partial_row_floats(&self) -> u32 {
        self.head_dim + 4
    }

    /// Offset of the epilogue's partial outputs `[DECODE_WARPS, DECODE_BLOCK_M,
    /// partial_row_floats]` f32, over the K/V ring (dead by then).
    pub const fn partial_o_offset(&self) -> u32 {
        self.k_offset(0)
    }

    /// Offset of the epilogue's row maxima and sums `[2, DECODE_WARPS, DECODE_BLOCK_M]` f32.
    pub const fn partial_ml_offset(&self) -> u32 {
        self.partial_o_offset() + DECODE_WARPS * DECODE_BLOCK_M * self.partial_row_floats() * 4
    }

    /// Dynamic shared memory of the kernel.
    pub const fn smem_bytes(&self) -> usize {
        let ring = self.k_offset(self.stages);
        let epilogue = self.partial_ml_offset() + 2 * DECODE_WARPS * DECODE_BLOCK_M * 4;
        let most = if ring > epilogue { ring } else { epilogue };
        most as usize + SMEM_ALIGN
    }
}

/// Parameters of `attention_decode_{bf16,f16}_d{D}`: one decode step over a paged KV cache.
///
/// - Q `[batch, seq_q, heads_q, D]` (strides `q_strides`, head dimension contiguous): the
///   `seq_q` newest tokens of each sequence; query `i` of sequence `b` sits at position
///   `L_b - seq_q + i`, `L_b = cache_seqlens[b]`.
/// - The caches `[num_pages, page_size, heads_kv, D]` (strides `k_strides`, `v_strides` for
///   page, slot, head): key `j` of sequence `b` is slot `j % page_size` of page
///   `block_table[b * max_pages + j / page_size]`.
/// - Without masking query `i` attends keys `j < L_b`; `causal` limits it to
///   `j <= L_b - seq_q + i`. A row with no key gets `O = 0`, `LSE = -inf` (the sink, with
///   sinks: [`LogitOptions`]).
/// - Split `s` of `num_splits` attends the keys `s c .. (s + 1) c` of its sequence, `c` =
///   `ceil(ceil(L_b / DECODE_BLOCK_N) / num_splits) DECODE_BLOCK_N`. With one split the kernel
///   writes O (strides `o_strides`) and LSE `[batch, heads_q, seq_q]` f32; with more, each
///   split writes its normalized partial output `o_partial [num_splits, batch, heads_q, seq_q,
///   D]` f32 and its LSE `lse_partial [num_splits, batch, heads_q, seq_q]` (`-inf`, O = 0
///   where it has no key), which `attention_decode_combine_*` merges.
///
/// The kernel clamps every `cache_seqlens` entry into `0 ..= max_pages * page_size` and every
/// page number it reads into `0 .. num_pages`, so no table contents make it access memory
/// outside the caches (the host checks tables it holds).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionDecodeParams {
    /// Q `[batch, seq_q, heads_q, D]` (16-bit elements).
    pub q: *const u16,
    /// The key cache `[num_pages, page_size, heads_kv, D]`.
    pub k_cache: *const u16,
    /// The value cache, as the key cache.
    pub v_cache: *const u16,
    /// O `[batch, seq_q, heads_q, D]` (one split).
    pub o: *mut u16,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous (one split).
    pub lse: *mut f32,
    /// Partial outputs `[num_splits, batch, heads_q, seq_q, D]` f32 (several splits).
    pub o_partial: *mut f32,
    /// Partial LSE `[num_splits, batch, heads_q, seq_q]` f32 (several splits).
    pub lse_partial: *mut f32,
    /// The block table `[batch, max_pages]` i32, contiguous.
    pub block_table: *const i32,
    /// `[batch]` i32: the context length of each sequence.
    pub cache_seqlens: *const i32,
    /// Element strides of Q for batch, token, head.
    pub q_strides: [u64; 3],
    /// Element strides of the key cache for page, slot, head.
    pub k_strides: [u64; 3],
    /// Element strides of the value cache for page, slot, head.
    pub v_strides: [u64; 3],
    /// Element strides of O for batch, token, head.
    pub o_strides: [u64; 3],
    /// Sequences.
    pub batch: u32,
    /// Query tokens per sequence.
    pub seq_q: u32,
    /// Query heads (a multiple of `heads_kv`).
    pub heads_q: u32,
    /// Key/value heads.
    pub heads_kv: u32,
    /// Tokens per page (a multiple of 16).
    pub page_size: u32,
    /// Pages in the caches.
    pub num_pages: u32,
    /// Columns of the block table.
    pub max_pages: u32,
    /// Splits of each sequence's keys (the grid's x).
    pub num_splits: u32,
    /// Blocks of query rows per key/value head: `ceil(seq_q * group / DECODE_BLOCK_M)`.
    pub row_blocks: u32,
    /// Softmax scale times log2(e).
    pub scale_log2: f32,
    /// 1 for causal masking among the new tokens, 0 otherwise.
    pub causal: u32,
    /// Softcap and sinks (read by the `capsink` kernels only; with several splits the sinks
    /// join in the combine kernel).
    pub logits: LogitOptions,
}

/// Parameters of `attention_decode_combine_{bf16,f16}_d{D}`: the splits of
/// [`AttentionDecodeParams`] merged by their LSE into O and LSE (rows `(batch, head, token)`,
/// one warp each; `rows` = `batch * heads_q * seq_q`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionDecodeCombineParams {
    /// Partial outputs, as written by the decode kernel.
    pub o_partial: *const f32,
    /// Partial LSE, as written by the decode kernel.
    pub lse_partial: *const f32,
    /// O `[batch, seq_q, heads_q, D]`.
    pub o: *mut u16,
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous.
    pub lse: *mut f32,
    /// Element strides of O for batch, token, head.
    pub o_strides: [u64; 3],
    /// Sequences.
    pub batch: u32,
    /// Query tokens per sequence.
    pub seq_q: u32,
    /// Query heads.
    pub heads_q: u32,
    /// Splits.
    pub num_splits: u32,
    /// The sinks (read by the `capsink` combine kernels only): each joins its head's rows as
    /// one more split with no value.
    pub logits: LogitOptions,
}

/// Parameters of `attention_kv_append`: new keys and values written into a paged KV cache
/// (FlashInfer's `append_paged_kv_cache`, the `k`, `v` of FlashAttention's
/// `flash_attn_with_kvcache`), any 16-bit element type.
///
/// - `k_new`, `v_new` `[batch, seq_new, heads_kv, head_dim]` (strides `k_new_strides`,
///   `v_new_strides` for batch, token, head; head dimension contiguous): token `t` of sequence
///   `b` goes to position `L_b + t`, `L_b = cache_seqlens[b]` (not updated: the caller's next
///   step passes `L_b + seq_new`).
/// - Position `j` of sequence `b` is slot `j % page_size` of page
///   `block_table[b * max_pages + j / page_size]` of the caches (strides `k_strides`,
///   `v_strides` for page, slot, head), as for [`AttentionDecodeParams`].
/// - One thread copies [`APPEND_CHUNK`] elements (16 bytes) of one row of K and of V: rows,
///   row starts and strides are multiples of 8 elements (16-byte aligned).
///
/// The kernel clamps every `cache_seqlens` entry into `0 ..= max_pages * page_size` and skips
/// a position past that or a page number outside `0 .. num_pages`, so no table contents make
/// it write outside the caches (the host checks tables it holds).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KvAppendParams {
    /// New keys `[batch, seq_new, heads_kv, head_dim]` (16-bit elements).
    pub k_new: *const u16,
    /// New values, as the new keys.
    pub v_new: *const u16,
    /// The key cache `[num_pages, page_size, heads_kv, head_dim]` (written).
    pub k_cache: *mut u16,
    /// The value cache, as the key cache (written).
    pub v_cache: *mut u16,
    /// The block table `[batch, max_pages]` i32, contiguous.
    pub block_table: *const i32,
    /// `[batch]` i32: the context length of each sequence before the new tokens.
    pub cache_seqlens: *const i32,
    /// Element strides of the new keys for batch, token, head.
    pub k_new_strides: [u64; 3],
    /// Element strides of the new values for batch, token, head.
    pub v_new_strides: [u64; 3],
    /// Element strides of the key cache for page, slot, head.
    pub k_strides: [u64; 3],
    /// Element strides of the value cache for page, slot, head.
    pub v_strides: [u64; 3],
    /// Sequences.
    pub batch: u32,
    /// New tokens per sequence.
    pub seq_new: u32,
    /// Key/value heads.
    pub heads_kv: u32,
    /// Elements of a row (a multiple of [`APPEND_CHUNK`]).
    pub head_dim: u32,
    /// Tokens per page.
    pub page_size: u32,
    /// Pages in the caches.
    pub num_pages: u32,
    /// Columns of the block table.
    pub max_pages: u32,
}

/// Elements one thread of `attention_kv_append` copies (16 bytes of 16-bit elements).
pub const APPEND_CHUNK: u32 = 8;
/// Threads of an `attention_kv_append` block.
pub const APPEND_THREADS: u32 = 128;

/// `attention_kv_append`: launch `ceil(batch seq_new heads_kv head_dim / (APPEND_CHUNK
/// APPEND_THREADS))` blocks of [`APPEND_THREADS`].
pub const KV_APPEND_KERNEL: Kernel<KvAppendParams> =
    Kernel::new("attention_kv_append", APPEND_THREADS, 1, no_smem);

/// A decode kernel and its combine kernel for one element type and head dimension.
pub struct DecodeKernel {
    /// The split-KV decode kernel; launch it with shape [`DecodeKernel::cfg`].
    pub kernel: Kernel<AttentionDecodeParams, DecodeConfig>,
    /// The combine kernel (no dynamic shared memory).
    pub combine: Kernel<AttentionDecodeCombineParams>,
    /// Element type.
    pub dtype: Dtype,
    /// Shared-memory layout (its head dimension is the kernels').
    pub cfg: DecodeConfig,
    /// Whether the kernels apply the softcap and sinks of [`LogitOptions`].
    pub capsink: bool,
}

fn decode_smem(cfg: DecodeConfig) -> usize {
    cfg.smem_bytes()
}

fn no_smem(_: ()) -> usize {
    0
}

const fn decode(name: &'static str, combine: &'static str, dtype: Dtype, d: u32) -> DecodeKernel {
    DecodeKernel {
        kernel: Kernel::new(name, DECODE_THREADS, 1, decode_smem),
        combine: Kernel::new(combine, COMBINE_THREADS, 1, no_smem),
        dtype,
        cfg: decode_config(d),
        capsink: false,
    }
}

const fn decode_capsink(
    name: &'static str,
    combine: &'static str,
    dtype: Dtype,
    d: u32,
) -> DecodeKernel {
    DecodeKernel {
        capsink: true,
        ..decode(name, combine, dtype, d)
    }
}

/// [`DECODE_KERNELS`] from the head dimensions' tokens.
macro_rules! decode_table {
    ($($d:literal),*) => {
        [
            $(decode(
                concat!("attention_decode_bf16_d", $d),
                concat!("attention_decode_combine_bf16_d", $d),
                Dtype::Bf16,
                $d,
            ),)*
            $(decode(
                concat!("attention_decode_f16_d", $d),
                concat!("attention_decode_combine_f16_d", $d),
                Dtype::F16,
                $d,
            ),)*
            $(decode_capsink(
                concat!("attention_decode_capsink_bf16_d", $d),
                concat!("attention_decode_combine_capsink_bf16_d", $d),
                Dtype::Bf16,
                $d,
            ),)*
            $(decode_capsink(
                concat!("attention_decode_capsink_f16_d", $d),
                concat!("attention_decode_combine_capsink_f16_d", $d),
                Dtype::F16,
                $d,
            ),)*
        ]
    };
}

/// The decode kernels, for each dtype and head dimension of [`super::HEAD_DIMS`], then their
/// `capsink` kernels.
pub const DECODE_KERNELS: [DecodeKernel; 4 * super::HEAD_DIMS.len()] =
    crate::with_attention_head_dims!(decode_table!());

/// Handles in [`DECODE_KERNELS`] (two per entry) and [`KV_APPEND_KERNEL`].
pub const DECODE_KERNEL_COUNT: usize = 2 * DECODE_KERNELS.len() + 1;

/// The handles of [`DECODE_KERNELS`] and [`KV_APPEND_KERNEL`], for the family's table.
pub const fn decode_kernel_decls() -> [KernelDecl; DECODE_KERNEL_COUNT] {
    let mut out = [DECODE_KERNELS[0].kernel.info(); DECODE_KERNEL_COUNT];
    let mut i = 0;
    while i < DECODE_KERNELS.len() {
        out[2 * i] = DECODE_KERNELS[i].kernel.info();
        out[2 * i + 1] = DECODE_KERNELS[i].combine.info();
        i += 1;
    }
    out[2 * i] = KV_APPEND_KERNEL.info();
    out
}

/// The decode kernels for `dtype` and head dimension `head_dim` (the `capsink` ones if
/// `capsink`), if built.
pub fn decode_kernel(dtype: Dtype, head_dim: u32, capsink: bool) -> Option<&'static DecodeKernel> {
    const ALL: &[DecodeKernel] = &DECODE_KERNELS;
    ALL.iter()
        .find(|k| k.dtype == dtype && k.cfg.head_dim == head_dim && k.capsink == capsink)
}

const _: () = {
    // One m16 tile of rows; a 16-key slice per warp.
    assert!(DECODE_BLOCK_M == 16 && DECODE_BLOCK_N == 16 * DECODE_WARPS);
    // Every configuration fits the 163 KiB a block may have on sm_80 (the largest D's does).
    assert!(decode_config(256).smem_bytes() <= 163 * 1024);
};
