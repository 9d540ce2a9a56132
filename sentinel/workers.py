"""``sentinel verify --jobs J``: the selected rows' work in J spawned worker processes.

A row (route, dtype) is split into units: each of its properties alone, and its other checks together (they share
the row's cases and outputs). On a GPU a property's examples are mostly Triton compilations (every new shape
class is a new specialisation), the longest work of a row. Units are handed out one at a time, row after row
(so rows finish, and are logged, in order); the parent assembles each row in the check order of one process,
so the results and the record are those of one process (timings aside). The processes are spawned (CUDA cannot
be forked) and share Triton's on-disk kernel cache: a specialisation one of them compiled, the others load.

``--devices`` pins each worker to one GPU: the parent hands every process a GPU index as it starts (in turn from
:func:`slots`, ``ceil(J / N)`` processes per GPU), and the worker makes it current (``torch.cuda.set_device``)
before any CUDA work. The run's device stays ``cuda`` without an index, so cases are built on the current device and
the results are those of a one-GPU run (only a failing ``devices`` check names the GPUs it compared). Every worker
sees every GPU (no per-process ``CUDA_VISIBLE_DEVICES``): the ``devices`` check needs a second GPU in each worker,
and one pool with a GPU per process keeps the dynamic hand-out of units. Each unit's result comes back with its GPU
and wall time, summed into each GPU's :class:`Share`. With one worker in all, the rows run in this process
(:func:`verify_here`), its GPU made current. ``--sanitize``'s compute-sanitizer processes run in as many threads as
there are workers, each on a GPU of :func:`slots` (:func:`sanitize_on`).

Families are looked up by name in the workers (:func:`kernel_sentinel.registry.family`, with the parent's
environment, so ``SENTINEL_FAMILY_PATH`` families work too; a family built only in the parent process does not),
each once per worker (:func:`_family`).

A unit still running after ``STALL_SECONDS`` prints, once, which unit it is and its Python stack to stderr (a
GPU session found a single Triton compilation taking minutes that way); it keeps running.

A unit that cannot finish, because it raised outside the checks' own error handling or its worker process died
(a crash, not a failing check; every unit still queued then fails the same way), fails what it stood for: its
property, or each of the row's other checks, with the reason. The rest of the row keeps its results.
"""
from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Optional, Sequence

import torch

from kernel_sentinel import profile, report, rows
from kernel_sentinel.checks import Measurement
from kernel_sentinel.family import Family
from kernel_sentinel.generic import error_text
from kernel_sentinel.records import CheckResult, RouteResult
from kernel_sentinel.rows import INTERPRETER_WARNINGS, Options, RouteRun, dtype_name, verify_route

OTHER_CHECKS = -1  # the unit of a row's checks other than properties; a unit i >= 0 is its i-th property
STALL_SECONDS = 180.0  # a unit running longer prints its stack once (module docstring)
Outcome = tuple[Optional[str], list[Measurement], float]  # a property unit's result: note, comparisons, seconds
Gpu = Optional[int]  # the CUDA device index a worker is pinned to; None: not pinned (the run's device)

_options: Optional[Options] = None  # in a worker process: the parent's options
_gpu: Gpu = None  # in a worker process: its GPU
_measured: Any = None  # in a worker process of ``verify --coverage``: its kernel_sentinel.coverage.Measurement
_marks: Optional[str] = None  # in a pool's worker process: where it marks the unit it runs
_finished: Callable[[CheckResult], None] = lambda result: None  # in a unit's own process: sends each check's result
_families: dict[str, Family] = {}  # in a worker process: the families its units ran, loaded once (_family)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def slots(jobs: int, gpus: Sequence[int], units: int) -> list[Gpu]:
    """The GPU of each worker process, one entry per process: ``jobs`` unpinned ones without ``gpus``, else
    ``ceil(jobs / len(gpus))`` per GPU (at least one each), the GPUs in turn; never more processes than ``units``
    (at least one)."""
    if not gpus:
        return [None] * max(1, min(jobs, units))
    per_gpu = max(1, math.ceil(jobs / len(gpus)))
    return [gpus[i % len(gpus)] for i in range(per_gpu * len(gpus))][:max(1, units)]


