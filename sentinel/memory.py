"""Every memory access of the Triton kernels under the Triton interpreter, checked before it is made, and the
``memory`` check: out-of-bounds loads and stores caught on the CPU, with no family code.

**The guard** (:func:`install`, on in every check of ``sentinel verify``): every interpreted launch (each call of
the interpreter's ``GridExecutor``, however the kernel was launched) is a :class:`Launch`, holding the spans of its
tensor arguments (tensors, tensors inside tuples, the bases of tensor descriptors), its own outputs and workspaces
included. Every load, store and atomic the interpreter makes (its calls of ``load``, ``store``, ``atomic_rmw`` and
``atomic_cas`` of Triton's C++ interpreter module, where ``tl.load``/``tl.store``, block pointers and tensor
descriptors all end, on Triton 3.6 to 3.8) is checked before it runs: each lane whose mask is on must access,
whole, memory inside one tensor argument of the launch (its first to its last element). A lane outside is masked
off, so nothing is read or written there, and the launch then raises :class:`OutOfBounds` naming the kernel, the
program id, the access, the argument it is nearest to and how far past it: the check that ran it fails, pointing at
this one. Inside :func:`recording` every checked access is also kept (:class:`Access`, in execution order) for
:mod:`kernel_sentinel.races`, which may also run the programs in another order.

**The check** runs the route's cases (``tiny`` and ``small``, forward and backward: :attr:`Family.run`) inside
:func:`watching`, each twice: with value checks in host mode (the CPU default) and in device mode (the CUDA default:
the kernels check the values they read, a code path of their own). It then runs the route's bad inputs in device
mode, where the kernels read bad indices and lengths themselves: whatever those hold, every access must stay inside
the arguments (an error is allowed). Inside :func:`watching` an access outside is reported instead of raised, and
every launch runs on **redzoned** copies of its tensor arguments, each storage copied into an allocation of its own
with a guard region before and after it (each as long as the storage, at least :data:`MIN_GUARD` bytes) holding
canaries (NaN for floats, :data:`provable_kernels.alloc.POISON_INT` for integers, ``True`` for bools); after the
launch the copies are written back and every guard must still hold its canaries.

The cases run with allocations poisoned (:func:`provable_kernels.alloc.poisoned`): every workspace is then a fresh
allocation of exactly the size the call asks for, where a workspace kept from an earlier, larger call would hide an
overrun inside its larger span. Two programs writing one element (a write race) are the ``races`` check's.

It fails loudly rather than pass silently when the interpreter's internals change: when the interpreter module
lacks those functions, when a launch makes no checked access at all (its memory accesses went another way), when
an access happens outside a launch, and when a guard changed (a store that escaped the address check).

What it cannot see: accesses of masked-off lanes (the GPU does not make them either); an address inside another
tensor argument (the guards make that need an access more than a storage's length away from its own argument);
an address inside an argument's span but between the elements of a strided view (the ``layouts`` check poisons
those gaps); accesses made by PyTorch operations (bounds-checked by PyTorch). On CUDA the kernels run compiled,
not under the interpreter: ``sentinel verify --sanitize`` runs compute-sanitizer's memcheck on them instead
(:mod:`kernel_sentinel.sanitize`), and this check says so without running.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import numpy
import torch

from provable_kernels import alloc
from provable_kernels.validate import value_checks
from kernel_sentinel.checks import run_route
from kernel_sentinel.family import Case, Family
from kernel_sentinel.generic import Verdict, fresh_case
from kernel_sentinel.sanitize import is_triton_route

MODES = ("sync", "device")  # value checks on the host (the CPU default), then the kernels' own (the CUDA default)
MIN_GUARD = 256  # bytes of each guard region at least (a multiple of every element size)
SHOWN = 6  # findings listed in a check's detail
ACCESSES = ("load", "store", "atomic_rmw", "atomic_cas")  # the interpreter module's memory functions


class Unavailable(RuntimeError):
    """The Triton interpreter does not have the functions the address check wraps."""


class OutOfBounds(RuntimeError):
    """A launch accessed memory outside its tensor arguments (those lanes were masked off: nothing was read or
    written there)."""


@dataclass(frozen=True)
class Span:
    """Bytes ``start:end`` of tensor argument ``name`` (its first to its last element) in a launch."""

    start: int
    end: int
    name: str
    what: str  # shape and dtype


@dataclass(frozen=True)
class Access:
    """One load, store or atomic of one program: its kind (:data:`ACCESSES`), the byte addresses of its lanes that
    were made (mask on, inside the arguments; uint64), the element size, and an atomic's memory semantic
    (``ACQUIRE``, ``RELEASE``, ``ACQUIRE_RELEASE``, ``RELAXED``; ``""`` for a plain load or store)."""

    program: tuple[int, int, int]
    kind: str
    addresses: numpy.ndarray
    size: int
    semantic: str


class Programs(Protocol):
    """How :func:`recording` runs a launch's programs (:mod:`kernel_sentinel.races`' schedules): ``wrap`` returns
    the function the interpreter calls once per program id (each after setting it), ``after`` is told of each
    access made, with the values it read (loads and atomics, else None) and whether it changed memory."""

    def wrap(self, fn: Callable[..., None], launch: "Launch") -> Callable[..., None]: ...

    def after(self, access: Access, values: Optional[numpy.ndarray], changed: bool) -> None: ...


def _program_index() -> Optional[tuple[int, int, int]]:
    """``(x, y, z)`` of the interpreter's current program, None when it does not say."""
    from triton.runtime import interpreter

    index = getattr(getattr(interpreter, "interpreter_builder", None), "grid_idx", None)
    return None if index is None else tuple(int(i) for i in index)


