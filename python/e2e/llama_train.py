"""End to end, against code nobody here wrote: a Hugging Face ``transformers`` Llama-style model
(random init, no downloads) trained for a few AdamW steps with its own attention (SDPA, and
eager as a second opinion on what bf16 noise is) and with ``rustkernels.flash_attn_func``
registered through transformers' attention interface. Same seed, same batches: the losses must
agree within the noise between transformers' own two implementations (or 1e-2 relative, the
larger), and the step times are reported.

Usage: python3 llama_train.py OUT.json [--steps N] [--commit C]
Writes its rows into a results file in the format of ``bench/results/*.json`` (family
``python``; other scripts' rows in it are kept: ``e2e_results.py``); prints a table; exits 1
when a check fails.
"""

import argparse
import math
import sys

import torch

from e2e_results import write_results

VOCAB = 8192


def ours_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-interface signature: query ``[B, H, S, D]``, key and value
    ``[B, H_kv, S, D]`` (not repeated for grouped-query attention). Causal language modelling
    without padding: the mask is the causal one, which ``causal=True`` applies (bottom-right
    aligned, equal to top-left when the lengths are equal)."""
    from rustkernels import flash_attn_func

    if dropout:
        raise ValueError("rustkernels attention: dropout is not supported")
    out = flash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=scaling,
        causal=True,
    )
    return out, None


def register():
    """Register ours with transformers under the attention implementation name "rustkernels"."""
    from transformers import AttentionInterface

    AttentionInterface.register("rustkernels", ours_attention)
    # Masks are built per attention implementation name; ours ignores the mask (causal=True,
    # no padding), so SDPA's mask builder serves (it returns None for a plain causal mask).
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        ALL_MASK_ATTENTION_FUNCTIONS.register("rustkernels", sdpa_mask)
    except ImportError:
        pass


def make_model(impl, head_dim, seq, seed=0):
    """The Llama of this check (4 layers, hidden 1024, 16 heads, 4 K/V heads, vocab 8192), bf16
    on the current CUDA device, random init from ``seed``, attention ``impl``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=head_dim,
        max_position_embeddings=seq,
        attention_dropout=0.0,
    )
    cfg._attn_implementation = impl
    return LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)


def batches(steps, batch, seq, seed=0):
    """The token batches of the run, ``[batch, seq]`` on the CPU, the same for every run."""
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    for _ in range(steps):
        yield torch.randint(0, VOCAB, (batch, seq), generator=gen)


def train(impl, head_dim, steps, batch, seq, seed=0):
    model = make_model(impl, head_dim, seq, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses, times = [], []
    for ids in batches(steps, batch, seq, seed):
        ids = ids.cuda()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        losses.append(out.loss.item())
        times.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated() / 2**20
    del model, opt
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    timed = sorted(times[3:]) if len(times) > 3 else sorted(times)
    return losses, timed[len(timed) // 2], peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()

    import transformers

    register()
    rows, notes, failed = [], [], False
    for head_dim in (64, 128):
        runs = {}
        for impl in ("sdpa", "eager", "rustkernels"):
            losses, ms, peak = train(impl, head_dim, a.steps, a.batch, a.seq)
            runs[impl] = (losses, ms, peak)
        ref = runs["sdpa"][0]
        rel = lambda xs: max(abs(x - y) / abs(y) for x, y in zip(xs, ref))  # noqa: E731
        noise = rel(runs["eager"][0])
        bound = max(2 * noise, 1e-2)
        for impl, (losses, ms, peak) in runs.items():
            ok = all(math.isfinite(x) for x in losses) and rel(losses) <= bound
            failed |= not ok
            rows.append({
                "kernel": "llama_train_step",
                "impl": "ours" if impl == "rustkernels" else f"transformers {impl}",
                "config": {
                    "head_dim": head_dim, "layers": 4, "hidden": 1024, "heads": 16,
                    "kv_heads": 4, "batch": a.batch, "seq": a.seq, "steps": a.steps,
                    "dtype": "bf16", "optimizer": "AdamW lr 1e-3",
                },
                "median_ms": ms,
                "peak_mib": round(peak, 1),
                "first_loss": losses[0],
                "last_loss": losses[-1],
                "max_rel_loss_diff_vs_sdpa": rel(losses),
                "loss_bound": bound,
                "check": "pass" if ok else "FAIL",
                "losses": losses,
            })
        notes.append(
            f"D {head_dim}: eager vs SDPA max relative loss difference {noise:.2e} "
            f"(bf16 noise); bound for ours {bound:.2e}"
        )
    write_results(
        a.out,
        a.commit,
        rows,
        notes + [f"torch {torch.__version__}, transformers {transformers.__version__}"],
        "llama_train: ",
    )
    for r in rows:
        print(
            f"{r['kernel']} D={r['config']['head_dim']} {r['impl']:<22} step {r['median_ms']:8.2f} ms "
            f"loss {r['first_loss']:.4f} -> {r['last_loss']:.4f} "
            f"max rel diff vs sdpa {r['max_rel_loss_diff_vs_sdpa']:.2e} (bound {r['loss_bound']:.2e}) "
            f"{r['check']}"
        )
    for n in notes:
        print("note:", n)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
