"""``sentinel verify --jobs J``: the selected rows' work in J spawned worker processes.

A row (route, dtype) is split into units: each of its properties alone, and its other checks together (they share
the row's cases and outputs). On a GPU a property's examples are mostly Triton compilations (every new shape
class is a new specialisation), the longest work of a row. Units are handed out one at a time, row after row
(so rows finish, and are logged, in order); the parent assembles each row in the check order of one process,
so the results and the record are those of one process (timings aside). The processes are spawned (CUDA cannot
be forked) and share Triton's on-disk kernel cache: a specialisation one of them compiled, the others load.

Families are looked up by name in the workers (:func:`kernel_sentinel.registry.family`, with the parent's
environment, so ``SENTINEL_FAMILY_PATH`` families work too; a family built only in the parent process does not).

A unit still running after ``STALL_SECONDS`` prints, once, which unit it is and its Python stack to stderr (a
GPU session found a single Triton compilation taking minutes that way); it keeps running.

A unit that cannot finish, because it raised outside the checks' own error handling or its worker process died
(a crash, not a failing check; every unit still queued then fails the same way), fails what it stood for: its
property, or each of the row's other checks, with the reason. The rest of the row keeps its results.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import sys
import threading
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Optional, Sequence

import torch

from kernel_sentinel import report, verify
from kernel_sentinel.checks import Measurement
from kernel_sentinel.family import Family
from kernel_sentinel.records import CheckResult, RouteResult
from kernel_sentinel.verify import Options, RouteRun, dtype_name

OTHER_CHECKS = -1  # the unit of a row's checks other than properties; a unit i >= 0 is its i-th property
STALL_SECONDS = 180.0  # a unit running longer prints its stack once (module docstring)
Outcome = tuple[Optional[str], list[Measurement], float]  # a property unit's result: note, comparisons, seconds

_options: Optional[Options] = None  # in a worker process: the parent's options


def _start(options: Options, threads: int) -> None:
    """Start a worker process: the parent's device (on the CPU the Triton interpreter switch, before any kernel
    module is imported), options, and ``threads`` CPU threads for torch (the workers share the CPUs)."""
    global _options
    from kernel_sentinel import device

    device.prepare(options.device.type)
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", **verify.INTERPRETER_WARNINGS)
    _options = options


def _other_checks(options: Options) -> Options:
    return dataclasses.replace(options, checks=tuple(c for c in options.checks if c != "properties"))


def _report_stall(route_id: str, dtype: str, unit: int, thread: int) -> None:
    """Print which unit has been running for ``STALL_SECONDS`` and the stack of the thread running it."""
    what = "its checks other than properties" if unit == OTHER_CHECKS else f"property {unit + 1}"
    frame = sys._current_frames().get(thread)
    stack = "".join(traceback.format_stack(frame)) if frame is not None else "(the unit has just finished)\n"
    print(f"still running after {STALL_SECONDS:g} s: {route_id} {dtype}, {what}; its stack:\n{stack}",
          file=sys.stderr, end="", flush=True)


def _run_unit(family_name: str, route_id: str, dtype: str, unit: int) -> RouteResult | Outcome:
    """In a worker: the row's other checks (a :class:`RouteResult`) or its property ``unit`` (an outcome)."""
    watch = threading.Timer(STALL_SECONDS, _report_stall, (route_id, dtype, unit, threading.get_ident()))
    watch.daemon = True
    watch.start()
    try:
        return _unit_result(family_name, route_id, dtype, unit)
    finally:
        watch.cancel()


def _unit_result(family_name: str, route_id: str, dtype: str, unit: int) -> RouteResult | Outcome:
    from kernel_sentinel import registry

    family, torch_dtype = registry.family(family_name), getattr(torch, dtype)
    if unit == OTHER_CHECKS:
        return verify.verify_route(family, route_id, _other_checks(_options), dtype=torch_dtype)
    run = RouteRun(family, route_id, _options, torch_dtype)
    start = time.perf_counter()
    note, measured = verify.property_outcome(run, verify.route_properties(run)[unit])
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
                verify.properties_result(run, [(note, measured) for note, measured, _ in outcomes], repro),
                seconds=sum(seconds for *_, seconds in outcomes))
        return RouteResult(self.route_id, self.family.name, tuple(checks[c] for c in options.checks),
                           dtype_name(self.dtype))


def _rows(selected: Sequence[tuple[Family, str, torch.dtype]], options: Options) -> list[_Row]:
    return [_Row(family, route_id, dtype, len(verify.route_properties(RouteRun(family, route_id, options, dtype)))
                 if "properties" in options.checks else 0) for family, route_id, dtype in selected]


def unit_count(selected: Sequence[tuple[Family, str, torch.dtype]], options: Options) -> int:
    """How many units the selected rows split into (see the module docstring)."""
    return sum(row.properties + 1 for row in _rows(selected, options))


def verify_in_processes(selected: Sequence[tuple[Family, str, torch.dtype]], options: Options,
                        jobs: int) -> list[RouteResult]:
    """:func:`kernel_sentinel.verify.verify_route` for each selected ``(family, route id, dtype)``, its work
    spread over ``jobs`` worker processes (at most one per unit); results in the order of ``selected``."""
    rows = _rows(selected, options)
    units = [(i, u) for i, row in enumerate(rows) for u in (*range(row.properties), OTHER_CHECKS)]
    jobs = min(jobs, len(units))
    threads = max(1, verify.usable_cpus() // jobs)
    finished = 0
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                               initargs=(options, threads))
    try:
        with report.progress_bar() as progress:
            task = progress.add_task(f"verify, {jobs} processes", total=len(units))
            futures = {pool.submit(_run_unit, rows[i].family.name, rows[i].route_id, dtype_name(rows[i].dtype), u):
                       (i, u) for i, u in units}
            for future in as_completed(futures):
                i, unit = futures[future]
                row = rows[i]
                try:
                    row.record(unit, future.result())
                except BrokenProcessPool as exc:
                    row.record(unit, row.failed(unit, f"its --jobs worker process died ({exc}); rerun with --jobs 1",
                                                options))
                except Exception as exc:  # outside the checks' own handling, e.g. a result that cannot be sent back
                    row.record(unit, row.failed(unit, f"its --jobs worker raised {verify.error_text(exc)}", options))
                progress.update(task, advance=1, description=f"{row.route_id} {dtype_name(row.dtype)}")
                if row.done() and not row.logged:
                    finished, row.logged = finished + 1, True
                    report.log_row(row.result(options), finished, len(rows))
    except BaseException:  # e.g. Ctrl-C: do not wait for the queued units
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [row.result(options) for row in rows]