@dataclasses.dataclass
class Share:
    """What one GPU (or the run's device, ``gpu`` None) did: its worker processes, the units of work it ran and
    their wall time summed, and the routes it ran under compute-sanitizer with their time."""

    gpu: Gpu
    processes: int = 0
    units: int = 0
    seconds: float = 0.0
    sanitized: int = 0
    sanitize_seconds: float = 0.0

    def as_dict(self, device: torch.device) -> dict[str, Any]:
        """The share as the JSON report holds it: ``device`` (``cuda:1``, or the run's device), its GPU model
        (``name``), and the counts and seconds (rounded to 0.01 s)."""
        where = device if self.gpu is None else torch.device("cuda", self.gpu)
        name = torch.cuda.get_device_name(where) if where.type == "cuda" else "CPU (Triton interpreter)"
        return {"device": str(where), "name": name, "processes": self.processes, "units": self.units,
                "seconds": round(self.seconds, 2), "sanitized": self.sanitized,
                "sanitize_seconds": round(self.sanitize_seconds, 2)}


def shares(workers: Sequence[Gpu]) -> dict[Gpu, Share]:
    """An empty :class:`Share` per GPU of ``workers`` (:func:`slots`), with its process count."""
    return {gpu: Share(gpu, processes=workers.count(gpu)) for gpu in dict.fromkeys(workers)}


def _pin(gpu: Gpu) -> None:
    """Make ``gpu`` the current CUDA device of this process (nothing when None)."""
    if gpu is not None:
        torch.cuda.set_device(gpu)


def _start(options: Options, threads: int, gpus: Any, coverage_roots: Optional[Sequence[Any]] = None,
           marks: Optional[str] = None) -> None:
    """Start a worker process: the parent's device (on the CPU the Triton interpreter switch, before any kernel
    module is imported), the next GPU of the queue ``gpus`` made current, options, and ``threads`` CPU threads for
    torch (the workers share the CPUs). With ``coverage_roots`` (``verify --coverage``) it measures the lines run
    under them from here on, before any kernel module is imported. With ``marks`` (a directory), each unit is
    marked there while it runs (:func:`_run_unit`)."""
    global _options, _gpu, _measured, _marks
    from kernel_sentinel import coverage, device

    if coverage_roots is not None:
        _measured = coverage.Measurement(coverage_roots)
        _measured.start()
    device.prepare(options.device.type)
    _gpu = gpus.get()
    _pin(_gpu)
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", **INTERPRETER_WARNINGS)
    _options, _marks = options, marks


def _other_checks(options: Options) -> Options:
    return dataclasses.replace(options, checks=tuple(c for c in options.checks if c != "properties"))


def _report_stall(route_id: str, dtype: str, unit: int, thread: int) -> None:
    """Print which unit has been running for ``STALL_SECONDS`` and the stack of the thread running it."""
    what = "its checks other than properties" if unit == OTHER_CHECKS else f"property {unit + 1}"
    frame = sys._current_frames().get(thread)
    stack = "".join(traceback.format_stack(frame)) if frame is not None else "(the unit has just finished)\n"
    print(f"still running after {STALL_SECONDS:g} s: {route_id} {dtype}, {what}; its stack:\n{stack}",
          file=sys.stderr, end="", flush=True)


