"""The trace site as a dashboard: status of every route on every recorded device, read from the records.

- :func:`route_status`: one cell of the matrix: a route on one device (every dtype of the record), ``pass``,
  ``fail``, ``stale`` (the record was made on other sources than the current ones; its result is shown too) or
  ``not run``; with the record's commit and that commit's date.
- :func:`rollup`: the home page's first table, one row per family and recorded device (one per GPU model: a record
  is one model's, whatever number of GPUs it ran on): status, routes passed, whether the record is current, the
  GPU count, the cross-device check (evidence only from a record made with a second GPU), sanitizer, coverage,
  mutation kill rate, the record's date and commit.
- :func:`matrix`: the home page's full table: families x routes x devices, plus the sanitizer result (GPU records,
  Triton routes) and the family's mutation kill rate (``traces/verification/mutation/<family>.json``, written by
  ``sentinel mutate --record``).
- :func:`decorate`: a Mermaid decision tree with its leaves coloured by status and linked to the route's row.
- :func:`failure_modes` and :func:`known_issues`: the failure-mode routing table and the known-issues table.
- :func:`glance`: the home page's first screen: :func:`headline` (families, routes, devices, which records are
  stale, failures, mutation scores) and :func:`grid` (family x device, each cell coloured by its status).
- :func:`without_roles`: Markdown with the Sphinx roles of docstrings (``:class:`~a.B```) turned into code spans.

Rendering only: what a record holds is defined in :mod:`kernel_sentinel.records`.
"""
from __future__ import annotations

import functools
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from kernel_sentinel.family import project_root
from kernel_sentinel.records import NOT_APPLICABLE, blob_ids, cross_device, git, gpus, row_key

MUTATION_DIR_NAME = "mutation"
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
# Status words with the theme's bundled SVG icons (material's emoji extension: they render offline, without system
# fonts)
SYMBOL = {"pass": ":material-check-circle: pass", "fail": ":material-close-circle: fail",
          "stale": ":material-clock-alert-outline: stale", "not run": ":material-minus-circle-outline: not run"}
COLOURS = {  # Mermaid classDef per status: fill, stroke, text
    "pass": ("#c8e6c9", "#2e7d32", "#1b5e20"),
    "fail": ("#ffcdd2", "#c62828", "#b71c1c"),
    "stale": ("#fff3c4", "#b28704", "#6d4c00"),
    "not run": ("#eeeeee", "#757575", "#424242"),
}
_LEAF = re.compile(r'^\s+(n\d+)\(\["([^"]+)"\]\)$')


@dataclass(frozen=True)
class Cell:
    """One route on one device: ``status`` (pass / fail / stale / not run), the recorded result behind a stale
    status, the record's commit and its date."""

    status: str
    recorded: str = ""
    commit: str = ""
    date: str = ""

    def text(self) -> str:
        shown = SYMBOL[self.status] + (f" ({self.recorded})" if self.status == "stale" else "")
        when = " ".join(x for x in (self.date, f"`{self.commit[:7]}`" if self.commit else "") if x)
        return f"{shown}<br>{when}" if when else shown


@functools.lru_cache(maxsize=None)
def commit_time(sha: str) -> int:
    """The commit time (seconds since the epoch) of ``sha``; 0 when the repository does not have it."""
    try:
        return int(git("show", "-s", "--format=%ct", sha)) if sha else 0
    except (RuntimeError, OSError, ValueError):
        return 0


@functools.lru_cache(maxsize=None)
def commit_date(sha: str) -> str:
    """The commit date (YYYY-MM-DD) of ``sha``; empty when the repository does not have it."""
    try:
        return git("show", "-s", "--format=%cs", sha)
    except (RuntimeError, OSError):
        return ""


def is_current(record: Mapping[str, Any], blobs: Mapping[str, str]) -> bool:
    """True when ``record`` was made on exactly the sources whose blob ids are ``blobs``."""
    return dict(record["sources"]) == dict(blobs)


def route_status(record: Mapping[str, Any], route_id: str, blobs: Mapping[str, str]) -> Cell:
    """The cell of ``route_id`` in ``record``: fail when any dtype row fails, pass when all pass."""
    rows = [r for r in record["routes"] if row_key(r)[0] == route_id]
    if not rows:
        return Cell("not run")
    result = "fail" if any(r["status"] != "pass" for r in rows) else "pass"
    commit = record.get("commit", "")
    status = result if is_current(record, blobs) else "stale"
    return Cell(status, result, commit, commit_date(commit) if commit else "")


