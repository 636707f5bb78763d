"""PyTorch ops backed by the pure-Rust GPU kernels of this project.

- ``flash_attn_func(q, k, v, ...)``: attention with flash-attn's signature, layout
  ``[batch, seqlen, nheads, headdim]`` and masking semantics; differentiable (the backward
  kernels through ``torch.autograd``, ``deterministic=True`` for bitwise reproducible
  gradients).
- ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
  ...)``: the same over packed sequences of different lengths (flash-attn's varlen signature,
  layout ``[total, nheads, headdim]``, int32 boundaries), differentiable.
- ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., block_table=..., ...)``: a
  decode step over a paged KV cache (flash-attn's signature and paged layout; inference only).
- ``flash_attn_fp8_func(q, k, v, q_descale, k_descale, v_descale, ...)``: the FP8 forward on
  Hopper GPUs (``float8_e4m3fn`` inputs with per-tensor descales, bf16 out; inference only).
- ``gla.chunk_gla(q, k, v, g, ...)``: gated linear attention with flash-linear-attention's
  signature and layout ``[B, T, H, D]``, returning ``(o, final_state)``; differentiable (the
  library's GLA backward).
- ``semicrf.semi_crf_streaming_forward(cum_scores, transition, duration_bias, lengths, K)``:
  flash-semicrf's semi-Markov CRF log partition (differentiable) or Viterbi score;
  ``semicrf.semi_crf_viterbi`` gives the best segmentations.
- ``mhc.MHC(n, channels)``: mHC (manifold-constrained hyper-connections) as an ``nn.Module``
  around a transformer block's layer, ``block(x, layer)`` with ``x [B, S, n, C]``;
  differentiable (the library's mHC backward); ``mhc.mhc_pre`` / ``mhc.mhc_post`` are its two
  halves.

The ops take CUDA tensors as they are (no copies where the kernels' layout allows), run on
torch's current stream of the tensors' device, and return tensors from torch's caching
allocator. Each op is a ``torch.library`` custom op (``torch.ops.rustkernels.*``) with a fake
implementation, so ``torch.compile`` traces around it.
"""

from . import gla, mhc, semicrf
from .attention import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from .attention_fp8 import flash_attn_fp8_func
from .gla import chunk_gla
from .mhc import MHC
from .semicrf import semi_crf_streaming_forward, semi_crf_viterbi

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_fp8_func",
    "chunk_gla",
    "MHC",
    "semi_crf_streaming_forward",
    "semi_crf_viterbi",
    "gla",
    "mhc",
    "semicrf",
]
