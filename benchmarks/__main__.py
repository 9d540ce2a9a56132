"""``python -m benchmarks {run,analyze,gpu,site}``: the benchmark suite of every family.

    python -m benchmarks run --family semicrf [--T 128,256 --K 4,8 ...] [--phases forward,backward,both]
        [--backends triton,flash-semicrf] [--repeats 3] [--output-dir DIR] [--budget-s 480] [--resume]
    python -m benchmarks analyze --input DIR/benchmark_full.csv --output-dir DIR/plots [--format png|pdf]
        [--baseline NAME]
    python -m benchmarks gpu --out DIR [--budget-s 480] [--families semicrf,sinkhorn,segment] [--archive F.tar.gz]
    python -m benchmarks overhead --out DIR [--families semicrf,sinkhorn,segment] [--calls 300]
    python -m benchmarks site [--check]

``run`` without axis flags runs the family's anchor configurations (the shapes its targets name); any axis flag
switches to the product grid of the given values (defaults for the other axes). See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path
from typing import Optional

import torch

from benchmarks import adapters
from benchmarks.adapters import FAMILIES, PHASES

DEFAULT_BUDGET_S = 480.0  # each family's anchors finish within it on an H100 (sinkhorn 338 s, segment 346 s)
RESULTS = Path(__file__).resolve().parent / "results"  # the same as benchmarks.site.RESULTS


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="measure one family's grid")
    run.add_argument("--family", required=True, choices=FAMILIES)
    run.add_argument("--backends", "--impls", dest="impls", help="implementations (default: the adapter's)")
    run.add_argument("--output-dir", "--out", dest="out", type=Path, help="default benchmarks/results/<family>")
    axes: dict[str, list[str]] = {}
    for family in FAMILIES:
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

    gpu = sub.add_parser("gpu", help="every family's default grid and its analysis, under OUT/<family>/")
    gpu.add_argument("--out", type=Path, required=True)
    gpu.add_argument("--families", default=",".join(FAMILIES))
    gpu.add_argument("--archive", type=Path, help="also pack OUT into this .tar.gz (few files to carry back)")
    add_run_arguments(gpu)

    from benchmarks import overhead

    overhead.add_arguments(sub.add_parser("overhead", help="public calls against a trivial torch op: wall time, "
                                          "launches, first-call compile time"))
    site = sub.add_parser("site", help="write the benchmark pages of the trace site from committed results")
    site.add_argument("--results", type=Path, default=RESULTS)
    site.add_argument("--check", action="store_true", help="exit 1 when a page is not current (nothing written)")
    return parser


def run_family(family: str, args: argparse.Namespace, out: Path, impl_names: Optional[list[str]],
               values: dict) -> int:
    from benchmarks.runner import Runner, grid, ours_failed

    adapter = adapters.load(family)
    impls = [adapter.impl(n) for n in (impl_names or adapter.default_impls)]
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


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "analyze":
        from benchmarks.analysis import analyze

        written = analyze(args.input, args.output_dir, args.format, args.baseline, plots=not args.tables_only)
        print(f"wrote {len(written)} files to {args.output_dir}")
        return 0
    if args.command == "overhead":
        from benchmarks import overhead

        return overhead.run(args)
    if args.command == "site":
        from benchmarks.site import write_pages

        stale = write_pages(args.results, check=args.check)
        if args.check and stale:
            print("not current (run `python -m benchmarks site`): " + ", ".join(stale))
            return 1
        return 0
    check_run_args(parser, args)
    if args.command == "run":
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
        return run_family(args.family, args, args.out or RESULTS / args.family, impl_names, values)
    # gpu: every family's default grid, then its analysis
    from benchmarks.analysis import analyze

    families = split(args.families)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"--families: unknown {unknown}")
    code = 0
    for family in families:
        out = args.out / family
        try:
            code |= run_family(family, args, out, None, {})
            analyze(out / "benchmark_full.csv", out / "plots", "png", None)
        except Exception as exc:  # noqa: BLE001 - one family's failure must not cost the others their run
            print(f"[{family}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
        if args.archive:  # after every family, so a run killed later still leaves what it finished
            pack(args.out, families, args.archive)
    return code


def pack(out: Path, families: list[str], archive: Path) -> None:
    """``archive`` (.tar.gz) holding ``out/<family>/`` of every family present, replaced atomically."""
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for family in families:
            if (out / family).exists():
                tar.add(out / family, arcname=family)
    partial.replace(archive)
    print(f"packed {archive}")


if __name__ == "__main__":
    sys.exit(main())