def combined(cells: Sequence[Cell]) -> str:
    """One status from a route's cells on every device: fail if any current record fails it, pass if some
    current record passes it and none fails, stale if only stale records have it, else not run."""
    statuses = {c.status for c in cells}
    for status in ("fail", "pass", "stale"):
        if status in statuses:
            return status
    return "not run"


def device_label(record: Mapping[str, Any]) -> str:
    device = record["device"]
    return "CPU (interpreter)" if device["type"] == "cpu" else device["name"]


def sanitizer(records: Sequence[Mapping[str, Any]], route_id: str, triton: bool, blobs: Mapping[str, str]) -> str:
    """The compute-sanitizer result of a Triton route from the GPU records made on the current sources (``blobs``):
    pass when every tool passed on every dtype, else the failing tools. When no current record ran the tools, the
    result of the newest stale record that did (by commit time), marked stale with its commit; ``not run`` when
    none did; ``n/a`` for other routes."""
    if not triton:
        return "n/a"
    ran = [(r, checks) for r in records if r["device"]["type"] == "cuda" and (checks := _tool_checks(r, route_id))]
    current = [(r, checks) for r, checks in ran if is_current(r, blobs)]
    stale = sorted(((r, checks) for r, checks in ran if not is_current(r, blobs)),
                   key=lambda item: commit_time(item[0].get("commit", "")))
    chosen = current or stale[-1:]
    if not chosen:
        return SYMBOL["not run"]
    found: dict[str, str] = {}
    for name, status in (c for _, checks in chosen for c in checks):
        found[name] = "fail" if "fail" in (found.get(name), status) else status
    failing = [t for t in SANITIZER_TOOLS if found.get(t) == "fail"]
    missing = [t for t in SANITIZER_TOOLS if t not in found]
    word = "fail" if failing else "pass"
    detail = f": {', '.join(failing)}" if failing else f" (not run: {', '.join(missing)})" if missing else ""
    if current:
        return SYMBOL[word] + detail
    record, _ = chosen[0]
    commit = record.get("commit", "")
    return f"{SYMBOL['stale']} ({word}{detail})" + (f"<br>`{commit[:7]}`" if commit else "")


def _tool_checks(record: Mapping[str, Any], route_id: str) -> list[tuple[str, str]]:
    """``(tool, status)`` of every compute-sanitizer check on the dtype rows of ``route_id`` in ``record``."""
    return [(c["name"], c["status"]) for row in record["routes"] if row_key(row)[0] == route_id
            for c in row["checks"] if c["name"] in SANITIZER_TOOLS]


def load_mutation(records_dir: Path, family: str) -> Optional[dict[str, Any]]:
    """The mutation record of ``family`` (None when ``sentinel mutate --record`` has not written one)."""
    path = records_dir / MUTATION_DIR_NAME / f"{family}.json"
    return json.loads(path.read_text()) if path.is_file() else None


@functools.lru_cache(maxsize=None)
def _blob_at(commit: str, path: str) -> str:
    """The blob id of ``path`` at ``commit`` (empty when the repository does not have it)."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{commit}:{path}")
    except (RuntimeError, OSError):
        return ""


def mutation_is_current(mutation: Mapping[str, Any]) -> bool:
    """True when every file the mutation record sampled (``files``) is as it was at the record's commit."""
    paths = sorted(mutation.get("files", {}))
    now = blob_ids([Path(p) for p in paths if (project_root() / p).is_file()])
    return all(_blob_at(mutation["commit"], p) == now.get(p, "gone") for p in paths)


def kill_rate(mutation: Optional[Mapping[str, Any]], short: bool = False) -> str:
    """The kill rate of a mutation record: ``short`` the percentage alone, else with the sample, date and
    commit; either marked stale when a sampled file changed since the record's commit."""
    if mutation is None or mutation.get("kill_rate") is None:
        return "not measured"
    stale = "" if mutation_is_current(mutation) else f" {SYMBOL['stale']} (sources changed since)"
    if short:
        return f"{mutation['kill_rate']:.0f}%{stale}"
    counted = mutation["sampled"] - mutation.get("equivalent_sampled", 0)  # sampled mutants shown equivalent: out
    return (f"{mutation['kill_rate']:.1f}% ({mutation['killed']}/{counted}){stale}<br>{mutation['date']} "
            f"`{mutation['commit'][:7]}`")


