"""The validated semi-CRF call: what every route and backend receives. Imports no backend.

Conventions (the site page "Semi-CRF conventions", ``traces/guide/semicrf-conventions.md``):

- ``cum_scores`` (B, T+1, C), ``cum_scores[:, 0] = 0``: prefix sums of per-position label scores (only
  differences enter a score). Every float tensor may be float16, bfloat16, float32 or float64, each its own, on
  the device of ``cum_scores``: they are computed in the *compute dtype*, float64 when any is float64, else
  float32 (the casts are differentiable, so gradients come back in each input's dtype; outputs are in the compute
  dtype).
- ``transition`` (C, C) or duration-dependent (K, C, C), oriented ``transition[src, dst]``.
- ``duration_bias`` (K, C): row ``d-1`` for duration ``d``; durations are 1..K, **K inclusive**.
- ``proj_start``, ``proj_end`` (B, T, C), each optional: scores for a segment starting / ending at a position.
- ``transition``, ``duration_bias``, ``proj_start`` and ``proj_end`` may hold -inf to forbid a choice; NaN and
  +inf are rejected everywhere, and ``cum_scores`` must be finite.
- ``lengths`` (B,) int32/int64 with 1 <= L <= T.
- A segment [s, s+d) with label c scores ``cum[s+d, c] - cum[s, c] + duration_bias[d-1, c] + proj_start[s, c]
  + proj_end[s+d-1, c]``; every segment after the first also pays ``trans(d)[c_prev, c]``.
- ``semiring="log"`` gives logZ (logsumexp over all segmentations), ``"max"`` the best score.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from provable_kernels import fused_checks, validate

SCORE_NAMES = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
SEMIRINGS = ("log", "max")
OPS = ("partition", "viterbi")


@dataclass(frozen=True)
class Scores:
    """The validated score tensors of a semi-CRF model (shapes in the module docstring)."""

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


@dataclass(frozen=True)
class StreamingCall(Scores):
    """A validated call of a streaming entry point: the scores, which ``op`` (``partition`` or ``viterbi``), the
    ``semiring`` and whether the caller allows the Triton backend."""

    op: str
    semiring: str
    use_triton: bool


INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRANSFORMS_HINT = ("the semi-CRF does not support torch.func transforms (vmap, grad, jacrev, ...): its kernels are "
                   "custom ops with a hand-written backward and no batching rule. Use torch.autograd.grad (or "
                   ".backward()) for gradients, and a larger batch B instead of vmap")


def check_scores(cum_scores, transition, duration_bias, lengths, K, proj_start=None, proj_end=None, *,
                 at_sync_point: bool = False, fused: bool = False) -> Scores:
    """Validate the score tensors (naming the argument on error: ``TypeError`` for a wrong type or dtype,
    ``ValueError`` for a wrong shape, device or value) and cast the float ones to the compute dtype (module
    docstring). Types, shapes, dtypes and devices are checked on the host before any work; the value checks
    (finiteness, length range) follow the host-sync policy of :class:`provable_kernels.validate.DataChecks`
    (``at_sync_point``: the caller reads results on the host anyway): a named error now, or ``Scores.ok`` for
    the caller to poison its outputs with (``lengths`` then clamped into 1..T). ``fused``: where Triton runs,
    every value check in one launch (:mod:`provable_kernels.fused_checks`); in host mode a failure is then
    checked again per argument for the named error."""
    # verify: unreached (torch.func transforms are refused with a hint; tests)
    if not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active():
        raise RuntimeError(TRANSFORMS_HINT)
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
    floats = (cum_scores, transition, duration_bias, proj_start, proj_end)
    dtype = torch.float64 if any(x is not None and x.dtype == torch.float64 for x in floats) else torch.float32
    cum_scores, transition, duration_bias, proj_start, proj_end = (  # a cast only where needed (host time)
        x if x is None or x.dtype == dtype else x.to(dtype) for x in floats)
    lengths = validate.tensor("lengths", lengths, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
    validate.shape("lengths", lengths, (B,), "(B,)")
    floats = ((cum_scores, False), (transition, True), (duration_bias, True), (proj_start, True), (proj_end, True))
    fused_failed = False
    if fused and fused_checks.usable(cum_scores):  # one launch instead of a reduction per check
        ok, clamped = fused_checks.check_values(floats, lengths, 1, T1 - 1)
        # verify: unreached (device mode: CUDA calls by default; tests/test_fused_checks.py on the CPU)
        if not validate.host_reads_allowed(cum_scores, at_sync_point=at_sync_point):
            return Scores(cum_scores, transition, duration_bias, clamped, K, proj_start, proj_end, ok=ok)
        if bool(ok):  # host mode, every value right: no per-check pass
            return Scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
        fused_failed = True
    checks = validate.DataChecks(at_sync_point=at_sync_point)  # one reduction per check: the named error
    for name, (x, allow_neg_inf) in zip(SCORE_NAMES, floats):
        if x is not None:
            checks.finite(name, x, allow_neg_inf=allow_neg_inf)
    lengths = checks.in_range("lengths", lengths, 1, T1 - 1)
    ok = checks.flag()  # host mode: raises the named error of a failed check
    if fused_failed and ok is None:  # verify: unreached (only a wrong fused kernel gets here)
        raise RuntimeError("internal error: the fused value check failed where every per-argument check passed")
    return Scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, ok=ok)


def make_call(op, cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
              use_triton) -> StreamingCall:
    """Validate every argument (naming it on error, see :func:`check_scores`) and bundle them into a
    :class:`StreamingCall`. ``op="viterbi"`` reads its value checks on the host wherever possible (its results
    become Python values anyway)."""
    op = validate.choice("op", op, OPS)
    semiring = validate.choice("semiring", semiring, SEMIRINGS)
    if not isinstance(use_triton, bool):
        raise TypeError(f"use_triton must be a bool, got {type(use_triton).__name__}")
    scores = check_scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                          at_sync_point=op == "viterbi", fused=use_triton)
    # Fields spelled out: torch.compile (dynamo) cannot trace vars() of a frozen dataclass.
    return StreamingCall(scores.cum_scores, scores.transition, scores.duration_bias, scores.lengths, scores.K,
                         scores.proj_start, scores.proj_end, ok=scores.ok, op=op, semiring=semiring,
                         use_triton=use_triton)


def require_call(call: object, semiring: Optional[str] = None) -> StreamingCall:
    """``call`` itself, after checking it is a :class:`StreamingCall` (and of ``semiring`` when given): the guard
    every backend function runs first."""
    if not isinstance(call, StreamingCall):  # verify: unreached (internal guard: routes get make_call's call)
        raise TypeError(f"call must be a StreamingCall (built by provable_kernels.semicrf.call.make_call), "
                        f"got {type(call).__name__}")
    if semiring is not None and call.semiring != semiring:  # verify: unreached (internal guard: the tree routes by it)
        raise ValueError(f"call.semiring must be {semiring!r} here, got {call.semiring!r}")
    return call


def pad_duration_rows(grad: torch.Tensor, K: int) -> torch.Tensor:
    """A gradient over durations (K', ...) with zero rows appended up to K rows: backends cap K at T, and the
    rows of durations longer than T (which no segment has) get zero gradient."""
    missing = K - grad.shape[0]
    return torch.cat([grad, grad.new_zeros((missing,) + tuple(grad.shape[1:]))]) if missing > 0 else grad
