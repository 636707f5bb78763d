"""Attention with flash-attn's interface: ``flash_attn_func``, and over packed sequences
``flash_attn_varlen_func``, forward and backward; the decode step over a paged KV cache
``flash_attn_with_kvcache`` (inference: forward only).

Layers, from the user down:

- ``flash_attn_func``: flash-attn's signature and semantics (``softcap``, and ``sinks`` beside
  it); rejects what the kernels do not do (dropout, ALiBi) and checks what torch knows (tensor,
  device, dtype, rank).
- ``_FlashAttnFunction`` (``torch.autograd.Function``): the autograd node, used when an input
  requires grad (q, k, v or the sinks). It saves q, k, v, out, the LSE and the sinks for the
  backward, which calls ``flash_attn_backward`` (dK and dV of grouped-query attention are summed
  over the query heads of each group by the kernels, so they have k's and v's shapes; the
  sinks' gradient over the batch and the rows).
- ``torch.ops.rustkernels.flash_attn_forward`` and ``torch.ops.rustkernels.flash_attn_backward``:
  the custom ops, each with a fake implementation so ``torch.compile`` traces around them. They
  allocate their outputs, and the backward its f32 workspace, with torch (the caching allocator
  owns them) and launch on torch's current stream of the tensors' device, through the Rust
  extension, which validates everything else (shapes, strides, alignment, sizes, options) with
  the library's messages.

The packed-sequence entry point has the same layers: ``flash_attn_varlen_func``,
``_FlashAttnVarlenFunction``, ``torch.ops.rustkernels.flash_attn_varlen_forward`` and
``flash_attn_varlen_backward`` (the library's varlen forward and backward; the boundaries stay
on the device).

The decode step, ``flash_attn_with_kvcache``, is in ``attention_decode`` (re-exported here).
"""

from typing import Optional, Tuple

import torch

_DTYPES = (torch.bfloat16, torch.float16)
_PATHS = ("auto", "mma_sync", "hopper")


def _native():
    """The Rust extension, imported on first use (it links the NVIDIA driver's libcuda.so.1)."""
    try:
        from . import _native as native
    except ImportError as e:
        raise RuntimeError(
            f"rustkernels: the extension module could not be loaded ({e}); "
            "it needs the NVIDIA driver (libcuda.so.1)"
        ) from e
    return native


def _describe(t: torch.Tensor):
    """A tensor as the extension takes it: address, dtype, shape, strides, and its storage."""
    s = t.untyped_storage()
    return (t.data_ptr(), str(t.dtype), tuple(t.shape), tuple(t.stride()), s.data_ptr(), s.nbytes())


