"""GPU check of rustkernels.flash_attn_with_kvcache, the decode step over a paged KV cache
(plain Python with asserts; no pytest needed).

    python3 python/tests/test_attention_decode.py [--quick]

Per sequence against the references of test_attention.py (f64, and the same computation in the
input precision) as dense batch-1 problems on the keys and values gathered from its pages
(pages in random order, one shared between two sequences, entries past a context -1; contexts
of 0 and not a multiple of the page size; causal with seqlen_q > 1; grouped-query attention;
explicit and heuristic split counts): O within FlashAttention's rule (2 x naive + 1e-3), LSE
within 1e-3 max(1, |ref|) and -inf exactly where a query has no key, outputs poisoned first.
Then cache_seqlens as an int and None; k, v appended in the call; bad input (exceptions with the library's message);
torch.library's opcheck; torch.compile.

Prints one line per check and 'N passed, N failed' last; exits 1 on any failure, 0 with a SKIP
line without a CUDA device.
"""

import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_attention import (  # noqa: E402  (the shared references and helpers)
    QUICK,
    SEED,
    allowed_mask,
    check,
    dtype_name,
    naive_same_precision,
    poison_allocator,
    raises,
    reference,
    results,
)


def paged_case(lens, sq, hq, hkv, d, page, dtype, seed):
    """Random q and paged caches for contexts ``lens``: the pages of all sequences a random
    permutation of the cache's (three spare pages, one spare column in the block table, entries
    past a context -1, never read), sequence 1's first page sequence 0's (shared) where both
    have keys. Returns q, k_cache, v_cache, block_table, cache_seqlens (int32 on the device) and
    each sequence's keys and values gathered from its pages, ``[len, nheads_k, headdim]``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.device("cuda")
    pages_of = [-(-n // page) for n in lens]
    num_pages = sum(pages_of) + 3
    max_pages = max(pages_of) + 1
    q = torch.randn(len(lens), sq, hq, d, device=dev, dtype=dtype, generator=g)
    k_cache = torch.randn(num_pages, page, hkv, d, device=dev, dtype=dtype, generator=g)
    v_cache = torch.randn(num_pages, page, hkv, d, device=dev, dtype=dtype, generator=g)
    order = list(range(num_pages))
    random.Random(seed).shuffle(order)
    table = [[-1] * max_pages for _ in lens]
    next_page = iter(order)
    for b, n in enumerate(pages_of):
        for t in range(n):
            table[b][t] = next(next_page)
    if len(lens) >= 2 and lens[0] > 0 and lens[1] > 0:
        table[1][0] = table[0][0]
    block_table = torch.tensor(table, dtype=torch.int32, device=dev)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)

    def gather(cache, b):
        pages = torch.tensor(table[b][: pages_of[b]], dtype=torch.long, device=dev)
        return cache[pages].reshape(-1, hkv, d)[: lens[b]]

    keys = [(gather(k_cache, b), gather(v_cache, b)) for b in range(len(lens))]
    return q, k_cache, v_cache, block_table, cache_seqlens, keys


def decode_references(q, keys, scale, causal):
    """Per sequence, as dense batch-1 problems on its gathered keys: f64 O ``[batch, seqlen_q,
    nheads, headdim]`` and LSE ``[batch, nheads, seqlen_q]``, and O as a straightforward
    implementation in the input precision computes it. A context of 0: O 0, LSE -inf."""
    b, sq, hq, d = q.shape
    ref_o = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    naive_o = torch.zeros_like(ref_o)
    ref_lse = torch.full((b, hq, sq), -math.inf, dtype=torch.float64, device=q.device)
    for i, (k, v) in enumerate(keys):
        if k.shape[0] == 0:
            continue
        allowed = allowed_mask(sq, k.shape[0], causal, (-1, -1), q.device)
        o, lse = reference(q[i : i + 1], k[None], v[None], scale, allowed)
        ref_o[i], ref_lse[i] = o[0], lse[0]
        naive_o[i] = naive_same_precision(q[i : i + 1], k[None], v[None], scale, allowed)[0]
    return ref_o, ref_lse, naive_o


def run_decode_case(lens, sq, hq, hkv, d, page, dtype, causal, num_splits, scale=None):
    """flash_attn_with_kvcache against per-sequence references: O within FlashAttention's rule
    (2 x naive + 1e-3, as ``run_case``), LSE within 1e-3 relative and -inf exactly where a query
    has no key; every element finite (outputs poisoned with NaN first)."""
    from rustkernels import flash_attn_with_kvcache

    seed = SEED + sum(lens) + 7 * sq + 13 * page + d + num_splits
    q, k_cache, v_cache, block_table, cache_seqlens, keys = paged_case(
        lens, sq, hq, hkv, d, page, dtype, seed
    )
    eff_scale = scale if scale is not None else 1.0 / math.sqrt(d)
    ref_o, ref_lse, naive_o = decode_references(q, keys, eff_scale, causal)
    b = len(lens)
    poison_allocator(((b, sq, hq, d), dtype), ((b, hq, sq), torch.float32), device=q.device)
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
        softmax_scale=scale, causal=causal, num_splits=num_splits, return_softmax_lse=True,
    )
    torch.cuda.synchronize()
    assert out.shape == q.shape and out.dtype == dtype, (out.shape, out.dtype)
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    got = out.double()
    assert torch.isfinite(got).all(), "O has NaN or inf (or an unwritten element)"
    err = (got - ref_o).abs().max().item()
    naive_err = (naive_o - ref_o).abs().max().item()
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


DECODE_CASES = [
    # (cache_seqlens, seqlen_q, nheads, nheads_k, headdim, page_block_size, dtype, causal, num_splits)
    ([1], 1, 8, 8, 64, 16, torch.bfloat16, False, 0),
    ([40, 61], 1, 32, 8, 128, 16, torch.bfloat16, False, 1),
    ([40, 61], 1, 32, 8, 128, 16, torch.bfloat16, False, 3),
    ([0, 1, 70, 300], 4, 32, 8, 128, 16, torch.float16, True, 0),
    ([40, 61], 1, 32, 8, 128, 16, torch.float16, False, 0),
    ([0, 3, 500], 4, 8, 8, 64, 256, torch.bfloat16, True, 3),
    ([1000, 257], 1, 8, 8, 64, 256, torch.float16, False, 0),
    ([1000, 257], 1, 8, 8, 64, 256, torch.float16, False, 1),
    ([4097], 1, 32, 8, 128, 256, torch.bfloat16, False, 0),
    ([4097], 4, 32, 8, 64, 16, torch.float16, True, 3),
    ([2, 33, 16], 4, 32, 8, 64, 16, torch.float16, False, 1),
    ([700, 0], 1, 8, 8, 128, 16, torch.float16, True, 3),
    ([100, 255, 256, 511, 1, 17, 0, 64], 4, 32, 8, 128, 256, torch.bfloat16, True, 0),
    ([300, 45], 4, 8, 8, 128, 16, torch.bfloat16, True, 0),
]
if QUICK:
    DECODE_CASES = DECODE_CASES[:4]


def decode_case_name(c):
    lens, sq, hq, hkv, d, page, dt, causal, splits = c
    return (
        f"decode/{dtype_name(dt)} ctx{lens if len(lens) <= 4 else lens[:4] + ['...']} sq{sq} "
        f"h{hq}/{hkv} d{d} page{page}{' causal' if causal else ''} "
        f"splits {splits if splits else 'default'}"
    )


def decode_seqlens_forms():
    """cache_seqlens as a Python int, and None (the whole block table's row), equal an int32
    tensor of the same contexts; a softmax_scale; LSE returned only when asked."""
    from rustkernels import flash_attn_with_kvcache

    lens = [77, 77, 77]
    q, k_cache, v_cache, block_table, cache_seqlens, keys = paged_case(
        lens, 2, 16, 4, 128, 16, torch.bfloat16, SEED
    )
    call = lambda seqlens, table=block_table, **kw: flash_attn_with_kvcache(  # noqa: E731
        q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, softmax_scale=0.3,
        causal=True, **kw
    )
    want = call(cache_seqlens)
    got = call(77)
    assert isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)
    assert torch.equal(got, want), "an int cache_seqlens differs from the tensor"
    # None: every sequence uses its whole row (5 pages of 16 = 80 keys, no spare column).
    table = block_table[:, :5].contiguous()
    full = torch.full((3,), 80, dtype=torch.int32, device="cuda")
    out, lse = call(None, table, return_softmax_lse=True)
    want, want_lse = call(full, table, return_softmax_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(lse, want_lse), "None differs from full rows"
    ref_o, _, naive_o = decode_references(q, keys, 0.3, True)
    got_o, _ = call(cache_seqlens, return_softmax_lse=True)
    err = (got_o.double() - ref_o).abs().max().item()
    tol = 2 * (naive_o - ref_o).abs().max().item() + 1e-3
    assert err <= tol, f"scale 0.3: {err} > {tol}"
    return f"int and None equal the tensors; scale 0.3: max |O - ref| {err:.1e} (tol {tol:.1e})"


def decode_append():
    """k, v appended in the call (flash-attn's semantics): the caches afterwards equal the
    caches with the new rows written by torch indexing (bitwise), cache_seqlens is unchanged,
    and the output equals a call without k, v over the torch-written caches with contexts
    cache_seqlens + seqlen_new (bitwise); then against the f64 reference."""
    from rustkernels import flash_attn_with_kvcache

    lens, sq, new, page, hkv, d = [40, 61, 0, 17], 3, 3, 16, 2, 128
    room = [n + new for n in lens]
    # Pages for the contexts after the append (the table has them; the step writes there).
    q, k_cache, v_cache, block_table, _, _ = paged_case(room, sq, 8, hkv, d, page, torch.bfloat16, SEED + 7)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(SEED + 8)
    k = torch.randn(len(lens), new, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(len(lens), new, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    table = block_table.tolist()
    for b, n in enumerate(lens):
        for t in range(new):
            pos = n + t
            want_k[table[b][pos // page], pos % page] = k[b, t]
            want_v[table[b][pos // page], pos % page] = v[b, t]
    before = cache_seqlens.clone()
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens, block_table=block_table,
        causal=True, return_softmax_lse=True,
    )
    torch.cuda.synchronize()
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), "caches after the append"
    assert torch.equal(cache_seqlens, before), "cache_seqlens changed"
    after = torch.tensor(room, dtype=torch.int32, device="cuda")
    want, want_lse = flash_attn_with_kvcache(
        q, want_k, want_v, cache_seqlens=after, block_table=block_table, causal=True,
        return_softmax_lse=True,
    )
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(lse, want_lse), "output differs from decode after a torch append"
    keys = []
    for b, n in enumerate(room):
        pages = torch.tensor(table[b][: -(-n // page)], dtype=torch.long, device="cuda")
        keys.append(tuple(c[pages].reshape(-1, hkv, d)[:n] for c in (want_k, want_v)))
    ref_o, _, naive_o = decode_references(q, keys, 1 / math.sqrt(d), True)
    err = (out.double() - ref_o).abs().max().item()
    tol = 2 * (naive_o - ref_o).abs().max().item() + 1e-3
    assert err <= tol, f"{err} > {tol}"
    return f"caches and output bitwise as decode after a torch append; max |O - ref| {err:.1e} (tol {tol:.1e})"


def decode_bad_inputs():
    from rustkernels import flash_attn_with_kvcache

    dev = "cuda"
    bf = torch.bfloat16
    q, kc, vc, bt, lens, _ = paged_case([40, 61], 1, 8, 2, 64, 16, bf, SEED)

    def call(q=q, kc=kc, vc=vc, **kw):
        kw.setdefault("cache_seqlens", lens)
        kw.setdefault("block_table", bt)
        return flash_attn_with_kvcache(q, kc, vc, **kw)

    def cache(shape, dtype=bf):
        return torch.randn(*shape, device=dev, dtype=dtype)

    cases = [
        ("cpu tensor", ValueError, lambda: call(q=q.cpu()), "CUDA"),
        ("float32", TypeError, lambda: call(q=q.float(), kc=kc.float(), vc=vc.float()), "bfloat16"),
        ("mixed dtypes", TypeError, lambda: call(kc=kc.half()), "float16"),
        ("q rank 3", ValueError, lambda: call(q=q[:, 0]), "4 dimensions"),
        ("k_cache rank 3", ValueError, lambda: call(kc=kc[0]), "4 dimensions"),
        ("block_table int64", TypeError, lambda: call(block_table=bt.long()), "int32"),
        ("block_table rank 1", ValueError, lambda: call(block_table=bt[0]), "2 dimensions"),
        ("block_table on the CPU", ValueError, lambda: call(block_table=bt.cpu()), "block_table"),
        ("block_table of another batch", ValueError, lambda: call(block_table=bt[:1]), "block table shape"),
        ("cache_seqlens int64", TypeError, lambda: call(cache_seqlens=lens.long()), "int32"),
        ("cache_seqlens rank 2", ValueError, lambda: call(cache_seqlens=lens[None]), "1 dimension"),
        ("cache_seqlens of another batch", ValueError, lambda: call(cache_seqlens=lens[:1]), "cache_seqlens shape"),
        ("cache_seqlens int above the table", ValueError, lambda: call(cache_seqlens=10**6), "cache_seqlens"),
        ("cache_seqlens a float", TypeError, lambda: call(cache_seqlens=3.0), "cache_seqlens"),
        ("page size 8", ValueError, lambda: call(kc=cache((20, 8, 2, 64)), vc=cache((20, 8, 2, 64))), "page size 8"),
        ("page size 24", ValueError, lambda: call(kc=cache((20, 24, 2, 64)), vc=cache((20, 24, 2, 64))), "page size 24"),
        ("seqlen_q 17", ValueError, lambda: call(q=cache((2, 17, 8, 64))), "seq_q 17"),
        ("head dim 72", ValueError, lambda: call(q=cache((2, 1, 8, 72)), kc=cache((9, 16, 2, 72)), vc=cache((9, 16, 2, 72))), "head dimension 72"),
        ("heads 8 vs 3", ValueError, lambda: call(kc=cache((9, 16, 3, 64)), vc=cache((9, 16, 3, 64))), "multiple"),
        ("v_cache of another shape", ValueError, lambda: call(vc=vc[:, :, :1]), "V cache shape"),
        ("q head dim strided", ValueError, lambda: call(q=cache((2, 1, 64, 8)).transpose(2, 3)), "head dimension must be contiguous"),
        ("num_splits 129", ValueError, lambda: call(num_splits=129), "num_splits"),
        ("num_splits -1", ValueError, lambda: call(num_splits=-1), "num_splits"),
        ("num_splits a float", TypeError, lambda: call(num_splits=1.5), "num_splits"),
        ("scale nan", ValueError, lambda: call(softmax_scale=float("nan")), "scale"),
        ("no block_table", NotImplementedError, lambda: call(block_table=None), "block_table"),
        ("k without v", ValueError, lambda: call(k=cache((2, 1, 2, 64))), "k and v"),
        ("k of another head count", ValueError, lambda: call(k=cache((2, 1, 4, 64)), v=cache((2, 1, 4, 64))), "seqlen_new"),
        ("k float16", TypeError, lambda: call(k=cache((2, 1, 2, 64), torch.float16), v=cache((2, 1, 2, 64), torch.float16)), "dtype"),
        ("k and v shapes differ", ValueError, lambda: call(k=cache((2, 1, 2, 64)), v=cache((2, 2, 2, 64))), "shapes differ"),
        ("rotary", NotImplementedError, lambda: call(rotary_cos=q, rotary_sin=q), "rotary_cos"),
        ("cache_batch_idx", NotImplementedError, lambda: call(cache_batch_idx=lens), "cache_batch_idx"),
        ("cache_leftpad", NotImplementedError, lambda: call(cache_leftpad=lens), "cache_leftpad"),
        ("window", NotImplementedError, lambda: call(window_size=(16, 0)), "window_size"),
        ("softcap -1", ValueError, lambda: call(softcap=-1.0), "softcap"),
        ("sinks of 3 heads", ValueError, lambda: call(sinks=torch.zeros(3, device=dev)), "sinks"),
        ("alibi", NotImplementedError, lambda: call(alibi_slopes=torch.ones(8, device=dev)), "alibi_slopes"),
    ]
    lines = [f"{name} -> {raises(exc, fn, contains)}" for name, exc, fn, contains in cases]
    out = call()
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    print("\n".join("     " + line for line in lines))
    return f"{len(cases)} bad inputs raised; a good call after them works"


def decode_opcheck():
    q, kc, vc, bt, lens, _ = paged_case([0, 37, 200], 4, 8, 2, 64, 16, torch.float16, SEED)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    for causal, splits in ((True, 0), (False, 3)):
        torch.library.opcheck(
            torch.ops.rustkernels.flash_attn_decode.default,
            (q, kc, vc, bt, lens, None, causal, splits),
            test_utils=utils,
        )
    return "flash_attn_decode causal with the heuristic's splits, and non-causal with 3 splits"


def decode_compiled():
    """A decode step under torch.compile(fullgraph=True), cache_seqlens as a tensor and as an
    int, LSE returned: against eager."""
    from rustkernels import flash_attn_with_kvcache

    q, kc, vc, bt, lens, _ = paged_case([100, 37, 20], 1, 32, 8, 128, 16, torch.bfloat16, SEED)

    def step(q, kc, vc, bt, lens):
        out, lse = flash_attn_with_kvcache(
            q * 0.5, kc, vc, cache_seqlens=lens, block_table=bt, causal=True, return_softmax_lse=True
        )
        fixed = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, block_table=bt, num_splits=2)
        return out.float().sum(dim=-1), lse, fixed.float().sum(dim=-1)

    want = step(q, kc, vc, bt, lens)
    got = torch.compile(step, fullgraph=True)(q, kc, vc, bt, lens)
    torch.cuda.synchronize()
    errs = []
    for name, a, b in zip(("out", "lse", "out (int cache_seqlens)"), got, want):
        same_inf = torch.equal(torch.isneginf(a), torch.isneginf(b))
        fin = torch.isfinite(b)
        err = (a[fin] - b[fin]).abs().max().item() if fin.any() else 0.0
        errs.append(f"{name} {err:.1e}")
        assert same_inf and err <= 1e-3, f"compiled vs eager: {', '.join(errs)}"
    return "fullgraph; max |compiled - eager|: " + ", ".join(errs)


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (rustkernels' GPU check)")
        print("0 passed, 0 failed")
        return 0
    torch.manual_seed(SEED)
    major, minor = torch.cuda.get_device_capability()
    print(
        f"rustkernels decode on {torch.cuda.get_device_name()} (sm_{major}{minor}), "
        f"torch {torch.__version__}, seed {SEED}"
    )
    for c in DECODE_CASES:
        check(decode_case_name(c), lambda c=c: run_decode_case(*c))
    check("decode: cache_seqlens as an int and None", decode_seqlens_forms)
    check("decode: k, v appended in the call", decode_append)
    check("decode: bad inputs", decode_bad_inputs)
    check("decode: torch.library.opcheck", decode_opcheck)
    check("decode: torch.compile", decode_compiled)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
