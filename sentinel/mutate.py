"""``sentinel mutate``: how strong are a family's checks? Plant one small bug at a time, see whether verify fails.

Each mutant changes one expression of a kernel source (found with :mod:`ast`, so comments, docstrings, string
literals, f-strings, annotations and decorators are never touched). The operators (:data:`OPERATORS`):

- ``comparison``: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``is`` <-> ``is not``, ``in`` <-> ``not in``;
- ``off-by-one``: an integer literal ``n`` used in index arithmetic (an operand of ``+``/``-``, a subscript or slice
  bound, an argument of ``range``/``arange``) becomes ``n + 1``;
- ``swap``: the operands of ``-``, ``/``, ``//``, ``%`` swapped; the two branches of ``where(c, a, b)`` swapped;
- ``mask``: a ``mask=`` argument dropped; ``where(c, a, b)`` becomes ``a``; ``a & b`` becomes ``a``;
- ``reduction``: ``max`` <-> ``min`` (also ``amax``, ``maximum``, ``argmax``), ``sum`` -> ``max``,
  ``logsumexp`` -> ``amax``;
- ``sign``: ``-x`` becomes ``x``; ``a + b`` <-> ``a - b``.

Every mutant runs in a scratch copy of the family's repository (the top-level packages of :func:`scratch_packages`
copied to a temporary directory at their paths relative to the repository, so that a mutant's file names its copy,
and imported from there through :func:`kernel_sentinel.layout.import_root`: for this repository's families
``kernels/`` and ``sentinel/``, for a family in another repository its own package, found through
``SENTINEL_FAMILY_PATH`` pointing into the copy, with the kernel library and sentinel imported as installed; the
working tree is never written), in a fresh worker process (a fork of a server that has imported torch and Triton
once) that verifies like ``sentinel verify --examples 2`` (every check at the default case sizes, every dtype of
the family: the small cases reach the code paths the tiny ones miss, e.g. several checkpoint intervals) and stops
at the first failing check: the mutant is then *killed*. The cheap checks that most mutants fail
(:data:`FIRST_PASS`: route, reference, exact, memory, written) run on every route first, then the other checks. A
mutant that makes the process crash or run past its time limit (one kernel launch's, each route's, or the
worker's) is killed too (reported as such).

Only the routes that execute the mutated line run it: a first unmutated run records, with ``coverage``, which routes
reach which lines (it must pass; else the verifier is broken and nothing is measured; with ``--jobs J`` the routes
are dealt out over J workers by their seconds in the family's CPU record, and their coverage merged). A mutant on a
line no route reaches survives (it is listed as unreached: a case is missing). Module-level lines count for every
route. ``--keep PATH`` keeps the unmutated run and each finished mutant's outcome, so that a run stopped part way
goes on where it stopped while the family's and the verifier's sources, the routes, the seed and the versions of
Python, torch, Triton and NumPy are the same (a kept unmutated run vouches only for the environment it passed in). A
survivor costs every check of every route it reaches (on the CPU, thousands of seconds for a line of a Triton kernel
that every route runs): ``--split-after S`` stops a mutant still running after S seconds on its one worker and, once
the others are done, runs it again, each of its routes on its own: the routes of all such mutants share the J
workers (the longest first), the first route that kills a mutant stops its others, and a route that passes is
kept, so that many cores end the run sooner and a stopped run loses little.

Reviewed equivalent mutants (mutants no test can kill because the program means the same) are listed in
``kernels/<family>/equivalent_mutants.json``, each with the reason: ``[{"file", "before", "after", "reason"}]``
where ``before``/``after`` are the mutated line(s) with whitespace collapsed (as printed for survivors); an optional
``"next"`` (the line after them, whitespace collapsed) names one of several identical lines. They are excluded
before sampling. A sampled mutant that survives and that the list names by the end of the run (an entry added after
reviewing the run's survivors; every entry is shown equivalent by ``tests/test_equivalent_mutants.py``) is reported
as ``equivalent`` and left out of the kill rate, not counted as killed. ``--rescore`` does the same for a run that
has ended: it rewrites each family's record, its survivors that the list names since taken out of the counts
(nothing runs; the sampled files must be those of the record's commit).

Beside its sample, a run runs again the survivors of the family's committed record (``--rerun RECORD``: of another
record, an older one from git), those it ran again that still survived included, and reports them apart
(``earlier_survivors``, outside every count): a check added since shows whether it kills them.

Output: the kill rate per file and overall, and each surviving mutant as a one-line diff. ``--json PATH`` writes
everything; ``--record`` writes ``traces/verification/mutation/<family>.json`` of the family's repository for the
site. Exit codes: 0; 1 when the kill rate of a family is under ``--min-kill`` (percent) or the unmutated run fails;
2 on usage errors.
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import dataclasses
import fnmatch
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy

from kernel_sentinel import console
from kernel_sentinel.layout import IMPORT_NAMES, import_root

DEFAULT_FILES = ("triton_*.py", "torch_ops.py")  # a family's backend sources (file names in its package)
EQUIVALENTS = "equivalent_mutants.json"
OPERATORS = ("comparison", "off-by-one", "swap", "mask", "reduction", "sign")
# each route of a mutant's worker may use, in each pass, 4x the CPU time of its unmutated run + 60 s (a hang ends
# there: the worker exits with ROUTE_TIMEOUT); the whole worker twice the routes' limits together, in wall time
TIME_LIMIT_FACTOR, TIME_LIMIT_FLOOR = 4.0, 60.0
# and each kernel launch 4x the CPU time of the route's longest unmutated launch + 30 s of user CPU time: an endless
# loop in a kernel ends there, not at the route's limit (minutes for a route that launches hundreds of kernels)
LAUNCH_LIMIT_FLOOR = 30.0
ROUTE_TIMEOUT = 3
CANCELLED = 4  # the fork server's code for a worker stopped because another copy has already decided the mutant
BASELINE_LIMIT = 4 * 3600.0  # seconds for the unmutated run (a guard against hangs only: it sets every other limit)
# a mutant's worker runs these on every route before the other checks: cheap (about a second a row on the CPU) and
# the ones most mutants fail (a wrong value, an access outside an argument, an output left unwritten)
FIRST_PASS = ("route", "reference", "exact", "memory", "written")
ALL_ROUTES = "*"  # coverage context of import-time (module-level) lines
IMPORT_DIR = "_import"  # a scratch copy's import root (its links name the packages copied there)
SCRATCH_VARIABLE = "SENTINEL_SCRATCH"  # a worker's scratch copy (Scratch.env)
VERIFIER = IMPORT_NAMES["sentinel"]  # copied with this repository's families, never measured

FLIPPED_COMPARISONS = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "==",
                       ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}
COMPARISON_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
                   ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
SWAPPED_OPERATORS = {ast.Sub: "-", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
REDUCTIONS = {"max": "min", "min": "max", "amax": "amin", "amin": "amax", "maximum": "minimum",
              "minimum": "maximum", "argmax": "argmin", "argmin": "argmax", "sum": "max", "logsumexp": "amax"}
RANGE_CALLS = {"range", "arange"}
ATOMS = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript, ast.List, ast.Tuple, ast.Dict)


@dataclass(frozen=True)
class Mutant:
    """One planted bug: in ``file`` (repo-relative), characters ``start:end`` of the source become
    ``replacement``; ``before``/``after`` are the affected lines (whitespace collapsed), ``line`` the first, and
    ``following`` the line after them (whitespace collapsed: it tells apart the mutants of identical lines)."""

    file: str
    line: int
    operator: str
    start: int
    end: int
    replacement: str
    before: str
    after: str
    following: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.file, self.before, self.after)

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end:]

    def diff(self) -> str:
        """The one-line diff printed for a survivor."""
        return f"{self.file}:{self.line}: {self.before}  -->  {self.after}  [{self.operator}]"


# ------------------------------------------------------------------------------------------ finding mutants


class _Source:
    """A source text with character offsets of AST positions (which count UTF-8 bytes within a line)."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def operand(self, node: ast.AST) -> str:
        """The node's text, parenthesised unless it is an atom."""
        text = self.segment(node)
        return text if isinstance(node, ATOMS) else f"({text})"


