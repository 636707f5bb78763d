//! `rustkernels._native`: the Rust side of the Python package. It takes tensors as plain
//! descriptions (address, dtype name, shape, strides, storage), validates and launches through
//! the `kernels` crate's raw API (`kernels::raw`; per family `kernels::attention::forward_raw`
//! and `backward_raw` (packed sequences: `forward_varlen_raw`, `backward_varlen_raw`; the decode
//! step over a paged KV cache: `decode_raw`, and `append_kv_raw` before it; the FP8 forward:
//! `forward_fp8_raw`), `kernels::gla::{forward_raw, backward_raw}`,
//! `kernels::semicrf::{forward_raw, backward_raw, viterbi_raw}`,
//! `kernels::mhc::{forward_pre_raw, forward_post_raw, backward_raw}`) on the caller's stream,
//! and returns nothing: the Python side allocates the
//! outputs and workspaces with torch (their sizes from the `*_workspace`/`*_layout` functions
//! here) and wires autograd and `torch.compile` (`rustkernels/attention.py`, `gla.py`,
//! `semicrf.py`, `mhc.py`).
//!
//! Not a public API: it trusts that the addresses are those of live tensors (the driver's
//! pointer attributes still catch host memory, another device, and storages longer than their
//! allocation). Errors become Python exceptions: bad input (`kernels::Error` variants for
//! shapes, arguments, alignment, unsupported options) `ValueError`, an unknown dtype
//! `TypeError`, anything from the driver `RuntimeError`. PyO3 turns a panic into a Python
//! exception too; no path here panics on input.

mod gla;
mod mhc;
mod semicrf;

use kernels::Error;
use kernels::attention::{
    AttentionDecodeOptions, AttentionOptions, BackwardOptions, Fp8Scales, Path,
    RawAttentionBackwardTensors, RawAttentionDecodeTensors, RawAttentionTensors,
    RawAttentionVarlenBackwardTensors, RawAttentionVarlenTensors, RawBackwardWorkspace,
    RawFp8Tensors, RawKvAppendTensors, append_kv_raw, backward_raw, backward_varlen_raw,
    backward_varlen_workspace_lens, backward_workspace_lens, decode_raw, decode_workspace_len,
    forward_fp8_raw, forward_raw, forward_varlen_raw, fp8_workspace_len_raw,
};
use kernels::raw::{ElemType, RawStream, RawTensor};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A tensor as the Python side describes it: `(data_ptr, dtype name, shape, strides,
/// storage data_ptr, storage nbytes)`.
pub(crate) type TensorArgs = (u64, String, Vec<usize>, Vec<i64>, u64, usize);

pub(crate) fn tensor(
    what: &str,
    (ptr, dtype, shape, strides, storage_ptr, storage_bytes): TensorArgs,
) -> PyResult<RawTensor> {
    let dtype = ElemType::from_name(&dtype).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{what}: unsupported dtype {dtype} (the kernels take bfloat16, float16, float32, \
             float64, int32 or float8_e4m3fn tensors, each op its own)"
        ))
    })?;
    Ok(RawTensor {
        ptr,
        dtype,
        shape,
        strides,
        storage_ptr,
        storage_bytes,
    })
}