def _program() -> str:
    """`` program (x, y, z)`` of the interpreter's current program, when it says."""
    index = _program_index()
    return f" program {index}" if index is not None else ""


class Launch:
    """One interpreted launch: its kernel, the spans of its tensor arguments, how many accesses were checked, the
    problems found (lanes outside every argument) and, when recorded, every access made (in execution order)."""

    def __init__(self, kernel: str, spans: Sequence[Span], record: bool, empty: Sequence[str] = ()):
        self.kernel, self.spans, self.empty = kernel, list(spans), list(empty)  # empty: tensor arguments (named)
        self.accesses = 0
        self.problems: list[str] = []
        self.trace: Optional[list[Access]] = [] if record else None
        merged: list[list[int]] = []  # overlapping spans (views of one storage) joined
        for s in sorted(self.spans, key=lambda s: s.start):
            if merged and s.start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], s.end)
            else:
                merged.append([s.start, s.end])
        self.starts = numpy.array([m[0] for m in merged], dtype=numpy.uint64)
        self.ends = numpy.array([m[1] for m in merged], dtype=numpy.uint64)

    def outside(self, addresses: numpy.ndarray, size: int) -> numpy.ndarray:
        """Which of ``addresses`` (uint64) do not start an access of ``size`` bytes inside one argument."""
        if not len(self.ends):
            return numpy.ones(addresses.shape, dtype=bool)
        if addresses.size:  # the common case first: the lowest and highest inside one (merged) argument
            low, high = addresses.min(), addresses.max()
            index = int(numpy.searchsorted(self.starts, low, side="right")) - 1
            if index >= 0 and high + numpy.uint64(size) <= self.ends[index]:
                return numpy.zeros(addresses.shape, dtype=bool)
        index = numpy.searchsorted(self.starts, addresses, side="right").astype(numpy.int64) - 1
        ends = self.ends[numpy.maximum(index, 0)]
        return ~((index >= 0) & (addresses + numpy.uint64(size) <= ends))

    def span_of(self, address: int) -> Span:
        """The argument holding byte ``address`` (one the launch accessed)."""
        return next(s for s in self.spans if s.start <= address < s.end)

    def nearest(self, address: int, size: int) -> str:
        """Where ``address`` lies relative to the nearest argument, in bytes and elements of ``size`` bytes."""
        if not self.spans:
            return "the launch has no tensor argument"

        def distance(s: Span) -> int:
            return s.start - address if address < s.start else address + size - s.end

        s = min(self.spans, key=distance)
        if address < s.start:
            gap, where = s.start - address, "before the start"
        else:
            gap, where = address + size - s.end, "past the end"
        return f"{gap} bytes ({gap / size:g} elements) {where} of argument {s.name} ({s.what})"

    def check(self, kind: str, pointers: numpy.ndarray, mask: Optional[numpy.ndarray], size: int,
              semantic: str) -> Optional[numpy.ndarray]:
        """Check one access; return the mask with the lanes outside every argument switched off (``mask`` itself
        when none is)."""
        self.accesses += 1
        if mask is None or mask.all():
            on, made = None, pointers.reshape(-1).astype(numpy.uint64, copy=False)
        else:
            on = numpy.broadcast_to(mask, pointers.shape)
            made = pointers[on].astype(numpy.uint64, copy=False)
        bad = self.outside(made, size)
        program = _program_index()
        if bad.any():
            first = int(made[bad][0])
            empty = f" (empty: {', '.join(self.empty)})" if self.empty else ""
            self.problems.append(f"{self.kernel} program {program}: {kind} of {size} bytes, {int(bad.sum())} lanes "
                                 f"outside every tensor argument{empty}; first {self.nearest(first, size)}")
            full = numpy.zeros(pointers.shape, dtype=bool)
            if on is None:
                full.reshape(-1)[:] = ~bad
            else:
                full[on] = ~bad
            mask, made = full, made[~bad]
        if self.trace is not None:
            self.trace.append(Access(program, kind, made, size, semantic))
        return mask


