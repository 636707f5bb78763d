"""GPU check of rustkernels.semicrf (plain Python with asserts; no pytest needed).

    python3 python/tests/test_semicrf.py [--quick]

log Z and its gradients against a PyTorch reference in float64: the semi-CRF forward
recurrence (flash-semicrf's streaming convention, as bench/peers/semicrf.py's baseline:
``alpha[t, c] = lse_{k <= min(K, t)} (v[t - k, c] + dur[k - 1, c]) + S[t, c]``,
``v[s, c] = lse_c' (alpha[s, c'] + trans[c', c]) - S[s, c]``, ``alpha[0] = 0``, log Z_b =
``lse_c alpha[L_b, c]``) differentiated by torch.autograd, on the same float32 inputs.
Tolerance: the kernels run the scans in f64 and the gradients in f32 from f64 exponents
(``kernels::semicrf``): log Z within ``1e-6 max(1, |ref|)``, each gradient G within
``1e-4 max |ref G| + 1e-6`` (an upstream gradient that differs per sequence included). Viterbi:
the best score against the same recurrence with max for lse, within ``1e-5 max(1, |ref|)``,
and each returned segmentation's own score equal to it. Then: float64 inputs (gradients in
float64), the forward without grad, bad input (ValueError/TypeError/NotImplementedError with
the library's message), torch.library's opcheck, torch.compile (fullgraph: log Z and every
gradient against eager, float32 and float64 inputs). Prints one line per check and
'N passed, N failed' last; exits 1 on any failure, 0 with a SKIP line without a CUDA device.
"""

import sys
import time
import traceback

import torch

from rustkernels.semicrf import semi_crf_streaming_forward, semi_crf_viterbi

QUICK = "--quick" in sys.argv
SEED = 20261124
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


def reference(cs, trans, dur, lengths, K, semiring="log"):
    """log Z (or the max score) [B] in float64 by the forward recurrence; differentiable."""
    reduce = (lambda x, d: torch.logsumexp(x, d)) if semiring == "log" else (lambda x, d: x.amax(d))
    cs, trans, dur = cs.double(), trans.double(), dur.double()
    b, rows, c = cs.shape
    alpha = [torch.zeros(b, c, dtype=torch.float64, device=cs.device)]
    vs = [reduce(alpha[0].unsqueeze(2) + trans.unsqueeze(0), 1) - cs[:, 0]]
    for t in range(1, rows):
        km = min(K, t)
        terms = torch.stack([vs[t - k] + dur[k - 1] for k in range(1, km + 1)], 0)
        a = reduce(terms, 0) + cs[:, t]
        alpha.append(a)
        vs.append(reduce(a.unsqueeze(2) + trans.unsqueeze(0), 1) - cs[:, t])
    ends = torch.stack([alpha[int(n)][i] for i, n in enumerate(lengths.tolist())])
    return reduce(ends, 1)


def inputs(b, t, k, c, gen, dtype=torch.float32):
    scores = torch.randn(b, t, c, device="cuda", generator=gen, dtype=torch.float64)
    scores = scores - scores.mean(dim=1, keepdim=True)
    cs = torch.zeros(b, t + 1, c, device="cuda", dtype=torch.float64)
    cs[:, 1:] = scores.cumsum(1)
    trans = 0.3 * torch.randn(c, c, device="cuda", generator=gen, dtype=torch.float64)
    dur = 0.3 * torch.randn(k, c, device="cuda", generator=gen, dtype=torch.float64)
    return cs.to(dtype), trans.to(dtype), dur.to(dtype)


def close(name, got, want, rtol, atol):
    err = (got.double() - want.double()).abs().max().item()
    bound = rtol * want.double().abs().max().item() + atol
    assert torch.isfinite(got).all(), f"{name} has NaN or inf"
    assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e}"
    return f"{name} {err:.1e}"


def run_case(b, t, k, c, lengths, dtype=torch.float32, weights=False, checkpoint=None):
    gen = torch.Generator(device="cuda").manual_seed(SEED + b * t + k * c)
    cs, trans, dur = inputs(b, t, k, c, gen, dtype)
    lengths = torch.tensor(lengths, device="cuda")
    leaves = [x.clone().requires_grad_() for x in (cs, trans, dur)]
    ref_leaves = [x.detach().clone().requires_grad_() for x in (cs, trans, dur)]
    w = (torch.rand(b, device="cuda", generator=gen, dtype=torch.float64) + 0.5) if weights else None
    z = semi_crf_streaming_forward(leaves[0], leaves[1], leaves[2], lengths, k,
                                   checkpoint_interval=checkpoint)
    ref = reference(ref_leaves[0], ref_leaves[1], ref_leaves[2], lengths, k)
    assert z.dtype == dtype and z.shape == (b,), (z.dtype, z.shape)
    (z.double() * w if weights else z).sum().backward()
    (ref * w if weights else ref).sum().backward()
    torch.cuda.synchronize()
    lines = [close("log Z", z, ref.detach(), 1e-6, 1e-6 * max(1.0, ref.abs().max().item()))]
    for name, a, r in zip(("dcum_scores", "dtransition", "dduration_bias"), leaves, ref_leaves):
        assert a.grad.dtype == dtype and a.grad.shape == a.shape, (name, a.grad.dtype, a.grad.shape)
        lines.append(close(name, a.grad, r.grad, 1e-4, 1e-6))
    return ", ".join(lines)


