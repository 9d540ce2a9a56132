"""The ``races`` check: races between the programs of a Triton launch, caught on the CPU under the Triton
interpreter, with no family code.

The interpreter runs a grid's programs one after another in program order; a GPU runs them concurrently, in an
order nobody chose. A kernel correct only in program order passes every other CPU check. This one runs the route's
``tiny`` case (forward and backward: :attr:`Family.run`) with every access recorded
(:func:`kernel_sentinel.memory.recording`), first in program order, then with the programs run in other orders
(:data:`SCHEDULES`), then the route's bad inputs in device mode, in program order (the kernels then read bad
indices themselves: unsorted ids may send two programs to one segment; the runs made once for this check and the
``bad_input`` and ``memory`` checks, ``kernel_sentinel.rows.run_bad_inputs``), and reports

- **conflicts** (:func:`conflicts`): two accesses of different programs to the same bytes, at least one of them a
  plain store and not both atomics, that no synchronisation orders. Order comes from the atomics' memory semantics
  (``sem=``), the only synchronisation between programs Triton has: an atomic with release semantics (release,
  acq_rel) publishes everything its program did before it, and an atomic with acquire semantics (acquire, acq_rel)
  of the same bytes, made after it, makes that visible to the acquiring program and to what it does afterwards
  (vector clocks, transitive). A kernel's publish protocol (a flag written with release after a partial, read
  with acquire before the partial is read) is thus checked as the kernel runs it: a wait that does not really
  guard its reads (it reads before the flag says so) leaves the read unordered in some schedule, and is reported.
  A family may also declare the protocol (``PUBLISHES``: :class:`kernel_sentinel.family.Publish`): then a read of
  the data argument written by another program must be ordered by an acquire of the declared flag argument itself;
  Each finding names the kernel, the two program ids, the argument, the offset and the accesses;
- **schedules other than program order**: the programs run in reversed order and in seeded random orders, one
  at a time (a thread each), each until it finishes or **waits**: it repeats its previous access with an atomic
  (same addresses, same values read, memory unchanged: a spin wait's poll; Triton's acquire is an atomic). A
  waiting program runs again once another program changes memory, so no dependency needs declaring: every order
  is one a GPU may run, a wait included. Outputs and gradients must be bitwise those of program order (a
  difference is an order dependence the GPU can show). When every unfinished program waits, the schedule has a **deadlock**: each
  waiting program is named with the argument and offset it polls, instead of hanging; a program that makes more
  than :data:`STEP_LIMIT` accesses in one launch is reported the same way (a spin wait the check does not
  recognise as one, such as one polling with plain loads).

Write races are thus found in program order too: two programs storing one element with a plain store are always
unordered, even where the interpreter leaves the right result.

What it cannot see: races between the threads of one program (warps, shared memory: compute-sanitizer's racecheck
on the GPU, ``sentinel verify --sanitize``); effects of the hardware's memory model beyond acquire and release
(the interpreter is sequentially consistent: a missing fence between plain accesses, relaxed atomics read out of
order, caches); schedules other than those it runs (a program is never interrupted between two accesses except
while it waits); accesses of masked-off lanes (not made, on a GPU either); a wait on a later program that a GPU
without room for every program at once would never start (every program here always gets its turn). On CUDA it
does not run (the kernels run compiled).
"""
from __future__ import annotations

import inspect
import random
import threading
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy
import torch

from provable_kernels import alloc
from kernel_sentinel import memory
from kernel_sentinel.checks import run_route
from kernel_sentinel.family import Case, Family
from kernel_sentinel.generic import Verdict, differences, error_text, fresh_case
from kernel_sentinel.sanitize import is_triton_route

SCHEDULES = ("reversed", "shuffled 1", "shuffled 2")  # program orders besides program order (shuffled: seed offset)
STEP_LIMIT = 200_000  # accesses one program may make in one launch of a schedule
SHOWN = 6  # findings listed in a check's detail
MAX_SHADOW = 2 ** 24  # programs x bytes a launch may access (the last load of each byte by each program is kept)
ACQUIRES = ("ACQUIRE", "ACQUIRE_RELEASE")
RELEASES = ("RELEASE", "ACQUIRE_RELEASE")


