"""Soak and concurrency through the Python layer: 10,000 calls of ``flash_attn_func`` with random
valid and invalid arguments from 4 threads, each on its own CUDA stream. Valid calls are checked
against a float64 PyTorch reference (FlashAttention's rule: at most 2x the error of the same
computation in bf16, plus 1e-3), some with a backward; invalid ones must raise ValueError or
TypeError. Afterwards torch's allocated device memory must be back where it started.

Usage: python3 soak.py [--calls N]; prints one summary line, exits 1 on any failure.
"""

import argparse
import random
import sys
import threading

import torch


def reference(q, k, v, causal, window_left, dtype):
    """softmax(scale q k^T + mask) v in `dtype`, q ``[B, Sq, H, D]``, k, v ``[B, Sk, Hkv, D]``;
    causal and window aligned bottom-right as flash-attn; rows with no key give 0."""
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qf, kf, vf = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    kf = kf.repeat_interleave(h // hkv, dim=1)
    vf = vf.repeat_interleave(h // hkv, dim=1)
    s = (qf * d ** -0.5) @ kf.transpose(-1, -2)
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= j <= i
    if window_left is not None:
        allowed &= j >= i - window_left
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ vf).transpose(1, 2)


def worker(tid, calls, results):
    from rustkernels import flash_attn_func

    rng = random.Random(1000 + tid)
    stream = torch.cuda.Stream()
    counts = {"forward": 0, "backward": 0, "refused": 0, "worst": 0.0}
    try:
        with torch.cuda.stream(stream):
            for _ in range(calls):
                b, sq, sk = rng.randint(1, 2), rng.randint(1, 64), rng.randint(1, 64)
                hkv = rng.randint(1, 2)
                h = hkv * rng.randint(1, 2)
                d = rng.choice([64, 128])
                causal = rng.random() < 0.5
                left = rng.randint(0, 20) if rng.random() < 0.3 else None
                kind = rng.randrange(10)
                g = torch.Generator(device="cuda").manual_seed(rng.randrange(1 << 30))
                mk = lambda *s: (torch.rand(*s, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)  # noqa: E731
                q, k, v = mk(b, sq, h, d), mk(b, sk, hkv, d), mk(b, sk, hkv, d)
                window = (left if left is not None else -1, -1)
                if kind < 9:
                    grad = kind == 8
                    if grad:
                        q.requires_grad_(True)
                    out = flash_attn_func(q, k, v, causal=causal, window_size=window)
                    want = reference(q.detach(), k, v, causal, left, torch.float64)
                    naive = reference(q.detach(), k, v, causal, left, torch.bfloat16).double()
                    tol = 2 * (naive - want).abs().max().item() + 1e-3
                    err = (out.detach().double() - want).abs().max().item()
                    if not err <= tol:
                        raise AssertionError(f"O error {err:.3e} > tol {tol:.3e}")
                    counts["worst"] = max(counts["worst"], err / tol)
                    if grad:
                        do = mk(b, sq, h, d)
                        (dq,) = torch.autograd.grad(out, q, do)
                        q64 = q.detach().double().requires_grad_(True)
                        (want_dq,) = torch.autograd.grad(
                            reference(q64, k, v, causal, left, torch.float64), q64, do.double()
                        )
                        qb = q.detach().clone().requires_grad_(True)
                        (naive_dq,) = torch.autograd.grad(
                            reference(qb, k, v, causal, left, torch.bfloat16), qb, do
                        )
                        # FlashAttention's rule, plus a floor scaled to the inputs (a dQ that
                        # is exactly 0 in f64, as with one allowed key, is ~1e-7 in f32).
                        floor = 1e-6 * do.abs().max().item() * v.abs().max().item() * max(
                            q.abs().max().item(), k.abs().max().item()
                        )
                        tol = 2 * (naive_dq.double() - want_dq).abs().max().item() + floor
                        err = (dq.double() - want_dq).abs().max().item()
                        if not err <= tol:
                            raise AssertionError(f"dQ error {err:.3e} > tol {tol:.3e}")
                        counts["backward"] += 1
                    else:
                        counts["forward"] += 1
                else:
                    bad = rng.randrange(4)
                    try:
                        if bad == 0:
                            flash_attn_func(q.cpu(), k.cpu(), v.cpu())
                        elif bad == 1:
                            flash_attn_func(q.float(), k.float(), v.float())
                        elif bad == 2:
                            flash_attn_func(q[..., :48].contiguous(), k[..., :48].contiguous(), v[..., :48].contiguous())
                        else:
                            flash_attn_func(q, k[:, :, :, : d // 2].contiguous(), v)
                    except (ValueError, TypeError):
                        counts["refused"] += 1
                    else:
                        raise AssertionError(f"invalid call {bad} accepted")
        stream.synchronize()
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        results[tid] = e
        return
    results[tid] = counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=4)
    a = ap.parse_args()
    torch.manual_seed(0)
    results = [None] * a.threads
    worker(99, 8, [None] * 100)  # warm-up: modules loaded, allocator primed
    torch.cuda.synchronize()
    # cuBLAS keeps a workspace per (handle, stream) in torch's allocator (the references'
    # matmuls, one per thread's stream): not ours, released before each reading.
    torch._C._cuda_clearCublasWorkspaces()
    before = torch.cuda.memory_allocated()
    threads = [
        threading.Thread(target=worker, args=(t, a.calls // a.threads, results)) for t in range(a.threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    after = torch.cuda.memory_allocated()
    failed = [r for r in results if not isinstance(r, dict)]
    ok = [r for r in results if isinstance(r, dict)]
    total = {k: sum(r[k] for r in ok) for k in ("forward", "backward", "refused")}
    worst = max((r["worst"] for r in ok), default=0.0)
    print(
        f"python soak: {sum(total.values())} calls from {a.threads} threads on {a.threads} streams: "
        f"{total['forward']} forward, {total['backward']} with backward (worst error / tolerance "
        f"{worst:.3f}), {total['refused']} invalid calls refused; torch allocated {before} bytes "
        f"before, {after} after; {len(failed)} thread(s) failed"
    )
    for f in failed:
        print(f"FAIL: {f!r}")
    sys.exit(0 if not failed and after == before and sum(total.values()) >= a.calls - a.threads else 1)


if __name__ == "__main__":
    main()
