"""Gated linear attention with flash-linear-attention's interface: ``chunk_gla``, forward and
backward.

Layers, from the user down:

- ``chunk_gla``: fla's ``chunk_gla`` signature, defaults, layout ``[B, T, H, D]`` and return
  value ``(o, final_state)``; checks what torch knows (tensor, device, dtype, rank).
- ``_ChunkGLAFunction`` (``torch.autograd.Function``): the autograd node, used when an input
  requires grad; it saves the forward's inputs (the backward recomputes what it needs from
  them) and calls ``chunk_gla_backward``.
- ``torch.ops.rustkernels.chunk_gla_forward`` and ``chunk_gla_backward``: the custom ops, each
  with a fake implementation so ``torch.compile`` traces around them. It allocates the outputs and the workspace (int32 segment
  tables and, when a long sequence is split across blocks, f32 state buffers; their sizes from
  the extension, which plans for the device) with torch and launches on torch's current stream
  of the tensors' device, through the Rust extension, which validates everything else (shapes,
  head dimensions, cu_seqlens, scale) with the library's messages.
"""

from typing import Optional, Tuple

import torch

from .attention import _describe, _native

_KERNELS = ("auto", "baseline", "pingpong")

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


def _offsets(cu_seqlens: Optional[torch.Tensor]):
    """cu_seqlens as a list of ints (read on the host), or None."""
    if cu_seqlens is None:
        return None
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"cu_seqlens must be a 1-dimensional int32 or int64 tensor, got "
            f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}"
        )
    cu = [int(x) for x in cu_seqlens.tolist()]
    if any(x < 0 for x in cu):
        raise ValueError(f"cu_seqlens must hold offsets >= 0, got {cu}")
    return cu


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
    gla_kernel: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """o ``[B, T, H, dv]`` bf16 and the final states ``[N, H, dk, dv]`` f32 (an empty tensor
    without ``output_final_state``). ``gla_kernel`` (not ``kernel``, a name Inductor's fallback
    for custom ops takes for itself): ``auto`` (the warp-specialized pingpong on
    sm_90 where it pays, else the baseline), ``baseline`` or ``pingpong``."""
    _check(q, k, v, g, initial_state)
    if gla_kernel not in _KERNELS:
        raise ValueError(f"kernel {gla_kernel!r}: use one of {_KERNELS}")
    # The kernels read contiguous bf16 tensors.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.to(torch.bfloat16).contiguous()
    h0 = None if initial_state is None else initial_state.contiguous()
    cu = _offsets(cu_seqlens)
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
            q.device.index, tuple(q.shape), tuple(v.shape), cu, gla_kernel
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
            gla_kernel,
        )
    return o, ht


@chunk_gla_forward.register_fake
def _chunk_gla_forward_fake(
    q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, gla_kernel="auto"
):
    _check(q, k, v, g, initial_state)
    batch, seqlen, heads, dk = q.shape
    dv = v.shape[-1]
    n = _num_seqs(q, cu_seqlens)
    return (
        q.new_empty((batch, seqlen, heads, dv)),
        q.new_empty((n, heads, dk, dv) if output_final_state else (0,), dtype=torch.float32),
    )


