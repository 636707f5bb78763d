"""GPU check of rustkernels.flash_attn_fp8_func, the FP8 attention forward (plain Python with
asserts; no pytest needed).

    python3 python/tests/test_attention_fp8.py [--quick]

e4m3 q, k, v quantized from random values with per-tensor descales (amax / 448), against the
f64 reference of the dequantized values (test_attention.py's): O within FlashAttention's rule
(2 x the error of the plain FP8 computation, P rounded to e4m3 and accumulated in f32, + 1e-3),
LSE within 1e-3 max(1, |ref|), outputs poisoned first; the bf16 forward on the same dequantized
values beside it (relative RMS errors printed). Then descales as one-element tensors; bad input
(exceptions with the library's message); torch.library's opcheck; torch.compile.

Prints one line per check and 'N passed, N failed' last; exits 1 on any failure, 0 with a SKIP
line without a CUDA device of compute capability 9.0 (the FP8 kernels are Hopper's) or with
KERNELS_ARCH=sm_80 (the portable PTX has no FP8 kernels).
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
    heads_first,
    poison_allocator,
    raises,
    reference,
    results,
)

from rustkernels import flash_attn_func, flash_attn_fp8_func  # noqa: E402

FP8 = torch.float8_e4m3fn

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window)
CASES = [
    (2, 113, 203, 4, 2, 128, True, (-1, -1)),
    (1, 1, 1, 2, 1, 128, False, (-1, -1)),
    (1, 300, 300, 4, 4, 256, False, (64, 32)),
    (2, 1023, 1024, 8, 2, 128, False, (-1, -1)),
    (1, 129, 389, 2, 1, 256, True, (-1, -1)),
]
if QUICK:
    CASES = CASES[:3]


def quantize(x):
    """e4m3 values and their descale (amax / 448) of the f32 tensor x."""
    descale = max(x.abs().max().item(), 1e-6) / 448.0
    return (x / descale).clamp(-448.0, 448.0).to(FP8), descale


def fp8_inputs(b, sq, sk, hq, hkv, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.device("cuda")
    q, qs = quantize(torch.randn(b, sq, hq, d, device=dev, generator=g))
    k, ks = quantize(torch.randn(b, sk, hkv, d, device=dev, generator=g))
    v, vs = quantize(torch.randn(b, sk, hkv, d, device=dev, generator=g))
    return q, k, v, (qs, ks, vs)


def naive_fp8(q, k, v, descales, scale, allowed):
    """O as the plain FP8 computation gives it: logits of the dequantized inputs, P = exp(s -
    row max) rounded to e4m3, sum(P V) in f32 times V's descale over the f32 row sum, bf16."""
    qs, ks, vs = descales
    qt, kt, vt = heads_first(q.double() * qs, k.double() * ks, v.float())
    s = (qt @ kt.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - m).nan_to_num(0.0).float()
    w = e.to(FP8).float()
    o = (w @ vt) * vs / e.sum(dim=-1, keepdim=True)
    o = o.nan_to_num(0.0).to(torch.bfloat16).double()
    return o.transpose(1, 2)


def rel_rms(a, b):
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def run_case(b, sq, sk, hq, hkv, d, causal, window):
    q, k, v, descales = fp8_inputs(b, sq, sk, hq, hkv, d, SEED + sq + 3 * sk + d)
    qs, ks, vs = descales
    scale = 1.0 / math.sqrt(d)
    dev = q.device
    allowed = allowed_mask(sq, sk, causal, window, dev)
    poison_allocator(((b, sq, hq, d), torch.bfloat16), ((b, hq, sq), torch.float32), device=dev)
    out, lse, _ = flash_attn_fp8_func(
        q, k, v, qs, ks, vs, causal=causal, window_size=window, return_attn_probs=True
    )
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, d), (out.dtype, out.shape)
    assert lse.dtype == torch.float32 and lse.shape == (b, hq, sq), (lse.dtype, lse.shape)
    deq = (q.double() * qs, k.double() * ks, v.double() * vs)
    ref_o, ref_lse = reference(*deq, scale, allowed)
    naive = naive_fp8(q, k, v, descales, scale, allowed)
    err = (out.double() - ref_o).abs().max().item()
    naive_err = (naive - ref_o).abs().max().item()
    tol = 2 * naive_err + 1e-3
    assert math.isfinite(err) and err <= tol, f"O max error {err:.3e} > {tol:.3e}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin), "LSE: -inf where the reference is not"
    lse_err = ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp_min(1.0))[fin]
    lse_err = lse_err.max().item() if fin.any() else 0.0
    assert lse_err <= 1e-3, f"LSE relative error {lse_err:.3e}"
    bf = [t.to(torch.bfloat16) for t in deq]
    out_bf16 = flash_attn_func(*bf, causal=causal, window_size=window).double()
    return (
        f"O max error {err:.2e} (tol {tol:.2e}), LSE {lse_err:.1e}; relative RMS FP8 "
        f"{rel_rms(out.double(), ref_o):.2e}, bf16 on the same values {rel_rms(out_bf16, ref_o):.2e}"
    )


