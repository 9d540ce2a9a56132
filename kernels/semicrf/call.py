"""The validated semi-CRF call: what every route and backend receives. Imports no backend.

Conventions (the site page "Semi-CRF conventions", ``traces/guide/semicrf-conventions.md``):

- ``cum_scores`` (B, T+1, C), ``cum_scores[:, 0] = 0``: prefix sums of per-position label scores (only differences
  enter a score). A nonzero first row is rejected like a NaN (a named ``ValueError`` in host mode, NaN results in
  device mode): it is what ``scores.cumsum(1)`` without the zero row gives, one position off; with ``lengths``
  reaching ``cum_scores.shape[1]`` as well (per-position scores (B, T, C) passed as ``cum_scores``) the error says so
  first. Every float tensor may be float16, bfloat16, float32 or float64, each its own, on the device of
  ``cum_scores``: they are computed in the *compute dtype*, float64 when any is float64, else float32 (the casts are
  differentiable, so gradients come back in each input's dtype; outputs are in the compute dtype).
- ``transition`` (C, C) or duration-dependent (K, C, C), oriented ``transition[src, dst]``.
- ``duration_bias`` (K, C): row ``d-1`` for duration ``d``; durations are 1..K, **K inclusive**.
- ``proj_start``, ``proj_end`` (B, T, C), each optional: scores for a segment starting / ending at a position.
- ``transition``, ``duration_bias``, ``proj_start`` and ``proj_end`` may hold -inf to forbid a choice; NaN and
  +inf are rejected everywhere, and ``cum_scores`` must be finite. Rejected means a named ``ValueError`` in host
  mode and NaN results in device mode (the site page "Host syncs and value checks" says which, and where).
- ``lengths`` (B,) int32/int64 with 1 <= L <= T.
- A segment [s, s+d) with label c scores ``cum[s+d, c] - cum[s, c] + duration_bias[d-1, c] + proj_start[s, c]
  + proj_end[s+d-1, c]``; every segment after the first also pays ``trans(d)[c_prev, c]``.
- ``semiring="log"`` gives logZ (logsumexp over all segmentations), ``"max"`` the best score.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from provable_kernels import validate
from provable_kernels.semicrf import fused_checks
from provable_kernels.dispatch import triton_usable

SCORE_NAMES = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
SEMIRINGS = ("log", "max")
OPS = ("partition", "viterbi")


@dataclass(slots=True)  # not frozen: a frozen dataclass costs ~1.5 us more host time per construction
class Scores:
    """The validated score tensors of a semi-CRF model (shapes in the module docstring). Read-only by convention."""

    cum_scores: torch.Tensor
    transition: torch.Tensor
    duration_bias: torch.Tensor
    lengths: torch.Tensor
    K: int
    proj_start: Optional[torch.Tensor]
    proj_end: Optional[torch.Tensor]
    ok: Optional[torch.Tensor] = field(default=None, kw_only=True)  # device-mode value checks (validate.poison)

    @property
    def batch(self) -> int:
        return self.cum_scores.shape[0]

    @property
    def T(self) -> int:
        return self.cum_scores.shape[1] - 1

    @property
    def C(self) -> int:
        return self.cum_scores.shape[2]

    @property
    def tensors(self) -> tuple[Optional[torch.Tensor], ...]:
        """The five differentiable inputs, in a fixed order."""
        return (self.cum_scores, self.transition, self.duration_bias, self.proj_start, self.proj_end)


@dataclass(slots=True)
class StreamingCall(Scores):
    """A validated call of a streaming entry point: the scores, which ``op`` (``partition`` or ``viterbi``), the
    ``semiring`` and whether the caller allows the Triton backend. Read-only by convention."""

    op: str
    semiring: str
    use_triton: bool


INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# The Triton kernels keep a (CP, CP) transition tile (CP = C padded to a power of two) and its float64 gradient
# sums in registers for the whole sequence. Up to CP = 64 that fits the register file; at CP = 128 it spills and
# the backward takes 24 s to compile for sm_90, at CP = 512 (C = 257) more than 200 s.
TRITON_MAX_LABELS = 64


def triton_runs(use_triton: bool, device: torch.device, C: int) -> bool:
    """Whether the Triton kernels run a call: the caller allows them, Triton can run on ``device`` (CUDA, or the
    CPU under ``TRITON_INTERPRET=1``) and there are at most :data:`TRITON_MAX_LABELS` labels."""
    return use_triton and C <= TRITON_MAX_LABELS and triton_usable(device)
TRANSFORMS_HINT = ("the semi-CRF does not support torch.func transforms (vmap, grad, jacrev, ...): its kernels are "
                   "custom ops with a hand-written backward and no batching rule. Use torch.autograd.grad (or "
                   ".backward()) for gradients, and a larger batch B instead of vmap")


def check_scores(cum_scores, transition, duration_bias, lengths, K, proj_start=None, proj_end=None, *,
                 at_sync_point: bool = False, use_triton: bool = False) -> Scores:
    """Validate the score tensors (naming the argument on error: ``TypeError`` for a wrong type or dtype,
    ``ValueError`` for a wrong shape, device or value) and cast the float ones to the compute dtype (module
    docstring): :func:`check_metadata`, then :func:`bind_scores`."""
    _refuse_transforms()
    meta = check_metadata(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
    return bind_scores(meta, cum_scores, transition, duration_bias, lengths, proj_start, proj_end,
                       at_sync_point=at_sync_point, use_triton=use_triton)


def _refuse_transforms() -> None:
    # verify: unreached (torch.func transforms are refused with a hint; tests)
    if not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active():
        raise RuntimeError(TRANSFORMS_HINT)


def bind_scores(meta: tuple, cum_scores, transition, duration_bias, lengths, proj_start, proj_end, *,
                at_sync_point: bool, use_triton: bool) -> Scores:
    """The :class:`Scores` of arguments that passed :func:`check_metadata` (``meta``: its result), cast to the
    compute dtype, after the value checks (finiteness, length range, the zero row), which follow the host-sync
    policy of :class:`provable_kernels.validate.DataChecks` (``at_sync_point``: the caller reads results on the
    host anyway): a named error now, or, in device mode, ``Scores.ok`` for the caller to poison its outputs with
    (``lengths`` then clamped into 1..T).

    ``use_triton``: the caller allows the Triton kernels. Where they run (:func:`triton_runs`) they check the
    values of each sequence themselves (a failed check makes that sequence's output NaN, lengths clamped), so
    device mode adds nothing here; host mode runs every check in one launch (:mod:`provable_kernels.semicrf.fused_checks`)
    and, on a failure, again per argument for the named error."""
    dtype, K, cast = meta
    device, T1, C = cum_scores.device, cum_scores.shape[1], cum_scores.shape[2]
    if cast:  # verify: unreached (mixed-dtype arguments: tests/test_semicrf_training.py, the GPU script's mixed section)
        cum_scores, transition, duration_bias, proj_start, proj_end = (
            x if x is None or x.dtype == dtype else x.to(dtype)
            for x in (cum_scores, transition, duration_bias, proj_start, proj_end))
    floats = ((cum_scores, False), (transition, True), (duration_bias, True), (proj_start, True), (proj_end, True))
    fused_failed = False
    if triton_runs(use_triton, device, C):
        if not validate.host_reads_allowed(cum_scores, at_sync_point=at_sync_point):
            return Scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
        if fused_checks.usable(cum_scores):  # one launch instead of a reduction per check, and the zero row
            if bool(fused_checks.check_values(floats, lengths, 1, T1 - 1) & _zero_row(cum_scores)):  # all right
                return Scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
            fused_failed = True
    checks = validate.DataChecks(at_sync_point=at_sync_point)  # one reduction per check: the named error
    for name, (x, allow_neg_inf) in zip(SCORE_NAMES, floats):
        if x is not None:
            checks.finite(name, x, allow_neg_inf=allow_neg_inf)
    checks.expect(_zero_row(cum_scores) | (lengths != T1).all(), lambda: PER_POSITION.format(T1=T1))
    lengths = checks.in_range("lengths", lengths, 1, T1 - 1)
    checks.expect(_zero_row(cum_scores), lambda: "cum_scores[:, 0] must be 0 (prefix sums start with a zero row: "
                  "torch.cat([zeros(B, 1, C), scores.cumsum(1)], 1)), got a nonzero entry")
    ok = checks.flag()  # host mode: raises the named error of a failed check
    if fused_failed and ok is None:  # verify: unreached (only a wrong fused kernel gets here)
        raise RuntimeError("internal error: the fused value check failed where every per-argument check passed")
    return Scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, ok=ok)


PER_POSITION = ("cum_scores looks like per-position scores (B, T, C), not their prefix sums (B, T+1, C): its first "
                "row is not zero and lengths reach cum_scores.shape[1] = {T1}; pass "
                "torch.cat([zeros(B, 1, C), scores.cumsum(1)], 1)")


def _zero_row(cum_scores: torch.Tensor) -> torch.Tensor:
    """0-d bool: ``cum_scores[:, 0]`` is all zeros (NaN fails)."""
    return (cum_scores[:, 0] == 0).all()


def check_metadata(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end) -> tuple:
    """Check every argument's type, rank, dtype, device and shape (naming it on error; values are not read) and
    return ``(compute dtype, K as an int, whether a float tensor needs a cast to it)``."""
    cum_scores = validate.tensor("cum_scores", cum_scores, ndim=3, dtypes=INPUT_DTYPES)
    device = cum_scores.device
    B, T1, C = cum_scores.shape
    if T1 < 2:
        raise ValueError(f"cum_scores must have shape (B, T+1, C) with T >= 1, got {tuple(cum_scores.shape)}")
    if C < 1:
        raise ValueError(f"cum_scores must have at least one label (C >= 1), got shape {tuple(cum_scores.shape)}")
    K = validate.positive_int("K", K)
    transition = validate.tensor("transition", transition, ndim=(2, 3), dtypes=INPUT_DTYPES, device=device)
    if transition.dim() == 2:
        validate.shape("transition", transition, (C, C), "(C, C)")
    else:
        validate.shape("transition", transition, (K, C, C), "(K, C, C)")
    duration_bias = validate.tensor("duration_bias", duration_bias, ndim=2, dtypes=INPUT_DTYPES, device=device)
    validate.shape("duration_bias", duration_bias, (K, C), "(K, C)")
    for name, proj in (("proj_start", proj_start), ("proj_end", proj_end)):
        if proj is not None:
            validate.tensor(name, proj, ndim=3, dtypes=INPUT_DTYPES, device=device)
            validate.shape(name, proj, (B, T1 - 1, C), "(B, T, C)")
    lengths = validate.tensor("lengths", lengths, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
    validate.shape("lengths", lengths, (B,), "(B,)")
    dtypes = {x.dtype for x in (cum_scores, transition, duration_bias, proj_start, proj_end) if x is not None}
    dtype = torch.float64 if torch.float64 in dtypes else torch.float32
    return dtype, K, dtypes != {dtype}


def check(op: str, cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
          use_triton) -> tuple:
    """The metadata checks of a streaming call (every argument but the values, naming it on error); returns
    :func:`check_metadata`'s result."""
    validate.choice("semiring", semiring, SEMIRINGS)
    if not isinstance(use_triton, bool):
        raise TypeError(f"use_triton must be a bool, got {type(use_triton).__name__}")
    _refuse_transforms()
    return check_metadata(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)


def bind(op: str, meta: tuple, cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
         use_triton) -> StreamingCall:
    """The :class:`StreamingCall` of arguments that passed :func:`check` (``meta``: its result), with the value
    checks of :func:`bind_scores`. ``op="viterbi"`` reads its value checks on the host wherever possible (its
    results become Python values anyway)."""
    scores = bind_scores(meta, cum_scores, transition, duration_bias, lengths, proj_start, proj_end,
                         at_sync_point=op == "viterbi", use_triton=use_triton)
    # Fields spelled out: torch.compile (dynamo) cannot trace vars() of a dataclass.
    return StreamingCall(scores.cum_scores, scores.transition, scores.duration_bias, scores.lengths, scores.K,
                         scores.proj_start, scores.proj_end, ok=scores.ok, op=op, semiring=semiring,
                         use_triton=use_triton)


# verify: unreached (check and bind in one call, for callers outside the runtime, which runs them itself: the tests)
def make_call(op, cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
              use_triton) -> StreamingCall:
    """Validate every argument (:func:`check`, then :func:`bind`) and bundle them into a :class:`StreamingCall`."""
    op = validate.choice("op", op, OPS)
    args = (cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end, use_triton)
    return bind(op, check(op, *args), *args)


require_call = validate.requirer(StreamingCall, "provable_kernels.semicrf.call.make_call", "semiring")


def pad_duration_rows(grad: torch.Tensor, K: int) -> torch.Tensor:
    """A gradient over durations (K', ...) with zero rows appended up to K rows: backends cap K at T, and the
    rows of durations longer than T (which no segment has) get zero gradient."""
    missing = K - grad.shape[0]
    return torch.cat([grad, grad.new_zeros((missing,) + tuple(grad.shape[1:]))]) if missing > 0 else grad
