"""Equivalent mutants shown, not argued: each entry of ``kernels/<family>/equivalent_mutants.json`` runs.

An entry names a mutant of :mod:`kernel_sentinel.mutate` (``file``, ``before``, ``after``) that its reviewer judged
equivalent: the program means the same. :func:`verdict` plants it in a scratch copy of the repository
(:class:`kernel_sentinel.mutate.Scratch`) and runs the family's cases with it, in a fresh process: every route that
executes the mutated line (found by an unmutated run of the same cases under coverage, :func:`baseline`), at the
family's first dtype (the interpreter's cost: every dtype would multiply it by up to four), on the route's ``tiny``
and ``small`` cases (value checks in host mode and again in device mode, the kernels' own checks) and on every
adversarial input declared for it (built from the tiny case, value checks in host mode). Every output and gradient
must be bitwise those of the unmutated run, and a case that raises must raise the same error. An entry whose mutant
changes an output is not equivalent (take it off the list: ``sentinel mutate`` then runs it); an entry whose lines
no longer exist in the file is stale; a mutant whose line no case reaches is shown nothing (the entry then rests on
its reason alone).

The worker (``python -m kernel_sentinel.equivalence --family F --route R ... --out PATH [--coverage PATH]``) runs
only inside a scratch copy.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from kernel_sentinel import mutate

TIME_LIMIT_FACTOR, TIME_LIMIT_FLOOR = 4.0, 120.0  # a mutated run may take 4x the unmutated one + 120 s


def entries(family_dir: Path) -> list[dict[str, str]]:
    """The entries of the family's ``equivalent_mutants.json`` (empty when it has none)."""
    path = Path(family_dir) / mutate.EQUIVALENTS
    return json.loads(path.read_text()) if path.is_file() else []


@dataclass
class Baseline:
    """The unmutated run of a family's cases in a scratch copy: which routes reach each line, each route's time,
    and the outputs file."""

    lines: dict[str, dict[int, set[str]]]
    seconds: dict[str, float]
    outputs: Path

    def routes_for(self, file: str, line: int) -> list[str]:
        reached = self.lines.get(file, {}).get(line, set())
        return sorted(self.seconds) if mutate.ALL_ROUTES in reached else sorted(reached)


