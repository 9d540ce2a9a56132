"""The ``opcheck`` check: every custom op a route calls passes ``torch.library.opcheck``, with no family code.

``torch.compile``, export and fake-tensor tracing see a route as its custom ops
(:class:`provable_kernels.custom_ops.Op`): their schemas, fake implementations and autograd registrations are
what compile runs, while a plain eager call skips the dispatcher and never runs them. The check runs the route's
``tiny`` case (forward and backward, :attr:`Family.run`) once under a recording ``TorchDispatchMode``, which also
makes every :class:`~provable_kernels.custom_ops.Op` call go through the custom-op dispatcher, as under compile;
the first call of each op in the ``provable_kernels`` namespace is kept with its arguments. Each kept call then
runs through ``torch.library.opcheck`` (:data:`TESTS`: the schema, the autograd registration, and the fake
implementation against the real one's output metadata). The arguments are copies; those of an op the route
differentiated (its backward pass reached the op's outputs) require grad where the route's did, those of the
others (a backward op, an inference call, an op whose outputs get no gradient) do not.

A Triton route that calls no custom op fails: compile would trace into its kernel launch. Another route without
one passes with nothing to check (PyTorch's own operations trace as they are).

What it cannot see: ops called only at other sizes or with other flags than the ``tiny`` case's (each op is
checked at its first call's arguments), and the op under AOT autograd with dynamic shapes (opcheck's
``test_aot_dispatch_dynamic``, left to the families' opcheck tests: it runs each op several more times, 1-7 s per
op under the Triton interpreter, more than the rest of the check).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from kernel_sentinel.checks import run_route
from kernel_sentinel.family import Case, Family
from kernel_sentinel.generic import Verdict, fresh_case
from kernel_sentinel.sanitize import is_triton_route

NAMESPACE = "provable_kernels"
TESTS = ("test_schema", "test_autograd_registration", "test_faketensor")


class Recorder(TorchDispatchMode):
    """Keeps the first call of every op of :data:`NAMESPACE`: ``calls[op] = (args, kwargs)`` (the tensors
    themselves; :func:`_copied` copies them)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[Any, tuple[tuple, dict]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace == NAMESPACE and func not in self.calls:
            self.calls[func] = (args, kwargs)
        return func(*args, **kwargs)


class Differentiated(TorchFunctionMode):
    """The ops of :data:`NAMESPACE` that the route differentiated: the backward pass reached the autograd node of
    one of their outputs (a backward op, called by the autograd engine, and an op whose outputs get no gradient
    are not among them)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if getattr(func, "namespace", None) == NAMESPACE:
            nodes = {id(t.grad_fn): t.grad_fn for t in _tensors(out) if t.grad_fn is not None}
            for node in nodes.values():
                node.register_prehook(lambda grads, op=func: self.ops.add(op))
        return out


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or lists and tuples of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _copied(value: Any, grad: bool) -> Any:
    """``value`` with every tensor copied (inside lists and tuples too), requiring grad where it did and ``grad``."""
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        return copy.requires_grad_(grad and value.requires_grad and copy.is_floating_point())
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(v, grad) for v in value)
    return value


def _name(op: Any) -> str:
    """``semicrf_log_forward`` for ``torch.ops.provable_kernels.semicrf_log_forward.default``."""
    return op.name().split("::", 1)[1].split(".", 1)[0]


def recorded_calls(family: Family, case: Case) -> tuple[dict[Any, tuple[tuple, dict]], set[Any]]:
    """The first call of each custom op of :data:`NAMESPACE` when ``case`` runs (forward and backward), and the
    ops among them that were differentiated (:class:`Differentiated`)."""
    with Differentiated() as differentiated, Recorder() as recorder:
        run_route(family.run, fresh_case(case))
    return recorder.calls, differentiated.ops


def verdict(family: Family, case: Case) -> Verdict:
    """The ``opcheck`` check on ``case`` (module docstring)."""
    calls, differentiated = recorded_calls(family, case)
    if not calls:
        problems = ("this Triton route calls no custom op: torch.compile would trace into its kernel launch",) \
            if is_triton_route(case.route_id) else ()
        return Verdict(problems, "no custom op called: nothing to check")
    problems = []
    for op, (args, kwargs) in calls.items():
        grad = op in differentiated
        outcome = torch.library.opcheck(op, _copied(args, grad), _copied(kwargs, grad), test_utils=TESTS,
                                        raise_exception=False)
        problems += [f"{_name(op)}: {test}: {' '.join(str(result).split())[:400]}"
                     for test, result in outcome.items() if result != "SUCCESS"]
    names = ", ".join(sorted(_name(op) for op in calls))
    return Verdict(tuple(problems), f"{len(calls)} custom ops ({names}) pass torch.library.opcheck "
                                    f"({', '.join(TESTS)}) at the route's first call of each")
