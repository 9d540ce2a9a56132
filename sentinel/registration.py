"""Reads a family's registration and builds the :class:`~kernel_sentinel.family.Family` that sentinel verifies.

A registration is a package's ``family.py`` (found by :mod:`kernel_sentinel.registry`): data and plain functions,
written with torch and the family's own modules. It imports nothing of sentinel and no hypothesis; everything generic
(building cases, weighted gradients, float64 copies, standard bad inputs, finite differences, comparisons) is here.
Every name a registration may declare, and what each means, is on the guide page ``traces/guide/registration.md``
(the schema: :mod:`kernel_sentinel.schema` checks each registration against it on load).

The functions of a registration receive sentinel's objects and use them without importing sentinel: a
:class:`~kernel_sentinel.family.Case` and a :class:`Checker`.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from kernel_sentinel import cases, schema
from kernel_sentinel.checks import expect, expect_close, run_route
from kernel_sentinel.family import (SYMPTOMS, Adversarial, Aliasing, BadInput, BatchItems, Blocks, Case, Family, FailureMode,
                                    Guard, Invariant, KnownIssue, LayoutRejection, Oracle, Outputs, Problem, Property,
                                    Publish, Tolerance, node_exists, project_root, statement_of)

SEED_RANGE = range(2**16 + 1)  # the seed each example draws


def _globs(routes: Any) -> tuple[str, ...]:
    return (routes,) if isinstance(routes, str) else tuple(routes)


def _placed(x: Any, dtype: torch.dtype, device: torch.device, grad: bool) -> Any:
    """An argument of a case on ``device``: floating tensors (also in tuples) and modules in ``dtype``, floating
    tensors requiring grad when ``grad``."""
    if isinstance(x, tuple):
        return tuple(_placed(m, dtype, device, grad) for m in x)
    if isinstance(x, torch.nn.Module):
        return x.to(device, dtype)
    if not isinstance(x, torch.Tensor):
        return x
    return x.to(device, dtype).requires_grad_(grad) if x.is_floating_point() else x.to(device)


class Part:
    """One registration module (``family.py`` or one of its ``PARTS``): the routes of its tree, how to build and
    run their cases and their float64 references."""

    def __init__(self, module: ModuleType, tolerances: Mapping[torch.dtype, Tolerance]):
        self.module, self.tolerances = module, tolerances
        self.tree = module.TREE
        self.routes = tuple(route.id for route in self.tree.routes())
        self.entry_points = dict(module.ENTRY_POINTS)

    def declared(self, name: str) -> Any:
        return getattr(self.module, name, ())

    def fit(self, route_id: str, problem: Mapping[str, Any], device: torch.device) -> Problem:
        fit = getattr(self.module, "fit", None)
        return Problem(problem if fit is None else fit(route_id, Problem(problem), device))

    def sized(self, route_id: str, size: str, seed: int, device: torch.device) -> Problem:
        return self.fit(route_id, {**self.module.SIZES[size], "seed": seed}, device)

    def build(self, route_id: str, problem: Mapping[str, Any], dtype: torch.dtype, device: torch.device) -> Case:
        """The case of ``route_id`` built from ``problem`` at ``dtype`` on ``device``."""
        problem = Problem(problem)
        entry, kwargs, upstream = self.module.case(route_id, problem, torch.Generator().manual_seed(problem.seed),
                                                   device)
        kwargs = {n: _placed(x, dtype, device, bool(upstream)) for n, x in kwargs.items()}
        upstream = {n: w.to(device, dtype) for n, w in upstream.items()}
        description = f"{entry} {problem} {str(dtype).removeprefix('torch.')} on {device}"
        return Case(route_id, entry, kwargs, description, upstream, problem, dtype, device)

    def rebuilt(self, case: Case, changes: Mapping[str, Any]) -> Case:
        """``case`` built again from its problem with ``changes``."""
        return self.build(case.route_id, {**case.problem, **changes}, case.dtype, case.device)

    def forward(self, case: Case) -> dict[str, Any]:
        """The named outputs of the case's entry point (no backward)."""
        result = self.entry_points[case.entry](**case.kwargs)
        outputs = getattr(self.module, "outputs", None)
        return {"value": result} if outputs is None else dict(outputs(result, case))

    def run(self, case: Case) -> Outputs:
        return cases.outputs_and_gradients(self.forward(case), case)

    def computed(self, function: Callable[[dict, Case], Outputs], case: Case, gradients: bool = True) -> Outputs:
        """``function(float64 copies of the arguments, case)`` with the weighted gradients added by autograd (unless
        ``gradients`` is false) when it returns none and its outputs are differentiable."""
        kw = cases.float64_copies(case.kwargs)
        with torch.enable_grad():
            outputs = dict(function(kw, case))
            if gradients and not any(n.startswith("grad_") for n in outputs) and any(
                    isinstance(x, torch.Tensor) and x.requires_grad for x in outputs.values()):
                return cases.outputs_and_gradients(outputs, case, kw)
        return {n: x.detach() for n, x in outputs.items()}

    def reference(self, case: Case) -> Outputs:
        return self.computed(self.module.reference, case)


