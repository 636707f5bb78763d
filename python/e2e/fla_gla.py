"""End to end, against code nobody here wrote: flash-linear-attention's own GLA layer
(``fla.layers.GatedLinearAttention``, mode ``chunk``) and its GLA language model
(``fla.models.GLAForCausalLM``), each run with fla's ``chunk_gla`` and with
``rustkernels.chunk_gla`` in its place.

The swap: fla's layer calls the name ``chunk_gla`` of its module ``fla.layers.gla`` (imported
there from ``fla.ops.gla``), as ``chunk_gla(q=, k=, v=, g=, initial_state=,
output_final_state=, state_v_first=True, cu_seqlens=)``; this script rebinds that name to an
adapter around ours (which transposes the states for ``state_v_first``; training passes none)
and counts the adapter's calls, so a run that did not go through ours fails.

(a) The layer (bf16, random init from a seed; head dims (dk, dv) = (64, 128), (128, 128) and
(64, 64); one case with padding, where fla unpads the batch and passes ``cu_seqlens``): the
output and every parameter's and the input's gradient (of ``sum(out * dy)``, dy random) with
ours and with fla's kernels, against the reference: an f32 copy of the layer whose
``chunk_gla`` is the recurrence itself, step by step in float64 (``reference_chunk_gla``; fla's
chunk kernels in f32 would not do, their products run in tf32). Per tensor, the relative L2
error ``|x - x_ref| / |x_ref|`` of ours must be at most ``max(2 err_fla, 1e-2)``, where
``err_fla`` is fla's bf16 error: bf16 noise as fla's own kernels have it (the convention of
``llama_train.py``). Step times (forward + backward, median of 20 after 3 warm-up runs).

(b) ``GLAForCausalLM`` (4 layers, hidden 1024, 8 heads: dk 64, dv 128; vocab 8192), 20 AdamW
steps from one seed on the same random batches, with fla's ``chunk`` kernels, with ours, and
with fla's ``fused_recurrent`` kernels (a second opinion on bf16 noise): the largest relative
loss difference of ours from fla's chunk must be at most ``max(2 noise, 1e-2)``, noise the
one of fla's fused_recurrent from fla's chunk. Step times (median over steps 4..20).

Usage: python3 fla_gla.py OUT.json [--steps N] [--commit C] [--layer-cases A,B] [--models A,B]
Adds its rows (kernels ``fla_gla_layer`` and ``fla_gla_train_step``) to the results file
(``e2e_results.py``), prints a summary, exits 1 when a check fails (0 with a SKIP line without
a CUDA device).
"""

import argparse
import copy
import math
import sys

import torch

from e2e_results import write_results

# The layer configurations: (name, hidden, heads, expand_k, expand_v, padded lengths or None).
LAYER_CASES = [
    ("dk64 dv128", 1024, 8, 0.5, 1.0, None),
    ("dk128 dv128", 1024, 8, 1.0, 1.0, None),
    ("dk64 dv64", 1024, 16, 1.0, 1.0, None),
    ("dk64 dv128 padded", 1024, 8, 0.5, 1.0, [2048, 1500, 777, 65]),
]
# The model runs: label -> (whose chunk_gla, fla's attention mode).
MODEL_RUNS = {
    "fla chunk": ("fla", "chunk"),
    "ours": ("ours", "chunk"),
    "fla fused_recurrent": ("fla", "fused_recurrent"),
}
calls = {"ours": 0, "reference": 0}


