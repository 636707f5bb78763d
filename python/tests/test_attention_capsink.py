"""GPU check of flash_attn_func's softcap and sinks (plain Python with asserts; no pytest needed).

    python3 python/tests/test_attention_capsink.py

Against an f64 reference of the definition (logits ``l = scale q.k``, capped as ``softcap
tanh(l / softcap)``; the sink of each query head joined to every row's softmax as one more
logit with no value; LSE over the keys and the sink), with the tolerance of test_attention.py:
max |O - ref| <= 2 max |O_naive - ref| + 1e-3 (O_naive the same computation in the input
precision), LSE within 1e-3 max(1, |ref|) and -inf exactly where the reference has it (a row
with neither keys nor sinks). Both kernel paths (auto: Hopper on sm_90; mma_sync), outputs
poisoned first; the same over a paged KV cache (flash_attn_with_kvcache, per sequence on its
gathered keys: contexts of 0, causal speculative tokens, explicit and heuristic splits, so the
sinks join in the decode kernel and in the combine kernel) and over packed sequences
(flash_attn_varlen_func, per sequence; empty sequences, where a sequence without keys has LSE =
its sink). Then: bad sinks raise with the library's message, torch.library's opcheck with both
options. The gradients are checked by test_attention_capsink_bwd.py.

Prints one line per check and 'N passed, N failed' last; exits 1 on any failure, 0 with a SKIP
line without a CUDA device.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_attention import (  # noqa: E402  (the shared references and helpers)
    SEED,
    allowed_mask,
    check,
    dtype_name,
    heads_first,
    poison_allocator,
    raises,
    results,
)

import rustkernels  # noqa: E402
from rustkernels import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: E402
from test_attention_decode import paged_case  # noqa: E402


def capped(s, softcap):
    return s if softcap == 0.0 else softcap * torch.tanh(s / softcap)


def reference(q, k, v, scale, allowed, softcap, sinks):
    """f64 O [b, sq, h, d] and LSE [b, h, sq] of the definition."""
    qt, kt, vt = heads_first(q.double(), k.double(), v.double())
    s = capped((qt @ kt.transpose(-1, -2)) * scale, softcap).masked_fill(~allowed, -math.inf)
    if sinks is not None:
        col = sinks.double()[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)
        s = torch.cat([s, col], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    return (p @ vt).transpose(1, 2), lse


def naive(q, k, v, scale, allowed, softcap, sinks):
    """O as a straightforward implementation in the input precision computes it."""
    dt = q.dtype
    qt, kt, vt = heads_first(q, k, v)
    s = ((qt.float() * scale).to(dt) @ kt.transpose(-1, -2)).float()
    s = capped(s, softcap).to(dt).float().masked_fill(~allowed, -math.inf)
    if sinks is not None:
        col = sinks.float()[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)
        s = torch.cat([s, col], dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    return (p.to(dt) @ vt).transpose(1, 2).double()


def run_case(b, sq, sk, hq, hkv, d, dtype, causal, softcap, sink_range, path):
    g = torch.Generator(device="cuda").manual_seed(SEED + sq * 7 + sk * 13 + d)
    dev = torch.device("cuda")
    q = torch.randn(b, sq, hq, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, d, device=dev, dtype=dtype, generator=g)
    sinks = None
    if sink_range is not None:
        lo, hi = sink_range
        sinks = lo + (hi - lo) * torch.rand(hq, device=dev, generator=g)
    scale = 1.0 / math.sqrt(d)
    allowed = allowed_mask(sq, sk, causal, (-1, -1), dev)
    poison_allocator(((b, sq, hq, d), dtype), ((b, hq, sq), torch.float32), device=dev)
    if path == "auto":
        out, lse, _ = flash_attn_func(
            q, k, v, causal=causal, softcap=softcap, sinks=sinks, return_attn_probs=True
        )
    else:
        out, lse = torch.ops.rustkernels.flash_attn_forward(
            q, k, v, None, causal, -1, -1, path, softcap, sinks
        )
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, scale, allowed, softcap, sinks)
    naive_o = naive(q, k, v, scale, allowed, softcap, sinks)
    got = out.double()
    assert torch.isfinite(got).all(), "O has NaN or inf (or an unwritten element)"
    err = (got - ref_o).abs().max().item()
    naive_err = (naive_o - ref_o).abs().max().item()
    tol = 2 * naive_err + 1e-3
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "LSE is -inf exactly where the reference is"
    finite = ~empty
    rel = (lse.double()[finite] - ref_lse[finite]).abs() / ref_lse[finite].abs().clamp(min=1.0)
    lse_err = rel.max().item() if finite.any() else 0.0
    detail = (
        f"max |O - ref| = {err:.3e} (tol {tol:.3e} = 2 x naive {naive_err:.3e} + 1e-3), "
        f"LSE rel err {lse_err:.3e}"
    )
    assert err <= tol, detail
    assert lse_err <= 1e-3, detail
    return detail


CASES = [
    # (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, causal, softcap, sinks)
    (2, 113, 203, 8, 2, 64, torch.bfloat16, False, 0.5, None),
    (2, 113, 203, 8, 2, 64, torch.bfloat16, True, 0.0, (-2.0, 2.0)),
    (1, 300, 200, 4, 4, 128, torch.bfloat16, True, 30.0, (-1.0, 3.0)),
    (1, 1024, 1024, 8, 1, 128, torch.float16, True, 1.0, (0.0, 1.0)),
    (2, 256, 300, 4, 2, 256, torch.bfloat16, False, 50.0, (5.0, 8.0)),
    (1, 200, 333, 4, 2, 96, torch.float16, False, 2.0, None),
    (1, 129, 257, 2, 2, 192, torch.bfloat16, True, 0.0, (-3.0, 0.0)),
]


DECODE_CASES = [
    # (contexts, seqlen_q, nheads, nheads_k, headdim, page, dtype, causal, softcap, sinks, splits)
    ([0, 37, 200, 1000], 1, 8, 2, 128, 16, torch.bfloat16, False, 30.0, (-1.0, 3.0), 0),
    ([5, 300, 64], 4, 8, 8, 64, 64, torch.float16, True, 0.0, (0.0, 2.0), 3),
    ([0, 129, 700], 2, 4, 1, 256, 32, torch.bfloat16, True, 2.0, None, 1),
    ([513, 2048], 1, 16, 2, 128, 256, torch.bfloat16, False, 0.0, (20.0, 30.0), 0),
]


def run_decode_case(lens, sq, hq, hkv, d, page, dtype, causal, softcap, sink_range, splits):
    """flash_attn_with_kvcache with a softcap and sinks, per sequence against the dense
    references on the keys and values gathered from its pages."""
    q, kc, vc, bt, seqlens, gathered = paged_case(lens, sq, hq, hkv, d, page, dtype, SEED + d)
    dev = q.device
    sinks = None
    if sink_range is not None:
        g = torch.Generator(device="cuda").manual_seed(SEED + len(lens))
        lo, hi = sink_range
        sinks = lo + (hi - lo) * torch.rand(hq, device=dev, generator=g)
    poison_allocator(((len(lens), sq, hq, d), dtype), ((len(lens), hq, sq), torch.float32), device=dev)
    out, lse = flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=seqlens, block_table=bt, causal=causal, softcap=softcap,
        num_splits=splits, return_softmax_lse=True, sinks=sinks,
    )
    torch.cuda.synchronize()
    scale = 1.0 / math.sqrt(d)
    worst = (0.0, 0.0, 0.0)
    for b, (kb, vb) in enumerate(gathered):
        allowed = allowed_mask(sq, kb.shape[0], causal, (-1, -1), dev)
        qb, kb, vb = q[b : b + 1], kb[None], vb[None]
        ref_o, ref_lse = reference(qb, kb, vb, scale, allowed, softcap, sinks)
        naive_o = naive(qb, kb, vb, scale, allowed, softcap, sinks)
        got = out[b : b + 1].double()
        assert torch.isfinite(got).all(), f"sequence {b}: O has NaN or inf"
        err = (got - ref_o).abs().max().item()
        naive_err = (naive_o - ref_o).abs().max().item()
        empty = torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse[b : b + 1]), empty), f"sequence {b}: -inf LSE"
        finite = ~empty
        lse_err = 0.0
        if finite.any():
            rel = (lse[b : b + 1].double()[finite] - ref_lse[finite]).abs()
            lse_err = (rel / ref_lse[finite].abs().clamp(min=1.0)).max().item()
        assert err <= 2 * naive_err + 1e-3, f"sequence {b}: max |O - ref| {err:.3e}, naive {naive_err:.3e}"
        assert lse_err <= 1e-3, f"sequence {b}: LSE rel err {lse_err:.3e}"
        worst = max(worst, (err, naive_err, lse_err))
    return f"worst sequence: max |O - ref| = {worst[0]:.3e} (naive {worst[1]:.3e}), LSE rel err {worst[2]:.3e}"


def run_varlen_case(lens, hq, hkv, d, dtype, causal, softcap, sink_range):
    """flash_attn_varlen_func with a softcap and sinks, per sequence against the dense
    references (empty sequences included)."""
    g = torch.Generator(device="cuda").manual_seed(SEED + d + len(lens))
    dev = torch.device("cuda")
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = torch.randn(tq, hq, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(tk, hkv, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(tk, hkv, d, device=dev, dtype=dtype, generator=g)
    lo, hi = sink_range
    sinks = lo + (hi - lo) * torch.rand(hq, device=dev, generator=g)
    cq = torch.tensor([0] + [sum(a for a, _ in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32, device=dev)
    ck = torch.tensor([0] + [sum(b for _, b in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32, device=dev)
    out, lse, _ = flash_attn_varlen_func(
        q, k, v, cq, ck, max(a for a, _ in lens), max(b for _, b in lens), causal=causal,
        softcap=softcap, sinks=sinks, return_attn_probs=True,
    )
    torch.cuda.synchronize()
    scale = 1.0 / math.sqrt(d)
    worst = (0.0, 0.0)
    for i, (sq, sk) in enumerate(lens):
        if sq == 0:
            continue
        q0, k0 = int(cq[i]), int(ck[i])
        allowed = allowed_mask(sq, sk, causal, (-1, -1), dev)
        qs, ks, vs = q[None, q0 : q0 + sq], k[None, k0 : k0 + sk], v[None, k0 : k0 + sk]
        ref_o, ref_lse = reference(qs, ks, vs, scale, allowed, softcap, sinks)
        naive_o = naive(qs, ks, vs, scale, allowed, softcap, sinks)
        got = out[None, q0 : q0 + sq].double()
        assert torch.isfinite(got).all(), f"sequence {i}: O has NaN or inf"
        err = (got - ref_o).abs().max().item()
        naive_err = (naive_o - ref_o).abs().max().item()
        assert err <= 2 * naive_err + 1e-3, f"sequence {i}: max |O - ref| {err:.3e}, naive {naive_err:.3e}"
        got_lse = lse[:, q0 : q0 + sq].double()
        lse_err = ((got_lse - ref_lse[0]).abs() / ref_lse[0].abs().clamp(min=1.0)).max().item()
        assert lse_err <= 1e-3, f"sequence {i}: LSE rel err {lse_err:.3e}"
        worst = max(worst, (err, lse_err))
    return f"worst sequence: max |O - ref| = {worst[0]:.3e}, LSE rel err {worst[1]:.3e}"


def bad_sinks():
    dev = torch.device("cuda")
    q = torch.randn(1, 16, 4, 64, device=dev, dtype=torch.bfloat16)
    raises(ValueError, lambda: flash_attn_func(q, q, q, sinks=torch.zeros(3, device=dev)), "sinks")
    raises(TypeError, lambda: flash_attn_func(q, q, q, sinks=torch.zeros(4, device=dev).half()), "float32")
    raises(ValueError, lambda: flash_attn_func(q, q, q, sinks=torch.zeros(4)), "sinks is on")
    raises(ValueError, lambda: flash_attn_func(q, q, q, softcap=-1.0), "softcap")


def opcheck():
    dev = torch.device("cuda")
    q = torch.randn(1, 64, 4, 64, device=dev, dtype=torch.bfloat16)
    sinks = torch.randn(4, device=dev)
    torch.library.opcheck(
        torch.ops.rustkernels.flash_attn_forward.default,
        (q, q, q, None, True, -1, -1, "auto", 3.0, sinks),
        test_utils=("test_schema", "test_faketensor"),
    )


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' GPU check)")
        print("0 passed, 0 failed")
        return 0
    torch.manual_seed(SEED)
    print(f"rustkernels {rustkernels.__name__} softcap and sinks on {torch.cuda.get_device_name()}")
    for c in CASES:
        b, sq, sk, hq, hkv, d, dt, causal, softcap, sinks = c
        for path in ("auto", "mma_sync"):
            name = (
                f"capsink {path} b{b} sq{sq} sk{sk} h{hq}x{hkv} d{d} {dtype_name(dt)}"
                f"{' causal' if causal else ''} softcap {softcap} sinks {sinks}"
            )
            check(name, lambda c=c, path=path: run_case(*c, path))
    for c in DECODE_CASES:
        lens, sq, hq, hkv, d, page, dt, causal, softcap, sinks, splits = c
        name = (
            f"capsink decode contexts {lens} sq{sq} h{hq}x{hkv} d{d} page {page} {dtype_name(dt)}"
            f"{' causal' if causal else ''} softcap {softcap} sinks {sinks} splits {splits}"
        )
        check(name, lambda c=c: run_decode_case(*c))
    for lens, d, causal, softcap in (
        ([(70, 90), (0, 5), (9, 0), (130, 40), (1, 1)], 128, True, 5.0),
        ([(200, 200), (33, 500)], 64, False, 0.0),
    ):
        check(
            f"capsink varlen lens {lens} d{d}{' causal' if causal else ''} softcap {softcap} sinks",
            lambda lens=lens, d=d, causal=causal, softcap=softcap: run_varlen_case(
                lens, 4, 2, d, torch.bfloat16, causal, softcap, (-2.0, 2.0)
            ),
        )
    check("capsink: bad sinks and softcap", bad_sinks)
    check("capsink: torch.library.opcheck", opcheck)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
