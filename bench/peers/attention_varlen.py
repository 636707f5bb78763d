"""Peers of the `attention-varlen` family: PyTorch SDPA on nested (jagged) tensors of the
case's sequence lengths (its FLASH backend runs FlashAttention-2's varlen kernel; the padded
dense batch of a framework without one would spend most of its work on padding), and
`flash_attn_varlen_func` (FlashAttention-2 or -4, whichever `flash_attn` / `flash_attn.cute`
imports) on the packed tensors. Inputs are random tensors of the case's shapes made here (each
case carries only the boundaries `cu_seqlens`), so the rows are timings, without a difference
from our output. FLOPs come from the case. Cases of kernel `attention_varlen_fwd_bwd` time the
forward and `backward()` of its output (autograd) with a random dO.

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
        c, counts, kernel = spec["config"], spec["counts"], spec["kernel"]
        train = kernel == "attention_varlen_fwd_bwd"
        cu = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")["cu_seqlens"]
        h, d, causal, total = c["heads"], c["d"], c["causal"], c["total"]
        lens = (cu[1:] - cu[:-1]).tolist()
        g = torch.Generator(device="cuda").manual_seed(7)
        q, k, v = ((torch.rand(total, h, d, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1)
                   .requires_grad_(train) for _ in range(3))
        dout = torch.rand(total, h, d, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1
        cu32 = cu.to(torch.int32)
        peers = []

        def nested(x):
            return torch.nested.nested_tensor_from_jagged(x, cu, jagged_dim=1).transpose(1, 2)

        qn, kn, vn = nested(q), nested(k), nested(v)
        backends = [("sdpa-flash varlen (nested jagged)", SDPBackend.FLASH_ATTENTION)]
        # cuDNN's nested backward made an illegal memory access on an H200 (torch 2.11,
        # 2026-11-28), which ends every later peer: forward only.
        if not train:
            backends.append(("sdpa-cudnn varlen (nested jagged)", SDPBackend.CUDNN_ATTENTION))
        for name, backend in backends:
            def f(backend=backend):
                # A training step builds its views each call (autograd frees the graph).
                x = (nested(q), nested(k), nested(v)) if train else (qn, kn, vn)
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(*x, is_causal=causal)
            peers.append((name, f))
        for name, fn in varlen:
            # Keywords: FlashAttention-4's signature has `qv` before the boundaries.
            peers.append((name, lambda fn=fn: fn(
                q, k, v, cu_seqlens_q=cu32, cu_seqlens_k=cu32, max_seqlen_q=max(lens),
                max_seqlen_k=max(lens), causal=causal)))
        def step(f):
            def run():
                out = f()
                out = out[0] if isinstance(out, tuple) else out
                if out.is_nested:
                    out.transpose(1, 2).values().backward(dout)
                else:
                    out.backward(dout)
            return run
        for name, f in peers:
            try:
                if train:
                    run = step(f)
                    run()
                    ms = median_ms(run)
                else:
                    with torch.no_grad():
                        f()
                        ms = median_ms(f)
            except Exception as e:
                print(f"  peer {name}: {c}: not available ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
                continue
            rows.append({
                "kernel": kernel,
                "impl": name,
                "config": c,
                "median_ms": ms,
                "tflops": counts["flops"] / (ms * 1e-3) / 1e12,
                "torch": torch.__version__,
            })
            print(f"  peer {name}: {kernel} {c} {ms:.4f} ms")
        del q, k, v, qn, kn, vn
        torch.cuda.empty_cache()
    with open(os.path.join(work, "peer_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