@dataclass
class Watch:
    """What :func:`watching` saw: launches, checked accesses, kernels launched, and the problems found."""

    launches: int = 0
    accesses: int = 0
    kernels: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def add(self, other: "Watch") -> None:
        """Count what ``other`` saw as seen here too."""
        self.launches, self.accesses = self.launches + other.launches, self.accesses + other.accesses
        self.kernels |= other.kernels
        self.problems += other.problems


@dataclass
class _State:
    """The guard's state in this process: the launch running now, the active :func:`watching` and
    :func:`recording`, and the programs' runner of the latter."""

    current: Optional[Launch] = None
    watch: Optional[Watch] = None
    recorded: Optional[list[Launch]] = None
    programs: Optional[Programs] = None
    installed: bool = False


_STATE = _State()


def _semantic(semantic: Any) -> str:
    return str(getattr(semantic, "name", semantic))


class _CheckedInterpreter:
    """Triton's C++ interpreter module with its memory functions checked against the current :class:`Launch`."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @staticmethod
    def _check(kind: str, pointers: numpy.ndarray, mask: Optional[numpy.ndarray], size: int,
               semantic: str = "") -> Optional[numpy.ndarray]:
        launch = _STATE.current
        if launch is None:
            if _STATE.watch is not None:
                _STATE.watch.problems.append(f"a {kind} outside an interpreted launch (a kernel run another way): "
                                             f"its addresses cannot be checked")
            return mask
        return launch.check(kind, pointers, mask, size, semantic)

    @staticmethod
    def _after(values: Optional[numpy.ndarray], changed: bool) -> None:
        launch = _STATE.current
        if _STATE.programs is not None and launch is not None and launch.trace:
            _STATE.programs.after(launch.trace[-1], values, changed)

    def _changed(self, pointers: numpy.ndarray, mask: Optional[numpy.ndarray], old: numpy.ndarray) -> bool:
        """Whether an atomic changed memory (asked only while a runner of :func:`recording` watches)."""
        if _STATE.programs is None:
            return True
        on = numpy.ones(pointers.shape, dtype=bool) if mask is None else mask
        now = self._inner.load(pointers, on, numpy.zeros_like(old), old.dtype)
        return not numpy.array_equal(now[on], old[on])

    # the C++ module's signatures: pointers (uint64 addresses), mask (bool), values as NumPy arrays
    def load(self, pointers: numpy.ndarray, mask: numpy.ndarray, other: numpy.ndarray, dtype: Any) -> Any:
        mask = self._check("load", pointers, mask, numpy.dtype(dtype).itemsize)
        values = self._inner.load(pointers, mask, other, dtype)
        self._after(values, False)
        return values

    def store(self, pointers: numpy.ndarray, value: numpy.ndarray, mask: numpy.ndarray) -> Any:
        mask = self._check("store", pointers, mask, numpy.asarray(value).dtype.itemsize)
        done = self._inner.store(pointers, value, mask)
        self._after(None, True)
        return done

    def atomic_rmw(self, op: Any, pointers: numpy.ndarray, value: numpy.ndarray, mask: numpy.ndarray,
                   semantic: Any) -> Any:
        mask = self._check("atomic_rmw", pointers, mask, numpy.asarray(value).dtype.itemsize, _semantic(semantic))
        old = self._inner.atomic_rmw(op, pointers, value, mask, semantic)
        self._after(old, self._changed(pointers, mask, old))
        return old

    def atomic_cas(self, pointers: numpy.ndarray, compare: numpy.ndarray, value: numpy.ndarray,
                   semantic: Any) -> Any:
        launch = _STATE.current
        before = len(launch.problems) if launch is not None else 0
        self._check("atomic_cas", pointers, None, numpy.asarray(value).dtype.itemsize, _semantic(semantic))
        if launch is not None and len(launch.problems) > before:  # no mask to switch lanes off: stop the kernel
            raise OutOfBounds(launch.problems[-1])
        old = self._inner.atomic_cas(pointers, compare, value, semantic)
        self._after(old, self._changed(pointers, None, old))
        return old


# ----------------------------------------------------------------------------------------------- redzones


def _span(x: torch.Tensor, name: str) -> Span:
    """The bytes of ``x`` (not empty) from its first to its last element."""
    low = sum((n - 1) * s for n, s in zip(x.shape, x.stride()) if s < 0)
    high = sum((n - 1) * s for n, s in zip(x.shape, x.stride()) if s > 0)
    size = x.element_size()
    return Span(x.data_ptr() + low * size, x.data_ptr() + (high + 1) * size, name, _what(x))


def _what(x: torch.Tensor) -> str:
    """Shape and dtype of ``x``: ``(4, 3) float32``."""
    return f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}"


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """``storage`` as a uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass
class _Redzone:
    """A copy of one argument storage inside a canary-filled allocation: ``guard`` bytes, the storage's ``size``
    bytes, ``guard`` bytes."""

    original: torch.Tensor  # the storage's bytes
    padded: torch.Tensor  # the allocation, typed like the first argument on the storage
    guard: int
    canaries: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.size = self.original.numel()
        raw = _bytes(self.padded.untyped_storage())
        raw[self.guard:self.guard + self.size].copy_(self.original)
        self.canaries = torch.cat([raw[:self.guard], raw[self.guard + self.size:]]).clone()

    @classmethod
    def around(cls, x: torch.Tensor) -> "_Redzone":
        original = _bytes(x.untyped_storage())
        guard = max(MIN_GUARD, math.ceil(original.numel() / MIN_GUARD) * MIN_GUARD)
        with alloc.poisoned():
            padded = alloc.empty((math.ceil((2 * guard + original.numel()) / x.element_size()),), dtype=x.dtype,
                                 device=x.device)
        return cls(original, padded, guard)

    def view(self, x: torch.Tensor) -> torch.Tensor:
        """``x``'s view of its storage, on the copy."""
        offset = self.guard // x.element_size() + x.storage_offset()
        return torch.empty(0, dtype=x.dtype, device=x.device).set_(self.padded.untyped_storage(), offset, x.shape,
                                                                    x.stride())

    def finish(self, names: str) -> list[str]:
        """Write the copy back; the problems of its guards (arguments ``names``)."""
        raw = _bytes(self.padded.untyped_storage())
        self.original.copy_(raw[self.guard:self.guard + self.size])
        guards = torch.cat([raw[:self.guard], raw[self.guard + self.size:]])
        if torch.equal(guards, self.canaries):
            return []
        changed = (guards != self.canaries).nonzero().flatten()
        first = int(changed[0])
        where = f"{self.guard - first} bytes before" if first < self.guard else f"{first - self.guard} bytes past"
        return [f"{changed.numel()} guard bytes around argument {names} changed, the first {where} the storage: "
                f"a store outside it escaped the address check (have the Triton interpreter's internals changed?)"]