def _run_unit(family_name: str, route_id: str, dtype: str,
              unit: int) -> tuple[RouteResult | Outcome, Gpu, float, Optional[dict[str, list[int]]], profile.Counts]:
    """In a worker: the row's other checks (a :class:`RouteResult`) or its property ``unit`` (an outcome), with
    the worker's GPU, the unit's wall time, under ``--coverage`` the lines this worker has run so far, and under
    ``--profile`` the unit's counts (:func:`kernel_sentinel.profile.take`)."""
    watch = threading.Timer(STALL_SECONDS, _report_stall, (route_id, dtype, unit, threading.get_ident()))
    watch.daemon = True
    watch.start()
    mark = None if _marks is None else os.path.join(_marks, str(os.getpid()))
    if mark is not None:
        with open(mark, "w") as file:
            file.write(_mark(family_name, route_id, dtype, unit))
    start = time.perf_counter()
    try:
        result = _unit_result(family_name, route_id, dtype, unit)
        lines = None if _measured is None else _measured.executed()
        return result, _gpu, time.perf_counter() - start, lines, profile.take()
    finally:
        watch.cancel()
        if mark is not None:
            os.unlink(mark)


def _family(name: str) -> Family:
    """The registered family ``name``, loaded at a worker's first unit of it: loading finds every registration and
    parses the test files its invariants name, about half a second each time."""
    from kernel_sentinel import registry

    if name not in _families:
        _families[name] = registry.family(name)
    return _families[name]


def _unit_result(family_name: str, route_id: str, dtype: str, unit: int) -> RouteResult | Outcome:
    family, torch_dtype = _family(family_name), getattr(torch, dtype)
    if unit == OTHER_CHECKS:
        return verify_route(family, route_id, _other_checks(_options), dtype=torch_dtype, finished=_finished)
    run = RouteRun(family, route_id, _options, torch_dtype)
    start = time.perf_counter()
    with rows.profiled(_options, (family_name, route_id, dtype, "properties")):
        note, measured = rows.property_outcome(run, rows.route_properties(run)[unit])
    return note, measured, time.perf_counter() - start


@dataclasses.dataclass
class _Row:
    family: Family
    route_id: str
    dtype: torch.dtype
    properties: int  # property units
    other: Optional[RouteResult] = None
    outcomes: dict[int, Outcome] = dataclasses.field(default_factory=dict)
    logged: bool = False  # its line was printed

    def done(self) -> bool:
        return self.other is not None and len(self.outcomes) == self.properties

    def record(self, unit: int, value: RouteResult | Outcome) -> None:
        if unit == OTHER_CHECKS:
            self.other = value
        else:
            self.outcomes[unit] = value

    def failed(self, unit: int, why: str, options: Options) -> RouteResult | Outcome:
        """What ``unit`` stands for, failed with ``why``."""
        if unit != OTHER_CHECKS:
            return f"property {unit + 1} of this route could not run: {why}", [], 0.0
        repro = options.repro(self.family.name, self.route_id, self.dtype)
        return RouteResult(self.route_id, self.family.name, tuple(
            CheckResult(name, False, why, repro) for name in _other_checks(options).checks), dtype_name(self.dtype))

    def result(self, options: Options) -> RouteResult:
        """The row as one process gives it (checks in ``options.checks`` order)."""
        checks = {c.name: c for c in self.other.checks}
        if "properties" in options.checks:
            run = RouteRun(self.family, self.route_id, options, self.dtype)
            outcomes = [self.outcomes[i] for i in range(self.properties)]
            repro = options.repro(self.family.name, self.route_id, self.dtype)
            checks["properties"] = dataclasses.replace(
                rows.properties_result(run, [(note, measured) for note, measured, _ in outcomes], repro),
                seconds=sum(seconds for *_, seconds in outcomes))
        return RouteResult(self.route_id, self.family.name, tuple(checks[c] for c in options.checks),
                           dtype_name(self.dtype))


def _rows(selected: Sequence[tuple[Family, str, torch.dtype]], options: Options) -> list[_Row]:
    return [_Row(family, route_id, dtype, len(rows.route_properties(RouteRun(family, route_id, options, dtype)))
                 if "properties" in options.checks else 0) for family, route_id, dtype in selected]