def _check_inputs(q, k, v) -> None:
    """What torch knows of the inputs: tensors, on one CUDA device, bf16/f16 alike, rank 4."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions [batch, seqlen, nheads, headdim], "
                f"got shape {tuple(t.shape)}"
            )
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} is {t.dtype}, q is {q.dtype}")


def _window(window_size) -> Tuple[int, int]:
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    for side in (left, right):
        if not isinstance(side, int) or side < -1:
            raise ValueError(
                f"window_size = {tuple(window_size)}: each side is an int >= 0, or -1 for unbounded"
            )
    return left, right


@torch.library.custom_op("rustkernels::flash_attn_forward", mutates_args=())
def flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    path: str = "auto",
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """O ``[batch, seqlen_q, nheads, headdim_v]`` (q's dtype; ``headdim_v`` is v's, which may
    differ from q's on Hopper: (192, 128)) and LSE ``[batch, nheads, seqlen_q]`` (f32, natural
    log). ``path`` picks the kernel: ``auto`` (the Hopper kernels on sm_90),
    ``mma_sync`` or ``hopper``. ``softcap > 0`` caps every logit ``l`` as
    ``softcap * tanh(l / softcap)``; ``sinks`` (float32 ``[nheads]``) joins one logit per query
    head to every row's softmax."""
    _check_inputs(q, k, v)
    if path not in _PATHS:
        raise ValueError(f"path {path!r}: use one of {_PATHS}")
    _check_sinks(sinks, q)
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty((batch, seqlen_q, nheads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    native = _native()
    # Short causal problems run on a persistent grid whose blocks draw their tiles from this
    # counter (zero at the start, zero again at the end; one per call, so that calls on
    # different streams never share one).
    tile_counter = None
    if causal and k.shape[1] * q.shape[-1] < native.DYNAMIC_GRID_KEY_ELEMS:
        tile_counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        native.attention_forward(
            q.device.index,
            stream,
            _describe(q),
            _describe(k),
            _describe(v),
            _describe(out),
            _describe(lse),
            softmax_scale,
            causal,
            window_left,
            window_right,
            path,
            float(softcap) if softcap != 0.0 else None,
            None if sinks is None else _describe(sinks),
            None if tile_counter is None else _describe(tile_counter),
        )
    return out, lse


def _check_sinks(sinks, q: torch.Tensor) -> None:
    """``sinks``: None, or a float32 tensor on q's device (its shape is the extension's)."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor, got {type(sinks).__name__}")
    if sinks.device != q.device:
        raise ValueError(f"sinks is on {sinks.device}, q on {q.device}")
    if sinks.dtype != torch.float32:
        raise TypeError(f"sinks must be float32, got {sinks.dtype}")


@flash_attn_forward.register_fake
def _flash_attn_forward_fake(
    q, k, v, softmax_scale, causal, window_left, window_right, path="auto", softcap=0.0, sinks=None
):
    _check_inputs(q, k, v)
    batch, seqlen_q, nheads, _ = q.shape
    return (
        q.new_empty((batch, seqlen_q, nheads, v.shape[-1])),
        q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32),
    )


def _check_like(name: str, t, like: torch.Tensor, like_name: str) -> None:
    """``t`` is a CUDA tensor of ``like``'s device and dtype (shapes are the extension's)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, {like_name} on {like.device}")
    if t.dtype != like.dtype:
        raise TypeError(f"{name} is {t.dtype}, {like_name} is {like.dtype}")


@torch.library.custom_op("rustkernels::flash_attn_backward", mutates_args=())
def flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dsoftmax_lse: Optional[torch.Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    deterministic: bool = False,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (q's, k's and v's shapes, contiguous, q's dtype) and dsinks of the attention
    forward that gave ``out`` and ``softmax_lse`` on q, k, v with these options, for the loss
    gradients ``dout`` (out's shape; head dimension contiguous, other strides multiples of 8
    elements) and ``dsoftmax_lse`` (the LSE's shape, f32, contiguous; ``None`` when the loss
    does not use the LSE). With grouped-query attention dk and dv are summed over the query
    heads of each group. ``deterministic``: bitwise reproducible dq (its f32 additions in a
    fixed order, or its own kernel; slower). ``softcap`` and ``sinks`` as the forward took them; dsinks is the sinks'
    gradient (float32 ``[nheads]``, summed over the batch and the rows; empty without sinks)."""
    _check_inputs(q, k, v)
    _check_sinks(sinks, q)
    _check_like("out", out, q, "q")
    _check_like("dout", dout, q, "q")
    for name, t in (("softmax_lse", softmax_lse), ("dsoftmax_lse", dsoftmax_lse)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
    native = _native()
    delta_len, accum_len = native.attention_backward_workspace(
        tuple(q.shape), tuple(k.shape), str(q.dtype), deterministic
    )
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dsinks = _dsinks_like(sinks, q)
    # The workspace: delta' and the f32 dQ accumulator (deterministic: with its order's
    # counters after it).
    delta = torch.empty(delta_len, dtype=torch.float32, device=q.device)
    accum = torch.empty(accum_len, dtype=torch.float32, device=q.device) if accum_len else None
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        native.attention_backward(
            q.device.index,
            stream,
            _describe(q),
            _describe(k),
            _describe(v),
            _describe(out),
            _describe(softmax_lse),
            _describe(dout),
            None if dsoftmax_lse is None else _describe(dsoftmax_lse),
            _describe(dq),
            _describe(dk),
            _describe(dv),
            _describe(delta),
            None if accum is None else _describe(accum),
            softmax_scale,
            causal,
            window_left,
            window_right,
            deterministic,
            float(softcap) if softcap != 0.0 else None,
            None if sinks is None else _describe(sinks),
            None if sinks is None else _describe(dsinks),
        )
    return dq, dk, dv, dsinks


def _dsinks_like(sinks: Optional[torch.Tensor], q: torch.Tensor) -> torch.Tensor:
    """The sinks' gradient: float32 of the sinks' shape, empty without sinks."""
    shape = (0,) if sinks is None else sinks.shape
    return torch.empty(shape, dtype=torch.float32, device=q.device)


@flash_attn_backward.register_fake
def _flash_attn_backward_fake(
    dout, q, k, v, out, softmax_lse, dsoftmax_lse, softmax_scale, causal, window_left, window_right,
    deterministic=False, softcap=0.0, sinks=None,
):
    _check_inputs(q, k, v)
    dsinks = _dsinks_like(sinks, q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _kernel_layout(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the kernels take it: head dimension contiguous, other strides and the offset
    in its storage multiples of 8 elements (16 bytes; torch's storages start aligned); a
    contiguous copy otherwise (an upstream gradient is often an expanded or strided view). No
    data pointer is read, so this traces under ``torch.compile`` (where the storage offset is
    not looked at: the extension still refuses a misaligned start with a ValueError)."""
    aligned = t.stride(-1) == 1
    if not torch.compiler.is_compiling():
        aligned = aligned and t.storage_offset() % 8 == 0
    for i in range(t.dim() - 1):
        if t.shape[i] > 1 and t.stride(i) % 8 != 0:
            aligned = False
    return t if aligned else t.clone(memory_format=torch.contiguous_format)


class _FlashAttnFunction(torch.autograd.Function):
    """The autograd node of ``flash_attn_func``. The LSE output is differentiable only with
    ``lse_grad`` (``flash_attn_func(..., return_attn_probs=True)``, where the caller gets it)."""

    @staticmethod
    def forward(
        ctx, q, k, v, softmax_scale, causal, window_left, window_right, deterministic, lse_grad,
        softcap, sinks,
    ):
        out, lse = flash_attn_forward(
            q, k, v, softmax_scale, causal, window_left, window_right, "auto", softcap, sinks
        )
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.softcap = softcap
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.window = (window_left, window_right)
        ctx.deterministic = deterministic
        ctx.lse_grad = lse_grad
        if not lse_grad:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        if dout is None:  # only the LSE reached the loss
            dout = torch.zeros_like(out)
        dlse = dlse.contiguous() if ctx.lse_grad and dlse is not None else None
        dq, dk, dv, dsinks = flash_attn_backward(
            _kernel_layout(dout),
            q,
            k,
            v,
            out,
            lse,
            dlse,
            ctx.softmax_scale,
            ctx.causal,
            ctx.window[0],
            ctx.window[1],
            ctx.deterministic,
            ctx.softcap,
            sinks,
        )
        dsinks = dsinks if sinks is not None and ctx.needs_input_grad[10] else None
        return dq, dk, dv, None, None, None, None, None, None, None, dsinks


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    sinks: Optional[torch.Tensor] = None,
):
    """flash-attn's ``flash_attn_func``: attention forward, and backward through autograd.

    q ``[batch, seqlen_q, nheads, headdim]``, k and v ``[batch, seqlen_k, nheads_k, headdim]``,
    bfloat16 or float16 CUDA tensors on one device, with the head dimension contiguous and the
    other strides multiples of 8 elements (16 bytes). headdim a multiple of 16 from 32 to 256
    (the backward too); ``nheads`` a multiple of ``nheads_k`` (grouped-query attention). ``softmax_scale`` defaults to ``1 / sqrt(headdim)``. With ``seqlen_q != seqlen_k`` the causal mask is aligned to the
    bottom-right corner; ``window_size = (left, right)`` lets query i attend keys j with
    ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right`` (-1: unbounded);
    a query with no key to attend gets 0 (and LSE -inf).

    Returns ``out`` (q's shape and dtype), or ``(out, softmax_lse, None)`` with
    ``return_attn_probs`` (LSE ``[batch, nheads, seqlen_q]`` f32; the probabilities are not
    returned). When q, k or v requires grad, ``out`` (and the LSE, where returned) has a
    gradient: dq, dk, dv come from the backward kernels (``flash_attn_backward``), dk and dv of
    grouped-query attention summed over each group's query heads. ``deterministic=True`` makes
    the backward bitwise reproducible (dq from its own kernel instead of f32 atomics; slower);
    the forward is always deterministic. ``softcap > 0`` caps every logit ``l`` as ``softcap *
    tanh(l / softcap)`` (Gemma 2); ``sinks`` (float32 ``[nheads]``, gpt-oss) joins one logit per
    query head to every row's softmax (no value; a row with no key gets LSE = its sink); with
    either, the backward's gradients follow them, and sinks that require grad get theirs
    (summed over the batch and the rows). Dropout and ``alibi_slopes`` are not supported
    (``NotImplementedError``).
    """
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p = {dropout_p}: dropout is not supported (use 0.0)")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi is not supported")
    window_left, window_right = _window(window_size)
    _check_inputs(q, k, v)
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    _check_sinks(sinks, q)
    args = (q, k, v, softmax_scale, bool(causal), window_left, window_right)
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    if grad:
        out, lse = _FlashAttnFunction.apply(
            *args, bool(deterministic), bool(return_attn_probs), float(softcap), sinks
        )
    else:
        out, lse = flash_attn_forward(*args, "auto", float(softcap), sinks)
    if return_attn_probs:
        return out, lse, None
    return out


