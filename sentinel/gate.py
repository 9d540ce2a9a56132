"""``sentinel gate``: the CI gate for kernel changes.

CI machines usually have no GPU, so the gate runs what a CPU can and demands a current GPU record for the rest:

1. **affected families**: with ``--base REF``, the files changed since the merge base of REF and HEAD
   (committed, staged, unstaged and untracked; a rename counts as both paths) are mapped to families through the
   registry: a family's ``Family.source_files()``, or a ``.py`` file (e.g. a deleted one) in the directories
   those live in. A change under ``sentinel/`` or to ``pyproject.toml`` affects every family. Without ``--base``
   every family is affected.
2. **verify** each affected family on the CPU (``sentinel verify --device cpu`` in a fresh process: Triton under
   its interpreter). ``--no-cpu-verify`` leaves this step out, for a CI job that has just run the full CPU
   verification of the same tree (``.ci/run`` runs the README's ``sentinel verify`` first).
3. **GPU record**: each affected family whose sources define Triton kernels needs a record from a CUDA device
   (``traces/verification/<family>-cuda-*.json``, one per GPU model, of any model) whose git blob ids match the
   current sources, which covers every route of the current tree at every dtype of the family, and whose rows
   all passed. The step's detail has a line per GPU model's record: current or what is wrong with it, the GPU
   count it ran on, and its cross-device evidence (:func:`kernel_sentinel.records.cross_device`: a record made on
   one GPU passes the ``devices`` check as not applicable, which the step names as no evidence).
4. **traces**: the check of ``sentinel trace --check`` (always: it is cheap, and a hand-edited trace must fail).

A docs-only change affects no family: the gate checks the traces and nothing else. Every failure says what to
do. Exit 0 when every step passed, 1 on a failure, 2 on a usage error (e.g. an unknown ``--base``).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from rich.markup import escape
from rich.table import Table

from kernel_sentinel import console, records, registry, trace
from kernel_sentinel.outputs import unwritable
from kernel_sentinel.family import Family, project_root, rooted
from kernel_sentinel.report import JUnitCase, junit_tree, save_junit

GLOBAL_INPUTS = ("sentinel/", "pyproject.toml")
RECORD_HINT = "run `sentinel verify --device cuda --record` on a GPU, then `sentinel trace`, and commit both"
TRACE_HINT = "run `sentinel trace` and commit the result"
DETAIL_LIMIT = 4000  # characters of evidence (a trace diff, verify's output) kept in a step's detail


@dataclass(frozen=True)
class Step:
    """One gate step's outcome. ``detail``'s first line is the verdict (on failure: what to do); further lines
    are evidence (a diff, an error output)."""

    name: str
    family: str
    passed: bool
    detail: str

    @property
    def headline(self) -> str:
        return self.detail.splitlines()[0] if self.detail else ""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "family": self.family, "status": "pass" if self.passed else "fail",
                "detail": self.detail}


def _clip(text: str, keep_end: bool) -> str:
    """``text`` cut to ``DETAIL_LIMIT`` characters: its end (an error output) or its start (a diff)."""
    text = text.strip()
    if len(text) <= DETAIL_LIMIT:
        return text
    return "…" + text[-DETAIL_LIMIT:] if keep_end else text[:DETAIL_LIMIT] + "…"


# ------------------------------------------------------------------------------------------ affected families


def merge_base(base: str) -> str:
    """The commit where HEAD's history left ``base`` (what a pull request's diff starts from); ``RuntimeError``
    when ``base`` is not a commit or shares no history with HEAD."""
    records.git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    return records.git("merge-base", base, "HEAD")


def changed_files(base: str) -> list[str]:
    """Repo-relative paths that differ from the merge base of ``base`` and HEAD: committed since, staged,
    unstaged, and untracked (not ignored); renames give both paths."""
    diff = records.git("diff", "--name-only", "--no-renames", merge_base(base), "--").splitlines()
    untracked = records.git("ls-files", "--others", "--exclude-standard").splitlines()
    return sorted(set(diff) | set(untracked))


def affected(family: Family, changed: Sequence[str]) -> list[str]:
    """The changed files that can change ``family``'s behaviour: its sources, a ``.py`` file where its sources
    live (one added or deleted), and the global inputs (``GLOBAL_INPUTS``)."""
    sources = {p.as_posix() for p in family.source_files()}
    source_dirs = {Path(p).parent for p in sources}
    return [f for f in changed if f in sources or f.startswith(GLOBAL_INPUTS)
            or (f.endswith(".py") and Path(f).parent in source_dirs)]


def triton_sources(family: Family) -> list[str]:
    """The family's source files that define Triton kernels."""
    return [p.as_posix() for p in family.source_files() if "@triton.jit" in (family.root / p).read_text()]


# ------------------------------------------------------------------------------------------------------ steps


def _listing(paths: Sequence[str]) -> str:
    verb = "has" if len(paths) == 1 else "have"
    return f"{', '.join(paths)} {verb}"


