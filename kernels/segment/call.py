"""The validated segment call every route receives, and its validation (naming the argument on error).

Conventions (one, everywhere):

- ``x`` (N, ...) float32 / float64 / bfloat16 / float16: rows are reduced over dim 0, trailing dims are independent
  columns.
- Exactly one index form: CSR ``offsets`` (S+1,) int32 / int64 with ``offsets[0] = 0``, ``offsets[-1] = N``,
  non-decreasing; or sorted ``ids`` (N,) int32 / int64 with values in [0, num_segments). Without
  ``num_segments`` the ids form reads S = ids[-1] + 1 from the device: one extra host sync, and an error naming
  ``num_segments`` where no host read is possible (``NUM_SEGMENTS_NEEDED``).
- Value checks (offsets from 0 to N and non-decreasing; ids in [0, num_segments) and sorted). Host mode (CPU
  tensors, or ``value_checks("sync")``): one batch of device reductions (:class:`provable_kernels.validate.DataChecks`)
  and one host read; a failed check raises the named ``ValueError`` before any work. Device mode (CUDA tensors by
  default, torch.compile, CUDA-graph capture): nothing is read on the host. Where the Triton kernels run they check
  the index themselves (no launch of its own; ``triton_segment`` module doc): nothing is read out of bounds, a segment
  with bad bounds is NaN (every segment when the offsets do not run from 0 to N), and so is a segment holding a row
  with another id (ids form). The PyTorch backend queues the checks as device reductions, swaps a failed index for a
  valid one (every row in one segment) and turns all outputs (the adjoints' upstream gradient) into NaN. A bad index
  is never a silent number.
- ``csr`` is the CSR offsets of either form (derived on the device from ``ids`` with ``searchsorted``) for the
  PyTorch backend; the Triton kernels build it from ``ids`` themselves (``csr`` is then None).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Optional

import torch

from provable_kernels import validate
from provable_kernels.dispatch import triton_usable

REDUCTIONS = ("sum", "mean", "max", "min")
X_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT32 = torch.finfo(torch.float32)  # empty reaches the kernels as two float32 halves (launch.float_halves)
INDEX_LIMIT = 2**31 - 1  # the Triton kernels index rows and segments with int32
# Under torch.compile(fullgraph=True) this message reaches the user inside Dynamo's error: in torch 2.11 in its own
# text, in newer releases as the cause of "Unsupported: Observed exception" (printed first in the traceback)
NUM_SEGMENTS_NEEDED = ("num_segments must be given with ids under torch.compile, CUDA-graph capture or fake tensors "
                       "(S = ids[-1] + 1 cannot be read from the device there): pass num_segments=S")


def runs_triton(use_triton: bool, device: torch.device, rows: int, num_segments: int) -> bool:
    """Whether the Triton kernels run the call: the caller allows them, Triton can run on ``device`` (CUDA, or CPU
    under TRITON_INTERPRET=1) and rows and segments fit int32 indices (N, S < 2**31)."""
    return use_triton and rows < INDEX_LIMIT and num_segments < INDEX_LIMIT and triton_usable(device)


@dataclass(frozen=True)
class SegmentCall:
    """A validated call. ``op`` is ``reduce`` (segment_reduce) or ``adjoint`` (segment_max_backward /
    segment_min_backward, with ``grad_output``)."""

    op: str
    x: torch.Tensor
    reduce: str
    offsets: Optional[torch.Tensor]
    ids: Optional[torch.Tensor]
    csr: Optional[torch.Tensor]
    num_segments: int
    empty: float
    use_triton: bool
    grad_output: Optional[torch.Tensor] = None
    flag: Optional[torch.Tensor] = None  # device mode: the fused value-check flag (outputs are poisoned with it)
    host_checked: bool = True  # the index values were checked on the host (else the Triton kernels check them)

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    @property
    def columns(self) -> int:
        """D: the product of the trailing dims of ``x``."""
        return math.prod(self.x.shape[1:])

    @property
    def form(self) -> str:
        return "ids" if self.ids is not None else "offsets"


require_call = validate.requirer(SegmentCall, "provable_kernels.segment.call.make_call", "op")


def _count(name: str, value: object) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, torch.Tensor) and
                                       (value.is_floating_point() or value.dtype == torch.bool)):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int >= 0, got {type(value).__name__}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _offsets_of(ids: torch.Tensor, S: int) -> torch.Tensor:
    """CSR offsets (S+1,) of sorted ``ids`` (PyTorch backend)."""
    return torch.searchsorted(ids.contiguous(), torch.arange(S + 1, device=ids.device, dtype=ids.dtype))


# verify: unreached (check and bind in one call, for callers outside the runtime, which runs them itself: the tests)
def make_call(op, x, reduce, offsets, ids, num_segments, empty, use_triton, grad_output=None) -> SegmentCall:
    """Validate every argument (naming it on error: :func:`check`, then :func:`bind`) and bundle them into a
    :class:`SegmentCall`."""
    args = (x, reduce, offsets, ids, num_segments, empty, use_triton, grad_output)
    return bind(op, check(op, *args), *args)


def check(op, x, reduce, offsets, ids, num_segments, empty, use_triton, grad_output=None) -> tuple:
    """The metadata checks of a call (every argument but the index values), naming the argument on error; returns
    ``(S, whether the Triton kernels run it)``. The ids form without ``num_segments`` reads S from ``ids`` (its
    documented host sync): the one value this reads."""
    x = validate.tensor("x", x, dtypes=X_DTYPES)
    if x.dim() < 1:
        raise ValueError(f"x must have at least one dim (N, ...), got shape {tuple(x.shape)}")
    reduce = validate.choice("reduce", reduce, REDUCTIONS)
    if isinstance(empty, bool) or not isinstance(empty, (int, float)):
        raise TypeError(f"empty must be a float, got {type(empty).__name__}")
    if empty != 0 and math.isfinite(empty) and not FLOAT32.tiny <= abs(empty) <= FLOAT32.max:
        raise ValueError(f"empty must be 0, +-inf, NaN or in float32's normal range (the kernels take it as two "
                         f"float32 halves), got {empty!r}")
    if not isinstance(use_triton, bool):
        raise TypeError(f"use_triton must be a bool, got {type(use_triton).__name__}")
    if (offsets is None) == (ids is None):
        raise ValueError("offsets and ids: give exactly one of them (CSR offsets or sorted ids), got "
                         + ("both" if offsets is not None else "neither"))
    N = x.shape[0]
    if offsets is not None:
        offsets = validate.tensor("offsets", offsets, ndim=1, dtypes=INDEX_DTYPES, device=x.device)
        if offsets.numel() < 1:
            raise ValueError("offsets must have shape (S+1,) with at least one entry, got shape (0,)")
        S = offsets.numel() - 1
        if num_segments is not None and _count("num_segments", num_segments) != S:
            raise ValueError(f"num_segments must equal offsets.numel() - 1 = {S}, got {num_segments}")
    else:
        ids = validate.tensor("ids", ids, ndim=1, dtypes=INDEX_DTYPES, device=x.device)
        validate.shape("ids", ids, (N,), "(N,)")
        if num_segments is None:
            no_host = N and not validate.host_reads_allowed(ids, at_sync_point=True)
            if no_host:  # verify: unreached (only under torch.compile, CUDA-graph capture, fake tensors)
                raise ValueError(NUM_SEGMENTS_NEEDED)
            S = int(ids[-1]) + 1 if N else 0  # the documented host sync of the ids form without num_segments
        else:
            S = _count("num_segments", num_segments)
    if grad_output is not None:
        grad_output = validate.tensor("grad_output", grad_output, dtypes=(x.dtype,), device=x.device)
        validate.shape("grad_output", grad_output, (S, *x.shape[1:]), "(S, *x.shape[1:])")
    return S, runs_triton(use_triton, x.device, N, S)


def bind(op, meta: tuple, x, reduce, offsets, ids, num_segments, empty, use_triton, grad_output=None) -> SegmentCall:
    """The :class:`SegmentCall` of arguments that passed :func:`check` (``meta``: its result), after the value
    checks of the host-sync policy: a named ``ValueError`` in host mode; in device mode the Triton kernels check
    the index values themselves, and the PyTorch backend gets valid indices and a flag that poisons its
    results."""
    S, triton = meta
    N = x.shape[0]
    if triton and not validate.host_reads_allowed(x):  # device mode (CUDA by default)
        return SegmentCall(op, x, reduce, offsets, ids, offsets, S, float(empty), use_triton, grad_output,
                           host_checked=False)  # the kernels check the index values
    checks = validate.DataChecks()
    if offsets is not None:
        checks.expect((offsets[0] == 0) & (offsets[-1] == N),
                      lambda: f"offsets must start at 0 and end at N = {N}, got {int(offsets[0])} .. "
                              f"{int(offsets[-1])}")
        checks.expect(offsets.diff().amin() >= 0 if S else offsets[0] == 0,
                      lambda: "offsets must be non-decreasing")
    elif N:
        checks.expect((ids[0] >= 0) & (ids[-1] < S),
                      lambda: f"ids must lie in [0, num_segments = {S}), got {int(ids[0])} .. {int(ids[-1])}")
        checks.expect(ids.diff().amin() >= 0 if N > 1 else ids[0] == ids[0],
                      lambda: "ids must be sorted (non-decreasing)")
    csr = offsets if offsets is not None or triton else _offsets_of(ids, S)
    flag = checks.flag()
    # device mode (PyTorch backend): nothing was read on the host. A failed check swaps the index for a valid one
    # (every row in the last segment, or in segment 0), so no kernel indexes out of bounds, and the flag poisons the
    # results.
    if flag is not None:
        if ids is not None:
            ids = torch.where(flag, ids, 0)
            csr = _offsets_of(ids, S)
        else:
            last = torch.arange(S + 1, device=x.device) == S
            csr = torch.where(flag, offsets, torch.where(last, N, 0).to(offsets.dtype))
        if grad_output is not None:
            grad_output = validate.poison(flag, grad_output)
    return SegmentCall(op, x, reduce, offsets, ids, csr, S, float(empty), use_triton, grad_output, flag)