/// The Python exception of a library error, with the library's message.
pub(crate) fn to_py(e: Error) -> PyErr {
    match e {
        Error::ShapeMismatch { .. }
        | Error::InvalidArgument { .. }
        | Error::Misaligned { .. }
        | Error::Unsupported { .. } => PyValueError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// A window side: -1 is unbounded, other negative values are an error.
fn window_side(what: &str, w: i64) -> PyResult<Option<usize>> {
    match w {
        -1 => Ok(None),
        w if w >= 0 => Ok(Some(w as usize)),
        w => Err(PyValueError::new_err(format!(
            "{what} = {w}: a window side is >= 0, or -1 for unbounded"
        ))),
    }
}

/// The options of a pass from the Python arguments.
fn options(
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    path: &str,
) -> PyResult<AttentionOptions> {
    Ok(AttentionOptions {
        scale: softmax_scale,
        causal,
        window: (
            window_side("window_size[0]", window_left)?,
            window_side("window_size[1]", window_right)?,
        ),
        path: match path {
            "auto" => Path::Auto,
            "mma_sync" => Path::MmaSync,
            "hopper" => Path::Hopper,
            other => {
                return Err(PyValueError::new_err(format!(
                    "path {other:?}: use \"auto\", \"mma_sync\" or \"hopper\""
                )));
            }
        },
        softcap: None,
    })
}

/// Attention forward on device `device`'s stream `stream` (an address of
/// `torch.cuda.Stream.cuda_stream`): O and LSE written from Q, K, V (see
/// `kernels::attention`). With `tile_counter` (int32 `[1]`, zero, one per call), short causal
/// problems (`seqlen_k * headdim` below `DYNAMIC_GRID_KEY_ELEMS`) take the dynamic grid.
/// Asynchronous, like any kernel launch on the stream.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k, v, o, lse, softmax_scale, causal, window_left, window_right, path = "auto", softcap = None, sinks = None, tile_counter = None))]
#[allow(clippy::too_many_arguments)]
fn attention_forward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    q: TensorArgs,
    k: TensorArgs,
    v: TensorArgs,
    o: TensorArgs,
    lse: TensorArgs,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    path: &str,
    softcap: Option<f32>,
    sinks: Option<TensorArgs>,
    tile_counter: Option<TensorArgs>,
) -> PyResult<()> {
    let options = AttentionOptions {
        softcap,
        ..options(softmax_scale, causal, window_left, window_right, path)?
    };
    let tile_counter = tile_counter
        .map(|c| tensor("tile_counter", c))
        .transpose()?;
    let (q, k, v, o, lse) = (
        tensor("q", q)?,
        tensor("k", k)?,
        tensor("v", v)?,
        tensor("out", o)?,
        tensor("softmax_lse", lse)?,
    );
    let sinks = sinks.map(|s| tensor("sinks", s)).transpose()?;
    // A kernel's first launch loads (JIT-compiles) it: no need to hold the GIL.
    py.detach(|| {
        // SAFETY: the Python side passes the handle of torch's current stream of `device`,
        // which torch keeps alive.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawAttentionTensors {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            sinks: sinks.as_ref(),
            tile_counter: tile_counter.as_ref(),
        };
        // SAFETY: the Python side passes live torch tensors it holds across this call; their
        // memory stays valid for work enqueued on `stream` afterwards (torch's caching
        // allocator reuses freed memory in the order of the stream it was allocated on, the
        // current stream here, or after `record_stream`); O, LSE and the tile counter are fresh
        // allocations, the counter zero.
        unsafe { forward_raw(&stream, &options, &tensors) }
    })
    .map_err(to_py)
}

/// The f32 elements of the attention backward's workspace, `(delta, dq_accum)`, for Q of shape
/// `q_shape` and K of shape `k_shape` of dtype `dtype` (`dq_accum` is 0 with `deterministic`).
#[pyfunction]
fn attention_backward_workspace(
    q_shape: Vec<usize>,
    k_shape: Vec<usize>,
    dtype: &str,
    deterministic: bool,
) -> PyResult<(usize, usize)> {
    let elem = ElemType::from_name(dtype)
        .ok_or_else(|| PyTypeError::new_err(format!("q: unsupported dtype {dtype}")))?;
    let lens = backward_workspace_lens(&q_shape, &k_shape, elem, BackwardOptions { deterministic })
        .map_err(to_py)?;
    Ok((lens.delta, lens.dq_accum))
}