def record_problem(family: Family, record: dict[str, Any], current: dict[str, str]) -> Optional[str]:
    """Why ``record`` does not vouch for ``family`` as it is now (sources ``current``), or None when it does."""
    where = records.device_text(record["device"])
    changed = sorted(p for p in set(current) | set(record["sources"]) if record["sources"].get(p) != current.get(p))
    if changed:
        return f"{_listing(changed)} changed since the last GPU verification on {where}: {RECORD_HINT}"
    by_row = {records.row_key(r): r["status"] for r in record["routes"]}
    wanted = [(r.id, str(d).removeprefix("torch.")) for d in family.dtypes for r in family.routes()]

    def label(route_id: str, dtype: str) -> str:
        return route_id if len(family.dtypes) == 1 else f"{route_id} ({dtype})"

    missing = [label(*row) for row in wanted if row not in by_row]
    if missing:
        return f"the GPU record from {where} lacks routes {', '.join(missing)}: {RECORD_HINT}"
    failed = [label(*row) for row, status in by_row.items() if status != "pass"]
    if failed:
        return f"routes {', '.join(failed)} failed on {where}: fix them, then {RECORD_HINT}"
    return None


def cross_device_note(record: dict[str, Any]) -> str:
    """What ``record`` shows of the ``devices`` check, in words, a not-applicable one named as no evidence."""
    found = records.cross_device(record)
    if found == "pass":
        return "cross-device check passed"
    if found == "not run":
        return "no cross-device evidence (recorded before the devices check existed)"
    if found.startswith(records.NOT_APPLICABLE):
        return (f"no cross-device evidence (the devices check was not applicable: "
                f"{found.removeprefix(records.NOT_APPLICABLE)}; record on a host with two GPUs or more)")
    return f"cross-device check: {found}"


def gpu_record_step(family: Family) -> Step:
    """Pass when some CUDA record of ``family`` matches the current sources, covers every route, all passed; the
    detail says so of each GPU model's record."""
    try:
        cuda = [r for r in records.load_records() if r["family"] == family.name and r["device"]["type"] == "cuda"]
    except ValueError as exc:
        return Step("gpu-record", family.name, False, f"unreadable verification record ({exc}): {RECORD_HINT}")
    if not cuda:
        return Step("gpu-record", family.name, False,
                    f"no GPU verification record of {family.name} in {records.RECORD_DIR}/: its Triton kernels "
                    f"({', '.join(triton_sources(family))}) ran only under the CPU interpreter here; {RECORD_HINT}")
    current = records.blob_ids(family.source_files())
    verdicts = [(record, record_problem(family, record, current)) for record in cuda]
    vouching = sorted((r for r, problem in verdicts if problem is None), key=lambda r: records.cross_device(r) != "pass")
    if not vouching:
        return Step("gpu-record", family.name, False, "\n".join(problem for _, problem in verdicts))
    best = vouching[0]
    lines = [f"{records.device_text(r['device'])}: {problem or 'current, every route passed'}; {cross_device_note(r)}"
             for r, problem in verdicts]
    return Step("gpu-record", family.name, True,
                "\n".join([f"current record from {records.device_text(best['device'])} (commit "
                           f"{best['commit'][:12]}); {cross_device_note(best)}", *lines]))


def _sentinel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_sentinel", *args], cwd=project_root(), capture_output=True,
                          text=True)


def verify_step(family: Family, quick: bool) -> Step:
    """``sentinel verify --family F --device cpu`` in a fresh process (the Triton interpreter needs one)."""
    repro = f"sentinel verify --family {family.name} --device cpu{' --quick' if quick else ''}"
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp, "report.json")
        done = _sentinel("verify", "--family", family.name, "--device", "cpu", "--json", str(report_path),
                         *(["--quick"] if quick else []))
        report = json.loads(report_path.read_text()) if report_path.exists() else None
    if done.returncode == 0 and report is not None:
        return Step("verify-cpu", family.name, True, f"{len(report['routes'])} routes passed on the CPU")
    if report is None:
        return Step("verify-cpu", family.name, False, f"verify exited {done.returncode} without a report: "
                    f"reproduce with `{repro}`\n{_clip(done.stderr or done.stdout, keep_end=True)}")
    failed = [f"{r['id']} ({', '.join(c['name'] for c in r['checks'] if c['status'] != 'pass')})"
              for r in report["routes"] if r["status"] != "pass"]
    problems = [*(["failing routes: " + "; ".join(failed)] if failed else []), *report.get("problems", [])]
    return Step("verify-cpu", family.name, False,
                f"{'; '.join(problems) or 'no route ran'}: reproduce with `{repro}`")


