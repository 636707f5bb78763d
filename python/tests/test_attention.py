"""GPU check of rustkernels.flash_attn_func, forward and backward (plain Python with asserts; no
pytest needed); flash_attn_varlen_func (test_attention_varlen.py) and flash_attn_with_kvcache
(test_attention_decode.py) have their own files, on this file's references and helpers.

    python3 python/tests/test_attention.py [--quick]

Forward: against an f64 reference computed with torch.nn.functional.scaled_dot_product_attention
(math, float64, explicit mask; rows with no allowed key set to 0, LSE by logsumexp).
Tolerance (FlashAttention's rule, as tests/attention.rs): max |O - ref| <= 2 max |O_naive - ref|
+ 1e-3, where O_naive is a straightforward computation in the input precision (scores and
probabilities rounded to it); LSE within 1e-3 max(1, |ref|), and -inf exactly where the reference
has it. Each case runs on both kernel paths (auto: Hopper on sm_90; mma_sync), with the outputs
poisoned (NaN) as far as torch's caching allocator allows.

Backward, through autograd in both modes (atomic dQ, deterministic): dq, dk, dv of
sum(out dout) (+ sum(lse dlse) where the case has dLSE) against torch.autograd on the same
function in float64 (same mask semantics), per gradient G: max |G - ref| <= 2 max |G_naive - ref|
+ 1e-3 max |ref| + 1e-6, with G_naive the same autograd computation in the input precision (as
tests/attention/backward.rs); then deterministic mode bitwise equal over repeated runs, packed
QKV gradients, out.sum().backward(), bad input to the backward op.

Then: packed QKV views, a side stream, a new thread, CUDA graph replays, bad input (exceptions with the library's
message), torch.library's opcheck on both ops, torch.compile of the forward and of a training
step (forward and backward).

Prints one line per check and 'N passed, N failed' last; exits 1 on any failure, 0 with a SKIP
line without a CUDA device.
"""

import math
import os
import sys
import threading
import time
import traceback

import torch
import torch.nn.functional as F

import rustkernels
from rustkernels import flash_attn_func

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


def allowed_mask(sq, sk, causal, window, device):
    """[sq, sk] bool: query i may attend key j (bottom-right aligned, flash-attn's rule)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + sk - sq
    left, right = window
    if causal:
        right = 0
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        allowed &= j >= diag - left
    if right >= 0:
        allowed &= j <= diag + right
    return allowed


def heads_first(q, k, v):
    """[b, s, h, d] -> [b, h, s, d], K and V heads repeated for grouped-query attention."""
    group = q.shape[2] // k.shape[2]
    return (
        q.transpose(1, 2),
        k.transpose(1, 2).repeat_interleave(group, dim=1),
        v.transpose(1, 2).repeat_interleave(group, dim=1),
    )


def reference(q, k, v, scale, allowed):
    """f64 O [b, sq, h, d] (SDPA, math) and LSE [b, h, sq]."""
    qt, kt, vt = heads_first(q.double(), k.double(), v.double())
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=allowed, scale=scale)
    empty = ~allowed.any(dim=-1)
    out = out.masked_fill(empty[None, None, :, None], 0.0)
    s = (qt @ kt.transpose(-1, -2)) * scale
    lse = torch.logsumexp(s.masked_fill(~allowed, -math.inf), dim=-1)
    return out.transpose(1, 2), lse


def naive_same_precision(q, k, v, scale, allowed):
    """O as a straightforward implementation in the input precision computes it."""
    dt = q.dtype
    qt, kt, vt = heads_first(q, k, v)
    s = ((qt.float() * scale).to(dt) @ kt.transpose(-1, -2)).float()
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1).nan_to_num(0.0).to(dt)
    return (p @ vt).transpose(1, 2).double()


def poison_allocator(*shapes_dtypes, device):
    """Leave NaN-filled blocks of these sizes in torch's caching allocator, so the op's
    outputs (allocated next, same sizes) most likely start as NaN."""
    blocks = [torch.full(s, math.nan, dtype=d, device=device) for s, d in shapes_dtypes]
    del blocks


def run_case(
    b, sq, sk, hq, hkv, d, dtype, causal=False, window=(-1, -1), scale=None, path="auto", dv=None
):
    """One forward case; ``dv``: v's head dimension where it differs from q's and k's."""
    g = torch.Generator(device="cuda").manual_seed(SEED + sq * 7 + sk * 13 + d)
    dev = torch.device("cuda")
    dv = d if dv is None else dv
    q = torch.randn(b, sq, hq, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, dv, device=dev, dtype=dtype, generator=g)
    eff_scale = scale if scale is not None else 1.0 / math.sqrt(d)
    allowed = allowed_mask(sq, sk, causal, window, dev)
    poison_allocator(((b, sq, hq, dv), dtype), ((b, hq, sq), torch.float32), device=dev)
    if path == "auto":
        out, lse, _ = flash_attn_func(
            q, k, v, softmax_scale=scale, causal=causal, window_size=window, return_attn_probs=True
        )
    else:
        out, lse = torch.ops.rustkernels.flash_attn_forward(
            q, k, v, scale, causal, window[0], window[1], path
        )
    torch.cuda.synchronize()
    assert out.shape == (b, sq, hq, dv) and out.dtype == dtype, (out.shape, out.dtype)
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    ref_o, ref_lse = reference(q, k, v, eff_scale, allowed)
    naive = naive_same_precision(q, k, v, eff_scale, allowed)
    got = out.double()
    assert torch.isfinite(got).all(), "O has NaN or inf (or an unwritten element)"
    err = (got - ref_o).abs().max().item()
    naive_err = (naive - ref_o).abs().max().item()
    tol = 2 * naive_err + 1e-3
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "LSE is -inf exactly where no key is allowed"
    finite = ~empty
    lse_err = 0.0
    if finite.any():
        rel = (lse.double()[finite] - ref_lse[finite]).abs() / ref_lse[finite].abs().clamp(min=1.0)
        lse_err = rel.max().item()
    detail = (
        f"max |O - ref| = {err:.3e} (tol {tol:.3e} = 2 x naive {naive_err:.3e} + 1e-3), "
        f"LSE rel err {lse_err:.3e}, {int(empty.sum())} empty rows"
    )
    assert err <= tol, detail
    assert lse_err <= 1e-3, detail
    return detail


