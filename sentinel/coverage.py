"""``sentinel verify --coverage``: which lines of each family's kernel sources the verification executed.

Under the Triton interpreter (the CPU device) ``@triton.jit`` functions run as plain Python, so coverage.py
measures them like the rest of the family; on a GPU they are compiled and cannot be measured, so coverage needs
the CPU device.

What is measured: the *kernel sources* of a family are its :meth:`~kernel_sentinel.family.Family.source_files`
without the verifier's side: its registration (``family.py`` and its parts ``family_*.py``: the cases) and its
independent references (``oracle.py``, which tests exercise too). Of each file, the statements inside function
bodies count (module- and class-level statements run when the module is imported, which can happen before
measurement starts). Library files that several families import (``kernels/dispatch.py``, ...) are reported once,
with the lines reached by any family of the run.

Declared exceptions: a comment ``# verify: unreached (reason)`` declares that a statement is not reached by
verification, with the reason in parentheses (required). On the header of an ``if`` / ``for`` / ``while`` /
``with`` / ``try`` it declares the body (the header itself runs), on an ``else:`` / ``finally:`` line that clause,
on a ``def`` (or one of its decorators) or ``except`` line all of it; on a line of its own, the statement that
follows. Markers live in the
code, so line numbers never drift.

Verdict: a file is *judged* when every family that imports it was verified completely in this run (every route at
every dtype, full sizes: no ``--route``, ``--dtype`` or ``--quick``). In a judged file, a statement neither reached
nor declared is a problem, so is a declaration whose block was reached (stale) and a marker without a reason; the
run then fails. Files of a partial run are reported without a verdict.
"""
from __future__ import annotations

import ast
import contextlib
import fnmatch
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from rich.markup import escape
from rich.table import Table

from kernel_sentinel.family import Family, project_root

MARKER = re.compile(r"#\s*verify:\s*unreached\b\s*(?:\((?P<reason>.*)\))?")
VERIFIER_SIDE = ("family.py", "family_*.py", "oracle.py")  # registration with sentinel (and its parts), oracle


def kernel_sources(family: Family) -> list[Path]:
    """The family's source files (repo-relative where inside the repository) without the verifier's side in the
    family's package: its registration (``family.py`` and its parts ``family_*.py``) and its ``oracle.py``."""
    package = Path(next(iter(family.package.__path__))).resolve()
    return [p for p in family.source_files()
            if not (_absolute(p, family.root).parent == package
                    and any(fnmatch.fnmatch(p.name, g) for g in VERIFIER_SIDE))]


def kernel_root() -> Path:
    """The directory of the kernel library (``provable_kernels``), where every family's kernel sources are."""
    import provable_kernels

    return Path(next(iter(provable_kernels.__path__))).resolve()


def _absolute(path: Path, root: Optional[Path] = None) -> Path:
    """``path`` made absolute: relative paths are relative to ``root`` (default: the repository sentinel works in)."""
    return (path if path.is_absolute() else (root or project_root()) / path).resolve()


# ------------------------------------------------------------------------------------------------ measurement


class Measurement:
    """coverage.py restricted to the files under the directories ``roots``; :func:`measuring` starts and stops it."""

    def __init__(self, roots: Sequence[Path]):
        import coverage as coveragepy  # the coverage.py package (this module is kernel_sentinel.coverage)

        self.roots = tuple(roots)
        self._cov = coveragepy.Coverage(data_file=None, include=[f"{_absolute(r)}/*" for r in roots],
                                        config_file=False)
        self._cov.clear_exclude()  # no pragma hides a line: declarations are the markers of this module

    def start(self) -> None:
        self._cov.start()

    def stop(self) -> None:
        self._cov.stop()

    def executed(self) -> dict[str, list[int]]:
        """The lines run so far, per file (absolute path): what a ``--jobs`` worker sends back with each unit."""
        data = self._cov.get_data()
        return {name: sorted(data.lines(name) or ()) for name in data.measured_files()}

    def add(self, executed: dict[str, list[int]]) -> None:
        """Count the lines of another process's :meth:`executed` as run here too."""
        self._cov.get_data().add_lines(executed)

    def lines(self, path: Path) -> tuple[list[int], set[int]]:
        """coverage.py's statements of ``path`` (first line of each) and those that ran."""
        _, statements, _, missing, _ = self._cov.analysis2(str(_absolute(path)))
        return list(statements), set(statements) - set(missing)


