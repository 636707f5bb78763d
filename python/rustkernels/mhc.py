"""mHC (manifold-constrained hyper-connections): ``MHC``, an ``nn.Module`` around a transformer
block's layer, on the library's forward and backward kernels.

Per token, with the residual state ``x [B, S, n, C]`` (n streams of C channels, bf16) flattened
to ``x~`` (``K = n C`` values), ``M = n^2 + 2 n`` and the weights ``phi [K, M]``, ``gamma [K]``
(optional RMSNorm weight), ``alpha [3]``, ``bias [M]`` (float32):

- ``r = sqrt(|x~|^2 / K + eps)``, ``h~ = x~ diag(gamma) phi / r``;
- ``H_pre = sigmoid(a_pre h~_pre + b_pre)``, ``H_post = 2 sigmoid(a_post h~_post + b_post)``,
  ``H_res = SinkhornKnopp(exp(a_res h~_res + b_res))`` (``sinkhorn_iters`` row-then-column
  normalisations);
- the layer's input ``x_in = H_pre x`` ``[B, S, C]`` and, from the layer's output
  ``y [B, S, C]``, the next residual state ``x_next = H_res x + H_post^T y`` ``[B, S, n, C]``.

(The library's ``kernels::mhc::reference`` is the specification; bench/peers/mhc.py writes the
same equations in PyTorch.)

Layers, from the user down:

- ``MHC``: the weights as parameters; ``MHC.forward(x, layer)`` is ``post(x, layer(pre(x)))``;
  ``pre`` and ``post`` can be called apart (``pre`` returns the coefficients ``post`` needs).
- ``mhc_pre`` / ``mhc_post`` (``torch.autograd.Function``): the two halves as autograd nodes.
  The library's backward takes the gradients of both halves' outputs together and is linear in
  them; each node runs it with the other half's gradient zero, and autograd adds the two (the
  backward kernels run twice per step; one fused call would need both gradients in one node).
- ``torch.ops.rustkernels.mhc_forward_pre``, ``mhc_forward_post``, ``mhc_backward``: the custom
  ops, each with a fake implementation so ``torch.compile`` traces around them; they allocate
  outputs, the saved coefficients (one f32 tensor) and the scratch with torch and launch on
  torch's current stream through the Rust extension, which validates the rest (n in 2..=8, C a
  multiple of 8, shapes, iterations, eps) with the library's messages.
"""

from typing import Optional, Tuple

import torch
from torch import nn

from .attention import _describe, _native

DEFAULT_SINKHORN_ITERS = 20
DEFAULT_EPS = 1e-6


def _tensor(name: str, t, dtype, rank: int, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, x on {device}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {str(dtype).replace('torch.', '')}, got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(t.shape)}")


def _check_weights(x, phi, gamma, alpha, bias) -> None:
    _tensor("x", x, torch.bfloat16, 4)
    _tensor("phi", phi, torch.float32, 2, x.device)
    if gamma is not None:
        _tensor("gamma", gamma, torch.float32, 1, x.device)
    _tensor("alpha", alpha, torch.float32, 1, x.device)
    _tensor("bias", bias, torch.float32, 1, x.device)


def _layout(x, iters, eps, gamma: bool):
    return _native().mhc_layout(tuple(x.shape), int(iters), float(eps), gamma)