def trace_step(families: Sequence[Family]) -> Step:
    """The check of ``sentinel trace --check``, in this process."""
    try:
        found = trace.drift(trace.generate(families), trace.traces_dir())
    except (RuntimeError, ValueError) as exc:  # TraceError, git failing, no family at all
        return Step("trace-check", "*", False, f"the traces cannot be generated: {exc}")
    if not found:
        return Step("trace-check", "*", True, "traces match the code")
    stale = ", ".join(f"{(trace.traces_dir() / d.path).relative_to(project_root())} ({d.kind})" for d in found)
    evidence = _clip("".join(d.diff for d in found), keep_end=False)
    return Step("trace-check", "*", False, f"traces out of date: {stale}: {TRACE_HINT}\n{evidence}".strip())


# ------------------------------------------------------------------------------------------------------- gate


def run_gate(base: Optional[str], quick: bool, cpu_verify: bool = True
             ) -> tuple[list[str], dict[str, list[str]], list[Step]]:
    """The changed files (empty without ``base``), the affected families with the files that affect them, and
    every step's outcome (``cpu_verify``: with the CPU verification of each affected family)."""
    changed = changed_files(base) if base is not None else []
    try:
        families, broken = registry.select_with_broken(None)
    except ValueError as exc:  # two families of one name
        return changed, {}, [Step("registry", "*", False, f"cannot load the kernel families: {exc}")]
    steps = [Step("registry", b.name, False, f"family {b.name} failed to load ({b.where}): {b.error}: fix its "
                  f"registration") for b in broken]
    if base is None:
        reasons = {f.name: ["no --base: every family"] for f in families}
    else:
        reasons = {f.name: files for f in families if (files := affected(f, changed))}
    for family in families:
        if family.name in reasons:
            with rooted(family.root):
                if cpu_verify:
                    steps.append(verify_step(family, quick))
                if triton_sources(family):
                    steps.append(gpu_record_step(family))
    for root, group in registry.by_root(families).items():
        with rooted(root):
            steps.append(trace_step(group))
    return changed, reasons, steps


def register(subparsers: argparse._SubParsersAction) -> None:
    from kernel_sentinel.cli import COMMANDS

    parser = subparsers.add_parser("gate", help=COMMANDS["gate"][1],
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", metavar="REF", help="check only the families affected by changes since REF "
                        "(from the merge base of REF and HEAD), e.g. origin/main")
    parser.add_argument("--quick", action="store_true", help="pass --quick to sentinel verify")
    parser.add_argument("--no-cpu-verify", dest="cpu_verify", action="store_false",
                        help="leave out the CPU verification (when this job has just run `sentinel verify` on the "
                        "same tree): GPU records and traces only")
    parser.add_argument("--json", metavar="PATH", help="write the gate result as JSON")
    parser.add_argument("--junit", metavar="PATH", help="write the gate result as JUnit XML")


def write_junit(path: str, steps: Sequence[Step]) -> None:
    """One ``testcase`` per step (``classname`` gate.<family>, ``name`` the step)."""
    cases = [JUnitCase(f"gate.{s.family}", s.name, s.passed, s.headline, s.detail) for s in steps]
    save_junit(path, junit_tree("sentinel gate", cases))


def print_summary(base: Optional[str], changed: Sequence[str], reasons: dict[str, list[str]],
                  steps: Sequence[Step]) -> None:
    """Affected families (stderr), a table of steps with their verdicts, each failure's evidence, a last line."""
    if base is not None:
        console.err.print(f"{len(changed)} files changed since {base}; affected families: "
                          f"{', '.join(sorted(reasons)) or 'none (verification not needed)'}", highlight=False)
    table = Table(title="sentinel gate")
    for column in ("step", "family", "status", "detail"):
        table.add_column(column, overflow="fold")
    for step in steps:
        status = "[green]pass[/]" if step.passed else "[bold red]FAIL[/]"
        table.add_row(step.name, step.family, status, escape(step.headline))
    console.out.print(table)
    for step in steps:
        evidence = step.detail.partition("\n")[2]
        if not step.passed and evidence:
            console.out.print(f"[bold red]{step.name}[/] {escape(step.family)}:\n{escape(evidence)}",
                              soft_wrap=True, highlight=False)
    failed = sum(not s.passed for s in steps)
    console.out.print(f"gate {'failed' if failed else 'passed'}: {len(steps) - failed}/{len(steps)} steps passed",
                      highlight=False)


def run(args: argparse.Namespace) -> int:
    if args.base is not None:
        try:
            merge_base(args.base)
        except RuntimeError:
            return console.usage_error(f"--base {args.base!r} is not a commit that shares history with HEAD "
                                       "(in CI, fetch the base branch with its history)")
    problem = unwritable({"--json": args.json, "--junit": args.junit})
    if problem:
        return console.usage_error(problem)
    changed, reasons, steps = run_gate(args.base, args.quick, args.cpu_verify)
    print_summary(args.base, changed, reasons, steps)
    passed = all(s.passed for s in steps)
    if args.json:
        Path(args.json).write_text(records.dumps({
            "base": args.base, "changed": changed, "affected": reasons,
            "status": "pass" if passed else "fail", "steps": [s.as_dict() for s in steps]}))
    if args.junit:
        write_junit(args.junit, steps)
    return 0 if passed else 1