def _run_worker(scratch: mutate.Scratch, family: str, routes: Sequence[str], out: Path, timeout: float,
                coverage_to: Optional[Path] = None) -> tuple[bool, str]:
    """The worker in a fresh process over the scratch copy: ``(finished, its last output line)``."""
    argv = [sys.executable, "-m", "kernel_sentinel.equivalence", "--family", family, "--out", str(out),
            "--route", *routes] + (["--coverage", str(coverage_to)] if coverage_to else [])
    try:
        done = subprocess.run(argv, env=scratch.env(), cwd=scratch.dir, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"ran past {timeout:.0f} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else f"exit code {done.returncode}"


def baseline(scratch: mutate.Scratch, family: Any, routes: Sequence[str] = ()) -> Baseline:
    """Run the cases of ``routes`` (default: every route) unmutated under coverage; ``RuntimeError`` when the run
    fails."""
    routes = list(routes) or [r.id for r in family.routes()]
    coverage_to, out = scratch.dir / "_equivalence_coverage.json", scratch.dir / "_equivalence_baseline.pt"
    ok, last = _run_worker(scratch, family.name, routes, out, 3600.0, coverage_to)
    if not ok:
        raise RuntimeError(f"the unmutated cases of {family.name} do not run: {last}")
    data = json.loads(coverage_to.read_text())
    lines = {f: {int(n): set(r) for n, r in by_line.items()} for f, by_line in data["lines"].items()}
    return Baseline(lines, data["seconds"], out)


def verdict(scratch: mutate.Scratch, family: Any, base: Baseline, entry: dict[str, str]) -> tuple[str, str]:
    """``(status, detail)`` of one entry: ``equivalent``, ``differs``, ``stale`` or ``unreached`` (module
    docstring)."""
    import torch

    from kernel_sentinel.generic import differences

    path = scratch.dir / entry["file"]
    original = path.read_text()
    key = (entry["file"], entry["before"], entry["after"])
    mutants = [m for m in mutate.find_mutants(original, entry["file"])
               if m.key == key and entry.get("next", m.following) == m.following]
    if not mutants:
        return "stale", "no mutant of the file has these lines: the code changed; review the entry again"
    notes = []
    for mutant in mutants:
        routes = base.routes_for(mutant.file, mutant.line)
        if not routes:
            notes.append(f"line {mutant.line}: no case reaches it")
            continue
        out = scratch.dir / "_equivalence_mutant.pt"
        path.write_text(mutant.apply(original))
        try:
            limit = TIME_LIMIT_FLOOR + TIME_LIMIT_FACTOR * sum(base.seconds[r] for r in routes)
            ok, last = _run_worker(scratch, family.name, routes, out, limit)
        finally:
            path.write_text(original)
        if not ok:
            return "differs", f"line {mutant.line}: the mutated cases do not run: {last}"
        got, want = torch.load(out), torch.load(base.outputs)
        for case, result in got.items():
            before = want[case]
            if isinstance(result, str) or isinstance(before, str):
                problems = [] if result == before else [f"{result!r} vs {before!r}"]
            else:
                problems = differences(result, before)
            if problems:
                return "differs", f"line {mutant.line}, {case}: {problems[0]}"
        notes.append(f"line {mutant.line}: {len(got)} cases of {len(routes)} routes bitwise equal")
    if all(n.endswith("no case reaches it") for n in notes):
        return "unreached", "; ".join(notes)
    return "equivalent", "; ".join(notes)


# ---------------------------------------------------------------------------------------------- the worker


def case_outputs(family: Any, routes: Sequence[str], seed: int = 0) -> dict[str, Any]:
    """``{"<route> <dtype> <case>": outputs on the CPU, or "<error type>: <message>"}`` for the cases of
    ``routes`` (module docstring)."""
    import torch

    from provable_kernels.validate import value_checks
    from kernel_sentinel.checks import run_route
    from kernel_sentinel.family import matches
    from kernel_sentinel.generic import fresh_case

    device = torch.device("cpu")
    found: dict[str, Any] = {}
    for route_id in routes:
        for dtype in family.dtypes[:1]:
            label = f"{route_id} {str(dtype).removeprefix('torch.')}"
            made = {size: family.make_case(route_id, size=size, dtype=dtype, device=device, seed=seed)
                    for size in ("tiny", "small")}
            made.update({item.name: item.make(made["tiny"]) for item in family.adversarial
                         if matches(route_id, item.routes)})
            runs = [(f"{label} {size} device mode", made[size], "device") for size in ("tiny", "small")]
            for key, case, mode in [(f"{label} {name}", case, "sync") for name, case in made.items()] + runs:
                torch.manual_seed(seed)
                try:
                    with value_checks(mode):
                        outputs = run_route(family.run, fresh_case(case))
                    found[key] = {n: x.detach().cpu().clone() for n, x in outputs.items()}
                except Exception as exc:
                    found[key] = f"{type(exc).__name__}: {exc}"
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_sentinel.equivalence")
    parser.add_argument("--family", required=True)
    parser.add_argument("--route", nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--coverage", type=Path)
    args = parser.parse_args(argv)

    import warnings

    started = mutate.start_in_scratch(args.coverage)
    if started is None:
        return 2
    here, cov = started
    import torch

    from kernel_sentinel import device

    device.prepare("cpu")
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    family = mutate.scratch_family(args.family, here)
    if family is None:
        return 2
    found: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for route_id in args.route:
        if cov is not None:
            cov.switch_context(route_id)
        start = time.perf_counter()
        found.update(case_outputs(family, [route_id]))
        seconds[route_id] = time.perf_counter() - start
    torch.save(found, args.out)
    if cov is not None:
        cov.stop()
        data = cov.get_data()
        lines = {Path(f).resolve().relative_to(here).as_posix(): {
            n: sorted(c if c else mutate.ALL_ROUTES for c in ctx) for n, ctx in data.contexts_by_lineno(f).items()}
            for f in data.measured_files()}
        args.coverage.write_text(json.dumps({"lines": lines, "seconds": seconds}))
    print(f"{len(found)} cases of {len(args.route)} routes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