@torch.library.custom_op("rustkernels::mhc_forward_pre", mutates_args=())
def mhc_forward_pre(
    x: torch.Tensor,
    phi: torch.Tensor,
    gamma: Optional[torch.Tensor],
    alpha: torch.Tensor,
    bias: torch.Tensor,
    sinkhorn_iters: int,
    eps: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``x_in [B, S, C]`` bf16 and the coefficients (one f32 tensor, read by
    ``mhc_forward_post`` and ``mhc_backward``) from ``x [B, S, n, C]`` bf16 and the weights."""
    _check_weights(x, phi, gamma, alpha, bias)
    x = x.contiguous()
    phi, alpha, bias = phi.contiguous(), alpha.contiguous(), bias.contiguous()
    gamma = None if gamma is None else gamma.contiguous()
    n_coeffs, n_scratch = _layout(x, sinkhorn_iters, eps, gamma is not None)
    b, s, _, c = x.shape
    # Zeroed, as the scratch: the kernels leave padding between the coefficient groups
    # unwritten, and an output must not depend on what the allocator hands out.
    coeffs = torch.zeros(n_coeffs, dtype=torch.float32, device=x.device)
    scratch = torch.zeros(n_scratch, dtype=torch.float32, device=x.device)
    x_in = torch.empty((b, s, c), dtype=torch.bfloat16, device=x.device)
    native = _native()
    with torch.cuda.device(x.device):
        native.mhc_forward_pre(
            x.device.index,
            torch.cuda.current_stream(x.device).cuda_stream,
            _describe(x),
            _describe(phi),
            None if gamma is None else _describe(gamma),
            _describe(alpha),
            _describe(bias),
            _describe(scratch),
            _describe(coeffs),
            _describe(x_in),
            int(sinkhorn_iters),
            float(eps),
        )
    return x_in, coeffs


@mhc_forward_pre.register_fake
def _mhc_forward_pre_fake(x, phi, gamma, alpha, bias, sinkhorn_iters, eps):
    _check_weights(x, phi, gamma, alpha, bias)
    if all(isinstance(d, int) for d in x.shape):
        n_coeffs, _ = _layout(x, sinkhorn_iters, eps, gamma is not None)
    else:
        # Symbolic sizes: the coefficients' length is the library's (opaque) function of them.
        n_coeffs = torch.library.get_ctx().new_dynamic_size()
    b, s, _, c = x.shape
    return x.new_empty((b, s, c)), x.new_empty((n_coeffs,), dtype=torch.float32)


@torch.library.custom_op("rustkernels::mhc_forward_post", mutates_args=())
def mhc_forward_post(
    x: torch.Tensor, y: torch.Tensor, coeffs: torch.Tensor, sinkhorn_iters: int, eps: float
) -> torch.Tensor:
    """``x_next [B, S, n, C]`` bf16 from ``x``, the layer's output ``y [B, S, C]`` bf16 and the
    coefficients ``mhc_forward_pre`` gave for ``x`` (with the same iterations and eps)."""
    _tensor("x", x, torch.bfloat16, 4)
    _tensor("y", y, torch.bfloat16, 3, x.device)
    _tensor("coefficients", coeffs, torch.float32, 1, x.device)
    x, y = x.contiguous(), y.contiguous()
    x_next = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    native = _native()
    with torch.cuda.device(x.device):
        native.mhc_forward_post(
            x.device.index,
            torch.cuda.current_stream(x.device).cuda_stream,
            _describe(x),
            _describe(y),
            _describe(coeffs),
            _describe(x_next),
            int(sinkhorn_iters),
            float(eps),
        )
    return x_next


@mhc_forward_post.register_fake
def _mhc_forward_post_fake(x, y, coeffs, sinkhorn_iters, eps):
    _tensor("x", x, torch.bfloat16, 4)
    _tensor("y", y, torch.bfloat16, 3, x.device)
    return x.new_empty(x.shape)


@torch.library.custom_op("rustkernels::mhc_backward", mutates_args=())
def mhc_backward(
    x: torch.Tensor,
    y: torch.Tensor,
    coeffs: torch.Tensor,
    phi: torch.Tensor,
    gamma: Optional[torch.Tensor],
    alpha: torch.Tensor,
    bias: torch.Tensor,
    d_xin: torch.Tensor,
    d_xnext: torch.Tensor,
    sinkhorn_iters: int,
    eps: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx ``[B, S, n, C]``, dy ``[B, S, C]`` (bf16), dphi, dgamma (an empty tensor without
    gamma), dalpha, dbias (f32) of ``<d_xin, x_in> + <d_xnext, x_next>`` (bf16 gradients), from
    the forward's inputs and coefficients."""
    _check_weights(x, phi, gamma, alpha, bias)
    _tensor("y", y, torch.bfloat16, 3, x.device)
    _tensor("coefficients", coeffs, torch.float32, 1, x.device)
    _tensor("d_xin", d_xin, torch.bfloat16, 3, x.device)
    _tensor("d_xnext", d_xnext, torch.bfloat16, 4, x.device)
    x, y, d_xin, d_xnext = (t.contiguous() for t in (x, y, d_xin, d_xnext))
    phi, alpha, bias = phi.contiguous(), alpha.contiguous(), bias.contiguous()
    gamma = None if gamma is None else gamma.contiguous()
    _, n_scratch = _layout(x, sinkhorn_iters, eps, gamma is not None)
    dev = x.device
    scratch = torch.zeros(n_scratch, dtype=torch.float32, device=dev)
    dx = torch.empty(x.shape, dtype=torch.bfloat16, device=dev)
    dy = torch.empty(y.shape, dtype=torch.bfloat16, device=dev)
    dphi = torch.empty(phi.shape, dtype=torch.float32, device=dev)
    dgamma = torch.empty(phi.shape[0] if gamma is not None else 0, dtype=torch.float32, device=dev)
    dalpha = torch.empty(alpha.shape, dtype=torch.float32, device=dev)
    dbias = torch.empty(bias.shape, dtype=torch.float32, device=dev)
    native = _native()
    with torch.cuda.device(dev):
        native.mhc_backward(
            dev.index,
            torch.cuda.current_stream(dev).cuda_stream,
            _describe(x),
            _describe(y),
            _describe(phi),
            None if gamma is None else _describe(gamma),
            _describe(alpha),
            _describe(bias),
            _describe(coeffs),
            _describe(d_xin),
            _describe(d_xnext),
            _describe(scratch),
            _describe(dx),
            _describe(dy),
            _describe(dphi),
            None if gamma is None else _describe(dgamma),
            _describe(dalpha),
            _describe(dbias),
            int(sinkhorn_iters),
            float(eps),
        )
    return dx, dy, dphi, dgamma, dalpha, dbias


@mhc_backward.register_fake
def _mhc_backward_fake(x, y, coeffs, phi, gamma, alpha, bias, d_xin, d_xnext, sinkhorn_iters, eps):
    _check_weights(x, phi, gamma, alpha, bias)
    f32 = dict(dtype=torch.float32)
    return (
        x.new_empty(x.shape),
        x.new_empty(y.shape),
        x.new_empty(phi.shape, **f32),
        x.new_empty((phi.shape[0] if gamma is not None else 0,), **f32),
        x.new_empty(alpha.shape, **f32),
        x.new_empty(bias.shape, **f32),
    )


def _weight_grads(grads, gamma):
    """(dphi, dgamma or None, dalpha, dbias) of ``mhc_backward``'s outputs."""
    _, _, dphi, dgamma, dalpha, dbias = grads
    return dphi, (dgamma if gamma is not None else None), dalpha, dbias


class _MhcPre(torch.autograd.Function):
    """``x_in`` and the coefficients (not differentiable) from x and the weights."""

    @staticmethod
    def forward(ctx, x, phi, gamma, alpha, bias, iters, eps):
        x_in, coeffs = mhc_forward_pre(x, phi, gamma, alpha, bias, iters, eps)
        ctx.save_for_backward(x, phi, gamma, alpha, bias, coeffs)
        ctx.iters, ctx.eps = iters, eps
        ctx.mark_non_differentiable(coeffs)
        return x_in, coeffs

    @staticmethod
    def backward(ctx, d_xin, _):
        x, phi, gamma, alpha, bias, coeffs = ctx.saved_tensors
        b, s, _, c = x.shape
        y = x.new_zeros((b, s, c))
        grads = mhc_backward(
            x, y, coeffs, phi, gamma, alpha, bias, d_xin.to(torch.bfloat16).contiguous(),
            torch.zeros_like(x), ctx.iters, ctx.eps,
        )
        return (grads[0], *_weight_grads(grads, gamma), None, None)


class _MhcPost(torch.autograd.Function):
    """``x_next`` from x, the layer's output y, the coefficients and (for the gradients through
    the coefficients) the weights."""

    @staticmethod
    def forward(ctx, x, y, coeffs, phi, gamma, alpha, bias, iters, eps):
        x_next = mhc_forward_post(x, y, coeffs, iters, eps)
        ctx.save_for_backward(x, y, coeffs, phi, gamma, alpha, bias)
        ctx.iters, ctx.eps = iters, eps
        return x_next

    @staticmethod
    def backward(ctx, d_xnext):
        x, y, coeffs, phi, gamma, alpha, bias = ctx.saved_tensors
        grads = mhc_backward(
            x, y, coeffs, phi, gamma, alpha, bias, y.new_zeros(y.shape),
            d_xnext.to(torch.bfloat16).contiguous(), ctx.iters, ctx.eps,
        )
        return (grads[0], grads[1], None, *_weight_grads(grads, gamma), None, None)


def mhc_pre(x, phi, gamma, alpha, bias, sinkhorn_iters=DEFAULT_SINKHORN_ITERS, eps=DEFAULT_EPS):
    """``(x_in, coeffs)``: the layer's input ``[B, S, C]`` bf16 and the coefficients to hand to
    ``mhc_post`` (differentiable in x and the weights)."""
    _check_weights(x, phi, gamma, alpha, bias)
    return _MhcPre.apply(x, phi, gamma, alpha, bias, int(sinkhorn_iters), float(eps))


def mhc_post(x, y, coeffs, phi, gamma, alpha, bias, sinkhorn_iters=DEFAULT_SINKHORN_ITERS,
             eps=DEFAULT_EPS):
    """``x_next [B, S, n, C]`` bf16 from x, the layer's output y and ``mhc_pre``'s coefficients
    (with the same weights, iterations and eps); differentiable in x, y and the weights."""
    _check_weights(x, phi, gamma, alpha, bias)
    _tensor("y", y, torch.bfloat16, 3, x.device)
    return _MhcPost.apply(x, y, coeffs, phi, gamma, alpha, bias, int(sinkhorn_iters), float(eps))


class MHC(nn.Module):
    """mHC around a layer, for ``n`` residual streams of ``channels`` channels (``n`` in
    2..=8, ``channels`` a multiple of 8): ``forward(x, layer)`` with ``x [B, S, n, C]`` bf16
    returns ``x_next = H_res x + H_post^T layer(H_pre x)`` ``[B, S, n, C]`` bf16, where
    ``layer`` maps ``[B, S, C]`` bf16 to ``[B, S, C]`` bf16 (attention or MLP with its own
    norm). Parameters (float32): ``phi [n C, M]``, ``gamma [n C]`` (with
    ``rmsnorm_weight``), ``alpha [3]``, ``bias [M]``; gradients through the library's backward.

    Initialization: ``phi ~ N(0, 0.02^2)``, ``gamma = 1``, ``alpha = 0.01``, ``bias_pre = 0``
    (``H_pre`` near 1/2), ``bias_post = 0`` (``H_post`` near 1), ``bias_res`` ``RES_DIAG`` on the
    diagonal and 0 elsewhere (``H_res`` near the identity: each stream mostly keeps itself).
    """

    RES_DIAG = 4.0

    def __init__(self, n: int, channels: int, sinkhorn_iters: int = DEFAULT_SINKHORN_ITERS,
                 eps: float = DEFAULT_EPS, rmsnorm_weight: bool = True, device=None):
        super().__init__()
        self.n, self.channels = int(n), int(channels)
        self.sinkhorn_iters, self.eps = int(sinkhorn_iters), float(eps)
        k, m = self.n * self.channels, self.n * self.n + 2 * self.n
        f32 = dict(dtype=torch.float32, device=device)
        self.phi = nn.Parameter(0.02 * torch.randn(k, m, **f32))
        self.gamma = nn.Parameter(torch.ones(k, **f32)) if rmsnorm_weight else None
        self.alpha = nn.Parameter(torch.full((3,), 0.01, **f32))
        bias = torch.zeros(m, **f32)
        bias[2 * self.n:].view(self.n, self.n).diagonal().fill_(self.RES_DIAG)
        self.bias = nn.Parameter(bias)

    def _weights(self):
        return self.phi, self.gamma, self.alpha, self.bias

    def pre(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(x_in, coeffs)``: the layer's input ``[B, S, C]`` and the coefficients for
        ``post``."""
        return mhc_pre(x, *self._weights(), self.sinkhorn_iters, self.eps)

    def post(self, x: torch.Tensor, y: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
        """``x_next`` from x, the layer's output y and ``pre``'s coefficients."""
        return mhc_post(x, y, coeffs, *self._weights(), self.sinkhorn_iters, self.eps)

    def forward(self, x: torch.Tensor, layer) -> torch.Tensor:
        x_in, coeffs = self.pre(x)
        return self.post(x, layer(x_in), coeffs)

    def extra_repr(self) -> str:
        return (f"n={self.n}, channels={self.channels}, sinkhorn_iters={self.sinkhorn_iters}, "
                f"eps={self.eps}, rmsnorm_weight={self.gamma is not None}")


__all__ = ["MHC", "mhc_pre", "mhc_post", "mhc_forward_pre", "mhc_forward_post", "mhc_backward"]