class _Redzones:
    """The redzoned copies of one launch's tensor arguments (one per storage) and which arguments use each."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.zones: dict[int, _Redzone] = {}
        self.users: dict[int, list[str]] = {}

    def copy(self, name: str, arg: Any) -> Any:
        """``arg`` on its redzoned copy (non-tensors, and empty tensors, as they are)."""
        if isinstance(arg, (tuple, list)) and any(isinstance(a, torch.Tensor) for a in arg):
            raise TypeError(f"memory check: argument {name} of {self.kernel} holds tensors inside a "
                            f"{type(arg).__name__}, which the check does not redzone")
        if not isinstance(arg, torch.Tensor) or arg.numel() == 0:
            return arg
        key = arg.untyped_storage().data_ptr()
        if key not in self.zones:
            self.zones[key] = _Redzone.around(arg)
        self.users.setdefault(key, []).append(name)
        return self.zones[key].view(arg)

    def finish(self) -> list[str]:
        """Write every copy back; the problems of their guards."""
        return [f"{self.kernel}: {p}" for key, zone in self.zones.items()
                for p in zone.finish(", ".join(self.users[key]))]


# ------------------------------------------------------------------------------------------------- launches


def _tensors(name: str, arg: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in argument ``name``, named: a tensor, the tensors of a tuple or list, the base of a tensor
    descriptor."""
    if isinstance(arg, torch.Tensor):
        yield name, arg
    elif isinstance(arg, (tuple, list)):
        for i, item in enumerate(arg):
            yield from _tensors(f"{name}[{i}]", item)
    elif isinstance(getattr(arg, "base", None), torch.Tensor):
        yield from _tensors(f"{name}.base", arg.base)


