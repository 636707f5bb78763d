"""Peers of the `gla` family, on the inputs `kbench gla` wrote (WORKDIR/shared.safetensors holds
q, k, v, g flat in bf16; each case takes the prefix of B T H D elements as [B, T, H, D], like
ours):

- flash-linear-attention's `chunk_gla` (fla-core 0.6.0, Triton): `chunk_gla(q, k, v, g)`, its
  defaults (scale D^-0.5, no initial state, no final state), the same layout and semantics as
  ours;
- a PyTorch chunked reference (f32, chunks of 64 tokens: intra-chunk scores through the explicit
  [B, H, C, C, D] decay tensor, so it is exact for any decay; inter-chunk through the state).

Each row records `max_diff_vs_ours` (max |peer - ours| over the outputs) and `rel_l2_vs_ours`.
Cases `gla_fwd_bwd` (training steps): fla's forward + backward through autograd (every
gradient, `dO` from the shared `do`), its gradients compared with ours (`rel_l2_vs_ours_<grad>`).
Usage: python3 gla.py WORKDIR. Writes WORKDIR/peer_rows.json. fla must be importable (its wheel
and `packaging`'s installed with `pip install --no-index --no-deps --target DIR` and
`PYTHONPATH=DIR`); a peer that cannot be imported or run is recorded as a note.
"""
import json
import os
import sys
import traceback

import torch
from safetensors.torch import load_file

from smoke import median_ms

CHUNK = 64