CASES = [
    # (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, causal, window, scale)
    (1, 1, 1, 1, 1, 64, torch.bfloat16, False, (-1, -1), None),
    (2, 113, 203, 8, 2, 64, torch.bfloat16, True, (-1, -1), None),
    (1, 239, 1, 4, 4, 128, torch.float16, False, (-1, -1), None),
    (2, 799, 3, 4, 1, 128, torch.bfloat16, True, (-1, -1), None),
    (1, 1023, 1024, 8, 8, 128, torch.bfloat16, True, (-1, -1), None),
    (2, 512, 512, 16, 4, 256, torch.bfloat16, False, (64, 32), None),
    (1, 300, 500, 4, 2, 256, torch.float16, False, (100, -1), None),
    (1, 1024, 1024, 4, 1, 64, torch.float16, True, (128, -1), None),
    (3, 128, 128, 6, 3, 64, torch.bfloat16, False, (0, 0), 0.3),
    (2, 2048, 2048, 8, 2, 128, torch.float16, False, (-1, -1), None),
    (2, 113, 203, 4, 2, 96, torch.bfloat16, True, (-1, -1), None),
    (1, 300, 300, 4, 4, 192, torch.float16, False, (64, -1), None),
]
# Head dimensions that take the tiles of the next of 64, 128, 256 (every multiple of 16 from 32
# to 256 has kernels).
OTHER_DIM_CASES = [
    (2, 113, 203, 4, 2, 80, torch.bfloat16, True, (-1, -1), None),
    (1, 300, 257, 4, 1, 32, torch.float16, False, (-1, -1), None),
    (1, 129, 300, 2, 2, 240, torch.bfloat16, False, (40, 8), None),
]
# v of its own head dimension (both paths): (..., dv).
VALUE_DIM_CASES = [
    (2, 113, 203, 8, 2, 192, torch.bfloat16, True, (-1, -1), None, 128),
    (1, 1023, 1024, 4, 4, 192, torch.float16, False, (-1, -1), None, 128),
    (1, 500, 700, 4, 1, 192, torch.bfloat16, False, (64, 32), None, 128),
]
if QUICK:
    CASES = CASES[:5] + OTHER_DIM_CASES[:1]
else:
    CASES = CASES + OTHER_DIM_CASES


def dtype_name(dt):
    return str(dt).replace("torch.", "")


def case_name(c, path):
    b, sq, sk, hq, hkv, d, dt, causal, window, scale = c
    return (
        f"forward/{path}/{dtype_name(dt)} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d}"
        f"{' causal' if causal else ''}{'' if window == (-1, -1) else f' window{window}'}"
        f"{'' if scale is None else f' scale{scale}'}"
    )


