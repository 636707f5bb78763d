"""Peers of the `smoke` family: cuBLAS (through torch.matmul) for the bf16 GEMM.

Usage: python3 smoke.py WORKDIR   (WORKDIR holds case*/case.json and tensors.safetensors,
written by `kbench smoke`). Writes WORKDIR/peer_rows.json.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file


def median_ms(fn, warmup=10, runs=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    n = len(times)
    return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])


def gemm(spec, t):
    a, b, ours = t["a"], t["b"], t["ours"]
    out = torch.matmul(a, b.t())
    ms = median_ms(lambda: torch.matmul(a, b.t()))
    return {
        "kernel": spec["kernel"],
        "impl": "cublas (torch.matmul)",
        "config": spec["config"],
        "median_ms": ms,
        "tflops": spec["counts"]["flops"] / (ms * 1e-3) / 1e12,
        "max_diff_vs_ours": (out.float() - ours.float()).abs().max().item(),
        "torch": torch.__version__,
    }


PEERS = {"gemm_bf16": gemm}


def main(work):
    rows = []
    for case in sorted(d for d in os.listdir(work) if d.startswith("case")):
        with open(os.path.join(work, case, "case.json")) as f:
            spec = json.load(f)
        peer = PEERS.get(spec["kernel"])
        if peer is None:
            continue
        tensors = load_file(os.path.join(work, case, "tensors.safetensors"), device="cuda")
        row = peer(spec, tensors)
        print(f"  peer {row['impl']}: {spec['kernel']} {spec['config']} {row['median_ms']:.4f} ms")
        rows.append(row)
        del tensors
        torch.cuda.empty_cache()
    with open(os.path.join(work, "peer_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