CASES = [
    # b, t, k, c, lengths
    (1, 1, 1, 1, [1]),
    (2, 17, 4, 3, [17, 5]),
    (3, 113, 8, 5, [113, 1, 64]),
    (1, 239, 16, 4, [239]),
    (4, 799, 12, 6, [799, 400, 798, 3]),
]
QUICK_CASES = [CASES[1], CASES[2]]


def viterbi_case(b, t, k, c, lengths):
    gen = torch.Generator(device="cuda").manual_seed(SEED + 7 * b + t)
    cs, trans, dur = inputs(b, t, k, c, gen)
    lengths_t = torch.tensor(lengths, device="cuda")
    with torch.no_grad():
        score = semi_crf_streaming_forward(cs, trans, dur, lengths_t, k, semiring="max")
    best, segments = semi_crf_viterbi(cs, trans, dur, lengths_t, k)
    ref = reference(cs, trans, dur, lengths_t, k, semiring="max")
    lines = [close("max score", score, ref, 1e-5, 1e-5), close("viterbi score", best, ref, 1e-5, 1e-5)]
    cs64, tr64, du64 = cs.double().cpu(), trans.double().cpu(), dur.double().cpu()
    for i, segs in enumerate(segments):
        pos, prev, total = 0, None, 0.0
        for start, d, label in segs:
            assert start == pos and 1 <= d <= k and 0 <= label < c, (i, segs)
            total += (cs64[i, start + d, label] - cs64[i, start, label] + du64[d - 1, label]).item()
            # The first segment's previous label is summed over (max here): the best one.
            total += (tr64[:, label].max() if prev is None else tr64[prev, label]).item()
            pos, prev = start + d, label
        assert pos == lengths[i], f"sequence {i}: segments cover {pos} of {lengths[i]}"
        assert abs(total - ref[i].item()) <= 1e-4 * max(1.0, abs(ref[i].item())), (i, total, ref[i].item())
    return ", ".join(lines) + f"; {sum(len(s) for s in segments)} segments rescored"


def float64_inputs():
    return run_case(2, 64, 5, 4, [64, 33], dtype=torch.float64) + " (float64 in and out)"


def no_grad_forward():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    cs, trans, dur = inputs(2, 50, 4, 3, gen)
    lengths = torch.tensor([50, 20], device="cuda")
    with torch.no_grad():
        z = semi_crf_streaming_forward(cs.requires_grad_(), trans, dur, lengths, 4)
    assert not z.requires_grad
    z2 = semi_crf_streaming_forward(cs.detach(), trans, dur, lengths.cpu(), 4)
    torch.cuda.synchronize()
    assert torch.equal(z, z2), "forward with CPU lengths differs"
    return close("log Z", z, reference(cs.detach(), trans, dur, lengths, 4), 1e-6, 1e-5) + "; lengths on the CPU too"


def bad_inputs():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    cs, trans, dur = inputs(2, 30, 4, 3, gen)
    lengths = torch.tensor([30, 10], device="cuda")
    f = semi_crf_streaming_forward
    nan_cs = cs.clone()
    nan_cs[1, 3, 2] = float("nan")
    cases = [
        ("cpu scores", ValueError, lambda: f(cs.cpu(), trans, dur, lengths, 4), "CUDA"),
        ("float16 scores", TypeError, lambda: f(cs.half(), trans, dur, lengths, 4), "float32 or float64"),
        ("float lengths", TypeError, lambda: f(cs, trans, dur, lengths.float(), 4), "integer"),
        ("rank 2 cum_scores", ValueError, lambda: f(cs[0], trans, dur, lengths, 4), "3 dimensions"),
        ("not a tensor", TypeError, lambda: f(cs, 1.0, dur, lengths, 4), "torch.Tensor"),
        ("K mismatch", ValueError, lambda: f(cs, trans, dur, lengths, 5), "K = 5"),
        ("length 0", ValueError, lambda: f(cs, trans, dur, torch.tensor([30, 0], device="cuda"), 4),
         "lengths[1] = 0 is outside 1..=30"),
        ("length > T", ValueError, lambda: f(cs, trans, dur, torch.tensor([31, 1], device="cuda"), 4),
         "lengths[0] = 31"),
        ("lengths count", ValueError, lambda: f(cs, trans, dur, lengths[:1], 4), "lengths [B]"),
        ("transition shape", ValueError, lambda: f(cs, trans[:2], dur, lengths, 4), "transition scores shape"),
        ("duration labels", ValueError, lambda: f(cs, trans, dur[:, :2], lengths, 4), "duration scores shape"),
        ("nan score", ValueError, lambda: f(nan_cs, trans, dur, lengths, 4), "finite"),
        ("checkpoint 0", ValueError, lambda: f(cs, trans, dur, lengths, 4, checkpoint_interval=0), "checkpoint"),
        ("semiring", ValueError, lambda: f(cs, trans, dur, lengths, 4, semiring="sum"), "semiring"),
        ("max with grad", ValueError,
         lambda: f(cs.clone().requires_grad_(), trans, dur, lengths, 4, semiring="max"), "gradients"),
        ("proj_start", NotImplementedError, lambda: f(cs, trans, dur, lengths, 4, proj_start=cs), "proj_start"),
        ("(K, C, C) transitions", NotImplementedError,
         lambda: f(cs, trans.expand(4, 3, 3), dur, lengths, 4), "duration-dependent"),
    ]
    lines = []
    for name, exc, fn, needle in cases:
        try:
            fn()
        except exc as e:
            assert needle in str(e), f"{name}: {type(e).__name__} without {needle!r}: {e}"
            lines.append(f"{name}: {type(e).__name__}: {e}")
        else:
            raise AssertionError(f"{name}: no {exc.__name__}")
    z = f(cs, trans, dur, lengths, 4)
    torch.cuda.synchronize()
    assert torch.isfinite(z).all()
    print("\n".join("     " + line for line in lines))
    return f"{len(cases)} bad inputs raised; a good call after them works"


