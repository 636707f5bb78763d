"""GPU check of rustkernels.mhc (plain Python with asserts; no pytest needed).

    python3 python/tests/test_mhc.py [--quick]

x_in, x_next and every gradient (dx, dy, dphi, dgamma, dalpha, dbias of
``<d_xin, x_in> + <d_xnext, x_next>`` through autograd, the two halves' nodes) against the same
equations in float64 through torch.autograd (bench/peers/mhc.py's formulation, the library's
``kernels::mhc::reference``), on the same bf16 activations and f32 weights as float64 leaves (so
the reference gradients are not rounded to the inputs' dtypes). dx is the sum of the two nodes'
bf16 gradients (autograd adds them), so it is rounded to bf16 twice. Tolerance (FA3's
rule, as test_attention.py): per output G, ``max |G - ref| <= 2 max |G_naive - ref| +
1e-3 max |ref| + 1e-6``, with G_naive the same autograd computation in float32 from the bf16
inputs and bf16 outputs (what a PyTorch user writes). Shapes: n in {2, 4, 8}, C in {8, 64, 128},
token counts that are not multiples of any tile (1, 113, 239), with and without gamma, few and
many Sinkhorn iterations. Then: the ``MHC`` module around a bf16 linear layer (a training step:
gradients of every parameter against the float64 reference of the whole block), bad input
(ValueError/TypeError with the library's message), torch.library's opcheck, torch.compile of
a training step. Prints one line per check and 'N passed, N failed' last; exits 1 on any
failure, 0 with a SKIP line without a CUDA device.
"""

import sys
import time
import traceback

import torch

from rustkernels.mhc import MHC, mhc_post, mhc_pre

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


def equations(x, y, phi, gamma, alpha, bias, iters, eps, dtype):
    """x_in [B, S, C] and x_next [B, S, n, C] computed in `dtype` (no rounding of outputs)."""
    b, s, n, c = x.shape
    xf = x.to(dtype)
    flat = xf.reshape(b, s, n * c)
    r = torch.sqrt(flat.square().mean(-1, keepdim=True) + eps)
    w = phi.to(dtype) if gamma is None else gamma.to(dtype)[:, None] * phi.to(dtype)
    h = (flat @ w) / r
    alpha, bias = alpha.to(dtype), bias.to(dtype)
    h_pre = torch.sigmoid(alpha[0] * h[..., :n] + bias[:n])
    h_post = 2.0 * torch.sigmoid(alpha[1] * h[..., n:2 * n] + bias[n:2 * n])
    z = (alpha[2] * h[..., 2 * n:] + bias[2 * n:]).reshape(b, s, n, n)
    p = torch.exp(z - z.amax(-1, keepdim=True).detach())
    for _ in range(iters):
        p = p / p.sum(-1, keepdim=True)
        p = p / p.sum(-2, keepdim=True)
    x_in = (h_pre.unsqueeze(-1) * xf).sum(-2)
    x_next = torch.matmul(p, xf) + h_post.unsqueeze(-1) * y.to(dtype).unsqueeze(-2)
    return x_in, x_next


def make(b, s, n, c, gamma, gen):
    m = n * n + 2 * n
    x = torch.randn(b, s, n, c, device="cuda", generator=gen).to(torch.bfloat16)
    y = torch.randn(b, s, c, device="cuda", generator=gen).to(torch.bfloat16)
    phi = torch.randn(n * c, m, device="cuda", generator=gen) / (n * c) ** 0.5
    g = (1.0 + 0.1 * torch.randn(n * c, device="cuda", generator=gen)) if gamma else None
    alpha = torch.tensor([0.8, 0.6, 1.2], device="cuda")
    bias = 0.2 * torch.randn(m, device="cuda", generator=gen)
    d_xin = torch.randn(b, s, c, device="cuda", generator=gen).to(torch.bfloat16)
    d_xnext = torch.randn(b, s, n, c, device="cuda", generator=gen).to(torch.bfloat16)
    return [x, y, phi, g, alpha, bias], (d_xin, d_xnext)