def _skipped(tree: ast.AST) -> set[int]:
    """Ids of nodes never mutated: docstrings, string literals, f-strings, annotations, decorators (and
    everything inside them)."""
    skip: set[int] = set()

    def all_of(node: Optional[ast.AST]) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            all_of(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                all_of(decorator)
            all_of(node.returns)
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                        node.args.vararg, node.args.kwarg]:
                if arg is not None:
                    all_of(arg.annotation)
        elif isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                all_of(decorator)
        elif isinstance(node, ast.AnnAssign):
            all_of(node.annotation)
    return skip


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _index_constants(tree: ast.AST) -> set[int]:
    """Ids of integer literals used in index arithmetic."""
    found: set[int] = set()

    def is_int(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and type(node.value) is int

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            found.update(id(n) for n in (node.left, node.right) if is_int(n))
        elif isinstance(node, ast.Subscript):
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            for part in parts:
                bounds = [part.lower, part.upper, part.step] if isinstance(part, ast.Slice) else [part]
                found.update(id(b) for b in bounds if b is not None and is_int(b))
        elif isinstance(node, ast.Call) and _call_name(node) in RANGE_CALLS:
            found.update(id(a) for a in node.args if is_int(a))
    return found


def _sites(src: _Source, tree: ast.AST) -> Iterator[tuple[str, ast.AST, str, Optional[tuple[int, int]]]]:
    """``(operator, node, replacement text, span)``: the replacement replaces the node's text (or ``span``)."""
    skip = _skipped(tree)
    index_constants = _index_constants(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                ops = [COMPARISON_TEXT[type(o)] for o in node.ops]
                ops[i] = FLIPPED_COMPARISONS[type(op)]
                text = src.operand(parts[0]) + "".join(f" {o} {src.operand(p)}" for o, p in zip(ops, parts[1:]))
                yield "comparison", node, text, None
        elif isinstance(node, ast.BinOp):
            left, right = src.operand(node.left), src.operand(node.right)
            if type(node.op) in SWAPPED_OPERATORS:
                yield "swap", node, f"{right} {SWAPPED_OPERATORS[type(node.op)]} {left}", None
            if isinstance(node.op, ast.Add):
                yield "sign", node, f"{left} - {right}", None
            elif isinstance(node.op, ast.Sub):
                yield "sign", node, f"{left} + {right}", None
            elif isinstance(node.op, ast.BitAnd):
                yield "mask", node, left, None
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            yield "sign", node, src.operand(node.operand), None
        elif isinstance(node, ast.Constant) and id(node) in index_constants:
            yield "off-by-one", node, str(node.value + 1), None
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name in REDUCTIONS:
                start, end = src.span(node.func)
                yield "reduction", node, REDUCTIONS[name], (end - len(name), end)
            if name == "where" and len(node.args) == 3 and not node.keywords:
                cond, a, b = (src.segment(x) for x in node.args)
                yield "swap", node, f"{src.segment(node.func)}({cond}, {b}, {a})", None
                yield "mask", node, src.operand(node.args[1]), None
            masks = [k for k in node.keywords if k.arg == "mask"]
            if masks:
                args = [src.segment(a) for a in node.args] + [src.segment(k) for k in node.keywords
                                                                if k.arg != "mask"]
                yield "mask", node, f"{src.segment(node.func)}({', '.join(args)})", None


def find_mutants(text: str, file: str) -> list[Mutant]:
    """Every mutant of the source ``text`` of ``file`` (repo-relative), in source order, distinct sources only."""
    src = _Source(text)
    tree = ast.parse(text)
    out: dict[str, Mutant] = {}
    for operator, node, replacement, span in _sites(src, tree):
        start, end = span or src.span(node)
        mutated = text[:start] + replacement + text[end:]
        if mutated == text or mutated in out:
            continue
        first, last = node.lineno, node.end_lineno
        before = " ".join(" ".join(src.lines[first - 1: last]).split())
        delta = replacement.count("\n") - text[start:end].count("\n")
        after = " ".join(" ".join(mutated.splitlines()[first - 1: last + delta]).split())
        following = " ".join(src.lines[last].split()) if last < len(src.lines) else ""
        out[mutated] = Mutant(file, first, operator, start, end, replacement, before, after, following)
    return sorted(out.values(), key=lambda m: (m.start, m.operator, m.replacement))


# --------------------------------------------------------------------------------------------- equivalents


def plant(text: str, pattern: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new`` inside the one match of the regular expression ``pattern`` (a
    hand-written planted bug); ``ValueError`` when ``pattern`` does not match exactly once or its match lacks
    ``old`` (the code it plants into has changed)."""
    found = list(re.finditer(pattern, text))
    if len(found) != 1 or old not in found[0].group(0):
        raise ValueError(f"pattern {pattern!r} matches {len(found)} places (one holding {old!r} expected): the code "
                         f"the bug is planted into has changed")
    start, end = found[0].span()
    return text[:start] + found[0].group(0).replace(old, new, 1) + text[end:]


def load_equivalents(path: Path) -> dict[tuple[str, str, str, str], str]:
    """``{(file, before, after, next): reason}`` from a reviewed equivalent-mutant file (empty when absent). An
    entry names its mutant by file and lines; ``next`` (the line after them, "" when the entry has none) picks one
    of several identical lines. Every entry needs a non-empty reason, and names a mutant no other entry names."""
    if not path.is_file():
        return {}
    entries = json.loads(path.read_text())
    out: dict[tuple[str, str, str, str], str] = {}
    for i, entry in enumerate(entries):
        if not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path}: entry {i} has no reason; every equivalent mutant needs one")
        key = (entry["file"], entry["before"], entry["after"], entry.get("next", ""))
        if key in out:
            raise ValueError(f"{path}: entry {i} names the mutant of an earlier entry ({key[0]}: {key[2]})")
        out[key] = entry["reason"]
    return out


def listed_reason(equivalents: dict[tuple[str, str, str, str], str], mutant: Mutant) -> Optional[str]:
    """The reason ``equivalents`` (:func:`load_equivalents`) gives for ``mutant``: by an entry naming its next line,
    else by one naming none. None when it is not listed."""
    return equivalents.get((*mutant.key, mutant.following)) or equivalents.get((*mutant.key, ""))


# ------------------------------------------------------------------------------------------------ running


@dataclass
class Outcome:
    """What happened to one mutant: ``status`` is ``killed``, ``crashed``, ``timeout`` (all three count as
    killed), ``survived`` or ``unreached`` (no route runs the line); ``by`` says which route and check failed."""

    mutant: Mutant
    status: str
    by: str = ""
    seconds: float = 0.0

    @property
    def killed(self) -> bool:
        return self.status in ("killed", "crashed", "timeout")


def scratch_packages(family: Any) -> dict[str, str]:
    """``{folder relative to the family's root: import name}``: the top-level packages a scratch copy for ``family``
    holds, those of the family's package, the kernel library (``provable_kernels``) and the verifier
    (``kernel_sentinel``) that lie in the family's repository (for this repository's own families, its ``kernels/``
    and ``sentinel/``: :data:`~kernel_sentinel.layout.IMPORT_NAMES`). The others are imported as installed: a mutant
    changes only files in the family's repository, and an installed package is no working tree."""
    import importlib

    root = family.root.resolve()
    found = {}
    for name in dict.fromkeys((family.package.__name__.partition(".")[0], "provable_kernels", "kernel_sentinel")):
        folder = Path(next(iter(importlib.import_module(name).__path__))).resolve()
        if folder.is_relative_to(root):
            found[folder.relative_to(root).as_posix()] = name
    return found


class Scratch:
    """A scratch copy of top-level packages of a repository (``packages``: ``{folder relative to repo: import
    name}``, default this repository's ``kernels/`` and ``sentinel/``; :func:`scratch_packages` for a family), each
    at its path relative to the repository (so a mutant's repo-relative file names its copy), with an import root
    over them, and a fork server (``python -m kernel_sentinel.mutate serve``) that runs each worker in a fresh fork
    of a process that has imported torch, Triton and hypothesis once (never the copied packages, which each fork
    imports from the scratch copy as it is at that moment). A family package outside the kernel library is found
    there through ``SENTINEL_FAMILY_PATH``, which names the copy's directories only."""

    def __init__(self, repo: Path, packages: Mapping[str, str] = IMPORT_NAMES):
        self.dir = Path(tempfile.mkdtemp(prefix="sentinel-mutate-"))
        for folder in packages:
            shutil.copytree(repo / folder, self.dir / folder, ignore=shutil.ignore_patterns("__pycache__"))
        self.root = import_root(self.dir, self.dir / IMPORT_DIR, packages)
        self.family_path = [str((self.dir / folder).parent) for folder, name in packages.items()
                            if name not in IMPORT_NAMES.values()]
        self._server: Optional[subprocess.Popen] = None

    def env(self) -> dict[str, str]:
        from kernel_sentinel.registry import FAMILY_PATH_VARIABLE

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), *filter(None, [env.get("PYTHONPATH")])])
        env[FAMILY_PATH_VARIABLE] = os.pathsep.join(self.family_path)
        env[SCRATCH_VARIABLE] = str(self.dir)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["TRITON_INTERPRET"] = "1"
        return env

    def worker(self, family: str, routes: Sequence[str], seed: int, timeout: float,
               coverage_to: Optional[Path] = None, checks: Sequence[str] = (),
               route_limits: Optional[dict[str, float]] = None,
               launch_limits: Optional[dict[str, float]] = None) -> tuple[int, str, bool]:
        """Run the worker on ``routes`` in a fork (only ``checks`` when given; each route within its CPU seconds in
        ``route_limits`` per pass, and each of its kernel launches within those in ``launch_limits``, when given);
        ``(exit code, last output line, timed out)``."""
        argv = ["--family", family, "--seed", str(seed), "--route", *routes]
        if checks:
            argv += ["--check", *checks]
        if route_limits:
            argv += ["--route-limits", json.dumps(route_limits)]
        if launch_limits:
            argv += ["--launch-limits", json.dumps(launch_limits)]
        if coverage_to is not None:
            argv += ["--coverage", str(coverage_to)]
        if self._server is None or self._server.poll() is not None:
            # a session of its own: a signal to the run's process group (Ctrl-C, `timeout`) stops the run, not the
            # server's worker, whose death would pass for the mutant's; the server ends itself once the run is gone
            self._server = subprocess.Popen([sys.executable, "-m", "kernel_sentinel.mutate", "serve"],
                                            env=self.env(), cwd=self.dir, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                            start_new_session=True)
        self._server.stdin.write(json.dumps({"argv": argv, "timeout": timeout}) + "\n")
        self._server.stdin.flush()
        line = self._server.stdout.readline()
        if not line:  # killed from outside (the machine's OOM killer): no verdict on the mutant
            raise RuntimeError(f"the fork server of {self.dir} exited without answering")
        reply = json.loads(line)
        return reply["code"], reply["last"], reply["timed_out"]

    def cancel(self) -> None:
        """Stop the worker running now, if any: its request is answered with :data:`CANCELLED` (a cancel that comes
        before the server has read the request is dropped: that request runs to its end, its result ignored)."""
        if self._server is not None and self._server.poll() is None:
            os.kill(self._server.pid, signal.SIGUSR1)

    @contextlib.contextmanager
    def planted(self, file: str, pattern: str, old: str, new: str) -> Iterator[None]:
        """Inside the block, ``file`` (repo-relative) of the scratch copy holds the bug :func:`plant` makes."""
        path = self.dir / file
        original = path.read_text()
        path.write_text(plant(original, pattern, old, new))
        try:
            yield
        finally:
            path.write_text(original)

    def remove(self) -> None:
        """Stop the fork server (and a worker it still runs: a run stopped part way) and delete the copy."""
        if self._server is not None:
            self.cancel()
            self._server.stdin.close()
            try:
                self._server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Baseline:
    """The unmutated run: which routes reach each line, how long each route took and its longest kernel launch (CPU
    seconds)."""

    lines: dict[str, dict[int, set[str]]]
    seconds: dict[str, float]
    launch_seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # each route's longest kernel launch

    def routes_for(self, mutant: Mutant) -> list[str]:
        reached = self.lines.get(mutant.file, {}).get(mutant.line, set())
        return sorted(self.seconds) if ALL_ROUTES in reached else sorted(reached)


