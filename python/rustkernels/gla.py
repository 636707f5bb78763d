"""Gated linear attention with flash-linear-attention's interface: ``chunk_gla``, forward.

Layers, from the user down:

- ``chunk_gla``: fla's ``chunk_gla`` signature, defaults, layout ``[B, T, H, D]`` and return
  value ``(o, final_state)``; checks what torch knows (tensor, device, dtype, rank) and
  refuses inputs that require grad (``NotImplementedError``: the GLA backward is not in the
  library yet; where it goes, see ``chunk_gla``).
- ``torch.ops.rustkernels.chunk_gla_forward``: the custom op, with a fake implementation so
  ``torch.compile`` traces around it. It allocates the outputs and the workspace (int32 segment
  tables and, when a long sequence is split across blocks, f32 state buffers; their sizes from
  the extension, which plans for the device) with torch and launches on torch's current stream
  of the tensors' device, through the Rust extension, which validates everything else (shapes,
  head dimensions, cu_seqlens, scale) with the library's messages.
"""

from typing import Optional, Tuple

import torch

from .attention import _describe, _native

_KERNELS = ("auto", "baseline", "pingpong")

NO_BACKWARD = (
    "chunk_gla: gradients are not available yet (the library's GLA backward computes dv and "
    "the initial state's gradient, not yet dq, dk and dg); call it under torch.no_grad() or "
    "on inputs that do not require grad"
)


def _check(q, k, v, g, initial_state) -> None:
    """What torch knows of the inputs: tensors on one CUDA device, q, k, v bf16 of rank 4, g
    bf16 or f32, the initial state f32."""
    named = (("q", q), ("k", k), ("v", v), ("g", g))
    for name, t in named + (("initial_state", initial_state),):
        if name == "initial_state" and t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    for name, t in named:
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions [batch, seqlen, heads, headdim], "
                f"got shape {tuple(t.shape)}"
            )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
    if g.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"g must be bfloat16 or float32 (read as bfloat16), got {g.dtype}")
    if initial_state is not None and initial_state.dtype != torch.float32:
        raise TypeError(f"initial_state must be float32, got {initial_state.dtype}")


def _num_seqs(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


@torch.library.custom_op("rustkernels::chunk_gla_forward", mutates_args=())
def chunk_gla_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: Optional[float],
    initial_state: Optional[torch.Tensor],
    output_final_state: bool,
    cu_seqlens: Optional[torch.Tensor],
    kernel: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """o ``[B, T, H, dv]`` bf16 and the final states ``[N, H, dk, dv]`` f32 (an empty tensor
    without ``output_final_state``). ``kernel``: ``auto`` (the warp-specialized pingpong on
    sm_90 where it pays, else the baseline), ``baseline`` or ``pingpong``."""
    _check(q, k, v, g, initial_state)
    if kernel not in _KERNELS:
        raise ValueError(f"kernel {kernel!r}: use one of {_KERNELS}")
    # The kernels read contiguous bf16 tensors.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.to(torch.bfloat16).contiguous()
    h0 = None if initial_state is None else initial_state.contiguous()
    cu = None
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"cu_seqlens must be a 1-dimensional int32 or int64 tensor, got "
                f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}"
            )
        cu = [int(x) for x in cu_seqlens.tolist()]
        if any(x < 0 for x in cu):
            raise ValueError(f"cu_seqlens must hold offsets >= 0, got {cu}")
    batch, seqlen, heads, dk = q.shape
    dv = v.shape[-1]
    n = _num_seqs(q, cu_seqlens)
    o = torch.empty((batch, seqlen, heads, dv), dtype=torch.bfloat16, device=q.device)
    ht = torch.empty(
        (n, heads, dk, dv) if output_final_state else (0,), dtype=torch.float32, device=q.device
    )
    native = _native()
    with torch.cuda.device(q.device):
        words, elems = native.gla_forward_workspace(
            q.device.index, tuple(q.shape), tuple(v.shape), cu, kernel
        )
        tables = torch.empty(words, dtype=torch.int32, device=q.device)
        buffers = torch.empty(elems, dtype=torch.float32, device=q.device) if elems else None
        stream = torch.cuda.current_stream(q.device).cuda_stream
        native.gla_forward(
            q.device.index,
            stream,
            _describe(q),
            _describe(k),
            _describe(v),
            _describe(g),
            None if h0 is None else _describe(h0),
            _describe(o),
            _describe(ht) if output_final_state else None,
            _describe(tables),
            None if buffers is None else _describe(buffers),
            scale,
            cu,
            kernel,
        )
    return o, ht


@chunk_gla_forward.register_fake
def _chunk_gla_forward_fake(
    q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, kernel="auto"
):
    _check(q, k, v, g, initial_state)
    batch, seqlen, heads, dk = q.shape
    dv = v.shape[-1]
    n = _num_seqs(q, cu_seqlens)
    return (
        q.new_empty((batch, seqlen, heads, dv)),
        q.new_empty((n, heads, dk, dv) if output_final_state else (0,), dtype=torch.float32),
    )


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    kernel: str = "auto",
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fla's ``chunk_gla``: ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = scale q_t S_t``
    per sequence and head.

    q, k ``[B, T, H, dk]``, v ``[B, T, H, dv]`` bfloat16 CUDA tensors on one device, g
    ``[B, T, H, dk]`` log-decays (natural log, ``<= 0`` the model's domain; bfloat16, or
    float32 rounded to bfloat16 as the kernels read it); dk and dv each 64 or 128; any T.
    ``scale`` defaults to ``dk ** -0.5``. ``initial_state`` ``[N, H, dk, dv]`` float32 (zero
    states if None); ``output_final_state`` returns the final states (same shape, float32).
    ``cu_seqlens`` (int32/int64, ``[N + 1]``, fla's convention: B = 1, sequences packed along T,
    each at least one token) gives variable-length sequences, each from its own initial state;
    reading it synchronizes with the device. Non-contiguous inputs are copied.

    Returns ``(o, final_state)``: o ``[B, T, H, dv]`` bfloat16, final_state or None.

    Gradients: not available yet. With an input that requires grad (and grad mode on) this
    raises ``NotImplementedError`` rather than returning outputs without gradients. When the
    library's GLA backward exists, it comes in here as flash_attn_func's does: a
    ``torch.autograd.Function`` whose forward is ``chunk_gla_forward`` and whose backward a
    ``chunk_gla_backward`` custom op.
    """
    _check(q, k, v, g, initial_state)
    tracked = (q, k, v, g) + (() if initial_state is None else (initial_state,))
    if torch.is_grad_enabled() and any(t.requires_grad for t in tracked):
        raise NotImplementedError(NO_BACKWARD)
    if scale is not None:
        scale = float(scale)
    o, ht = chunk_gla_forward(
        q, k, v, g, scale, initial_state, bool(output_final_state), cu_seqlens, kernel
    )
    return o, (ht if output_final_state else None)