/// Attention backward on device `device`'s stream `stream`: dQ, dK and dV written from Q, K,
/// V, the forward's O and LSE, dO and optionally dLSE, with the workspace `delta` and
/// `dq_accum` (f32, of the lengths `attention_backward_workspace` gives; `dq_accum` may be
/// `None` with `deterministic`). With `sinks` (the forward's), their gradient is written into
/// `d_sinks`. See `kernels::attention::backward_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k, v, o, lse, d_o, d_lse, dq, dk, dv, delta, dq_accum, softmax_scale, causal, window_left, window_right, deterministic, softcap = None, sinks = None, d_sinks = None))]
#[allow(clippy::too_many_arguments)]
fn attention_backward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    q: TensorArgs,
    k: TensorArgs,
    v: TensorArgs,
    o: TensorArgs,
    lse: TensorArgs,
    d_o: TensorArgs,
    d_lse: Option<TensorArgs>,
    dq: TensorArgs,
    dk: TensorArgs,
    dv: TensorArgs,
    delta: TensorArgs,
    dq_accum: Option<TensorArgs>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    deterministic: bool,
    softcap: Option<f32>,
    sinks: Option<TensorArgs>,
    d_sinks: Option<TensorArgs>,
) -> PyResult<()> {
    let options = AttentionOptions {
        softcap,
        ..options(softmax_scale, causal, window_left, window_right, "auto")?
    };
    let backward = BackwardOptions { deterministic };
    let sinks = sinks.map(|s| tensor("sinks", s)).transpose()?;
    let d_sinks = d_sinks.map(|s| tensor("dsinks", s)).transpose()?;
    let (q, k, v, o, lse, d_o) = (
        tensor("q", q)?,
        tensor("k", k)?,
        tensor("v", v)?,
        tensor("out", o)?,
        tensor("softmax_lse", lse)?,
        tensor("dout", d_o)?,
    );
    let d_lse = d_lse.map(|t| tensor("dsoftmax_lse", t)).transpose()?;
    let (dq, dk, dv) = (tensor("dq", dq)?, tensor("dk", dk)?, tensor("dv", dv)?);
    let delta = tensor("workspace", delta)?;
    let dq_accum = dq_accum.map(|t| tensor("workspace", t)).transpose()?;
    py.detach(|| {
        // SAFETY: as in `attention_forward`: the handle of torch's current stream of `device`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawAttentionBackwardTensors {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            d_o: &d_o,
            d_lse: d_lse.as_ref(),
            dq: &dq,
            dk: &dk,
            dv: &dv,
            sinks: sinks.as_ref(),
            d_sinks: d_sinks.as_ref(),
        };
        let workspace = RawBackwardWorkspace {
            delta: &delta,
            dq_accum: dq_accum.as_ref(),
        };
        // SAFETY: as in `attention_forward`: live torch tensors the Python side holds across
        // this call, whose memory stays valid for work enqueued on `stream`; dQ, dK, dV and the
        // workspace are fresh allocations on that stream.
        unsafe { backward_raw(&stream, &options, backward, &tensors, &workspace) }
    })
    .map_err(to_py)
}

/// Attention forward over packed sequences (FlashAttention's `flash_attn_varlen_func`) on
/// device `device`'s stream `stream`: O `[total_q, heads_q, D]` and LSE `[heads_q, total_q]`
/// written from Q, K, V and the boundaries `cu_seqlens_q`, `cu_seqlens_k` (int32 on the device),
/// with `max_seqlen_q`, `max_seqlen_k` the longest lengths (see
/// `kernels::attention::forward_varlen_raw`). Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap = None, sinks = None, tile_counter = None))]
#[allow(clippy::too_many_arguments)]
fn attention_varlen_forward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    q: TensorArgs,
    k: TensorArgs,
    v: TensorArgs,
    o: TensorArgs,
    lse: TensorArgs,
    cu_seqlens_q: TensorArgs,
    cu_seqlens_k: TensorArgs,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: Option<f32>,
    sinks: Option<TensorArgs>,
    tile_counter: Option<TensorArgs>,
) -> PyResult<()> {
    let options = AttentionOptions {
        softcap,
        ..options(softmax_scale, causal, window_left, window_right, "auto")?
    };
    let (q, k, v, o, lse) = (
        tensor("q", q)?,
        tensor("k", k)?,
        tensor("v", v)?,
        tensor("out", o)?,
        tensor("softmax_lse", lse)?,
    );
    let sinks = sinks.map(|s| tensor("sinks", s)).transpose()?;
    let tile_counter = tile_counter
        .map(|c| tensor("tile_counter", c))
        .transpose()?;
    let (cu_q, cu_k) = (
        tensor("cu_seqlens_q", cu_seqlens_q)?,
        tensor("cu_seqlens_k", cu_seqlens_k)?,
    );
    py.detach(|| {
        // SAFETY: as in `attention_forward`: the handle of torch's current stream of `device`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawAttentionVarlenTensors {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
            sinks: sinks.as_ref(),
            tile_counter: tile_counter.as_ref(),
        };
        // SAFETY: as in `attention_forward`: live torch tensors the Python side holds across
        // this call, whose memory stays valid for work enqueued on `stream`; O, LSE and the tile
        // counter (zeros) are fresh allocations. The boundaries' contents cannot make the
        // kernel leave the tensors.
        unsafe { forward_varlen_raw(&stream, &options, &tensors, max_seqlen_q, max_seqlen_k) }
    })
    .map_err(to_py)
}