class Kept:
    """What ``--keep PATH`` holds between runs (a run stopped part way goes on where it stopped): the unmutated run
    and each finished mutant's outcome, valid while ``key`` (the family's and the verifier's sources, the routes,
    the seed, the versions of Python, torch, Triton and NumPy) is the same: a kept unmutated run vouches only for
    the environment it passed in; without a path, nothing is kept."""

    def __init__(self, path: Optional[Path], key: dict[str, Any]):
        self.path, self.key = path, key
        data = json.loads(path.read_text()) if path is not None and path.is_file() else {}
        data = data if data.get("key") == key else {}
        self.baseline_data: Optional[dict] = data.get("baseline")
        self.outcomes: dict[str, dict[str, Any]] = data.get("outcomes", {})
        self._lock = threading.Lock()

    @staticmethod
    def name(mutant: Mutant) -> str:
        return f"{mutant.file}:{mutant.start}:{mutant.end}:{mutant.replacement}"

    def baseline(self, run: Callable[[], Baseline]) -> Baseline:
        """The kept unmutated run, else ``run()``'s (then kept)."""
        data = self.baseline_data
        if data is not None:
            console.err.print(f"{self.key['family']}: the unmutated run kept in {self.path}")
            return Baseline({f: {int(n): set(r) for n, r in by.items()} for f, by in data["lines"].items()},
                            data["seconds"], data["launch_seconds"])
        baseline = run()
        lines = {f: {str(n): sorted(r) for n, r in by.items()} for f, by in baseline.lines.items()}
        self.baseline_data = {"lines": lines, "seconds": baseline.seconds, "launch_seconds": baseline.launch_seconds}
        self._write()
        return baseline

    def outcome(self, mutant: Mutant) -> Optional[Outcome]:
        """The kept outcome of ``mutant``, if it finished in an earlier run (or ``unfinished``, if it ran past
        ``--split-after`` on its one worker there, or was stopped while spread out)."""
        kept = self.outcomes.get(self.name(mutant))
        return None if kept is None else Outcome(mutant, kept["status"], kept["by"], kept["seconds"])

    def passed(self, mutant: Mutant) -> list[str]:
        """The routes an unfinished ``mutant`` has passed (they need not run again)."""
        return self.outcomes.get(self.name(mutant), {}).get("passed", [])

    def add(self, outcome: Outcome, passed: Sequence[str] = ()) -> None:
        """Keep ``outcome`` and the routes the mutant has passed (with those kept before: a route passed in an
        earlier sitting stays passed)."""
        with self._lock:
            passed = sorted(set(self.passed(outcome.mutant)) | set(passed))
            self.outcomes[self.name(outcome.mutant)] = {"status": outcome.status, "by": outcome.by,
                                                        "seconds": round(outcome.seconds, 1), "passed": passed}
            self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps({"key": self.key, "baseline": self.baseline_data, "outcomes": self.outcomes}))
        temporary.replace(self.path)