class Checker:
    """What a property's ``holds`` and an adversarial input's ``expect`` use: the route's cases and runs, and the
    comparisons sentinel reports (with their error sizes)."""

    def __init__(self, part: Part, route_id: str, dtype: torch.dtype, device: torch.device):
        self.part, self.route_id, self.dtype, self.device = part, route_id, dtype, device
        self.tolerance = part.tolerances[dtype]

    def case(self, problem: Mapping[str, Any]) -> Case:
        """The route's case of ``problem`` (used as it is: not fitted) at the row's dtype and device."""
        return self.part.build(self.route_id, problem, self.dtype, self.device)

    def run(self, case: Case) -> Outputs:
        """Outputs and weighted gradients of ``case``, which must take its route."""
        return run_route(self.part.run, case)

    def forward(self, case: Case) -> Outputs:
        """Outputs of ``case`` without backward; it must take its route."""
        return run_route(self.part.forward, case)

    def reference(self, case: Case) -> Outputs:
        """The float64 reference of ``case`` (on the CPU)."""
        return self.part.reference(case)

    def computed(self, function: Callable[[dict, Case], Outputs], case: Case, gradients: bool = True) -> Outputs:
        """``function(kw, case)`` computed like the reference (float64 copies on the CPU, weighted gradients unless
        ``gradients`` is false)."""
        return self.part.computed(function, case, gradients)

    def close(self, label: str, got: torch.Tensor, want: torch.Tensor, tolerance: Any = None) -> None:
        """``got`` equals ``want`` within ``tolerance`` (``(atol, rtol)``; default the row's)."""
        expect_close(label, got, want, self.tolerance if tolerance is None else Tolerance(*tolerance))

    def matches_reference(self, case: Case, outputs: Outputs, tolerance: Any = None, source: str = "float64 reference",
                          function: Optional[Callable[[dict, Case], Outputs]] = None) -> None:
        """Every output of the reference of ``case`` (or of ``function``, computed like it without gradients)
        equals the output of the same name in ``outputs`` within ``tolerance`` (default the row's)."""
        want = self.reference(case) if function is None else self.computed(function, case, gradients=False)
        for name, want in want.items():
            self.close(f"{name} vs {source}", outputs[name], want, tolerance)

    @staticmethod
    def expect(condition: bool, message: str) -> None:
        """``condition`` holds; ``message`` says what was expected and what was seen."""
        expect(condition, message)


def _strategy(example: Callable[[Callable[[Any], Any]], Mapping[str, Any]]) -> Any:
    """A hypothesis strategy of the problems ``example(pick)`` draws, each with a ``seed``."""
    from hypothesis import strategies as st

    def pick(draw: Any, choices: Any) -> Any:
        if isinstance(choices, range):
            return draw(st.integers(choices.start, choices.stop - 1))
        return draw(st.sampled_from(tuple(choices)))

    @st.composite
    def problems(draw: Any) -> Problem:
        drawn = example(lambda choices: pick(draw, choices))
        return Problem(drawn, seed=pick(draw, SEED_RANGE))

    return problems()


