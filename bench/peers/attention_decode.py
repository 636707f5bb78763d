"""Peers of the `attention-decode` family: PyTorch SDPA (FLASH and CUDNN backends) on each
case's contexts gathered from the paged caches into dense, padded K/V `[batch, context, heads_kv,
D]` (the gather is done once, outside the timed region: the baseline of a framework without a
paged kernel), `flash_attn_with_kvcache` with the block table when the `flash_attn` package
(FlashAttention-2) is importable, and FlashAttention-4's `flash_attn_varlen_func` on the paged
caches (`page_table`, `seqused_k`; on Hopper it has no split-KV) when `flash_attn.cute` is.

The caches are rebuilt on the GPU as ours were: WORKDIR/shared.safetensors holds the repeating
block; K is the block repeated over `cache_tokens x heads_kv x D` elements, V the same from half
a block on; pages of `page` tokens. Each case holds Q `[batch, 1, heads_q, D]`, the block table
`[batch, max_pages]` and our O. Bytes come from the case (the K and V of every context).

Usage: python3 attention_decode.py WORKDIR. Writes WORKDIR/peer_rows.json.
"""
import importlib.metadata
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.nn.attention import SDPBackend, sdpa_kernel

from smoke import median_ms

SDPA_BACKENDS = [
    ("sdpa-flash (FlashAttention-2)", SDPBackend.FLASH_ATTENTION),
    ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
]


def caches(block, tokens, heads_kv, d, page):
    n = tokens * heads_kv * d
    reps = -(-n // block.numel())
    k = block.repeat(reps)[:n]
    v = torch.roll(block, -(block.numel() // 2)).repeat(reps)[:n]
    shape = (tokens // page, page, heads_kv, d)
    return k.view(shape), v.view(shape)


def main(work):
    block = load_file(os.path.join(work, "shared.safetensors"), device="cuda")["block"]
    cases = sorted(d for d in os.listdir(work) if d.startswith("case"))
    k_cache = v_cache = None
    try:
        from flash_attn import flash_attn_with_kvcache
    except Exception as e:
        print(f"  peer flash_attn_with_kvcache: not available ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        flash_attn_with_kvcache = None
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4_varlen
        fa4_name = f"fa4 {importlib.metadata.version('flash-attn-4')} (paged)"
    except Exception as e:
        print(f"  peer fa4: not available ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        fa4_varlen = None
    rows = []
    for case in cases:
        with open(os.path.join(work, case, "case.json")) as f:
            spec = json.load(f)
        c, counts = spec["config"], spec["counts"]
        b, ctx, hq, hkv, d, page = (c[n] for n in ("batch", "context", "heads_q", "heads_kv", "d", "page"))
        if k_cache is None:
            k_cache, v_cache = caches(block, counts["cache_tokens"], hkv, d, page)
        t = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")
        q, table, ours = t["q"], t["block_table"], t["ours"]
        pages = ctx // page
        # Dense contexts [b, ctx, hkv, d] gathered from the pages (not timed).
        k = k_cache[table[:, :pages]].reshape(b, ctx, hkv, d)
        v = v_cache[table[:, :pages]].reshape(b, ctx, hkv, d)
        peers = []
        for name, backend in SDPA_BACKENDS:
            def f(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        enable_gqa=True).transpose(1, 2)
            peers.append((name, f))
        seqlens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
        table32 = table.to(torch.int32).contiguous()
        if flash_attn_with_kvcache is not None:
            peers.append(("flash_attn_with_kvcache (paged)", lambda: flash_attn_with_kvcache(
                q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table32)))
        if fa4_varlen is not None:
            def fa4_step(q=q, seqlens=seqlens, table32=table32, ctx=ctx):
                out = fa4_varlen(q, k_cache, v_cache, seqused_k=seqlens, page_table=table32,
                                 max_seqlen_k=ctx)
                return out[0] if isinstance(out, tuple) else out
            peers.append((fa4_name, fa4_step))
        for name, f in peers:
            try:
                with torch.no_grad():
                    got = f()
                    ms = median_ms(f)
            except Exception as e:
                print(f"  peer {name}: {c}: not available ({str(e).splitlines()[0]})")
                continue
            diff = (got.float() - ours.float()).abs().max().item()
            rows.append({
                "kernel": "attention_decode",
                "impl": name,
                "config": c,
                "median_ms": ms,
                "gbps": counts["bytes"] / (ms * 1e-3) / 1e9,
                "max_diff_vs_ours": diff,
                "torch": torch.__version__,
            })
            print(f"  peer {name}: attention_decode {c} {ms:.4f} ms, diff vs ours {diff:.2e}")
        del k, v, t
        torch.cuda.empty_cache()
    with open(os.path.join(work, "peer_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