def _guarded_call(original: Callable[..., None]) -> Callable[..., None]:
    """``GridExecutor.__call__`` running each launch as a :class:`Launch` under the address check (module doc)."""

    def call(executor: Any, *args: Any, **kwargs: Any) -> None:
        state = _STATE
        names = list(executor.arg_names)[:len(args)]
        names += [f"#{i}" for i in range(len(names), len(args))]
        if any(t.device.type != "cpu" for n, a in kwargs.items() for _, t in _tensors(n, a)) or any(
                t.device.type != "cpu" for n, a in zip(names, args) for _, t in _tensors(n, a)):
            return original(executor, *args, **kwargs)  # copied to the host: the copies' addresses are not known
        kernel = executor.fn.__name__
        watch, zones = state.watch, _Redzones(kernel)
        if watch is not None:
            args = tuple(zones.copy(n, a) for n, a in zip(names, args))
            kwargs = {n: zones.copy(n, a) for n, a in kwargs.items()}
        tensors = [named for n, a in (*zip(names, args), *kwargs.items()) for named in _tensors(n, a)]
        launch = Launch(kernel, [_span(t, n) for n, t in tensors if t.numel()], state.recorded is not None,
                        [f"{n} ({_what(t)})" for n, t in tensors if not t.numel()])
        fn, outer = executor.fn, state.current
        state.current = launch
        if state.programs is not None:
            executor.fn = state.programs.wrap(fn, launch)
        try:
            original(executor, *args, **kwargs)
        finally:
            executor.fn, state.current = fn, outer
            if watch is not None:
                watch.problems += zones.finish()
        if state.recorded is not None:
            state.recorded.append(launch)
        if watch is None:
            if launch.problems:
                raise OutOfBounds(f"{launch.problems[0]} (masked off: nothing was read or written there; "
                                  f"{len(launch.problems)} such accesses in this launch; the memory check names "
                                  f"them)")
            return
        watch.launches, watch.accesses = watch.launches + 1, watch.accesses + launch.accesses
        watch.kernels.add(kernel)
        watch.problems += launch.problems
        if launch.accesses == 0:
            watch.problems.append(f"{kernel}: the launch made no checked load or store (the Triton interpreter "
                                  f"reaches memory another way: its internals changed)")

    return call


def _interpreter_module() -> Any:
    """Triton's interpreter module, with the functions the check wraps (else :class:`Unavailable`)."""
    from triton.runtime import interpreter

    inner = getattr(interpreter, "_interpreter", None)
    inner = getattr(inner, "_inner", inner)
    missing = [name for name in ACCESSES if not hasattr(inner, name)]
    if missing or not hasattr(interpreter, "GridExecutor"):
        raise Unavailable(f"triton.runtime.interpreter lacks {', '.join(missing or ['GridExecutor'])}: this "
                          f"Triton's interpreter reaches memory another way; the memory check must be ported to it")
    return interpreter


