"""The ``memory`` check: out-of-bounds loads and stores of the Triton kernels, caught on the CPU under the Triton
interpreter, with no family code.

The check runs the route's cases (``tiny`` and ``small``, forward and backward: :attr:`Family.run`) inside
:func:`watching`, each twice: with value checks in host mode (the CPU default) and in device mode (the CUDA default:
the kernels check the values they read, a code path of their own). It then runs the route's bad inputs in device
mode, where the kernels read bad indices and lengths themselves: whatever those hold, every access must stay inside
the arguments (an error is allowed). :func:`watching` does two things to every launch through
:meth:`provable_kernels.launch.Launcher.launch` (every Triton launch of the library goes through it):

- **redzones**: the kernel runs on copies of its tensor arguments, each storage copied into an allocation of its
  own with a guard region before and after it (each as long as the storage, at least :data:`MIN_GUARD` bytes)
  holding canaries (NaN for floats, :data:`provable_kernels.alloc.POISON_INT` for integers, ``True`` for bools);
  after the launch the copies are written back and every guard must still hold its canaries;
- **address check**: every load, store and atomic the interpreter makes (its calls of ``load``, ``store``,
  ``atomic_rmw`` and ``atomic_cas`` of Triton's C++ interpreter module, where ``tl.load``/``tl.store``, block
  pointers and tensor descriptors all end, on Triton 3.6 to 3.8) is checked before it runs: each lane whose mask
  is on must access, whole, memory inside one tensor argument of the launch (its first to its last element).
  A lane outside is reported (kernel, program id, access, which argument it is nearest to and how far past it)
  and masked off, so the run goes on without touching that memory;
- **one writer per element**: within a launch, no two programs may write the same address where at least one of
  them does it with a plain ``store`` (atomics among themselves are made for that and are exempt). On a GPU the
  programs run concurrently, so such a pair is a write race whatever the values, even where the interpreter,
  running the programs one after another, happens to leave the right result.

The cases run with allocations poisoned (:func:`provable_kernels.alloc.poisoned`): every workspace is then a fresh
allocation of exactly the size the call asks for, where a workspace kept from an earlier, larger call would hide an
overrun inside its larger span.

It fails loudly rather than pass silently when the interpreter's internals change: when the interpreter module
lacks those functions, when a launch makes no checked access at all (its memory accesses went another way), when
an access happens outside a launch of the launcher, and when a guard changed (a store that escaped the address
check).

What it cannot see: stores of two programs to overlapping but not identical addresses (elements of different sizes),
accesses of masked-off lanes (the GPU does not make them either); an address inside another
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
from typing import Any, Callable, Iterator, Optional, Sequence

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


@dataclass(frozen=True)
class _Span:
    """Bytes ``start:end`` of tensor argument ``name`` (its first to its last element) in a launch."""

    start: int
    end: int
    name: str
    what: str  # shape and dtype


@dataclass
class _Launch:
    """The launch running now: its kernel, the spans of its tensor arguments, how many accesses were checked."""

    kernel: str
    spans: list[_Span]
    accesses: int = 0
    stores: list[tuple[numpy.ndarray, tuple, bool]] = field(default_factory=list)  # addresses written, by which
    # program, whether by a plain store (else an atomic)

    def __post_init__(self) -> None:
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
        index = numpy.searchsorted(self.starts, addresses, side="right").astype(numpy.int64) - 1
        inside = index >= 0
        ends = self.ends[numpy.maximum(index, 0)] if len(self.ends) else numpy.zeros_like(addresses)
        return ~(inside & (addresses + numpy.uint64(size) <= ends))

    def shared_stores(self) -> list[str]:
        """The problem of elements written by two programs of this launch, one of them with a plain store (one
        writer per element), if any."""
        if not any(plain for *_, plain in self.stores):
            return []
        programs = sorted({program for _, program, _ in self.stores})
        number = {program: i for i, program in enumerate(programs)}
        addresses = numpy.concatenate([a for a, _, _ in self.stores])
        writers = numpy.concatenate([numpy.full(a.shape, number[p], dtype=numpy.int64) for a, p, _ in self.stores])
        plain = numpy.concatenate([numpy.full(a.shape, kind) for a, _, kind in self.stores])
        order = numpy.lexsort((writers, addresses))
        addresses, writers, plain = addresses[order], writers[order], plain[order]
        if not addresses.size:
            return []
        first = numpy.flatnonzero(numpy.r_[True, addresses[1:] != addresses[:-1]])  # each address's first write
        last = numpy.r_[first[1:], addresses.size] - 1
        race = (writers[first] != writers[last]) & numpy.logical_or.reduceat(plain, first)
        if not race.any():
            return []
        start = first[int(numpy.argmax(race))]
        other = start + int(numpy.argmax(writers[start:] != writers[start]))  # the next program writing it
        address = int(addresses[start])
        span = next(s for s in self.spans if s.start <= address < s.end)
        return [f"{self.kernel}: {int(race.sum())} elements stored by more than one program (a write race on a "
                f"GPU); the first, byte {address - span.start} of argument {span.name} ({span.what}), by programs "
                f"{programs[writers[start]]} and {programs[writers[other]]}"]

    def nearest(self, address: int, size: int) -> str:
        """Where ``address`` lies relative to the nearest argument, in bytes and elements of ``size`` bytes."""
        if not self.spans:
            return "the launch has no tensor argument"

        def distance(s: _Span) -> int:
            return s.start - address if address < s.start else address + size - s.end

        s = min(self.spans, key=distance)
        if address < s.start:
            gap, where = s.start - address, "before the start"
        else:
            gap, where = address + size - s.end, "past the end"
        return f"{gap} bytes ({gap / size:g} elements) {where} of argument {s.name} ({s.what})"


@dataclass
class Watch:
    """What :func:`watching` saw: launches, checked accesses, kernels launched, and the problems found."""

    launches: int = 0
    accesses: int = 0
    kernels: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    current: Optional[_Launch] = None

    def access(self, kind: str, pointers: numpy.ndarray, mask: Optional[numpy.ndarray],
               size: int) -> Optional[numpy.ndarray]:
        """Check one access; return the mask with the lanes outside every argument switched off (``mask`` itself
        when none is)."""
        launch = self.current
        if launch is None:
            self.problems.append(f"a {kind} outside a launch through provable_kernels.launch.Launcher (a kernel "
                                 f"launched another way): its addresses cannot be checked")
            return mask
        launch.accesses += 1
        on = numpy.ones(pointers.shape, dtype=bool) if mask is None else numpy.broadcast_to(mask, pointers.shape)
        bad = numpy.zeros(pointers.shape, dtype=bool)
        bad[on] = launch.outside(pointers[on].astype(numpy.uint64), size)
        if kind != "load":
            launch.stores.append((pointers[on & ~bad].astype(numpy.uint64), _program_index(), kind == "store"))
        if not bad.any():
            return mask
        first = int(pointers[bad].flat[0])
        self.problems.append(f"{launch.kernel}{_program()}: {kind} of {size} bytes, {int(bad.sum())} lanes outside "
                             f"every tensor argument; first {launch.nearest(first, size)}")
        return on & ~bad


_WATCH: Optional[Watch] = None


def _program_index() -> Optional[tuple]:
    """``(x, y, z)`` of the interpreter's current program, None when it does not say."""
    from triton.runtime import interpreter

    index = getattr(getattr(interpreter, "interpreter_builder", None), "grid_idx", None)
    return None if index is None else tuple(int(i) for i in index)


