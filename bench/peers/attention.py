"""Peers of the `attention` family: PyTorch SDPA with the FLASH backend (FlashAttention-2)
and with the CUDNN backend, on the same inputs as ours (WORKDIR/shared.safetensors holds Q, K,
V flat; each case reshapes them to [batch, seq, heads, D] like ours and transposes to SDPA's
[batch, heads, seq, D] view without copying).

Usage: python3 attention.py WORKDIR. Writes WORKDIR/peer_rows.json.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.nn.attention import SDPBackend, sdpa_kernel

from smoke import median_ms

BACKENDS = [
    ("sdpa-flash (FlashAttention-2)", SDPBackend.FLASH_ATTENTION),
    ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
]


def main(work):
    shared = load_file(os.path.join(work, "shared.safetensors"), device="cuda")
    rows = []
    for case in sorted(d for d in os.listdir(work) if d.startswith("case")):
        with open(os.path.join(work, case, "case.json")) as f:
            spec = json.load(f)
        c = spec["config"]
        b, s, h, d, causal = c["batch"], c["seq"], c["heads"], c["d"], c["causal"]
        shape = (b, s, h, d)
        q, k, v = (shared[n].view(shape).transpose(1, 2) for n in ("q", "k", "v"))
        ours = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")["ours"]
        for name, backend in BACKENDS:
            try:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            except RuntimeError as e:
                print(f"  peer {name}: {c}: not available ({str(e).splitlines()[0]})")
                continue
            diff = (out.transpose(1, 2).float() - ours.float()).abs().max().item()
            rows.append({
                "kernel": spec["kernel"],
                "impl": name,
                "config": c,
                "median_ms": ms,
                "tflops": spec["counts"]["flops"] / (ms * 1e-3) / 1e12,
                "max_diff_vs_ours": diff,
                "torch": torch.__version__,
            })
            print(f"  peer {name}: {c} {ms:.4f} ms, diff vs ours {diff:.2e}")
        del ours
    with open(os.path.join(work, "peer_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