class Deadlock(RuntimeError):
    """Every unfinished program of a launch waits (or one runs past :data:`STEP_LIMIT` accesses)."""


class _Aborted(BaseException):
    """Raised inside a waiting program to end it once its launch cannot finish."""


# ------------------------------------------------------------------------------------------- happens-before


def _bytes_of(trace: Sequence[memory.Access]) -> tuple[numpy.ndarray, list[numpy.ndarray]]:
    """Every byte address the accesses touch (sorted, unique) and each access's bytes as indices into it."""
    touched = [(a.addresses[:, None] + numpy.arange(a.size, dtype=numpy.uint64)).reshape(-1) for a in trace]
    every = numpy.unique(numpy.concatenate(touched)) if touched else numpy.zeros(0, dtype=numpy.uint64)
    return every, [numpy.searchsorted(every, t) for t in touched]


def conflicts(launch: memory.Launch, guards: Optional[Mapping[str, str]] = None) -> list[str]:
    """The unordered conflicting pairs of ``launch``'s recorded accesses (module doc): the first found (in
    execution order) of each argument and pair of kinds, one line each. ``guards`` (data argument: flag argument,
    the kernel's declared publish protocols, :class:`kernel_sentinel.family.Publish`) adds the reads of a data
    argument's bytes written by another program that no acquire of its flag argument orders."""
    guards = guards or {}
    trace = [a for a in launch.trace or () if a.addresses.size]
    programs = sorted({a.program for a in trace})
    number = {p: i for i, p in enumerate(programs)}
    every, indices = _bytes_of(trace)
    count, size = len(programs), every.size
    if count * size > MAX_SHADOW:
        return [f"{launch.kernel}: {count} programs accessing {size} bytes, too many to check for races (programs x "
                f"bytes at most {MAX_SHADOW}): the route's tiny case should be smaller"]
    clock = numpy.zeros((count, count), dtype=numpy.int64)  # clock[q, p]: p's steps ordered before q's next one
    writer = numpy.full(size, -1, dtype=numpy.int64)  # the last write of each byte: program, step, atomic
    written = numpy.zeros(size, dtype=numpy.int64)
    atomic = numpy.zeros(size, dtype=bool)
    read = numpy.zeros((count, size), dtype=numpy.int32)  # the last plain load of each byte by each program (step)
    released: dict[int, numpy.ndarray] = {}  # byte index: the releasing program's clock
    kinds = numpy.zeros(size, dtype=numpy.int64)  # the access index of the last write (for its kind)
    # per flag argument: the clock advanced only through acquires of that flag (and each program's own steps)
    guarded = {flag: numpy.zeros((count, count), dtype=numpy.int64) for flag in set(guards.values())}
    found: dict[tuple, str] = {}
    for index, (access, touched) in enumerate(zip(trace, indices)):
        q = number[access.program]
        clock[q, q] += 1
        step = clock[q, q]
        for own in guarded.values():
            own[q, q] = step
        name = launch.span_of(int(access.addresses[0])).name if guards else None
        if access.semantic in ACQUIRES:
            for b in touched.tolist():
                if b in released:
                    numpy.maximum(clock[q], released[b], out=clock[q])
                    if name in guarded:
                        numpy.maximum(guarded[name][q], released[b], out=guarded[name][q])
        w = writer[touched]
        if name in guards and access.kind != "store":
            order = guarded[guards[name]]
            hit = numpy.flatnonzero((w >= 0) & (w != q) & (written[touched] > order[q, numpy.maximum(w, 0)]))
            if hit.size:
                _unguarded(found, launch, every[touched[hit[0]]], int(w[hit[0]]), q, guards[name], programs)
        earlier = (w >= 0) & (w != q) & (written[touched] > clock[q, numpy.maximum(w, 0)])
        if access.kind != "store":  # a load or an atomic conflicts with plain stores only
            earlier &= ~atomic[touched]
        for b in touched[earlier][:1].tolist():
            _note(found, launch, every[b], (int(writer[b]), trace[kinds[b]].kind), (q, access.kind), programs)
        if access.kind == "load":
            read[q, touched] = step
            continue
        if access.kind == "store":  # a plain store conflicts with loads too
            unordered = read[:, touched] > clock[q][:, None]
            unordered[q] = False
            if unordered.any():
                p, column = (int(v[0]) for v in numpy.nonzero(unordered))
                _note(found, launch, every[touched[column]], (p, "load"), (q, "store"), programs)
        writer[touched], written[touched], atomic[touched], kinds[touched] = q, step, access.kind != "store", index
        if access.semantic in RELEASES:
            for b in touched.tolist():
                released[b] = clock[q].copy()
    return list(found.values())


