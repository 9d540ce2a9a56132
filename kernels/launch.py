"""Launching a ``@triton.jit`` kernel again without Triton's per-call argument binding.

``kernel[grid](*args, **meta)`` binds every argument, computes its specialization (dtype and 16-byte alignment of
each pointer, range, ``== 1`` and divisibility by 16 of each integer) and looks the compiled kernel up: tens of
microseconds of host time per launch for a kernel with some thirty arguments, more than a short semi-CRF kernel
runs. :class:`Launcher` keys a cache on a superset of those
properties, computed directly (constexprs and launch options interned once: :func:`options`), and launches the
compiled kernel Triton returned for that key through its own launcher (``CompiledKernel.run`` with every
parameter, the arguments its ``CompiledKernel[grid]`` runner passes; the runner itself when a profiler set launch
hooks): the same binary, the same arguments, so bitwise the same results. The first call of a key, and every call
under the Triton interpreter, goes through ``kernel[grid]`` itself.
"""
from __future__ import annotations

import inspect
import math
import struct
from typing import Any

import numpy
import torch
import triton
from triton import knobs

from provable_kernels.dispatch import interpreter_enabled

FLOAT32_TINY, FLOAT32_MAX = 2.0 ** -126, (2.0 - 2.0 ** -23) * 2.0 ** 127


def float_halves(value: float) -> tuple[float, float]:
    """``value`` as two float32 numbers ``(hi, lo)`` whose float64 sum is ``value`` to about 48 bits (``lo = 0``
    for 0 and infinities): a kernel's float argument is float32, and a per-call scalar tensor would cost an
    allocation and a launch. The kernel side is :func:`provable_kernels.triton_math.float_scalar`. A finite
    nonzero ``value`` must lie in float32's normal range (callers validate their arguments against it)."""
    if value == 0.0 or not math.isfinite(value):
        return value, 0.0
    if not FLOAT32_TINY <= abs(value) <= FLOAT32_MAX:  # verify: unreached (callers validate the range)
        raise ValueError(f"{value!r} lies outside float32's normal range")
    hi = struct.unpack("f", struct.pack("f", value))[0]
    return hi, struct.unpack("f", struct.pack("f", value - hi))[0]


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