def recorded_seconds(family: str) -> dict[str, float]:
    """Each route's seconds in the family's CPU verification record (its checks at every dtype; empty without a
    record): what the unmutated run takes, roughly, route by route."""
    from kernel_sentinel import records

    path = records.record_path(family, {"type": "cpu"})
    if not path.is_file():
        return {}
    seconds: dict[str, float] = {}
    for route in records.load_record(path)["routes"]:
        seconds[route["id"]] = seconds.get(route["id"], 0.0) + sum(c.get("seconds") or 0.0 for c in route["checks"])
    return seconds


def run_baseline(scratches: Sequence[Scratch], family: str, routes: Sequence[str], seed: int,
                 estimates: Optional[dict[str, float]] = None) -> Baseline:
    """Run every route unmutated under coverage, the routes dealt out over ``scratches`` (run in parallel) by their
    ``estimates`` of seconds (:func:`deal`; a route without one counts as the mean); raise ``RuntimeError`` when it
    does not pass."""
    console.err.print(f"{family}: unmutated run of {len(routes)} routes under coverage")
    known = [estimates[r] for r in routes if estimates and r in estimates]
    mean = sum(known) / len(known) if known else 1.0
    groups = deal(routes, {r: (estimates or {}).get(r, mean) for r in routes}, len(scratches))

    def one(scratch: Scratch, group: list[str]) -> dict:
        out = scratch.dir / "_baseline.json"
        code, last, _ = scratch.worker(family, group, seed, timeout=BASELINE_LIMIT, coverage_to=out)
        if code != 0:
            raise RuntimeError(f"the unmutated run of {family} fails, so no mutant can be measured: {last}")
        return json.loads(out.read_text())

    used = [(s, g) for s, g in zip(scratches, groups) if g]
    with concurrent.futures.ThreadPoolExecutor(len(used)) as pool:
        try:
            parts = list(pool.map(lambda sg: one(*sg), used))
        except BaseException:  # a group failed, or Ctrl-C: stop the others
            for scratch, _ in used:
                scratch.cancel()
            raise
    lines: dict[str, dict[int, set[str]]] = {}
    for data in parts:
        for f, by_line in data["lines"].items():
            for n, reached in by_line.items():
                lines.setdefault(f, {}).setdefault(int(n), set()).update(reached)
    return Baseline(lines, {r: t for data in parts for r, t in data["seconds"].items()},
                    {r: t for data in parts for r, t in data["launch_seconds"].items()})


def deal(routes: Sequence[str], seconds: dict[str, float], groups: int) -> list[list[str]]:
    """``routes`` dealt out into at most ``groups`` non-empty groups of about equal unmutated seconds (the longest
    route first, each into the group with the fewest seconds so far)."""
    dealt: list[list[str]] = [[] for _ in range(max(1, min(groups, len(routes))))]
    load = [0.0] * len(dealt)
    for route in sorted(routes, key=lambda r: -seconds[r]):
        i = load.index(min(load))
        dealt[i].append(route)
        load[i] += seconds[route]
    return dealt


def decides(code: int, capped: bool) -> bool:
    """Whether one group's result settles its mutant as killed (a failed check, a crash or a hang), whatever the
    other groups find."""
    return code not in (0, CANCELLED) and not capped


class _InFlight:
    """One mutant being run: its groups of routes, the results of those finished, and its outcome once settled."""

    def __init__(self, mutant: Mutant, groups: list[list[str]]):
        self.mutant, self.groups, self.results = mutant, groups, []
        self.passed: list[str] = []
        self.start: Optional[float] = None
        self.outcome: Optional[Outcome] = None

    def settle(self, last_decides: bool) -> Optional[Outcome]:
        """The outcome, when the last result decides the mutant or every group has finished (else None): killed
        when a group fails a check, crashed when one exits otherwise, timeout when one runs past its limits (all
        three count as killed; which one is reported can depend on which group got there first), unfinished when
        one stopped at the cap, else survived."""
        if not last_decides and len(self.results) < len(self.groups):
            return None
        results = [r for r in self.results if r[0] != CANCELLED]
        seconds = time.perf_counter() - (self.start or time.perf_counter())
        for code, last, timed_out, capped in results:
            if code == 1 and not timed_out:
                return Outcome(self.mutant, "killed", last, seconds)
        for code, last, timed_out, capped in results:
            if code not in (0, ROUTE_TIMEOUT) and not timed_out:
                return Outcome(self.mutant, "crashed", last, seconds)
        for code, last, timed_out, capped in results:
            if capped:
                return Outcome(self.mutant, "unfinished", last, seconds)
            if timed_out or code == ROUTE_TIMEOUT:
                return Outcome(self.mutant, "timeout", last, seconds)
        return Outcome(self.mutant, "survived", "", seconds)


def run_mutants(scratches: Sequence[Scratch], family: str, work: Sequence[tuple[Mutant, list[list[str]]]],
                baseline: Baseline, seed: int, done: Callable[[Mutant, Optional[Outcome], list[str]], None],
                cap: Optional[float] = None) -> None:
    """Run each mutant of ``work`` as its groups of routes, every group of every mutant sharing ``scratches``: a
    free copy takes the next group (the groups of the longest unmutated seconds first), plants its mutant, runs the
    worker on the group's routes and restores the file. The first group that settles a mutant (:func:`decides`)
    cancels its groups still running and drops those not started, so a killed mutant costs the time of its fastest
    kill. ``cap``: a group still running after that many seconds stops, and its mutant is ``unfinished`` (not an
    outcome: the mutant runs again, spread out). ``done(mutant, outcome, routes passed)`` as each of a mutant's
    groups finishes until it settles (``outcome`` None until then: a run stopped part way keeps the routes passed so
    far); groups finishing after that are ignored. A group that raises (a fork server killed from outside) stops
    every group and the error propagates: no verdict is made up."""
    flights = [_InFlight(mutant, groups) for mutant, groups in work]
    tasks = sorted(((f, g) for f in flights for g in f.groups), key=lambda fg: -sum(baseline.seconds[r] for r in fg[1]))
    free: queue.Queue[Scratch] = queue.Queue()
    for scratch in scratches:
        free.put(scratch)
    running: dict[Scratch, _InFlight] = {}
    lock, failed = threading.Lock(), threading.Event()

    def one(flight: _InFlight, group: list[str]) -> None:
        scratch = free.get()
        try:
            with lock:
                if flight.outcome is not None or failed.is_set():
                    return
                flight.start = flight.start or time.perf_counter()
                running[scratch] = flight
            limits = {r: TIME_LIMIT_FLOOR + TIME_LIMIT_FACTOR * baseline.seconds[r] for r in group}
            launch = {r: LAUNCH_LIMIT_FLOOR + TIME_LIMIT_FACTOR * baseline.launch_seconds.get(r, 0.0) for r in group}
            timeout = 2 * sum(limits.values())
            capped = cap is not None and cap < timeout
            path = scratch.dir / flight.mutant.file
            original = path.read_text()
            path.write_text(flight.mutant.apply(original))
            try:
                code, last, timed_out = scratch.worker(family, group, seed, cap if capped else timeout,
                                                       route_limits=limits, launch_limits=launch)
            finally:
                path.write_text(original)
                with lock:
                    del running[scratch]
        finally:
            free.put(scratch)
        with lock:
            if flight.outcome is not None or failed.is_set():
                return
            flight.results.append((code, last, timed_out, timed_out and capped))
            if code == 0:
                flight.passed += group
            outcome = flight.settle(decides(code, timed_out and capped))
            if outcome is not None:
                flight.outcome = outcome
                for other, busy in running.items():  # under the lock: each still runs this mutant's group
                    if busy is flight:
                        other.cancel()
            done(flight.mutant, outcome, sorted(flight.passed))  # under the lock: in the order of the results

    with concurrent.futures.ThreadPoolExecutor(len(scratches)) as pool:
        futures = [pool.submit(one, flight, group) for flight, group in tasks]
        try:
            finished, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            for future in finished:  # all of them, unless one raised
                future.result()
        except BaseException:  # a group raised, or Ctrl-C: no verdict can be trusted, stop every group
            with lock:
                failed.set()
                for scratch in running:
                    scratch.cancel()
            raise