def reference_chunk_gla(
    q,
    k,
    v,
    g,
    scale=None,
    initial_state=None,
    output_final_state=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
):
    """The GLA recurrence with ``chunk_gla``'s signature, one step per token in float64:
    ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = scale q_t S_t`` (states ``[N, H, dk,
    dv]``, ``[N, H, dv, dk]`` with ``state_v_first``); packed sequences (``cu_seqlens``, a batch
    of one) each from their own initial state. Returns ``o`` in q's dtype."""
    calls["reference"] += 1
    dk = q.shape[-1]
    scale = dk ** -0.5 if scale is None else scale
    if initial_state is not None and state_v_first:
        initial_state = initial_state.transpose(-1, -2)
    if cu_seqlens is None:
        spans = [(b, 0, q.shape[1]) for b in range(q.shape[0])]
    else:
        bounds = cu_seqlens.tolist()
        spans = [(0, s, e) for s, e in zip(bounds[:-1], bounds[1:])]
    outs, finals = [], []
    for n, (b, start, end) in enumerate(spans):
        qs, ks, vs, gs = (t[b, start:end].double() for t in (q, k, v, g))
        h = qs.new_zeros(qs.shape[1], dk, vs.shape[-1])
        if initial_state is not None:
            h = h + initial_state[n].double()
        steps = []
        for t in range(end - start):
            h = h * gs[t].exp()[..., None] + ks[t][..., None] * vs[t][:, None, :]
            steps.append((qs[t][..., None] * h).sum(-2) * scale)
        outs.append(torch.stack(steps) if steps else vs.new_zeros(vs.shape))
        finals.append(h)
    if cu_seqlens is None:
        o = torch.stack(outs)
    else:
        o = torch.cat(outs)[None]
    ht = None
    if output_final_state:
        ht = torch.stack(finals).to(q.dtype)
        if state_v_first:
            ht = ht.transpose(-1, -2)
    return o.to(q.dtype), ht


def ours_chunk_gla(
    q,
    k,
    v,
    g,
    scale=None,
    initial_state=None,
    output_final_state=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
):
    """fla 0.6.0's ``chunk_gla`` signature over ``rustkernels.chunk_gla`` (states
    ``[N, H, dk, dv]``; with ``state_v_first`` fla's are ``[N, H, dv, dk]``)."""
    from rustkernels import chunk_gla

    calls["ours"] += 1
    if initial_state is not None and state_v_first:
        initial_state = initial_state.transpose(-1, -2)
    o, ht = chunk_gla(
        q,
        k,
        v,
        g,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )
    if ht is not None and state_v_first:
        ht = ht.transpose(-1, -2)
    return o, ht


def use(impl):
    """Bind the name fla's GLA layer calls to fla's kernels, ours or the reference."""
    import fla.layers.gla as layer_module
    from fla.ops.gla import chunk_gla as fla_chunk_gla

    layer_module.chunk_gla = {
        "ours": ours_chunk_gla, "reference": reference_chunk_gla, "fla": fla_chunk_gla,
    }[impl]