def _program() -> str:
    """`` program (x, y, z)`` of the interpreter's current program, when it says."""
    index = _program_index()
    return f" program {index}" if index is not None else ""


class _CheckedInterpreter:
    """Triton's C++ interpreter module with its memory functions checked by the active :class:`Watch`."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    # the C++ module's signatures: pointers (uint64 addresses), mask (bool), values as NumPy arrays
    def load(self, pointers: numpy.ndarray, mask: numpy.ndarray, other: numpy.ndarray, dtype: Any) -> Any:
        mask = _WATCH.access("load", pointers, mask, numpy.dtype(dtype).itemsize)
        return self._inner.load(pointers, mask, other, dtype)

    def store(self, pointers: numpy.ndarray, value: numpy.ndarray, mask: numpy.ndarray) -> Any:
        mask = _WATCH.access("store", pointers, mask, numpy.asarray(value).dtype.itemsize)
        return self._inner.store(pointers, value, mask)

    def atomic_rmw(self, op: Any, pointers: numpy.ndarray, value: numpy.ndarray, mask: numpy.ndarray,
                   semantic: Any) -> Any:
        mask = _WATCH.access("atomic_rmw", pointers, mask, numpy.asarray(value).dtype.itemsize)
        return self._inner.atomic_rmw(op, pointers, value, mask, semantic)

    def atomic_cas(self, pointers: numpy.ndarray, compare: numpy.ndarray, value: numpy.ndarray,
                   semantic: Any) -> Any:
        before = len(_WATCH.problems)
        _WATCH.access("atomic_cas", pointers, None, numpy.asarray(value).dtype.itemsize)
        if len(_WATCH.problems) > before:  # no mask to switch lanes off: stop the kernel before it writes
            raise RuntimeError(_WATCH.problems[-1])
        return self._inner.atomic_cas(pointers, compare, value, semantic)


# ----------------------------------------------------------------------------------------------- redzones


def _span(x: torch.Tensor, name: str) -> Optional[_Span]:
    """The bytes of ``x`` from its first to its last element (None when it has none)."""
    if x.numel() == 0:
        return None
    low = sum((n - 1) * s for n, s in zip(x.shape, x.stride()) if s < 0)
    high = sum((n - 1) * s for n, s in zip(x.shape, x.stride()) if s > 0)
    size = x.element_size()
    return _Span(x.data_ptr() + low * size, x.data_ptr() + (high + 1) * size, name,
                 f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}")


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


def _names(kernel: Any, count: int) -> list[str]:
    names = list(getattr(kernel, "arg_names", ()))[:count]
    return names + [f"#{i}" for i in range(len(names), count)]


def _checked_launch(original: Any) -> Any:
    """:meth:`Launcher.launch` running each interpreted launch on redzoned copies under the address check."""

    def launch(self: Any, grid: tuple, args: tuple, opts: Any) -> None:
        if self.compiled:  # compiled kernels (CUDA): nothing to check here
            return original(self, grid, args, opts)
        names = _names(self.kernel, len(args))
        zones: dict[int, _Redzone] = {}
        users: dict[int, list[str]] = {}
        copies, spans = [], []
        for name, arg in zip(names, args):
            if isinstance(arg, (tuple, list)) and any(isinstance(a, torch.Tensor) for a in arg):
                raise TypeError(f"memory check: argument {name} of {self.kernel.__name__} holds tensors inside a "
                                f"{type(arg).__name__}, which the check does not redzone")
            if not isinstance(arg, torch.Tensor) or arg.numel() == 0:
                copies.append(arg)
                continue
            key = arg.untyped_storage().data_ptr()
            if key not in zones:
                zones[key] = _Redzone.around(arg)
            zone = zones[key]
            users.setdefault(key, []).append(name)
            copies.append(zone.view(arg))
            spans.append(_span(copies[-1], name))
        watch = _WATCH
        launch_state = _Launch(self.kernel.__name__, spans)
        watch.current, watch.launches = launch_state, watch.launches + 1
        watch.kernels.add(self.kernel.__name__)
        try:
            original(self, grid, tuple(copies), opts)
        finally:
            watch.current = None
            watch.accesses += launch_state.accesses
            for key, zone in zones.items():
                watch.problems += [f"{self.kernel.__name__}: {p}" for p in zone.finish(", ".join(users[key]))]
            if any(program is None for _, program, _ in launch_state.stores):
                watch.problems.append(f"{self.kernel.__name__}: the Triton interpreter did not say which program "
                                      f"stored (its internals changed): one writer per element cannot be checked")
            else:
                watch.problems += launch_state.shared_stores()
        if launch_state.accesses == 0:
            watch.problems.append(f"{self.kernel.__name__}: the launch made no checked load or store (the Triton "
                                  f"interpreter reaches memory another way: its internals changed)")

    return launch


@contextlib.contextmanager
def watching() -> Iterator[Watch]:
    """Check every interpreted Triton launch made inside the block (module docstring); yields the :class:`Watch`.
    Raises :class:`Unavailable` when the interpreter lacks the functions the check wraps."""
    global _WATCH
    from triton.runtime import interpreter

    from provable_kernels.launch import Launcher

    inner = getattr(interpreter, "_interpreter", None)
    missing = [name for name in ACCESSES if not hasattr(inner, name)]
    if missing:
        raise Unavailable(f"triton.runtime.interpreter._interpreter lacks {', '.join(missing)}: this Triton's "
                          f"interpreter reaches memory another way; the memory check must be ported to it")
    if _WATCH is not None:
        raise RuntimeError("memory.watching() is already active")
    original = Launcher.launch
    _WATCH = Watch()
    interpreter._interpreter = _CheckedInterpreter(inner)
    Launcher.launch = _checked_launch(original)
    try:
        yield _WATCH
    finally:
        Launcher.launch = original
        interpreter._interpreter = inner
        _WATCH = None


# -------------------------------------------------------------------------------------------------- check


def verdict(family: Family, cases: Sequence[Case], device: torch.device,
            bad: Sequence[Callable[[], Case]] = ()) -> Verdict:
    """The ``memory`` check on ``cases`` (of one route): run each (forward and backward) inside :func:`watching`,
    in host mode and in device mode (:data:`MODES`), then each of the route's bad inputs ``bad`` (builders) in
    device mode, where the kernels read the bad values themselves and must stay inside their arguments whatever
    they hold (raising is allowed)."""
    if device.type != "cpu":
        return Verdict((), f"not run on {device.type}: the kernels run compiled, not under the Triton interpreter "
                           f"(`sentinel verify --device cpu` runs this check; on a GPU `--sanitize` runs "
                           f"compute-sanitizer's memcheck)")
    with alloc.poisoned(), watching() as watch:  # fresh workspaces of exactly their size (module doc)
        for case in cases:
            for mode in MODES:
                with value_checks(mode):
                    run_route(family.run, fresh_case(case))
        for make in bad:
            with value_checks("device"), contextlib.suppress(Exception):
                family.run(make())
    problems = list(watch.problems[:SHOWN])
    if len(watch.problems) > SHOWN:
        problems.append(f"... {len(watch.problems) - SHOWN} more")
    if not watch.launches:
        if any(is_triton_route(case.route_id) for case in cases):
            problems.append("this Triton route launched no Triton kernel through provable_kernels.launch.Launcher")
        return Verdict(tuple(problems), "no Triton launch on this route: nothing to check (PyTorch bounds-checks "
                                        "its own operations)")
    return Verdict(tuple(problems), f"{watch.accesses} loads and stores in {watch.launches} launches "
                                    f"({', '.join(sorted(watch.kernels))}) over {len(cases)} cases in host and "
                                    f"device mode and {len(bad)} bad inputs in device mode checked: every lane "
                                    f"inside its arguments, one program storing to each element, redzones intact")
