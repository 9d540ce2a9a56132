"""``python -m benchmarks <phase>``: the benchmark suite of every family (families: ``adapters.families()``).

    python -m benchmarks run --family semicrf [--T 128,256 --K 4,8 ...] [--phases forward,backward,both]
        [--backends triton,flash-semicrf] [--repeats 3] [--output-dir DIR] [--budget-s 480] [--resume]
    python -m benchmarks analyze --input DIR/benchmark_full.csv --output-dir DIR/plots [--format png|pdf]
        [--baseline NAME]
    python -m benchmarks gpu --out DIR [--budget-s 480] [--families F1,F2] [--archive F.tar.gz]
    python -m benchmarks overhead --out DIR [--families F1,F2] [--calls 300] [--archive F.tar.gz]
    python -m benchmarks breakdown --out DIR [--families F1,F2] [--budget-s 120] [--archive F.tar.gz]
    python -m benchmarks check --out DIR [--families F1,F2] [--only NAME,...] [--budget-s 150] [--archive F.tar.gz]
    python -m benchmarks site [--check]

``run`` without axis flags runs the family's anchor configurations (the shapes its targets name); any axis flag
switches to the product grid of the given values (defaults for the other axes). Every phase but ``analyze`` and
``site`` writes each family's results to ``OUT/<family>/<device slug>/`` (``run``: ``benchmarks/results/...`` by
default), the layout of ``benchmarks/results/``: the latest run per family and device. See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Optional

import torch

from benchmarks import adapters
from benchmarks.adapters import PHASES
from benchmarks.common import RESULTS, Deadline, environment, failure_status, print_table, run_dir, write_json

DEFAULT_BUDGET_S = 480.0  # each family's anchors finish within it on an H100 (sinkhorn 338 s, segment 346 s)


def split(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of " + ",".join(PHASES))
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="wall-clock budget per family (what does not fit is recorded as skipped)")
    parser.add_argument("--repeats", "--min-reps", dest="min_reps", type=int, default=3,
                        help="timed calls per measurement, at least")
    parser.add_argument("--target-s", type=float, default=0.25, help="timed seconds per measurement, aimed at")
    parser.add_argument("--max-reps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="skip measurements already in the output directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (one line per measurement)")


def add_suite_arguments(parser: argparse.ArgumentParser, budget_s: Optional[float] = None) -> None:
    """``--out``, ``--families`` and ``--archive`` of the phases that cover every family (and ``--budget-s``)."""
    parser.add_argument("--out", type=Path, required=True, help="results go to OUT/<family>/<device slug>/")
    parser.add_argument("--families", default=",".join(adapters.families()),
                        help="comma-separated subset of " + ",".join(adapters.families()))
    parser.add_argument("--archive", type=Path, help="also pack OUT into this .tar.gz (few files to carry back)")
    if budget_s is not None:
        parser.add_argument("--budget-s", type=float, default=budget_s, help="wall-clock budget per family")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="measure one family's grid")
    run.add_argument("--family", required=True, choices=adapters.families())
    run.add_argument("--backends", "--impls", dest="impls", help="implementations (default: the adapter's)")
    run.add_argument("--output-dir", "--out", dest="out", type=Path,
                     help="default benchmarks/results/<family>/<device slug>")
    axes: dict[str, list[str]] = {}
    for family in adapters.families():
        for axis in adapters.load(family).axes:
            default = ",".join(map(str, axis.default))
            axes.setdefault(axis.name, []).append(f"{family}: {axis.help} (product default {default})")
    for name, helps in sorted(axes.items()):
        flags = [f"--{name}"] + ([f"--{name}s"] if len(name) > 1 and not name.endswith("s") else [])
        run.add_argument(*flags, dest=f"axis_{name}", metavar="V1,V2", help="; ".join(helps))
    add_run_arguments(run)

    analyze = sub.add_parser("analyze", help="plots and tables from a benchmark_full.csv")
    analyze.add_argument("--input", type=Path, required=True)
    analyze.add_argument("--output-dir", type=Path, required=True)
    analyze.add_argument("--format", choices=("png", "pdf"), default="png")
    analyze.add_argument("--baseline", help="implementation the ratios divide by (default: this project's first)")
    analyze.add_argument("--tables-only", action="store_true", help="write the CSV tables, no plots")

    gpu = sub.add_parser("gpu", help="every family's default grid and its analysis")
    add_suite_arguments(gpu)
    add_run_arguments(gpu)

    from benchmarks import overhead

    overhead_parser = sub.add_parser("overhead", help="public calls against a trivial torch op and their kernels "
                                     "alone: wall time, host time, launches, first-call compile time")
    add_suite_arguments(overhead_parser)
    overhead.add_arguments(overhead_parser)
    add_suite_arguments(sub.add_parser("breakdown", help="every CUDA kernel of a public call against its wall time "
                                       "and the hardware floor"), budget_s=120.0)
    check = sub.add_parser("check", help="the families' GPU checks beyond timing (each adapter's ``checks``)")
    add_suite_arguments(check, budget_s=150.0)
    check.add_argument("--only", help="comma-separated check names (default: every check of each family)")
    site = sub.add_parser("site", help="write the benchmark pages of the trace site from committed results")
    site.add_argument("--results", type=Path, default=RESULTS)
    site.add_argument("--check", action="store_true", help="exit 1 when a page is not current (nothing written)")
    return parser


def run_family(family: str, args: argparse.Namespace, out: Path, impl_names: Optional[list[str]],
               values: dict) -> int:
    from benchmarks.runner import Runner, grid, ours_failed

    adapter = adapters.load(family)
    impls = [adapter.impl(n) for n in (impl_names or adapter.default_impls)]
    if not args.resume:  # a new run replaces the device's last one: its plots and tables no longer match
        shutil.rmtree(out / "plots", ignore_errors=True)
    runner = Runner(adapter, impls, args.phases, torch.device(args.device), out, args.budget_s, seed=args.seed,
                    min_reps=args.min_reps, target_s=args.target_s, max_reps=args.max_reps, resume=args.resume,
                    progress=not args.no_progress)
    rows = runner.run(grid(adapter, values))
    print(f"[{family}] wrote {out}/benchmark_full.csv ({len(rows)} rows), benchmark_full.json, heatmap_data.json, "
          f"memory_breakdown.csv; {runner.deadline.elapsed():.0f} s of {args.budget_s:.0f} s budget")
    return 1 if ours_failed(rows) else 0


def check_run_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.phases = split(args.phases)
    bad = sorted(set(args.phases) - set(PHASES))
    if bad or not args.phases:
        parser.error(f"--phases: expected a subset of {PHASES}, got {bad or 'nothing'}")
    if args.budget_s <= 0 or args.target_s <= 0 or args.min_reps < 1 or args.max_reps < args.min_reps:
        parser.error("--budget-s and --target-s must be > 0, 1 <= --repeats <= --max-reps")
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        parser.error(f"--device: {exc}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here (use --device cpu)")


def run_checks(args: argparse.Namespace) -> int:
    """Every check of each family (or those named by ``--only``) into OUT/<family>/<device slug>/checks.json;
    exit 1 when one failed. Checks that need CUDA are recorded as skipped on the CPU."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    only = set(split(args.only)) if args.only else None
    code = 0
    for family in args.families:
        adapter = adapters.load(family)
        deadline = Deadline(args.budget_s)
        results = {}
        for check in adapter.checks:
            if only is not None and check.name not in only:
                continue
            if device.type != "cuda" and not check.cpu:
                results[check.name] = {"passed": None, "status": "skipped: needs CUDA"}
            elif deadline.remaining() <= 0:
                results[check.name] = {"passed": None, "status": "skipped: wall-clock budget spent"}
            else:
                try:
                    results[check.name] = {"status": "ok", **check.run(device, deadline.remaining())}
                except Exception as exc:  # noqa: BLE001 - one check's failure must not cost the others
                    results[check.name] = {"passed": False, "status": failure_status(exc)}
            code |= results[check.name]["passed"] is False
        if not results:
            continue
        out = run_dir(args.out, family, device)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "checks.json", {"family": family, **environment(device), "smoke_only": device.type != "cuda",
                                         "checks": results})
        print_table(f"[{family}] checks ({device.type})",
                    [{"check": name, **r} for name, r in results.items()],
                    [("check", "check", ""), ("passed", "passed", ""), ("status", "status", "")])
    return int(code)


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "analyze":
        from benchmarks.analysis import analyze

        written = analyze(args.input, args.output_dir, args.format, args.baseline, plots=not args.tables_only)
        print(f"wrote {len(written)} files to {args.output_dir}")
        return 0
    if args.command == "site":
        from benchmarks.site import write_pages

        stale = write_pages(args.results, check=args.check)
        if args.check and stale:
            print("not current (run `python -m benchmarks site`): " + ", ".join(stale))
            return 1
        return 0
    if args.command == "run":
        return run_one(parser, args)
    args.families = split(args.families)
    unknown = sorted(set(args.families) - set(adapters.families()))
    if unknown or not args.families:
        parser.error(f"--families: expected a subset of {adapters.families()}, got {unknown or 'nothing'}")
    if args.command == "overhead":
        from benchmarks import overhead

        code = overhead.run(args)
    elif args.command == "breakdown":
        from benchmarks import overhead

        code = overhead.run_breakdown(args)
    elif args.command == "check":
        code = run_checks(args)
    else:
        check_run_args(parser, args)
        return run_all(args)  # packs after every family
    if args.archive:
        pack(args.out, args.archive)
    return code


