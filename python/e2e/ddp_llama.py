"""End to end under data parallelism: ``llama_train.py``'s transformers Llama with our attention
(``rustkernels.flash_attn_func``), trained with ``torch.nn.parallel.DistributedDataParallel``
over NCCL, one process per GPU (``torch.multiprocessing.spawn``, world size 2), against the same
model on one GPU.

Same seed, same global batches: each of the 2 ranks takes its half of every global batch, DDP
averages the gradients, so each step's loss (the ranks' mean) is the one-GPU loss of the whole
batch up to bf16 rounding (DDP's bf16 all-reduce, another summation order). The bound follows
``llama_train.py``'s convention: the largest relative loss difference of DDP from the one-GPU
run must be at most ``max(2 noise, 1e-2)``, where noise is the difference of a second one-GPU
run that accumulates the gradients of the two halves (the same split as DDP's, without
communication). Also checked: the ranks end with bitwise equal parameters. Step times: median
over steps 4..N of each run (DDP: rank 0's).

Usage: python3 ddp_llama.py OUT.json [--steps N] [--batch GLOBAL] [--seq S] [--commit C]
Adds its rows (kernel ``llama_ddp_train_step``) to the results file (``e2e_results.py``);
prints a summary; exits 1 when a check fails, 0 with a line 'SKIP: needs 2 GPUs' on a machine
with fewer.
"""

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import traceback

import torch

import llama_train
from e2e_results import write_results

WORLD = 2
HEAD_DIM = 128
LR = 1e-3


