"""Launching a ``@triton.jit`` kernel again without Triton's per-call argument binding.

``kernel[grid](*args, **meta)`` binds every argument, computes its specialization (dtype and 16-byte alignment of
each pointer, range, ``== 1`` and divisibility by 16 of each integer) and looks the compiled kernel up: 20-50 us
of host time per launch on the lent H100 hosts for a kernel with some thirty arguments, more than a short
semi-CRF kernel runs (``benchmarks/NOTES-semicrf.md``). :class:`Launcher` keys a cache on a superset of those
properties, computed directly, and launches the compiled kernel Triton returned for that key through its own
launcher (``CompiledKernel[grid](*every parameter)``, as the code ``torch.compile`` generates does): the same
binary, the same arguments, so bitwise the same results. The first call of a key, and every call under the
Triton interpreter, goes through ``kernel[grid]`` itself.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
import triton

def _spec(arg: Any) -> Any:  # verify: unreached (compiled kernels only: CUDA; tests/test_launch.py)
    """What Triton may specialize ``arg`` on (a superset): a tensor's dtype and 16-byte alignment; an int's width
    (32-bit signed, 64-bit signed, 64-bit unsigned), ``== 1`` and divisibility by 16; a float's type; other values
    themselves (None, bools, dtypes). The device is keyed once per launch (:func:`_key`)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if type(arg) is int:
        width = 0 if -2**31 <= arg < 2**31 else 1 if -2**63 <= arg < 2**63 else 2
        return int, width, arg == 1, arg % 16 == 0
    if type(arg) is float:
        return float
    return type(arg), arg


def _key(args: tuple, meta: dict) -> tuple:  # verify: unreached (compiled kernels only: CUDA; tests/test_launch.py)
    """The cache key of a launch: the current CUDA device (Triton compiles and launches for it), :func:`_spec` of
    each runtime argument (tensors inline: host time per launch), the constexprs and options by exact value."""
    specs = tuple([(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else _spec(a) for a in args])
    return torch.cuda.current_device(), specs, tuple(meta.items())


class Launcher:
    """``Launcher(kernel)[grid](*args, **meta)`` launches ``kernel`` as ``kernel[grid](*args, **meta)`` does:
    ``args`` its leading (runtime) parameters in order, keyed by :func:`_spec`; ``meta`` the remaining (constexpr)
    ones by name and the launch options (``num_warps``, ``num_stages``), keyed by their exact values."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.compiled = isinstance(kernel, triton.runtime.JITFunction)  # not under the interpreter
        self.names = list(inspect.signature(kernel.fn).parameters) if self.compiled else []
        self.cache: dict = {}

    def __getitem__(self, grid: tuple) -> Any:
        return lambda *args, **meta: self._launch(grid, args, meta)

    def _launch(self, grid: tuple, args: tuple, meta: dict) -> None:
        if not self.compiled:  # the Triton interpreter: kernel[grid] itself
            self.kernel[grid](*args, **meta)
            return
        # verify: unreached (compiled kernels only: CUDA; the GPU records, tests/test_launch.py)
        self._launch_compiled(grid, args, meta)

    # verify: unreached (compiled kernels only: CUDA; the GPU records, tests/test_launch.py)
    def _launch_compiled(self, grid: tuple, args: tuple, meta: dict) -> None:
        key = _key(args, meta)
        compiled = self.cache.get(key)
        if compiled is None:
            self.cache[key] = self.kernel[grid](*args, **meta)
            return
        grid = tuple(grid) + (1,) * (3 - len(grid))
        compiled[grid](*args, *(meta[name] for name in self.names[len(args):]))


_LAUNCHERS: dict[Any, Launcher] = {}


def launcher(kernel: Any) -> Launcher:
    """The :class:`Launcher` of ``kernel`` (one per kernel object, made at its first launch)."""
    found = _LAUNCHERS.get(kernel)
    if found is None:
        found = _LAUNCHERS[kernel] = Launcher(kernel)
    return found
