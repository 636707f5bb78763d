"""Peers of the `attention-varlen` family: PyTorch SDPA on nested (jagged) tensors of the
case's sequence lengths (its FLASH backend runs FlashAttention-2's varlen kernel; the padded
dense batch of a framework without one would spend most of its work on padding), and
`flash_attn_varlen_func` (FlashAttention-2 or -4, whichever `flash_attn` / `flash_attn.cute`
imports) on the packed tensors. Inputs are random tensors of the case's shapes made here (each
case carries only the boundaries `cu_seqlens`), so the rows are timings, without a difference
from our output. FLOPs come from the case.

Usage: python3 attention_varlen.py WORKDIR. Writes WORKDIR/peer_rows.json.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.nn.attention import SDPBackend, sdpa_kernel

from smoke import median_ms


def main(work):
    cases = sorted(d for d in os.listdir(work) if d.startswith("case"))
    varlen = []
    try:
        from flash_attn import flash_attn_varlen_func as fa2
        varlen.append(("flash_attn_varlen_func (FlashAttention-2)", fa2))
    except Exception as e:
        print(f"  peer flash_attn (FlashAttention-2): not available ({type(e).__name__})")
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4
        varlen.append(("flash_attn_varlen_func (FlashAttention-4)", fa4))
    except Exception as e:
        print(f"  peer flash_attn.cute (FlashAttention-4): not available ({type(e).__name__})")
    rows = []
    for case in cases:
        with open(os.path.join(work, case, "case.json")) as f:
            spec = json.load(f)
        c, counts = spec["config"], spec["counts"]
        cu = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")["cu_seqlens"]
        h, d, causal, total = c["heads"], c["d"], c["causal"], c["total"]
        lens = (cu[1:] - cu[:-1]).tolist()
        g = torch.Generator(device="cuda").manual_seed(7)
        q, k, v = (torch.rand(total, h, d, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1
                   for _ in range(3))
        cu32 = cu.to(torch.int32)
        peers = []

        def nested(x):
            return torch.nested.nested_tensor_from_jagged(x, cu, jagged_dim=1).transpose(1, 2)

        qn, kn, vn = nested(q), nested(k), nested(v)
        for name, backend in (("sdpa-flash varlen (nested jagged)", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-cudnn varlen (nested jagged)", SDPBackend.CUDNN_ATTENTION)):
            def f(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal)
            peers.append((name, f))
        for name, fn in varlen:
            # Keywords: FlashAttention-4's signature has `qv` before the boundaries.
            peers.append((name, lambda fn=fn: fn(
                q, k, v, cu_seqlens_q=cu32, cu_seqlens_k=cu32, max_seqlen_q=max(lens),
                max_seqlen_k=max(lens), causal=causal)))
        for name, f in peers:
            try:
                with torch.no_grad():
                    f()
                    ms = median_ms(f)
            except Exception as e:
                print(f"  peer {name}: {c}: not available ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
                continue
            rows.append({
                "kernel": "attention_varlen_fwd",
                "impl": name,
                "config": c,
                "median_ms": ms,
                "tflops": counts["flops"] / (ms * 1e-3) / 1e12,
                "torch": torch.__version__,
            })
            print(f"  peer {name}: attention_varlen_fwd {c} {ms:.4f} ms")
        del q, k, v, qn, kn, vn
        torch.cuda.empty_cache()
    with open(os.path.join(work, "peer_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
