"""Dispatch as data.

A family declares its dispatch as a :class:`Tree`: internal nodes are :class:`Branch` objects that ask a
named :class:`Condition` about the call, leaves are :class:`Route` objects with a stable id and the function
they run. The dispatcher evaluates this same tree (:meth:`Tree.dispatch`), so the tree that sentinel walks and
that the traces draw *is* the dispatch. Every dispatch appends the route id to each active :func:`recording`.

    with recording() as taken:
        semi_crf_streaming_forward(...)
    assert taken == ["semicrf.torch.log.train"]
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Union


@dataclass(frozen=True)
class Condition:
    """A named question about a call. ``ask(call)`` returns one of ``outcomes``; its docstring is the trace text."""

    name: str
    ask: Callable[[Any], str]
    outcomes: tuple[str, ...]

    @property
    def doc(self) -> str:  # verify: unreached (the trace text: sentinel trace, tests/test_dispatch_tree.py)
        return (self.ask.__doc__ or "").strip()


@dataclass(frozen=True)
class Route:
    """A leaf of the tree: a stable id (``family.backend.variant``) and the function that runs the call.
    ``prepare(call, args)``, when given, returns the *direct runner* of every call with the signature of ``call``
    and the entry point's arguments ``args`` it was made from, or None to decline: a function of the entry point's
    own arguments that returns what ``fn`` and the entry point's ``finish`` return, bitwise, with its plan, launch
    options and kernels made once (:class:`provable_kernels.runtime.Entry`)."""

    id: str
    fn: Callable[[Any], Any]
    prepare: Optional[Callable[[Any, tuple], Optional[Callable[..., Any]]]] = None

    @property
    def doc(self) -> str:  # verify: unreached (the trace text: sentinel trace, tests/test_dispatch_tree.py)
        return (self.fn.__doc__ or "").strip()


@dataclass(frozen=True)
class Branch:
    """An internal node: ask ``condition``, continue in ``children[outcome]``."""

    condition: Condition
    children: Mapping[str, "Node"]


Node = Union[Branch, Route]
Path = tuple[tuple[Condition, str], ...]


class DispatchError(RuntimeError):
    """A condition answered an outcome the tree has no child for (a bug in the tree, never in user input)."""


class Tree:
    """A family's decision tree. ``name`` is the public entry point it dispatches."""

    def __init__(self, name: str, root: Node):
        self.name = name
        self.root = root
        seen: set[str] = set()
        for route, path in self.paths():
            if route.id in seen:  # verify: unreached (a malformed tree, refused at import; tests)
                raise ValueError(f"route id {route.id!r} appears twice in tree {name!r}")
            seen.add(route.id)
        for branch in self.branches():
            missing = set(branch.condition.outcomes) ^ set(branch.children)
            if missing:  # verify: unreached (a malformed tree, refused at import; tests)
                raise ValueError(
                    f"tree {name!r}: branch on {branch.condition.name!r} must have exactly one child per outcome "
                    f"{branch.condition.outcomes}; mismatch {sorted(missing)}"
                )

    def paths(self) -> list[tuple[Route, Path]]:
        """Every leaf with the (condition, outcome) pairs that lead to it, in declaration order."""
        out: list[tuple[Route, Path]] = []

        def walk(node: Node, path: Path) -> None:
            if isinstance(node, Route):
                out.append((node, path))
            else:
                for outcome, child in node.children.items():
                    walk(child, path + ((node.condition, outcome),))

        walk(self.root, ())
        return out

    def routes(self) -> list[Route]:
        return [route for route, _ in self.paths()]

    def branches(self) -> list[Branch]:
        out: list[Branch] = []

        def walk(node: Node) -> None:
            if isinstance(node, Branch):
                out.append(node)
                for child in node.children.values():
                    walk(child)

        walk(self.root)
        return out

    def conditions(self) -> list[Condition]:  # verify: unreached (sentinel trace and routes; tests)
        """Distinct conditions in first-use order."""
        seen: dict[str, Condition] = {}
        for branch in self.branches():
            seen.setdefault(branch.condition.name, branch.condition)
        return list(seen.values())

    def path_to(self, route_id: str) -> dict[str, str]:
        """``{condition name: outcome}`` on the way to ``route_id``."""
        for route, path in self.paths():
            if route.id == route_id:
                return {cond.name: outcome for cond, outcome in path}
        # verify: unreached (a route id not in the tree: tests)
        raise KeyError(f"no route {route_id!r} in tree {self.name!r}")

    def select(self, call: Any) -> Route:
        """Evaluate the tree on ``call`` and return the leaf it reaches."""
        node = self.root
        while isinstance(node, Branch):
            outcome = node.condition.ask(call)
            if outcome not in node.children:  # verify: unreached (a condition outside its outcomes; tests)
                raise DispatchError(
                    f"{self.name}: condition {node.condition.name!r} answered {outcome!r}, "
                    f"expected one of {sorted(node.children)}"
                )
            node = node.children[outcome]
        return node

    def dispatch(self, call: Any) -> Any:
        """Select the route for ``call``, record its id, run it."""
        route = self.select(call)
        return self.run(route, route.fn, call)

    def run(self, route: Route, runner: Callable[[Any], Any], call: Any) -> Any:
        """Record ``route``'s id in every active :func:`recording`, then return ``runner(call)``."""
        # torch.compile cannot trace a ContextVar; recordings observe eager calls
        if _compiling():  # verify: unreached (torch.compile: tests/test_semicrf_training.py, GPU script)
            return runner(call)
        recordings = _RECORDINGS.get()
        if not recordings:  # nothing to record (host time per call)
            return runner(call)
        depth = _DEPTH.get()
        for taken, opened, nested in recordings:
            if nested or depth == opened:
                taken.append(route.id)
        token = _DEPTH.set(depth + 1)
        try:
            return runner(call)
        finally:
            _DEPTH.reset(token)


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


_RECORDINGS: contextvars.ContextVar[tuple[tuple[list[str], int, bool], ...]] = contextvars.ContextVar(
    "_RECORDINGS", default=())
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("_DEPTH", default=0)  # routes running now


def recordings_active() -> bool:
    """True inside a :func:`recording` block (a direct runner then records its route: host time otherwise)."""
    return bool(_RECORDINGS.get())


@contextlib.contextmanager
def recording(nested: bool = True) -> Iterator[list[str]]:
    """Collect the ids of every route dispatched inside the block, in order (recordings nest). A route may call
    another entry point (the head's routes call the streaming API): ``nested=False`` keeps only the routes
    dispatched directly in the block, not those dispatched by a route while it runs."""
    taken: list[str] = []
    token = _RECORDINGS.set(_RECORDINGS.get() + ((taken, _DEPTH.get(), nested),))
    try:
        yield taken
    finally:
        _RECORDINGS.reset(token)


def interpreter_enabled() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_usable(device: Any) -> bool:
    """Triton can run on ``device``: a CUDA device, or a CPU device under the Triton interpreter."""
    import torch

    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    if kind == "cuda":  # verify: unreached (CUDA: the GPU records)
        return True
    return kind == "cpu" and interpreter_enabled()
