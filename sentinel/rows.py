"""Verifying one row: a route at one input dtype, every check of :data:`CHECKS` (each described in
:mod:`kernel_sentinel.verify`, the command that runs them).

:class:`Options` says how (device, seed, examples, quick mode, which checks, the GPUs of the run);
:class:`RouteRun` builds the row's cases and runs them once per size; :func:`verify_route` runs every check, an
exception inside one failing that check only. :mod:`kernel_sentinel.verify` and the worker processes of
:mod:`kernel_sentinel.workers` both call it; this module imports neither.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from kernel_sentinel import crossdevice, memory, opcheck, profile, races
from provable_kernels import alloc
from provable_kernels.validate import value_checks
from kernel_sentinel.checks import Measurement, compare_outputs, measuring, non_finite, run_route
from kernel_sentinel.family import Adversarial, BadInput, Case, Family, Outputs, Property, matches
from kernel_sentinel.generic import GENERIC_CHECKS, Probe, differences, error_text, fresh_case
from kernel_sentinel.invariance import batch_invariance
from kernel_sentinel.observed import in_child, observe
from kernel_sentinel.records import CheckResult, RouteResult

CHECKS = ("route", "reference", "exact", "properties", "guards", "bad_input") + GENERIC_CHECKS + ("observed", "batch")
CHECKS += ("memory", "races", "opcheck", "devices")
GENERIC_SIZES = {"layouts": "tiny"}  # the size each generic check asks for (default: small)
DEFAULT_EXAMPLES = 12
QUICK_EXAMPLES = 2


@dataclass(frozen=True)
class Options:
    """How to verify: device, seed (inputs and hypothesis), examples per property, quick mode (tiny sizes),
    which checks to run (all of them, unless a test or a debugging session narrows it), the CUDA device indices
    the run spreads over (``--devices``; empty: the current device only) and whether each check counts its Triton
    launches and CPU time (``--profile``: :mod:`kernel_sentinel.profile`). ``device`` is ``cuda`` without an index
    on a GPU: cases are built on the current device, the one a ``--devices`` worker is pinned to."""

    device: torch.device
    seed: int = 0
    examples: int = DEFAULT_EXAMPLES
    quick: bool = False
    checks: tuple[str, ...] = CHECKS
    gpus: tuple[int, ...] = ()
    profile: bool = False

    def size(self, wanted: str) -> str:
        """The case size to use where ``wanted`` is asked for (``--quick`` runs everything at ``tiny``)."""
        return "tiny" if self.quick else wanted

    def repro(self, family: str, route_id: str, dtype: torch.dtype) -> str:
        """The command that reruns exactly this route's checks at ``dtype``."""
        quick = " --quick" if self.quick else ""
        return (f"sentinel verify --family {family} --route {route_id} --device {self.device.type} "
                f"--seed {self.seed} --examples {self.examples}{quick} --dtype {dtype_name(dtype)}")


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


class RouteRun:
    """One route at one dtype: its cases and outputs, each built and run once per size (a failure is kept and
    re-raised)."""

    def __init__(self, family: Family, route_id: str, options: Options, dtype: torch.dtype):
        self.family, self.route_id, self.options, self.dtype = family, route_id, options, dtype
        memory.install()  # every check's interpreted launches stay inside their arguments (memory.py)
        self.tolerance = family.tolerance(dtype)
        self._cases: dict[str, Case] = {}
        self._outputs: dict[str, Any] = {}
        self._probes: dict[str, Probe] = {}
        self._bad_input_runs: Optional[BadInputRuns] = None

    def case(self, size: str) -> Case:
        if size not in self._cases:
            self._cases[size] = self.family.make_case(self.route_id, size=size, dtype=self.dtype,
                                                      device=self.options.device, seed=self.options.seed)
        return self._cases[size]

    def outputs(self, size: str) -> Outputs:
        """The outputs of the case of ``size``: those of its probe's baseline run (one run serves every check)."""
        if size not in self._outputs:
            try:
                self._outputs[size] = self.probe(size).baseline()[2]
            except Exception as exc:  # kept: every later check on this size reports the same failure
                self._outputs[size] = exc
        result = self._outputs[size]
        if isinstance(result, Exception):
            raise result
        return result

    def bad_input_runs(self) -> "BadInputRuns":
        """The route's bad inputs run in device mode under the interpreter, once for the ``bad_input``, ``memory``
        and ``races`` checks (:func:`run_bad_inputs`); on a GPU none (nothing runs interpreted there)."""
        if self._bad_input_runs is None:
            interpreted = self.options.device.type == "cpu"
            self._bad_input_runs = run_bad_inputs(self) if interpreted else BadInputRuns([], [], None)
        return self._bad_input_runs

    def probe(self, size: str) -> Probe:
        """The generic checks' runs of the case of ``size`` (their shared baseline runs once)."""
        if size not in self._probes:
            self._probes[size] = Probe(self.family, self.case(size), self.tolerance)
        return self._probes[size]