def unit_count(selected: Sequence[tuple[Family, str, torch.dtype]], options: Options) -> int:
    """How many units the selected rows split into (see the module docstring)."""
    return sum(row.properties + 1 for row in _rows(selected, options))


def verify_in_processes(selected: Sequence[tuple[Family, str, torch.dtype]], options: Options,
                        workers: Sequence[Gpu], done: dict[Gpu, Share],
                        measurement: Any = None) -> list[RouteResult]:
    """:func:`kernel_sentinel.rows.verify_route` for each selected ``(family, route id, dtype)``, its work spread
    over one spawned worker process per entry of ``workers`` (:func:`slots`: the GPU each is pinned to), at most
    one per unit; results in the order of ``selected``. Each GPU's units and their time are added to ``done``.
    With a ``measurement`` (:class:`kernel_sentinel.coverage.Measurement`, ``--coverage``) every worker measures
    the lines under its roots, and each unit's lines are added to it.

    A worker that dies (a crash in compiled code, not a failing check) breaks the pool: the units then running
    (each worker marks the unit it runs) run again, each in a process of its own (:func:`_alone`), so that the one
    that crashes fails alone with its exit code and last output lines; the units not yet started go to a new pool."""
    pending = _rows(selected, options)
    units = [(i, u) for i, row in enumerate(pending) for u in (*range(row.properties), OTHER_CHECKS)]
    workers = list(workers)[:len(units)]
    threads = max(1, usable_cpus() // len(workers))
    roots = measurement and measurement.roots
    finished = 0
    where = f" on {len(set(workers))} GPUs" if workers[0] is not None else ""

    def record(i: int, unit: int, value: RouteResult | Outcome, progress: Any, task: Any) -> None:
        nonlocal finished
        row = pending[i]
        row.record(unit, value)
        progress.update(task, advance=1, description=f"{row.route_id} {dtype_name(row.dtype)}")
        if row.done() and not row.logged:
            finished, row.logged = finished + 1, True
            report.log_row(row.result(options), finished, len(pending))

    def counted(answer: tuple) -> RouteResult | Outcome:
        value, gpu, seconds, lines, counts = answer
        if measurement is not None and lines is not None:
            measurement.add(lines)
        profile.add(counts)
        done[gpu].units, done[gpu].seconds = done[gpu].units + 1, done[gpu].seconds + seconds
        return value

    with report.progress_bar() as progress, tempfile.TemporaryDirectory(prefix="sentinel-marks-") as marks:
        task = progress.add_task(f"verify, {len(workers)} processes{where}", total=len(units))
        remaining = units
        while remaining:
            unfinished = _pool_round(remaining, pending, options, workers, threads, roots, marks,
                                     lambda i, u, answer: record(i, u, counted(answer), progress, task),
                                     lambda i, u, why: record(i, u, pending[i].failed(u, why, options),
                                                              progress, task))
            if not unfinished:
                break
            running = _marked(marks, unfinished, pending) or unfinished  # no mark: the workers died before any unit
            with ThreadPoolExecutor(len(workers)) as alone:
                answers = {alone.submit(_alone, pending[i], u, options, workers[n % len(workers)], threads, roots):
                           (i, u) for n, (i, u) in enumerate(running)}
                for future in as_completed(answers):
                    record(*answers[future], counted(future.result()), progress, task)
            remaining = [unit for unit in unfinished if unit not in running]
    return [row.result(options) for row in pending]


def _pool_round(units: Sequence[tuple[int, int]], pending: Sequence["_Row"], options: Options,
                workers: Sequence[Gpu], threads: int, roots: Any, marks: str,
                answered: Callable[[int, int, tuple], None],
                failed: Callable[[int, int, str], None]) -> list[tuple[int, int]]:
    """Run ``units`` in one pool of ``workers``; each answer goes to ``answered`` (a unit that raised outside the
    checks to ``failed``); return the units left unfinished by a worker's death (none when no worker died)."""
    context = multiprocessing.get_context("spawn")
    gpus = context.Queue()
    for gpu in workers:
        gpus.put(gpu)
    pool = ProcessPoolExecutor(len(workers), mp_context=context, initializer=_start,
                               initargs=(options, threads, gpus, roots, marks))
    unfinished = []
    try:
        futures = {pool.submit(_run_unit, pending[i].family.name, pending[i].route_id, dtype_name(pending[i].dtype),
                               u): (i, u) for i, u in units}
        for future in as_completed(futures):
            i, unit = futures[future]
            try:
                answer = future.result()
            except BrokenProcessPool:
                unfinished.append((i, unit))
            except Exception as exc:  # outside the checks' own handling, e.g. a result that cannot be sent back
                failed(i, unit, f"its --jobs worker raised {error_text(exc)}")
            else:
                answered(i, unit, answer)
    except BaseException:  # e.g. Ctrl-C: do not wait for the queued units
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=not unfinished, cancel_futures=True)
    return sorted(unfinished, key=units.index)