def _note(found: dict[tuple, str], launch: memory.Launch, address: Any, first: tuple[int, str],
          second: tuple[int, str], programs: Sequence[tuple]) -> None:
    """Keep the first conflict of each argument and pair of kinds."""
    address = int(address)
    span = launch.span_of(address)
    key = (span.name, first[1], second[1])
    if key not in found:
        found[key] = (f"{launch.kernel}: {first[1]} by program {programs[first[0]]} and {second[1]} by program "
                      f"{programs[second[0]]} of argument {span.name} ({span.what}) at byte {address - span.start}, "
                      f"unordered (no release and acquire between them): a race on a GPU")


def _unguarded(found: dict[tuple, str], launch: memory.Launch, address: Any, writer: int, reader: int, flag: str,
               programs: Sequence[tuple]) -> None:
    """Keep the first read of each data argument that its declared flag does not guard."""
    span = launch.span_of(int(address))
    key = (span.name, "unguarded")
    if key not in found:
        found[key] = (f"{launch.kernel}: program {programs[reader]} reads argument {span.name} ({span.what}) at byte "
                      f"{int(address) - span.start}, written by program {programs[writer]}, with no acquire of "
                      f"{flag} ordering the read after the write: the declared publish protocol (PUBLISHES) "
                      f"does not guard it")


# ------------------------------------------------------------------------------------------------- schedules


class _Programs:
    """The function the interpreter calls once per program id of one launch (:class:`memory.Programs`): it only
    notes the id, and at the last one runs every program, each in a thread of its own, one at a time, in the
    schedule's order (module doc)."""

    def __init__(self, schedule: "Schedule", fn: Callable[..., None], launch: memory.Launch):
        self.schedule, self.fn, self.launch = schedule, fn, launch
        self.__signature__ = inspect.signature(fn)  # what the interpreter inspects and binds arguments with
        self.__globals__ = fn.__globals__  # where it patches triton.language
        self.__name__ = fn.__name__

    def __call__(self, **args: Any) -> None:
        from triton.runtime.interpreter import interpreter_builder

        last = tuple(n - 1 for n in interpreter_builder.grid_dim)
        if tuple(interpreter_builder.grid_idx) == last:
            self.schedule.run(self.fn, args, self.launch, last)


