"""How verification results are shown and written: a rich progress bar (stderr), a rich table (stdout), the JSON
report and JUnit XML.

JSON report: ``{"commit", "device": {"type", "name", "gpus"}, "routes": [<route result, see
kernel_sentinel.records>]}``, plus ``"problems"`` (a list of strings) when a family's declarations are broken;
``sentinel verify`` adds ``"devices"``: the run's wall time and each device's share of the work
(:class:`kernel_sentinel.workers.Share`). JUnit: one ``testcase`` per route,
dtype and check (``classname`` = route id, ``name`` = ``check[dtype]``), and one failing ``testcase`` per problem
(``classname`` ``sentinel.problems``), so that the JUnit file fails whenever the exit code does.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kernel_sentinel import console
from kernel_sentinel.records import CheckResult, RouteResult, device_text, dumps


def progress_bar() -> Progress:
    """The progress bar of long sentinel runs (stderr): description, bar, done / total, elapsed time."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console.err)


def log_row(result: RouteResult, done: int, total: int) -> None:
    """Where stderr is not a terminal (CI logs, a GPU machine's log file: no live progress bar), one line per
    finished row: ``[done/total] route dtype: pass|FAIL in S s`` (S: the time its checks took)."""
    if not console.err.is_terminal:
        seconds = sum(c.seconds or 0.0 for c in result.checks)
        console.err.print(f"[{done}/{total}] {result.id} {result.dtype}: {result.status} in {seconds:.1f} s",
                          highlight=False, markup=False)


def run_with_progress(selected: Sequence[tuple[Any, str, Any]], options: Any,
                      verify_route: Callable[..., RouteResult], checks: Sequence[str]) -> list[RouteResult]:
    """``verify_route(family, route_id, options, progress, dtype)`` for each selected ``(family, route id, dtype)``,
    with a progress bar on stderr that advances once per check (and :func:`log_row` lines)."""
    results = []
    with progress_bar() as progress:
        task = progress.add_task("verify", total=len(selected) * len(checks))
        for i, (family, route_id, dtype) in enumerate(selected):
            label = f"{route_id} {str(dtype).removeprefix('torch.')}"

            def step(check: str, label: str = label, done: int = i * len(checks)) -> None:
                progress.update(task, completed=done + checks.index(check), description=f"{label} {check}")

            results.append(verify_route(family, route_id, options, step, dtype))
            log_row(results[-1], i + 1, len(selected))
        progress.update(task, completed=len(selected) * len(checks), description="verify")
    return results


def of_tol_text(of_tol: float) -> str:
    """A check's criterion: its largest error as a fraction of the allowed bound, ``0.21 of tol``."""
    return f"{of_tol:.2g} of tol"


def _error_cell(check: Optional[CheckResult]) -> str:
    return "-" if check is None or check.of_tol is None else of_tol_text(check.of_tol)


def _tolerance_cell(check: Optional[CheckResult]) -> str:
    if check is None or check.atol is None:
        return "-"
    return f"{check.atol:g} + {check.rtol:g}·|ref|"


def _find(result: RouteResult, name: str) -> Optional[CheckResult]:
    return next((c for c in result.checks if c.name == name), None)


def results_table(results: Sequence[RouteResult]) -> Table:
    """One row per route and dtype: checks passed, the largest error vs reference and vs exact as a fraction of the
    bound it must stay under (elementwise ``|x - ref| <= atol + rtol * |ref|``: passes at <= 1), that bound,
    status. The absolute and relative errors are in the JSON report."""
    table = Table(title="sentinel verify", show_lines=False)
    table.add_column("route", no_wrap=True)
    table.add_column("dtype")
    table.add_column("checks")
    table.add_column("vs reference", justify="right")
    table.add_column("vs exact", justify="right")
    table.add_column("tol (|x - ref| <= tol)", justify="right")
    table.add_column("status")
    for r in results:
        failed = [c.name for c in r.checks if not c.passed]
        passed = len(r.checks) - len(failed)
        checks = f"{passed}/{len(r.checks)}" + (f" failed: {', '.join(failed)}" if failed else "")
        reference = _find(r, "reference")
        status = "[green]pass[/]" if r.passed else "[bold red]FAIL[/]"
        table.add_row(r.id, r.dtype, checks, _error_cell(reference), _error_cell(_find(r, "exact")),
                      _tolerance_cell(reference), status)
    return table


