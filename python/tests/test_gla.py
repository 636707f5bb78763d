"""GPU check of rustkernels.gla.chunk_gla (plain Python with asserts; no pytest needed).

    python3 python/tests/test_gla.py [--quick]

Forward against the recurrence in float64 (fla's naive GLA: ``S_t = diag(exp(g_t)) S_{t-1} +
k_t^T v_t``, ``o_t = scale q_t S_t``, per sequence and head, from the bf16 inputs). Tolerance
(fla's rule, as tests/gla.rs): relative L2 error ``||o - ref|| / ||ref|| <= 1e-2`` for o and for
the final state. Shapes: dk, dv in {64, 128}; lengths that are not multiples of any tile (1,
17, 113, 239, 799, 3000: long enough to be split across blocks), batch 1 and 3, initial
states, packed variable lengths, both kernels where the GPU has them, a float32 g, a
non-contiguous q. Gradients through autograd (dq, dk, dv, dg, dh0 of ``<do, o> + <dht, ht>``)
against torch.autograd on the float64 recurrence, same relative L2 tolerance, including
packed sequences and a float32 g. Then: bad input (ValueError/TypeError with the library's
message), torch.library's opcheck on both ops, torch.compile of the forward and of a training
step. Prints one line per check and 'N passed, N
failed' last; exits 1 on any failure, 0 with a SKIP line without a CUDA device.
"""

import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from rustkernels.gla import chunk_gla

QUICK = "--quick" in sys.argv
SEED = 20261124
TOL = 1e-2
results = {"passed": 0, "failed": 0}


def check(name, fn):
    """Run one check; an exception (an assert included) fails it and the run goes on."""
    start = time.time()
    try:
        detail = fn()
        results["passed"] += 1
        print(f"ok   {name} ({time.time() - start:.2f}s){': ' + detail if detail else ''}", flush=True)
    except Exception:
        results["failed"] += 1
        print(f"FAIL {name}", flush=True)
        traceback.print_exc(file=sys.stdout)


def recurrence(q, k, v, g, scale, h0, cu):
    """o [B, T, H, dv] and the final states [N, H, dk, dv] in float64."""
    q, k, v, g = (x.double() for x in (q, k, v, g))
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    seqs = [(i, 0, t) for i in range(b)] if cu is None else [
        (0, cu[j], cu[j + 1]) for j in range(len(cu) - 1)
    ]
    o = torch.zeros(b, t, h, dv, dtype=torch.float64, device=q.device)
    finals = []
    for n, (row, s0, s1) in enumerate(seqs):
        s = torch.zeros(h, dk, dv, dtype=torch.float64, device=q.device)
        if h0 is not None:
            s = h0[n].double().clone()
        for i in range(s0, s1):
            s = s * g[row, i].exp()[:, :, None] + k[row, i][:, :, None] * v[row, i][:, None, :]
            o[row, i] = scale * torch.einsum("hk,hkv->hv", q[row, i], s)
        finals.append(s)
    return o, torch.stack(finals)


