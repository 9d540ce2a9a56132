"""The host path of every public call: validation and route selection once per call signature, then a direct runner.

A family's public entry point is an :class:`Entry` over the family's dispatch :class:`~provable_kernels.dispatch.Tree`
and two functions:

- ``check(*args) -> meta``: every metadata check (types, ranks, shapes, dtypes, devices, settings), naming the
  argument on error; values are not read. ``meta`` is what the checks decided (e.g. the compute dtype).
- ``make_call(meta, *args) -> call``: the call object every route receives, with the per-call value checks of the
  family's host-sync policy (:func:`provable_kernels.validate.host_reads_allowed`: a named error in host mode; in
  device mode, the CUDA default, the kernels check the values they read and ``make_call`` reads nothing).

The first call of a *signature* (:func:`signature`: each tensor argument's dtype, device, shape, strides and
``requires_grad``, each other argument's type and value, the grad mode, the value-check mode and, with CPU tensors,
whether Triton's interpreter is on; ``check`` reads no tensor's values, except 0-d tensors standing for numbers,
which the cache does not cover) runs ``check``, builds the call, selects the route (its conditions decide on
metadata only), runs the route's body and lets the route prepare a *direct runner* for that signature
(:attr:`Route.prepare <provable_kernels.dispatch.Route>`, given the call and the arguments): a function of the
entry point's own arguments that
computes what the route's body and ``finish`` compute, bitwise, with its plan, launch options, compiled kernels and
autograd function made once. A repeat call is then :func:`signature`, a dictionary lookup and the runner: no call
object, no tree walk. Where values are checked on the host (CPU tensors, or ``value_checks("sync")``),
``make_call`` still runs first on every call, for its named errors. A route without ``prepare``, or whose
``prepare`` declines (returns None), takes ``make_call``, the route's body and ``finish`` on every call.
Calls the cache does not cover (under ``torch.compile``, export, ``torch.func`` transforms, fake or meta tensors,
tensor subclasses, arguments of other types) take the full path every time: the same checks, the same tree.

Every call runs with its tensors' CUDA device current (``cuda:1`` in a multi-GPU job, whatever the current device
is): Triton launches on the current device, and so do the allocations and streams of the launch path. Autograd's
backward runs on the gradients' device, and a compiled graph on its own.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from provable_kernels import validate
from provable_kernels.dispatch import Route, Tree, interpreter_enabled, recordings_active

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_PLAIN_VALUES = (int, float, str, bool, type(None))
CACHE_SIZE = 256  # signatures kept per entry point (cleared when full: a loop of ever-new shapes stays bounded)


def signature(args: tuple) -> Optional[tuple]:
    """The cache key of a call with ``args`` (see the module docstring), or None when the cache does not cover it."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active() \
            or _get_current_dispatch_mode() is not None:
        return None
    mode = validate.current_mode()
    key: list = [torch.is_grad_enabled(), mode]
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
    elif mode == "sync":  # strict mode reads values on the host, except while a CUDA graph is captured
        key.append(torch.cuda.is_current_stream_capturing())
    return tuple(key)


def _gpu(args: tuple) -> Optional[int]:
    """The index of the CUDA device of the first CUDA tensor argument (None: no CUDA tensor, or while compiling:
    the compiled graph runs on its own device). Validation rejects arguments on several devices."""
    if torch.compiler.is_compiling():
        return None
    return next((a.get_device() for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)


class Entry:
    """A public entry point: ``Entry(tree, check, make_call, finish)(*args)`` runs the call (module docstring) and
    returns ``finish(call, result)`` (the route's result itself when ``finish`` is None)."""

    def __init__(self, tree: Tree, check: Callable[..., Any], make_call: Callable[..., Any],
                 finish: Optional[Callable[[Any, Any], Any]] = None):
        self.tree, self.check, self.make_call, self.finish = tree, check, make_call, finish
        self.cache: dict[tuple, tuple[Any, Route, Optional[Callable[..., Any]], bool, Optional[int]]] = {}

    def __call__(self, *args: Any) -> Any:
        key = signature(args)
        found = self.cache.get(key) if key is not None else None
        gpu = _gpu(args) if found is None else found[4]
        if gpu is not None and gpu != torch._C._cuda_getDevice():  # launch where the tensors are (cuda:1 ...)
            with torch.cuda.device(gpu):
                return self._call(key, found, args)
        return self._call(key, found, args)

    def uncached(self, *args: Any) -> Any:
        """The full path, never cached: for a call whose signature depends on a value read from a tensor (the
        segment ids form without ``num_segments``) or on an argument the checks will reject."""
        gpu = _gpu(args)
        if gpu is not None and gpu != torch._C._cuda_getDevice():
            with torch.cuda.device(gpu):
                return self._first_call(None, args)
        return self._first_call(None, args)

    def _call(self, key: Optional[tuple], found: Optional[tuple], args: tuple) -> Any:
        if found is None:
            return self._first_call(key, args)
        meta, route, direct, host_checks, _ = found
        if direct is None:
            call = self.make_call(meta, *args)
            return self._finish(call, self.tree.run(route, route.fn, call))
        if host_checks:  # the named errors of the value checks, on every call
            self.make_call(meta, *args)
        if recordings_active():
            return self.tree.run(route, lambda _: direct(*args), None)
        return direct(*args)

    def _first_call(self, key: Optional[tuple], args: tuple) -> Any:
        """The full path: every check, the tree, the route's body; then, for a key, the cache entry."""
        meta = self.check(*args)
        call = self.make_call(meta, *args)
        route = self.tree.select(call)
        out = self._finish(call, self.tree.run(route, route.fn, call))
        if key is not None:
            if len(self.cache) >= CACHE_SIZE:  # verify: unreached (more signatures than that in one process)
                self.cache.clear()
            mode = key[1]
            on_cpu = any(type(a) in _PLAIN_TENSORS and not a.is_cuda for a in args)
            direct = route.prepare(call, args) if route.prepare else None
            self.cache[key] = meta, route, direct, mode == "sync" or (mode == "auto" and on_cpu), _gpu(args)
        return out

    def _finish(self, call: Any, out: Any) -> Any:
        return out if self.finish is None else self.finish(call, out)