def print_results(results: Sequence[RouteResult], problems: Sequence[str], elapsed: float,
                  device: dict[str, Any],
                  routing: Callable[[RouteResult, CheckResult], Sequence[str]] = lambda r, c: ()) -> None:
    """The table, then every failing check with its detail, repro command and ``routing(result, check)`` lines
    (the family's failure-mode entries), then a one-line summary."""
    out = console.out
    out.print(results_table(results))
    for r in results:
        for c in r.checks:
            if not c.passed:
                out.print(f"[bold red]FAIL[/] {escape(r.id)} [bold]{c.name}[/] at {r.dtype}: {escape(c.detail)}",
                          soft_wrap=True)
                out.print(f"     reproduce: {escape(c.repro)}", soft_wrap=True, highlight=False)
                for line in routing(r, c):
                    out.print(f"     {escape(line)}", soft_wrap=True, highlight=False)
    for problem in problems:
        out.print(f"[bold red]FAIL[/] {escape(problem)}", soft_wrap=True)
    if not results:
        out.print("[bold red]no route ran[/]")
    out.print(summary_line(results, problems, elapsed, device), highlight=False, soft_wrap=True)  # one line


def summary_line(results: Sequence[RouteResult], problems: Sequence[str], elapsed: float,
                 device: dict[str, Any]) -> str:
    """``N routes on DEVICE: P passed, F failed[, K problems] in S s (...)``: every failure that sets the exit
    code is counted, the failed rows and the ``problems`` (broken declarations, unreached coverage lines)."""
    failed = sum(not r.passed for r in results)
    dtypes = ", ".join(dict.fromkeys(r.dtype for r in results))
    counted = f", {len(problems)} problem{'s' if len(problems) != 1 else ''} (FAIL above)" if problems else ""
    return (f"{len(results)} routes on {device_text(device)}: {len(results) - failed} passed, {failed} failed"
            f"{counted} in {elapsed:.1f} s (one row per route and dtype: {dtypes or 'none'})")


def json_report(results: Sequence[RouteResult], commit: str, device: dict[str, Any],
                problems: Sequence[str] = ()) -> dict[str, Any]:
    report: dict[str, Any] = {"commit": commit, "device": dict(device), "routes": [r.as_dict() for r in results]}
    if problems:
        report["problems"] = list(problems)
    return report


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(report))


PROBLEMS_CLASS = "sentinel.problems"


@dataclass(frozen=True)
class JUnitCase:
    """One JUnit ``testcase``: a failure carries ``message`` (first 500 characters) and ``text``; a pass, ``text``
    as its output."""

    classname: str
    name: str
    passed: bool
    message: str
    text: str


def junit_tree(suite_name: str, cases: Sequence[JUnitCase]) -> ET.ElementTree:
    """A ``testsuites`` document holding one suite of ``cases`` (shared by verify and gate)."""
    failures = str(sum(not c.passed for c in cases))
    suites = ET.Element("testsuites", name="sentinel", tests=str(len(cases)), failures=failures)
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(cases)), failures=failures,
                          errors="0", skipped="0")
    for c in cases:
        case = ET.SubElement(suite, "testcase", classname=c.classname, name=c.name)
        if c.passed:
            ET.SubElement(case, "system-out").text = c.text
        else:
            ET.SubElement(case, "failure", message=c.message[:500]).text = c.text
    ET.indent(suites)
    return ET.ElementTree(suites)


def save_junit(path: Path, tree: ET.ElementTree) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def junit_xml(results: Sequence[RouteResult], problems: Sequence[str] = ()) -> ET.ElementTree:
    """One ``testcase`` per (route, dtype, check); a failing check carries its detail and repro. Each of ``problems``
    (broken declarations, e.g. a missing invariant test) is one more failing ``testcase``."""
    cases = [JUnitCase(r.id, f"{c.name}[{r.dtype}]", c.passed, c.detail,
                       c.detail if c.passed else f"{c.detail}\nreproduce: {c.repro}")
             for r in results for c in r.checks]
    cases += [JUnitCase(PROBLEMS_CLASS, p, False, p, p) for p in problems]
    return junit_tree("sentinel verify", cases)


def write_junit(path: Path, results: Sequence[RouteResult], problems: Sequence[str] = ()) -> None:
    save_junit(path, junit_xml(results, problems))