def _mark(family_name: str, route_id: str, dtype: str, unit: int) -> str:
    return f"{family_name} {route_id} {dtype} {unit}"


def _marked(marks: str, unfinished: Sequence[tuple[int, int]],
            pending: Sequence["_Row"]) -> list[tuple[int, int]]:
    """The units of ``unfinished`` that a worker had started when the pool broke (their marks, then cleared)."""
    started = set()
    for name in os.listdir(marks):
        with open(os.path.join(marks, name)) as file:
            started.add(file.read())
        os.unlink(os.path.join(marks, name))
    return [(i, u) for i, u in unfinished
            if _mark(pending[i].family.name, pending[i].route_id, dtype_name(pending[i].dtype), u) in started]


class _OneGpu:
    """The GPU queue of :func:`_start` for a process of its own: always ``gpu``."""

    def __init__(self, gpu: Gpu):
        self.gpu = gpu

    def get(self) -> Gpu:
        return self.gpu


def _alone_child(conn: Any, log: str, options: Options, gpu: Gpu, threads: int, roots: Any,
                 unit: tuple[str, str, str, int]) -> None:
    """In a process of its own: its output to ``log``, then the unit, whose result (or error) goes to ``conn``, each
    check's result as it finishes first."""
    global _finished
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    _finished = lambda result: conn.send(("check", result))  # noqa: E731
    try:
        _start(options, threads, _OneGpu(gpu), roots)
        conn.send(("result", _run_unit(*unit)))
    except BaseException as exc:  # noqa: BLE001 - reported as the unit's failure
        conn.send(("error", error_text(exc)))