def _errors(measurements: Sequence[Measurement]) -> dict[str, float]:
    """The largest errors over ``measurements`` and the tolerance of the one closest to failing (empty when
    nothing was compared)."""
    if not measurements:
        return {}
    worst = max(measurements, key=lambda m: m.ratio)
    return {"max_abs": max(m.max_abs for m in measurements), "max_rel": max(m.max_rel for m in measurements),
            "atol": worst.atol, "rtol": worst.rtol, "of_tol": worst.ratio}


def _measured(name: str, measurements: Sequence[Measurement], repro: str) -> CheckResult:
    """A check made of comparisons: passes when there is at least one and all pass."""
    failing = [str(m) for m in measurements if not m.ok]
    lines = failing + [str(m) for m in measurements if m.ok]
    passed = bool(measurements) and not failing
    return CheckResult(name, passed, "; ".join(lines) or "nothing was compared", repro, **_errors(measurements))


def _listed(names: Sequence[str]) -> str:
    return f": {', '.join(names)}" if names else ""


def _summarized(name: str, problems: Sequence[str], summary: str, measurements: Sequence[Measurement],
                repro: str) -> CheckResult:
    """A check made of items: passes when no item has a problem; the detail lists problems, then ``summary``."""
    return CheckResult(name, not problems, "; ".join([*problems, summary]), repro, **_errors(measurements))


# ------------------------------------------------------------------------------------------------------ checks


def check_route(run: RouteRun, repro: str) -> CheckResult:
    size = run.options.size("small")
    run.outputs(size)
    return CheckResult("route", True, f"recorded {run.route_id!r} for {run.case(size).description}", repro)


def check_reference(run: RouteRun, repro: str) -> CheckResult:
    case = run.case(run.options.size("small"))
    got = run.outputs(run.options.size("small"))
    want = run.family.reference(case)
    measurements = compare_outputs(got, want, run.tolerance, "float64 reference")
    if run.options.device.type == "cpu":  # the CPU default is host mode; device mode runs the kernels' own checks
        with value_checks("device"):
            got = run_route(run.family.run, fresh_case(case))
        measurements += compare_outputs(got, want, run.tolerance, "float64 reference, device mode")
    return _measured("reference", measurements, repro)


def check_exact(run: RouteRun, repro: str) -> CheckResult:
    oracles = [o for o in run.family.oracles if matches(run.route_id, o.routes)]
    if not oracles:
        return CheckResult("exact", False, "no oracle declared for this route", repro)
    measurements: list[Measurement] = []
    for oracle in oracles:
        size = run.options.size(oracle.size)
        want = oracle.compute(run.case(size))
        measurements += compare_outputs(run.outputs(size), want, run.tolerance, oracle.name)
    return _measured("exact", measurements, repro)