class Reader:
    """Turns one part's declarations into sentinel's objects."""

    def __init__(self, part: Part):
        self.part = part

    def checker(self, case: Case) -> Checker:
        return Checker(self.part, case.route_id, case.dtype, case.device)

    def oracle(self, name: str, size: str, function: Callable[..., Outputs], routes: Any = None) -> Oracle:
        return Oracle(name, size, lambda case: self.part.computed(function, case),
                      self.part.routes if routes is None else _globs(routes))

    def example(self, example: Optional[Callable[..., Any]] = None) -> Callable[[], Any]:
        return lambda: _strategy(example or self.part.module.example)

    def property(self, name: str, routes: Any, holds: Callable[[Checker, Case], None],
                 dtypes: tuple[torch.dtype, ...] = (), example: Optional[Callable[..., Any]] = None) -> Property:
        def check(route_id: str, problem: Problem, device: torch.device, dtype: torch.dtype) -> None:
            checker = Checker(self.part, route_id, dtype, device)
            holds(checker, checker.case(self.part.fit(route_id, problem, device)))

        return Property(name, _globs(routes), self.example(example), check, tuple(dtypes))

    def agreement(self, name: str, routes: Any, function: Callable[[dict, Case], Outputs],
                  dtypes: tuple[torch.dtype, ...] = (), example: Optional[Callable[..., Any]] = None) -> Property:
        def holds(check: Checker, case: Case) -> None:
            check.matches_reference(case, check.forward(case), source=name, function=function)

        return self.property(name, routes, holds, dtypes, example)

    def finite_differences(self, routes: Any) -> Property:
        def make(route_id: str, problem: Problem, device: torch.device) -> Case:
            return self.part.build(route_id, self.part.fit(route_id, problem, device), torch.float64, device)

        return cases.finite_difference_property(_globs(routes), self.example(), make, self.part.run,
                                                self.part.forward, pinned=getattr(self.part.module, "pinned", None))

    def changed(self, case: Case, what: str, change: Any) -> Case:
        if callable(change):
            return change(case)
        functions = dict(change)
        problem = functions.pop("problem", None)
        if problem is not None:
            case = self.part.rebuilt(case, problem(case) if callable(problem) else problem)
        return case.transformed(what, **functions)

    def adversarial(self, name: str, change: Any, verdict: Any = None,
                    options: Optional[Mapping[str, Any]] = None) -> Adversarial:
        if verdict == "reference":
            expected = lambda case, outputs: self.checker(case).matches_reference(case, outputs)  # noqa: E731
        elif verdict == "agrees":
            expected = cases.agrees_with_reference(self.part.reference)
        elif verdict is not None:
            expected = lambda case, outputs: verdict(self.checker(case), case, outputs)  # noqa: E731
        else:
            expected = None
        options = dict(options or {})
        routes = _globs(options.pop("routes", self.part.routes))
        return Adversarial(name, routes, lambda case: self.changed(case, name, change), expect=expected, **options)

    def bad_input(self, argument: str, what: str, value: Any, routes: Any = None,
                  device_mode: Optional[Callable[[Case, dict], None]] = None) -> BadInput:
        def make(case: Case) -> Case:
            new = value(case) if callable(value) else value
            if isinstance(new, Case):
                return new.with_kwargs(f"{new.description}; {argument}: {what}")
            return cases.replace_argument(case, argument, new, what)

        return BadInput(argument, what, self.part.routes if routes is None else _globs(routes), make, device_mode)

    def standard_bad_inputs(self, routes: Any = None, **options: Any) -> tuple[BadInput, ...]:
        return cases.standard_bad_inputs(self.part.routes if routes is None else _globs(routes), **options)

    @staticmethod
    def batch_items(what: str, routes: Any, dims: Any, summed: tuple[str, ...] = ()) -> BatchItems:
        if isinstance(dims, Mapping) and "ragged" in dims:
            return cases.batch_ragged(what, _globs(routes), **dims["ragged"])
        if isinstance(dims, Mapping):
            return cases.batch_along(what, _globs(routes), dims, tuple(summed))
        return BatchItems(what, _globs(routes), *dims, summed=tuple(summed))

    def read(self) -> dict[str, Any]:
        """The part's fields of :class:`~kernel_sentinel.family.Family` (sequences, concatenated over the parts)."""
        declared = self.part.declared
        standard = declared("STANDARD_BAD_INPUTS")
        return {
            "oracles": [self.oracle(*o) for o in declared("ORACLES")],
            "properties": [self.property(*p) for p in declared("PROPERTIES")]
            + [self.agreement(*a) for a in declared("AGREEMENTS")]
            + ([self.finite_differences(declared("FINITE_DIFFERENCES"))] if declared("FINITE_DIFFERENCES") else []),
            "adversarial": [self.adversarial(*a) for a in declared("ADVERSARIAL")],
            "bad_inputs": [b for s in ((standard,) if isinstance(standard, Mapping) else standard)
                           for b in self.standard_bad_inputs(**s)]
            + [self.bad_input(*b) for b in declared("BAD_INPUTS")],
            "batch_items": [self.batch_items(*b) for b in declared("BATCH_ITEMS")],
        }