def decorate(diagram: str, statuses: Mapping[str, str], links: Mapping[str, str]) -> str:
    """``diagram`` (a Mermaid flowchart whose leaves are ``nX(["route id"])``) with every leaf of ``statuses``
    in that status's class and, for the ids in ``links``, a click link to that URL."""
    lines = diagram.splitlines()
    extra = [f"    classDef {name.replace(' ', '_')} fill:{fill},stroke:{stroke},color:{text}"
             for name, (fill, stroke, text) in COLOURS.items()]
    for line in lines:
        match = _LEAF.match(line)
        if match and match.group(2) in statuses:
            node, route_id = match.groups()
            extra.append(f"    class {node} {statuses[route_id].replace(' ', '_')}")
            if route_id in links:
                extra.append(f'    click {node} href "{links[route_id]}" "{route_id}: {statuses[route_id]}"')
    return "\n".join(lines + extra)


def route_anchor(route_id: str) -> str:
    """The HTML id of a route's row in the routes table of its pages."""
    return "route-" + re.sub(r"[^a-z0-9]+", "-", route_id.lower()).strip("-")


def anchor(route_id: str) -> str:
    """An empty HTML anchor for a route's row (put in its first cell)."""
    return f'<a id="{html.escape(route_anchor(route_id))}"></a>'


@dataclass(frozen=True)
class FamilyStatus:
    """What the matrix needs of one family: its routes (id, link to the route's row, is it a Triton route), its
    records (every device), the blob ids of its current sources and its mutation record."""

    family: str
    routes: Sequence[tuple[str, str, bool]]
    records: Sequence[Mapping[str, Any]]
    blobs: Mapping[str, str]
    mutation: Optional[Mapping[str, Any]]

    def cells(self, route_id: str) -> dict[str, Cell]:
        return {device_label(r): route_status(r, route_id, self.blobs) for r in self.records}


def devices(statuses: Sequence[FamilyStatus]) -> list[str]:
    """Device labels of every record, the CPU first, then the GPUs by name."""
    labels = {device_label(r): r["device"]["type"] for s in statuses for r in s.records}
    return sorted(labels, key=lambda label: (labels[label] != "cpu", label))


def matrix(statuses: Sequence[FamilyStatus], family_column: bool = True) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the status matrix: one row per route; a column per device, the sanitizer result and the
    family's kill rate."""
    columns = devices(statuses)
    header = (["family"] if family_column else []) + ["route"] + columns + ["sanitizer", "mutation kill rate"]
    rows = []
    for status in statuses:
        rate = kill_rate(status.mutation)
        for route_id, link, triton in status.routes:
            cells = status.cells(route_id)
            row = [f"[`{route_id}`]({link})"]
            row += [cells[c].text() if c in cells else SYMBOL["not run"] for c in columns]
            row += [sanitizer(status.records, route_id, triton, status.blobs), rate]
            rows.append(([status.family] if family_column else []) + row)
    return header, rows


def _sanitized(record: Mapping[str, Any], route_id: str) -> bool:
    """Every compute-sanitizer tool ran and passed on every dtype row of ``route_id`` in ``record``."""
    tools = _tool_checks(record, route_id)
    return {t for t, _ in tools} == set(SANITIZER_TOOLS) and all(s == "pass" for _, s in tools)


def coverage_summary(record: Mapping[str, Any]) -> str:
    """The kernel lines a CPU record's ``--coverage`` run reached in its judged files, and ``clean`` when no line
    there went unreached without a declaration."""
    files = [f for f in (record.get("coverage") or {}).get("files", []) if f["judged"]]
    if not files:
        return "not measured"
    reached, total = sum(f["reached"] for f in files), sum(f["statements"] for f in files)
    undeclared = sum(len(f["unreached"]) for f in files)
    return f"{reached}/{total}, " + ("clean" if not undeclared else f"{undeclared} unreached undeclared")


