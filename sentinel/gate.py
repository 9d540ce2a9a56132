"""``sentinel gate``: the CI gate for kernel changes.

CI machines usually have no GPU, so the gate runs what a CPU can and demands a current GPU record for the rest:

1. **affected families**: with ``--base REF``, the files changed since REF (committed, staged, unstaged and
   untracked) are mapped to families through the registry (``Family.source_files()``); a change under
   ``sentinel/`` or to ``pyproject.toml`` affects every family. Without ``--base`` every family is affected.
2. **verify** each affected family on the CPU (``sentinel verify --device cpu``: Triton under its interpreter).
3. **traces**: ``sentinel trace --check`` (always: it is cheap, and a hand-edited trace must fail).
4. **GPU record**: each affected family whose sources define Triton kernels needs a record from a CUDA device
   (``traces/verification/<family>-cuda-*.json``) whose git blob ids match the current sources and whose routes
   all passed.

A docs-only change affects no family: the gate runs the trace check and nothing else. Exit 0 when every step
passed, 1 on a failure, 2 on a usage error (e.g. an unknown ``--base``).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from rich.markup import escape
from rich.table import Table

from sentinel import console, records, registry
from sentinel.family import REPO_ROOT, Family

GLOBAL_INPUTS = ("sentinel/", "pyproject.toml")
RECORD_HINT = "run `sentinel verify --device cuda --record` on a GPU and commit the record"


@dataclass(frozen=True)
class Step:
    """One gate step's outcome; ``detail`` says what to do when it failed."""

    name: str
    family: str
    passed: bool
    detail: str

    def as_dict(self) -> dict:
        return {"name": self.name, "family": self.family, "status": "pass" if self.passed else "fail",
                "detail": self.detail}


def changed_files(base: str) -> list[str]:
    """Repo-relative paths that differ from ``base``: committed since, staged, unstaged, and untracked."""
    diff = records.git("diff", "--name-only", base, "--").splitlines()
    untracked = records.git("ls-files", "--others", "--exclude-standard").splitlines()
    return sorted(set(diff) | set(untracked))


def affected(family: Family, changed: Sequence[str]) -> list[str]:
    """The changed files that can change ``family``'s behaviour."""
    sources = {str(p) for p in family.source_files()}
    return [f for f in changed if f in sources or f.startswith(GLOBAL_INPUTS)]


def triton_sources(family: Family) -> list[str]:
    """The family's source files that define Triton kernels."""
    return [str(p) for p in family.source_files() if "@triton.jit" in (REPO_ROOT / p).read_text()]


def gpu_record_step(family: Family) -> Step:
    """Pass when a CUDA record of ``family`` matches the current sources and all its routes passed."""
    current = records.blob_ids(family.source_files())
    cuda = [r for r in records.load_records() if r["family"] == family.name and r["device"]["type"] == "cuda"]
    if not cuda:
        return Step("gpu-record", family.name, False, f"no GPU verification record for {family.name}: {RECORD_HINT}")
    problems = []
    for record in cuda:
        stale = sorted(p for p in current if record["sources"].get(p) != current[p])
        failed = [r["id"] for r in record["routes"] if r["status"] != "pass"]
        if not stale and not failed:
            return Step("gpu-record", family.name, True, f"current record from {record['device']['name']}")
        if stale:
            problems.append(f"{', '.join(stale)} changed since its last GPU verification on "
                            f"{record['device']['name']}: {RECORD_HINT}")
        else:
            problems.append(f"the GPU record from {record['device']['name']} has failing routes "
                            f"{', '.join(failed)}: fix them, then {RECORD_HINT}")
    return Step("gpu-record", family.name, False, "; ".join(problems))


def _sentinel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sentinel", *args], cwd=REPO_ROOT, capture_output=True, text=True)


