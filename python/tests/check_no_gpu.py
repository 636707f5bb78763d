"""What the rustkernels wheel can show on a machine without a GPU (CI): the package and its
native extension import, every custom op is registered with torch, and every public entry point
refuses tensors off the GPU with a ValueError that names the tensor, before any launch.

Usage (the wheel installed on sys.path, the CUDA driver library loadable; `./x wheel` runs it):
    python3 check_no_gpu.py
Prints one line per check and 'N passed, N failed' last; exits 1 on any failure.
"""

import sys

import torch

import rustkernels
from rustkernels import (
    MHC,
    chunk_gla,
    flash_attn_fp8_func,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    semi_crf_streaming_forward,
)

OPS = [
    "chunk_gla_backward",
    "chunk_gla_forward",
    "flash_attn_backward",
    "flash_attn_decode",
    "flash_attn_forward",
    "flash_attn_fp8_forward",
    "flash_attn_varlen_backward",
    "flash_attn_varlen_forward",
    "kv_append",
    "mhc_backward",
    "mhc_forward_post",
    "mhc_forward_pre",
    "semicrf_backward",
    "semicrf_forward",
    "semicrf_viterbi",
]

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def refuses_cpu(name, fn, tensor):
    """`fn()` raises ValueError saying that `tensor` must be a CUDA tensor."""
    try:
        fn()
    except ValueError as e:
        want = f"{tensor} must be a CUDA tensor"
        check(name, want in str(e), str(e))
    except Exception as e:  # noqa: BLE001 - any other outcome is the failure reported
        check(name, False, f"{type(e).__name__}: {e}")
    else:
        check(name, False, "no error")


def main():
    import importlib

    native = importlib.import_module("rustkernels._native")
    check("native extension imported", native.__file__.endswith(".abi3.so"), native.__file__)
    registered = [op for op in OPS if hasattr(torch.ops.rustkernels, op)]
    missing = ", ".join(sorted(set(OPS) - set(registered)))
    check(f"{len(OPS)} custom ops registered", registered == OPS, missing)

    bf = torch.bfloat16
    q = torch.randn(1, 8, 4, 64, dtype=bf)
    kv = torch.randn(1, 8, 2, 64, dtype=bf)
    refuses_cpu("flash_attn_func on CPU tensors", lambda: flash_attn_func(q, kv, kv, causal=True), "q")
    f8 = torch.float8_e4m3fn
    refuses_cpu(
        "flash_attn_fp8_func on CPU tensors",
        lambda: flash_attn_fp8_func(q.to(f8), kv.to(f8), kv.to(f8), causal=True),
        "q",
    )
    packed = torch.randn(8, 4, 64, dtype=bf)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    refuses_cpu(
        "flash_attn_varlen_func on CPU tensors",
        lambda: flash_attn_varlen_func(packed, packed[:, :2], packed[:, :2], cu, cu, 5, 5),
        "q",
    )
    cache = torch.randn(4, 16, 2, 64, dtype=bf)
    refuses_cpu(
        "flash_attn_with_kvcache on CPU tensors",
        lambda: flash_attn_with_kvcache(
            q[:, :1], cache, cache,
            cache_seqlens=torch.tensor([20], dtype=torch.int32),
            block_table=torch.tensor([[0, 1]], dtype=torch.int32),
        ),
        "q",
    )
    g = torch.randn(1, 8, 2, 64)
    refuses_cpu("chunk_gla on CPU tensors", lambda: chunk_gla(g, g, g, -g.abs()), "q")
    refuses_cpu(
        "semi_crf_streaming_forward on CPU tensors",
        lambda: semi_crf_streaming_forward(
            torch.randn(2, 11, 4), torch.randn(4, 4), torch.randn(3, 4), torch.tensor([10, 10]), 3
        ),
        "cum_scores",
    )
    check("MHC is an nn.Module", issubclass(MHC, torch.nn.Module))

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