def torch_chunked_gla(q, k, v, g, scale):
    """o = chunked GLA forward in f32 (see the module docstring); inputs [B, T, H, D]."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    q, k, v, g = (x.float().transpose(1, 2) for x in (q, k, v, g))  # [B, H, T, D]
    S = q.new_zeros(B, H, K, V)
    o = q.new_empty(B, H, T, V)
    mask = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device))
    for s in range(0, T, CHUNK):
        e = min(s + CHUNK, T)
        c = e - s
        qc, kc, vc, gc = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], g[:, :, s:e]
        b = gc.cumsum(2)  # [B, H, c, K], inclusive
        diff = b[:, :, :, None, :] - b[:, :, None, :, :]  # [B, H, c, c, K]: b_i - b_j
        diff = diff.masked_fill(~mask[:c, :c, None], float("-inf"))
        A = (qc[:, :, :, None, :] * kc[:, :, None, :, :] * diff.exp()).sum(-1)
        o[:, :, s:e] = scale * (A @ vc + (qc * b.exp()) @ S)
        last = b[:, :, -1:]  # [B, H, 1, K]
        S = S * last.transpose(2, 3).exp() + (kc * (last - b).exp()).transpose(2, 3) @ vc
    return o.transpose(1, 2).to(torch.bfloat16)


def fwd_bwd_row(work, case, spec, inputs, d_o_flat, chunk_gla, fla_version, rows, notes):
    """fla's chunk_gla forward + backward through autograd (every gradient), timed together,
    compared with our gradients (`ours_dq`, `ours_dk`, `ours_dv`, `ours_dg` of the case)."""
    c = spec["config"]
    B, T, H, dv = c["B"], c["T"], c["H"], c["dv"]
    d_o = d_o_flat[: B * T * H * dv].view(B, T, H, dv)
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]

    def step():
        o = chunk_gla(*leaves)[0]
        return torch.autograd.grad(o, leaves, d_o)

    name = f"fla chunk_gla {fla_version}"
    try:
        # The first calls autotune fla's Triton kernels (minutes): outside the timed runs.
        grads = step()
        ms = median_ms(step, warmup=10, runs=50)
    except Exception as e:  # noqa: BLE001 - recorded as a note, the other rows go on
        traceback.print_exc()
        notes.append(f"{name} fwd+bwd failed on {c}: {type(e).__name__}: {str(e).splitlines()[0]}")
        return
    ours = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")
    row = {"kernel": "gla_fwd_bwd", "impl": name, "config": c, "median_ms": ms, "fla": fla_version,
           "torch": torch.__version__}
    counts = spec["counts"]
    row["tflops"] = counts["flops"] / (ms * 1e-3) / 1e12
    row["tokens_per_s"] = counts["tokens"] / (ms * 1e-3)
    worst = 0.0
    for n, got in zip(("dq", "dk", "dv", "dg"), grads):
        mine = ours[f"ours_{n}"].float()
        d = got.float() - mine
        row[f"rel_l2_vs_ours_{n}"] = (d.norm() / mine.norm().clamp_min(1e-30)).item()
        worst = max(worst, d.abs().max().item())
    row["max_diff_vs_ours"] = worst
    rows.append(row)
    print(f"  peer {name}: fwd+bwd {c} {ms:.4f} ms, rel L2 vs ours "
          + ", ".join(f"{n} {row[f'rel_l2_vs_ours_{n}']:.2e}" for n in ("dq", "dk", "dv", "dg")),
          flush=True)


def main(work):
    shared = load_file(os.path.join(work, "shared.safetensors"), device="cuda")
    rows, notes = [], []
    try:
        from fla.ops.gla import chunk_gla
        import fla
        fla_version = getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001 - any import failure makes the peer unavailable
        chunk_gla = None
        notes.append(f"fla chunk_gla not available: {type(e).__name__}: {e}")
    for case in sorted(d for d in os.listdir(work) if d.startswith("case")):
        with open(os.path.join(work, case, "case.json")) as f:
            spec = json.load(f)
        c = spec["config"]
        B, T, H, dk, dv = c["B"], c["T"], c["H"], c["dk"], c["dv"]
        q, k, g = (shared[n][: B * T * H * dk].view(B, T, H, dk) for n in ("q", "k", "g"))
        v = shared["v"][: B * T * H * dv].view(B, T, H, dv)
        if spec["kernel"] == "gla_fwd_bwd":
            if chunk_gla is not None:
                fwd_bwd_row(work, case, spec, (q, k, v, g), shared["do"], chunk_gla, fla_version,
                            rows, notes)
            continue
        ours = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")["ours"]
        scale = dk ** -0.5
        peers = [("torch-chunked (f32, C=64)", lambda: torch_chunked_gla(q, k, v, g, scale), {})]
        if chunk_gla is not None:
            peers.insert(0, (f"fla chunk_gla {fla_version}", lambda: chunk_gla(q, k, v, g)[0],
                             {"fla": fla_version}))
        for name, fn, extra in peers:
            try:
                out = fn()
                ms = median_ms(fn, warmup=3 if "torch" in name else 10,
                               runs=10 if "torch" in name else 50)
            except Exception as e:  # noqa: BLE001 - recorded as a note, the other rows go on
                traceback.print_exc()
                notes.append(f"{name} failed on {c}: {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            d = (out.float() - ours.float())
            diff = d.abs().max().item()
            rel = (d.norm() / ours.float().norm().clamp_min(1e-30)).item()
            counts = spec["counts"]
            row = {
                "kernel": spec["kernel"],
                "impl": name,
                "config": c,
                "median_ms": ms,
                "tflops": counts["flops"] / (ms * 1e-3) / 1e12,
                "gbps": counts["bytes"] / (ms * 1e-3) / 1e9,
                "tokens_per_s": counts["tokens"] / (ms * 1e-3),
                "max_diff_vs_ours": diff,
                "rel_l2_vs_ours": rel,
                "torch": torch.__version__,
            }
            row.update(extra)
            rows.append(row)
            print(f"  peer {name}: {c} {ms:.4f} ms, diff vs ours {diff:.2e} (rel L2 {rel:.2e})",
                  flush=True)
            del out
        del ours
    for n in notes:
        rows.append({"kernel": "note", "impl": "peers", "config": {}, "median_ms": 0.0, "note": n})
    with open(os.path.join(work, "peer_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