# ---------------------------------------------------------------------------------------------- the worker


def start_in_scratch(coverage_path: Optional[Path]) -> Optional[tuple[Path, Any]]:
    """For a worker process: the scratch copy it runs in (``SENTINEL_SCRATCH``, set by :meth:`Scratch.env`) and,
    with ``coverage_path``, a started coverage measurement of the packages copied there but the verifier (context
    :data:`ALL_ROUTES`); None, after saying so, when the variable names no scratch copy."""
    value = os.environ.get(SCRATCH_VARIABLE)
    here = Path(value).resolve() if value else None
    if here is None or not (here / IMPORT_DIR).is_dir():
        print(f"refusing to run outside a scratch copy: {SCRATCH_VARIABLE} is {value!r}")
        return None
    cov = None
    if coverage_path:
        import coverage

        measured = {name: folder for name, folder in copied_packages(here).items() if name != VERIFIER}
        cov = coverage.Coverage(data_file=None, include=[str(p / "*") for name, folder in measured.items()
                                                         for p in (folder, here / IMPORT_DIR / name)])
        cov.start()
        cov.switch_context(ALL_ROUTES)
    return here, cov


def copied_packages(here: Path) -> dict[str, Path]:
    """``{import name: folder}`` of the packages the scratch copy ``here`` holds (the links of its import root)."""
    return {link.name: link.resolve() for link in sorted((here / IMPORT_DIR).iterdir())}


def scratch_family(name: str, here: Path) -> Any:
    """For a worker process in the scratch copy ``here``: the family ``name``, each of its source modules imported
    (their import-time lines count for every route); None, after saying so, when its package is not the copy's (a
    worker never runs against a working tree)."""
    from kernel_sentinel import registry

    (family,) = registry.select([name])
    package = Path(family.package.__file__).resolve().parent
    if not package.is_relative_to(here):
        print(f"refusing to run outside a scratch copy: {family.package.__name__} is {package}")
        return None
    folders = {folder: module for module, folder in copied_packages(here).items()}
    for file in family.source_files():
        path = (family.root / file).resolve()
        folder = next((f for f in folders if path.is_relative_to(f)), None)
        if path.suffix == ".py" and path.name != "__init__.py" and folder is not None:
            __import__(".".join((folders[folder], *path.relative_to(folder).with_suffix("").parts)))
    return family


_EXPIRED: list[str] = []  # the deadlines that fired in this process: an extension may turn the exception into another


class _RouteTimeout(BaseException):
    """A route ran past its limit (a BaseException: the checks, which catch exceptions, let it through)."""


@contextlib.contextmanager
def _deadline(seconds: Optional[float], what: str = "ran past", timer: int = signal.ITIMER_PROF) -> Iterator[None]:
    """Raise :class:`_RouteTimeout` ("<what> <seconds> s") in the block once it has used ``seconds`` of the
    process's CPU time (None: no limit) by ``timer``: ``ITIMER_PROF`` (user and system time) or ``ITIMER_VIRTUAL``
    (user time), two timers that run side by side (main thread only). CPU time, not wall time: a worker slowed by
    other processes on the machine never times out for it (a hang that spins uses CPU; one that blocks ends at the
    worker's wall-time limit)."""
    if not seconds:
        yield
        return
    number = signal.SIGPROF if timer == signal.ITIMER_PROF else signal.SIGVTALRM

    def expire(signum: int, frame: Any) -> None:
        _EXPIRED.append(f"{what} {seconds:.0f} s")
        raise _RouteTimeout(_EXPIRED[-1])

    previous = signal.signal(number, expire)
    signal.setitimer(timer, seconds)
    try:
        yield
    finally:
        signal.setitimer(timer, 0)
        signal.signal(number, previous)


class _LaunchWatch:
    """In a worker: measures each route's longest kernel launch (CPU seconds) and, when ``limits`` holds a limit for
    the route running, ends a launch past it (:func:`_deadline` on the user-time timer, beside the route's), so an
    endless loop in a kernel ends there, not at its route's limit."""

    def __init__(self, limits: dict[str, float]):
        from provable_kernels.launch import Launcher

        self.limits, self.longest = limits, {}
        self.route: Optional[str] = None
        original = Launcher.launch

        def timed(launcher: Any, *args: Any, **kwargs: Any) -> None:
            start = time.process_time()
            try:
                with _deadline(self.limits.get(self.route), "a kernel launch ran past", signal.ITIMER_VIRTUAL):
                    original(launcher, *args, **kwargs)
            finally:
                self.longest[self.route] = max(self.longest.get(self.route, 0.0), time.process_time() - start)

        Launcher.launch = timed


