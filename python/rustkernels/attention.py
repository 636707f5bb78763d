"""Attention forward with flash-attn's interface: ``flash_attn_func``.

Layers, from the user down:

- ``flash_attn_func``: flash-attn's signature and semantics; rejects what the kernels do not do
  (dropout, softcap, ALiBi) and checks what torch knows (tensor, device, dtype, rank).
- ``_FlashAttnFunction`` (``torch.autograd.Function``): the autograd node, used when an input
  requires grad; its backward raises ``NotImplementedError`` (no backward kernel yet).
- ``torch.ops.rustkernels.flash_attn_forward``: the custom op, with a fake implementation so
  ``torch.compile`` traces around it. It allocates O and LSE with torch (the caching allocator
  owns them) and launches on torch's current stream of the tensors' device, through the Rust
  extension, which validates everything else (shapes, strides, alignment, sizes, options) with
  the library's messages.
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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """O ``[batch, seqlen_q, nheads, headdim]`` (q's dtype) and LSE ``[batch, nheads, seqlen_q]``
    (f32, natural log). ``path`` picks the kernel: ``auto`` (the Hopper kernels on sm_90),
    ``mma_sync`` or ``hopper``."""
    _check_inputs(q, k, v)
    if path not in _PATHS:
        raise ValueError(f"path {path!r}: use one of {_PATHS}")
    batch, seqlen_q, nheads, headdim = q.shape
    out = torch.empty((batch, seqlen_q, nheads, headdim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    native = _native()
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
        )
    return out, lse


@flash_attn_forward.register_fake
def _flash_attn_forward_fake(q, k, v, softmax_scale, causal, window_left, window_right, path="auto"):
    _check_inputs(q, k, v)
    batch, seqlen_q, nheads, headdim = q.shape
    return (
        q.new_empty((batch, seqlen_q, nheads, headdim)),
        q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32),
    )


class _FlashAttnFunction(torch.autograd.Function):
    """The autograd node of ``flash_attn_func``: forward only for now."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, window_left, window_right):
        out, lse = flash_attn_forward(q, k, v, softmax_scale, causal, window_left, window_right)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        raise NotImplementedError(
            "rustkernels.flash_attn_func: the backward pass is not implemented yet (forward "
            "only); run it under torch.no_grad() or on tensors that do not require grad"
        )


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
):
    """flash-attn's ``flash_attn_func``, forward only.

    q ``[batch, seqlen_q, nheads, headdim]``, k and v ``[batch, seqlen_k, nheads_k, headdim]``,
    bfloat16 or float16 CUDA tensors on one device, with the head dimension contiguous and the
    other strides multiples of 8 elements (16 bytes). headdim 64, 128 or 256; ``nheads`` a
    multiple of ``nheads_k`` (grouped-query attention). ``softmax_scale`` defaults to
    ``1 / sqrt(headdim)``. With ``seqlen_q != seqlen_k`` the causal mask is aligned to the
    bottom-right corner; ``window_size = (left, right)`` lets query i attend keys j with
    ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right`` (-1: unbounded);
    a query with no key to attend gets 0 (and LSE -inf).

    Returns ``out`` (q's shape and dtype), or ``(out, softmax_lse, None)`` with
    ``return_attn_probs`` (LSE ``[batch, nheads, seqlen_q]`` f32; the probabilities are not
    returned). ``deterministic`` is accepted: the forward pass is deterministic. Dropout,
    ``softcap`` and ``alibi_slopes`` are not supported (``NotImplementedError``).
    """
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p = {dropout_p}: dropout is not supported (use 0.0)")
    if softcap != 0.0:
        raise NotImplementedError(f"softcap = {softcap}: logit soft-capping is not supported")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi is not supported")
    window_left, window_right = _window(window_size)
    _check_inputs(q, k, v)
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    args = (q, k, v, softmax_scale, bool(causal), window_left, window_right)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _FlashAttnFunction.apply(*args)
    else:
        out, lse = flash_attn_forward(*args)
    if return_attn_probs:
        return out, lse, None
    return out