/// The f32 elements of the packed attention backward's workspace, `(delta, dq_accum)`, for Q of
/// shape `q_shape` and K of shape `k_shape` (`[total, heads, D]`) of dtype `dtype` in `batch`
/// sequences of at most `max_seqlen_q` and `max_seqlen_k` rows (the accumulator in the Hopper
/// kernels' packed tiled layout, in deterministic mode with its order's counters after it).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn attention_varlen_backward_workspace(
    q_shape: Vec<usize>,
    k_shape: Vec<usize>,
    batch: usize,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    dtype: &str,
    deterministic: bool,
) -> PyResult<(usize, usize)> {
    let elem = ElemType::from_name(dtype)
        .ok_or_else(|| PyTypeError::new_err(format!("q: unsupported dtype {dtype}")))?;
    let lens = backward_varlen_workspace_lens(
        &q_shape,
        &k_shape,
        batch,
        max_seqlen_q,
        max_seqlen_k,
        elem,
        BackwardOptions { deterministic },
    )
    .map_err(to_py)?;
    Ok((lens.delta, lens.dq_accum))
}

/// Attention backward over packed sequences on device `device`'s stream `stream`: dQ, dK and dV
/// written from Q, K, V, the forward's O and LSE, dO and optionally dLSE, the boundaries, with
/// the workspace `delta` and `dq_accum` (f32, of the lengths
/// `attention_varlen_backward_workspace` gives; `dq_accum` may be `None` where that length is
/// 0). See `kernels::attention::backward_varlen_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k, v, o, lse, d_o, d_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, delta, dq_accum, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, deterministic, softcap = None, sinks = None, d_sinks = None))]
#[allow(clippy::too_many_arguments)]
fn attention_varlen_backward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    q: TensorArgs,
    k: TensorArgs,
    v: TensorArgs,
    o: TensorArgs,
    lse: TensorArgs,
    d_o: TensorArgs,
    d_lse: Option<TensorArgs>,
    dq: TensorArgs,
    dk: TensorArgs,
    dv: TensorArgs,
    cu_seqlens_q: TensorArgs,
    cu_seqlens_k: TensorArgs,
    delta: TensorArgs,
    dq_accum: Option<TensorArgs>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    deterministic: bool,
    softcap: Option<f32>,
    sinks: Option<TensorArgs>,
    d_sinks: Option<TensorArgs>,
) -> PyResult<()> {
    let options = AttentionOptions {
        softcap,
        ..options(softmax_scale, causal, window_left, window_right, "auto")?
    };
    let backward = BackwardOptions { deterministic };
    let sinks = sinks.map(|s| tensor("sinks", s)).transpose()?;
    let d_sinks = d_sinks.map(|s| tensor("dsinks", s)).transpose()?;
    let (q, k, v, o, lse, d_o) = (
        tensor("q", q)?,
        tensor("k", k)?,
        tensor("v", v)?,
        tensor("out", o)?,
        tensor("softmax_lse", lse)?,
        tensor("dout", d_o)?,
    );
    let d_lse = d_lse.map(|t| tensor("dsoftmax_lse", t)).transpose()?;
    let (dq, dk, dv) = (tensor("dq", dq)?, tensor("dk", dk)?, tensor("dv", dv)?);
    let (cu_q, cu_k) = (
        tensor("cu_seqlens_q", cu_seqlens_q)?,
        tensor("cu_seqlens_k", cu_seqlens_k)?,
    );
    let delta = tensor("workspace", delta)?;
    let dq_accum = dq_accum.map(|t| tensor("workspace", t)).transpose()?;
    py.detach(|| {
        // SAFETY: as in `attention_forward`: the handle of torch's current stream of `device`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawAttentionVarlenBackwardTensors {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            d_o: &d_o,
            d_lse: d_lse.as_ref(),
            dq: &dq,
            dk: &dk,
            dv: &dv,
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
            sinks: sinks.as_ref(),
            d_sinks: d_sinks.as_ref(),
        };
        let workspace = RawBackwardWorkspace {
            delta: &delta,
            dq_accum: dq_accum.as_ref(),
        };
        // SAFETY: as in `attention_backward`: live torch tensors the Python side holds across
        // this call, whose memory stays valid for work enqueued on `stream`; dQ, dK, dV and the
        // workspace are fresh allocations on that stream. The boundaries' contents cannot make
        // the kernels leave the tensors.
        unsafe {
            backward_varlen_raw(
                &stream,
                &options,
                backward,
                &tensors,
                &workspace,
                max_seqlen_q,
                max_seqlen_k,
            )
        }
    })
    .map_err(to_py)
}