NAMES = ["x", "y", "phi", "gamma", "alpha", "bias"]


def leaves_of(tensors, dtype=None):
    """Leaves for autograd: copies of `tensors`, converted to `dtype` when given. The float64
    reference needs float64 leaves: autograd returns a leaf's gradient in the leaf's dtype, so a
    bf16 leaf would round the reference's gradient to bf16."""
    copy = (lambda t: t.detach().clone()) if dtype is None else (lambda t: t.detach().to(dtype))
    return [None if t is None else copy(t).requires_grad_() for t in tensors]


def grads_of(fn, tensors, seeds, dtype=None):
    """Outputs and gradients of <d_xin, x_in> + <d_xnext, x_next> for fn(*leaves), the leaves
    converted to `dtype` when given."""
    leaves = leaves_of(tensors, dtype)
    x_in, x_next = fn(*leaves)
    loss = (x_in.double() * seeds[0].double()).sum() + (x_next.double() * seeds[1].double()).sum()
    used = [t for t in leaves if t is not None]
    g = iter(torch.autograd.grad(loss, used))
    return (x_in.detach(), x_next.detach()), [None if t is None else next(g) for t in leaves]


def within(name, got, ref, naive, bf16=False):
    """max |got - ref| within 2x the float32 formulation's error plus 1e-3 max|ref|; for bf16
    outputs also one bf16 unit of each element (2^-7 |ref|: the library's stated bound for its
    bf16 outputs, which round f32 results computed in a different order)."""
    got, ref, naive = got.double(), ref.double(), naive.double()
    assert torch.isfinite(got).all(), f"{name} has NaN or inf"
    base = 2 * (naive - ref).abs().max().item() + 1e-3 * ref.abs().max().item() + 1e-6
    bound = base + (2.0 ** -7) * ref.abs() if bf16 else torch.full_like(ref, base)
    excess = ((got - ref).abs() - bound).max().item()
    err = (got - ref).abs().max().item()
    assert excess <= 0, f"{name}: max error {err:.3e} exceeds its bound by {excess:.3e}"
    return f"{name} {err:.1e}/{bound.max().item():.1e}"


def run_case(b, s, n, c, gamma, iters=20, eps=1e-6):
    gen = torch.Generator(device="cuda").manual_seed(SEED + b * s * n + c)
    tensors, seeds = make(b, s, n, c, gamma, gen)

    def ours(x, y, phi, g, alpha, bias):
        x_in, coeffs = mhc_pre(x, phi, g, alpha, bias, iters, eps)
        return x_in, mhc_post(x, y, coeffs, phi, g, alpha, bias, iters, eps)

    def ref(x, y, phi, g, alpha, bias):
        return equations(x, y, phi, g, alpha, bias, iters, eps, torch.float64)

    def naive(x, y, phi, g, alpha, bias):
        x_in, x_next = equations(x, y, phi, g, alpha, bias, iters, eps, torch.float32)
        return x_in.to(torch.bfloat16), x_next.to(torch.bfloat16)

    out, grads = grads_of(ours, tensors, seeds)
    ref_out, ref_grads = grads_of(ref, tensors, seeds, torch.float64)
    naive_out, naive_grads = grads_of(naive, tensors, seeds)
    torch.cuda.synchronize()
    assert out[0].dtype == torch.bfloat16 and out[1].shape == (b, s, n, c)
    lines = [
        within(name, o, r, nv, bf16=True)
        for name, o, r, nv in zip(("x_in", "x_next"), out, ref_out, naive_out)
    ]
    for name, g, r, nv in zip(NAMES, grads, ref_grads, naive_grads):
        if r is None:
            assert g is None, name
            continue
        assert g.dtype == tensors[NAMES.index(name)].dtype and g.shape == r.shape, (name, g.dtype, g.shape)
        lines.append(within("d" + name, g, r, nv, bf16=g.dtype == torch.bfloat16))
    return ", ".join(lines)