def rel_l2(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def median_ms(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def layer_case(name, hidden, heads, expand_k, expand_v, lengths, batch, seq, seed):
    """One layer configuration: errors of ours and fla's against fla in f32, step times."""
    from fla.layers import GatedLinearAttention

    torch.manual_seed(seed)
    base = GatedLinearAttention(
        mode="chunk",
        hidden_size=hidden,
        expand_k=expand_k,
        expand_v=expand_v,
        num_heads=heads,
        layer_idx=0,
    ).cuda()
    dk, dv = base.head_k_dim, base.head_v_dim
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    if lengths is not None:
        batch, seq = len(lengths), max(lengths)
    x = torch.randn(batch, seq, hidden, device="cuda", generator=gen)
    dy = torch.randn(batch, seq, hidden, device="cuda", generator=gen)
    mask = None
    if lengths is not None:
        mask = torch.zeros(batch, seq, dtype=torch.int32, device="cuda")
        for i, n in enumerate(lengths):
            mask[i, :n] = 1

    def run(impl, dtype):
        use(impl)
        layer = copy.deepcopy(base).to(dtype)
        # A leaf of its own in every run (x.to(float32) would be x itself).
        xi = x.to(dtype).detach().requires_grad_()
        before = dict(calls)
        out, _, _ = layer(xi, attention_mask=mask)
        out.backward(dy.to(dtype))
        if impl in calls:
            assert calls[impl] > before[impl], f"fla's layer did not call the {impl} chunk_gla"
        tensors = {"out": out.detach(), "d_input": xi.grad}
        for pname, p in layer.named_parameters():
            tensors["d_" + pname] = p.grad
        step_ms = None
        if dtype == torch.bfloat16:
            def step():
                layer.zero_grad(set_to_none=True)
                o, _, _ = layer(xi, attention_mask=mask)
                o.backward(dy.to(dtype))

            step_ms = median_ms(step)
        return tensors, step_ms

    ref, _ = run("reference", torch.float32)
    fla, fla_ms = run("fla", torch.bfloat16)
    ours, ours_ms = run("ours", torch.bfloat16)
    errors, failed = {}, []
    for key, r in ref.items():
        if r is None or fla[key] is None or ours[key] is None:
            if not (r is None and fla[key] is None and ours[key] is None):
                failed.append(f"{key}: gradient present in some runs only")
            continue
        e_ours, e_fla = rel_l2(ours[key], r), rel_l2(fla[key], r)
        bound = max(2 * e_fla, 1e-2)
        ok = math.isfinite(e_ours) and e_ours <= bound
        errors[key] = {
            "ours": e_ours,
            "fla": e_fla,
            "bound": bound,
            "ours_vs_fla_bf16": rel_l2(ours[key], fla[key]),
        }
        if not ok:
            failed.append(f"{key}: ours {e_ours:.2e} > bound {bound:.2e} (fla {e_fla:.2e})")
    worst = max(errors, key=lambda k: errors[k]["ours"] / errors[k]["bound"])
    config = {
        "case": name, "hidden": hidden, "heads": heads, "dk": dk, "dv": dv, "batch": batch,
        "seq": seq, "dtype": "bf16", "pass": "forward + backward",
    }
    if lengths is not None:
        config["lengths"] = lengths
    rows = []
    for impl, ms, errs in (("ours", ours_ms, "ours"), ("fla", fla_ms, "fla")):
        rows.append({
            "kernel": "fla_gla_layer",
            "impl": impl,
            "config": config,
            "median_ms": ms,
            "max_rel_l2_vs_reference": max(e[errs] for e in errors.values()),
            "check": "FAIL" if failed else "pass",
            "rel_l2_vs_reference": {k: e[errs] for k, e in errors.items()},
            **({"bounds": {k: e["bound"] for k, e in errors.items()}} if impl == "ours" else {}),
        })
    summary = (
        f"fla_gla_layer {name:<18} ours {ours_ms:7.2f} ms, fla {fla_ms:7.2f} ms; "
        f"{len(errors)} tensors; worst (vs bound) {worst}: ours {errors[worst]['ours']:.2e}, "
        f"fla {errors[worst]['fla']:.2e}, bound {errors[worst]['bound']:.2e}; "
        f"out ours {errors['out']['ours']:.2e} fla {errors['out']['fla']:.2e} "
        f"{'FAIL' if failed else 'pass'}"
    )
    return rows, summary, failed


def train(impl, mode, steps, batch, seq, seed=0):
    """20 AdamW steps of fla's GLA language model with ``impl``'s chunk_gla (fla's kernels of
    ``mode``, or ours in fla's chunk mode)."""
    from fla.models import GLAConfig, GLAForCausalLM

    use(impl)
    torch.manual_seed(seed)
    cfg = GLAConfig(
        vocab_size=8192,
        hidden_size=1024,
        num_hidden_layers=4,
        num_heads=8,
        expand_k=0.5,
        expand_v=1.0,
        attn_mode=mode,
        max_position_embeddings=seq,
        use_cache=False,
    )
    model = GLAForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    losses, times = [], []
    before = calls["ours"]
    for _ in range(steps):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).cuda()
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
    if impl == "ours":
        assert calls["ours"] > before, "fla's model did not call the swapped-in chunk_gla"
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
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument(
        "--layer-cases", default="",
        help="comma-separated layer case names to run (default: all); fla's Triton kernels "
        "autotune on every new shape, minutes each",
    )
    ap.add_argument(
        "--models", default=",".join(MODEL_RUNS),
        help="comma-separated model runs (default: all of " + ", ".join(MODEL_RUNS) + "; "
        "'none' for none); the loss check needs 'fla chunk' and 'ours'",
    )
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (fla GLA end to end)")
        return 0
    import rustkernels  # noqa: F401 - fails here, not mid-run, without the package

    try:
        import fla
        import fla.layers  # noqa: F401
        import fla.models  # noqa: F401
    except ImportError as e:
        print(f"FAIL: flash-linear-attention (fla.layers, fla.models) cannot be imported: {e}")
        return 1

    rows, notes, failures = [], [], []
    cases = [c for c in LAYER_CASES if not a.layer_cases or c[0] in a.layer_cases.split(",")]
    for case in cases:
        name = case[0]
        try:
            case_rows, summary, failed = layer_case(*case, batch=a.batch, seq=a.seq, seed=0)
        except Exception as e:  # noqa: BLE001 - reported as a failure, the other cases go on
            import traceback

            traceback.print_exc()
            failures.append(f"layer {name}: {type(e).__name__}: {e}")
            print(f"fla_gla_layer {name:<18} FAIL ({type(e).__name__}: {e})")
            continue
        rows += case_rows
        failures += [f"layer {name}: {f}" for f in failed]
        print(summary, flush=True)
        for f in failed:
            print(f"  FAIL {f}", flush=True)

    runs = {}
    wanted = a.models.split(",")
    for label, (impl, mode) in MODEL_RUNS.items():
        if label not in wanted:
            continue
        try:
            runs[label] = train(impl, mode, a.steps, a.batch, a.seq)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            import traceback

            traceback.print_exc()
            failures.append(f"model {label}: {type(e).__name__}: {e}")
            print(f"fla_gla_train_step {label:<20} FAIL ({type(e).__name__}: {e})")
    if "fla chunk" in runs and "ours" in runs:
        ref = runs["fla chunk"][0]
        rel = lambda xs: max(abs(x - y) / abs(y) for x, y in zip(xs, ref))  # noqa: E731
        noise = rel(runs["fla fused_recurrent"][0]) if "fla fused_recurrent" in runs else 0.0
        bound = max(2 * noise, 1e-2)
        for label, (losses, ms, peak) in runs.items():
            ok = all(math.isfinite(x) for x in losses) and rel(losses) <= bound
            if not ok:
                failures.append(f"model {label}: max relative loss difference {rel(losses):.2e} > {bound:.2e}")
            rows.append({
                "kernel": "fla_gla_train_step",
                "impl": "ours" if label == "ours" else label,
                "config": {
                    "layers": 4, "hidden": 1024, "heads": 8, "dk": 64, "dv": 128,
                    "vocab": 8192, "batch": a.batch, "seq": a.seq, "steps": a.steps,
                    "dtype": "bf16", "optimizer": "AdamW lr 1e-3",
                },
                "median_ms": ms,
                "peak_mib": round(peak, 1),
                "first_loss": losses[0],
                "last_loss": losses[-1],
                "max_rel_loss_diff_vs_fla_chunk": rel(losses),
                "loss_bound": bound,
                "check": "pass" if ok else "FAIL",
                "losses": losses,
            })
            print(
                f"fla_gla_train_step {label:<20} step {ms:8.2f} ms loss {losses[0]:.4f} -> "
                f"{losses[-1]:.4f} max rel diff vs fla chunk {rel(losses):.2e} (bound {bound:.2e}) "
                f"{'pass' if ok else 'FAIL'}",
                flush=True,
            )
        notes.append(
            f"GLA model: fla fused_recurrent vs fla chunk max relative loss difference "
            f"{noise:.2e} (bf16 noise); bound for ours {bound:.2e}"
        )
    notes.append(
        "layer: per tensor (output, input and parameter gradients) relative L2 error against "
        "an f32 copy of the layer with the GLA recurrence in float64 step by step; bound "
        "max(2 x fla bf16's, 1e-2)"
    )
    import transformers

    notes.append(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"fla {getattr(fla, '__version__', '?')}"
    )
    write_results(a.out, a.commit, rows, notes, "fla_gla: ")
    for f in failures:
        print("FAIL", f)
    print(f"fla_gla: {'FAIL' if failures else 'pass'} ({len(failures)} failures, {len(rows)} rows)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