def rel_l2(a, ref):
    return ((a.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def inputs(b, t, h, dk, dv, gen, g_dtype=torch.bfloat16):
    bf = torch.bfloat16
    q = torch.randn(b, t, h, dk, device="cuda", generator=gen).to(bf)
    k = (torch.randn(b, t, h, dk, device="cuda", generator=gen) / dk**0.5).to(bf)
    v = torch.randn(b, t, h, dv, device="cuda", generator=gen).to(bf)
    # Log-decays in (-inf, 0): fla's GLA layer uses logsigmoid of a projection (scaled).
    g = (F.logsigmoid(torch.randn(b, t, h, dk, device="cuda", generator=gen)) / 16).to(g_dtype)
    return q, k, v, g


def run_case(b, t, h, dk, dv, init=False, final=False, cu=None, kernel="auto", g_dtype=torch.bfloat16,
             strided_q=False):
    gen = torch.Generator(device="cuda").manual_seed(SEED + b * t + dk + dv)
    q, k, v, g = inputs(b, t, h, dk, dv, gen, g_dtype)
    if strided_q:
        wide = torch.randn(b, t, h, 2 * dk, device="cuda", generator=gen).to(torch.bfloat16)
        wide[..., :dk] = q
        q = wide[..., :dk]
        assert not q.is_contiguous()
    n = b if cu is None else len(cu) - 1
    h0 = torch.randn(n, h, dk, dv, device="cuda", generator=gen) if init else None
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int64, device="cuda")
    # Poison the memory the outputs will be allocated from (the caching allocator hands the
    # freed block back).
    torch.full((b * t * h * dv * 2 + n * h * dk * dv * 4,), float("nan"), device="cuda")
    o, ht = chunk_gla(q, k, v, g, initial_state=h0, output_final_state=final, cu_seqlens=cu_t,
                      kernel=kernel)
    torch.cuda.synchronize()
    scale = dk**-0.5
    ref_o, ref_s = recurrence(q, k, v, g.to(torch.bfloat16), scale, h0, cu)
    assert o.shape == (b, t, h, dv) and o.dtype == torch.bfloat16, (o.shape, o.dtype)
    assert torch.isfinite(o.float()).all(), "o has NaN or inf (unwritten?)"
    err_o = rel_l2(o, ref_o)
    detail = f"o rel L2 {err_o:.2e}"
    assert err_o <= TOL, detail
    if final:
        assert ht.shape == (n, h, dk, dv) and ht.dtype == torch.float32, (ht.shape, ht.dtype)
        assert torch.isfinite(ht).all(), "final state has NaN or inf"
        err_s = rel_l2(ht, ref_s)
        detail += f", final state rel L2 {err_s:.2e}"
        assert err_s <= TOL, detail
    else:
        assert ht is None
    return detail + f" (tol {TOL:.0e})"


CASES = [
    # b, t, h, dk, dv, init, final, cu
    (1, 1, 1, 64, 64, False, False, None),
    (2, 17, 2, 64, 128, True, True, None),
    (3, 113, 4, 128, 64, False, True, None),
    (1, 239, 3, 128, 128, True, True, None),
    (2, 799, 2, 64, 64, True, True, None),
    (1, 3000, 1, 64, 64, True, True, None),
    (1, 1000, 4, 64, 128, True, True, [0, 1, 17, 530, 1000]),
]
QUICK_CASES = [CASES[1], CASES[4], CASES[6]]


def case_name(c, kernel):
    b, t, h, dk, dv, init, final, cu = c
    return (f"forward B={b} T={t} H={h} dk={dk} dv={dv}{' init' if init else ''}"
            f"{' final' if final else ''}{f' cu_seqlens={cu}' if cu else ''} [{kernel}]")


def run_backward_case(b, t, h, dk, dv, init, cu=None, g_dtype=torch.bfloat16):
    """Gradients of <do, o> + <dht, ht> through chunk_gla against the float64 recurrence."""
    gen = torch.Generator(device="cuda").manual_seed(SEED + 7 * t + dk)
    q, k, v, g = inputs(b, t, h, dk, dv, gen, g_dtype)
    n = b if cu is None else len(cu) - 1
    h0 = torch.randn(n, h, dk, dv, device="cuda", generator=gen) if init else None
    do = torch.randn(b, t, h, dv, device="cuda", generator=gen).to(torch.bfloat16)
    dht = torch.randn(n, h, dk, dv, device="cuda", generator=gen)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int64, device="cuda")
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g)] + (
        [h0.clone().requires_grad_()] if init else [])
    o, ht = chunk_gla(*leaves[:4], initial_state=leaves[4] if init else None,
                      output_final_state=True, cu_seqlens=cu_t)
    got = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), leaves)
    ref_leaves = [x.detach().double().requires_grad_() for x in (q, k, v, g.to(torch.bfloat16))] + (
        [h0.double().requires_grad_()] if init else [])
    ref_o, ref_s = recurrence(*ref_leaves[:4], dk**-0.5, ref_leaves[4] if init else None, cu)
    ref = torch.autograd.grad((ref_o * do.double()).sum() + (ref_s * dht.double()).sum(), ref_leaves)
    torch.cuda.synchronize()
    lines = []
    for name, a, r, x in zip(("dq", "dk", "dv", "dg", "dh0"), got, ref, leaves):
        assert a.dtype == x.dtype and a.shape == x.shape, (name, a.dtype, a.shape)
        assert torch.isfinite(a.float()).all(), f"{name} has NaN or inf"
        err = rel_l2(a, r)
        lines.append(f"{name} rel L2 {err:.2e}")
        assert err <= TOL, ", ".join(lines)
    return ", ".join(lines) + f" (tol {TOL:.0e})"