@torch.library.custom_op("rustkernels::chunk_gla_backward", mutates_args=())
def chunk_gla_backward(
    do: torch.Tensor,
    dht: Optional[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: Optional[float],
    initial_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (bf16), dg and dh0 (f32; dh0 ``[N, H, dk, dv]`` whether or not the forward
    had initial states) of the forward of q, k, v, g (bf16) and ``initial_state``, for the
    loss gradients ``do`` (o's shape, bf16) and ``dht`` (the final states' gradient, f32, or
    None)."""
    _check(q, k, v, g, initial_state)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.to(torch.bfloat16).contiguous()
    do = do.to(torch.bfloat16).contiguous()
    h0 = None if initial_state is None else initial_state.contiguous()
    dht = None if dht is None else dht.to(torch.float32).contiguous()
    cu = _offsets(cu_seqlens)
    batch, seqlen, heads, dk = q.shape
    dv = v.shape[-1]
    n = _num_seqs(q, cu_seqlens)
    dev = q.device
    dq, dk_, dv_ = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dg = torch.empty(q.shape, dtype=torch.float32, device=dev)
    dh0 = torch.empty((n, heads, dk, dv), dtype=torch.float32, device=dev)
    native = _native()
    with torch.cuda.device(dev):
        words, elems = native.gla_backward_workspace(dev.index, tuple(q.shape), tuple(v.shape), cu)
        tables = torch.empty(words, dtype=torch.int32, device=dev)
        buffers = torch.zeros(elems, dtype=torch.float32, device=dev)
        native.gla_backward(
            dev.index,
            torch.cuda.current_stream(dev).cuda_stream,
            _describe(q),
            _describe(k),
            _describe(v),
            _describe(g),
            None if h0 is None else _describe(h0),
            _describe(do),
            None if dht is None else _describe(dht),
            _describe(dq),
            _describe(dk_),
            _describe(dv_),
            _describe(dg),
            _describe(dh0),
            _describe(tables),
            _describe(buffers),
            scale,
            cu,
        )
    return dq, dk_, dv_, dg, dh0


@chunk_gla_backward.register_fake
def _chunk_gla_backward_fake(do, dht, q, k, v, g, scale, initial_state, cu_seqlens):
    _check(q, k, v, g, initial_state)
    batch, seqlen, heads, dk = q.shape
    n = _num_seqs(q, cu_seqlens)
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        v.new_empty(v.shape),
        q.new_empty(q.shape, dtype=torch.float32),
        q.new_empty((n, heads, dk, v.shape[-1]), dtype=torch.float32),
    )


class _ChunkGLAFunction(torch.autograd.Function):
    """The autograd node of ``chunk_gla``: saves the forward's inputs as given (g is rounded
    to bf16, as the kernels read it, again in the backward: under ``torch.compile`` a saved
    ``g.to(bfloat16)`` of a bf16 g would be the input under a second name, which PyTorch 2.11's
    Dynamo mishandles, see ``semicrf._SemiCrfFunction``); gradients in each input's dtype."""

    @staticmethod
    def forward(ctx, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, kernel):
        o, ht = chunk_gla_forward(
            q, k, v, g.to(torch.bfloat16), scale, initial_state, output_final_state, cu_seqlens,
            kernel,
        )
        ctx.save_for_backward(q, k, v, g, initial_state, cu_seqlens)
        ctx.scale = scale
        ctx.g_dtype = g.dtype
        ctx.output_final_state = output_final_state
        if not output_final_state:
            ctx.mark_non_differentiable(ht)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, h0, cu_seqlens = ctx.saved_tensors
        g16 = g.to(torch.bfloat16)
        if do is None:
            do = torch.zeros(v.shape, dtype=torch.bfloat16, device=v.device)
        if not ctx.output_final_state:
            dht = None
        dq, dk, dv, dg, dh0 = chunk_gla_backward(do, dht, q, k, v, g16, ctx.scale, h0, cu_seqlens)
        return (dq, dk, dv, dg.to(ctx.g_dtype), None, None if h0 is None else dh0,
                None, None, None)


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

    Gradients: when q, k, v, g or initial_state requires grad, o and final_state have
    gradients through the library's GLA backward (dq, dk, dv, dg and the initial states'
    gradient; ``kernel`` picks the forward's kernels only, the backward's are the baseline's).
    """
    _check(q, k, v, g, initial_state)
    if scale is not None:
        scale = float(scale)
    args = (q, k, v, g, scale, initial_state, bool(output_final_state), cu_seqlens, kernel)
    tracked = (q, k, v, g) + (() if initial_state is None else (initial_state,))
    if torch.is_grad_enabled() and any(t.requires_grad for t in tracked):
        o, ht = _ChunkGLAFunction.apply(*args)
    else:
        o, ht = chunk_gla_forward(*args)
    return o, (ht if output_final_state else None)
