"""The one interface through which a kernel family registers with sentinel.

A family is a :class:`Family` object exported as ``FAMILY`` from ``kernels/<name>/family.py``; sentinel finds it
through :mod:`sentinel.registry` and never needs changing when a family is added. Everything sentinel says about
a family (routes, checks, traces, gate) comes from this object and the code it points at.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from kernels.dispatch import Tree

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Tolerance:
    """Allowed error against the float64 reference: pass when ``|x - ref| <= atol + rtol * |ref|`` elementwise."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Invariant:
    """A property the family promises, and the pytest node id of the test that checks it."""

    text: str
    test: str


@dataclass(frozen=True)
class Guard:
    """A numerical guard in the code: what can go wrong, what the code does about it, where (a function)."""

    text: str
    where: Callable[..., Any]


@dataclass(frozen=True)
class Case:
    """Inputs for one route: keyword arguments of ``entry`` and a replayable description."""

    route_id: str
    entry: str
    kwargs: Mapping[str, Any]
    description: str


@dataclass
class Family:
    """A kernel family as sentinel sees it.

    - ``package``: the family package (``kernels.semicrf``); its docstring is the trace summary.
    - ``tree``: the dispatch tree; its leaves are the routes sentinel must run.
    - ``entry_points``: public functions by name (the ones the tree dispatches).
    - ``make_case(route_id, dtype=, device=, seed=, size=)``: inputs that make the dispatcher take that route.
    - ``run(case)``: outputs and gradients of the route under test, as named tensors.
    - ``reference(case)``: the same names from the PyTorch reference run in float64.
    - ``exact(case)``: the same names (or a subset) from the exact backend / brute-force oracle, or None.
    - ``properties``, ``guards_check``, ``bad_inputs``: callables the verifier runs per route (see sentinel.verify).
    - ``tolerances``: per input dtype.
    - ``invariants``, ``guards``: declared promises and numerical guards, for checks and traces.
    - ``known_issues``: prose for the trace.
    """

    name: str
    package: ModuleType
    tree: Tree
    entry_points: Mapping[str, Callable[..., Any]]
    make_case: Callable[..., Case]
    run: Callable[[Case], Mapping[str, torch.Tensor]]
    reference: Callable[[Case], Mapping[str, torch.Tensor]]
    exact: Callable[[Case], Optional[Mapping[str, torch.Tensor]]]
    tolerances: Mapping[torch.dtype, Tolerance]
    properties: Sequence[Any] = ()
    adversarial: Sequence[Any] = ()
    bad_inputs: Sequence[Any] = ()
    invariants: Sequence[Invariant] = ()
    guards: Sequence[Guard] = ()
    known_issues: Sequence[str] = ()

    @property
    def summary(self) -> str:
        return inspect.cleandoc(self.package.__doc__ or "")

    def source_files(self) -> list[Path]:
        """Every file whose change can change this family's behaviour: the family package and the shared
        ``kernels`` modules it imports (paths relative to the repository root)."""
        pkg_dir = Path(self.package.__file__).resolve().parent
        files = sorted(pkg_dir.glob("*.py"))
        shared = sorted(Path(REPO_ROOT, "kernels").glob("*.py"))
        return [p.relative_to(REPO_ROOT) for p in shared + files]