def median_after_warmup(times):
    timed = sorted(times[3:]) if len(times) > 3 else sorted(times)
    return timed[len(timed) // 2]


def one_gpu(steps, batch, seq, micro, seed=0):
    """One GPU: every global batch as ``micro`` equal micro-batches whose gradients accumulate
    (``micro = 1``: the whole batch at once). Returns per-step losses (the mean over the
    micro-batches), the median step time and the peak memory."""
    model = llama_train.make_model("rustkernels", HEAD_DIM, seq, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    losses, times = [], []
    for ids in llama_train.batches(steps, batch, seq, seed):
        ids = ids.cuda()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        total = 0.0
        for part in ids.chunk(micro):
            loss = model(input_ids=part, labels=part).loss / micro
            loss.backward()
            total = total + loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        losses.append(float(total))
        times.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated() / 2**20
    del model, opt
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return losses, median_after_warmup(times), peak


def worker(rank, port, steps, batch, seq, out_path):
    """One DDP rank: its half of every global batch; rank 0 writes the losses (the ranks'
    mean), its step times and whether the ranks' parameters agree into ``out_path``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=dev)
    try:
        llama_train.register()
        model = llama_train.make_model("rustkernels", HEAD_DIM, seq, seed=0)
        model.train()
        ddp = DistributedDataParallel(model, device_ids=[rank])
        opt = torch.optim.AdamW(ddp.parameters(), lr=LR, weight_decay=0.01)
        per = batch // WORLD
        losses, times = [], []
        for ids in llama_train.batches(steps, batch, seq, seed=0):
            local = ids[rank * per:(rank + 1) * per].to(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = ddp(input_ids=local, labels=local).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            end.record()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            torch.cuda.synchronize()
            losses.append(mean.item() / WORLD)
            times.append(start.elapsed_time(end))
        # The ranks' parameters after the run, bitwise: every rank's flattened bytes against
        # rank 0's (broadcast; NCCL takes bytes, not 16-bit integers).
        flat = torch.cat([p.detach().reshape(-1).view(torch.uint8) for p in model.parameters()])
        theirs = flat.clone()
        dist.broadcast(theirs, src=0)
        same = torch.tensor([int(torch.equal(flat, theirs))], device=dev)
        dist.all_reduce(same, op=dist.ReduceOp.MIN)
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump({
                    "losses": losses,
                    "median_ms": median_after_warmup(times),
                    "peak_mib": peak,
                    "params_equal": bool(same.item()),
                }, f)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="global batch (split over the ranks)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < WORLD:
        print(f"SKIP: needs {WORLD} GPUs (found {gpus}); DDP check not run")
        return 0
    if a.batch % WORLD:
        print(f"FAIL: the global batch {a.batch} must be a multiple of the world size {WORLD}")
        return 1
    # NVLink multicast (NVLS) stays off: the GPU machines' notes ask for it.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import transformers

    import rustkernels  # noqa: F401 - fails here, not in a rank, without the package

    llama_train.register()
    failures = []
    single, single_ms, single_peak = one_gpu(a.steps, a.batch, a.seq, micro=1)
    accum, accum_ms, accum_peak = one_gpu(a.steps, a.batch, a.seq, micro=WORLD)

    ddp = None
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "rank0.json")
        try:
            torch.multiprocessing.spawn(
                worker,
                args=(free_port(), a.steps, a.batch, a.seq, out_path),
                nprocs=WORLD,
                join=True,
            )
            with open(out_path) as f:
                ddp = json.load(f)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            traceback.print_exc()
            failures.append(f"DDP run: {type(e).__name__}: {e}")

    rel = lambda xs: max(abs(x - y) / abs(y) for x, y in zip(xs, single))  # noqa: E731
    noise = rel(accum)
    bound = max(2 * noise, 1e-2)
    config = {
        "head_dim": HEAD_DIM, "layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 4,
        "global_batch": a.batch, "seq": a.seq, "steps": a.steps, "dtype": "bf16",
        "optimizer": f"AdamW lr {LR:g}", "world_size": WORLD,
    }
    runs = [
        ("ours 1 GPU", single, single_ms, single_peak, {}),
        (f"ours 1 GPU, {WORLD} accumulated halves", accum, accum_ms, accum_peak, {}),
    ]
    if ddp is not None:
        runs.append((f"ours DDP x{WORLD}", ddp["losses"], ddp["median_ms"], ddp["peak_mib"],
                     {"params_equal_across_ranks": ddp["params_equal"]}))
        if not ddp["params_equal"]:
            failures.append("DDP: the ranks' parameters differ after the run")
    rows = []
    for name, losses, ms, peak, extra in runs:
        ok = all(math.isfinite(x) for x in losses) and len(losses) == a.steps and rel(losses) <= bound
        if name.startswith("ours DDP") and not ok:
            failures.append(f"DDP: max relative loss difference {rel(losses):.2e} > {bound:.2e}")
        rows.append({
            "kernel": "llama_ddp_train_step",
            # The DDP run is "ours" (the report's reference row); the one-GPU runs compare to it.
            "impl": "ours" if name.startswith("ours DDP") else name,
            "run": name,
            "config": config,
            "median_ms": ms,
            "peak_mib": round(peak, 1),
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "max_rel_loss_diff_vs_1gpu": rel(losses),
            "loss_bound": bound,
            "check": "pass" if ok else "FAIL",
            "losses": losses,
            **extra,
        })
        print(
            f"llama_ddp_train_step {name:<34} step {ms:8.2f} ms loss {losses[0]:.4f} -> "
            f"{losses[-1]:.4f} max rel diff vs 1 GPU {rel(losses):.2e} (bound {bound:.2e}) "
            f"{'pass' if ok else 'FAIL'}",
            flush=True,
        )
    notes = [
        f"D {HEAD_DIM}, global batch {a.batch}: one GPU with {WORLD} accumulated halves vs the "
        f"whole batch max relative loss difference {noise:.2e} (bf16 noise); bound for DDP "
        f"{bound:.2e}",
        f"torch {torch.__version__}, transformers {transformers.__version__}, NCCL "
        f"{torch.cuda.nccl.version()}",
    ]
    write_results(a.out, a.commit, rows, notes, "ddp_llama: ")
    for f in failures:
        print("FAIL", f)
    print(f"ddp_llama: {'FAIL' if failures else 'pass'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