def falsify(prop: Property, route_id: str, options: Options,
            dtype: torch.dtype) -> Optional[tuple[Any, BaseException]]:
    """Run ``prop`` under hypothesis (seeded, shrinking); ``None`` when it holds, else the minimal failing
    example and its error. Each example runs with allocations poisoned (:func:`provable_kernels.alloc.poisoned`:
    fresh workspaces, NaN where nothing is written), so that its outcome does not depend on what earlier runs left
    in memory; a failure that still does not happen again when hypothesis replays the example (hypothesis's
    ``Flaky``) is reported as the failure it was, with the example, the error and that note."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
    from hypothesis.errors import Flaky

    last: dict[str, Any] = {}

    def body(example: Any) -> None:
        last["example"] = example
        with alloc.poisoned():
            prop.check(route_id, example, options.device, dtype)

    try:  # building the strategy can raise too: a failure of this property, like one of its examples
        test = settings(max_examples=options.examples, deadline=None, database=None, verbosity=Verbosity.quiet,
                        phases=(Phase.explicit, Phase.generate, Phase.shrink), report_multiple_bugs=False,
                        suppress_health_check=list(HealthCheck), print_blob=False)(given(prop.example())(body))
        seed(options.seed)(test)()
    except Flaky as exc:  # failed, then passed on the replay: the first failure, with what happened
        first = next(iter(getattr(exc, "exceptions", ())), exc)
        return last.get("example"), StateDependent(f"{error_text(first)} (it failed when first run and passed when "
                                                   f"run again: its outcome depends on state outside the example)")
    except Exception as exc:  # the minimal example is the last one hypothesis ran before re-raising
        return last.get("example"), exc
    return None


class StateDependent(AssertionError):
    """A property's failure that did not happen again on the replay of its example."""


def route_properties(run: RouteRun) -> list[Property]:
    """The family's properties that apply to the run's route at its dtype."""
    return [p for p in run.family.properties if p.runs_at(run.route_id, run.dtype)]


def property_outcome(run: RouteRun, prop: Property) -> tuple[Optional[str], list[Measurement]]:
    """Falsify one property on the run's route: ``(None, comparisons)`` when it holds, else the failure note
    (minimal example and error) in place of None. Seeded by itself, so it gives the same outcome alone (a
    ``--jobs`` worker) as after the route's other properties."""
    torch.manual_seed(run.options.seed)
    with measuring() as measured:
        failure = falsify(prop, run.route_id, run.options, run.dtype)
    if failure is None:
        return None, list(measured)
    example, exc = failure
    return f"property {prop.name!r} fails; minimal example: {example!r}; {error_text(exc)}", list(measured)


def properties_result(run: RouteRun, outcomes: Sequence[tuple[Optional[str], list[Measurement]]],
                      repro: str) -> CheckResult:
    """The ``properties`` check from the outcome of each of :func:`route_properties` (in that order)."""
    props = route_properties(run)
    if not props:
        return CheckResult("properties", False, f"no property declared for this route at {dtype_name(run.dtype)}",
                           repro)
    notes = [note for note, _ in outcomes if note is not None]
    held = [p.name for p, (note, _) in zip(props, outcomes) if note is None]
    measurements = [m for _, measured in outcomes for m in measured]
    summary = f"{len(held)}/{len(props)} properties hold ({run.options.examples} examples each)" + _listed(held)
    return _summarized("properties", notes, summary, measurements, repro)


def check_properties(run: RouteRun, repro: str) -> CheckResult:
    return properties_result(run, [property_outcome(run, p) for p in route_properties(run)], repro)


def check_guards(run: RouteRun, repro: str) -> CheckResult:
    items = [a for a in run.family.adversarial if matches(run.route_id, a.routes)]
    if not items:
        return CheckResult("guards", False, "no adversarial input declared for this route", repro)
    base = run.case("tiny")
    notes, passed, measurements = [], [], []
    for item in items:
        with measuring() as measured:
            problem = _guard_problem(run, item, base)
        measurements += measured
        if problem:
            notes.append(f"{item.name}: {problem}")
        else:
            passed.append(item.name)
    summary = f"{len(passed)}/{len(items)} adversarial inputs handled" + _listed(passed)
    return _summarized("guards", notes, summary, measurements, repro)


def _guard_problem(run: RouteRun, item: Adversarial, base: Case) -> Optional[str]:
    """What went wrong with one adversarial input, or None."""
    case = item.make(base)  # outside the try: an error of the builder is a bug in the declaration, not a pass
    try:
        with value_checks("sync"):  # the named-error contract: on a GPU too, not NaN-poisoned device mode
            outputs = run_route(run.family.run, case)
    except (ValueError, TypeError) as exc:
        return None if item.errors_ok else f"raised {error_text(exc)}"
    except Exception as exc:
        return f"raised {error_text(exc)}"
    bad = non_finite(outputs, item.allow_inf)
    if bad:
        return "; ".join(bad)
    if item.expect is not None:
        try:
            item.expect(case, outputs)
        except AssertionError as exc:
            return str(exc)
    return None