def opcheck():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    cs, trans, dur = inputs(3, 60, 5, 4, gen)
    lengths = torch.tensor([60, 31, 2], device="cuda")
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    ops = torch.ops.rustkernels
    torch.library.opcheck(ops.semicrf_forward.default, (cs, dur, trans, lengths, None), test_utils=utils)
    log_z, state = ops.semicrf_forward(cs, dur, trans, lengths, 7)
    w = torch.rand(3, device="cuda", generator=gen)
    torch.library.opcheck(
        ops.semicrf_backward.default, (w, cs, dur, trans, lengths, 7, state, log_z), test_utils=utils
    )
    torch.library.opcheck(ops.semicrf_viterbi.default, (cs, dur, trans, lengths), test_utils=utils)
    return "semicrf_forward, semicrf_backward, semicrf_viterbi"


def compiled_case(dtype, weights):
    """log Z and every gradient of a loss around ``semi_crf_streaming_forward`` compiled with
    ``fullgraph=True`` against eager on the same inputs: log Z within 1e-6 max(1, |Z|), each
    gradient within 1e-5 max |eager| + 1e-6 (the same kernels run; only their surroundings are
    compiled)."""
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    cs, trans, dur = inputs(2, 100, 6, 4, gen, dtype)
    lengths = torch.tensor([100, 57], device="cuda")
    w = torch.tensor([1.0, 0.25], device="cuda", dtype=dtype) if weights else None

    def loss(cs, trans, dur):
        z = semi_crf_streaming_forward(cs * 1.0, trans, dur, lengths, 6)
        return (z * w).sum() if weights else z.sum()

    def run(fn):
        leaves = [x.clone().requires_grad_() for x in (cs, trans, dur)]
        value = fn(*leaves)
        grads = torch.autograd.grad(value, leaves)
        return value.detach(), grads

    want, want_g = run(loss)
    got, got_g = run(torch.compile(loss, fullgraph=True))
    torch.cuda.synchronize()
    lines = [close("loss", got, want, 1e-6, 1e-6 * max(1.0, abs(want.item())))]
    for name, a, b in zip(("dcum_scores", "dtransition", "dduration_bias"), got_g, want_g):
        assert a.dtype == dtype and a.shape == b.shape, (name, a.dtype, a.shape)
        lines.append(close(name, a, b, 1e-5, 1e-6))
    return "fullgraph; compiled vs eager: " + ", ".join(lines)


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' semi-CRF GPU check)")
        print("0 passed, 0 failed")
        return 0
    major, minor = torch.cuda.get_device_capability()
    print(f"rustkernels.semicrf on {torch.cuda.get_device_name()} (sm_{major}{minor}), "
          f"torch {torch.__version__}, seed {SEED}")
    for c in QUICK_CASES if QUICK else CASES:
        check(f"log Z and gradients B={c[0]} T={c[1]} K={c[2]} C={c[3]} lengths={c[4]}",
              lambda c=c: run_case(*c))
    check("gradients, upstream weights per sequence, checkpoint 7",
          lambda: run_case(3, 90, 6, 4, [90, 45, 9], weights=True, checkpoint=7))
    check("float64 inputs", float64_inputs)
    for c in (CASES[1], CASES[3]) if QUICK else CASES[1:]:
        check(f"viterbi B={c[0]} T={c[1]} K={c[2]} C={c[3]}", lambda c=c: viterbi_case(*c))
    check("forward without grad", no_grad_forward)
    check("bad inputs", bad_inputs)
    check("torch.library.opcheck", opcheck)
    check("torch.compile: float32, loss sum", lambda: compiled_case(torch.float32, False))
    check("torch.compile: float32, weighted loss", lambda: compiled_case(torch.float32, True))
    check("torch.compile: float64", lambda: compiled_case(torch.float64, False))
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
