"""PyTorch ops backed by the pure-Rust GPU kernels of this project.

- ``flash_attn_func(q, k, v, ...)``: attention with flash-attn's signature, layout
  ``[batch, seqlen, nheads, headdim]`` and masking semantics; differentiable (the backward
  kernels through ``torch.autograd``, ``deterministic=True`` for bitwise reproducible
  gradients).

The ops take CUDA tensors as they are (no copies, no host synchronization), run on torch's
current stream of the tensors' device, and return tensors from torch's caching allocator. Each op
is a ``torch.library`` custom op (``torch.ops.rustkernels.flash_attn_forward``,
``torch.ops.rustkernels.flash_attn_backward``) with a fake implementation, so ``torch.compile``
traces around it, forward and backward.
"""

from .attention import flash_attn_func

__all__ = ["flash_attn_func"]