# Packed sequences of different lengths: flash-attn's ``flash_attn_varlen_func``.


def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k) -> None:
    """What torch knows of the inputs: q, k, v tensors on one CUDA device, bf16/f16 alike, rank
    3; the boundaries int32 tensors of rank 1 on that device (their lengths are the
    extension's)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(
                f"{name} must have 3 dimensions [total_seqlen, nheads, headdim], "
                f"got shape {tuple(t.shape)}"
            )
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} is {t.dtype}, q is {q.dtype}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name} must have 1 dimension [batch + 1], got shape {tuple(t.shape)}")


def _max_seqlen(name: str, value) -> int:
    """A longest length: an int >= 0 (under torch.compile a SymInt, taken as it is)."""
    if isinstance(value, torch.SymInt):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} = {value}: a length is >= 0")
    return value


@torch.library.custom_op("rustkernels::flash_attn_varlen_forward", mutates_args=())
def flash_attn_varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """O ``[total_q, nheads, headdim_v]`` (q's dtype; ``headdim_v`` v's, as in
    ``flash_attn_forward``) and LSE ``[nheads, total_q]`` (f32, natural log) over packed sequences (the Hopper kernels on sm_90a, the ``mma.sync`` kernels on
    other GPUs); ``softcap`` and ``sinks`` as in ``flash_attn_forward``."""
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    _check_sinks(sinks, q)
    total_q, nheads, _ = q.shape
    out = torch.empty((total_q, nheads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((nheads, total_q), dtype=torch.float32, device=q.device)
    # The Hopper kernels' persistent grid draws its tiles from this counter (zero at the
    # start, zero again at the end; one per call, so that calls on different streams never
    # share one).
    tile_counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    native = _native()
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        native.attention_varlen_forward(
            q.device.index,
            stream,
            _describe(q),
            _describe(k),
            _describe(v),
            _describe(out),
            _describe(lse),
            _describe(cu_seqlens_q),
            _describe(cu_seqlens_k),
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            causal,
            window_left,
            window_right,
            float(softcap) if softcap != 0.0 else None,
            None if sinks is None else _describe(sinks),
            _describe(tile_counter),
        )
    return out, lse


@flash_attn_varlen_forward.register_fake
def _flash_attn_varlen_forward_fake(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
    window_left, window_right, softcap=0.0, sinks=None,
):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    total_q, nheads, _ = q.shape
    return (
        q.new_empty((total_q, nheads, v.shape[-1])),
        q.new_empty((nheads, total_q), dtype=torch.float32),
    )


@torch.library.custom_op("rustkernels::flash_attn_varlen_backward", mutates_args=())
def flash_attn_varlen_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dsoftmax_lse: Optional[torch.Tensor],
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    deterministic: bool = False,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (q's, k's and v's shapes, contiguous, q's dtype) and dsinks of the packed
    forward that gave ``out`` and ``softmax_lse`` (``[nheads, total_q]``) with these boundaries
    and options, for the loss gradients ``dout`` and ``dsoftmax_lse`` (the LSE's shape, f32,
    contiguous; ``None`` when the loss does not use the LSE). As ``flash_attn_backward``: dk
    and dv summed over each group's query heads; ``deterministic``: bitwise reproducible dq;
    dsinks summed over every sequence (empty without sinks)."""
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    _check_sinks(sinks, q)
    _check_like("out", out, q, "q")
    _check_like("dout", dout, q, "q")
    for name, t in (("softmax_lse", softmax_lse), ("dsoftmax_lse", dsoftmax_lse)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
    native = _native()
    delta_len, accum_len = native.attention_varlen_backward_workspace(
        tuple(q.shape),
        tuple(k.shape),
        max(cu_seqlens_q.shape[0] - 1, 0),
        max_seqlen_q,
        max_seqlen_k,
        str(q.dtype),
        deterministic,
    )
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dsinks = _dsinks_like(sinks, q)
    delta = torch.empty(delta_len, dtype=torch.float32, device=q.device)
    accum = torch.empty(accum_len, dtype=torch.float32, device=q.device) if accum_len else None
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        native.attention_varlen_backward(
            q.device.index,
            stream,
            _describe(q),
            _describe(k),
            _describe(v),
            _describe(out),
            _describe(softmax_lse),
            _describe(dout),
            None if dsoftmax_lse is None else _describe(dsoftmax_lse),
            _describe(dq),
            _describe(dk),
            _describe(dv),
            _describe(cu_seqlens_q),
            _describe(cu_seqlens_k),
            _describe(delta),
            None if accum is None else _describe(accum),
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            causal,
            window_left,
            window_right,
            deterministic,
            float(softcap) if softcap != 0.0 else None,
            None if sinks is None else _describe(sinks),
            None if sinks is None else _describe(dsinks),
        )
    return dq, dk, dv, dsinks


@flash_attn_varlen_backward.register_fake
def _flash_attn_varlen_backward_fake(
    dout, q, k, v, out, softmax_lse, dsoftmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k, softmax_scale, causal, window_left, window_right, deterministic=False,
    softcap=0.0, sinks=None,
):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    dsinks = _dsinks_like(sinks, q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


class _FlashAttnVarlenFunction(torch.autograd.Function):
    """The autograd node of ``flash_attn_varlen_func`` (as ``_FlashAttnFunction``; the
    boundaries and longest lengths are not differentiable)."""

    @staticmethod
    def forward(
        ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        causal, window_left, window_right, deterministic, lse_grad, softcap, sinks,
    ):
        out, lse = flash_attn_varlen_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            causal, window_left, window_right, softcap, sinks,
        )
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks)
        ctx.softcap = softcap
        ctx.max_seqlen = (max_seqlen_q, max_seqlen_k)
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.window = (window_left, window_right)
        ctx.deterministic = deterministic
        ctx.lse_grad = lse_grad
        if not lse_grad:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
        if dout is None:  # only the LSE reached the loss
            dout = torch.zeros_like(out)
        dlse = dlse.contiguous() if ctx.lse_grad and dlse is not None else None
        dq, dk, dv, dsinks = flash_attn_varlen_backward(
            _kernel_layout(dout),
            q,
            k,
            v,
            out,
            lse,
            dlse,
            cu_seqlens_q,
            cu_seqlens_k,
            ctx.max_seqlen[0],
            ctx.max_seqlen[1],
            ctx.softmax_scale,
            ctx.causal,
            ctx.window[0],
            ctx.window[1],
            ctx.deterministic,
            ctx.softcap,
            sinks,
        )
        dsinks = dsinks if sinks is not None and ctx.needs_input_grad[14] else None
        return (dq, dk, dv) + (None,) * 11 + (dsinks,)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[torch.Tensor] = None,
    sinks: Optional[torch.Tensor] = None,
):
    """flash-attn's ``flash_attn_varlen_func``: attention over packed sequences of different
    lengths, forward, and backward through autograd.

    q ``[total_q, nheads, headdim]``, k and v ``[total_k, nheads_k, headdim]``, bfloat16 or
    float16 CUDA tensors on one device (head dimension contiguous, other strides multiples of 8
    elements); ``cu_seqlens_q``, ``cu_seqlens_k`` ``[batch + 1]`` int32 on that device: sequence
    ``b`` is query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` (from 0, non-decreasing, ending at the totals; a
    sequence may be empty); ``max_seqlen_q``, ``max_seqlen_k`` the longest lengths (at least
    the longest, at most the totals). Each sequence is the attention of ``flash_attn_func``
    (causal mask and window aligned to its own bottom-right corner; a query with no key gets 0
    and LSE -inf). headdim a multiple of 16 from 32 to 256 (the backward too); ``nheads`` a
    multiple of ``nheads_k``. The boundaries are
    not read on the host (no synchronization): boundaries that break the rules above cannot make
    the kernels access memory outside the tensors, but give meaningless results.

    Returns ``out`` (q's shape and dtype), or ``(out, softmax_lse, None)`` with
    ``return_attn_probs`` (LSE ``[nheads, total_q]`` f32). Gradients as ``flash_attn_func``'s
    (dk, dv summed over each group's query heads; ``deterministic=True``: bitwise reproducible).
    ``softcap`` and ``sinks`` as ``flash_attn_func``'s (the sinks' gradient summed over every
    sequence). Dropout,
    ``alibi_slopes`` and ``block_table`` (paged K/V) are not supported (``NotImplementedError``).
    """
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p = {dropout_p}: dropout is not supported (use 0.0)")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi is not supported")
    if block_table is not None:
        raise NotImplementedError("block_table: paged K/V is not supported")
    window_left, window_right = _window(window_size)
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    max_seqlen_q = _max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _max_seqlen("max_seqlen_k", max_seqlen_k)
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    args = (
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        bool(causal), window_left, window_right,
    )
    _check_sinks(sinks, q)
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    if grad:
        out, lse = _FlashAttnVarlenFunction.apply(
            *args, bool(deterministic), bool(return_attn_probs), float(softcap), sinks
        )
    else:
        out, lse = flash_attn_varlen_forward(*args, float(softcap), sinks)
    if return_attn_probs:
        return out, lse, None
    return out


# The decode step lives in ``attention_decode`` (it uses this module's helpers); importing it
# here registers its custom op with the others.
from .attention_decode import flash_attn_decode, flash_attn_with_kvcache  # noqa: E402, F401