def value_dim_backward_sm80():
    """v of head dimension 128 beside q, k of 192 with the mma.sync kernels forced
    (``KERNELS_ARCH=sm_80``): the forward runs, the backward (the Hopper kernels only) is
    refused with the library's message."""
    dev = "cuda"
    q = torch.randn(1, 64, 2, 192, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 64, 2, 192, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, 64, 2, 128, device=dev, dtype=torch.bfloat16)
    out = flash_attn_func(q, k, v, causal=True)
    assert out.shape == (1, 64, 2, 128), out.shape
    return raises(ValueError, lambda: out.sum().backward(), "V and O of their own head dimension")


def packed_qkv():
    """q, k, v as views of one [b, s, 3, h, d] tensor (strides of the packed layout)."""
    b, s, h, d = 2, 333, 4, 128
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(dim=2)
    out = flash_attn_func(q, k, v, causal=True)
    want = flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    torch.cuda.synchronize()
    assert torch.equal(out, want), "views and contiguous copies give different results"
    return f"q strides {q.stride()}"


def side_stream():
    """The op runs on torch's current stream (here a side stream), ordered after its inputs."""
    q = torch.randn(1, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    want = flash_attn_func(q, q, q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x = q * 1.0  # made on the side stream, right before the op reads it
        out = flash_attn_func(x, x, x)
    stream.synchronize()
    assert torch.equal(out, want)
    return None


def another_thread():
    """A thread that has not used CUDA yet (no current context): the op makes the device's
    primary context current and runs there."""
    q = torch.randn(2, 200, 4, 64, device="cuda", dtype=torch.float16)
    want = flash_attn_func(q, q, q, causal=True)
    torch.cuda.synchronize()
    got = {}

    def work():
        try:
            got["out"] = flash_attn_func(q, q, q, causal=True)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported by the assert below
            got["error"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in got, f"in a new thread: {got.get('error')!r}"
    assert torch.equal(got["out"], want)
    return None


def cuda_graph():
    """The forward captured in a CUDA graph and replayed on new inputs: short causal problems
    draw their tiles from a counter the op allocates per call (captured, the graph's own,
    zeroed by a captured memset on each replay). Every replay equals the eager call bitwise."""
    lines = []
    for b, s, h, d in ((4, 1024, 8, 64), (2, 2048, 8, 128)):
        static = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capturing stream, as torch asks
            flash_attn_func(*static, causal=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = flash_attn_func(*static, causal=True)
        for i in range(3):
            fresh = [torch.randn_like(t) for t in static]
            for t, f in zip(static, fresh):
                t.copy_(f)
            graph.replay()
            want = flash_attn_func(*fresh, causal=True)
            torch.cuda.synchronize()
            assert torch.equal(out, want), f"B{b} S{s} D{d}: replay {i} differs from eager"
        lines.append(f"B{b} S{s} H{h} D{d}")
    return "3 replays each, causal: " + ", ".join(lines)


def raises(exc, fn, contains=None):
    try:
        fn()
    except exc as e:
        msg = str(e)
        if contains is not None:
            assert contains in msg, f"{exc.__name__} without {contains!r}: {msg}"
        return f"{exc.__name__}: {msg}"
    except Exception as e:  # noqa: BLE001 - the wrong exception type fails the check
        raise AssertionError(f"expected {exc.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {exc.__name__}, nothing was raised")


def bad_inputs():
    dev = "cuda"
    bf = torch.bfloat16
    q = torch.randn(2, 64, 4, 64, device=dev, dtype=bf)
    kv = torch.randn(2, 64, 2, 64, device=dev, dtype=bf)
    kv3 = torch.randn(2, 64, 3, 64, device=dev, dtype=bf)
    kv128 = torch.randn(2, 64, 2, 128, device=dev, dtype=bf)
    cases = [
        ("cpu tensor", ValueError, lambda: flash_attn_func(q.cpu(), kv.cpu(), kv.cpu()), "CUDA"),
        ("float32", TypeError, lambda: flash_attn_func(q.float(), kv.float(), kv.float()), "bfloat16"),
        ("mixed dtypes", TypeError, lambda: flash_attn_func(q, kv.half(), kv), "float16"),
        ("rank 3", ValueError, lambda: flash_attn_func(q[0], kv[0], kv[0]), "4 dimensions"),
        ("not a tensor", TypeError, lambda: flash_attn_func(q, kv, 3.0), "torch.Tensor"),
        (
            "head dim 72",
            ValueError,
            lambda: flash_attn_func(
                torch.randn(2, 64, 4, 72, device=dev, dtype=bf),
                torch.randn(2, 64, 2, 72, device=dev, dtype=bf),
                torch.randn(2, 64, 2, 72, device=dev, dtype=bf),
            ),
            "head dimension 72",
        ),
        ("heads 4 vs 3", ValueError, lambda: flash_attn_func(q, kv3, kv3), "multiple"),
        ("batch mismatch", ValueError, lambda: flash_attn_func(q, kv[:1], kv[:1]), "K shape"),
        ("k, v lengths differ", ValueError, lambda: flash_attn_func(q, kv, kv[:, :63]), "V shape"),
        ("head dim mismatch", ValueError, lambda: flash_attn_func(q, kv128, kv128), "K shape"),
        (
            "strided head dim",
            ValueError,
            lambda: flash_attn_func(torch.randn(2, 64, 64, 4, device=dev, dtype=bf).transpose(2, 3), kv, kv),
            "head dimension must be contiguous",
        ),
        (
            "stride not a multiple of 8",
            ValueError,
            lambda: flash_attn_func(torch.randn(2, 64, 4, 68, device=dev, dtype=bf)[..., :64], kv, kv),
            "aligned to 16 bytes",
        ),
        (
            "misaligned start",
            ValueError,
            lambda: flash_attn_func(torch.randn(2 * 64 * 4 * 64 + 1, device=dev, dtype=bf)[1:].view(2, 64, 4, 64), kv, kv),
            "Q start must be aligned",
        ),
        ("dropout", NotImplementedError, lambda: flash_attn_func(q, kv, kv, dropout_p=0.1), "dropout"),
        ("softcap -1", ValueError, lambda: flash_attn_func(q, kv, kv, softcap=-1.0), "softcap"),
        ("alibi", NotImplementedError, lambda: flash_attn_func(q, kv, kv, alibi_slopes=torch.ones(4, device=dev)), "ALiBi"),
        ("window -2", ValueError, lambda: flash_attn_func(q, kv, kv, window_size=(-2, 0)), "window_size"),
        ("window not a pair", ValueError, lambda: flash_attn_func(q, kv, kv, window_size=3), "pair"),
        ("scale nan", ValueError, lambda: flash_attn_func(q, kv, kv, softmax_scale=float("nan")), "scale"),
        ("scale negative", ValueError, lambda: flash_attn_func(q, kv, kv, softmax_scale=-1.0), "scale"),
        ("empty batch", ValueError, lambda: flash_attn_func(q[:0], kv[:0], kv[:0]), "batch"),
        ("unknown path", ValueError, lambda: torch.ops.rustkernels.flash_attn_forward(q, kv, kv, None, False, -1, -1, "fast"), "path"),
    ]
    if torch.cuda.device_count() > 1:
        cases.append(
            ("k on another device", ValueError, lambda: flash_attn_func(q, kv.to("cuda:1"), kv), "cuda:1")
        )
    lines = []
    for name, exc, fn, contains in cases:
        lines.append(f"{name} -> {raises(exc, fn, contains)}")
    # The context is fine afterwards: a good call still works.
    out = flash_attn_func(q, kv, kv)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    print("\n".join("     " + line for line in lines))
    return f"{len(cases)} bad inputs raised; a good call after them works"


def autograd_sum_backward():
    """``flash_attn_func(...).sum().backward()`` works: the upstream gradient is an expanded
    view (strides 0), laid out for the kernels by the autograd node; gradients flow to every
    input, dk and dv in k's and v's shapes (grouped-query attention)."""
    q = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 80, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 80, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=True)
    assert out.requires_grad and out.grad_fn is not None
    with torch.no_grad():
        assert not flash_attn_func(q, k, v).requires_grad
    out.sum().backward()
    grads = (q.grad, k.grad, v.grad)
    # The same gradients from an explicit, contiguous dout of ones.
    want = torch.autograd.grad(flash_attn_func(q, k, v, causal=True), (q, k, v), torch.ones_like(out))
    torch.cuda.synchronize()
    for name, t, g, w in zip("qkv", (q, k, v), grads, want):
        assert g is not None and g.shape == t.shape and g.dtype == t.dtype, (name, g)
        assert torch.isfinite(g.float()).all(), f"d{name} has NaN or inf"
        err = (g.float() - w.float()).abs().max().item()
        assert err <= 1e-2 * w.float().abs().max().item() + 1e-6, f"d{name}: {err}"
    return "dq, dk, dv finite; equal to an explicit dout of ones (up to f32 atomics)"


def grads_reference(q, k, v, dout, dlse, scale, allowed, dtype):
    """dq, dk, dv of ``loss = sum(out dout) + sum(lse dlse)`` by torch.autograd, in f64
    (``dtype = float64``: the reference) or as a straightforward implementation in the input
    precision computes them (``dtype`` = q's: scores, probabilities and O rounded to it, the
    softmax in f32). Rows with no allowed key: out 0, no gradient (as the kernels)."""
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    qd, kd, vd = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    qt, kt, vt = heads_first(qd, kd, vd)
    empty = ~allowed.any(dim=-1)
    s = ((qt * scale) @ kt.transpose(-1, -2)).to(ct)
    s = s.masked_fill(~allowed, -math.inf).masked_fill(empty[:, None], 0.0)
    p = torch.softmax(s, dim=-1) * (~empty)[:, None].to(ct)
    out = p.to(dtype) @ vt
    loss = (out.to(ct) * dout.transpose(1, 2).to(ct)).sum()
    if dlse is not None:
        lse = torch.logsumexp(s, dim=-1)
        loss = loss + (lse * dlse.to(ct) * (~empty).to(ct)).sum()
    dq, dk, dv = torch.autograd.grad(loss, (qd, kd, vd))
    return [t.double() for t in (dq, dk, dv)]


def run_backward_case(b, sq, sk, hq, hkv, d, dtype, causal, window, scale, with_dlse, dv=None):
    """The gradients of flash_attn_func through autograd, in both modes (atomic dQ and
    deterministic), against the f64 reference with FlashAttention's rule per gradient G:
    max |G - ref| <= 2 max |G_naive - ref| + 1e-3 max |ref| + 1e-6 m (as
    tests/attention/backward.rs, whose inputs lie in [-1, 1): there m = 1); m = max|dO| max|V|
    max(max|Q|, max|K|) scales the absolute floor to these normal inputs. The floor covers the
    f32 rounding of dP - delta where the exact gradient is 0 (a row with one key: dP = delta
    exactly, and the kernels sum the two in different orders), which grows with those
    magnitudes; every element finite (the gradients' memory poisoned with NaN first). ``dv``:
    v, out and dout of that head dimension (a pair beside q and k of ``d``)."""
    g = torch.Generator(device="cuda").manual_seed(SEED + 3 * sq + 5 * sk + d)
    dev = torch.device("cuda")
    dv = d if dv is None else dv
    q = torch.randn(b, sq, hq, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, dv, device=dev, dtype=dtype, generator=g)
    dout = torch.randn(b, sq, hq, dv, device=dev, dtype=dtype, generator=g)
    dlse = torch.randn(b, hq, sq, device=dev, generator=g) if with_dlse else None
    eff_scale = scale if scale is not None else 1.0 / math.sqrt(d)
    mag = lambda t: t.abs().max().item()
    abs_floor = 1e-6 * mag(dout) * mag(v) * max(mag(q), mag(k))
    allowed = allowed_mask(sq, sk, causal, window, dev)
    ref = grads_reference(q, k, v, dout, dlse, eff_scale, allowed, torch.float64)
    naive = grads_reference(q, k, v, dout, dlse, eff_scale, allowed, dtype)
    details = []
    for deterministic in (False, True):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        poison_allocator(
            ((b, sq, hq, d), dtype), ((b, sk, hkv, d), dtype), ((b, sk, hkv, dv), dtype), device=dev
        )
        out, lse, _ = flash_attn_func(
            qg,
            kg,
            vg,
            softmax_scale=scale,
            causal=causal,
            window_size=window,
            deterministic=deterministic,
            return_attn_probs=True,
        )
        outputs, grads_out = [out], [dout]
        if with_dlse:
            outputs.append(lse)
            grads_out.append(dlse)
        got = torch.autograd.grad(outputs, (qg, kg, vg), grads_out)
        torch.cuda.synchronize()
        mode = "det" if deterministic else "atomic"
        parts = []
        for name, gk, gr, gn, t in zip(("dq", "dk", "dv"), got, ref, naive, (q, k, v)):
            assert gk.shape == t.shape and gk.dtype == dtype, (name, gk.shape, gk.dtype)
            gk = gk.double()
            assert torch.isfinite(gk).all(), f"{mode}: {name} has NaN or inf (or an unwritten element)"
            err = (gk - gr).abs().max().item()
            naive_err = (gn - gr).abs().max().item()
            tol = 2 * naive_err + 1e-3 * gr.abs().max().item() + abs_floor
            parts.append(f"{name} {err:.2e} (tol {tol:.2e}, naive {naive_err:.2e})")
            assert err <= tol, f"{mode}: " + ", ".join(parts)
        details.append(f"{mode}: " + ", ".join(parts))
    return "; ".join(details)


BWD_CASES = [
    # (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, causal, window, scale, dlse)
    (1, 1, 1, 1, 1, 64, torch.bfloat16, False, (-1, -1), None, False),
    (2, 113, 203, 8, 2, 64, torch.bfloat16, True, (-1, -1), None, False),
    (1, 239, 1, 4, 4, 128, torch.float16, False, (-1, -1), None, True),
    (2, 799, 3, 4, 1, 128, torch.bfloat16, True, (-1, -1), None, True),
    (1, 300, 500, 4, 2, 256, torch.float16, False, (100, -1), None, False),
    (2, 512, 512, 8, 4, 256, torch.bfloat16, False, (64, 32), None, True),
    (1, 1024, 1024, 4, 1, 64, torch.float16, True, (128, -1), None, False),
    (3, 128, 128, 6, 3, 64, torch.bfloat16, False, (0, 0), 0.3, False),
    (1, 1023, 1024, 8, 8, 128, torch.bfloat16, True, (-1, -1), None, False),
    (1, 200, 150, 4, 2, 256, torch.bfloat16, True, (-1, -1), None, False),
    (2, 113, 203, 4, 2, 96, torch.bfloat16, True, (-1, -1), None, True),
    (1, 200, 150, 4, 4, 192, torch.float16, False, (-1, -1), None, False),
    (2, 113, 203, 4, 2, 80, torch.bfloat16, False, (-1, -1), None, False),
    (1, 150, 200, 4, 4, 160, torch.float16, True, (-1, -1), None, True),
    (1, 113, 203, 4, 2, 240, torch.bfloat16, False, (40, 7), None, False),
]
if QUICK:
    BWD_CASES = BWD_CASES[:4]
# v, out and dout of their own head dimension (the Hopper kernels): (..., dv).
VALUE_DIM_BWD_CASES = [
    (2, 113, 203, 8, 2, 192, torch.bfloat16, True, (-1, -1), None, True, 128),
    (1, 1023, 1024, 4, 4, 192, torch.float16, False, (-1, -1), None, False, 128),
    (1, 500, 700, 4, 1, 192, torch.bfloat16, False, (64, 32), None, True, 128),
]


def backward_case_name(c):
    b, sq, sk, hq, hkv, d, dt, causal, window, scale, dlse = c
    return (
        f"backward/{dtype_name(dt)} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d}"
        f"{' causal' if causal else ''}{'' if window == (-1, -1) else f' window{window}'}"
        f"{'' if scale is None else f' scale{scale}'}{' dLSE' if dlse else ''}"
    )


def deterministic_repeats():
    """deterministic=True: the gradients are bitwise equal over repeated runs."""
    g = torch.Generator(device="cuda").manual_seed(SEED)
    q = torch.randn(2, 777, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = torch.randn(2, 900, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(2, 777, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    runs = []
    for _ in range(4):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, kv, kv))
        out = flash_attn_func(qg, kg, vg, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (qg, kg, vg), dout))
    torch.cuda.synchronize()
    for i, r in enumerate(runs[1:], 1):
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], r):
            assert torch.equal(a, b), f"run {i}: {name} differs from run 0"
    return f"{len(runs)} runs bitwise equal"


def packed_qkv_backward():
    """Gradients into a packed [b, s, 3, h, d] tensor through q, k, v views equal those of
    contiguous copies (deterministic mode, so bitwise)."""
    b, s, h, d = 2, 333, 4, 128
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(dim=2)
    out = flash_attn_func(q, k, v, causal=True, deterministic=True)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    parts = [t.detach().contiguous().requires_grad_() for t in qkv.unbind(dim=2)]
    out2 = flash_attn_func(*parts, causal=True, deterministic=True)
    want = torch.autograd.grad(out2, parts, dout)
    torch.cuda.synchronize()
    assert torch.equal(dqkv, torch.stack(want, dim=2)), "packed and contiguous gradients differ"
    return None


def bad_backward_inputs():
    dev = "cuda"
    bf = torch.bfloat16
    q = torch.randn(2, 64, 4, 64, device=dev, dtype=bf)
    kv = torch.randn(2, 64, 2, 64, device=dev, dtype=bf)
    out, lse = torch.ops.rustkernels.flash_attn_forward(q, kv, kv, None, False, -1, -1)
    dout = torch.randn_like(out)

    def call(**kw):
        a = dict(dout=dout, q=q, k=kv, v=kv, out=out, lse=lse, dlse=None)
        a.update(kw)
        return torch.ops.rustkernels.flash_attn_backward(
            a["dout"], a["q"], a["k"], a["v"], a["out"], a["lse"], a["dlse"], None, False, -1, -1, False
        )

    strided = torch.randn(2, 64, 64, 4, device=dev, dtype=bf).transpose(2, 3)
    lse_t = lse.transpose(1, 2).contiguous().transpose(1, 2)
    k128 = torch.randn(2, 64, 2, 128, device=dev, dtype=bf)
    cases = [
        ("dout of the wrong shape", ValueError, lambda: call(dout=dout[:, :63]), "dO shape"),
        ("dout of another dtype", TypeError, lambda: call(dout=dout.half()), "dout"),
        ("dout strided head dim", ValueError, lambda: call(dout=strided), "head dimension must be contiguous"),
        ("out of the wrong shape", ValueError, lambda: call(out=out[:1]), "O shape"),
        ("out on the CPU", ValueError, lambda: call(out=out.cpu()), "out"),
        ("lse bfloat16", TypeError, lambda: call(lse=lse.to(bf)), "float32"),
        ("lse of the wrong shape", ValueError, lambda: call(lse=lse[:, :2]), "LSE shape"),
        ("lse not contiguous", ValueError, lambda: call(lse=lse_t), "LSE must be contiguous"),
        ("dlse of the wrong shape", ValueError, lambda: call(dlse=lse[..., :10].contiguous()), "dLSE shape"),
        ("dlse on the CPU", ValueError, lambda: call(dlse=lse.cpu()), "dsoftmax_lse"),
        ("k of another head dim", ValueError, lambda: call(k=k128), "K shape"),
    ]
    lines = [f"{name} -> {raises(exc, fn, contains)}" for name, exc, fn, contains in cases]
    dq, dk, dv, _ = call()
    torch.cuda.synchronize()
    assert all(torch.isfinite(t.float()).all() for t in (dq, dk, dv))
    print("\n".join("     " + line for line in lines))
    return f"{len(cases)} bad inputs raised; a good call after them works"


def opcheck():
    q = torch.randn(2, 100, 4, 64, device="cuda", dtype=torch.float16)
    kv = torch.randn(2, 150, 2, 64, device="cuda", dtype=torch.float16)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    torch.library.opcheck(
        torch.ops.rustkernels.flash_attn_forward.default, (q, kv, kv, None, True, -1, -1), test_utils=utils
    )
    out, lse = torch.ops.rustkernels.flash_attn_forward(q, kv, kv, None, True, -1, -1)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    for dl, det in ((None, False), (dlse, True)):
        torch.library.opcheck(
            torch.ops.rustkernels.flash_attn_backward.default,
            (dout, q, kv, kv, out, lse, dl, None, True, -1, -1, det),
            test_utils=utils,
        )
    return "flash_attn_forward; flash_attn_backward without dLSE, and with dLSE deterministic"


def compiled():
    q = torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 256, 2, 128, device="cuda", dtype=torch.bfloat16)

    def layer(q, k, v):
        return flash_attn_func(q * 0.5, k, v, causal=True).float().sum(dim=-1)

    want = layer(q, kv, kv)
    got = torch.compile(layer, fullgraph=True)(q, kv, kv)
    torch.cuda.synchronize()
    err = (got - want).abs().max().item()
    assert err <= 1e-3, f"compiled vs eager: {err}"
    return f"fullgraph; max |compiled - eager| = {err:.1e}"