BWD_CASES = [
    # b, t, h, dk, dv, init, cu
    (1, 1, 1, 64, 64, False, None),
    (2, 113, 2, 64, 128, True, None),
    (1, 239, 2, 128, 64, True, None),
    (1, 700, 2, 64, 64, True, [0, 5, 300, 700]),
]


def compiled_training_step():
    """A loss through chunk_gla compiled against eager: the gradients of a weight before q and
    of g itself (bf16, a leaf: the autograd node must not save it under a second name)."""
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    q, k, v, g = inputs(2, 128, 2, 64, 64, gen)
    w = (torch.randn(64, 64, device="cuda", generator=gen) / 8).to(torch.bfloat16).requires_grad_()
    g = g.to(torch.bfloat16).requires_grad_()

    def loss_fn(q, w, g):
        o, _ = chunk_gla(q @ w, k, v, g)
        return o.float().square().mean()

    want = torch.autograd.grad(loss_fn(q, w, g), (w, g))
    got = torch.autograd.grad(torch.compile(loss_fn)(q, w, g), (w, g))
    torch.cuda.synchronize()
    lines = []
    for name, a, b in zip(("dw", "dg"), got, want):
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        lines.append(f"{name} max |compiled - eager| {err:.1e} (max |eager| {scale:.1e})")
        assert torch.isfinite(a.float()).all() and err <= 1e-2 * scale + 1e-6, lines[-1]
    return ", ".join(lines)


def bad_inputs():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    q, k, v, g = inputs(2, 64, 2, 64, 64, gen)
    q96 = torch.randn(2, 64, 2, 96, device="cuda").to(torch.bfloat16)
    cu = torch.tensor([0, 10, 64], device="cuda")
    cases = [
        ("cpu tensor", ValueError, lambda: chunk_gla(q.cpu(), k, v, g), "CUDA"),
        ("float16 q", TypeError, lambda: chunk_gla(q.half(), k, v, g), "bfloat16"),
        ("float16 g", TypeError, lambda: chunk_gla(q, k, v, g.half()), "g must be"),
        ("rank 3", ValueError, lambda: chunk_gla(q[0], k[0], v[0], g[0]), "4 dimensions"),
        ("not a tensor", TypeError, lambda: chunk_gla(q, k, 3.0, g), "torch.Tensor"),
        ("dk 96", ValueError, lambda: chunk_gla(q96, q96, v, q96), "dk"),
        ("k shape", ValueError, lambda: chunk_gla(q, k[:, :32], v, g), "GLA k shape"),
        ("v length", ValueError, lambda: chunk_gla(q, k, v[:1], g), "GLA v shape"),
        ("state shape", ValueError,
         lambda: chunk_gla(q, k, v, g, initial_state=torch.zeros(1, 2, 64, 64, device="cuda")),
         "GLA initial state shape"),
        ("state dtype", TypeError,
         lambda: chunk_gla(q, k, v, g, initial_state=torch.zeros(2, 2, 64, 64, device="cuda").double()),
         "float32"),
        ("cu_seqlens with batch 2", ValueError, lambda: chunk_gla(q, k, v, g, cu_seqlens=cu), "batch must be 1"),
        ("cu_seqlens not increasing", ValueError,
         lambda: chunk_gla(q[:1], k[:1], v[:1], g[:1], cu_seqlens=torch.tensor([0, 10, 10, 64], device="cuda")),
         "increase strictly"),
        ("cu_seqlens end", ValueError,
         lambda: chunk_gla(q[:1], k[:1], v[:1], g[:1], cu_seqlens=torch.tensor([0, 10, 60], device="cuda")),
         "last offset"),
        ("scale nan", ValueError, lambda: chunk_gla(q, k, v, g, scale=float("nan")), "scale"),
        ("unknown kernel", ValueError, lambda: chunk_gla(q, k, v, g, kernel="fast"), "kernel"),
    ]
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0) or os.environ.get("KERNELS_ARCH") == "sm_80":
        cases.append(("pingpong off sm_90", ValueError, lambda: chunk_gla(q, k, v, g, kernel="pingpong"), "sm_90"))
    lines = []
    for name, exc, fn, needle in cases:
        try:
            fn()
        except exc as e:
            assert needle in str(e), f"{name}: {type(e).__name__} without {needle!r}: {e}"
            lines.append(f"{name}: {type(e).__name__}: {e}")
        else:
            raise AssertionError(f"{name}: no {exc.__name__}")
    o, _ = chunk_gla(q, k, v, g)
    torch.cuda.synchronize()
    assert torch.isfinite(o.float()).all()
    print("\n".join("     " + line for line in lines))
    return f"{len(cases)} bad inputs raised; a good call after them works"