def bad_inputs_of(family: Family, route_id: str) -> list[BadInput]:
    """The family's bad inputs declared for ``route_id``, in declaration order (indexed by the device-mode runs)."""
    return [b for b in family.bad_inputs if matches(route_id, b.routes)]


def check_bad_input(run: RouteRun, repro: str) -> CheckResult:
    items = bad_inputs_of(run.family, run.route_id)
    if not items:
        return CheckResult("bad_input", False, "no bad input declared for this route", repro)
    base = run.case("tiny")
    notes, rejected = [], []
    for index, item in enumerate(items):
        label = f"{item.argument} ({item.what})"
        try:
            with value_checks("sync"):  # named errors on a GPU too (device mode would poison or assert instead)
                run.family.run(item.make(base))
        except (ValueError, TypeError) as exc:
            if not str(exc).startswith(item.argument):
                notes.append(f"{label}: message does not start with {item.argument!r}: {error_text(exc)}")
            else:
                rejected.append(index)
        except Exception as exc:
            notes.append(f"{label}: raised {error_text(exc)}, expected ValueError or TypeError")
        else:
            notes.append(f"{label}: accepted without error")
    poisoned = 0
    for index, (raised, finite, unwritten, broken) in _device_mode_runs(run, base, rejected).items():
        poisoned += not raised
        if broken:
            notes.append(f"{items[index].argument} ({items[index].what}): device mode: {broken}")
        if not raised and finite:
            notes.append(f"{items[index].argument} ({items[index].what}): device mode returned only numbers (a bad "
                         f"value became a silent number)")
        if unwritten:
            notes.append(f"{items[index].argument} ({items[index].what}): device mode left elements unwritten "
                         f"(allocations poisoned two ways give different bits): {'; '.join(unwritten)}")
    summary = (f"{len(items) - len(notes)}/{len(items)} wrong arguments rejected with an error naming them; in "
               f"device mode {poisoned} of them gave non-finite results, the others raised")
    return _summarized("bad_input", notes, summary, (), repro)


# raised, every output finite, the outputs left part unwritten, what the bad input's device_mode found ("": nothing)
DeviceModeRun = tuple[bool, bool, tuple[str, ...], str]


def _device_mode_runs(run: RouteRun, base: Case, indices: Sequence[int]) -> dict[int, DeviceModeRun]:
    """The route's bad inputs ``indices`` (among those declared for it), which the host checks reject, in device
    mode (the CUDA default: nothing read on the host, the kernels check what they read): each must raise (a
    metadata check, an entry point that reads its results on the host anyway, the device assertion of
    ``validate.DataChecks.verify``, or the interpreter refusing the poisoned values) or give NaN or an infinity
    somewhere in the outputs and gradients (the families poison with NaN; an infinite input may also come out
    infinite), never only finite numbers, and write every element of every output (:func:`_device_mode_run`).
    Returns ``{index: DeviceModeRun}``. On a GPU the calls run in a spawned process, since a device assertion ends
    the CUDA context it fires in: after one, a new process goes on with the rest (:func:`_in_turn`)."""
    if run.options.device.type == "cpu":
        return {index: run.bad_input_runs().outcomes[index] for index in indices}
    return _in_turn(lambda pending: in_child(functools.partial(
        _spawned_device_mode_runs, run.family.name, run.route_id, "tiny", str(run.dtype).removeprefix("torch."),
        run.options.device.type, run.options.seed, pending), "spawn"), indices)


def _in_turn(spawn: Callable[[tuple[int, ...]], Any], indices: Sequence[int]) -> dict[int, DeviceModeRun]:
    """The results of ``spawn(pending)`` (a child process's :func:`_spawned_device_mode_runs`, or
    :func:`kernel_sentinel.observed.in_child`'s ``(True, what happened)``) for ``indices``, a new child going on
    after each one that stopped early. A child that died or ran past its time counts as raised at the first of its
    bad inputs; one that raised could not set the route up, which fails the check (it must not pass unchecked)."""
    results: dict[int, tuple[bool, bool]] = {}
    pending = tuple(indices)
    while pending:
        done = spawn(pending)
        if not isinstance(done, list):
            if str(done[1]).startswith("raised"):
                raise RuntimeError(f"the device-mode process could not run the route's bad inputs: {done[1]}")
            done = [(True, False, (), "")]
        results.update(zip(pending, done))
        pending = pending[len(done):]
    return results