def _alone(row: "_Row", unit: int, options: Options, gpu: Gpu, threads: int,
           roots: Any) -> tuple[RouteResult | Outcome, Gpu, float, Optional[dict[str, list[int]]], profile.Counts]:
    """``unit`` of ``row`` run in a spawned process of its own (after a worker died with it among the unfinished
    ones): its result, or the unit failed with the process's exit code and the last lines of its output. For the
    row's other checks, the checks that finished before the crash keep their results, the one that crashed fails,
    and the ones after it run again in a process of their own."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    start = time.perf_counter()
    finished: list[CheckResult] = []
    with tempfile.TemporaryDirectory(prefix="sentinel-unit-") as tmp:
        log = os.path.join(tmp, "output.txt")
        process = context.Process(target=_alone_child, args=(send, log, options, gpu, threads, roots,
                                                              (row.family.name, row.route_id, dtype_name(row.dtype),
                                                               unit)))
        process.start()
        send.close()
        kind, payload = "died", None
        try:
            while kind == "died":
                message, value = receive.recv()
                if message == "check":
                    finished.append(value)
                else:
                    kind, payload = message, value
        except EOFError:  # it died before answering
            pass
        process.join()
        tail = _last_lines(log)
    seconds = time.perf_counter() - start
    if kind == "result":
        return payload
    if kind == "error":
        why = f"its worker process raised {payload}"
    else:
        code = process.exitcode
        name = f" ({signal.Signals(-code).name})" if code is not None and code < 0 else ""
        why = f"its worker process died (exit code {code}{name}), the last lines of its output: {tail or '(none)'}"
    if unit != OTHER_CHECKS or kind == "error":
        return row.failed(unit, why, options), gpu, seconds, None, {}
    order = _other_checks(options).checks
    crashed = order[len(finished)]
    repro = options.repro(row.family.name, row.route_id, row.dtype)
    checks = [*finished, CheckResult(crashed, False, why, repro)]
    rest = order[len(finished) + 1:]
    if rest:  # the checks after the one that crashed, in a process of their own
        value, _, more, _, _ = _alone(row, unit, dataclasses.replace(options, checks=rest), gpu, threads, roots)
        checks += value.checks
        seconds += more
    return RouteResult(row.route_id, row.family.name, tuple(checks), dtype_name(row.dtype)), gpu, seconds, None, {}


def _last_lines(path: str, lines: int = 3) -> str:
    """The last ``lines`` non-empty lines of the file at ``path``, joined with `` | ``."""
    try:
        with open(path, errors="replace") as file:
            kept = [line.strip() for line in file if line.strip()][-lines:]
    except OSError:
        return ""
    return " | ".join(kept)


def verify_here(selected: Sequence[tuple[Family, str, torch.dtype]], options: Options, gpu: Gpu,
                done: dict[Gpu, Share]) -> list[RouteResult]:
    """:func:`kernel_sentinel.rows.verify_route` for each selected row in this process, ``gpu`` made current
    first; its units and their time are added to ``done``."""
    _pin(gpu)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", **INTERPRETER_WARNINGS)
        results = report.run_with_progress(selected, options, verify_route, options.checks)
    done[gpu].units += unit_count(selected, options)
    done[gpu].seconds += time.perf_counter() - start
    return results


def sanitize_on(results: Sequence[RouteResult], sanitize: Callable[[RouteResult, Gpu], RouteResult],
                workers: Sequence[Gpu], done: dict[Gpu, Share]) -> list[RouteResult]:
    """``sanitize(result, gpu)`` (the result with its compute-sanitizer checks, or the result itself for a route
    without them) for each result, in one thread per entry of ``workers``, each job on a GPU no other thread holds
    more often than ``workers`` lists it; results in order. Each sanitized route and its time are added to its
    GPU's share in ``done``."""
    free: queue.Queue = queue.Queue()
    for gpu in workers:
        free.put(gpu)
    lock = threading.Lock()

    def one(item: RouteResult) -> RouteResult:
        gpu = free.get()
        start = time.perf_counter()
        try:
            result = sanitize(item, gpu)
        finally:
            free.put(gpu)
        if result is not item:
            with lock:
                done[gpu].sanitized += 1
                done[gpu].sanitize_seconds += time.perf_counter() - start
        return result

    with ThreadPoolExecutor(len(workers)) as pool:
        return list(pool.map(one, results))


def print_shares(spread: dict[str, Any]) -> None:
    """The table of each GPU's share of a ``--devices`` run (the JSON report's ``devices``: :class:`Share` as a
    dict per GPU, and the run's wall time), so that a run's scaling with the number of GPUs can be read off."""
    from rich.table import Table

    from kernel_sentinel import console

    table = Table(title=f"per GPU (wall time {spread['wall_seconds']:.1f} s)")
    for column in ("device", "GPU", "processes", "units", "busy (s)", "sanitized", "sanitizer (s)"):
        table.add_column(column, justify="left" if column in ("device", "GPU") else "right")
    for share in spread["shares"]:
        table.add_row(share["device"], share["name"], str(share["processes"]), str(share["units"]),
                      f"{share['seconds']:.1f}", str(share["sanitized"]), f"{share['sanitize_seconds']:.1f}")
    console.out.print(table)
