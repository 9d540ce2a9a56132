"""``sentinel verify --profile``: where a verification's time goes, per check, per row and per family.

Every check of every row is timed already (``CheckResult.seconds``: wall time, properties summed over their
``--jobs`` units). With ``--profile`` each check also counts the Triton kernel launches it makes in the process
that runs it and that process's CPU time (:func:`counting`, keyed ``(family, route id, dtype, check)``): under the
interpreter a launch is the unit of cost, and on a shared machine the CPU time is what the check would take alone.
Launches and CPU time inside child processes (``observed``'s kernel-less runs, forked one per kernel) are not
counted: they show in the check's wall seconds only. A ``--jobs`` worker sends its counts back with each unit
(:func:`take`, :func:`add`).

:func:`summary` is the profile as the JSON report holds it (``profile``): the run's wall time, then per check,
per family and per row the seconds (summed over the rows, in the verifying processes) and launches, largest first;
:func:`tables` prints it.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Mapping, Sequence

from kernel_sentinel.records import RouteResult

Key = tuple[str, str, str, str]  # family, route id, dtype, check
ROWS_SHOWN = 15  # the most expensive rows printed (the JSON report holds them all)

Counts = dict[Key, tuple[int, float]]  # launches, CPU seconds
_counts: Counts = {}  # this process's counts since the last take()


@contextlib.contextmanager
def counting(key: Key) -> Iterator[None]:
    """Count the Triton launches made inside the block and its CPU time (this process) under ``key``."""
    from kernel_sentinel.checks import kernel_launches

    start = time.process_time()
    with kernel_launches() as launched:
        try:
            yield
        finally:
            add({key: (len(launched), time.process_time() - start)})


def take() -> Counts:
    """The counts made in this process since the last call, removed from it."""
    taken = dict(_counts)
    _counts.clear()
    return taken


def add(counts: Mapping[Key, tuple[int, float]]) -> None:
    """Add a worker's counts (:func:`take` there) to this process's."""
    for key, (n, cpu) in counts.items():
        was = _counts.get(key, (0, 0.0))
        _counts[key] = was[0] + n, was[1] + cpu


def _entry(name: str, seconds: float, launches: int, cpu: float, total: float) -> dict[str, Any]:
    return {"name": name, "seconds": round(seconds, 2), "share": round(seconds / total, 4) if total else 0.0,
            "launches": launches, "cpu_seconds": round(cpu, 2)}


def summary(results: Sequence[RouteResult], counts: Mapping[Key, tuple[int, float]],
            wall_seconds: float) -> dict[str, Any]:
    """The profile of ``results`` with the counts ``counts`` (:func:`take`) and the run's wall time: ``checks``,
    ``families`` and ``rows`` (each entry its wall ``seconds``, ``share`` of all checks' seconds, ``launches`` and
    ``cpu_seconds``; a row also its checks'), largest first."""
    checks: dict[str, list[float]] = {}
    families: dict[str, list[float]] = {}
    rows = []
    for result in results:
        row_checks = {}
        for check in result.checks:
            n, cpu = counts.get((result.family, result.id, result.dtype, check.name), (0, 0.0))
            seconds = check.seconds or 0.0
            row_checks[check.name] = {"seconds": round(seconds, 2), "launches": n, "cpu_seconds": round(cpu, 2)}
            for totals, name in ((checks, check.name), (families, result.family)):
                totals.setdefault(name, [0.0, 0, 0.0])
                totals[name][0] += seconds
                totals[name][1] += n
                totals[name][2] += cpu
        rows.append({"family": result.family, "route": result.id, "dtype": result.dtype,
                     **{k: sum(c[k] for c in row_checks.values()) for k in ("seconds", "launches", "cpu_seconds")},
                     "checks": row_checks})
    total = sum(seconds for seconds, _, _ in checks.values())

    def ranked(totals: dict[str, list[float]]) -> list[dict[str, Any]]:
        return sorted((_entry(name, s, int(n), cpu, total) for name, (s, n, cpu) in totals.items()),
                      key=lambda e: -e["seconds"])

    for row in rows:
        row["seconds"], row["cpu_seconds"] = round(row["seconds"], 2), round(row["cpu_seconds"], 2)
        row["share"] = round(row["seconds"] / total, 4) if total else 0.0
    return {"wall_seconds": round(wall_seconds, 2), "check_seconds": round(total, 2),
            "cpu_seconds": round(sum(cpu for _, _, cpu in checks.values()), 2),
            "launches": sum(int(n) for _, n, _ in checks.values()), "rows_verified": len(rows),
            "checks": ranked(checks), "families": ranked(families),
            "rows": sorted(rows, key=lambda r: -r["seconds"])}


def tables(profile: Mapping[str, Any]) -> list[Any]:
    """A title line, then rich tables of :func:`summary`: per check, per family, and the :data:`ROWS_SHOWN` most
    expensive rows."""
    from rich.table import Table

    out: list[Any] = [f"profile: {profile['rows_verified']} rows, {profile['check_seconds']:.1f} s in checks "
                      f"({profile['cpu_seconds']:.1f} s CPU), wall {profile['wall_seconds']:.1f} s, "
                      f"{profile['launches']} Triton launches (launches and CPU: in the verifying processes)"]
    for what, entries in (("check", profile["checks"]), ("family", profile["families"])):
        table = Table()
        for column in (what, "seconds", "share", "CPU seconds", "launches"):
            table.add_column(column, justify="left" if column == what else "right")
        for e in entries:
            table.add_row(e["name"], f"{e['seconds']:.1f}", f"{100 * e['share']:.1f} %", f"{e['cpu_seconds']:.1f}",
                          str(e["launches"]))
        out.append(table)
    table = Table(title=f"the {min(ROWS_SHOWN, len(profile['rows']))} most expensive rows")
    for column in ("row", "seconds", "CPU seconds", "launches", "largest checks (s)"):
        table.add_column(column, justify="left" if column in ("row", "largest checks (s)") else "right")
    for row in profile["rows"][:ROWS_SHOWN]:
        largest = sorted(row["checks"].items(), key=lambda kv: -kv[1]["seconds"])[:3]
        table.add_row(f"{row['route']} {row['dtype']}", f"{row['seconds']:.1f}", f"{row['cpu_seconds']:.1f}",
                      str(row["launches"]), ", ".join(f"{name} {c['seconds']:.1f}" for name, c in largest))
    out.append(table)
    return out
