"""GPU check of the gradients of flash_attn_func and flash_attn_varlen_func with a softcap and
sinks (plain Python with asserts; no pytest needed).

    python3 python/tests/test_attention_capsink_bwd.py

dq, dk, dv and the sinks' gradient through autograd (both modes: atomic dQ and deterministic)
against torch.autograd of the definition in f64 (logits ``l = scale q.k`` capped as ``softcap
tanh(l / softcap)``, each query head's sink one more logit of every row's softmax with no
value), with FlashAttention's rule per gradient G: max |G - ref| <= 2 max |G_naive - ref| +
1e-3 max |ref| + 1e-6 m (G_naive the same autograd in the input precision; m as in
test_attention.py's backward cases); every element finite (the gradients' memory poisoned
first). The loss uses O and, where the case says, the LSE. Then: sinks that do not require grad
get none, the deterministic mode is bitwise reproducible with both options, opcheck of the
backward op with both options.

Prints one line per check and 'N passed, N failed' last; exits 1 on any failure, 0 with a SKIP
line without a CUDA device.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_attention import (  # noqa: E402  (the shared helpers)
    SEED,
    allowed_mask,
    check,
    dtype_name,
    heads_first,
    poison_allocator,
    results,
)

import rustkernels  # noqa: E402
from rustkernels import flash_attn_func, flash_attn_varlen_func  # noqa: E402


def grads_reference(q, k, v, sinks, dout, dlse, scale, allowed, softcap, dtype, o_given=None):
    """dq, dk, dv, dsinks of ``loss = sum(out dout) + sum(lse dlse)`` by torch.autograd, in f64
    (``dtype = float64``) or as a straightforward implementation in the input precision
    (scores, capped logits, probabilities and O rounded to it; the softmax in f32; dsinks from
    the forward output ``o_given``, as the kernels: the sinks' gradient is a sum over every row
    of ``rowsum(dO O)``, so O's rounding dominates its error, and the backward is checked on the
    O it gets; the forward's O is checked by test_attention_capsink.py). Rows with neither an
    allowed key nor a sink: out 0, no gradient."""
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    qd, kd, vd = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    sd = sinks.detach().to(ct).requires_grad_() if sinks is not None else None
    qt, kt, vt = heads_first(qd, kd, vd)
    s = ((qt * scale) @ kt.transpose(-1, -2)).to(ct)
    if softcap != 0.0:
        s = (softcap * torch.tanh(s / softcap)).to(dtype).to(ct)
    s = s.masked_fill(~allowed, -math.inf)
    if sd is not None:
        col = sd[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)
        s = torch.cat([s, col], dim=-1)
    empty = torch.isneginf(s).all(dim=-1)
    s = s.masked_fill(empty[..., None], 0.0)
    p = torch.softmax(s, dim=-1) * (~empty)[..., None].to(ct)
    if sd is not None:
        p = p[..., :-1]
    out = p.to(dtype) @ vt
    loss = (out.to(ct) * dout.transpose(1, 2).to(ct)).sum()
    if dlse is not None:
        lse = torch.logsumexp(s, dim=-1)
        loss = loss + (lse * dlse.to(ct) * (~empty).to(ct)).sum()
    inputs = (qd, kd, vd) if sd is None else (qd, kd, vd, sd)
    grads = [t.double() for t in torch.autograd.grad(loss, inputs)]
    if sd is not None and dtype != torch.float64:
        # The sinks' gradient as an implementation in the input precision computes it from the
        # layer's saved output O (``o_given``, the one the kernels' backward gets, ``[b, s, h,
        # d]``): sum P_sink (dLSE - rowsum(dO O)).
        p_sink = torch.softmax(s, dim=-1)[..., -1] * (~empty).to(ct)
        row = (o_given.transpose(1, 2).float() * dout.transpose(1, 2).float()).sum(-1)
        dl = dlse.float() if dlse is not None else 0.0
        grads[3] = (p_sink.float() * (dl - row)).sum(dim=(0, 2)).double()
    return grads


def compare(names, got, ref, naive, abs_floor):
    parts = []
    for name, gk, gr, gn in zip(names, got, ref, naive):
        gk = gk.double()
        assert torch.isfinite(gk).all(), f"{name} has NaN or inf (or an unwritten element)"
        err = (gk - gr).abs().max().item()
        naive_err = (gn - gr).abs().max().item()
        tol = 2 * naive_err + 1e-3 * gr.abs().max().item() + abs_floor
        parts.append(f"{name} {err:.2e} (tol {tol:.2e})")
        assert err <= tol, ", ".join(parts)
    return ", ".join(parts)


def inputs(b, sq, sk, hq, hkv, d, dtype, sink_range, with_dlse, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.device("cuda")
    q = torch.randn(b, sq, hq, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, d, device=dev, dtype=dtype, generator=g)
    dout = torch.randn(b, sq, hq, d, device=dev, dtype=dtype, generator=g)
    dlse = torch.randn(b, hq, sq, device=dev, generator=g) if with_dlse else None
    sinks = None
    if sink_range is not None:
        lo, hi = sink_range
        sinks = lo + (hi - lo) * torch.rand(hq, device=dev, generator=g)
    return q, k, v, dout, dlse, sinks


def run_case(b, sq, sk, hq, hkv, d, dtype, causal, softcap, sink_range, with_dlse):
    q, k, v, dout, dlse, sinks = inputs(
        b, sq, sk, hq, hkv, d, dtype, sink_range, with_dlse, SEED + 3 * sq + 5 * sk + d
    )
    scale = 1.0 / math.sqrt(d)
    mag = lambda t: t.abs().max().item()
    abs_floor = 1e-6 * mag(dout) * mag(v) * max(mag(q), mag(k))
    allowed = allowed_mask(sq, sk, causal, (-1, -1), q.device)
    args = (q, k, v, sinks, dout, dlse, scale, allowed, softcap)
    ref = grads_reference(*args, torch.float64)
    with torch.no_grad():
        out0 = flash_attn_func(q, k, v, causal=causal, softcap=softcap, sinks=sinks)
    naive = grads_reference(*args, dtype, out0)
    names = ("dq", "dk", "dv") if sinks is None else ("dq", "dk", "dv", "dsinks")
    details = []
    for deterministic in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        sg = sinks.clone().requires_grad_() if sinks is not None else None
        poison_allocator(((b, sq, hq, d), dtype), ((b, sk, hkv, d), dtype), device=q.device)
        out, lse, _ = flash_attn_func(
            *leaves, causal=causal, softcap=softcap, sinks=sg, deterministic=deterministic,
            return_attn_probs=True,
        )
        outputs, grads_out = [out], [dout]
        if with_dlse:
            outputs.append(lse)
            grads_out.append(dlse)
        got = torch.autograd.grad(outputs, leaves + ([sg] if sg is not None else []), grads_out)
        torch.cuda.synchronize()
        mode = "det" if deterministic else "atomic"
        details.append(f"{mode}: " + compare(names, got, ref, naive, abs_floor))
    return "; ".join(details)


CASES = [
    # (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, causal, softcap, sinks, dlse)
    (2, 113, 203, 8, 2, 64, torch.bfloat16, False, 5.0, None, False),
    (2, 113, 203, 8, 2, 64, torch.bfloat16, True, 0.0, (-2.0, 2.0), True),
    (1, 300, 200, 4, 4, 128, torch.bfloat16, True, 30.0, (-1.0, 3.0), False),
    (1, 512, 512, 8, 1, 128, torch.float16, True, 20.0, (0.0, 1.0), True),
    (1, 256, 300, 4, 2, 256, torch.bfloat16, False, 50.0, (5.0, 8.0), False),
    (1, 200, 333, 4, 2, 96, torch.float16, False, 2.0, None, True),
]


def run_varlen_case(lens, hq, hkv, d, dtype, causal, softcap, sink_range):
    """flash_attn_varlen_func's gradients per sequence against the dense references (the
    sinks' gradient summed over the sequences); empty sequences included."""
    dev = torch.device("cuda")
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q, k, v, dout, _, sinks = inputs(1, tq, tk, hq, hkv, d, dtype, sink_range, False, SEED + d)
    q, k, v, dout = q[0], k[0], v[0], dout[0]
    cq = torch.tensor([0] + [sum(a for a, _ in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32, device=dev)
    ck = torch.tensor([0] + [sum(b for _, b in lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32, device=dev)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sg = sinks.clone().requires_grad_()
    out = flash_attn_varlen_func(
        *leaves, cq, ck, max(a for a, _ in lens), max(b for _, b in lens), causal=causal,
        softcap=softcap, sinks=sg,
    )
    got = torch.autograd.grad([out], leaves + [sg], [dout])
    torch.cuda.synchronize()
    out = out.detach()
    scale = 1.0 / math.sqrt(d)
    ref = [torch.zeros_like(t, dtype=torch.float64) for t in (q, k, v, sinks)]
    naive = [torch.zeros_like(t, dtype=torch.float64) for t in (q, k, v, sinks)]
    for i, (sq, sk) in enumerate(lens):
        q0, k0 = int(cq[i]), int(ck[i])
        allowed = allowed_mask(sq, sk, causal, (-1, -1), dev)
        args = (
            q[None, q0 : q0 + sq], k[None, k0 : k0 + sk], v[None, k0 : k0 + sk], sinks,
            dout[None, q0 : q0 + sq], None, scale, allowed, softcap,
        )
        for acc, dt in ((ref, torch.float64), (naive, dtype)):
            if sq == 0:
                continue
            dq, dk, dv, ds = grads_reference(*args, dt, out[None, q0 : q0 + sq])
            acc[0][q0 : q0 + sq] += dq[0]
            acc[1][k0 : k0 + sk] += dk[0]
            acc[2][k0 : k0 + sk] += dv[0]
            acc[3] += ds
    mag = lambda t: t.abs().max().item()
    abs_floor = 1e-6 * mag(dout) * mag(v) * max(mag(q), mag(k))
    return compare(("dq", "dk", "dv", "dsinks"), got, ref, naive, abs_floor)


def sinks_without_grad():
    """Sinks that do not require grad get none; q's gradient still follows them."""
    q, k, v, dout, _, sinks = inputs(1, 64, 64, 4, 2, 64, torch.bfloat16, (0.0, 2.0), False, SEED)
    qg = q.clone().requires_grad_()
    out = flash_attn_func(qg, k, v, sinks=sinks, softcap=10.0)
    (dq,) = torch.autograd.grad([out], [qg], [dout])
    assert sinks.grad is None and torch.isfinite(dq.float()).all()
    return "dq only"


def deterministic_bitwise():
    q, k, v, dout, _, sinks = inputs(2, 300, 257, 8, 2, 128, torch.bfloat16, (-1.0, 2.0), False, SEED)

    def run():
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        out = flash_attn_func(*leaves[:3], causal=True, softcap=20.0, sinks=leaves[3], deterministic=True)
        return torch.autograd.grad([out], leaves, [dout])

    first = run()
    for i in range(5):
        again = run()
        assert all(torch.equal(a, b) for a, b in zip(first, again)), f"run {i + 1} differs"
    return "6 runs bitwise identical (dq, dk, dv, dsinks)"


def opcheck():
    dev = torch.device("cuda")
    q = torch.randn(1, 64, 4, 64, device=dev, dtype=torch.bfloat16)
    sinks = torch.randn(4, device=dev)
    out, lse = torch.ops.rustkernels.flash_attn_forward(q, q, q, None, True, -1, -1, "auto", 3.0, sinks)
    dout = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.rustkernels.flash_attn_backward.default,
        (dout, q, q, q, out, lse, None, None, True, -1, -1, True, 3.0, sinks),
        test_utils=("test_schema", "test_faketensor"),
    )
    return "flash_attn_backward with a softcap and sinks"


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' GPU check)")
        print("0 passed, 0 failed")
        return 0
    torch.manual_seed(SEED)
    print(f"rustkernels {rustkernels.__name__} softcap and sinks backward on {torch.cuda.get_device_name()}")
    for c in CASES:
        b, sq, sk, hq, hkv, d, dt, causal, softcap, sinks, dlse = c
        name = (
            f"capsink bwd b{b} sq{sq} sk{sk} h{hq}x{hkv} d{d} {dtype_name(dt)}"
            f"{' causal' if causal else ''} softcap {softcap} sinks {sinks}{' dlse' if dlse else ''}"
        )
        check(name, lambda c=c: run_case(*c))
    for lens, d, causal, softcap in (
        ([(70, 90), (0, 5), (9, 0), (130, 40), (1, 1)], 128, True, 5.0),
        ([(200, 200), (33, 500)], 64, False, 0.0),
    ):
        check(
            f"capsink bwd varlen lens {lens} d{d}{' causal' if causal else ''} softcap {softcap} sinks",
            lambda lens=lens, d=d, causal=causal, softcap=softcap: run_varlen_case(
                lens, 4, 2, d, torch.bfloat16, causal, softcap, (-2.0, 2.0)
            ),
        )
    check("capsink bwd: sinks without grad", sinks_without_grad)
    check("capsink bwd: deterministic bitwise", deterministic_bitwise)
    check("capsink bwd: torch.library.opcheck", opcheck)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