def compiled_training_step():
    """A training step under torch.compile(fullgraph=True): the loss (forward) compiled, its
    backward compiled by AOTAutograd through the autograd node into flash_attn_backward;
    the gradients (deterministic mode) against eager, and two compiled steps bitwise equal."""
    g = torch.Generator(device="cuda").manual_seed(SEED)
    bf = torch.bfloat16
    x = torch.randn(2, 200, 256, device="cuda", dtype=bf, generator=g)
    wq = (torch.randn(256, 256, device="cuda", dtype=bf, generator=g) / 16).requires_grad_()
    wkv = (torch.randn(256, 256, device="cuda", dtype=bf, generator=g) / 16).requires_grad_()
    target = torch.randn(2, 200, 4, 64, device="cuda", generator=g)

    def loss_fn(x, wq, wkv, target):
        q = (x @ wq).view(2, 200, 4, 64)
        k, v = (x @ wkv).view(2, 200, 2, 128).split(64, dim=-1)
        out = flash_attn_func(q, k, v, causal=True, window_size=(64, -1), deterministic=True)
        return ((out.float() - target) ** 2).mean()

    def step(fn):
        loss = fn(x, wq, wkv, target)
        grads = torch.autograd.grad(loss, (wq, wkv))
        return loss.detach(), grads

    want_loss, want = step(loss_fn)
    compiled_fn = torch.compile(loss_fn, fullgraph=True)
    got_loss, got = step(compiled_fn)
    _, got2 = step(compiled_fn)
    torch.cuda.synchronize()
    lines = [f"loss {got_loss.item():.5f} vs eager {want_loss.item():.5f}"]
    assert abs(got_loss.item() - want_loss.item()) <= 1e-3 * abs(want_loss.item()) + 1e-5, lines[0]
    for name, a, b, c in zip(("dwq", "dwkv"), got, want, got2):
        assert torch.isfinite(a.float()).all(), f"{name} has NaN or inf"
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        lines.append(f"{name} max |compiled - eager| {err:.1e} (max |eager| {scale:.1e})")
        assert err <= 2e-2 * scale + 1e-6, lines[-1]
        assert torch.equal(a, c), f"{name}: two compiled steps differ (deterministic mode)"
    return "fullgraph; " + ", ".join(lines)


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' GPU check)")
        print("0 passed, 0 failed")
        return 0
    torch.manual_seed(SEED)
    major, minor = torch.cuda.get_device_capability()
    print(
        f"rustkernels on {torch.cuda.get_device_name()} (sm_{major}{minor}), torch {torch.__version__}, "
        f"seed {SEED}"
    )
    start = time.time()
    check("first call (loads the kernels)", lambda: run_case(1, 128, 128, 2, 2, 64, torch.bfloat16))
    print(f"     first call took {time.time() - start:.2f}s")
    for c in CASES:
        b, sq, sk, hq, hkv, d, dt, causal, window, scale = c
        for path in ("auto", "mma_sync"):
            check(case_name(c, path), lambda: run_case(b, sq, sk, hq, hkv, d, dt, causal, window, scale, path))
    if (major, minor) == (9, 0) and os.environ.get("KERNELS_ARCH") != "sm_80":
        c = CASES[1]
        b, sq, sk, hq, hkv, d, dt, causal, window, scale = c
        check(case_name(c, "hopper"), lambda: run_case(b, sq, sk, hq, hkv, d, dt, causal, window, scale, "hopper"))
        # v of its own head dimension: its backward (the Hopper kernels).
        for c in VALUE_DIM_BWD_CASES:
            check(backward_case_name(c[:-1]) + f" dv{c[-1]}", lambda c=c: run_backward_case(*c))
    else:
        check("value head dimension: backward refused off Hopper", value_dim_backward_sm80)
    # v of its own head dimension (the (192, 128) pair), both paths.
    for c in VALUE_DIM_CASES:
        b, sq, sk, hq, hkv, d, dt, causal, window, scale, dv = c
        for path in ("auto", "mma_sync"):
            check(
                case_name(c[:-1], path) + f" dv{dv}",
                lambda: run_case(b, sq, sk, hq, hkv, d, dt, causal, window, scale, path, dv),
            )
    check("packed qkv views", packed_qkv)
    check("side stream", side_stream)
    check("another thread", another_thread)
    check("CUDA graph replays", cuda_graph)
    check("bad inputs", bad_inputs)
    for c in BWD_CASES:
        check(backward_case_name(c), lambda c=c: run_backward_case(*c))
    check("autograd: out.sum().backward()", autograd_sum_backward)
    check("backward: deterministic runs bitwise equal", deterministic_repeats)
    check("backward: packed qkv views", packed_qkv_backward)
    check("backward: bad inputs", bad_backward_inputs)
    check("torch.library.opcheck", opcheck)
    check("torch.compile", compiled)
    check("torch.compile: training step", compiled_training_step)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
