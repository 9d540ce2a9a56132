"""Comparison and assertion helpers shared by the verifier and by the families' properties and guards.

- :func:`compare` measures one tensor against a reference (max abs error, max rel error, tolerance verdict).
- :func:`expect_close` / :func:`expect` are the assertions property and guard code uses; every comparison made
  through :func:`expect_close` inside :func:`measuring` is collected so the report can show the error sizes.
- :func:`run_route` runs a family's route on a case and fails unless the dispatcher recorded exactly that route.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

from provable_kernels.dispatch import recording
from kernel_sentinel.family import Case, Outputs, Tolerance


class RouteMismatch(AssertionError):
    """The dispatcher took another route (or none) than the one the case was built for."""


@dataclass(frozen=True)
class Measurement:
    """One comparison ``got`` vs ``want``: the largest absolute and relative errors, the tolerance, and ``ratio``,
    the largest ``|got - want| / (atol + rtol * |want|)`` (the comparison passes when ``ratio <= 1``).

    Equal infinities count as zero error; NaN on either side, an infinity on one side only, or a shape mismatch
    count as infinite error. ``max_rel`` is taken over the elements where ``want != 0``.
    """

    label: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    ratio: float
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def __str__(self) -> str:
        text = f"{self.label}: abs {self.max_abs:.3g}, rel {self.max_rel:.3g} (atol {self.atol:g}, rtol {self.rtol:g})"
        return text + (f" {self.note}" if self.note else "")


def compare(label: str, got: torch.Tensor, want: torch.Tensor, tol: Tolerance) -> Measurement:
    """Measure ``got`` against ``want`` elementwise in float64 on the CPU."""
    got = torch.as_tensor(got).detach().cpu().double()
    want = torch.as_tensor(want).detach().cpu().double()
    if got.shape != want.shape:
        note = f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
        return Measurement(label, math.inf, math.inf, tol.atol, tol.rtol, math.inf, note)
    if got.numel() == 0:
        return Measurement(label, 0.0, 0.0, tol.atol, tol.rtol, 0.0)
    same = (got == want) & ~torch.isnan(got)
    err = torch.where(same, torch.zeros_like(got), (got - want).abs())
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    scale = torch.where(torch.isfinite(want), want.abs(), torch.zeros_like(want))
    ratio = err / (tol.atol + tol.rtol * scale)
    nonzero = want != 0
    rel = (err[nonzero] / want[nonzero].abs()) if bool(nonzero.any()) else torch.zeros(1, dtype=torch.float64)
    rel = torch.where(torch.isnan(rel), torch.full_like(rel, math.inf), rel)
    bad = int((~torch.isfinite(got) & ~same).sum())
    note = f"({bad} non-finite values differ)" if bad else ""
    return Measurement(label, float(err.max()), float(rel.max()), tol.atol, tol.rtol, float(ratio.max()), note)


_MEASURED: contextvars.ContextVar[tuple[list[Measurement], ...]] = contextvars.ContextVar("_MEASURED", default=())


@contextlib.contextmanager
def measuring() -> Iterator[list[Measurement]]:
    """Collect every :func:`expect_close` comparison made inside the block (also the failing one)."""
    collected: list[Measurement] = []
    token = _MEASURED.set(_MEASURED.get() + (collected,))
    try:
        yield collected
    finally:
        _MEASURED.reset(token)


def expect_close(label: str, got: torch.Tensor, want: torch.Tensor, tol: Tolerance) -> Measurement:
    """Assert ``got`` matches ``want`` within ``tol`` (see :func:`compare`); the measurement is collected."""
    m = compare(label, got, want, tol)
    for collected in _MEASURED.get():
        collected.append(m)
    if not m.ok:
        raise AssertionError(str(m))
    return m


def expect(condition: bool, message: str) -> None:
    """Assert ``condition``; ``message`` says what was expected and what was seen."""
    if not condition:
        raise AssertionError(message)


def compare_outputs(got: Outputs, want: Outputs, tol: Tolerance, source: str = "") -> list[Measurement]:
    """Compare every name in ``want`` with the same name in ``got`` (a name missing from ``got`` fails)."""
    prefix = f"{source}: " if source else ""
    out = []
    for name, ref in want.items():
        if name not in got:
            out.append(Measurement(prefix + name, math.inf, math.inf, tol.atol, tol.rtol, math.inf, "(missing)"))
        else:
            out.append(compare(prefix + name, got[name], ref, tol))
    return out


def run_route(run: Callable[[Case], Outputs], case: Case) -> Outputs:
    """``run(case)`` inside :func:`provable_kernels.dispatch.recording`; raise :class:`RouteMismatch` unless the
    dispatcher recorded exactly ``[case.route_id]`` (routes that the route itself dispatches, e.g. the streaming
    route under a head route, are not counted)."""
    with recording(nested=False) as taken:
        outputs = run(case)
    if taken != [case.route_id]:
        raise RouteMismatch(f"intended route {case.route_id!r}, dispatcher recorded {taken!r} ({case.description})")
    return outputs


def non_finite(outputs: Mapping[str, torch.Tensor], allow_inf: tuple[str, ...] = ()) -> list[str]:
    """Names of outputs holding NaN, or an infinity when the name is not in ``allow_inf``."""
    bad = []
    for name, value in outputs.items():
        value = torch.as_tensor(value)
        if not value.is_floating_point():
            continue
        if bool(torch.isnan(value).any()):
            bad.append(f"{name} has NaN")
        elif name not in allow_inf and bool(torch.isinf(value).any()):
            bad.append(f"{name} has inf")
    return bad


def kernel_name(kernel: Any) -> str:
    """The name of a ``@triton.jit`` function (interpreted or compiled: both wrap the Python function as ``fn``)."""
    return getattr(kernel, "fn", kernel).__name__


@contextlib.contextmanager
def kernel_launches(removed: Optional[str] = None) -> Iterator[list[str]]:
    """Record the name of every kernel launched inside the block, one entry per launch in launch order; launches
    of the kernel named ``removed`` do nothing (its outputs stay as allocated)."""
    if removed is not None and not isinstance(removed, str):
        raise TypeError(f"removed must be a kernel name (str) or None, got {type(removed).__name__}")
    from provable_kernels.launch import Bound, Launcher  # here: it imports Triton, after the interpreter switch

    original, bound_call = Launcher.launch, Bound.__call__
    launched: list[str] = []

    def launch(self: Any, grid: tuple, args: tuple, opts: Any) -> None:
        name = kernel_name(self.kernel)
        launched.append(name)
        if name != removed:
            original(self, grid, args, opts)

    def bound_launch(self: Any, *tensors: Any) -> None:  # a prepared launch: on a GPU it bypasses Launcher.launch
        self.launcher.launch(self.grid, (*tensors, *self.tail), self.opts)  # through any wrapper set inside the block

    Launcher.launch, Bound.__call__ = launch, bound_launch
    try:
        yield launched
    finally:
        Launcher.launch, Bound.__call__ = original, bound_call