class Schedule:
    """A program order other than program order (``reversed``, or ``shuffled`` by ``seed``); as
    :func:`kernel_sentinel.memory.recording`'s runner, it runs every launch's programs in that order."""

    def __init__(self, name: str, seed: int = 0):
        if name != "reversed" and not name.startswith("shuffled"):
            raise ValueError(f"name: {name!r} is no schedule; use 'reversed' or 'shuffled N'")
        self.name, self.seed = name, seed
        self.condition = threading.Condition()

    def wrap(self, fn: Callable[..., None], launch: memory.Launch) -> Callable[..., None]:
        return _Programs(self, fn, launch)

    def order(self, count: int) -> list[int]:
        """The programs' priority: a program runs when every one before it has finished or waits."""
        order = list(range(count))[::-1]
        if self.name != "reversed":
            random.Random(f"{self.seed} {self.name}").shuffle(order)
        return order

    def run(self, fn: Callable[..., None], args: dict, launch: memory.Launch, last: tuple[int, int, int]) -> None:
        """Run every program of ``launch`` (grid up to ``last``) in this schedule; raises :class:`Deadlock`, or
        the first program's error."""
        from triton.runtime.interpreter import interpreter_builder

        self.builder, self.launch, self.errstate = interpreter_builder, launch, numpy.geterr()
        self.programs = [(x, y, z) for x in range(last[0] + 1) for y in range(last[1] + 1) for z in range(last[2] + 1)]
        count = len(self.programs)
        self.priority = self.order(count)
        self.state = ["ready"] * count
        self.steps, self.previous = [0] * count, [None] * count
        self.errors: list[BaseException] = []
        self.stuck: list[str] = []
        threads = [threading.Thread(target=self._program, args=(fn, args, i), daemon=True) for i in range(count)]
        with self.condition:
            self.turn: Optional[int] = None
            for thread in threads:
                thread.start()
            self._next()
            self.condition.wait_for(lambda: self.turn is None)
        for thread in threads:
            thread.join()
        if self.stuck:
            raise Deadlock(f"{launch.kernel} in {self.name} order: " + "; ".join(self.stuck))
        if self.errors:
            raise self.errors[0]

    def _program(self, fn: Callable[..., None], args: dict, i: int) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.turn == i)
        self.builder.set_grid_idx(*self.programs[i])
        try:
            if self.state[i] != "ending":  # ended before it started
                with numpy.errstate(**self.errstate):  # the launching thread's (per thread in NumPy)
                    fn(**args)
        except _Aborted:
            pass
        except BaseException as exc:  # the launch stops: every other program is ended
            self.errors.append(exc)
        with self.condition:
            self.state[i] = "done"
            self._next()

    def _next(self) -> None:
        """Give the turn to the first ready program, ending the waiting ones when none is (holding the lock)."""
        ready = [i for i in self.priority if self.state[i] == "ready"]
        waiting = [i for i in self.priority if self.state[i] == "waiting"]
        if (self.errors or self.stuck) and (ready or waiting):
            self.turn = (ready or waiting)[0]
            self.state[self.turn] = "ending"
        elif ready:
            self.turn = ready[0]
        elif waiting:
            self.stuck = [f"program {self.programs[i]} waits forever, polling {self._polled(i)}" for i in waiting]
            self.turn = waiting[0]
            self.state[self.turn] = "ending"
        else:
            self.turn = None
        self.condition.notify_all()

    def _polled(self, i: int) -> str:
        """Where program ``i``'s last access went: argument, offset and kind."""
        access = self.previous[i][0]
        address = int(access.addresses[0])
        span = self.launch.span_of(address)
        return f"argument {span.name} ({span.what}) at byte {address - span.start} ({access.kind})"

    def after(self, access: memory.Access, values: Optional[numpy.ndarray], changed: bool) -> None:
        """A program's access (the running one's): note it; wait when it repeats the previous one unchanged."""
        i = self.turn
        self.steps[i] += 1
        signature = (access.kind, access.addresses.tobytes(), None if values is None else values.tobytes())
        repeated = (access.kind != "load" and not changed and self.previous[i] is not None
                    and self.previous[i][1] == signature)
        self.previous[i] = (access, signature)
        with self.condition:
            if changed:
                self.state = ["ready" if s == "waiting" else s for s in self.state]
            if self.steps[i] > STEP_LIMIT and not self.stuck:
                self.stuck = [f"program {self.programs[i]} made more than {STEP_LIMIT} accesses without finishing "
                              f"(a spin wait never satisfied?), the last on {self._polled(i)}"]
                repeated = True
            if not repeated and not (self.errors or self.stuck):
                return
            self.state[i] = "waiting"
            self._next()
            self.condition.wait_for(lambda: self.turn == i)
            if self.state[i] == "ending":
                raise _Aborted()
            self.state[i] = "ready"
        self.builder.set_grid_idx(*self.programs[i])