@contextlib.contextmanager
def measuring(roots: Sequence[Path]) -> Iterator[Measurement]:
    """Measure the lines of the files under ``roots`` that run inside the block. Start it before the families
    are imported (:func:`kernel_root`), so that what runs at import (building dispatch trees) is seen too."""
    measurement = Measurement(roots)
    measurement.start()
    try:
        yield measurement
    finally:
        measurement.stop()


# ----------------------------------------------------------------------------------------- source analysis


@dataclass(frozen=True)
class Declaration:
    """A ``# verify: unreached (reason)`` marker: the lines ``first..last`` it declares and its reason."""

    first: int
    last: int
    reason: str

    def covers(self, line: int) -> bool:
        return self.first <= line <= self.last


@dataclass(frozen=True)
class Source:
    """What the AST of one file says: the measured statements (given coverage.py's statement lines), the innermost
    function around each line, the declarations, and the markers that declare nothing (line, problem)."""

    measured: tuple[int, ...]
    function_of: Mapping[int, str]
    declarations: tuple[Declaration, ...]
    broken: tuple[tuple[int, str], ...]


def _functions(tree: ast.AST) -> list[tuple[int, int, str]]:
    """``(first body line, last line, qualified name)`` of every function, outer ones first."""
    out: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out.append((child.body[0].lineno, child.end_lineno or child.body[-1].lineno, name))
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _comments(text: str) -> dict[int, tuple[str, bool]]:
    """``{line: (comment, alone)}``: each comment and whether it is the only thing on its line."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = (tok.string, not tok.line[: tok.start[1]].strip())
    return out


HEADED = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)
CLAUSE = re.compile(r"\s*(else|finally)\s*:")


def _block(tree: ast.AST, line: int, text: str) -> Optional[tuple[int, int]]:
    """The lines ``(first, last)`` that a marker on ``line`` (whose text is ``text``) declares: the outermost
    statement (or ``except`` clause) starting there, of an ``if`` / ``for`` / ``while`` / ``with`` / ``try`` only
    the body (its header runs; an ``else`` needs a marker of its own); the ``else:`` / ``finally:`` clause opening
    there; or else the innermost statement spanning the line. None when no statement is there."""
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.stmt, ast.ExceptHandler))]
    starting = [n for n in nodes if n.lineno == line or line in {d.lineno for d in getattr(n, "decorator_list", ())}]
    if starting:
        node = max(starting, key=lambda n: n.end_lineno or n.lineno)
        if isinstance(node, HEADED):  # the header runs: the body is what is not reached
            return node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno
        return node.lineno, node.end_lineno or node.lineno
    if CLAUSE.match(text):
        bodies = [body for n in nodes for body in (getattr(n, "orelse", None), getattr(n, "finalbody", None))
                  if body and body[0].lineno > line]
        if bodies:
            body = min(bodies, key=lambda b: b[0].lineno)
            return line, body[-1].end_lineno or body[-1].lineno
    spanning = [(n.lineno, n.end_lineno or n.lineno) for n in nodes if n.lineno < line <= (n.end_lineno or 0)]
    return min(spanning, key=lambda span: span[1] - span[0]) if spanning else None


def analyse(text: str, statements: Sequence[int]) -> Source:
    """The :class:`Source` of a file with contents ``text``, given coverage.py's statement lines of it."""
    tree = ast.parse(text)
    functions = _functions(tree)
    function_of: dict[int, str] = {}
    for first, last, name in functions:  # outer first: inner functions overwrite their lines
        function_of.update({line: name for line in range(first, last + 1)})
    measured = tuple(sorted(s for s in statements if s in function_of))
    declarations, broken = [], []
    lines = text.splitlines()
    for line, (comment, alone) in sorted(_comments(text).items()):
        match = MARKER.search(comment)
        if not match:
            continue
        reason = (match.group("reason") or "").strip()
        target = line
        if alone:  # a marker on a line of its own declares the statement that follows
            target = next((n for n in range(line + 1, len(lines) + 1)
                           if lines[n - 1].strip() and not lines[n - 1].lstrip().startswith("#")), line)
        block = _block(tree, target, lines[target - 1])
        if not reason:
            broken.append((line, "marker without a reason: write '# verify: unreached (why)'"))
        elif block is None:
            broken.append((line, "marker on a line that holds no statement"))
        else:
            declarations.append(Declaration(block[0], block[1], reason))
    return Source(measured, function_of, tuple(declarations), tuple(broken))