def verify_step(family: Family, quick: bool) -> Step:
    """``sentinel verify --family F --device cpu`` in a fresh process (the Triton interpreter needs one)."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp, "report.json")
        done = _sentinel("verify", "--family", family.name, "--device", "cpu", "--json", str(report_path),
                         *(["--quick"] if quick else []))
        if done.returncode == 0:
            routes = json.loads(report_path.read_text())["routes"]
            return Step("verify-cpu", family.name, True, f"{len(routes)} routes passed")
        if report_path.exists():
            routes = json.loads(report_path.read_text())["routes"]
            failed = [f"{r['id']} ({', '.join(c['name'] for c in r['checks'] if c['status'] != 'pass')})"
                      for r in routes if r["status"] != "pass"]
            detail = f"failing routes: {'; '.join(failed)}" if failed else "verify failed"
        else:
            detail = f"verify exited {done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}"
        return Step("verify-cpu", family.name, False,
                    f"{detail}; reproduce with `sentinel verify --family {family.name} --device cpu`")


def trace_step() -> Step:
    done = _sentinel("trace", "--check")
    if done.returncode == 0:
        return Step("trace-check", "*", True, "traces match the code")
    stale = (done.stdout + done.stderr).strip()
    return Step("trace-check", "*", False,
                f"traces are stale: run `sentinel trace` and commit the result\n{stale[-1500:]}")


def run_gate(base: Optional[str], quick: bool) -> tuple[list[str], dict[str, list[str]], list[Step]]:
    """The changed files (None-base: empty), the affected families with their reasons, and every step."""
    families = registry.families()
    if base is None:
        changed: list[str] = []
        reasons = {f.name: ["no --base: every family"] for f in families}
    else:
        changed = changed_files(base)
        reasons = {f.name: files for f in families if (files := affected(f, changed))}
    steps = []
    for family in families:
        if family.name not in reasons:
            continue
        steps.append(verify_step(family, quick))
        if triton_sources(family):
            steps.append(gpu_record_step(family))
    steps.append(trace_step())
    return changed, reasons, steps


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gate", help="CI gate: CPU verification, trace drift, current GPU records",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", metavar="REF", help="check only the families affected by changes since REF")
    parser.add_argument("--quick", action="store_true", help="pass --quick to sentinel verify")
    parser.add_argument("--json", metavar="PATH", help="write the gate result as JSON")
    parser.add_argument("--junit", metavar="PATH", help="write the gate result as JUnit XML")


def write_junit(path: str, steps: Sequence[Step]) -> None:
    suite = ET.Element("testsuite", name="sentinel gate", tests=str(len(steps)),
                       failures=str(sum(not s.passed for s in steps)))
    for step in steps:
        case = ET.SubElement(suite, "testcase", classname=f"gate.{step.family}", name=step.name)
        if not step.passed:
            ET.SubElement(case, "failure", message=step.detail.splitlines()[0]).text = step.detail
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def run(args: argparse.Namespace) -> int:
    if args.base is not None:
        try:
            records.git("rev-parse", "--verify", "--quiet", f"{args.base}^{{commit}}")
        except RuntimeError:
            return console.usage_error(f"--base {args.base!r} is not a commit of this repository")
    changed, reasons, steps = run_gate(args.base, args.quick)
    if args.base is not None:
        console.err.print(f"{len(changed)} files changed since {args.base}; affected families: "
                          f"{', '.join(sorted(reasons)) or 'none (verification not needed)'}", highlight=False)
    table = Table(title="sentinel gate")
    for column in ("step", "family", "status", "detail"):
        table.add_column(column, overflow="fold")
    for step in steps:
        status = "[green]pass[/]" if step.passed else "[bold red]FAIL[/]"
        table.add_row(step.name, step.family, status, escape(step.detail))
    console.out.print(table)
    passed = all(s.passed for s in steps)
    if args.json:
        Path(args.json).write_text(records.dumps({
            "base": args.base, "changed": changed, "affected": reasons,
            "status": "pass" if passed else "fail", "steps": [s.as_dict() for s in steps]}))
    if args.junit:
        write_junit(args.junit, steps)
    return 0 if passed else 1
