"""Semi-Markov CRF with flash-semicrf's interface: ``semi_crf_streaming_forward`` (log Z, with
gradients) and Viterbi.

Model (flash-semicrf's streaming convention, the library's ``kernels::semicrf``): segments of
durations ``1..K``; a segment ``[s, s + k)`` with label ``c`` after label ``c'`` scores
``cum_scores[b, s + k, c] - cum_scores[b, s, c] + duration_bias[k - 1, c] + transition[c', c]``
(the first segment's ``c'`` is summed over, as a virtual label before position 0); log Z of
sequence ``b`` sums over the segmentations of its first ``lengths[b]`` positions.

Layers, from the user down:

- ``semi_crf_streaming_forward``: flash-semicrf's signature; ``semiring="log"`` gives log Z
  (differentiable), ``"max"`` the Viterbi score; checks what torch knows.
- ``_SemiCrfFunction`` (``torch.autograd.Function``): saves the inputs, log Z and the f64 state
  of the forward (checkpoints; its layout from the extension), and calls
  ``semicrf_backward``.
- ``torch.ops.rustkernels.semicrf_forward``, ``semicrf_backward``, ``semicrf_viterbi``: the
  custom ops, each with a fake implementation so ``torch.compile`` traces around them. Each
  reads the lengths and the scores' finiteness on the host (one synchronization: the library
  checks every length in ``1..=T`` before its kernels see it), allocates its outputs and
  workspace with torch and launches on torch's current stream through the Rust extension.

The backward kernels give the gradients of ``sum_b log Z_b``; for an upstream gradient
``w [B]`` the cumulative scores' gradient is scaled per sequence, and the duration and
transition gradients are the ``w``-weighted sums of the per-(sequence, checkpoint segment)
expected counts the backward leaves in the state (in f64).
"""

from typing import Optional, Tuple

import torch

from .attention import _describe, _native

_FLOATS = (torch.float32, torch.float64)


