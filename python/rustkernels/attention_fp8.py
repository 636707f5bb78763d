"""FP8 attention forward on Hopper GPUs: ``flash_attn_fp8_func`` (inference: forward only).

e4m3 (``torch.float8_e4m3fn``) q, k, v ``[batch, seqlen, nheads, headdim]`` with one f32 descale
per tensor (the inputs are each tensor's values times its descale), bf16 out and f32 LSE, head
dimensions 128 and 256, causal masks and windows as ``flash_attn_func``, grouped-query
attention. The library transposes V into a workspace first (the layout FP8 ``wgmma`` reads),
then runs its FP8 kernel.

Layers: ``flash_attn_fp8_func`` checks what torch knows (tensors, device, dtype, rank, the
descales) and calls ``torch.ops.rustkernels.flash_attn_fp8_forward``, a ``torch.library``
custom op with a fake implementation (``torch.compile`` traces around it) that allocates out,
LSE and the workspace with torch and launches on torch's current stream through the Rust
extension, which validates the rest with the library's messages (a GPU without the sm_90a
kernels, other head dimensions, strides TMA cannot describe).
"""

from typing import Optional, Tuple

import torch

from .attention import _describe, _native, _window

_FP8 = torch.float8_e4m3fn


def _check_fp8_inputs(q, k, v) -> None:
    """What torch knows of the inputs: tensors, on one CUDA device, float8_e4m3fn, rank 4."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
        if t.dtype != _FP8:
            raise TypeError(f"{name} must be float8_e4m3fn, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions [batch, seqlen, nheads, headdim], "
                f"got shape {tuple(t.shape)}"
            )
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")


@torch.library.custom_op("rustkernels::flash_attn_fp8_forward", mutates_args=())
def flash_attn_fp8_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_descale: float,
    k_descale: float,
    v_descale: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """O ``[batch, seqlen_q, nheads, headdim]`` (bf16) and LSE ``[batch, nheads, seqlen_q]``
    (f32, natural log) of e4m3 q, k, v dequantized by their descales."""
    _check_fp8_inputs(q, k, v)
    batch, seqlen_q, nheads, headdim = q.shape
    native = _native()
    out = torch.empty((batch, seqlen_q, nheads, headdim), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    workspace = torch.empty(
        native.attention_fp8_workspace(tuple(q.shape), tuple(k.shape)), dtype=_FP8, device=q.device
    )
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        native.attention_fp8_forward(
            q.device.index,
            stream,
            _describe(q),
            _describe(k),
            _describe(v),
            _describe(out),
            _describe(lse),
            _describe(workspace),
            float(q_descale),
            float(k_descale),
            float(v_descale),
            softmax_scale,
            causal,
            window_left,
            window_right,
        )
    return out, lse


@flash_attn_fp8_forward.register_fake
def _(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right):
    batch, seqlen_q, nheads, headdim = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, headdim), dtype=torch.bfloat16)
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse


def _descale(name: str, x) -> float:
    """A per-tensor descale: a Python number, or a tensor of one element (read on the host, a
    synchronization)."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(
                f"{name} has {x.numel()} elements: the FP8 kernels take one descale per tensor"
            )
        return float(x.item())
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    raise TypeError(f"{name} must be a float or a one-element tensor, got {type(x).__name__}")


def flash_attn_fp8_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_descale=1.0,
    k_descale=1.0,
    v_descale=1.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    return_attn_probs: bool = False,
):
    """FP8 attention forward: ``softmax(scale (q q_descale)(k k_descale)^T) (v v_descale)`` with
    flash-attn's masking (bottom-right aligned causal mask and windows, ``softmax_scale``
    default ``1 / sqrt(headdim)``). q ``[batch, seqlen_q, nheads, headdim]``, k and v
    ``[batch, seqlen_k, nheads_k, headdim]``, all ``torch.float8_e4m3fn`` on one CUDA device of
    compute capability 9.0, headdim 128 or 256. The descales are per tensor (floats or
    one-element tensors). Returns out (bf16), and with ``return_attn_probs`` ``(out, lse,
    None)`` (LSE f32 ``[batch, nheads, seqlen_q]``). Not differentiable."""
    _check_fp8_inputs(q, k, v)
    left, right = _window(window_size)
    out, lse = torch.ops.rustkernels.flash_attn_fp8_forward(
        q,
        k,
        v,
        _descale("q_descale", q_descale),
        _descale("k_descale", k_descale),
        _descale("v_descale", v_descale),
        softmax_scale,
        causal,
        left,
        right,
    )
    if return_attn_probs:
        return out, lse, None
    return out