/// The splits and the f32 workspace elements of a decode step over a paged KV cache,
/// `(num_splits, workspace_len)`, for Q of shape `q_shape`, caches of shape `k_cache_shape` and
/// a block table of shape `block_table_shape` of dtype `dtype`: `num_splits` as given, or with
/// 0 the library's heuristic for a GPU of `multiprocessors` SMs with `smem_per_sm` bytes of
/// shared memory each (0 if unknown) and the longest context the block table allows (see
/// `kernels::attention::decode_workspace_len`).
#[pyfunction]
fn attention_decode_workspace(
    q_shape: Vec<usize>,
    k_cache_shape: Vec<usize>,
    block_table_shape: Vec<usize>,
    dtype: &str,
    num_splits: usize,
    multiprocessors: usize,
    smem_per_sm: usize,
) -> PyResult<(usize, usize)> {
    let elem = ElemType::from_name(dtype)
        .ok_or_else(|| PyTypeError::new_err(format!("q: unsupported dtype {dtype}")))?;
    decode_workspace_len(
        &q_shape,
        &k_cache_shape,
        &block_table_shape,
        elem,
        num_splits,
        multiprocessors,
        smem_per_sm,
    )
    .map_err(to_py)
}

/// A decode step over a paged KV cache (FlashAttention's `flash_attn_with_kvcache` with a block
/// table) on device `device`'s stream `stream`: O `[batch, seqlen_q, nheads, headdim]` and LSE
/// `[batch, nheads, seqlen_q]` written from Q, the caches `[num_blocks, page_block_size,
/// nheads_k, headdim]` and the tables `block_table` `[batch, max_num_blocks_per_seq]` and
/// `cache_seqlens` `[batch]` (int32 on the device, not read on the host), with `num_splits`
/// splits and the f32 `workspace` of their length (both from `attention_decode_workspace`).
/// See `kernels::attention::decode_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k_cache, v_cache, o, lse, block_table, cache_seqlens, workspace, softmax_scale, causal, num_splits, softcap = None, sinks = None))]
#[allow(clippy::too_many_arguments)]
fn attention_decode(
    py: Python<'_>,
    device: u32,
    stream: u64,
    q: TensorArgs,
    k_cache: TensorArgs,
    v_cache: TensorArgs,
    o: TensorArgs,
    lse: TensorArgs,
    block_table: TensorArgs,
    cache_seqlens: TensorArgs,
    workspace: TensorArgs,
    softmax_scale: Option<f32>,
    causal: bool,
    num_splits: usize,
    softcap: Option<f32>,
    sinks: Option<TensorArgs>,
) -> PyResult<()> {
    let options = AttentionDecodeOptions {
        scale: softmax_scale,
        causal,
        softcap,
    };
    let sinks = sinks.map(|s| tensor("sinks", s)).transpose()?;
    let (q, k_cache, v_cache, o, lse) = (
        tensor("q", q)?,
        tensor("k_cache", k_cache)?,
        tensor("v_cache", v_cache)?,
        tensor("out", o)?,
        tensor("softmax_lse", lse)?,
    );
    let (block_table, cache_seqlens) = (
        tensor("block_table", block_table)?,
        tensor("cache_seqlens", cache_seqlens)?,
    );
    let workspace = tensor("workspace", workspace)?;
    py.detach(|| {
        // SAFETY: as in `attention_forward`: the handle of torch's current stream of `device`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawAttentionDecodeTensors {
            q: &q,
            k_cache: &k_cache,
            v_cache: &v_cache,
            o: &o,
            lse: &lse,
            block_table: &block_table,
            cache_seqlens: &cache_seqlens,
            workspace: &workspace,
            sinks: sinks.as_ref(),
        };
        // SAFETY: as in `attention_forward`: live torch tensors the Python side holds across
        // this call, whose memory stays valid for work enqueued on `stream`; O, LSE and the
        // workspace are fresh allocations on that stream. The tables' contents cannot make the
        // kernels leave the tensors (they clamp them).
        unsafe { decode_raw(&stream, &options, &tensors, num_splits) }
    })
    .map_err(to_py)
}