def rollup(statuses: Sequence[FamilyStatus], every_route: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the one-screen status: a row per family and recorded device (the CPU first; a row per
    dtype where the dtypes' results differ) with its status (pass when every route passed), routes passed /
    routes, whether the record is current (**STALE**: made on other sources than today's), the number of GPUs it
    ran on, the cross-device check (:func:`cross_devices`), the sanitizer (GPU: Triton routes with every tool
    clean), coverage (CPU), the mutation kill rate and the record's date and commit; the device links to
    ``every_route``, the full matrix (where the mutation record's date and commit are)."""
    header = ["family", "device", "status", "routes passed", "current", "GPUs", "cross-device", "sanitizer",
              "coverage", "mutants killed", "record"]
    rows = []
    for status in statuses:
        for record in sorted(status.records, key=lambda r: (r["device"]["type"] != "cpu", device_label(r))):
            routes = [r for r, _, _ in status.routes]
            by_dtype = {d: _passed(record, routes, d) for d in sorted({row_key(r)[1] for r in record["routes"]})}
            split = len(set(by_dtype.values())) > 1  # the dtypes' results differ: a row each
            for dtype, passed in (by_dtype.items() if split else [("", _passed(record, routes))]):
                rows.append(_rollup_row(status, record, routes, passed, dtype, every_route))
    return header, rows


def cross_devices(record: Mapping[str, Any]) -> str:
    """The cross-device cell of a record (:func:`kernel_sentinel.records.cross_device`): pass, fail, not run (a
    record older than the check), or not applicable with the GPU count: no evidence; n/a on the CPU."""
    if record["device"]["type"] != "cuda":
        return "n/a"
    found = cross_device(dict(record))
    if found in ("pass", "fail", "not run"):
        return SYMBOL[found]
    if found.startswith(NOT_APPLICABLE):
        return f":material-minus-circle-outline: {found} (no evidence)"
    return f"{SYMBOL['pass']} {found.removeprefix('pass ')}"


def _passed(record: Mapping[str, Any], routes: Sequence[str], dtype: str = "") -> int:
    """How many of ``routes`` have rows in ``record`` (at ``dtype``, or every dtype) and all of them passed."""
    count = 0
    for route_id in routes:
        rows = [r for r in record["routes"] if row_key(r)[0] == route_id and (not dtype or row_key(r)[1] == dtype)]
        count += bool(rows) and all(r["status"] == "pass" for r in rows)
    return count


def _rollup_row(status: FamilyStatus, record: Mapping[str, Any], routes: Sequence[str], passed: int, dtype: str,
                every_route: str) -> list[str]:
    current = is_current(record, status.blobs)
    triton = [r for r, _, is_triton in status.routes if is_triton]
    gpu = record["device"]["type"] == "cuda"
    commit = record.get("commit", "")
    mutation = status.mutation
    device = device_label(record) + (f", {dtype}" if dtype else "")
    return [f"[{status.family}]({status.family}/index.md)", f"[{device}]({every_route})",
            SYMBOL["pass" if passed == len(routes) else "fail"], f"{passed}/{len(routes)}",
            ":material-check-circle: current" if current else SYMBOL["stale"].replace(" stale", " **STALE**"),
            str(len(gpus(dict(record["device"])))) if gpu else "n/a", cross_devices(record),
            f"{sum(_sanitized(record, r) for r in triton)}/{len(triton)} Triton" if gpu else "n/a",
            "n/a" if gpu else coverage_summary(record),
            kill_rate(mutation, short=True),
            " ".join(x for x in (commit_date(commit), f"`{commit[:7]}`" if commit else "") if x)]


def slug(heading: str) -> str:
    """The anchor the site gives a heading (Python-Markdown's toc default): backticks dropped, lower case,
    characters other than word characters, spaces and hyphens removed, runs of spaces and hyphens as one ``-``."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown document: its headings' slugs and the ids of its ``<a id>`` tags."""
    found = {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", markdown, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"></a>', markdown))


def broken_link(target: str, documents: Mapping[str, str], guide: Path) -> Optional[str]:
    """Why ``target`` (``page.md`` or ``page.md#anchor``, relative to the trace directory) does not resolve
    among the generated ``documents`` and the hand-written pages under ``guide`` (None when it does)."""
    page, _, fragment = target.partition("#")
    if page in documents:
        text = documents[page]
    elif page.startswith(f"{guide.name}/") and (guide.parent / page).is_file():
        text = (guide.parent / page).read_text()
    else:
        return f"{page} is neither a generated trace nor a page under {guide.name}/"
    if fragment and fragment not in anchors(text):
        return f"{page} has no section #{fragment}"
    return None


# A Sphinx role (``:class:`~pkg.mod.Name```, ``:py:func:`f```, ``:ref:`text <target>```) and a fenced code block
_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")
_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)


def without_roles(markdown: str) -> str:
    """``markdown`` with every Sphinx role outside fenced code blocks as a code span: ``:class:`~a.B``` -> ```B```
    (the ``~`` form shows the last name), ``:func:`a.f``` -> ```a.f```, ``:ref:`text <target>``` -> ```text```."""

    def code(match: re.Match) -> str:
        shown = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
        return f"`{shown}`"

    parts, last = [], 0
    for fence in _FENCE.finditer(markdown):
        parts += [_ROLE.sub(code, markdown[last:fence.start()]), fence.group(0)]
        last = fence.end()
    return "".join(parts + [_ROLE.sub(code, markdown[last:])])


GRID_CLASS = "sentinel-{}"  # the stylesheet of sentinel/site.py colours each status class


@dataclass(frozen=True)
class DeviceState:
    """One family on one device: ``status`` (pass / fail / stale / not run), routes passed and routes, and the
    recorded result behind a stale status."""

    status: str
    passed: int = 0
    routes: int = 0
    recorded: str = ""

    def cell(self) -> str:
        """The grid's cell: the status with its icon, coloured (``GRID_CLASS``), with the routes passed."""
        count = f" {self.passed}/{self.routes}" if self.routes else ""
        text = SYMBOL[self.status] + (f" ({self.recorded}{count})" if self.status == "stale" else count)
        return f'<span class="{GRID_CLASS.format(self.status.replace(" ", "-"))}">{text}</span>'


def device_states(status: FamilyStatus) -> dict[str, DeviceState]:
    """The state of ``status``'s family on each recorded device (by :func:`device_label`)."""
    routes = [r for r, _, _ in status.routes]
    states = {}
    for record in status.records:
        passed = _passed(record, routes)
        result = "pass" if passed == len(routes) else "fail"
        current = is_current(record, status.blobs)
        states[device_label(record)] = DeviceState(result if current else "stale", passed, len(routes), result)
    return states


def headline(statuses: Sequence[FamilyStatus]) -> str:
    """One line: families, routes and devices; which devices' records are all current and which are stale (for
    which families); the failures of current records; every family's mutation kill rate."""
    columns = devices(statuses)
    states = {s.family: device_states(s) for s in statuses}
    routes = sum(len(s.routes) for s in statuses)
    parts = [f"**{len(statuses)} families, {routes} routes, {len(columns)} devices**"]
    for device in columns:
        stale = [f for f in states if states[f].get(device, DeviceState("not run")).status == "stale"]
        missing = [f for f in states if device not in states[f]]
        if stale:
            parts.append(f"{device}: {SYMBOL['stale'].replace(' stale', ' **STALE**')} ({', '.join(stale)})")
        elif not missing:
            parts.append(f"{device}: :material-check-circle: all current")
        if missing:
            parts.append(f"{device}: {SYMBOL['not run']} ({', '.join(missing)})")
    failing = [f"{f} on {d}" for f in states for d, state in states[f].items() if state.status == "fail"]
    parts.append(f"{SYMBOL['fail']}: {', '.join(failing)}" if failing else "no failures in current records")
    rates = [f"{s.family} {kill_rate(s.mutation, short=True)}" for s in statuses]
    parts.append("mutants killed: " + ", ".join(rates))
    return " · ".join(parts)


def grid(statuses: Sequence[FamilyStatus]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the family x device grid: a row per family, a column per device (the CPU first), each
    cell its :class:`DeviceState`, then the family's mutation kill rate."""
    columns = devices(statuses)
    rows = []
    for status in statuses:
        states = device_states(status)
        rows.append([f"[{status.family}]({status.family}/index.md)"]
                    + [states.get(c, DeviceState("not run")).cell() for c in columns]
                    + [kill_rate(status.mutation, short=True)])
    return ["family", *columns, "mutants killed"], rows