def _device_mode_run(family: Family, route_id: str, base: Case, index: int) -> DeviceModeRun:
    """(whether the route raised, whether every output was finite, which outputs have elements no kernel wrote, what
    the bad input's ``device_mode`` expectation found) for its bad input ``index`` in device mode, run twice: with
    allocations poisoned with NaN and with a finite second poison (:func:`provable_kernels.alloc.poisoned`), so
    that an unwritten element, NaN in the first run, differs between them; the expectation sees the second run
    (where an unwritten element is a number)."""
    item = bad_inputs_of(family, route_id)[index]
    runs = []
    try:
        for alternate in (False, True):
            with value_checks("device"), alloc.poisoned(alternate):
                case = item.make(base)
                runs.append(family.run(case))
    except Exception:  # loud, not a silent number
        return True, False, (), ""
    outputs, again = runs
    broken = ""
    if item.device_mode is not None:
        try:
            item.device_mode(case, again)
        except AssertionError as exc:
            broken = str(exc)
    return False, not non_finite(outputs), tuple(differences(again, outputs)), broken


@dataclass
class BadInputRuns:
    """Every bad input declared for a route (on its tiny case) run by :func:`_device_mode_run` under the Triton
    interpreter: each one's :data:`DeviceModeRun`, the launches of its runs (recorded, programs in order), and what
    the memory guard saw of them all (None where the interpreter lacks what the guard watches: the ``memory`` check
    then fails on its own runs)."""

    outcomes: list[DeviceModeRun]
    launches: list[list[memory.Launch]]
    watch: Optional[memory.Watch]


def run_bad_inputs(run: RouteRun) -> BadInputRuns:
    """:class:`BadInputRuns` of ``run``'s route: one device-mode run of each bad input (two allocation poisons)
    serves the ``bad_input`` check (its outcome), the ``memory`` check (every lane inside its arguments, whatever
    the bad values: :func:`kernel_sentinel.memory.watching`) and the ``races`` check (the recorded launches)."""
    base = run.case("tiny")
    outcomes, launches = [], []
    with contextlib.ExitStack() as stack:
        try:
            watch: Optional[memory.Watch] = stack.enter_context(memory.watching())
        except memory.Unavailable:
            watch = None
        for index in range(len(bad_inputs_of(run.family, run.route_id))):
            with memory.recording() as recorded:
                outcomes.append(_device_mode_run(run.family, run.route_id, base, index))
            launches.append(recorded)
    return BadInputRuns(outcomes, launches, watch)


def _spawned_device_mode_runs(family_name: str, route_id: str, size: str, dtype: str, device: str, seed: int,
                              indices: tuple[int, ...]) -> list[DeviceModeRun]:
    """:func:`_device_mode_run` of each of ``indices`` in a spawned process (the family and case rebuilt from their
    names), up to the first after which the CUDA context is unusable (a device assertion): the results so far."""
    from kernel_sentinel import device as devices
    from kernel_sentinel import registry

    devices.prepare(device)
    family = registry.family(family_name)
    base = family.make_case(route_id, size=size, dtype=getattr(torch, dtype), device=torch.device(device), seed=seed)
    results = []
    for index in indices:
        try:
            outcome = _device_mode_run(family, route_id, base, index)
            if device != "cpu":
                torch.cuda.synchronize()  # an asynchronous device assertion raises here
        except Exception:  # the context is gone: this one raised, a new process goes on with the rest
            return [*results, (True, False, (), "")]
        results.append(outcome)
    return results


def generic_check(name: str) -> Callable[[RouteRun, str], CheckResult]:
    """The check ``name`` of :mod:`kernel_sentinel.generic` as a verify check."""
    def check(run: RouteRun, repro: str) -> CheckResult:
        verdict = getattr(run.probe(run.options.size(GENERIC_SIZES.get(name, "small"))), name)()
        return _summarized(name, verdict.problems, verdict.summary, verdict.measurements, repro)

    return check