/// New keys and values appended to a paged KV cache (the `k`, `v` of FlashAttention's
/// `flash_attn_with_kvcache`) on device `device`'s stream `stream`: `k_new`, `v_new` `[batch,
/// seqlen_new, nheads_k, headdim]` written at positions `cache_seqlens[b] + t` of the caches
/// `[num_blocks, page_block_size, nheads_k, headdim]` through `block_table` (the tables int32
/// on the device, not read on the host; `cache_seqlens` not changed). See
/// `kernels::attention::append_kv_raw`. Asynchronous.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn attention_kv_append(
    py: Python<'_>,
    device: u32,
    stream: u64,
    k_new: TensorArgs,
    v_new: TensorArgs,
    k_cache: TensorArgs,
    v_cache: TensorArgs,
    block_table: TensorArgs,
    cache_seqlens: TensorArgs,
) -> PyResult<()> {
    let (k_new, v_new, k_cache, v_cache) = (
        tensor("k", k_new)?,
        tensor("v", v_new)?,
        tensor("k_cache", k_cache)?,
        tensor("v_cache", v_cache)?,
    );
    let (block_table, cache_seqlens) = (
        tensor("block_table", block_table)?,
        tensor("cache_seqlens", cache_seqlens)?,
    );
    py.detach(|| {
        // SAFETY: as in `attention_forward`: the handle of torch's current stream of `device`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawKvAppendTensors {
            k_new: &k_new,
            v_new: &v_new,
            k_cache: &k_cache,
            v_cache: &v_cache,
            block_table: &block_table,
            cache_seqlens: &cache_seqlens,
        };
        // SAFETY: live torch tensors the Python side holds across this call, whose memory stays
        // valid for work enqueued on `stream`; the caches are written only by this launch on
        // that stream (the custom op declares them mutated). The tables' contents cannot make
        // the kernel write outside the caches (it clamps them).
        unsafe { append_kv_raw(&stream, &tensors) }
    })
    .map_err(to_py)
}

/// The bytes of the FP8 forward's workspace (`V^T`) for Q of shape `q_shape` and K of shape
/// `k_shape`.
#[pyfunction]
fn attention_fp8_workspace(q_shape: Vec<usize>, k_shape: Vec<usize>) -> PyResult<usize> {
    fp8_workspace_len_raw(&q_shape, &k_shape).map_err(to_py)
}

