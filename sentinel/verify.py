"""``sentinel verify``: run every route of every family, prove the route taken, cross-check, report.

For each route (a leaf of the family's dispatch tree) and each input dtype the family declares (``--dtype``
selects some), fifteen checks run and are reported separately, one row per route and dtype:

- ``route``: the family builds a case for the route; running it must make the dispatcher record exactly that
  route id (a mis-dispatched or unreachable route fails; nothing is skipped).
- ``reference``: outputs and every gradient against the family's independent float64 reference, within the
  family's tolerance for the row's dtype.
- ``exact``: the same against each oracle (exact backend; brute force at tiny sizes).
- ``properties``: the family's hypothesis properties for the route, seeded, shrinking to a minimal example.
- ``guards``: adversarial inputs give finite results (infinities only where declared) or a clear
  ``ValueError``/``TypeError`` where declared; never NaN.
- ``bad_input``: each argument made wrong in turn raises ``ValueError``/``TypeError`` naming it.

Guards and bad inputs run with value checks in host mode (``value_checks("sync")``) on every device: their
contract is the named error; the device mode that CUDA calls use by default (NaN-poisoned results, device
asserts) is tested by the host-sync policy tests.
- the generic checks of :mod:`kernel_sentinel.generic`, from sentinel alone: ``inputs`` (arguments unchanged,
  forward and backward), ``aliasing``, ``written`` (poisoned allocations change nothing), ``determinism``,
  ``layouts`` (non-contiguous views); at the ``small`` size, ``layouts`` at ``tiny``.
- ``observed`` (:mod:`kernel_sentinel.observed`, at the ``small`` size, also with ``--quick``): the route runs
  again once per Triton kernel it launches, with that kernel's launches replaced by a no-op and allocations
  poisoned, and each such run must fail the route's checks (raise, or miss the float64 reference): every
  kernel's output is seen. A PyTorch route passes as not applicable.
- ``batch`` (:mod:`kernel_sentinel.invariance`, at the ``tiny`` size): an item (``Family.batch_items``: a
  sequence, a matrix, a segment) gives bitwise the same outputs and gradients alone and first, middle and last in
  a batch with other random items.
- ``memory`` (:mod:`kernel_sentinel.memory`, CPU, at the ``tiny`` and ``small`` sizes): every load and store of
  every Triton launch, under the interpreter, lies inside the launch's tensor arguments (each one copied between
  canary-filled guard regions, which must stay intact); a masked read past the end fails though its value never
  shows. On CUDA it does not run (the kernels run compiled): ``--sanitize``'s ``memcheck`` is its counterpart.
- ``opcheck`` (:mod:`kernel_sentinel.opcheck`, at the ``tiny`` size): every custom op the route calls passes
  ``torch.library.opcheck`` (schema, autograd registration, fake implementation) at the route's own arguments:
  what ``torch.compile`` runs instead of the eager fast path.

``--sanitize`` (GPU only) adds ``memcheck``, ``racecheck``, ``initcheck`` and ``synccheck`` to every Triton route
(:mod:`kernel_sentinel.sanitize`). A failed check prints, next to its reproduce command, the family's
failure-mode entries for it (which page to read first).

A check with nothing to do (no oracle, property, guard or bad input declared for the route) fails.

``--jobs J`` spreads the work over J spawned worker processes (:mod:`kernel_sentinel.workers`); the results are
those of one process, in the same order.

``--coverage`` (CPU) also measures which lines of each family's kernel sources the run executed
(:mod:`kernel_sentinel.coverage`): a table per file, in the JSON report and in the records.

Exit codes: 0 when every selected route ran and passed; 1 when any check failed, when no route ran, when a
family declares an invariant whose test does not exist, or (``--coverage``, complete run) when a kernel line is
neither reached nor declared unreached; 2 on usage errors: an unknown family, a ``--route`` glob that matches no
route, a ``--dtype`` no selected family declares, ``--record`` with ``--route`` / ``--dtype`` and ``--coverage``,
``--coverage`` with ``--jobs`` other than 1 or auto, ``--device cuda`` without a GPU, ``--coverage`` on a GPU,
``--sanitize`` without a GPU or without compute-sanitizer.

``--record`` with ``--route`` or ``--dtype`` records a part: its rows join the saved record of the family and
device when that was made from the same sources and versions (:func:`kernel_sentinel.records.merge_record`), so a
verification too long for one session on a GPU machine is recorded in several runs. The gate accepts a record
only when it covers every route at every dtype.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from kernel_sentinel import console, memory, opcheck, report, sanitize
from provable_kernels.validate import value_checks
from kernel_sentinel.outputs import unwritable
from kernel_sentinel.checks import Measurement, compare_outputs, measuring, non_finite, run_route
from kernel_sentinel.family import REPO_ROOT, Adversarial, Case, Family, Outputs, Property, matches
from kernel_sentinel.generic import GENERIC_CHECKS, Probe
from kernel_sentinel.invariance import batch_invariance
from kernel_sentinel.observed import observe
from kernel_sentinel.records import CheckResult, RouteResult

CHECKS = ("route", "reference", "exact", "properties", "guards", "bad_input") + GENERIC_CHECKS + ("observed", "batch")
CHECKS += ("memory", "opcheck")
GENERIC_SIZES = {"layouts": "tiny"}  # the size each generic check asks for (default: small)
DEFAULT_EXAMPLES = 12
AUTO_JOBS, AUTO_MIN_UNITS = 8, 24  # --jobs auto: at most this many processes, from this many units of work
QUICK_EXAMPLES = 2


@dataclass(frozen=True)
class Options:
    """How to verify: device, seed (inputs and hypothesis), examples per property, quick mode (tiny sizes), and
    which checks to run (all of them, unless a test or a debugging session narrows it)."""

    device: torch.device
    seed: int = 0
    examples: int = DEFAULT_EXAMPLES
    quick: bool = False
    checks: tuple[str, ...] = CHECKS

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


def parse_dtype(text: str) -> torch.dtype:
    """The floating dtype named ``text`` (``float32``, ``float64``, ``bfloat16``, ``float16``)."""
    dtype = getattr(torch, text, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise argparse.ArgumentTypeError(f"not a floating dtype: {text!r}")
    return dtype


def error_text(exc: BaseException) -> str:
    """``TypeName: message`` of an exception, as check details show it."""
    return f"{type(exc).__name__}: {exc}".strip()


class RouteRun:
    """One route at one dtype: its cases and outputs, each built and run once per size (a failure is kept and
    re-raised)."""

    def __init__(self, family: Family, route_id: str, options: Options, dtype: torch.dtype):
        self.family, self.route_id, self.options, self.dtype = family, route_id, options, dtype
        self.tolerance = family.tolerance(dtype)
        self._cases: dict[str, Case] = {}
        self._outputs: dict[str, Any] = {}
        self._probes: dict[str, Probe] = {}

    def case(self, size: str) -> Case:
        if size not in self._cases:
            self._cases[size] = self.family.make_case(self.route_id, size=size, dtype=self.dtype,
                                                      device=self.options.device, seed=self.options.seed)
        return self._cases[size]

    def outputs(self, size: str) -> Outputs:
        if size not in self._outputs:
            try:
                self._outputs[size] = run_route(self.family.run, self.case(size))
            except Exception as exc:  # kept: every later check on this size reports the same failure
                self._outputs[size] = exc
        result = self._outputs[size]
        if isinstance(result, Exception):
            raise result
        return result

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
            "atol": worst.atol, "rtol": worst.rtol}


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
    return _measured("reference", compare_outputs(got, want, run.tolerance, "float64 reference"), repro)


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
    example and its error."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings

    last: dict[str, Any] = {}

    def body(example: Any) -> None:
        last["example"] = example
        prop.check(route_id, example, options.device, dtype)

    try:  # building the strategy can raise too: a failure of this property, like one of its examples
        test = settings(max_examples=options.examples, deadline=None, database=None, verbosity=Verbosity.quiet,
                        phases=(Phase.explicit, Phase.generate, Phase.shrink), report_multiple_bugs=False,
                        suppress_health_check=list(HealthCheck), print_blob=False)(given(prop.example())(body))
        seed(options.seed)(test)()
    except Exception as exc:  # the minimal example is the last one hypothesis ran before re-raising
        return last.get("example"), exc
    return None


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


def check_bad_input(run: RouteRun, repro: str) -> CheckResult:
    items = [b for b in run.family.bad_inputs if matches(run.route_id, b.routes)]
    if not items:
        return CheckResult("bad_input", False, "no bad input declared for this route", repro)
    base = run.case("tiny")
    notes = []
    for item in items:
        label = f"{item.argument} ({item.what})"
        try:
            with value_checks("sync"):  # named errors on a GPU too (device mode would poison or assert instead)
                run.family.run(item.make(base))
        except (ValueError, TypeError) as exc:
            if not str(exc).startswith(item.argument):
                notes.append(f"{label}: message does not start with {item.argument!r}: {error_text(exc)}")
        except Exception as exc:
            notes.append(f"{label}: raised {error_text(exc)}, expected ValueError or TypeError")
        else:
            notes.append(f"{label}: accepted without error")
    summary = f"{len(items) - len(notes)}/{len(items)} wrong arguments rejected with an error naming them"
    return _summarized("bad_input", notes, summary, (), repro)


def generic_check(name: str) -> Callable[[RouteRun, str], CheckResult]:
    """The check ``name`` of :mod:`kernel_sentinel.generic` as a verify check."""
    def check(run: RouteRun, repro: str) -> CheckResult:
        verdict = getattr(run.probe(run.options.size(GENERIC_SIZES.get(name, "small"))), name)()
        return _summarized(name, verdict.problems, verdict.summary, verdict.measurements, repro)

    return check


def check_memory(run: RouteRun, repro: str) -> CheckResult:
    sizes = dict.fromkeys(run.options.size(s) for s in ("tiny", "small"))
    verdict = memory.verdict(run.family, [run.case(s) for s in sizes], run.options.device)
    return _summarized("memory", verdict.problems, verdict.summary, (), repro)


def check_opcheck(run: RouteRun, repro: str) -> CheckResult:
    verdict = opcheck.verdict(run.family, run.case("tiny"))
    return _summarized("opcheck", verdict.problems, verdict.summary, (), repro)


def check_observed(run: RouteRun, repro: str) -> CheckResult:
    size = "small"  # --quick too: at tiny sizes a kernel may have nothing to do (segment's combine pass)
    verdict = observe(run.family, run.case(size), size=size, dtype=run.dtype, seed=run.options.seed)
    return _summarized("observed", verdict.problems, verdict.summary, (), repro)


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
    "opcheck": check_opcheck,
}


def verify_route(family: Family, route_id: str, options: Options,
                 progress: Callable[[str], None] = lambda check: None,
                 dtype: Optional[torch.dtype] = None) -> RouteResult:
    """Every check of one route at ``dtype`` (default: the family's first dtype); an exception inside a check
    fails that check only."""
    dtype = family.dtypes[0] if dtype is None else dtype
    run = RouteRun(family, route_id, options, dtype)
    repro = options.repro(family.name, route_id, dtype)
    checks = []
    for name in options.checks:
        progress(name)
        torch.manual_seed(options.seed)
        start = time.perf_counter()
        try:
            result = CHECK_FUNCTIONS[name](run, repro)
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{error_text(exc)} (at {Path(where.filename).name}:{where.lineno})"
            result = CheckResult(name, False, detail, repro)
        checks.append(dataclasses.replace(result, seconds=time.perf_counter() - start))
    return RouteResult(route_id, family.name, tuple(checks), dtype_name(dtype))


def sanitized(result: RouteResult, options: Options) -> RouteResult:
    """``result`` with the compute-sanitizer checks appended when it is a Triton route's."""
    if not sanitize.is_triton_route(result.id):
        return result
    repro = options.repro(result.family, result.id, getattr(torch, result.dtype))
    extra = sanitize.sanitize_route(result.family, result.id, result.dtype, options.seed, options.quick, repro)
    done = dataclasses.replace(result, checks=(*result.checks, *extra))
    status = "pass" if all(c.passed for c in extra) else "FAIL"
    console.err.print(f"compute-sanitizer: {result.id} {result.dtype}: {status} in "
                      f"{sum(c.seconds or 0.0 for c in extra):.1f} s", highlight=False, markup=False)
    return done


# The interpreter runs kernels in numpy, which warns on log(0) = -inf.
INTERPRETER_WARNINGS = dict(category=RuntimeWarning, module=r"triton\.runtime\.interpreter")


def failure_routing(families: Sequence[Family], result: RouteResult, check: CheckResult) -> list[str]:
    """The failure-mode entries of ``result``'s family that a failure of ``check`` on its route shows (the check
    named, its detail holding one of the entry's signs), one line each: the check and the symptom, the pages to
    read (under ``traces/``) and what covers it."""
    family = next((f for f in families if f.name == result.family), None)
    modes = [m for m in (family.failure_modes if family else ())
             if m.shown_by(check.name, check.detail) and matches(result.id, m.routes)]
    return [f"{check.name} check, failure mode '{m.symptom}': read traces/{m.read_first} first, then "
            f"traces/{m.then}; covered by {m.covered_by}" for m in modes]


def select_routes(families: Sequence[Family], globs: Sequence[str]) -> list[tuple[Family, str]]:
    """``(family, route id)`` for every route matching one of ``globs`` (every route when empty), in tree order."""
    return [(f, r.id) for f in families for r in f.routes() if not globs or matches(r.id, globs)]


def select_rows(families: Sequence[Family], globs: Sequence[str],
                dtypes: Sequence[torch.dtype] = ()) -> list[tuple[Family, str, torch.dtype]]:
    """``(family, route id, dtype)``: each selected route (:func:`select_routes`) at each dtype of its family
    that is in ``dtypes`` (every dtype of the family when empty); dtype-major within a family."""
    return [(f, route_id, d) for f in families for d in f.dtypes if not dtypes or d in dtypes
            for _, route_id in select_routes([f], globs)]


# ------------------------------------------------------------------------------------------------------- CLI


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _jobs(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return _positive(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or auto, got {text!r}") from None


def resolve_jobs(jobs: int | str, units: int, coverage: bool) -> int:
    """The worker processes for ``--jobs`` over ``units`` units of work (:func:`kernel_sentinel.workers.unit_count`:
    a row's properties one by one, and its other checks): ``auto`` is one per usable CPU (at most
    :data:`AUTO_JOBS`) when there are at least :data:`AUTO_MIN_UNITS` units and no coverage is measured, else 1
    (starting a process costs seconds: a little work runs faster in this one)."""
    if jobs != "auto":
        return int(jobs)
    if coverage or units < AUTO_MIN_UNITS:
        return 1
    return min(AUTO_JOBS, usable_cpus())


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def register(subparsers: argparse._SubParsersAction) -> None:
    from kernel_sentinel.device import DEVICE_CHOICES

    p = subparsers.add_parser(
        "verify", help="run every dispatch route and cross-check it",
        description=__doc__.split("\n\n")[0] + " Exit 0 when every selected route ran and passed, 1 on any "
        "failure (also when no route ran), 2 on usage errors (unknown family, a --route glob matching no route).")
    p.add_argument("--family", nargs="+", action="extend", metavar="F", help="families to verify (default: all)")
    p.add_argument("--route", nargs="+", action="extend", metavar="GLOB",
                   help="only routes whose id matches one of these fnmatch globs, e.g. 'semicrf.torch.*'")
    p.add_argument("--dtype", nargs="+", action="extend", type=parse_dtype, metavar="DTYPE",
                   help="only these input dtypes, e.g. float32 (default: every dtype each family declares)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                   help="auto: cuda when available, else cpu (Triton routes then run under the Triton interpreter)")
    p.add_argument("--quick", action="store_true", help=f"tiny inputs only, {QUICK_EXAMPLES} examples per property")
    p.add_argument("--examples", type=_positive, metavar="N",
                   help=f"hypothesis examples per property (default {DEFAULT_EXAMPLES}, {QUICK_EXAMPLES} with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and of hypothesis (default 0)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the JSON report here")
    p.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML here (one testcase per route and check)")
    p.add_argument("--coverage", action="store_true",
                   help="measure which lines of each family's kernel sources the run executes (CPU: Triton code runs "
                        "as Python under the interpreter); on a complete run, a line neither reached nor declared "
                        "'# verify: unreached (reason)' fails it")
    p.add_argument("--sanitize", action="store_true",
                   help="GPU only: also run every Triton route's cases under compute-sanitizer (memcheck, racecheck, "
                        "initcheck, synccheck), one check per tool")
    p.add_argument("--jobs", type=_jobs, default="auto", metavar="J",
                   help=f"verify in J worker processes, with the results of one (a GPU run is mostly Triton "
                        f"compilation, which runs in parallel across processes); not with --coverage. Default "
                        f"auto: one per CPU, at most {AUTO_JOBS}, for {AUTO_MIN_UNITS} units of work or more "
                        f"(a row's properties one by one, and its other checks), else 1")
    p.add_argument("--record", action="store_true",
                   help="write traces/verification/<family>-<device>.json for the trace generator and the gate")


def run(args: argparse.Namespace) -> int:
    from kernel_sentinel import device as devices
    from kernel_sentinel import coverage, records, registry, workers

    try:
        device = devices.prepare(args.device)  # idempotent: kernel_sentinel.cli.main ran it before any kernel import
    except ValueError as exc:
        return console.usage_error(str(exc))
    if args.record and (args.route or args.dtype) and args.coverage:
        return console.usage_error("--coverage measures a whole run: drop it, or --route / --dtype, with --record")
    if args.record and (args.quick or args.examples):
        return console.usage_error("--record needs the full default verification; drop --quick / --examples")
    problem = unwritable({"--json": args.json, "--junit": args.junit},
                         {"--record": records.record_dir() if args.record else None})
    if problem:
        return console.usage_error(problem)
    if args.coverage and args.jobs not in ("auto", 1):
        return console.usage_error("--coverage measures one process: drop --jobs")
    if args.coverage and device.type != "cpu":
        return console.usage_error("--coverage reads the Triton kernels as Python under the interpreter: "
                                   "use --device cpu")
    measurement = coverage.Measurement([coverage.kernel_root()]) if args.coverage else None
    if measurement is not None:
        measurement.start()  # before the families are imported: what runs at import counts too
    try:
        families = registry.select(args.family)
    except registry.UnknownFamily as exc:
        return console.usage_error(exc.args[0])
    globs, dtypes = args.route or [], args.dtype or []
    selected = select_rows(families, globs, dtypes)
    unmatched = [g for g in globs if not select_routes(families, [g])]
    if unmatched:
        return console.usage_error(f"--route {' '.join(unmatched)} matches no route; see `sentinel routes`")
    undeclared = [dtype_name(d) for d in dtypes if not select_rows(families, globs, [d])]
    if undeclared:
        return console.usage_error(f"--dtype {' '.join(undeclared)}: no selected family declares it")
    if args.sanitize and (reason := sanitize.unavailable(device.type)):
        return console.usage_error(reason)
    examples = args.examples or (QUICK_EXAMPLES if args.quick else DEFAULT_EXAMPLES)
    options = Options(device=device, seed=args.seed, examples=examples, quick=args.quick)

    start = time.perf_counter()
    jobs = resolve_jobs(args.jobs, workers.unit_count(selected, options), args.coverage)
    if jobs > 1:
        results = workers.verify_in_processes(selected, options, jobs)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", **INTERPRETER_WARNINGS)
            results = report.run_with_progress(selected, options, verify_route, options.checks)
    if args.sanitize:  # each check is a compute-sanitizer process: --jobs of them at a time
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda r: sanitized(r, options), results))
    elapsed = time.perf_counter() - start
    problems = [f"{f.name}: invariant test {t} does not exist" for f in families for t in f.missing_tests()]
    reached = None
    if measurement is not None:
        measurement.stop()
        complete = not (globs or dtypes or args.quick or args.examples)
        reached = coverage.report(families, registry.families(), measurement, lambda family: complete)
        console.out.print(coverage.table(reached))
        problems += reached.problems

    info = devices.info(device)
    report.print_results(results, problems, elapsed, info, routing=lambda r, c: failure_routing(families, r, c))
    commit = records.head_commit()
    if args.json:
        data = report.json_report(results, commit, info, problems)
        report.write_json(args.json, {**data, "coverage": reached.as_dict()} if reached else data)
    if args.junit:
        report.write_junit(args.junit, results, problems)
    if args.record:
        for family in families:
            ran = [r for r in results if r.family == family.name]
            record = records.make_record(family, info, ran)
            if reached is not None:
                record["coverage"] = reached.for_family(family.name).as_dict()
            if globs or dtypes:  # a part of the verification: joined with the saved record of the same sources
                order = [(r.id, dtype_name(d)) for r in family.routes() for d in family.dtypes]
                record = records.merge_record(record, order)
            path = records.save_record(record)
            console.err.print(f"recorded {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")
    ok = bool(results) and all(r.passed for r in results) and not problems
    return 0 if ok else 1