CASES = [
    # b, s, n, c, gamma, iters
    (1, 1, 2, 8, False, 20),
    (2, 113, 4, 64, True, 20),
    (1, 239, 8, 128, True, 5),
    (3, 40, 2, 64, True, 1),
    (2, 64, 4, 128, False, 20),
]
QUICK_CASES = [CASES[1], CASES[3]]


def module_step():
    """MHC around a bf16 linear layer: one forward and backward; every parameter's gradient
    against the float64 equations of the whole block (the layer in float64 too)."""
    torch.manual_seed(SEED)
    n, c = 4, 64
    block = MHC(n, c, device="cuda")
    layer = torch.nn.Linear(c, c, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 50, n, c, device="cuda").to(torch.bfloat16).requires_grad_()
    target = torch.randn(2, 50, n, c, device="cuda")
    out = block(x, layer)
    loss = ((out.float() - target) ** 2).mean()
    params = [x, block.phi, block.gamma, block.alpha, block.bias, layer.weight]
    got = torch.autograd.grad(loss, params)

    def ref_loss(x, phi, gamma, alpha, bias, w, dtype):
        x_in, _ = equations(x, torch.zeros(2, 50, c, device="cuda"), phi, gamma, alpha, bias,
                            block.sinkhorn_iters, block.eps, dtype)
        if dtype == torch.float32:
            x_in = x_in.to(torch.bfloat16)
        y = torch.nn.functional.linear(x_in.to(dtype), w.to(dtype), layer.bias.to(dtype))
        if dtype == torch.float32:
            y = y.to(torch.bfloat16)
        _, x_next = equations(x, y, phi, gamma, alpha, bias, block.sinkhorn_iters, block.eps, dtype)
        if dtype == torch.float32:
            x_next = x_next.to(torch.bfloat16)
        return ((x_next.to(dtype) - target.to(dtype)) ** 2).mean()

    lines = []
    refs = {}
    for dtype in (torch.float64, torch.float32):
        leaves = leaves_of(params, torch.float64 if dtype == torch.float64 else None)
        refs[dtype] = torch.autograd.grad(ref_loss(*leaves, dtype), leaves)
    torch.cuda.synchronize()
    for name, g, r, nv in zip(("x", "phi", "gamma", "alpha", "bias", "layer.weight"), got,
                              refs[torch.float64], refs[torch.float32]):
        lines.append(within("d" + name, g, r, nv, bf16=g.dtype == torch.bfloat16))
    return ", ".join(lines)