# ---------------------------------------------------------------------------------------------------- check


def _run(family: Family, case: Case, schedule: Optional[Schedule]) -> tuple[Any, list[memory.Launch]]:
    """The case's outputs and gradients, and its recorded launches, with the programs run in ``schedule``
    (program order: None)."""
    with alloc.poisoned(), memory.recording(schedule) as launches:
        outputs = run_route(family.run, fresh_case(case))
    return outputs, launches


def verdict(family: Family, case: Case, device: torch.device, seed: int = 0,
            bad: Sequence[list[memory.Launch]] = ()) -> Verdict:
    """The ``races`` check on ``case`` (a route's tiny case): conflicts in program order and in each of
    :data:`SCHEDULES` (shuffled ones seeded by ``seed``), whose outputs must be bitwise program order's; then
    conflicts in program order of the route's bad inputs in device mode, where the kernels read the bad values
    themselves (unsorted ids, say: raising is allowed): ``bad``, the recorded launches of each one's runs (made
    once for this check and the ``bad_input`` and ``memory`` checks by ``kernel_sentinel.rows.run_bad_inputs``)."""
    if device.type != "cpu":
        return Verdict((), f"not run on {device.type}: the kernels run compiled, not under the Triton interpreter "
                           f"(`sentinel verify --device cpu` runs this check; on a GPU `--sanitize` runs "
                           f"compute-sanitizer's racecheck, for shared memory)")
    def checked(launch: memory.Launch) -> list[str]:
        guards = {p.data: p.flag for p in family.publishes if p.kernel == launch.kernel}
        missing = sorted({a for pair in guards.items() for a in pair} - {s.name for s in launch.spans})
        if missing:
            return [f"{launch.kernel}: PUBLISHES names argument(s) {', '.join(missing)}, which this launch of it does "
                    f"not have (its tensor arguments: {', '.join(s.name for s in launch.spans)})"]
        return conflicts(launch, guards)

    want, launches = _run(family, case, None)
    found = {c: c for launch in launches for c in checked(launch)}  # a finding: its line in the report
    if not launches:
        problems = ["this Triton route launched no Triton kernel under the interpreter"] if is_triton_route(
            case.route_id) else []
        return Verdict(tuple(problems), "no Triton launch on this route: nothing to check")
    for name in SCHEDULES:
        try:
            got, again = _run(family, case, Schedule(name, seed))
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, Deadlock) else exc
            found.setdefault(error_text(cause), f"in {name} order: {error_text(cause)}")
            continue
        for line in (c for launch in again for c in checked(launch)):
            found.setdefault(line, f"{line} (in {name} order)")
        for line in differences(got, want):
            found.setdefault(line, f"in {name} order, not bitwise program order's: {line}")
    for launches_of_one in bad:
        for line in (c for launch in launches_of_one for c in checked(launch)):
            found.setdefault(line, f"{line} (a bad input in device mode)")
    found = list(found.values())
    problems = found[:SHOWN] + ([f"... {len(found) - SHOWN} more"] if len(found) > SHOWN else [])
    accesses = sum(len(launch.trace) for launch in launches)
    kernels = ", ".join(sorted({launch.kernel for launch in launches}))
    return Verdict(tuple(problems), f"{accesses} accesses in {len(launches)} launches ({kernels}) of the tiny case "
                                    f"checked for unordered conflicts between programs, in program order and "
                                    f"{', '.join(SCHEDULES)} order, outputs compared bitwise; the bad inputs in "
                                    f"device mode checked for conflicts{_declared(family.publishes)}")


def _declared(publishes: Sequence[Any]) -> str:
    """The summary's words on the declared publish protocols (PUBLISHES), if any."""
    if not publishes:
        return ""
    return "; declared protocols checked: " + ", ".join(f"{p.kernel} reads {p.data} after acquiring {p.flag}"
                                                         for p in publishes)
