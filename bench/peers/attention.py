"""Peers of the `attention` family on the same inputs as ours: PyTorch SDPA with the FLASH
backend (FlashAttention-2) and with the CUDNN backend, and FlashAttention-4 (`flash_attn.cute`)
when it is importable (shared/PEERS.md says how to bring it).

WORKDIR/shared.safetensors holds Q, K, V (and dO for the backward cases) flat; each case reshapes
them to [batch, seq, heads, D] like ours (SDPA gets its [batch, heads, seq, D] view by a
transpose, without copying). Case kinds (`kernel` in case.json):
- `attention_fwd`: the forward, compared with ours (`ours` = O);
- `attention_bwd`: the backward alone (the graph of one forward kept, gradients taken again
  and again), compared with ours (`dq`, `dk`, `dv`);
- `attention_fwd_bwd`: forward and backward together, as a training step runs them.
FLOPs come from the case (the backward counts 2.5x the forward, as FlashAttention does).

Usage: python3 attention.py WORKDIR. Writes WORKDIR/peer_rows.json.
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


def sdpa(backend):
    """`f(q, k, v, causal) -> O` in our layout through SDPA with one backend."""

    def f(q, k, v, causal):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)

    return f


def fa4():
    """FlashAttention-4 as `(name, f)`, or None when it is not installed."""
    try:
        from flash_attn.cute import flash_attn_func
        version = importlib.metadata.version("flash-attn-4")
    except Exception as e:  # not installed, or its dependencies are missing
        print(f"  peer fa4: not available ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        return None

    def f(q, k, v, causal):
        out = flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    return (f"fa4 {version}", f)


def time_case(kind, f, q, k, v, do, causal):
    """Median milliseconds of one case kind, and the results to compare with ours."""
    if kind == "attention_fwd":
        with torch.no_grad():
            out = f(q, k, v, causal)
            ms = median_ms(lambda: f(q, k, v, causal))
        return ms, {"ours": out}
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    if kind == "attention_bwd":
        out = f(*leaves, causal)
        grads = torch.autograd.grad(out, leaves, do, retain_graph=True)
        ms = median_ms(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
    else:
        grads = torch.autograd.grad(f(*leaves, causal), leaves, do)
        ms = median_ms(lambda: torch.autograd.grad(f(*leaves, causal), leaves, do))
    return ms, dict(zip(("dq", "dk", "dv"), grads))


def main(work):
    shared = load_file(os.path.join(work, "shared.safetensors"), device="cuda")
    peers = [(name, sdpa(backend)) for name, backend in SDPA_BACKENDS]
    four = fa4()
    if four is not None:
        peers.append(four)
    rows = []
    for case in sorted(d for d in os.listdir(work) if d.startswith("case")):
        with open(os.path.join(work, case, "case.json")) as f:
            spec = json.load(f)
        kind, c = spec["kernel"], spec["config"]
        b, s, h, d, causal = c["batch"], c["seq"], c["heads"], c["d"], c["causal"]
        hk = c.get("heads_kv", h)
        dv = c.get("dv", d)  # V's head dimension where it differs from Q's and K's
        q = shared["q"][: b * s * h * d].view(b, s, h, d)
        k = shared["k"][: b * s * hk * d].view(b, s, hk, d)
        v = shared["v"][: b * s * hk * dv].view(b, s, hk, dv)
        do = shared["do"][: b * s * h * dv].view(b, s, h, dv) if "do" in shared else None
        ours = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")
        for name, f in peers:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                ms, got = time_case(kind, f, q, k, v, do, causal)
            except Exception as e:  # a backend that refuses the shape, or runs out of memory
                print(f"  peer {name}: {kind} {c}: not available ({str(e).splitlines()[0]})")
                torch.cuda.empty_cache()
                continue
            # Device memory the peer allocated beyond what was live before it (inputs, ours).
            peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
            diff = max((got[n].float() - ours[n].float()).abs().max().item() for n in got)
            rows.append({
                "kernel": kind,
                "impl": name,
                "config": c,
                "median_ms": ms,
                "tflops": spec["counts"]["flops"] / (ms * 1e-3) / 1e12,
                "max_diff_vs_ours": diff,
                "torch": torch.__version__,
                "peak_extra_mib": peak_mib,
            })
            print(f"  peer {name}: {kind} {c} {ms:.4f} ms, diff vs ours {diff:.2e}")
            del got
        del ours
        torch.cuda.empty_cache()
    with open(os.path.join(work, "peer_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