def install() -> None:
    """Switch the guard on in this process (module doc), once: every interpreted launch from now on is checked.
    Nothing happens when the interpreter lacks what the guard wraps (:func:`watching` then raises
    :class:`Unavailable`, failing the ``memory`` check)."""
    if _STATE.installed:
        return
    with contextlib.suppress(Unavailable):
        interpreter = _interpreter_module()
        interpreter._interpreter = _CheckedInterpreter(interpreter._interpreter)
        interpreter.GridExecutor.__call__ = _guarded_call(interpreter.GridExecutor.__call__)
        _STATE.installed = True


@contextlib.contextmanager
def watching() -> Iterator[Watch]:
    """Report, rather than raise, every access outside the arguments of an interpreted launch made inside the
    block, each launch on redzoned copies of its arguments (module doc); yields the :class:`Watch`. Raises
    :class:`Unavailable` when the interpreter lacks the functions the check wraps."""
    interpreter = _interpreter_module()
    install()
    if not _STATE.installed or not isinstance(interpreter._interpreter, _CheckedInterpreter):
        raise Unavailable("triton.runtime.interpreter._interpreter was replaced after the guard was installed")
    if _STATE.watch is not None:
        raise RuntimeError("memory.watching() is already active")
    _STATE.watch = Watch()
    try:
        yield _STATE.watch
    finally:
        _STATE.watch = None


@contextlib.contextmanager
def recording(programs: Optional[Programs] = None) -> Iterator[list[Launch]]:
    """Keep every access of every interpreted launch made inside the block (:attr:`Launch.trace`), the programs
    run by ``programs`` when given (program order otherwise); yields the list of launches, in order."""
    install()
    if _STATE.recorded is not None:
        raise RuntimeError("memory.recording() is already active")
    _STATE.recorded, _STATE.programs = [], programs
    try:
        yield _STATE.recorded
    finally:
        _STATE.recorded, _STATE.programs = None, None


# -------------------------------------------------------------------------------------------------- check


def verdict(family: Family, cases: Sequence[Case], device: torch.device, bad: Optional[Watch] = None,
            bad_inputs: int = 0) -> Verdict:
    """The ``memory`` check on ``cases`` (of one route): run each (forward and backward) inside :func:`watching`,
    in host mode and in device mode (:data:`MODES`); ``bad``: what :func:`watching` saw of the route's
    ``bad_inputs`` bad inputs run in device mode (by ``kernel_sentinel.rows.run_bad_inputs``, whose runs serve the
    ``bad_input`` and ``races`` checks too), where the kernels read the bad values themselves and must stay inside
    their arguments whatever they hold (raising is allowed)."""
    if device.type != "cpu":
        return Verdict((), f"not run on {device.type}: the kernels run compiled, not under the Triton interpreter "
                           f"(`sentinel verify --device cpu` runs this check; on a GPU `--sanitize` runs "
                           f"compute-sanitizer's memcheck)")
    with alloc.poisoned(), watching() as watch:  # fresh workspaces of exactly their size (module doc)
        for case in cases:
            for mode in MODES:
                with value_checks(mode):
                    run_route(family.run, fresh_case(case))
    if bad is not None:
        watch.add(bad)
    problems = list(watch.problems[:SHOWN])
    if len(watch.problems) > SHOWN:
        problems.append(f"... {len(watch.problems) - SHOWN} more")
    if not watch.launches:
        if any(is_triton_route(case.route_id) for case in cases):
            problems.append("this Triton route launched no Triton kernel under the interpreter")
        return Verdict(tuple(problems), "no Triton launch on this route: nothing to check (PyTorch bounds-checks "
                                        "its own operations)")
    return Verdict(tuple(problems), f"{watch.accesses} loads and stores in {watch.launches} launches "
                                    f"({', '.join(sorted(watch.kernels))}) over {len(cases)} cases in host and "
                                    f"device mode and {bad_inputs} bad inputs in device mode checked: every lane "
                                    f"inside its arguments, redzones intact")