def _check(cum_scores, transition, duration_bias, lengths) -> None:
    """What torch knows: tensors, the scores float32/float64 CUDA tensors on one device of
    ranks 3, 2, 2, the lengths integers of rank 1."""
    for name, t in (
        ("cum_scores", cum_scores),
        ("transition", transition),
        ("duration_bias", duration_bias),
        ("lengths", lengths),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t, rank in (
        ("cum_scores", cum_scores, 3),
        ("transition", transition, 2),
        ("duration_bias", duration_bias, 2),
    ):
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
        if t.device != cum_scores.device:
            raise ValueError(f"{name} is on {t.device}, cum_scores on {cum_scores.device}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
        if t.dim() != rank:
            if name == "transition" and t.dim() == 3:
                raise NotImplementedError(
                    "transition: duration-dependent transitions (K, C, C) are not supported; "
                    "use static transitions (C, C)"
                )
            raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(t.shape)}")
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(
            f"lengths must be a 1-dimensional integer tensor, got {lengths.dtype} of shape "
            f"{tuple(lengths.shape)}"
        )


def _host_lengths(cum_scores, transition, duration_bias, lengths):
    """The lengths as a list, after checking that every score is finite (one synchronization
    for both)."""
    finite = torch.stack(
        [torch.isfinite(t).all() for t in (cum_scores, duration_bias, transition)]
    ).to(torch.int64)
    values = torch.cat([lengths.to(cum_scores.device, torch.int64), finite]).tolist()
    b = lengths.shape[0]
    for name, ok in zip(("cum_scores", "duration_bias", "transition"), values[b:]):
        if not ok:
            raise ValueError(f"semi-CRF {name}: every score must be finite")
    return values[:b]


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous()


@torch.library.custom_op("rustkernels::semicrf_forward", mutates_args=())
def semicrf_forward(
    cum_scores: torch.Tensor,
    duration_bias: torch.Tensor,
    transition: torch.Tensor,
    lengths: torch.Tensor,
    checkpoint: Optional[int],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """log Z ``[B]`` f32 and the f64 state a backward needs, from f32 scores (cum_scores
    ``[B, T + 1, C]``, duration_bias ``[K, C]``, transition ``[C, C]``) and lengths ``[B]``;
    ``checkpoint``: the checkpoint interval (None: the library's default)."""
    _check(cum_scores, transition, duration_bias, lengths)
    host = _host_lengths(cum_scores, transition, duration_bias, lengths)
    native = _native()
    total = native.semicrf_state_layout(
        tuple(cum_scores.shape), tuple(duration_bias.shape), checkpoint
    )[0]
    device = cum_scores.device
    # Zeroed: the forward leaves parts of it (the backward's partial counts) unwritten, and an
    # output must not depend on what the allocator hands out (opcheck, torch.compile compare).
    state = torch.zeros(total, dtype=torch.float64, device=device)
    log_z = torch.empty(cum_scores.shape[0], dtype=torch.float32, device=device)
    lengths_buf = torch.empty(cum_scores.shape[0], dtype=torch.int32, device=device)
    with torch.cuda.device(device):
        native.semicrf_forward(
            device.index,
            torch.cuda.current_stream(device).cuda_stream,
            _describe(cum_scores),
            _describe(duration_bias),
            _describe(transition),
            _describe(lengths_buf),
            host,
            checkpoint,
            _describe(state),
            _describe(log_z),
        )
    return log_z, state


@semicrf_forward.register_fake
def _semicrf_forward_fake(cum_scores, duration_bias, transition, lengths, checkpoint):
    _check(cum_scores, transition, duration_bias, lengths)
    shapes = tuple(cum_scores.shape) + tuple(duration_bias.shape)
    if all(isinstance(d, int) for d in shapes):
        total = _native().semicrf_state_layout(
            tuple(cum_scores.shape), tuple(duration_bias.shape), checkpoint
        )[0]
    else:
        # Symbolic sizes: the state's length is the library's (opaque) function of them.
        total = torch.library.get_ctx().new_dynamic_size()
    return (
        cum_scores.new_empty((cum_scores.shape[0],), dtype=torch.float32),
        cum_scores.new_empty((total,), dtype=torch.float64),
    )


@torch.library.custom_op("rustkernels::semicrf_backward", mutates_args=())
def semicrf_backward(
    grad_log_z: torch.Tensor,
    cum_scores: torch.Tensor,
    duration_bias: torch.Tensor,
    transition: torch.Tensor,
    lengths: torch.Tensor,
    checkpoint: Optional[int],
    state: torch.Tensor,
    log_z: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``sum_b grad_log_z[b] log Z_b`` with respect to cum_scores,
    duration_bias and transition (f32, their shapes), after ``semicrf_forward`` gave ``state``
    and ``log_z`` on the same inputs. ``state`` is not modified (the backward completes a copy)."""
    _check(cum_scores, transition, duration_bias, lengths)
    host = _host_lengths(cum_scores, transition, duration_bias, lengths)
    native = _native()
    _, p_off, p_len, interval, segments = native.semicrf_state_layout(
        tuple(cum_scores.shape), tuple(duration_bias.shape), checkpoint
    )
    device = cum_scores.device
    state = state.clone()
    b, k, c = cum_scores.shape[0], duration_bias.shape[0], cum_scores.shape[2]
    grad_cum = torch.empty(cum_scores.shape, dtype=torch.float32, device=device)
    grad_dur = torch.empty((k, c), dtype=torch.float32, device=device)
    grad_trans = torch.empty((c, c), dtype=torch.float32, device=device)
    lengths_buf = torch.empty(b, dtype=torch.int32, device=device)
    with torch.cuda.device(device):
        native.semicrf_backward(
            device.index,
            torch.cuda.current_stream(device).cuda_stream,
            _describe(cum_scores),
            _describe(duration_bias),
            _describe(transition),
            _describe(lengths_buf),
            host,
            checkpoint,
            _describe(state),
            _describe(log_z),
            _describe(grad_cum),
            _describe(grad_dur),
            _describe(grad_trans),
        )
    w = grad_log_z.to(device, torch.float64).reshape(b)
    grad_cum = grad_cum * w.to(torch.float32).view(b, 1, 1)
    # The expected counts of sequence b: its segments j <= L_b / S (the others hold nothing
    # of it), weighted by w[b].
    partials = state[p_off:p_off + p_len].view(b, segments, k * c + c * c)
    last = torch.tensor([min(n // interval, segments - 1) for n in host], device=device)
    used = torch.arange(segments, device=device).view(1, segments) <= last.view(b, 1)
    counts = torch.einsum("bj,bje->e", used.to(torch.float64) * w.view(b, 1), partials)
    counts = counts.to(torch.float32)
    return grad_cum, counts[: k * c].view(k, c).clone(), counts[k * c:].view(c, c).clone()


@semicrf_backward.register_fake
def _semicrf_backward_fake(
    grad_log_z, cum_scores, duration_bias, transition, lengths, checkpoint, state, log_z
):
    _check(cum_scores, transition, duration_bias, lengths)
    k, c = duration_bias.shape[0], cum_scores.shape[2]
    return (
        cum_scores.new_empty(cum_scores.shape, dtype=torch.float32),
        cum_scores.new_empty((k, c), dtype=torch.float32),
        cum_scores.new_empty((c, c), dtype=torch.float32),
    )


@torch.library.custom_op("rustkernels::semicrf_viterbi", mutates_args=())
def semicrf_viterbi(
    cum_scores: torch.Tensor,
    duration_bias: torch.Tensor,
    transition: torch.Tensor,
    lengths: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best segmentation of every sequence from f32 scores: score ``[B]`` f32, and int32
    segment starts, durations, labels ``[B, T]`` (row b's first ``count[b]`` entries, in order
    of position) and counts ``[B]``."""
    _check(cum_scores, transition, duration_bias, lengths)
    host = _host_lengths(cum_scores, transition, duration_bias, lengths)
    device = cum_scores.device
    b, rows, c = cum_scores.shape
    t = max(rows - 1, 0)
    i32 = dict(dtype=torch.int32, device=device)
    score = torch.empty(b, dtype=torch.float32, device=device)
    # Zeroed: only each sequence's first `count` segments (and its own back-pointer rows) are
    # written, and an output must not depend on what the allocator hands out.
    backptr = torch.zeros((b, rows, c), **i32)
    start, dur, label = (torch.zeros((b, t), **i32) for _ in range(3))
    count = torch.zeros(b, **i32)
    lengths_buf = torch.empty(b, **i32)
    native = _native()
    with torch.cuda.device(device):
        native.semicrf_viterbi(
            device.index,
            torch.cuda.current_stream(device).cuda_stream,
            _describe(cum_scores),
            _describe(duration_bias),
            _describe(transition),
            _describe(lengths_buf),
            host,
            _describe(score),
            _describe(backptr),
            _describe(start),
            _describe(dur),
            _describe(label),
            _describe(count),
        )
    return score, start, dur, label, count


@semicrf_viterbi.register_fake
def _semicrf_viterbi_fake(cum_scores, duration_bias, transition, lengths):
    _check(cum_scores, transition, duration_bias, lengths)
    b, rows, _ = cum_scores.shape
    t = max(rows - 1, 0)
    return (
        cum_scores.new_empty((b,), dtype=torch.float32),
        *(cum_scores.new_empty((b, t), dtype=torch.int32) for _ in range(3)),
        cum_scores.new_empty((b,), dtype=torch.int32),
    )


class _SemiCrfFunction(torch.autograd.Function):
    """The autograd node of ``semi_crf_streaming_forward`` (log semiring).

    Under ``torch.compile`` no tensor it saves or returns may be a second name of another
    (PyTorch 2.11's Dynamo collects the saved tensors as extra outputs of the traced forward;
    one that is the same tensor as the returned one, or as an input, under a new name, e.g.
    ``log_z.to(float32)`` of an f32 ``log_z`` or ``x.to(float32)`` of an f32 input, takes over
    the returned tensor's gradient slot, and the compiled gradient comes out wrong). So it saves
    the inputs as given (converted again in the backward) and returns log Z as the op gave it,
    or a converted copy."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, lengths, checkpoint):
        log_z, state = semicrf_forward(
            _f32(cum_scores), _f32(duration_bias), _f32(transition), lengths, checkpoint
        )
        ctx.save_for_backward(cum_scores, duration_bias, transition, lengths, state, log_z)
        ctx.checkpoint = checkpoint
        ctx.dtypes = (cum_scores.dtype, transition.dtype, duration_bias.dtype)
        if cum_scores.dtype == torch.float32:
            return log_z
        return log_z.to(cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        cum_scores, duration_bias, transition, lengths, state, log_z = ctx.saved_tensors
        cs, dur, trans = _f32(cum_scores), _f32(duration_bias), _f32(transition)
        g_cs, g_dur, g_trans = semicrf_backward(
            grad.contiguous(), cs, dur, trans, lengths, ctx.checkpoint, state, log_z
        )
        cs_t, trans_t, dur_t = ctx.dtypes
        return g_cs.to(cs_t), g_trans.to(trans_t), g_dur.to(dur_t), None, None


def _prepare(cum_scores, transition, duration_bias, lengths, K):
    _check(cum_scores, transition, duration_bias, lengths)
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K = {K!r}: the maximum segment duration is an int >= 1")
    if duration_bias.shape[0] != K:
        raise ValueError(
            f"duration_bias has {duration_bias.shape[0]} rows, K = {K}: it must be (K, C)"
        )


def semi_crf_streaming_forward(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    semiring: str = "log",
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    use_triton: bool = True,
    num_warps: int = 4,
    checkpoint_interval: Optional[int] = None,
) -> torch.Tensor:
    """flash-semicrf's ``semi_crf_streaming_forward``: log Z (``semiring="log"``) or the best
    segmentation's score (``"max"``) per sequence, ``[B]`` in cum_scores' dtype.

    cum_scores ``[B, T + 1, C]`` (cumulative per-position scores, row 0 usually zeros; centre
    the scores before the cumulative sum), transition ``[C (from), C (to)]``, duration_bias
    ``[K, C]`` (row ``k - 1`` for duration k): float32 or float64 CUDA tensors on one device
    (the kernels compute in f64 from float32 values: float64 inputs are rounded to float32);
    lengths ``[B]`` integers in ``1..=T`` (read on the host: one synchronization). K up to
    65535 and C up to the library's limit, within its shared-memory budget (the library's
    error says which). ``checkpoint_interval``: the backward's checkpoint interval (default
    ``~sqrt(T K)``). ``use_triton`` and ``num_warps`` are accepted and ignored;
    ``proj_start``/``proj_end`` and duration-dependent transitions ``(K, C, C)`` are not
    supported (``NotImplementedError``).

    With ``semiring="log"`` and an input that requires grad, the result has gradients with
    respect to cum_scores, transition and duration_bias (the library's backward). ``"max"`` has
    none (``ValueError`` when an input requires grad, as flash-semicrf).
    """
    if semiring not in ("log", "max"):
        raise ValueError(f"semiring must be 'log' or 'max', got {semiring!r}")
    if proj_start is not None or proj_end is not None:
        raise NotImplementedError("proj_start / proj_end: boundary projections are not supported")
    _prepare(cum_scores, transition, duration_bias, lengths, K)
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (cum_scores, transition, duration_bias)
    )
    if semiring == "max":
        if needs_grad:
            raise ValueError(
                "semiring='max' (Viterbi) does not support gradients; use torch.no_grad() for "
                "decoding, or semiring='log' for training"
            )
        score = semicrf_viterbi(
            _f32(cum_scores), _f32(duration_bias), _f32(transition), lengths
        )[0]
        return score.to(cum_scores.dtype)
    if checkpoint_interval is not None:
        checkpoint_interval = int(checkpoint_interval)
    if needs_grad:
        return _SemiCrfFunction.apply(
            cum_scores, transition, duration_bias, lengths, checkpoint_interval
        )
    log_z, _ = semicrf_forward(
        _f32(cum_scores), _f32(duration_bias), _f32(transition), lengths, checkpoint_interval
    )
    return log_z.to(cum_scores.dtype)


# Decoding reads the segmentations on the host (lists): run eagerly under torch.compile.
@torch.compiler.disable
def semi_crf_viterbi(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
):
    """The best segmentation of every sequence (inputs as ``semi_crf_streaming_forward``):
    ``(score [B], segments)`` with score in cum_scores' dtype and ``segments[b]`` the list of
    ``(start, duration, label)`` of sequence b in order of position (read on the host)."""
    _prepare(cum_scores, transition, duration_bias, lengths, K)
    score, start, dur, label, count = semicrf_viterbi(
        _f32(cum_scores), _f32(duration_bias), _f32(transition), lengths
    )
    start, dur, label, count = (x.cpu() for x in (start, dur, label, count))
    segments = [
        list(zip(start[b, :n].tolist(), dur[b, :n].tolist(), label[b, :n].tolist()))
        for b, n in enumerate(count.tolist())
    ]
    return score.to(cum_scores.dtype), segments