# ---------------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Span:
    """Consecutive measured statements (no measured statement between them), in one function."""

    first: int
    last: int
    function: str
    statements: int

    def __str__(self) -> str:
        lines = f"{self.first}" if self.first == self.last else f"{self.first}-{self.last}"
        return f"{lines} ({self.function})"


@dataclass(frozen=True)
class FileCoverage:
    """One kernel source file: measured statements, reached ones, the unreached ones neither declared (``unreached``)
    nor declared (``declared``: span and reason), stale declarations (reached anyway) and broken markers."""

    path: str
    families: tuple[str, ...]
    judged: bool
    statements: int
    reached: int
    unreached: tuple[Span, ...]
    declared: tuple[tuple[Span, str], ...]
    stale: tuple[tuple[Span, str], ...]
    broken: tuple[tuple[int, str], ...]

    @property
    def percent(self) -> float:
        return 100.0 * self.reached / self.statements if self.statements else 100.0

    @property
    def problems(self) -> list[str]:
        """Why this file fails the run (nothing when it is not judged)."""
        if not self.judged:
            return []
        out = [f"{self.path}: lines {s} unreached by verification and not declared" for s in self.unreached]
        out += [f"{self.path}: lines {s} declared unreached ({reason}) but reached" for s, reason in self.stale]
        out += [f"{self.path}:{line}: {problem}" for line, problem in self.broken]
        return out

    def as_dict(self) -> dict[str, Any]:
        def span(s: Span) -> dict[str, Any]:
            return {"first": s.first, "last": s.last, "function": s.function, "statements": s.statements}

        return {"path": self.path, "families": list(self.families), "judged": self.judged,
                "statements": self.statements, "reached": self.reached, "percent": round(self.percent, 2),
                "unreached": [span(s) for s in self.unreached],
                "declared": [{**span(s), "reason": r} for s, r in self.declared],
                "stale": [{**span(s), "reason": r} for s, r in self.stale],
                "broken": [{"line": line, "problem": p} for line, p in self.broken]}


def _spans(lines: Sequence[int], measured: Sequence[int], function_of: Mapping[int, str]) -> list[Span]:
    """``lines`` (a subset of ``measured``) grouped into runs of consecutive measured statements of one function."""
    index = {line: i for i, line in enumerate(measured)}
    runs: list[list[int]] = []
    for line in sorted(lines):
        if runs and index[line] == index[runs[-1][-1]] + 1 and function_of[line] == function_of[runs[-1][-1]]:
            runs[-1].append(line)
        else:
            runs.append([line])
    return [Span(run[0], run[-1], function_of[run[0]], len(run)) for run in runs]