def _failure_modes(name: str, declared: Mapping[str, Sequence[Any]]) -> list[FailureMode]:
    """The declared failure modes with sentinel's checks and signs of each symptom; "wrong route taken" added
    (leading to the family's decision tree) when not declared."""
    route = (f"{name}/index.md#dispatch-conditions", f"{name}/index.md#decision-tree",
             "route check: the dispatcher records the route id it took")
    modes = []
    for symptom, (checks, signs) in SYMPTOMS.items():
        entry = declared.get(symptom, route if symptom == "wrong route taken" else None)
        if entry is not None:
            first, then, covered, *routes = entry
            modes.append(FailureMode(symptom, first, then, covered, checks, _globs(routes[0] if routes else "*"),
                                     signs))
    unknown = sorted(set(declared) - set(SYMPTOMS))
    if unknown:
        raise ValueError(f"family {name!r}: failure modes of unknown symptoms {unknown}; known: {list(SYMPTOMS)}")
    return modes


def _invariant(family: str, test: str, root: Path) -> Invariant:
    """The invariant that the test ``test`` (a pytest node id relative to ``root``) checks, stated by its
    docstring's first paragraph; a test that does not exist keeps its node id as the text (the trace check names it
    missing)."""
    text = statement_of(test, root)
    if text is None and node_exists(test, root):
        raise ValueError(f"family {family!r}: the invariant test {test} has no docstring; its first paragraph states "
                         f"the invariant the test checks")
    return Invariant(text or test, test)


def _node_ids(tests: Any) -> list[str]:
    """Pytest node ids of ``tests``: node ids, or ``{file: test names}``."""
    if isinstance(tests, Mapping):
        return [f"{path}::{test}" for path, names in tests.items() for test in names]
    return list(tests)


def family_of(module: ModuleType, root: Optional[Path] = None) -> Family:
    """The :class:`~kernel_sentinel.family.Family` of the registration module ``module`` (``<package>.family``),
    whose repository is ``root`` (default :func:`~kernel_sentinel.family.project_root`); ``TypeError`` when it is
    not one."""
    if not isinstance(module, ModuleType):
        raise TypeError(f"module must be a module, got {type(module).__name__}")
    schema.check(module, first=True)
    package = importlib.import_module(module.__name__.rpartition(".")[0])
    name = package.__name__.rpartition(".")[2]
    root = (root or project_root()).resolve()
    tolerances = {dtype: Tolerance(*pair) for dtype, pair in module.TOLERANCES.items()}
    more = [importlib.import_module(f"{package.__name__}.{part}") for part in getattr(module, "PARTS", ())]
    for part in more:
        schema.check(part, first=False)
    parts = [Part(m, tolerances) for m in (module, *more)]
    fields: dict[str, list[Any]] = {}
    for part in parts:
        for field_name, items in Reader(part).read().items():
            fields.setdefault(field_name, []).extend(items)

    def part_of(route_id: str) -> Part:
        found = [p for p in parts if route_id in p.routes]
        if not found:
            raise ValueError(f"route_id {route_id!r} is no route of family {name!r}")
        return found[0]

    def make_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
        part = part_of(route_id)
        return part.build(route_id, part.sized(route_id, size, seed, device), dtype, device)

    def issue(entry: Any) -> Any:
        return entry if isinstance(entry, str) else KnownIssue(*entry)

    return Family(
        name=name, package=package, tree=parts[0].tree, more_trees=[p.tree for p in parts[1:]],
        entry_points={n: f for p in parts for n, f in p.entry_points.items()},
        make_case=make_case, run=lambda case: part_of(case.route_id).run(case),
        reference=lambda case: part_of(case.route_id).reference(case),
        tolerances=tolerances, dtypes=tuple(tolerances),
        invariants=[_invariant(name, test, root) for test in _node_ids(getattr(module, "INVARIANTS", ()))],
        guards=[Guard(*g) for g in getattr(module, "GUARDS", ())],
        known_issues=[issue(i) for i in getattr(module, "KNOWN_ISSUES", ())],
        failure_modes=_failure_modes(name, getattr(module, "FAILURE_MODES", {})),
        aliasing=[Aliasing(output, argument, _globs(routes), why)
                  for output, argument, routes, why in getattr(module, "ALIASING", ())],
        rejected_layouts=[LayoutRejection(argument, layout, _globs(routes), why)
                          for argument, layout, routes, why in getattr(module, "REJECTED_LAYOUTS", ())],
        blocks=[Blocks(_globs(routes), argument, dim, block, tuple(sizes[0]) if sizes else ("small",))
                for routes, argument, dim, block, *sizes in getattr(module, "BLOCKS", ())],
        publishes=[Publish(*p) for p in getattr(module, "PUBLISHES", ())],
        root=root, **fields)