def case_name(c):
    b, sq, sk, hq, hkv, d, causal, window = c
    name = f"fp8 b{b} sq{sq} sk{sk} h{hq}x{hkv} d{d}"
    if causal:
        name += " causal"
    if window != (-1, -1):
        name += f" window{window}"
    return name


def tensor_descales():
    """Descales as one-element tensors give the floats' result, bit for bit."""
    q, k, v, (qs, ks, vs) = fp8_inputs(1, 64, 96, 2, 2, 128, SEED)
    a = flash_attn_fp8_func(q, k, v, qs, ks, vs, causal=True)
    t = [torch.tensor([x], device="cuda") for x in (qs, ks, vs)]
    b = flash_attn_fp8_func(q, k, v, *t, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(a, b), "tensor descales differ from float descales"
    return None


def bad_inputs():
    q, k, v, (qs, ks, vs) = fp8_inputs(1, 32, 32, 2, 2, 128, SEED)
    q64, k64, v64, _ = fp8_inputs(1, 32, 32, 2, 2, 64, SEED)
    cases = [
        (TypeError, lambda: flash_attn_fp8_func(q.to(torch.bfloat16), k, v), "float8_e4m3fn"),
        (ValueError, lambda: flash_attn_fp8_func(q[0], k, v), "4 dimensions"),
        (ValueError, lambda: flash_attn_fp8_func(q64, k64, v64), "64"),
        (ValueError, lambda: flash_attn_fp8_func(q, k, v, q_descale=-1.0), "descale"),
        (ValueError, lambda: flash_attn_fp8_func(q, k, v, k_descale=torch.ones(2, device="cuda")), "one descale"),
        (TypeError, lambda: flash_attn_fp8_func(q, k, v, v_descale="1"), "v_descale"),
        (ValueError, lambda: flash_attn_fp8_func(q, k, v, window_size=(-2, 0)), "window_size"),
        (ValueError, lambda: flash_attn_fp8_func(q.cpu(), k, v), "CUDA"),
    ]
    lines = [raises(exc, fn, contains) for exc, fn, contains in cases]
    out = flash_attn_fp8_func(q, k, v, qs, ks, vs)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    print("\n".join("     " + line for line in lines))
    return f"{len(cases)} bad inputs raised; a good call after them works"


def fp8_opcheck():
    # Not "test_schema": its check that the op leaves its inputs alone compares them with
    # torch.allclose, which torch does not implement for float8_e4m3fn ("mul_cuda").
    q, k, v, (qs, ks, vs) = fp8_inputs(1, 100, 130, 4, 2, 128, SEED)
    utils = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    torch.library.opcheck(
        torch.ops.rustkernels.flash_attn_fp8_forward.default,
        (q, k, v, qs, ks, vs, None, True, -1, -1),
        test_utils=utils,
    )
    return "flash_attn_fp8_forward, causal (fake tensor, AOT dispatch static and dynamic)"


def fp8_compiled():
    """The FP8 forward under torch.compile(fullgraph=True), against eager (bitwise)."""
    q, k, v, (qs, ks, vs) = fp8_inputs(2, 200, 300, 4, 2, 128, SEED)
    f = lambda q, k, v: flash_attn_fp8_func(q, k, v, qs, ks, vs, causal=True)  # noqa: E731
    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(eager, compiled), "compiled differs from eager"
    return "fullgraph; compiled == eager"


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' GPU check)")
        print("0 passed, 0 failed")
        return 0
    if os.environ.get("KERNELS_ARCH") == "sm_80":
        print("SKIP: KERNELS_ARCH=sm_80 (the FP8 kernels are in the sm_90a PTX only)")
        print("0 passed, 0 failed")
        return 0
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        print(f"SKIP: the FP8 kernels need compute capability 9.0, this GPU is {major}.{minor}")
        print("0 passed, 0 failed")
        return 0
    torch.manual_seed(SEED)
    print(
        f"rustkernels FP8 forward on {torch.cuda.get_device_name()} (sm_{major}{minor}), "
        f"torch {torch.__version__}, seed {SEED}"
    )
    for c in CASES:
        check(case_name(c), lambda c=c: run_case(*c))
    check("fp8: descales as one-element tensors", tensor_descales)
    check("fp8: bad inputs", bad_inputs)
    check("fp8: torch.library.opcheck", fp8_opcheck)
    check("fp8: torch.compile", fp8_compiled)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