def file_coverage(path: Path, families: Sequence[str], judged: bool, statements: Sequence[int],
                  executed: set[int], where: Optional[Path] = None) -> FileCoverage:
    """The coverage of ``path`` (repo-relative or absolute; the file at ``where`` when given) from coverage.py's
    statements and executed lines."""
    source = analyse((where or _absolute(path)).read_text(), statements)
    reached = [s for s in source.measured if s in executed]
    missing = [s for s in source.measured if s not in executed]
    declared, stale = [], []
    for d in source.declarations:
        inside = [s for s in source.measured if d.covers(s)]
        hit = [s for s in inside if s in executed]
        if hit:
            stale += [(span, d.reason) for span in _spans(hit, source.measured, source.function_of)]
        declared += [(span, d.reason) for span in _spans([s for s in inside if s not in executed],
                                                         source.measured, source.function_of)]
    undeclared = [s for s in missing if not any(d.covers(s) for d in source.declarations)]
    return FileCoverage(str(path), tuple(families), judged, len(source.measured), len(reached),
                        tuple(_spans(undeclared, source.measured, source.function_of)), tuple(declared),
                        tuple(stale), source.broken)


@dataclass(frozen=True)
class CoverageReport:
    """Every kernel source file of the measured families, in path order."""

    files: tuple[FileCoverage, ...]

    @property
    def problems(self) -> list[str]:
        return [f"coverage: {p}" for f in self.files for p in f.problems]

    def for_family(self, name: str) -> "CoverageReport":
        return CoverageReport(tuple(f for f in self.files if name in f.families))

    def as_dict(self) -> dict[str, Any]:
        return {"files": [f.as_dict() for f in self.files]}


def report(families: Sequence[Family], every: Sequence[Family], measurement: Measurement,
           complete: Callable[[Family], bool]) -> CoverageReport:
    """The coverage of every kernel source of the verified ``families`` from ``measurement``. ``every`` is every
    registered family: a file is judged when each of them that imports it was verified and is ``complete``."""
    users: dict[Path, list[Family]] = {}
    registered = {f.name for f in every}
    for family in [*every, *(f for f in families if f.name not in registered)]:
        for path in kernel_sources(family):
            users.setdefault(path, []).append(family)
    verified = {f.name for f in families}
    files = []
    for path in sorted({p for f in families for p in kernel_sources(f)}):
        owners = users[path]
        judged = all(f.name in verified and complete(f) for f in owners)
        where = _absolute(path, owners[0].root)  # sources are named relative to their family's repository
        files.append(file_coverage(path, [f.name for f in owners], judged, *measurement.lines(where), where))
    return CoverageReport(tuple(files))


def table(cov: CoverageReport) -> Table:
    """One row per file: families, statements reached, percent, unreached (undeclared) and declared lines."""
    out = Table(title="sentinel verify --coverage (statements in function bodies of the kernel sources)")
    out.add_column("file", no_wrap=True)
    out.add_column("families")
    out.add_column("reached", justify="right")
    out.add_column("%", justify="right")
    out.add_column("unreached, not declared")
    out.add_column("declared unreached")
    for f in cov.files:
        unreached = ", ".join(str(s) for s in f.unreached)
        style = "bold red" if f.judged and f.problems else ("yellow" if f.unreached else "green")
        percent = f"{f.percent:.1f}" + ("" if f.judged else " (partial run)")
        out.add_row(escape(f.path), ", ".join(f.families), f"{f.reached}/{f.statements}",
                    f"[{style}]{percent}[/]", escape(unreached) or "-",
                    escape(", ".join(f"{s}: {r}" for s, r in f.declared)) or "-")
    return out


def markdown(data: dict[str, Any]) -> str:
    """A Markdown table of a coverage report's JSON (:meth:`CoverageReport.as_dict`), for the site: one row per
    file with the statements reached, the unreached lines and the declared ones with their reasons."""
    def spans(items: Sequence[dict[str, Any]]) -> str:
        return ", ".join(f"{s['first']}" + (f"-{s['last']}" if s["last"] != s["first"] else "")
                         + f" (`{s['function']}`" + (f": {s['reason']}".replace("|", "\\|") if "reason" in s else "")
                         + ")"
                         for s in items) or "-"

    rows = [f"| `{f['path']}` | {f['reached']}/{f['statements']} | {f['percent']:.1f}% | {spans(f['unreached'])} | "
            f"{spans(f['declared'])} |" for f in data["files"]]
    return "\n".join(["| file | statements reached | % | unreached, not declared | declared unreached (reason) |",
                      "|---|---|---|---|---|", *rows])