def run_one(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``run``: one family's grid (the anchors, or the product of the axis flags given)."""
    check_run_args(parser, args)
    adapter = adapters.load(args.family)
    values = {}
    for axis in adapter.axes:
        given = getattr(args, f"axis_{axis.name}")
        if given:
            try:
                values[axis.name] = [axis.parse(v) for v in split(given)]
            except ValueError as exc:
                parser.error(f"--{axis.name}: {exc}")
    others = sorted(n for n in vars(args) if n.startswith("axis_") and getattr(args, n)
                    and n[5:] not in {a.name for a in adapter.axes})
    if others:
        parser.error(f"{', '.join('--' + n[5:] for n in others)}: not an axis of {args.family}")
    impl_names = split(args.impls) if args.impls else None
    for name in impl_names or ():
        try:
            adapter.impl(name)
        except KeyError as exc:
            parser.error(f"--backends: {exc.args[0]}")
    out = args.out or run_dir(RESULTS, args.family, torch.device(args.device))
    return run_family(args.family, args, out, impl_names, values)


def run_all(args: argparse.Namespace) -> int:
    """``gpu``: every family's default grid, then its analysis; the archive is rewritten after every family, so a
    run killed later still leaves what it finished."""
    from benchmarks.analysis import analyze

    code = 0
    for family in args.families:
        out = run_dir(args.out, family, torch.device(args.device))
        try:
            code |= run_family(family, args, out, None, {})
            analyze(out / "benchmark_full.csv", out / "plots", "png", None)
        except Exception as exc:  # noqa: BLE001 - one family's failure must not cost the others their run
            print(f"[{family}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
        if args.archive:
            pack(args.out, args.archive)
    return code


def pack(out: Path, archive: Path) -> None:
    """``archive`` (.tar.gz) holding every ``out/<family>/`` folder, replaced atomically; unpack it with
    ``tar xzf ARCHIVE -C benchmarks/results/``."""
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for folder in sorted(Path(out).iterdir()) if Path(out).exists() else ():
            if folder.is_dir():
                tar.add(folder, arcname=folder.name)
    partial.replace(archive)
    print(f"packed {archive}")


if __name__ == "__main__":
    sys.exit(main())