def bad_inputs():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    (x, y, phi, g, alpha, bias), _ = make(2, 16, 4, 64, True, gen)
    x9 = torch.zeros(2, 16, 9, 64, device="cuda", dtype=torch.bfloat16)
    x12 = torch.zeros(2, 16, 4, 12, device="cuda", dtype=torch.bfloat16)
    cases = [
        ("cpu x", ValueError, lambda: mhc_pre(x.cpu(), phi, g, alpha, bias), "CUDA"),
        ("float32 x", TypeError, lambda: mhc_pre(x.float(), phi, g, alpha, bias), "bfloat16"),
        ("bf16 phi", TypeError, lambda: mhc_pre(x, phi.bfloat16(), g, alpha, bias), "float32"),
        ("rank 3 x", ValueError, lambda: mhc_pre(x[0], phi, g, alpha, bias), "4 dimensions"),
        ("not a tensor", TypeError, lambda: mhc_pre(x, phi, g, 1.0, bias), "torch.Tensor"),
        ("n = 9", ValueError, lambda: mhc_pre(x9, phi, g, alpha, bias), "mHC n = 9"),
        ("C = 12", ValueError, lambda: mhc_pre(x12, phi, g, alpha, bias), "mHC C = 12"),
        ("phi shape", ValueError, lambda: mhc_pre(x, phi[:, :20], g, alpha, bias), "mHC phi shape"),
        ("gamma shape", ValueError, lambda: mhc_pre(x, phi, g[:10], alpha, bias), "mHC gamma shape"),
        ("alpha shape", ValueError, lambda: mhc_pre(x, phi, g, alpha[:2], bias), "mHC alpha shape"),
        ("iterations 0", ValueError, lambda: mhc_pre(x, phi, g, alpha, bias, 0), "sinkhorn_iters"),
        ("eps negative", ValueError, lambda: mhc_pre(x, phi, g, alpha, bias, 20, -1.0), "eps"),
        ("y shape", ValueError,
         lambda: mhc_post(x, y[:, :8], mhc_pre(x, phi, g, alpha, bias)[1], phi, g, alpha, bias),
         "mHC y shape"),
        ("coefficients of another shape", ValueError,
         lambda: mhc_post(x, y, torch.zeros(10, device="cuda"), phi, g, alpha, bias),
         "mHC coefficients shape"),
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
    x_in, _ = mhc_pre(x, phi, g, alpha, bias)
    torch.cuda.synchronize()
    assert torch.isfinite(x_in.float()).all()
    print("\n".join("     " + line for line in lines))
    return f"{len(cases)} bad inputs raised; a good call after them works"


def opcheck():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    ops = torch.ops.rustkernels
    for gamma in (True, False):
        (x, y, phi, g, alpha, bias), (d_xin, d_xnext) = make(2, 37, 4, 64, gamma, gen)
        torch.library.opcheck(ops.mhc_forward_pre.default, (x, phi, g, alpha, bias, 20, 1e-6), test_utils=utils)
        _, coeffs = ops.mhc_forward_pre(x, phi, g, alpha, bias, 20, 1e-6)
        torch.library.opcheck(ops.mhc_forward_post.default, (x, y, coeffs, 20, 1e-6), test_utils=utils)
        torch.library.opcheck(
            ops.mhc_backward.default,
            (x, y, coeffs, phi, g, alpha, bias, d_xin, d_xnext, 20, 1e-6),
            test_utils=utils,
        )
    return "mhc_forward_pre, mhc_forward_post, mhc_backward, with and without gamma"


def compiled_training_step():
    torch.manual_seed(SEED)
    n, c = 4, 128
    block = MHC(n, c, device="cuda")
    layer = torch.nn.Linear(c, c, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 64, n, c, device="cuda").to(torch.bfloat16)

    def loss_fn(x):
        return block(x, layer).float().square().mean()

    def step(fn):
        loss = fn(x)
        return loss.detach(), torch.autograd.grad(loss, (block.phi, block.alpha, layer.weight))

    want_loss, want = step(loss_fn)
    got_loss, got = step(torch.compile(loss_fn))
    torch.cuda.synchronize()
    assert abs(got_loss.item() - want_loss.item()) <= 1e-3 * abs(want_loss.item()) + 1e-6
    errs = []
    for name, a, b in zip(("dphi", "dalpha", "dlayer.weight"), got, want):
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        assert torch.isfinite(a.float()).all() and err <= 1e-2 * scale + 1e-6, f"{name}: {err} vs {scale}"
        errs.append(f"{name} {err:.1e}")
    return "loss and gradients match eager: " + ", ".join(errs)


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' mHC GPU check)")
        print("0 passed, 0 failed")
        return 0
    major, minor = torch.cuda.get_device_capability()
    print(f"rustkernels.mhc on {torch.cuda.get_device_name()} (sm_{major}{minor}), "
          f"torch {torch.__version__}, seed {SEED}")
    for c in QUICK_CASES if QUICK else CASES:
        b, s, n, ch, gamma, iters = c
        check(f"forward and gradients B={b} S={s} n={n} C={ch} gamma={gamma} iters={iters}",
              lambda c=c: run_case(*c[:5], iters=c[5]))
    check("MHC module: training step", module_step)
    check("bad inputs", bad_inputs)
    check("torch.library.opcheck", opcheck)
    check("torch.compile: training step", compiled_training_step)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