def _key(args: tuple, options: "Options") -> tuple:  # verify: unreached (compiled kernels only: CUDA; tests)
    """The cache key of a launch: the current CUDA device (Triton compiles and launches for it), :func:`_spec` of
    each runtime argument (tensors inline: host time per launch) and the interned :class:`Options` (its constexprs
    and launch options by exact value)."""
    specs = tuple([(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else _spec(a) for a in args])
    return torch.cuda.current_device(), specs, options


LATE_INTERPRETER = (
    "TRITON_INTERPRET=1 was set after the Triton kernels of provable_kernels were imported, so they were built for a "
    "GPU driver: set it before the first import of provable_kernels (e.g. in the shell environment), or pass "
    "use_triton=False for the PyTorch backend on the CPU")


class Options:
    """A kernel's constexpr arguments and launch options (``num_warps``, ...), interned: :func:`options` returns
    one object per distinct set of values, so a launch keys them by identity instead of hashing them again."""

    __slots__ = ("meta",)

    def __init__(self, meta: dict):
        self.meta = meta


_OPTIONS: dict[tuple, Options] = {}


def options(**meta: Any) -> Options:
    """The interned :class:`Options` of ``meta`` (callers on a hot path keep it: one lookup per call signature)."""
    key = tuple(sorted(meta.items()))
    found = _OPTIONS.get(key)
    if found is None:
        found = _OPTIONS[key] = Options(dict(meta))
    return found


class Launcher:
    """``Launcher(kernel)[grid](*args, **meta)`` launches ``kernel`` as ``kernel[grid](*args, **meta)`` does, and
    ``Launcher(kernel).launch(grid, args, opts)`` the same with ``opts = options(**meta)`` made beforehand:
    ``args`` its leading (runtime) parameters in order, keyed by :func:`_spec`; ``meta`` the remaining (constexpr)
    ones by name and the launch options (``num_warps``, ``num_stages``), keyed by their exact values."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.compiled = isinstance(kernel, triton.runtime.JITFunction)  # not under the interpreter
        self.names = list(inspect.signature(kernel.fn).parameters) if self.compiled else []
        self.cache: dict = {}

    def __getitem__(self, grid: tuple) -> Any:
        return lambda *args, **meta: self.launch(grid, args, options(**meta))

    def bind(self, grid: tuple, tail: tuple, opts: Options) -> "Bound":
        """A :class:`Bound` launch on ``grid`` with the trailing runtime arguments ``tail`` and ``opts`` fixed."""
        return Bound(self, grid, tail, opts)

    def launch(self, grid: tuple, args: tuple, opts: Options) -> None:
        """Launch on ``grid`` with the runtime arguments ``args`` and the constexprs and options ``opts``."""
        if not self.compiled:  # the Triton interpreter: kernel[grid] itself, its NumPy warnings kept from the caller
            with numpy.errstate(all="ignore"):  # (masked-off lanes divide by zero or take log(0) harmlessly)
                self.kernel[grid](*args, **opts.meta)
            return
        try:  # verify: unreached (compiled kernels only: CUDA; the GPU records, tests/test_launch.py)
            self._launch_compiled(grid, args, opts)
        except Exception:
            if interpreter_enabled():  # the kernels were built for a GPU driver before TRITON_INTERPRET was set
                raise RuntimeError(LATE_INTERPRETER) from None
            raise

    # verify: unreached (compiled kernels only: CUDA; the GPU records, tests/test_launch.py)
    def _launch_compiled(self, grid: tuple, args: tuple, opts: Options) -> None:
        key = _key(args, opts)
        found = self.cache.get(key)
        if found is None:
            compiled = self.kernel[grid](*args, **opts.meta)
            compiled._init_handles()  # loads the binary: what CompiledKernel[grid] does before every launch
            self.cache[key] = compiled, tuple(opts.meta[name] for name in self.names[len(args):])
            return
        compiled, constexprs = found
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if not (_active(knobs.runtime.launch_enter_hook) or _active(knobs.runtime.launch_exit_hook)):
            # CompiledKernel[grid]'s runner without its per-launch lookups (the stream as Triton's CUDA driver gets it)
            stream = torch._C._cuda_getCurrentRawStream(key[0])
            compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None,
                         None, *args, *constexprs)
        else:  # a profiler's launch hooks: the runner calls them
            compiled[grid](*args, *constexprs)


class Bound:
    """``bound(*tensors)`` launches as ``launcher.launch(grid, (*tensors, *tail), opts)`` does, for a call path that
    launches the same kernel with the same grid, sizes and options again and again (a public call with a signature
    seen before: :mod:`provable_kernels.runtime`). ``tensors`` are the leading runtime arguments, tensors or ints that
    change per call (which the kernel must not specialise on: ``do_not_specialize``, values below 2**31). A compiled
    kernel is looked up by what still varies, the current device and each tensor's 16-byte alignment, and launched
    directly; the first launch of such a key, launches
    under profiler hooks and the interpreter go through :meth:`Launcher.launch` (where ``sentinel verify`` looks)."""

    __slots__ = ("launcher", "grid", "grid3", "tail", "opts", "kernels")

    def __init__(self, launcher: Launcher, grid: tuple, tail: tuple, opts: Options):
        self.launcher, self.grid, self.tail, self.opts = launcher, grid, tail, opts
        self.grid3 = tuple(grid) + (1,) * (3 - len(grid))
        self.kernels: dict = {}

    def __call__(self, *tensors: Any) -> None:
        if not self.launcher.compiled:
            return self.launcher.launch(self.grid, (*tensors, *self.tail), self.opts)
        return self._launch_compiled(tensors)

    # verify: unreached (compiled kernels only: CUDA; the GPU records, tests/test_launch.py)
    def _launch_compiled(self, tensors: tuple) -> None:
        if not self.kernels:  # the first launch (CUDA initialised, or the launcher's error when it cannot be)
            return self._first(tensors)
        device = torch._C._cuda_getDevice()  # what torch.cuda.current_device() returns once CUDA is initialised
        pointers, aligned = _pointers(tensors)
        found = self.kernels.get((device, aligned))
        if found is None or _active(knobs.runtime.launch_enter_hook) or _active(knobs.runtime.launch_exit_hook):
            return self._first(tensors)
        compiled, constexprs = found
        compiled.run(*self.grid3, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *pointers, *self.tail, *constexprs)
        return None

    # verify: unreached (compiled kernels only: CUDA; the GPU records, tests/test_launch.py)
    def _first(self, tensors: tuple) -> None:
        """Launch through :meth:`Launcher.launch` (compiling, or under a profiler's hooks) and keep the compiled
        kernel for the current device and the tensors' alignments."""
        args = (*tensors, *self.tail)
        self.launcher.launch(self.grid, args, self.opts)
        key = torch.cuda.current_device(), _pointers(tensors)[1]
        self.kernels[key] = self.launcher.cache[_key(args, self.opts)]


def _pointers(tensors: tuple) -> tuple[list, tuple]:  # verify: unreached (compiled kernels only: CUDA; tests)
    """The arguments of a :class:`Bound` launch with each tensor replaced by its data pointer (Triton's launcher
    takes an int as the address itself, without calling ``data_ptr`` and asking the driver about it again: the call's
    validation put every tensor on the launch's device), and whether each is 16-byte aligned (True for None and
    ints)."""
    pointers, aligned = [], []
    for t in tensors:
        if t is None or type(t) is int:
            pointers.append(t)
            aligned.append(True)
        else:
            pointer = t.data_ptr()
            pointers.append(pointer)
            aligned.append(pointer % 16 == 0)
    return pointers, tuple(aligned)


def _active(hook: Any) -> bool:
    """Whether a launch hook of Triton's is set: None (Triton <= 3.4) or an empty ``HookChain`` (newer) is not."""
    return hook is not None and bool(getattr(hook, "calls", True))


_LAUNCHERS: dict[Any, Launcher] = {}


def launcher(kernel: Any) -> Launcher:
    """The :class:`Launcher` of ``kernel`` (one per kernel object, made at its first launch)."""
    found = _LAUNCHERS.get(kernel)
    if found is None:
        found = _LAUNCHERS[kernel] = Launcher(kernel)
    return found