def worker(argv: Sequence[str]) -> int:
    """Verify the routes like ``sentinel verify --examples 2`` at every dtype, stopping at the first failing check
    (the checks of :data:`FIRST_PASS` on every route first, except under coverage); exit 1 (printing ``route dtype
    check: detail``) when one fails, 0 when all pass. ``--coverage PATH``: record which route reaches which line of
    the kernel library, each route's CPU time and its longest kernel launch, as JSON. ``--check NAME ...``: only
    these checks (a planted-bug test that names the check it expects to fail). ``--route-limits``: each route's CPU
    seconds per pass, ``--launch-limits``: those of each of its kernel launches; past either the worker exits with
    :data:`ROUTE_TIMEOUT`."""
    parser = argparse.ArgumentParser(prog="kernel_sentinel.mutate worker")
    parser.add_argument("--family", required=True)
    parser.add_argument("--route", nargs="+", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--coverage", type=Path)
    parser.add_argument("--check", nargs="+", help="only these checks (default: all)")
    parser.add_argument("--route-limits", type=json.loads, default={},
                        help="JSON {route: seconds}: each route's CPU time per pass")
    parser.add_argument("--launch-limits", type=json.loads, default={},
                        help="JSON {route: seconds}: the CPU time of each of the route's kernel launches")
    args = parser.parse_args(argv)

    import warnings

    started = start_in_scratch(args.coverage)
    if started is None:
        return 2
    here, cov = started
    import torch

    from kernel_sentinel import interpreter
    from kernel_sentinel.rows import CHECK_FUNCTIONS, QUICK_EXAMPLES, Options, RouteRun

    interpreter.install()  # as sentinel verify runs it (kernel_sentinel.device.prepare)
    # one thread: the workers share the CPUs, and a check's forked child (observed) must find no OpenMP team
    # (libgomp's children wait for the parent's threads forever)
    torch.set_num_threads(1)

    family = scratch_family(args.family, here)
    if family is None:
        return 2
    options = Options(device=torch.device("cpu"), seed=args.seed, examples=QUICK_EXAMPLES)
    if args.check:
        options = dataclasses.replace(options, checks=tuple(args.check))
    seconds: dict[str, float] = {}
    watch = _LaunchWatch(args.launch_limits)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    # a mutant: the cheap checks of every route first (most mutants fail one), then the rest; the unmutated run
    # under coverage: route by route (each route's lines are its own coverage context)
    first = () if cov is not None else tuple(c for c in options.checks if c in FIRST_PASS)
    passes = [first, tuple(c for c in options.checks if c not in first)] if first else [options.checks]
    for checks in passes:
        for route_id in args.route:
            if cov is not None:
                cov.switch_context(route_id)
            watch.route, start = route_id, time.process_time()
            try:
                with _deadline(args.route_limits.get(route_id)):
                    for dtype in family.dtypes:
                        run = RouteRun(family, route_id, options, dtype)
                        repro = options.repro(family.name, route_id, dtype)
                        for name in checks:
                            torch.manual_seed(options.seed)
                            try:
                                result = CHECK_FUNCTIONS[name](run, repro)
                                passed, detail = result.passed, result.detail
                            except Exception as exc:
                                passed, detail = False, f"{type(exc).__name__}: {exc}"
                            if not passed and _EXPIRED:  # numpy, say, turned the timeout into a TypeError
                                raise _RouteTimeout(_EXPIRED[-1])
                            if not passed:
                                print(f"{route_id} {str(dtype).removeprefix('torch.')} {name}: "
                                      f"{' '.join(detail.split())[:300]}")
                                return 1
            except _RouteTimeout as exc:
                print(f"{route_id}: {exc} (a hang?)")
                return ROUTE_TIMEOUT
            seconds[route_id] = seconds.get(route_id, 0.0) + time.process_time() - start
    if cov is not None:
        cov.stop()
        data = cov.get_data()
        lines: dict[str, dict[int, list[str]]] = {}
        for measured in data.measured_files():
            relative = Path(measured).resolve().relative_to(here).as_posix()
            by_line = data.contexts_by_lineno(measured)
            lines[relative] = {n: sorted(c if c else ALL_ROUTES for c in ctx) for n, ctx in by_line.items()}
        args.coverage.write_text(json.dumps({"lines": lines, "seconds": seconds, "launch_seconds": watch.longest}))
    print(f"{len(args.route)} routes pass")
    return 0


# ----------------------------------------------------------------------------------------------- reporting


def percent_killed(killed: int, counted: int) -> Optional[float]:
    """The percentage of ``counted`` mutants killed, to one decimal (None when none counted)."""
    return round(100.0 * killed / counted, 1) if counted else None


def summarize(family: str, outcomes: Sequence[Outcome], candidates: int, excluded: int,
              seed: int, earlier: Sequence[Outcome] = ()) -> dict[str, Any]:
    """The JSON summary of one family's run (also the record the site shows): the sample's ``outcomes``, and the
    ``earlier`` record's survivors run again beside it (:func:`earlier_survivors`), outside every count."""
    files: dict[str, dict[str, Any]] = {}
    counted = [o for o in outcomes if o.status != "equivalent"]  # shown equivalent: out of every kill rate
    for o in counted:
        entry = files.setdefault(o.mutant.file, {"mutants": 0, "killed": 0})
        entry["mutants"] += 1
        entry["killed"] += o.killed
    for entry in files.values():
        entry["kill_rate"] = percent_killed(entry["killed"], entry["mutants"])
    killed = sum(o.killed for o in counted)
    return {
        "family": family,
        "seed": seed,
        "candidates": candidates,
        "equivalent_excluded": excluded,
        "sampled": len(outcomes),
        "equivalent_sampled": len(outcomes) - len(counted),
        "killed": killed,
        "kill_rate": percent_killed(killed, len(counted)),
        "by_operator": {op: {"mutants": sum(o.mutant.operator == op for o in counted),
                             "killed": sum(o.killed for o in counted if o.mutant.operator == op)}
                        for op in OPERATORS},
        "files": dict(sorted(files.items())),
        "survivors": [{"diff": o.mutant.diff(), "status": o.status} for o in counted if not o.killed],
        "earlier_survivors": [{"diff": o.mutant.diff(), "status": o.status, "by": o.by} for o in earlier],
        "mutants": [{**dataclasses.asdict(o.mutant), "status": o.status, "by": o.by,
                     "seconds": round(o.seconds, 2)} for o in [*outcomes, *earlier]],
    }


def print_summary(summary: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"mutation: {summary['family']}", title_justify="left")
    for column in ("file", "mutants", "killed", "kill rate"):
        table.add_column(column, justify="left" if column == "file" else "right")
    for file, entry in summary["files"].items():
        table.add_row(file, str(entry["mutants"]), str(entry["killed"]), f"{entry['kill_rate']:.1f}%")
    rate, shown = summary["kill_rate"], summary["equivalent_sampled"]
    table.add_row("all", str(summary["sampled"] - shown), str(summary["killed"]),
                  "-" if rate is None else f"{rate:.1f}%", style="bold")
    console.out.print(table)
    console.out.print(f"{summary['candidates']} candidate mutants, {summary['equivalent_excluded']} reviewed "
                      f"equivalent excluded, {summary['sampled']} run (seed {summary['seed']})"
                      + (f", {shown} of them shown equivalent since (not counted)" if shown else ""),
                      highlight=False)
    for survivor in summary["survivors"]:
        note = " (no route runs this line)" if survivor["status"] == "unreached" else ""
        console.out.print(f"survived{note}: {escape(survivor['diff'])}", highlight=False, soft_wrap=True)
    for again in summary.get("earlier_survivors", ()):
        now = "killed" if again["status"] in ("killed", "crashed", "timeout") else again["status"]
        console.out.print(f"a survivor of the last record, run again: {now}: {escape(again['diff'])}"
                          + (f"  ({escape(again['by'])})" if again["by"] else ""), highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    from kernel_sentinel.cli import COMMANDS

    p = subparsers.add_parser("mutate", help=COMMANDS["mutate"][1],
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--family", nargs="+", action="extend", metavar="F", help="families (default: all)")
    p.add_argument("--files", nargs="+", action="extend", metavar="GLOB",
                   help="repo-relative globs among the family's source files (default: the family package's "
                        f"{' and '.join(DEFAULT_FILES)})")
    p.add_argument("--route", nargs="+", action="extend", metavar="GLOB",
                   help="verify only the routes matching these globs (default: every route)")
    p.add_argument("-n", type=int, metavar="N", help="run a seeded sample of N mutants per family (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample and of verify (default 0)")
    p.add_argument("--min-kill", type=float, default=0.0, metavar="P",
                   help="exit 1 when a family's kill rate is under P percent")
    p.add_argument("--jobs", type=int, default=1, metavar="J", help="mutants run in parallel (default 1)")
    p.add_argument("--split-after", type=float, metavar="S",
                   help="stop a mutant still running after S seconds on one job, and run it again after the others, "
                        "each of its routes on its own, the routes of every such mutant sharing the jobs (survivors "
                        "run every check of every route they reach: on many cores this ends a run sooner; default: "
                        "never)")
    p.add_argument("--keep", type=Path, metavar="PATH",
                   help="keep the unmutated run and every finished mutant's outcome in PATH, and go on from them "
                        "while the family's and the verifier's sources, the routes, the seed and the versions of "
                        "Python, torch, Triton and NumPy are the same (one family)")
    p.add_argument("--rescore", action="store_true",
                   help="rewrite each family's record, its survivors that equivalent_mutants.json names since "
                        "marked equivalent (nothing runs)")
    p.add_argument("--rerun", type=Path, metavar="RECORD",
                   help="run the survivors of this mutation record again beside the sample, outside its kill rate "
                        "(default: the family's committed record; e.g. an older one from git)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every family's summary and mutants here")
    p.add_argument("--record", action="store_true",
                   help="write traces/verification/mutation/<family>.json (the kill rates the site shows)")


def _selected_files(family: Any, globs: Optional[Sequence[str]], repo: Path) -> list[str]:
    files = [p.as_posix() for p in family.source_files() if not p.is_absolute()]
    if globs:
        return [f for f in files if any(fnmatch.fnmatchcase(f, g) for g in globs)]
    package = Path(family.package.__file__).resolve().parent.relative_to(repo).as_posix()
    return [f for f in files if f.rpartition("/")[0] == package
            and any(fnmatch.fnmatchcase(f.rpartition("/")[2], g) for g in DEFAULT_FILES)]


def mutate_family(family: Any, args: argparse.Namespace, repo: Path) -> Optional[dict[str, Any]]:
    """Run the mutants of one family; None (after a message) when there is nothing to run."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kernel_sentinel import records
    from kernel_sentinel.family import matches

    routes = [r.id for r in family.routes() if not args.route or matches(r.id, args.route)]
    files = _selected_files(family, args.files, repo)
    if not routes or not files:
        console.err.print(f"{family.name}: no {'route' if not routes else 'source file'} selected")
        return None
    equivalents = load_equivalents(Path(family.package.__file__).resolve().parent / EQUIVALENTS)
    candidates = [m for f in files for m in find_mutants((repo / f).read_text(), f)]
    kept = [m for m in candidates if listed_reason(equivalents, m) is None]
    sample = sorted(random.Random(args.seed).sample(kept, min(args.n, len(kept))) if args.n is not None else kept,
                    key=lambda m: (m.file, m.start))
    earlier = earlier_survivors(family, kept, sample, args.rerun)
    running = [*sample, *earlier]
    made = [Scratch(repo, scratch_packages(family)) for _ in range(args.jobs)]
    try:  # the verifier the workers run: its copy's files by repo-relative path, an installed one's by its own
        verifier = sorted(p.relative_to(repo) if p.is_relative_to(repo) else p
                          for p in Path(__file__).resolve().parent.glob("*.py"))
        store = Kept(args.keep, {"family": family.name, "sources": records.blob_ids(family.source_files()),
                                 "verifier": records.blob_ids(verifier), "routes": routes, "seed": args.seed,
                                 "versions": {**records.versions(), "numpy": numpy.__version__}})
        baseline = store.baseline(lambda: run_baseline(made, family.name, routes, args.seed,
                                                       recorded_seconds(family.name)))

        outcomes: list[Outcome] = []
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console.err) as progress:
            task = progress.add_task(f"mutate {family.name}", total=len(running))

            def report(outcome: Outcome) -> None:
                outcomes.append(outcome)
                progress.console.print(f"{outcome.status}: {escape(outcome.mutant.diff())}"
                                       + (f"  ({escape(outcome.by)})" if outcome.by else ""),
                                       highlight=False, soft_wrap=True)
                killed = sum(o.killed for o in outcomes)
                progress.update(task, advance=1, description=f"mutate {family.name}: {killed}/{len(outcomes)} killed")

            def done(mutant: Mutant, outcome: Optional[Outcome], passed: list[str]) -> None:
                store.add(outcome or Outcome(mutant, "unfinished", "stopped while spread out"), passed)
                if outcome is not None and outcome.status != "unfinished":
                    report(outcome)

            first = []
            for mutant in running:
                kept_outcome = store.outcome(mutant)
                if kept_outcome is None and not baseline.routes_for(mutant):
                    done(mutant, Outcome(mutant, "unreached", "no route runs this line"), [])
                elif kept_outcome is None:
                    first.append((mutant, [baseline.routes_for(mutant)]))
                elif kept_outcome.status != "unfinished":
                    report(kept_outcome)
            run_mutants(made, family.name, first, baseline, args.seed, done, cap=args.split_after)
            late = [m for m in running if store.outcome(m).status == "unfinished"]
            if late:
                progress.console.print(f"{len(late)} mutants unfinished: each route of each on its own, over "
                                       f"{len(made)} workers", highlight=False)
            run_mutants(made, family.name,
                        [(m, [[r] for r in baseline.routes_for(m) if r not in store.passed(m)]) for m in late],
                        baseline, args.seed, done)
    finally:
        for s in made:
            s.remove()
    shown = load_equivalents(Path(family.package.__file__).resolve().parent / EQUIVALENTS)  # entries added meanwhile
    again = [o for o in outcomes if o.mutant in earlier]
    return summarize(family.name, with_equivalents([o for o in outcomes if o not in again], shown), len(candidates),
                     len(candidates) - len(kept), args.seed, again)


def _unlined(diff: str) -> str:
    """A survivor's one-line diff (:meth:`Mutant.diff`) without its line number, which moves with edits above it."""
    file, _, rest = diff.partition(":")
    return f"{file}:{rest.partition(':')[2]}"


def _record_family(path: Path) -> Optional[str]:
    """The family a mutation record at ``path`` is of (None: no such file, or not a record)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record.get("family") if isinstance(record, dict) else None


def earlier_survivors(family: Any, kept: Sequence[Mutant], sample: Sequence[Mutant],
                      record: Optional[Path] = None) -> list[Mutant]:
    """The survivors of a mutation record of the family (``record``; default: its committed one,
    ``traces/verification/mutation/<family>.json``), those it ran again that still survived included, that are still
    mutants of the sampled files (``kept``: none listed equivalent; found by file, lines and operator), outside
    ``sample``. A run runs them again beside its sample, outside its kill rate, so that the record shows whether a
    check added since kills them (its ``earlier_survivors``); one that survives stays in the next record's list."""
    from kernel_sentinel import records
    from kernel_sentinel.dashboard import MUTATION_DIR_NAME

    path = record or family.root / records.RECORD_DIR / MUTATION_DIR_NAME / f"{family.name}.json"
    if not path.is_file():
        return []
    old = json.loads(path.read_text())
    wanted = {_unlined(s["diff"]) for s in (*old.get("survivors", ()), *old.get("earlier_survivors", ()))
              if s.get("status") == "survived"}
    return [m for m in kept if _unlined(m.diff()) in wanted and m not in sample]


def with_equivalents(outcomes: Sequence[Outcome], shown: dict[tuple[str, str, str, str], str]) -> list[Outcome]:
    """``outcomes`` with each survivor that ``shown`` (:func:`load_equivalents`) names marked ``equivalent``, its
    reason as ``by``; killed and unreached mutants stay as they are."""
    reasons = [listed_reason(shown, o.mutant) if o.status == "survived" else None for o in outcomes]
    return [o if reason is None else dataclasses.replace(o, status="equivalent", by=reason)
            for o, reason in zip(outcomes, reasons)]


def rescore(record: dict[str, Any], equivalents: dict[tuple[str, str, str, str], str],
            repo: Path) -> dict[str, Any]:
    """``record`` (a family's mutation record) with each survivor that ``equivalents`` names now taken out of every
    count and of the kill rate, as :func:`with_equivalents` does at the end of a run. The survivors are found again
    by their diff in the sampled files under ``repo``, which must be those of the record's commit."""
    found = {m.diff(): m for f in record["files"] for m in find_mutants((repo / f).read_text(), f)}
    out = json.loads(json.dumps(record))
    out["survivors"] = []
    out.setdefault("equivalent_sampled", 0)  # records made before equivalents were shown after a run
    for survivor in record["survivors"]:
        if survivor["diff"] not in found:
            raise ValueError(f"survivor not among the mutants of the sampled files: {survivor['diff']}")
        mutant = found[survivor["diff"]]
        if survivor["status"] != "survived" or listed_reason(equivalents, mutant) is None:
            out["survivors"].append(survivor)
            continue
        out["equivalent_sampled"] += 1
        out["by_operator"][mutant.operator]["mutants"] -= 1
        out["files"][mutant.file]["mutants"] -= 1
    out["files"] = {f: {**e, "kill_rate": percent_killed(e["killed"], e["mutants"])}
                    for f, e in out["files"].items() if e["mutants"]}
    out["kill_rate"] = percent_killed(out["killed"], out["sampled"] - out["equivalent_sampled"])
    return out


def rescore_records(families: Sequence[Any]) -> int:
    """``--rescore``: each family's committed record rewritten by :func:`rescore`; 1 when one is missing or its
    sampled files changed since its commit."""
    from kernel_sentinel import records
    from kernel_sentinel.dashboard import MUTATION_DIR_NAME, mutation_is_current
    failed = False
    for family in families:
        path = family.root / records.RECORD_DIR / MUTATION_DIR_NAME / f"{family.name}.json"
        record = json.loads(path.read_text()) if path.is_file() else None
        if record is None or not mutation_is_current(record):
            why = "no mutation record" if record is None else "the sampled files changed since the record"
            console.err.print(f"{family.name}: {why}: run `sentinel mutate --record` again", highlight=False)
            failed = True
            continue
        equivalents = load_equivalents(Path(family.package.__file__).resolve().parent / EQUIVALENTS)
        summary = rescore(record, equivalents, family.root)
        print_summary(summary)
        if summary["survivors"] == record["survivors"]:
            console.err.print(f"{path.relative_to(family.root)}: no survivor listed since; unchanged")
            continue
        path.write_text(records.dumps(summary))
        console.err.print(f"rescored {path.relative_to(family.root)}")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    from kernel_sentinel import records, registry
    from kernel_sentinel.dashboard import MUTATION_DIR_NAME
    from kernel_sentinel.family import matches, rooted

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill`, `timeout`: stop like Ctrl-C, copies removed
    if args.n is not None and args.n < 1:
        return console.usage_error(f"-n must be >= 1, got {args.n}")
    if args.jobs < 1:
        return console.usage_error(f"--jobs must be >= 1, got {args.jobs}")
    if args.split_after is not None and args.split_after <= 0:
        return console.usage_error(f"--split-after must be > 0 seconds, got {args.split_after:g}")
    if not 0 <= args.min_kill <= 100:
        return console.usage_error(f"--min-kill is a percentage in 0..100, got {args.min_kill}")
    try:
        families = registry.select(args.family)
    except registry.UnknownFamily as exc:
        return console.usage_error(exc.args[0])
    except RuntimeError as exc:  # a named family whose registration is broken
        console.err.print(f"[bold red]sentinel mutate:[/] {exc}", highlight=False, soft_wrap=True)
        return 1
    if args.route and not any(matches(r.id, args.route) for f in families for r in f.routes()):
        return console.usage_error(f"--route {' '.join(args.route)} matches no route; see `sentinel routes`")
    if args.keep is not None and len(families) != 1:
        return console.usage_error("--keep keeps the runs of one family: name it with --family")
    if args.rerun is not None and (len(families) != 1 or _record_family(args.rerun) != families[0].name):
        return console.usage_error(f"--rerun {args.rerun}: not a mutation record of "
                                   f"{families[0].name if len(families) == 1 else 'one family named with --family'}")
    if args.record and (args.route or args.files):
        return console.usage_error("--record measures every route and the default files; drop --route / --files")
    if args.rescore:
        if args.keep or args.record or args.route or args.files:
            return console.usage_error("--rescore rewrites the committed records: drop --keep, --record, --route "
                                       "and --files")
        return rescore_records(families)
    summaries, failed = [], False
    for family in families:
        try:
            with rooted(family.root):  # its records, sources and commit are those of its own repository
                commit = records.head_commit()  # the sources the scratch copies are made of, not those at the end
                summary = mutate_family(family, args, family.root)
        except RuntimeError as exc:
            console.err.print(f"[bold red]{family.name}:[/] {exc}", highlight=False)
            failed = True
            continue
        if summary is None:
            continue
        summary["commit"] = commit
        summary["date"] = time.strftime("%Y-%m-%d", time.gmtime())
        summaries.append(summary)
        print_summary(summary)
        if summary["kill_rate"] is not None and summary["kill_rate"] < args.min_kill:
            console.out.print(f"{family.name}: kill rate {summary['kill_rate']:.1f}% is under --min-kill "
                              f"{args.min_kill:g}%", highlight=False)
            failed = True
        if args.record:
            path = family.root / records.RECORD_DIR / MUTATION_DIR_NAME / f"{family.name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(records.dumps({k: v for k, v in summary.items() if k != "mutants"}))
            console.err.print(f"recorded {path.relative_to(family.root)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summaries, indent=2) + "\n")
    return 1 if failed or not summaries else 0


def serve() -> int:
    """The fork server: for each JSON request ``{"argv", "timeout"}`` on stdin, fork, run :func:`worker` with
    ``argv`` in the child (its output to a file), kill it past ``timeout`` seconds or on SIGUSR1
    (:meth:`Scratch.cancel`), and answer ``{"code", "last", "timed_out"}`` (``code``: the exit code, negative for a
    signal, :data:`CANCELLED` when cancelled) on stdout."""
    import traceback

    cancelled = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: cancelled.set())  # Scratch.cancel (first: a cancel never ends the server)

    import hypothesis  # noqa: F401  (warm imports shared by every fork)
    import torch  # noqa: F401
    import triton.language  # noqa: F401

    parent = os.getppid()
    for line in sys.stdin:  # ends when the run is gone (its end of the pipe closed)
        request = json.loads(line)
        cancelled.clear()  # a cancel that came after the last answer was for that request
        handle, output = tempfile.mkstemp(prefix="sentinel-mutant-", suffix=".log")
        pid = os.fork()
        if pid == 0:
            os.dup2(handle, 1)
            os.dup2(handle, 2)
            try:
                code = worker(request["argv"])
            except BaseException:  # an import or setup error of the mutant: a failure like any other
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        os.close(handle)
        deadline, timed_out = time.monotonic() + request["timeout"], False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline or cancelled.is_set() or os.getppid() != parent:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                if os.getppid() != parent:  # the run is gone: nobody reads the verdict
                    return 1
                timed_out = not cancelled.is_set()
                break
            time.sleep(0.05)
        text = Path(output).read_text(errors="replace").strip().splitlines()
        os.unlink(output)
        last = f"ran past {request['timeout']:.0f} s" if timed_out else (text[-1] if text else "(no output)")
        code = CANCELLED if cancelled.is_set() else os.waitstatus_to_exitcode(status)
        print(json.dumps({"code": code, "last": last, "timed_out": timed_out}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve())
    if sys.argv[1:2] == ["worker"]:
        sys.exit(worker(sys.argv[2:]))
    sys.exit("usage: python -m kernel_sentinel.mutate serve | "
             "worker --family F --route R [R ...] [--seed S] [--check C ...]")
