"""The decode step over a paged KV cache with flash-attn's interface:
``flash_attn_with_kvcache`` (flash-attn's signature, the paged layout with a ``block_table``
only) over the custom op ``torch.ops.rustkernels.flash_attn_decode`` (the library's split-KV
decode kernels; the split count from the library's heuristic for the GPU's multiprocessors
unless given, its f32 workspace allocated with torch; the tables stay on the device). No
autograd node: backward through it raises. Shares the helpers of ``attention``.
"""

from typing import Optional, Tuple

import torch

from .attention import _DTYPES, _check_sinks, _describe, _native, _window

# The decode step over a paged KV cache: flash-attn's ``flash_attn_with_kvcache``.


def _check_decode_inputs(q, k_cache, v_cache, block_table, cache_seqlens) -> None:
    """What torch knows of the inputs: q and the caches tensors on one CUDA device, bf16/f16
    alike, rank 4; the tables int32 tensors on that device, ``block_table`` of rank 2 and
    ``cache_seqlens`` (unless ``None``) of rank 1 (their sizes are the extension's)."""
    for name, t, dims in (
        ("q", q, "[batch, seqlen_q, nheads, headdim]"),
        ("k_cache", k_cache, "[num_blocks, page_block_size, nheads_k, headdim]"),
        ("v_cache", v_cache, "[num_blocks, page_block_size, nheads_k, headdim]"),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions {dims}, got shape {tuple(t.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} is {t.dtype}, q is {q.dtype}")
    for name, t, rank, dims in (
        ("block_table", block_table, 2, "2 dimensions [batch, max_num_blocks_per_seq]"),
        ("cache_seqlens", cache_seqlens, 1, "1 dimension [batch]"),
    ):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.dim() != rank:
            raise ValueError(f"{name} must have {dims}, got shape {tuple(t.shape)}")


def _num_splits(value) -> int:
    """A split count: an int >= 0 (0: the library's heuristic; under torch.compile a SymInt,
    taken as it is)."""
    if isinstance(value, torch.SymInt):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_splits must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"num_splits = {value}: use 0 (the heuristic) or a count >= 1")
    return value


@torch.library.custom_op("rustkernels::flash_attn_decode", mutates_args=())
def flash_attn_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    num_splits: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """O ``[batch, seqlen_q, nheads, headdim]`` (q's dtype) and LSE ``[batch, nheads, seqlen_q]``
    (f32, natural log) of a decode step over a paged KV cache, with ``num_splits`` splits of
    each sequence's keys (0: the library's heuristic for this GPU's multiprocessors and the
    longest context the block table allows); ``softcap`` and ``sinks`` as in
    ``flash_attn_forward``."""
    _check_decode_inputs(q, k_cache, v_cache, block_table, cache_seqlens)
    _check_sinks(sinks, q)
    native = _native()
    props = torch.cuda.get_device_properties(q.device)
    # Shared memory per SM bounds the decode blocks an SM holds (0 if this torch lacks it).
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 0)
    num_splits, workspace_len = native.attention_decode_workspace(
        tuple(q.shape),
        tuple(k_cache.shape),
        tuple(block_table.shape),
        str(q.dtype),
        _num_splits(num_splits),
        props.multi_processor_count,
        smem_per_sm,
    )
    batch, seqlen_q, nheads, headdim = q.shape
    out = torch.empty((batch, seqlen_q, nheads, headdim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    # The splits' partial outputs and LSE (empty with one split).
    workspace = torch.empty(workspace_len, dtype=torch.float32, device=q.device)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        native.attention_decode(
            q.device.index,
            stream,
            _describe(q),
            _describe(k_cache),
            _describe(v_cache),
            _describe(out),
            _describe(lse),
            _describe(block_table),
            _describe(cache_seqlens),
            _describe(workspace),
            softmax_scale,
            causal,
            num_splits,
            float(softcap) if softcap != 0.0 else None,
            None if sinks is None else _describe(sinks),
        )
    return out, lse


@flash_attn_decode.register_fake
def _flash_attn_decode_fake(
    q,
    k_cache,
    v_cache,
    block_table,
    cache_seqlens,
    softmax_scale,
    causal,
    num_splits=0,
    softcap=0.0,
    sinks=None,
):
    _check_decode_inputs(q, k_cache, v_cache, block_table, cache_seqlens)
    _num_splits(num_splits)
    batch, seqlen_q, nheads, headdim = q.shape
    return (
        q.new_empty((batch, seqlen_q, nheads, headdim)),
        q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32),
    )


@torch.library.custom_op("rustkernels::kv_append", mutates_args=("k_cache", "v_cache"))
def kv_append(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
) -> None:
    """Write ``k``, ``v`` ``[batch, seqlen_new, nheads_k, headdim]`` into the paged caches:
    token ``t`` of sequence ``b`` at position ``cache_seqlens[b] + t`` (through
    ``block_table``; ``cache_seqlens`` is not changed). The tables are not read on the host:
    positions past ``max_num_blocks_per_seq * page_block_size`` or pages outside the cache are
    skipped, never written outside it."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != k_cache.device:
            raise ValueError(f"{name} is on {t.device}, k_cache on {k_cache.device}")
        if t.dtype != k_cache.dtype:
            raise TypeError(f"{name} must have k_cache's dtype {k_cache.dtype}, got {t.dtype}")
    native = _native()
    with torch.cuda.device(k_cache.device):
        stream = torch.cuda.current_stream(k_cache.device).cuda_stream
        native.attention_kv_append(
            k_cache.device.index,
            stream,
            _describe(k),
            _describe(v),
            _describe(k_cache),
            _describe(v_cache),
            _describe(block_table),
            _describe(cache_seqlens),
        )


@kv_append.register_fake
def _kv_append_fake(k, v, k_cache, v_cache, block_table, cache_seqlens):
    return None


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens=None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    sinks: Optional[torch.Tensor] = None,
):
    """flash-attn's ``flash_attn_with_kvcache`` over a paged KV cache: one decode step of
    ``seqlen_q`` new tokens per sequence attending the keys and values already in the cache
    (inference: no gradient; backward through it raises).

    q ``[batch, seqlen_q, nheads, headdim]``; k_cache and v_cache ``[num_blocks,
    page_block_size, nheads_k, headdim]``, bfloat16 or float16 CUDA tensors on one device (head
    dimension contiguous, other strides multiples of 8 elements); ``block_table`` ``[batch,
    max_num_blocks_per_seq]`` int32 on that device: page ``t`` of sequence ``b`` is
    ``block_table[b, t]``; ``cache_seqlens``: the context length of each sequence, an int32
    tensor ``[batch]`` on that device or a Python int for all (``None``: every sequence uses its
    whole row of the block table, ``max_num_blocks_per_seq * page_block_size`` keys): the keys
    ``0 .. cache_seqlens[b]`` of sequence ``b`` are at slot ``j % page_block_size`` of page
    ``block_table[b, j // page_block_size]`` (entries past a context are not read; pages may come
    in any order and be shared). seqlen_q 1 to 16; headdim a multiple of 16 from 32 to 256; ``nheads`` a
    multiple of ``nheads_k``; page_block_size a multiple of 16 from 16 to 256. Query ``i`` of
    sequence ``b`` is the token at position ``cache_seqlens[b] - seqlen_q + i``: it attends every
    key of the context, or with ``causal`` the keys up to its own position (bottom-right
    aligned); a query with no key (a context of 0) gets 0 and LSE -inf. ``softmax_scale``
    defaults to ``1 / sqrt(headdim)``. ``num_splits``: how many blocks each sequence's keys are
    split over (flash-decoding; 0: the library's heuristic, from the GPU's multiprocessors and
    ``max_num_blocks_per_seq * page_block_size``). The tables are not read on the host (no
    synchronization): contents outside the rules above cannot make the kernels access memory
    outside the tensors, but give meaningless results. ``softcap > 0`` caps every logit ``l`` as
    ``softcap * tanh(l / softcap)``; ``sinks`` (float32 ``[nheads]``) joins one logit per query
    head to every row's softmax (gpt-oss; a query with no key gets LSE = its sink).

    ``k``, ``v`` (``[batch, seqlen_new, nheads_k, headdim]``, the caches' dtype, both or
    neither): new keys and values written into the caches first, token ``t`` of sequence ``b``
    at position ``cache_seqlens[b] + t`` (pages for them must be in the block table), and the
    step attends ``cache_seqlens[b] + seqlen_new`` keys; ``cache_seqlens`` itself is not
    changed (the caller advances it), as in flash-attn.

    Returns ``out`` (q's shape and dtype), or ``(out, softmax_lse)`` with
    ``return_softmax_lse`` (LSE ``[batch, nheads, seqlen_q]`` f32). Not supported
    (``NotImplementedError``): rotary embedding (``rotary_cos``, ``rotary_sin``),
    ``cache_batch_idx``, ``cache_leftpad``, a sliding ``window_size``, ``alibi_slopes``, and the
    contiguous cache layout without a ``block_table``.
    """
    if (k is None) != (v is None):
        raise ValueError("k and v: give both new keys and new values, or neither")
    if rotary_cos is not None or rotary_sin is not None:
        raise NotImplementedError("rotary_cos, rotary_sin: rotary embedding is not supported")
    if cache_batch_idx is not None:
        raise NotImplementedError("cache_batch_idx: indexing the cache's batch is not supported")
    if cache_leftpad is not None:
        raise NotImplementedError("cache_leftpad: left-padded caches are not supported")
    if block_table is None:
        raise NotImplementedError(
            "block_table is required: only the paged KV cache layout is supported "
            "(k_cache, v_cache [num_blocks, page_block_size, nheads_k, headdim] and a block_table)"
        )
    window_left, window_right = _window(window_size)
    if (window_left, window_right) != (-1, -1):
        raise NotImplementedError(
            f"window_size = {tuple(window_size)}: sliding windows are not supported in decoding"
        )
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi is not supported")
    num_splits = _num_splits(num_splits)
    seqlens_tensor = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
    _check_decode_inputs(q, k_cache, v_cache, block_table, seqlens_tensor)
    if seqlens_tensor is None:
        most = block_table.shape[1] * k_cache.shape[1]
        if cache_seqlens is None:
            cache_seqlens = most
        elif isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.SymInt)):
            raise TypeError(
                f"cache_seqlens must be an int32 tensor or an int, got {type(cache_seqlens).__name__}"
            )
        elif not isinstance(cache_seqlens, torch.SymInt) and not 0 <= cache_seqlens <= most:
            raise ValueError(
                f"cache_seqlens = {cache_seqlens}: a context is 0 to max_num_blocks_per_seq x "
                f"page_block_size = {most} keys"
            )
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 4 or t.shape[0] != q.shape[0] or t.shape[2:] != k_cache.shape[2:]:
                raise ValueError(
                    f"{name} must be [batch, seqlen_new, nheads_k, headdim] = [{q.shape[0]}, "
                    f"seqlen_new, {k_cache.shape[2]}, {k_cache.shape[3]}], got shape "
                    f"{tuple(t.shape)}"
                )
        if k.shape != v.shape:
            raise ValueError(f"k and v shapes differ: {tuple(k.shape)} and {tuple(v.shape)}")
        kv_append(k, v, k_cache, v_cache, block_table, cache_seqlens)
        # The step attends the new tokens too; the caller's cache_seqlens is not changed.
        cache_seqlens = cache_seqlens + k.shape[1]
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    out, lse = flash_attn_decode(
        q,
        k_cache,
        v_cache,
        block_table,
        cache_seqlens,
        softmax_scale,
        bool(causal),
        num_splits,
        float(softcap),
        sinks,
    )
    if return_softmax_lse:
        return out, lse
    return out