/// The FP8 attention forward on device `device`'s stream `stream`: bf16 O and f32 LSE written
/// from e4m3 Q, K, V and their descales (each tensor's values times its descale are the
/// inputs), `V^T` into `workspace` (uint8 or float8_e4m3fn, of the length
/// `attention_fp8_workspace` gives). See `kernels::attention::forward_fp8_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k, v, o, lse, workspace, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right))]
#[allow(clippy::too_many_arguments)]
fn attention_fp8_forward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    q: TensorArgs,
    k: TensorArgs,
    v: TensorArgs,
    o: TensorArgs,
    lse: TensorArgs,
    workspace: TensorArgs,
    q_descale: f32,
    k_descale: f32,
    v_descale: f32,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
) -> PyResult<()> {
    let options = options(softmax_scale, causal, window_left, window_right, "hopper")?;
    let scales = Fp8Scales {
        q: q_descale,
        k: k_descale,
        v: v_descale,
    };
    let (q, k, v, o, lse, workspace) = (
        tensor("q", q)?,
        tensor("k", k)?,
        tensor("v", v)?,
        tensor("out", o)?,
        tensor("softmax_lse", lse)?,
        tensor("workspace", workspace)?,
    );
    py.detach(|| {
        // SAFETY: the Python side passes the handle of torch's current stream of `device`,
        // which torch keeps alive.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawFp8Tensors {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            workspace: &workspace,
        };
        // SAFETY: as for `attention_forward`: live torch tensors held across the call; O, LSE
        // and the workspace are fresh allocations.
        unsafe { forward_fp8_raw(&stream, &options, scales, &tensors) }
    })
    .map_err(to_py)
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "DYNAMIC_GRID_KEY_ELEMS",
        kernels::attention::DYNAMIC_GRID_KEY_ELEMS,
    )?;
    m.add_function(wrap_pyfunction!(attention_forward, m)?)?;
    m.add_function(wrap_pyfunction!(attention_backward_workspace, m)?)?;
    m.add_function(wrap_pyfunction!(attention_backward, m)?)?;
    m.add_function(wrap_pyfunction!(attention_varlen_forward, m)?)?;
    m.add_function(wrap_pyfunction!(attention_varlen_backward_workspace, m)?)?;
    m.add_function(wrap_pyfunction!(attention_varlen_backward, m)?)?;
    m.add_function(wrap_pyfunction!(attention_decode_workspace, m)?)?;
    m.add_function(wrap_pyfunction!(attention_decode, m)?)?;
    m.add_function(wrap_pyfunction!(attention_kv_append, m)?)?;
    m.add_function(wrap_pyfunction!(attention_fp8_workspace, m)?)?;
    m.add_function(wrap_pyfunction!(attention_fp8_forward, m)?)?;
    m.add_function(wrap_pyfunction!(gla::gla_forward_workspace, m)?)?;
    m.add_function(wrap_pyfunction!(gla::gla_forward, m)?)?;
    m.add_function(wrap_pyfunction!(gla::gla_backward_workspace, m)?)?;
    m.add_function(wrap_pyfunction!(gla::gla_backward, m)?)?;
    m.add_function(wrap_pyfunction!(semicrf::semicrf_state_layout, m)?)?;
    m.add_function(wrap_pyfunction!(semicrf::semicrf_forward, m)?)?;
    m.add_function(wrap_pyfunction!(semicrf::semicrf_backward, m)?)?;
    m.add_function(wrap_pyfunction!(semicrf::semicrf_viterbi, m)?)?;
    m.add_function(wrap_pyfunction!(mhc::mhc_layout, m)?)?;
    m.add_function(wrap_pyfunction!(mhc::mhc_forward_pre, m)?)?;
    m.add_function(wrap_pyfunction!(mhc::mhc_forward_post, m)?)?;
    m.add_function(wrap_pyfunction!(mhc::mhc_backward, m)?)?;
    Ok(())
}