def check_memory(run: RouteRun, repro: str) -> CheckResult:
    sizes = dict.fromkeys(run.options.size(s) for s in ("tiny", "small"))
    bad = run.bad_input_runs()
    verdict = memory.verdict(run.family, [run.case(s) for s in sizes], run.options.device, bad.watch,
                             len(bad.outcomes))
    return _summarized("memory", verdict.problems, verdict.summary, (), repro)


def check_races(run: RouteRun, repro: str) -> CheckResult:
    verdict = races.verdict(run.family, run.case("tiny"), run.options.device, run.options.seed,
                            run.bad_input_runs().launches)
    return _summarized("races", verdict.problems, verdict.summary, (), repro)


def check_opcheck(run: RouteRun, repro: str) -> CheckResult:
    verdict = opcheck.verdict(run.family, run.case("tiny"))
    return _summarized("opcheck", verdict.problems, verdict.summary, (), repro)


def check_observed(run: RouteRun, repro: str) -> CheckResult:
    size = "small"  # --quick too: at tiny sizes a kernel may have nothing to do (segment's long segments)
    verdict = observe(run.family, run.case(size), size=size, dtype=run.dtype, seed=run.options.seed,
                      kernels=run.probe(size).kernels())
    return _summarized("observed", verdict.problems, verdict.summary, (), repro)


def check_devices(run: RouteRun, repro: str) -> CheckResult:
    verdict = crossdevice.check(run.probe(run.options.size("small")), run.options.device, run.options.gpus)
    return _summarized("devices", verdict.problems, verdict.summary, (), repro)


def check_batch(run: RouteRun, repro: str) -> CheckResult:
    verdict = batch_invariance(run.family, run.route_id, dtype=run.dtype, device=run.options.device,
                               seed=run.options.seed)
    return _summarized("batch", verdict.problems, verdict.summary, (), repro)


CHECK_FUNCTIONS: dict[str, Callable[[RouteRun, str], CheckResult]] = {
    "route": check_route,
    "reference": check_reference,
    "exact": check_exact,
    "properties": check_properties,
    "guards": check_guards,
    "bad_input": check_bad_input,
    **{name: generic_check(name) for name in GENERIC_CHECKS},
    "observed": check_observed,
    "batch": check_batch,
    "memory": check_memory,
    "races": check_races,
    "opcheck": check_opcheck,
    "devices": check_devices,
}


def profiled(options: Options, key: profile.Key) -> contextlib.AbstractContextManager:
    """:func:`kernel_sentinel.profile.counting` under ``key`` with ``--profile``, else nothing."""
    return profile.counting(key) if options.profile else contextlib.nullcontext()


def verify_route(family: Family, route_id: str, options: Options,
                 progress: Callable[[str], None] = lambda check: None,
                 dtype: Optional[torch.dtype] = None,
                 finished: Callable[[CheckResult], None] = lambda result: None) -> RouteResult:
    """Every check of one route at ``dtype`` (default: the family's first dtype); an exception inside a check
    fails that check only. ``progress(name)`` is called before each check, ``finished(result)`` after it."""
    dtype = family.dtypes[0] if dtype is None else dtype
    run = RouteRun(family, route_id, options, dtype)
    repro = options.repro(family.name, route_id, dtype)
    checks = []
    for name in options.checks:
        progress(name)
        torch.manual_seed(options.seed)
        start = time.perf_counter()
        try:
            with profiled(options, (family.name, route_id, dtype_name(dtype), name)):
                result = CHECK_FUNCTIONS[name](run, repro)
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{error_text(exc)} (at {Path(where.filename).name}:{where.lineno})"
            result = CheckResult(name, False, detail, repro)
        checks.append(dataclasses.replace(result, seconds=time.perf_counter() - start))
        finished(checks[-1])
    return RouteResult(route_id, family.name, tuple(checks), dtype_name(dtype))


# The interpreter runs kernels in numpy, which warns on log(0) = -inf.
INTERPRETER_WARNINGS = dict(category=RuntimeWarning, module=r"triton\.runtime\.interpreter")

