"""GPU check of rustkernels.flash_attn_varlen_func (packed sequences), forward and backward
(plain Python with asserts; no pytest needed), on test_attention.py's references and helpers.

    python3 python/tests/test_attention_varlen.py [--quick]

Per sequence against the same references as dense batch-1 problems (empty sequences, length 1,
causal with seqlen_q != seqlen_k, grouped-query attention, windows, dLSE), forward and gradients
in both modes with test_attention.py's rules; equal lengths against the dense kernels; bad input;
opcheck; a compiled training step.

Prints one line per check and 'N passed, N failed' last; exits 1 on any failure, 0 with a SKIP
line without a CUDA device.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_attention import (  # noqa: E402  (the shared references and helpers)
    QUICK,
    SEED,
    allowed_mask,
    check,
    dtype_name,
    grads_reference,
    naive_same_precision,
    poison_allocator,
    raises,
    reference,
    results,
)


def packed_case(seqlens, hq, hkv, d, dtype, seed, dv=None):
    """Random packed q, k, v, dout, dlse for sequences of (seqlen_q, seqlen_k) = ``seqlens``,
    and the int32 boundaries on the device; v and dout of head dimension ``dv`` (default
    ``d``)."""
    dv = d if dv is None else dv
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.device("cuda")
    total_q = sum(sq for sq, _ in seqlens)
    total_k = sum(sk for _, sk in seqlens)
    q = torch.randn(total_q, hq, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(total_k, hkv, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(total_k, hkv, dv, device=dev, dtype=dtype, generator=g)
    dout = torch.randn(total_q, hq, dv, device=dev, dtype=dtype, generator=g)
    dlse = torch.randn(hq, total_q, device=dev, generator=g)
    cu_q = [0]
    cu_k = [0]
    for sq, sk in seqlens:
        cu_q.append(cu_q[-1] + sq)
        cu_k.append(cu_k[-1] + sk)
    cu_q = torch.tensor(cu_q, dtype=torch.int32, device=dev)
    cu_k = torch.tensor(cu_k, dtype=torch.int32, device=dev)
    return q, k, v, dout, dlse, cu_q, cu_k


def varlen_references(q, k, v, dout, dlse, seqlens, scale, causal, window):
    """Per sequence, as dense batch-1 problems: f64 O and LSE (packed), and dq, dk, dv of
    ``sum(out dout) (+ sum(lse dlse)`` when ``dlse`` is given) in f64 and as a straightforward
    implementation in the input precision computes them. A sequence without query or key rows:
    O 0, LSE -inf, no gradient."""
    hq = q.shape[1]
    dt = q.dtype
    ref_o = torch.zeros(dout.shape, dtype=torch.float64, device=q.device)
    naive_o = torch.zeros_like(ref_o)
    ref_lse = torch.full((hq, q.shape[0]), -math.inf, dtype=torch.float64, device=q.device)
    grads = {
        key: [torch.zeros(t.shape, dtype=torch.float64, device=q.device) for t in (q, k, v)]
        for key in ("ref", "naive")
    }
    q0 = k0 = 0
    for sq, sk in seqlens:
        rq, rk = slice(q0, q0 + sq), slice(k0, k0 + sk)
        q0, k0 = q0 + sq, k0 + sk
        if sq == 0 or sk == 0:
            continue
        qs, ks, vs = q[rq][None], k[rk][None], v[rk][None]
        allowed = allowed_mask(sq, sk, causal, window, q.device)
        o, lse = reference(qs, ks, vs, scale, allowed)
        ref_o[rq] = o[0]
        ref_lse[:, rq] = lse[0]
        naive_o[rq] = naive_same_precision(qs, ks, vs, scale, allowed)[0]
        do_s = dout[rq][None]
        dl_s = None if dlse is None else dlse[:, rq][None]
        for key, prec in (("ref", torch.float64), ("naive", dt)):
            gq, gk, gv = grads_reference(qs, ks, vs, do_s, dl_s, scale, allowed, prec)
            grads[key][0][rq] = gq[0]
            grads[key][1][rk] = gk[0]
            grads[key][2][rk] = gv[0]
    return ref_o, ref_lse, naive_o, grads


def run_varlen_case(seqlens, hq, hkv, d, dtype, causal, window, scale, with_dlse, dv=None):
    """flash_attn_varlen_func against per-sequence references: O within FlashAttention's rule
    (2 x naive + 1e-3, as ``run_case``), LSE within 1e-3 relative and -inf exactly where a
    query has no key; then the gradients through autograd in both modes with the rule of
    ``run_backward_case``; every element finite (outputs poisoned with NaN first). ``dv``: v,
    out and dout of that head dimension (a pair beside q and k of ``d``)."""
    from rustkernels import flash_attn_varlen_func

    q, k, v, dout, dlse, cu_q, cu_k = packed_case(
        seqlens, hq, hkv, d, dtype, SEED + len(seqlens) + d, dv
    )
    max_q = max(sq for sq, _ in seqlens)
    max_k = max(sk for _, sk in seqlens)
    eff_scale = scale if scale is not None else 1.0 / math.sqrt(d)
    ref_o, ref_lse, naive_o, grads = varlen_references(
        q, k, v, dout, dlse if with_dlse else None, seqlens, eff_scale, causal, window
    )
    poison_allocator((tuple(dout.shape), dtype), ((hq, q.shape[0]), torch.float32), device=q.device)
    out, lse, _ = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=causal,
        window_size=window, return_attn_probs=True,
    )
    torch.cuda.synchronize()
    assert out.shape == dout.shape and out.dtype == dtype, (out.shape, out.dtype)
    assert lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    got = out.double()
    assert torch.isfinite(got).all(), "O has NaN or inf (or an unwritten element)"
    err = (got - ref_o).abs().max().item() if got.numel() else 0.0
    naive_err = (naive_o - ref_o).abs().max().item() if got.numel() else 0.0
    tol = 2 * naive_err + 1e-3
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "LSE is -inf exactly where no key is allowed"
    finite = ~empty
    lse_err = 0.0
    if finite.any():
        rel = (lse.double()[finite] - ref_lse[finite]).abs() / ref_lse[finite].abs().clamp(min=1.0)
        lse_err = rel.max().item()
    parts = [f"O {err:.2e} (tol {tol:.2e}), LSE rel {lse_err:.1e}, {int(empty.sum())} empty rows"]
    assert err <= tol, parts[0]
    assert lse_err <= 1e-3, parts[0]

    mag = lambda t: t.abs().max().item() if t.numel() else 0.0  # noqa: E731
    abs_floor = 1e-6 * mag(dout) * mag(v) * max(mag(q), mag(k))
    ref, naive = grads["ref"], grads["naive"]
    for deterministic in (False, True):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        poison_allocator(
            (tuple(q.shape), dtype), (tuple(k.shape), dtype), (tuple(v.shape), dtype), device=q.device
        )
        out, lse, _ = flash_attn_varlen_func(
            qg, kg, vg, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=causal,
            window_size=window, deterministic=deterministic, return_attn_probs=True,
        )
        outputs, grads_out = [out], [dout]
        if with_dlse:
            outputs.append(lse)
            grads_out.append(dlse)
        got = torch.autograd.grad(outputs, (qg, kg, vg), grads_out)
        torch.cuda.synchronize()
        mode = "det" if deterministic else "atomic"
        line = []
        for name, gk, gr, gn, t in zip(("dq", "dk", "dv"), got, ref, naive, (q, k, v)):
            assert gk.shape == t.shape and gk.dtype == dtype, (name, gk.shape, gk.dtype)
            gk = gk.double()
            assert torch.isfinite(gk).all(), f"{mode}: {name} has NaN or inf (or an unwritten element)"
            e = (gk - gr).abs().max().item() if gk.numel() else 0.0
            ne = (gn - gr).abs().max().item() if gk.numel() else 0.0
            t_ = 2 * ne + 1e-3 * mag(gr) + abs_floor
            line.append(f"{name} {e:.2e} (tol {t_:.2e})")
            assert e <= t_, f"{mode}: " + ", ".join(line)
        parts.append(f"{mode}: " + ", ".join(line))
    return "; ".join(parts)


VARLEN_CASES = [
    # (seqlens [(seqlen_q, seqlen_k)], nheads, nheads_k, headdim, dtype, causal, window, scale, dlse)
    ([(1, 1)], 1, 1, 64, torch.bfloat16, False, (-1, -1), None, False),
    ([(17, 9), (0, 5), (300, 1), (40, 0), (128, 128)], 4, 2, 128, torch.bfloat16, True, (-1, -1), None, True),
    ([(113, 203), (77, 77), (1, 64), (64, 1)], 8, 2, 64, torch.float16, True, (32, -1), None, False),
    ([(256, 512), (512, 256), (3, 700)], 4, 1, 256, torch.bfloat16, False, (-1, -1), None, True),
    ([(5, 300), (300, 5), (1000, 999)], 6, 3, 64, torch.bfloat16, False, (0, 0), 0.3, False),
    ([(2048, 2048), (1, 1), (999, 1500)], 8, 8, 128, torch.float16, True, (-1, -1), None, False),
]
if QUICK:
    VARLEN_CASES = VARLEN_CASES[:3]
# v, out and dout of their own head dimension (forward and backward on the Hopper kernels):
# (..., dv).
VARLEN_VALUE_DIM_CASES = [
    ([(17, 9), (0, 5), (300, 1), (128, 128), (500, 700)], 4, 2, 192, torch.bfloat16, True, (-1, -1), None, True, 128),
    ([(113, 203), (1, 64), (999, 1000)], 4, 4, 192, torch.float16, False, (64, 32), None, False, 128),
]


def varlen_case_name(c):
    seqlens, hq, hkv, d, dt, causal, window, scale, dlse = c
    return (
        f"varlen/{dtype_name(dt)} {len(seqlens)} seqs {seqlens if len(seqlens) <= 3 else seqlens[:3] + ['...']} "
        f"h{hq}/{hkv} d{d}{' causal' if causal else ''}"
        f"{'' if window == (-1, -1) else f' window{window}'}{'' if scale is None else f' scale{scale}'}"
        f"{' dLSE' if dlse else ''}"
    )


def varlen_equal_lengths_match_dense():
    """Equal-length sequences packed are the dense batch: varlen O and LSE against
    flash_attn_forward on the automatic path (the one varlen takes: Hopper on sm_90a, else
    mma_sync), O within 2^-6 relative + 1e-3 per element (a bf16 rounding apart at most), LSE
    within 1e-3."""
    from rustkernels import flash_attn_varlen_func

    b, s, hq, hkv, d = 3, 333, 8, 2, 128
    g = torch.Generator(device="cuda").manual_seed(SEED)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    out, lse, _ = flash_attn_varlen_func(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, s, s, causal=True,
        return_attn_probs=True,
    )
    want, want_lse = torch.ops.rustkernels.flash_attn_forward(q, k, v, None, True, -1, -1, "auto")
    torch.cuda.synchronize()
    diff = (out.view(b, s, hq, d).float() - want.float()).abs()
    err = diff.max().item()
    excess = (diff - (2**-6 * want.float().abs() + 1e-3)).max().item()
    lse_err = (lse.view(hq, b, s).transpose(0, 1).float() - want_lse).abs().max().item()
    assert excess <= 0 and lse_err <= 1e-3, f"O {err}, LSE {lse_err}"
    return f"max |O varlen - O dense| = {err:.1e}, LSE {lse_err:.1e}"


def varlen_bad_inputs():
    from rustkernels import flash_attn_varlen_func

    dev = "cuda"
    bf = torch.bfloat16
    q = torch.randn(100, 4, 64, device=dev, dtype=bf)
    kv = torch.randn(80, 2, 64, device=dev, dtype=bf)
    cu_q = torch.tensor([0, 60, 100], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 30, 80], dtype=torch.int32, device=dev)

    def call(q=q, k=kv, v=kv, cu_q=cu_q, cu_k=cu_k, max_q=60, max_k=50, **kw):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    cases = [
        ("cpu tensor", ValueError, lambda: call(q=q.cpu()), "CUDA"),
        ("float32", TypeError, lambda: call(q=q.float(), k=kv.float(), v=kv.float()), "bfloat16"),
        ("rank 4", ValueError, lambda: call(q=q[None]), "3 dimensions"),
        ("cu_seqlens int64", TypeError, lambda: call(cu_q=cu_q.long()), "int32"),
        ("cu_seqlens on the CPU", ValueError, lambda: call(cu_k=cu_k.cpu()), "cu_seqlens_k"),
        ("cu_seqlens rank 2", ValueError, lambda: call(cu_q=cu_q[None]), "1 dimension"),
        ("cu_seqlens lengths differ", ValueError, lambda: call(cu_k=cu_k[:2]), "cu_seqlens_k"),
        ("max_seqlen_q below the total / batch", ValueError, lambda: call(max_q=10), "max_seqlen_q"),
        ("max_seqlen_k above the total", ValueError, lambda: call(max_k=81), "max_seqlen_k"),
        ("max_seqlen negative", ValueError, lambda: call(max_q=-1), "max_seqlen_q"),
        ("max_seqlen a float", TypeError, lambda: call(max_q=60.0), "max_seqlen_q"),
        ("head dim 72", ValueError, lambda: call(q=torch.randn(100, 4, 72, device=dev, dtype=bf),
                                                 k=torch.randn(80, 2, 72, device=dev, dtype=bf),
                                                 v=torch.randn(80, 2, 72, device=dev, dtype=bf)),
         "head dimension 72"),
        ("heads 4 vs 3", ValueError, lambda: call(k=torch.randn(80, 3, 64, device=dev, dtype=bf),
                                                  v=torch.randn(80, 3, 64, device=dev, dtype=bf)),
         "multiple"),
        ("k, v lengths differ", ValueError, lambda: call(v=kv[:79]), "V shape"),
        ("dropout", NotImplementedError, lambda: call(dropout_p=0.1), "dropout"),
        ("block_table", NotImplementedError, lambda: call(block_table=cu_q), "block_table"),
        ("window -2", ValueError, lambda: call(window_size=(-2, 0)), "window_size"),
        ("scale nan", ValueError, lambda: call(softmax_scale=float("nan")), "scale"),
    ]
    lines = [f"{name} -> {raises(exc, fn, contains)}" for name, exc, fn, contains in cases]
    out = call()
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    print("\n".join("     " + line for line in lines))
    return f"{len(cases)} bad inputs raised; a good call after them works"


def varlen_opcheck():
    q = torch.randn(100, 4, 64, device="cuda", dtype=torch.float16)
    kv = torch.randn(150, 2, 64, device="cuda", dtype=torch.float16)
    cu_q = torch.tensor([0, 60, 60, 100], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 30, 100, 150], dtype=torch.int32, device="cuda")
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    fwd_args = (q, kv, kv, cu_q, cu_k, 60, 70, None, True, -1, -1)
    torch.library.opcheck(torch.ops.rustkernels.flash_attn_varlen_forward.default, fwd_args, test_utils=utils)
    out, lse = torch.ops.rustkernels.flash_attn_varlen_forward(*fwd_args)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    for dl, det in ((None, False), (dlse, True)):
        torch.library.opcheck(
            torch.ops.rustkernels.flash_attn_varlen_backward.default,
            (dout, q, kv, kv, out, lse, dl, cu_q, cu_k, 60, 70, None, True, -1, -1, det),
            test_utils=utils,
        )
    return "flash_attn_varlen_forward; flash_attn_varlen_backward without dLSE, and with dLSE deterministic"


def varlen_compiled_training_step():
    """A loss over packed sequences under torch.compile(fullgraph=True), forward and backward
    (deterministic): against eager."""
    from rustkernels import flash_attn_varlen_func

    g = torch.Generator(device="cuda").manual_seed(SEED)
    bf = torch.bfloat16
    total = 500
    x = torch.randn(total, 256, device="cuda", dtype=bf, generator=g)
    w = (torch.randn(256, 3 * 256, device="cuda", dtype=bf, generator=g) / 16).requires_grad_()
    target = torch.randn(total, 4, 64, device="cuda", generator=g)
    cu = torch.tensor([0, 200, 201, 500], dtype=torch.int32, device="cuda")

    def loss_fn(x, w, target, cu):
        q, k, v = (x @ w).view(total, 3, 4, 64).unbind(dim=1)
        out = flash_attn_varlen_func(q, k, v, cu, cu, 299, 299, causal=True, deterministic=True)
        return ((out.float() - target) ** 2).mean()

    def step(fn):
        loss = fn(x, w, target, cu)
        (grad,) = torch.autograd.grad(loss, (w,))
        return loss.detach(), grad

    want_loss, want = step(loss_fn)
    got_loss, got = step(torch.compile(loss_fn, fullgraph=True))
    torch.cuda.synchronize()
    assert abs(got_loss.item() - want_loss.item()) <= 1e-3 * abs(want_loss.item()) + 1e-5, (
        got_loss.item(), want_loss.item())
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert torch.isfinite(got.float()).all() and err <= 2e-2 * scale + 1e-6, f"dw {err} (max {scale})"
    return f"fullgraph; loss {got_loss.item():.5f} vs eager {want_loss.item():.5f}; dw max diff {err:.1e} (max {scale:.1e})"


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' GPU check)")
        print("0 passed, 0 failed")
        return 0
    torch.manual_seed(SEED)
    print(f"rustkernels flash_attn_varlen_func on {torch.cuda.get_device_name()}, seed {SEED}")
    for c in VARLEN_CASES:
        check(varlen_case_name(c), lambda c=c: run_varlen_case(*c))
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) == (9, 0) and os.environ.get("KERNELS_ARCH") != "sm_80":
        for c in VARLEN_VALUE_DIM_CASES:
            check(varlen_case_name(c[:-1]) + f" dv{c[-1]}", lambda c=c: run_varlen_case(*c))
    check("varlen: equal lengths match the dense batch", varlen_equal_lengths_match_dense)
    check("varlen: bad inputs", varlen_bad_inputs)
    check("varlen: torch.library.opcheck", varlen_opcheck)
    check("varlen: torch.compile training step", varlen_compiled_training_step)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
