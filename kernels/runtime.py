"""The host path of every public call: validation and route selection once per call signature.

A family's public entry point is an :class:`Entry` over the family's dispatch :class:`~provable_kernels.dispatch.Tree`
and two functions:

- ``check(*args) -> meta``: every metadata check (types, ranks, shapes, dtypes, devices, settings), naming the
  argument on error; values are not read. ``meta`` is what the checks decided (e.g. the compute dtype).
- ``make_call(meta, *args) -> call``: the call object every route receives, with the per-call value checks of the
  family's host-sync policy (:func:`provable_kernels.validate.host_reads_allowed`; on CUDA they live inside the
  kernels and cost nothing here).

The first call of a *signature* (:func:`signature`: each tensor argument's dtype, device, shape, strides and
``requires_grad``, each other argument's type and value, the grad mode and, with CPU tensors, whether Triton's
interpreter is on; ``check`` reads no tensor's values, except 0-d tensors standing for numbers, which the cache
does not cover) runs ``check``, builds the call, selects the route (its conditions decide on metadata only) and lets the route
prepare a runner for that signature (:attr:`Route.prepare <provable_kernels.dispatch.Route>`: the plan, launch
options and compiled kernel looked up once). A repeat call is a dictionary lookup, ``make_call`` and the runner.
Calls the cache does not cover (under ``torch.compile``, export, ``torch.func`` transforms, fake or meta tensors,
tensor subclasses, arguments of other types) take the full path every time: the same checks, the same tree.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from provable_kernels.dispatch import Route, Tree, interpreter_enabled

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_PLAIN_VALUES = (int, float, str, bool, type(None))
CACHE_SIZE = 256  # signatures kept per entry point (cleared when full: a loop of ever-new shapes stays bounded)


def signature(args: tuple) -> Optional[tuple]:
    """The cache key of a call with ``args`` (see the module docstring), or None when the cache does not cover it."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active() \
            or _get_current_dispatch_mode() is not None:
        return None
    key: list = [torch.is_grad_enabled()]
    on_cpu = False
    for a in args:
        kind = type(a)
        if kind in _PLAIN_TENSORS:
            if a.is_meta or not a.dim():  # a 0-d tensor may stand for a number (iters=torch.tensor(5)): its value
                return None                # would have to be in the key
            key.append((a.dtype, a.device, a.shape, a.stride(), a.requires_grad))
            on_cpu = on_cpu or not a.is_cuda
        elif kind in _PLAIN_VALUES:
            key.append((kind, a))
        else:
            return None
    if on_cpu:  # the interpreter decides the backend of CPU tensors (reading the environment costs host time)
        key.append(interpreter_enabled())
    return tuple(key)


class Entry:
    """A public entry point: ``Entry(tree, check, make_call, finish)(*args)`` runs the call (module docstring) and
    returns ``finish(call, result)`` (the route's result itself when ``finish`` is None)."""

    def __init__(self, tree: Tree, check: Callable[..., Any], make_call: Callable[..., Any],
                 finish: Optional[Callable[[Any, Any], Any]] = None):
        self.tree, self.check, self.make_call, self.finish = tree, check, make_call, finish
        self.cache: dict[tuple, tuple[Any, Route, Callable[[Any], Any]]] = {}

    def __call__(self, *args: Any) -> Any:
        key = signature(args)
        found = self.cache.get(key) if key is not None else None
        if found is None:
            meta = self.check(*args)
            call = self.make_call(meta, *args)
            route = self.tree.select(call)
            runner = route.fn
            if key is not None:
                if len(self.cache) >= CACHE_SIZE:  # verify: unreached (more signatures than that in one process)
                    self.cache.clear()
                runner = route.prepare(call) if route.prepare else route.fn
                self.cache[key] = meta, route, runner
        else:
            meta, route, runner = found
            call = self.make_call(meta, *args)
        out = self.tree.run(route, runner, call)
        return out if self.finish is None else self.finish(call, out)
