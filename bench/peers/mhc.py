"""Peers of the `mhc` family: PyTorch eager and torch.compile of the same equations.

Usage: python3 mhc.py WORKDIR   (WORKDIR holds case*/case.json and tensors.safetensors, written
by `kbench mhc`: the inputs and every output of ours). Writes WORKDIR/peer_rows.json.

The equations are those of `host/src/mhc/reference.rs` (the specification), written as a
PyTorch user would: f32 math on the bf16 activations, bf16 outputs, autograd for the backward.
`exp(z - rowmax z)` is `exp(z)` up to a per-row factor that the first row normalisation removes
(the shift is detached: its total gradient is zero), so the result is the same function.

Rows: `mhc_fwd` (x_in and x_next from x and y), `mhc_bwd` (autograd of both, retained graph) and
`mhc_fwd_bwd`, for `torch eager` and `torch.compile`, timed like ours (CUDA events, median of 50
after 10 warm-up runs), with the same byte counts (case.json `counts`), the difference from every
output of ours (`diff_<name>`, max |peer - ours|; `max_diff_vs_ours` is the largest), and the
fraction of the copy bandwidth measured in the same run.
"""
import json
import os
import sys
import traceback

import torch
from safetensors.torch import load_file

from smoke import median_ms


def mhc_forward(x, y, phi, gamma, alpha, bias, iters: int, eps: float):
    """x [B, S, n, C] bf16, y [B, S, C] bf16 -> x_in [B, S, C], x_next [B, S, n, C] (bf16)."""
    b, s, n, c = x.shape
    xf = x.float()
    flat = xf.reshape(b, s, n * c)
    r = torch.sqrt(flat.square().mean(-1, keepdim=True) + eps)
    w = phi if gamma is None else gamma[:, None] * phi
    h = (flat @ w) / r
    h_pre = torch.sigmoid(alpha[0] * h[..., :n] + bias[:n])
    h_post = 2.0 * torch.sigmoid(alpha[1] * h[..., n:2 * n] + bias[n:2 * n])
    z = (alpha[2] * h[..., 2 * n:] + bias[2 * n:]).reshape(b, s, n, n)
    p = torch.exp(z - z.amax(-1, keepdim=True).detach())
    for _ in range(iters):
        p = p / p.sum(-1, keepdim=True)
        p = p / p.sum(-2, keepdim=True)
    x_in = (h_pre.unsqueeze(-1) * xf).sum(-2)
    x_next = torch.matmul(p, xf) + h_post.unsqueeze(-1) * y.float().unsqueeze(-2)
    return x_in.to(torch.bfloat16), x_next.to(torch.bfloat16)


def max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def run_case(spec, t):
    cfg, counts = spec["config"], spec["counts"]
    iters, eps = int(cfg["t_max"]), float(counts["eps"])
    copy_gbps = counts["copy_gbps"]
    gamma = t.get("gamma")
    names = ["x", "y", "phi", "alpha", "bias"] + (["gamma"] if gamma is not None else [])
    grad_out = (t["d_xin"], t["d_xnext"])
    ours_grads = {"x": t["ours_dx"], "y": t["ours_dy"], "phi": t["ours_dphi"], "alpha": t["ours_dalpha"],
                  "bias": t["ours_dbias"], "gamma": t.get("ours_dgamma")}
    rows = []

    def row(kernel, impl, ms, nbytes, diffs):
        gbps = nbytes / (ms * 1e-3) / 1e9
        r = {"kernel": kernel, "impl": impl, "config": cfg, "median_ms": ms, "gbps": gbps,
             "max_diff_vs_ours": max(diffs.values()), "pct_of_copy": round(1000.0 * gbps / copy_gbps) / 10.0,
             "torch": torch.__version__}
        r.update({f"diff_{k}": v for k, v in diffs.items()})
        print(f"  peer {impl}: {kernel} {ms:.4f} ms {gbps:.0f} GB/s max diff vs ours {r['max_diff_vs_ours']:.3e}")
        rows.append(r)

    for impl, fn in [("torch eager", mhc_forward), ("torch.compile", torch.compile(mhc_forward))]:
        try:
            def call(*args):
                return fn(*args, iters, eps)

            inputs = [t["x"], t["y"], t["phi"], gamma, t["alpha"], t["bias"]]
            with torch.no_grad():
                x_in, x_next = call(*inputs)
                diffs = {"x_in": max_diff(x_in, t["ours_x_in"]), "x_next": max_diff(x_next, t["ours_x_next"])}
                del x_in, x_next
                ms = median_ms(lambda: call(*inputs))
            row("mhc_fwd", impl, ms, counts["fwd_bytes"], diffs)

            leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
            args = [leaves["x"], leaves["y"], leaves["phi"], leaves.get("gamma"), leaves["alpha"], leaves["bias"]]
            order = [leaves[k] for k in names]

            def fwd_bwd():
                return torch.autograd.grad(call(*args), order, grad_out)

            grads = dict(zip(names, fwd_bwd()))
            diffs = {f"d{k}": max_diff(grads[k], ours_grads[k]) for k in names}
            out = call(*args)
            diffs["x_in"] = max_diff(out[0], t["ours_x_in"])
            diffs["x_next"] = max_diff(out[1], t["ours_x_next"])
            del grads
            ms = median_ms(fwd_bwd)
            row("mhc_fwd_bwd", impl, ms, counts["fwd_bytes"] + counts["bwd_bytes"], diffs)
            try:
                ms = median_ms(lambda: torch.autograd.grad(out, order, grad_out, retain_graph=True))
                row("mhc_bwd", impl, ms, counts["bwd_bytes"], {k: v for k, v in diffs.items() if k.startswith("d")})
            except Exception as e:  # a retained-graph backward is not supported everywhere
                print(f"  peer {impl}: backward alone not timed: {e}")
            del out
        except Exception:
            traceback.print_exc()
            print(f"  peer {impl} failed; its rows are missing")
        torch.cuda.empty_cache()
    return rows


def main(work):
    rows = []
    for case in sorted(d for d in os.listdir(work) if d.startswith("case")):
        with open(os.path.join(work, case, "case.json")) as f:
            spec = json.load(f)
        if spec["kernel"] != "mhc":
            continue
        tensors = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")
        rows.extend(run_case(spec, tensors))
        del tensors
        torch.cuda.empty_cache()
    with open(os.path.join(work, "peer_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
