"""``sentinel verify``: run every route of every family, prove the route taken, cross-check, report.

For each route (a leaf of the family's dispatch tree) and each input dtype the family declares (``--dtype``
selects some), seventeen checks run (:mod:`kernel_sentinel.rows`) and are reported separately, one row per route
and dtype: ``route``, ``reference``, ``exact``, ``properties``, ``guards``, ``bad_input``, the generic ``inputs``,
``aliasing``, ``written``, ``determinism`` and ``layouts`` (:mod:`kernel_sentinel.generic`), ``observed``,
``batch``, ``memory`` (CPU only), ``opcheck`` and ``devices`` (two GPUs or more; else not applicable). What each
proves, at which size and in which value-check mode, is the guide page "The verification ladder"
(``traces/guide/verification-ladder.md``). A check with nothing to do (no oracle, property, guard or bad input
declared for the route) fails. ``--quick``: tiny inputs only, fewer hypothesis examples per property.

``--sanitize`` (GPU only) adds ``memcheck``, ``racecheck``, ``initcheck`` and ``synccheck`` to every Triton route
(:mod:`kernel_sentinel.sanitize`). A failed check prints, next to its reproduce command, the family's
failure-mode entries for it (which page to read first).

``--jobs J`` spreads the work over J spawned worker processes (:mod:`kernel_sentinel.workers`; ``--jobs 0``: this
process); a worker that crashes (compiled code the kernel under test calls) fails its unit alone; the results are
those of one process, in the same order. ``--devices all`` (or ``cuda:0,cuda:1,...``) spreads them over those
GPUs: each worker is pinned to one GPU (``ceil(J / N)`` workers per GPU, at least one), units go to whichever
worker is free, and the end of the run prints each GPU's share (units, busy seconds), also in the JSON report
(``devices``). The record then names every GPU it ran on (:mod:`kernel_sentinel.records`); with ``--sanitize``
the compute-sanitizer processes are spread over the same GPUs.

``--coverage`` (CPU) also measures which lines of each family's kernel sources the run executed
(:mod:`kernel_sentinel.coverage`): a table per file, in the JSON report and in the records. With ``--jobs``
every worker measures its own units and sends its lines back with each result; the table is their union.

Exit codes: 0 when every selected route ran and passed; 1 when any check failed, when no route ran, when a
family declares an invariant whose test does not exist, or (``--coverage``, complete run) when a kernel line is
neither reached nor declared unreached; 2 on usage errors: an unknown family, a ``--route`` glob that matches no
route, a ``--dtype`` no selected family declares, ``--record`` with ``--route`` / ``--dtype`` and ``--coverage``,
``--device cuda`` without a GPU, ``--coverage`` on a GPU, ``--sanitize`` without a GPU or without
compute-sanitizer, ``--devices`` without a GPU, with ``--device cpu``, naming a GPU the host does not have,
``cpu`` or the same GPU twice.

``--profile`` also prints where the time went (:mod:`kernel_sentinel.profile`): wall and CPU seconds and Triton
launches per check, per family and per row, also in the JSON report (``profile``).

``--record`` with ``--route`` or ``--dtype`` records a part: its rows join the saved record of the family and
device when that was made from the same sources and versions on the same GPUs
(:func:`kernel_sentinel.records.merge_record`), so a
verification too long for one session on a GPU machine is recorded in several runs. The gate accepts a record
only when it covers every route at every dtype.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Sequence

import torch

from kernel_sentinel import console, profile, report, sanitize, workers
from kernel_sentinel.family import Family, matches, rooted
from kernel_sentinel.outputs import unwritable
from kernel_sentinel.records import CheckResult, RouteResult
from kernel_sentinel.rows import DEFAULT_EXAMPLES, QUICK_EXAMPLES, Options, dtype_name

AUTO_JOBS, AUTO_MIN_UNITS = 8, 24  # --jobs auto: at most this many processes, from this many units of work


def parse_dtype(text: str) -> torch.dtype:
    """The floating dtype named ``text`` (``float32``, ``float64``, ``bfloat16``, ``float16``)."""
    dtype = getattr(torch, text, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise argparse.ArgumentTypeError(f"not a floating dtype: {text!r}")
    return dtype


def sanitized(result: RouteResult, options: Options, gpu: workers.Gpu = None) -> RouteResult:
    """``result`` with the compute-sanitizer checks appended when it is a Triton route's, run on GPU ``gpu``
    (None: the current one)."""
    if not sanitize.is_triton_route(result.id):
        return result
    from kernel_sentinel.device import visible_id

    repro = options.repro(result.family, result.id, getattr(torch, result.dtype))
    extra = sanitize.sanitize_route(result.family, result.id, result.dtype, options.seed, options.quick, repro,
                                    visible=None if gpu is None else visible_id(gpu))
    done = dataclasses.replace(result, checks=(*result.checks, *extra))
    status = "pass" if all(c.passed for c in extra) else "FAIL"
    where = "" if gpu is None else f" on cuda:{gpu}"
    console.err.print(f"compute-sanitizer: {result.id} {result.dtype}{where}: {status} in "
                      f"{sum(c.seconds or 0.0 for c in extra):.1f} s", highlight=False, markup=False)
    return done


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
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0, a positive integer or auto, got {text!r}")
    return value


def resolve_jobs(jobs: int | str, units: int) -> int:
    """The worker processes for ``--jobs`` over ``units`` units of work (:func:`kernel_sentinel.workers.unit_count`:
    a row's properties one by one, and its other checks): ``auto`` is one per usable CPU (at most
    :data:`AUTO_JOBS`) when there are at least :data:`AUTO_MIN_UNITS` units, else 1 (starting a process costs
    seconds); 0 runs in this process (no worker: a crash of the kernel's compiled code then ends the run; for a
    debugger, or a family built in this process). ``--devices`` then rounds it up to a multiple of the GPU count
    (:func:`kernel_sentinel.workers.slots`)."""
    if jobs != "auto":
        return int(jobs)
    if units < AUTO_MIN_UNITS:
        return 1
    return min(AUTO_JOBS, workers.usable_cpus())


def register(subparsers: argparse._SubParsersAction) -> None:
    from kernel_sentinel.cli import COMMANDS

    from kernel_sentinel.device import DEVICE_CHOICES

    p = subparsers.add_parser(
        "verify", help=COMMANDS["verify"][1],
        description=__doc__.split("\n\n")[0] + " Exit 0 when every selected route ran and passed, 1 on any "
        "failure (also when no route ran), 2 on usage errors (unknown family, a --route glob matching no route).")
    p.add_argument("--family", nargs="+", action="extend", metavar="F", help="families to verify (default: those of the "
                   "current directory's repository, or every family when none lives there)")
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
                        f"compilation, which runs in parallel across processes; --coverage is measured in each). "
                        f"Default auto: one per CPU, at most {AUTO_JOBS}, for {AUTO_MIN_UNITS} units of work or more "
                        f"(a row's properties one by one, and its other checks), else 1. A worker that crashes fails "
                        f"the unit it ran alone. 0: in this process (no worker; for a debugger)")
    p.add_argument("--devices", metavar="LIST",
                   help="spread the work over these GPUs: all, or a comma-separated list such as cuda:0,cuda:1 (one "
                        "worker process per GPU, ceil(J / N) with --jobs J; each pinned to its GPU); prints each "
                        "GPU's share at the end; the record names every GPU")
    p.add_argument("--profile", action="store_true",
                   help="also print where the time went: seconds and Triton launches per check, per family and for "
                        "the most expensive rows (all rows in --json's 'profile')")
    p.add_argument("--record", action="store_true",
                   help="write traces/verification/<family>-<device>.json for the trace generator and the gate")


def run(args: argparse.Namespace) -> int:
    from kernel_sentinel import device as devices
    from kernel_sentinel import coverage, records, registry

    try:
        device = devices.prepare(args.device)  # idempotent: kernel_sentinel.cli.main ran it before any kernel import
        gpus = devices.select_gpus(args.devices, device) if args.devices is not None else ()
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
    if args.coverage and device.type != "cpu":
        return console.usage_error("--coverage reads the Triton kernels as Python under the interpreter: "
                                   "use --device cpu")
    measurement = coverage.Measurement([coverage.kernel_root()]) if args.coverage else None
    if measurement is not None:
        measurement.start()  # before the families are imported: what runs at import counts too
    try:
        families, broken = registry.select_with_broken(args.family)
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
    options = Options(device=device, seed=args.seed, examples=examples, quick=args.quick, gpus=gpus,
                      profile=args.profile)

    stamps = {}  # taken at the start: the sources the run runs, not HEAD at its end; in each family's repository
    for family in families:
        with rooted(family.root):
            stamps[family.name] = (records.head_commit(), records.blob_ids(family.source_files()))
    commit = records.head_commit()
    start = time.perf_counter()
    units = workers.unit_count(selected, options)
    jobs = resolve_jobs(args.jobs, units)
    pinned = workers.slots(max(1, jobs), gpus, units)
    shares = workers.shares(pinned)
    if jobs:
        results = workers.verify_in_processes(selected, options, pinned, shares, measurement)
    else:
        results = workers.verify_here(selected, options, pinned[0], shares)
    if args.sanitize:  # each check is a compute-sanitizer process: one per worker at a time, on the workers' GPUs
        results = workers.sanitize_on(results, lambda r, gpu: sanitized(r, options, gpu), pinned, shares)
    elapsed = time.perf_counter() - start
    problems = [f"{b.name}: the family failed to load ({b.where}): {b.error}" for b in broken]
    problems += [f"{f.name}: invariant test {t} does not exist in {f.root}" for f in families
                 for t in f.missing_tests()]
    problems += [f"{f.name}: {line}" for f in families for line in f.one_block_cases()]
    reached = None
    if measurement is not None:
        measurement.stop()
        complete = not (globs or dtypes or args.quick or args.examples)
        reached = coverage.report(families, registry.families(), measurement, lambda family: complete)
        console.out.print(coverage.table(reached))
        problems += reached.problems

    info = devices.info(device, gpus)
    report.print_results(results, problems, elapsed, info, routing=lambda r, c: failure_routing(families, r, c))
    spread = {"wall_seconds": round(elapsed, 2), "shares": [s.as_dict(device) for s in shares.values()]}
    if gpus:
        workers.print_shares(spread)
    profiled = profile.summary(results, profile.take(), elapsed) if args.profile else None
    for table in profiled and profile.tables(profiled) or ():
        console.out.print(table)
    if args.json:
        data = {**report.json_report(results, commit, info, problems), "devices": spread}
        data = {**data, "profile": profiled} if profiled else data
        report.write_json(args.json, {**data, "coverage": reached.as_dict()} if reached else data)
    if args.junit:
        report.write_junit(args.junit, results, problems)
    if args.record:
        for family in families:
            ran = [r for r in results if r.family == family.name]
            with rooted(family.root):  # the record lives in the family's own repository
                record = records.make_record(family, info, ran, stamps[family.name])
                if reached is not None:
                    record["coverage"] = reached.for_family(family.name).as_dict()
                if globs or dtypes:  # a part of the verification: joined with the saved record of the same sources
                    order = [(r.id, dtype_name(d)) for r in family.routes() for d in family.dtypes]
                    record = records.merge_record(record, order)
                path = records.save_record(record)
            here = Path.cwd()
            console.err.print(f"recorded {path.relative_to(here) if path.is_relative_to(here) else path}")
    ok = bool(results) and all(r.passed for r in results) and not problems
    return 0 if ok else 1