def opcheck():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    q, k, v, g = inputs(1, 300, 2, 64, 128, gen)
    h0 = torch.randn(2, 2, 64, 128, device="cuda", generator=gen)
    cu = torch.tensor([0, 100, 300], device="cuda")
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    for args in ((q, k, v, g, None, None, False, None), (q, k, v, g, 0.5, h0, True, cu)):
        torch.library.opcheck(torch.ops.rustkernels.chunk_gla_forward.default, args, test_utils=utils)
    do = torch.randn(1, 300, 2, 128, device="cuda", generator=gen).to(torch.bfloat16)
    dht = torch.randn(2, 2, 64, 128, device="cuda", generator=gen)
    for args in ((do, None, q, k, v, g, None, None, None), (do, dht, q, k, v, g, 0.5, h0, cu)):
        torch.library.opcheck(torch.ops.rustkernels.chunk_gla_backward.default, args, test_utils=utils)
    return "chunk_gla_forward and chunk_gla_backward without and with states and cu_seqlens"


def compiled():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    q, k, v, g = inputs(2, 256, 4, 64, 64, gen)

    def layer(q, k, v, g):
        o, ht = chunk_gla(q * 0.5, k, v, g, output_final_state=True)
        return o.float().sum(dim=-1), ht.sum()

    want = layer(q, k, v, g)
    got = torch.compile(layer, fullgraph=True)(q, k, v, g)
    torch.cuda.synchronize()
    err = max((a - b).abs().max().item() for a, b in zip(got, want))
    assert err <= 1e-3 * max(1.0, want[1].abs().item()), f"compiled vs eager: {err}"
    return f"fullgraph; max |compiled - eager| = {err:.1e}"


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' GLA GPU check)")
        print("0 passed, 0 failed")
        return 0
    major, minor = torch.cuda.get_device_capability()
    print(f"rustkernels.gla on {torch.cuda.get_device_name()} (sm_{major}{minor}), "
          f"torch {torch.__version__}, seed {SEED}")
    kernels = ["auto", "baseline"]
    hopper = (major, minor) == (9, 0) and os.environ.get("KERNELS_ARCH") != "sm_80"
    if hopper:
        kernels.append("pingpong")
    for c in QUICK_CASES if QUICK else CASES:
        for kernel in kernels:
            check(case_name(c, kernel), lambda c=c, kernel=kernel: run_case(*c, kernel=kernel))
    check("forward float32 g", lambda: run_case(2, 200, 2, 64, 64, final=True, g_dtype=torch.float32))
    check("forward non-contiguous q", lambda: run_case(2, 100, 2, 64, 64, strided_q=True))
    for c in BWD_CASES[1:3] if QUICK else BWD_CASES:
        b, t, h, dk, dv, init, cu = c
        check(f"backward B={b} T={t} H={h} dk={dk} dv={dv}{' init' if init else ''}"
              f"{f' cu_seqlens={cu}' if cu else ''}", lambda c=c: run_backward_case(*c))
    check("backward float32 g", lambda: run_backward_case(2, 100, 2, 64, 64, True, g_dtype=torch.float32))
    check("bad inputs", bad_inputs)
    check("torch.library.opcheck", opcheck)
    check("torch.compile", compiled)
    check("torch.compile: training step", compiled_training_step)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
