"""The one interface through which a kernel family registers with sentinel.

A family is a :class:`Family` object exported as ``FAMILY`` from ``kernels/<name>/family.py``; sentinel finds it
through :mod:`kernel_sentinel.registry` and never needs changing when a family is added. Everything sentinel says about
a family (routes, checks, traces, gate) comes from this object and the code it points at.

Declarative part (read by the trace generator): ``name``, ``package`` (its docstring is ``summary``), ``tree``,
``invariants``, ``guards``, ``known_issues``, ``source_files()``.

Executable part (run by :mod:`kernel_sentinel.verify`, one route at a time):

- ``make_case(route_id, size=, dtype=, device=, seed=)`` builds a :class:`Case` whose inputs make the dispatcher
  take that route; ``size`` is ``"small"`` (reference and exact backend) or ``"tiny"`` (brute force affordable).
- ``run(case)`` calls the entry point with the case's arguments untouched (bad-input checks go through it too) and,
  for training routes, backward; it returns named tensors: the outputs and every gradient. The verifier runs it
  inside :func:`provable_kernels.dispatch.recording` and checks the route taken.
- ``reference(case)`` returns the same names from the PyTorch reference run in float64.
- ``oracles``: independent computations (exact backend, brute force), each returning some of those names.
- ``properties``: hypothesis properties; ``adversarial``: guard inputs; ``bad_inputs``: one wrong argument each.
- ``tolerances``: allowed error per input dtype, one table for the whole family; routes run in ``dtype``.
"""
from __future__ import annotations

import ast
import dataclasses
import fnmatch
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from provable_kernels.dispatch import Tree

REPO_ROOT = Path(__file__).resolve().parent.parent

Outputs = Mapping[str, torch.Tensor]


def matches(route_id: str, globs: Sequence[str]) -> bool:
    """True when ``route_id`` matches one of the fnmatch patterns ``globs``."""
    return any(fnmatch.fnmatchcase(route_id, g) for g in globs)


def node_exists(node_id: str, root: Path = REPO_ROOT) -> bool:
    """True when the pytest node id ``path.py::test_name`` (or ``path.py::TestClass::test_name``, a ``[param]``
    suffix ignored) names a test pytest would collect (``test*`` functions, ``Test*`` classes) defined in that file, found by parsing it with ``ast`` (no pytest run)."""
    path, _, rest = node_id.partition("::")
    file = root / path
    if not rest or not file.is_file():
        return False
    scope: Sequence[ast.stmt] = ast.parse(file.read_text()).body
    *classes, function = rest.split("[", 1)[0].split("::")
    for name in classes:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == name and name.startswith("Test")]
        if not found:
            return False
        scope = found[0].body
    return function.startswith("test") and any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function for n in scope)


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
    """Inputs for one route: keyword arguments of ``entry`` plus family-private ``extra`` data (e.g. the upstream
    gradient), and a replayable one-line ``description``."""

    route_id: str
    entry: str
    kwargs: Mapping[str, Any]
    description: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def with_kwargs(self, description: str, **changes: Any) -> "Case":
        """The same case with some keyword arguments replaced, described by ``description``."""
        return dataclasses.replace(self, kwargs={**self.kwargs, **changes}, description=description)


@dataclass(frozen=True)
class Oracle:
    """An independent computation of a route's outputs. ``compute(case)`` returns some of the names that
    ``Family.run`` returns (every name it returns is compared); ``size`` is the case size it can afford."""

    name: str
    size: str
    compute: Callable[[Case], Outputs]


@dataclass(frozen=True)
class Property:
    """A hypothesis property of the routes matching ``routes`` (fnmatch globs).

    ``example()`` returns a hypothesis strategy of one example (keep it printable: it is shown shrunk on failure);
    ``check(route_id, example, device)`` raises ``AssertionError`` when the property fails (use
    :func:`kernel_sentinel.checks.expect_close` and :func:`kernel_sentinel.checks.expect`, which also report the error sizes).
    """

    name: str
    routes: tuple[str, ...]
    example: Callable[[], Any]
    check: Callable[[str, Any, torch.device], None]


@dataclass(frozen=True)
class Adversarial:
    """A guard input for the routes matching ``routes``: ``make(case)`` turns the route's tiny case into the
    adversarial one. Outputs must never be NaN; an infinite output is allowed only for the names in ``allow_inf``;
    ``errors_ok`` accepts a ``ValueError``/``TypeError`` instead of a result; ``expect(case, outputs)`` may add
    family-specific assertions (raise ``AssertionError``)."""

    name: str
    routes: tuple[str, ...]
    make: Callable[[Case], Case]
    errors_ok: bool = False
    allow_inf: tuple[str, ...] = ()
    expect: Optional[Callable[[Case, Outputs], None]] = None


@dataclass(frozen=True)
class BadInput:
    """One argument made wrong: ``make(case)`` returns the case with ``argument`` wrong; the call must raise
    ``ValueError`` or ``TypeError`` whose message names ``argument``."""

    argument: str
    what: str
    routes: tuple[str, ...]
    make: Callable[[Case], Case]


@dataclass
class Family:
    """A kernel family as sentinel sees it (see the module docstring for every field)."""

    name: str
    package: ModuleType
    tree: Tree
    entry_points: Mapping[str, Callable[..., Any]]
    make_case: Callable[..., Case]
    run: Callable[[Case], Outputs]
    reference: Callable[[Case], Outputs]
    tolerances: Mapping[torch.dtype, Tolerance]
    oracles: Sequence[Oracle] = ()
    properties: Sequence[Property] = ()
    adversarial: Sequence[Adversarial] = ()
    bad_inputs: Sequence[BadInput] = ()
    invariants: Sequence[Invariant] = ()
    guards: Sequence[Guard] = ()
    known_issues: Sequence[str] = ()
    dtype: torch.dtype = torch.float32

    @property
    def summary(self) -> str:
        return inspect.cleandoc(self.package.__doc__ or "")

    def source_files(self) -> list[Path]:
        """Every file whose change can change this family's behaviour: the family package and the shared
        ``kernels`` modules it imports (paths relative to the repository root)."""
        pkg_dir = Path(next(iter(self.package.__path__))).resolve()
        files = sorted(pkg_dir.glob("*.py"))
        shared = sorted(Path(REPO_ROOT, "kernels").glob("*.py"))
        return [p.relative_to(REPO_ROOT) for p in shared + files]

    def missing_tests(self) -> list[str]:
        """Node ids of declared invariants whose test does not exist."""
        return [inv.test for inv in self.invariants if not node_exists(inv.test)]

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        if dtype not in self.tolerances:
            raise KeyError(f"family {self.name!r} declares no tolerance for {dtype}")
        return self.tolerances[dtype]
