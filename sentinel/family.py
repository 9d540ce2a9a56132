"""The one interface through which sentinel sees a kernel family: the :class:`Family` object.

Sentinel builds a family's :class:`Family` from its registration, ``kernels/<name>/family.py``, which is data and
plain functions and imports nothing of sentinel (:mod:`kernel_sentinel.registration` reads it;
:mod:`kernel_sentinel.registry` finds it). Sentinel never changes when a family is added. Everything sentinel says
about a family (routes, checks, traces, gate) comes from this object and the code it points at.

Declarative part (read by the trace generator): ``name``, ``package`` (its docstring is ``summary``), ``tree``
and ``more_trees`` (one dispatch tree per group of public entry points; route ids unique across them),
``entry_points``, ``invariants``, ``guards``, ``known_issues``, ``source_files()``.

Executable part (run by :mod:`kernel_sentinel.verify`, once per route and per dtype of ``dtypes``):

- ``make_case(route_id, size=, dtype=, device=, seed=)`` builds a :class:`Case` whose inputs make the dispatcher
  take that route, with floating inputs in ``dtype``; ``size`` is ``"small"`` (reference and exact backend) or
  ``"tiny"`` (brute force affordable; guards and bad inputs). Training routes set ``Case.upstream``.
- ``run(case)`` calls the entry point with the case's arguments untouched (bad-input checks go through it too) and,
  for training routes, backward; it returns named tensors: the outputs and every gradient ``grad_<input>`` of
  ``sum_k (case.upstream[k] * output_k).sum()`` (:func:`kernel_sentinel.cases.outputs_and_gradients`). The
  verifier runs it inside :func:`provable_kernels.dispatch.recording` and checks the route taken.
- ``reference(case)`` returns the same names from an independent float64 computation (the family's oracle module).
- ``oracles``: more independent computations (exact backend, brute force), each returning some of those names.
- ``properties``: hypothesis properties; ``adversarial``: guard inputs; ``bad_inputs``: one wrong argument each.
- ``dtypes``: the input dtypes the family supports, each verified; ``tolerances``: allowed error per dtype.

``batch_items``: what an item of a batch is, per group of routes (:class:`BatchItems`), for the ``batch`` check.

Exceptions to the generic checks (:mod:`kernel_sentinel.generic`), declared where the contract needs them:
``aliasing`` (an output that may share storage with an argument) and ``rejected_layouts`` (a view an argument
may not be passed as). Site and verify output: ``failure_modes`` (symptom -> pages to read and the check that
covers it) and ``known_issues`` (:class:`KnownIssue`; a plain string is shown unrated).
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import dataclasses
import fnmatch
import functools
import inspect
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch

from provable_kernels.dispatch import Route, Tree

REPO_ROOT = Path(__file__).resolve().parent.parent  # the checkout sentinel runs from: its own families' repository

Outputs = Mapping[str, torch.Tensor]

_ROOT: contextvars.ContextVar[Optional[Path]] = contextvars.ContextVar("sentinel_root", default=None)


@functools.lru_cache(maxsize=None)
def repository_of(path: Path) -> Optional[Path]:
    """The top level of the git repository holding ``path`` (a directory), or None when no repository does."""
    try:
        done = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True)
    except OSError:  # no git, or no such directory
        return None
    return Path(done.stdout.strip()).resolve() if done.returncode == 0 and done.stdout.strip() else None


def current_repository() -> Path:
    """The repository of the current directory (its git top level; the directory itself outside any repository)."""
    here = Path.cwd().resolve()
    return repository_of(here) or here


def project_root() -> Path:
    """The repository sentinel works in now: the one :func:`rooted` set (the root of the families a command
    handles), else the current directory's (:func:`current_repository`). Traces, records and the paths of a
    registration (invariant tests, sources) are relative to it."""
    return _ROOT.get() or current_repository()


@contextlib.contextmanager
def rooted(root: Path):
    """Work in the repository ``root`` (:func:`project_root`) inside the ``with`` block."""
    token = _ROOT.set(Path(root).resolve())
    try:
        yield
    finally:
        _ROOT.reset(token)


def matches(route_id: str, globs: Sequence[str]) -> bool:
    """True when ``route_id`` matches one of the fnmatch patterns ``globs``."""
    return any(fnmatch.fnmatchcase(route_id, g) for g in globs)


@functools.lru_cache(maxsize=128)
def _statements(path: str, mtime_ns: int, size: int) -> tuple[ast.stmt, ...]:
    """The top-level statements of the Python file ``path``, parsed once per version of it (its modification time
    and size): every invariant of a family names a test in one of a few files."""
    return tuple(ast.parse(Path(path).read_text()).body)


def _test_function(node_id: str, root: Optional[Path] = None) -> Optional[ast.AST]:
    """The definition of the test that the pytest node id ``path.py::test_name`` (or ``path.py::TestClass::test_name``,
    a ``[param]`` suffix ignored) names, if pytest would collect it (``test*`` functions, ``Test*`` classes) from
    that file, found by parsing it with ``ast`` (no pytest run); else None."""
    path, _, rest = node_id.partition("::")
    file = (root or project_root()) / path
    if not rest or not file.is_file():
        return None
    stat = file.stat()
    scope: Sequence[ast.stmt] = _statements(str(file), stat.st_mtime_ns, stat.st_size)
    *classes, function = rest.split("[", 1)[0].split("::")
    for name in classes:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == name and name.startswith("Test")]
        if not found:
            return None
        scope = found[0].body
    if not function.startswith("test"):
        return None
    return next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function),
                None)


def node_exists(node_id: str, root: Optional[Path] = None) -> bool:
    """True when the pytest node id (its path relative to ``root``, default :func:`project_root`) names a test
    pytest would collect (:func:`_test_function`)."""
    return _test_function(node_id, root) is not None


def statement_of(node_id: str, root: Optional[Path] = None) -> Optional[str]:
    """The first paragraph of the docstring of the test ``node_id`` names (what it checks, in one statement), its
    lines joined; None when the test does not exist or has no docstring."""
    found = _test_function(node_id, root)
    doc = ast.get_docstring(found) if found is not None else None
    return " ".join(doc.split("\n\n", 1)[0].split()) if doc else None


@dataclass(frozen=True)
class Tolerance:
    """Allowed error against the float64 reference: pass when ``|x - ref| <= atol + rtol * |ref|`` elementwise."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Invariant:
    """A property the family promises (``text``: the first paragraph of the test's docstring), and the pytest node
    id of the test that checks it."""

    text: str
    test: str


@dataclass(frozen=True)
class Guard:
    """A numerical guard in the code: what can go wrong, what the code does about it, where (a function)."""

    text: str
    where: Callable[..., Any]


class Problem(dict):
    """The problem a case is built from: named sizes and options (``seed`` among them), a dict whose keys also read
    as attributes (``p.n``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __str__(self) -> str:
        return " ".join(f"{k}={v!r}" for k, v in self.items())


@dataclass(frozen=True)
class Case:
    """Inputs for one route and a replayable one-line ``description``.

    ``kwargs`` are the keyword arguments of the entry point named ``entry``. ``upstream`` is the weighted-gradient
    contract of training routes: the weight per output name (a tensor shaped like that output), so that every
    gradient a route reports is ``d/d input of sum_k (upstream[k] * output_k).sum()`` (empty: no gradients).
    ``problem`` is what the case was built from (empty for a case built by hand), ``dtype`` and ``device`` those of
    its floating inputs.
    """

    route_id: str
    entry: str
    kwargs: Mapping[str, Any]
    description: str
    upstream: Mapping[str, torch.Tensor] = field(default_factory=dict)
    problem: Problem = field(default_factory=Problem)
    dtype: Optional[torch.dtype] = None
    device: Optional[torch.device] = None

    def with_kwargs(self, description: str, **changes: Any) -> "Case":
        """The same case with some keyword arguments replaced, described by ``description``."""
        return dataclasses.replace(self, kwargs={**self.kwargs, **changes}, description=description)

    def without(self, what: str, *names: str) -> "Case":
        """The same case without the keyword arguments ``names``; ``"; <what>"`` is appended to the description."""
        return dataclasses.replace(self, kwargs={n: x for n, x in self.kwargs.items() if n not in names},
                                   description=f"{self.description}; {what}")

    def transformed(self, what: str, **functions: Callable[[Any], Any]) -> "Case":
        """The same case with each named argument replaced by ``function(argument)``, ``"; <what>"`` appended to
        the description. A tensor argument (or each tensor of a tuple) is passed as a float64 copy on the CPU and
        the result cast back to its dtype and device, a leaf requiring grad like the original."""
        def change(x: Any, fn: Callable[[Any], Any]) -> Any:
            if isinstance(x, tuple):
                return tuple(change(m, fn) for m in x)
            if not isinstance(x, torch.Tensor):
                return fn(x)
            copy = x.detach().cpu().double().clone()
            return fn(copy).to(x.device, x.dtype).requires_grad_(x.requires_grad)

        missing = [n for n in functions if n not in self.kwargs]
        if missing:
            raise ValueError(f"functions name arguments the case of {self.route_id} lacks: {', '.join(missing)}")
        changed = {n: change(self.kwargs[n], fn) for n, fn in functions.items()}
        return self.with_kwargs(f"{self.description}; {what}", **changed)


@dataclass(frozen=True)
class Oracle:
    """An independent computation of a route's outputs. ``compute(case)`` returns some of the names that
    ``Family.run`` returns (every name it returns is compared); ``size`` is the case size it can afford;
    ``routes`` (fnmatch globs) the routes it applies to."""

    name: str
    size: str
    compute: Callable[[Case], Outputs]
    routes: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class Property:
    """A hypothesis property of the routes matching ``routes`` (fnmatch globs), run at the dtypes ``dtypes`` of the
    family (empty: every dtype of the family).

    ``example()`` returns a hypothesis strategy of one example (keep it printable: it is shown shrunk on failure);
    ``check(route_id, example, device, dtype)`` raises ``AssertionError`` when the property fails (use
    :func:`kernel_sentinel.checks.expect_close` and :func:`kernel_sentinel.checks.expect`, which also report the
    error sizes); ``dtype`` is the dtype of the verify row (build the inputs in it and compare with
    ``Family.tolerance(dtype)``). :func:`kernel_sentinel.cases.finite_difference_property` builds one.
    """

    name: str
    routes: tuple[str, ...]
    example: Callable[[], Any]
    check: Callable[[str, Any, torch.device, torch.dtype], None]
    dtypes: tuple[torch.dtype, ...] = ()

    def runs_at(self, route_id: str, dtype: torch.dtype) -> bool:
        """True when this property applies to ``route_id`` at ``dtype``."""
        return matches(route_id, self.routes) and (not self.dtypes or dtype in self.dtypes)


@dataclass(frozen=True)
class Adversarial:
    """A guard input for the routes matching ``routes``: ``make(case)`` turns the route's tiny case into the
    adversarial one. Outputs must never be NaN; an infinite output is allowed only for the names in ``allow_inf``;
    ``errors_ok`` accepts a ``ValueError``/``TypeError`` instead of a result; ``expect(case, outputs)`` may add
    family-specific assertions (raise ``AssertionError``)."""

    name: str
    routes: tuple[str, ...]
    make: Callable[[Case], Case]
    errors_ok: bool = False
    allow_inf: tuple[str, ...] = ()
    expect: Optional[Callable[[Case, Outputs], None]] = None


@dataclass(frozen=True)
class BadInput:
    """One argument made wrong: ``make(case)`` returns the case with ``argument`` wrong; the call must raise
    ``ValueError`` or ``TypeError`` whose message starts with ``argument``. The tensor-argument ones every family
    needs come from :func:`kernel_sentinel.cases.standard_bad_inputs`. ``device_mode(case, outputs)`` (optional)
    raises ``AssertionError`` when the outputs of a device-mode run that did not raise break what the family
    promises for this input beyond "non-finite somewhere" (e.g. which elements are NaN)."""

    argument: str
    what: str
    routes: tuple[str, ...]
    make: Callable[[Case], Case]
    device_mode: Optional[Callable[[Case, dict], None]] = None


@dataclass(frozen=True)
class Aliasing:
    """A declared exception to the generic ``aliasing`` check: on the routes matching ``routes``, output
    ``output`` may share storage with tensor argument ``argument``; ``why`` says why that is the contract."""

    output: str
    argument: str
    routes: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Blocks:
    """A kernel's block along one dimension of an argument, declared so that the fixed cases cross a block edge:
    on the routes matching ``routes``, the cases of each size in ``sizes`` must have ``argument.shape[dim] >
    block`` (two blocks or more), so a mask or loop between blocks runs without a lucky random example."""

    routes: tuple[str, ...]
    argument: str
    dim: int
    block: int
    sizes: tuple[str, ...] = ("small",)


@dataclass(frozen=True)
class Publish:
    """A publish protocol a kernel relies on, declared for the ``races`` check: in kernel ``kernel``, a program
    reads what another program wrote to argument ``data`` only after an acquire of argument ``flag`` that the
    writer released after its write (``why``: the protocol in words). The check then fails any such read that no
    acquire of ``flag`` orders, even one some other synchronisation orders."""

    kernel: str
    data: str
    flag: str
    why: str


@dataclass(frozen=True)
class LayoutRejection:
    """A declared exception to the generic ``layouts`` check: on the routes matching ``routes``, tensor argument
    ``argument`` passed in layout ``layout`` (``transposed``, ``strided``, ``offset`` or ``expanded``) is rejected
    with a ``ValueError``/``TypeError`` whose message starts with the argument's name; ``why`` says why."""

    argument: str
    layout: str
    routes: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class BatchItems:
    """What an item of a batch is on the routes matching ``routes`` (``what``: "a sequence", "a matrix", "a
    segment"), for the ``batch`` check (:mod:`kernel_sentinel.invariance`).

    ``split(case)`` returns the case's items, each a case holding that item alone (its upstream weights too);
    ``join(base, items)`` one case holding ``items`` in order, every argument that is not per item (shared
    parameters, options) taken from ``base``; ``outputs(case, outputs)`` the outputs of a joined case split into
    each item's outputs, by the names ``Family.run`` returns. ``summed`` names the outputs that are sums over the
    items (gradients of shared parameters), not per item. :func:`kernel_sentinel.cases.batch_along` builds one for
    items along a dimension of named tensors."""

    what: str
    routes: tuple[str, ...]
    split: Callable[[Case], Sequence[Case]]
    join: Callable[[Case, Sequence[Case]], Case]
    outputs: Callable[[Case, Outputs], Sequence[Outputs]]
    summed: tuple[str, ...] = ()


SYMPTOMS = {  # symptom -> the verify checks whose failure shows it, and the signs of it in their detail
    "NaN in the loss": (("guards", "written"), ("has NaN", "has inf", "poisoned")),
    "NaN in the backward": (("guards", "written"), ("has NaN", "has inf", "poisoned")),
    "wrong gradients": (("reference", "exact", "properties", "guards"), ("grad", "derivative")),
    "out of memory": ((), ()),
    "backend mismatch": (("reference", "exact"), ()),
    "wrong route taken": (("route",), ()),
}


@dataclass(frozen=True)
class FailureMode:
    """Where a symptom leads: the page and section to read first and a secondary page (paths relative to the
    trace directory, e.g. ``semicrf/partition-triton.md#numerical-guards`` or ``guide/semicrf.md``; ``sentinel
    trace`` fails when one does not resolve), and the guard or check that covers it. ``checks`` names the verify
    checks whose failure on a route matching ``routes`` shows this symptom (``sentinel verify`` prints the entry
    next to the reproduce command) when the failure's detail holds one of ``signs`` (e.g. ``"NaN"`` for a NaN
    symptom, ``"grad"`` for a gradient one; empty: any failure of those checks)."""

    symptom: str
    read_first: str
    then: str
    covered_by: str
    checks: tuple[str, ...] = ()
    routes: tuple[str, ...] = ("*",)
    signs: tuple[str, ...] = ()

    def shown_by(self, check: str, detail: str) -> bool:
        """Whether a failure of ``check`` with ``detail`` shows this symptom."""
        return check in self.checks and (not self.signs or any(sign in detail for sign in self.signs))


@dataclass(frozen=True)
class KnownIssue:
    """A known issue: what happens, how bad (``severity``), how often (``frequency``), what resolves or works
    around it (``resolution``) and the commit that resolved it (empty while open)."""

    text: str
    severity: str
    frequency: str
    resolution: str
    commit: str = ""


@dataclass
class Family:
    """A kernel family as sentinel sees it (see the module docstring for every field). ``dtypes`` lists the input
    dtypes verified (each needs an entry in ``tolerances``)."""

    name: str
    package: ModuleType
    tree: Tree
    entry_points: Mapping[str, Callable[..., Any]]
    make_case: Callable[..., Case]
    run: Callable[[Case], Outputs]
    reference: Callable[[Case], Outputs]
    tolerances: Mapping[torch.dtype, Tolerance]
    oracles: Sequence[Oracle] = ()
    properties: Sequence[Property] = ()
    adversarial: Sequence[Adversarial] = ()
    bad_inputs: Sequence[BadInput] = ()
    invariants: Sequence[Invariant] = ()
    guards: Sequence[Guard] = ()
    known_issues: Sequence[Union[KnownIssue, str]] = ()
    dtypes: Sequence[torch.dtype] = (torch.float32,)
    aliasing: Sequence[Aliasing] = ()
    rejected_layouts: Sequence[LayoutRejection] = ()
    failure_modes: Sequence[FailureMode] = ()
    more_trees: Sequence[Tree] = ()
    batch_items: Sequence[BatchItems] = ()
    root: Path = field(default_factory=project_root)  # the family's repository: its paths are relative to it
    blocks: Sequence[Blocks] = ()
    publishes: Sequence[Publish] = ()

    def __post_init__(self) -> None:
        missing = [d for d in self.dtypes if d not in self.tolerances]
        if not self.dtypes or missing:
            raise ValueError(f"family {self.name!r}: dtypes must be non-empty and each needs a tolerance; "
                             f"no tolerance for {missing}")
        ids = [route.id for route in self.routes()]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"family {self.name!r}: route ids must be unique across its trees; repeated: {twice}")

    @property
    def trees(self) -> tuple[Tree, ...]:
        """Every dispatch tree of the family: ``tree`` (its kernels' entry points), then ``more_trees`` (other
        public entry points that decide something, e.g. a module choosing a backend)."""
        return (self.tree, *self.more_trees)

    def routes(self) -> list[Route]:
        """Every route of every tree, in tree order."""
        return [route for tree in self.trees for route in tree.routes()]

    @property
    def summary(self) -> str:
        return inspect.cleandoc(self.package.__doc__ or "")

    def source_files(self) -> list[Path]:
        """Every file whose change can change this family's behaviour: the ``.py`` files of the family package and
        every module of the kernel library they import, transitively (import statements read with ``ast``, at
        module top and inside functions; parent packages' ``__init__.py`` included), that lie in the family's
        repository (``root``). Sorted; paths relative to ``root``. Files outside it are installed packages (the
        kernel library of a family in another repository, say): records name them by version
        (:func:`kernel_sentinel.records.versions`)."""
        return self._inside_root(imported_files(self.package))

    def runtime_files(self) -> list[Path]:
        """The files ``import <family package>`` loads, transitively: what a user's call runs (the registration
        modules and the oracle only when the package itself imports them). Benchmarks go stale with these."""
        return self._inside_root(imported_files(self.package, runtime=True))

    def _inside_root(self, files: set[Path]) -> list[Path]:
        root = self.root.resolve()
        return sorted(p.relative_to(root) for p in files if p.is_relative_to(root))

    def one_block_cases(self) -> list[str]:
        """What the fixed cases leave inside one block (:class:`Blocks`): one line per route, size and argument
        whose case does not reach a second block."""
        found = []
        for blocks in self.blocks:
            for route in (r for r in self.routes() if matches(r.id, blocks.routes)):
                for size in blocks.sizes:
                    case = self.make_case(route.id, size=size, dtype=self.dtypes[0], device=torch.device("cpu"),
                                          seed=0)
                    x = case.kwargs.get(blocks.argument)
                    if not isinstance(x, torch.Tensor):
                        found.append(f"{route.id} ({size}): the case has no tensor {blocks.argument!r} (BLOCKS)")
                    elif x.shape[blocks.dim] <= blocks.block:
                        found.append(f"{route.id} ({size}): {blocks.argument}.shape[{blocks.dim}] = "
                                     f"{x.shape[blocks.dim]} fits in one block of {blocks.block}: make SIZES[{size!r}] "
                                     f"span two blocks, so that the edge between them runs")
        return found

    def missing_tests(self) -> list[str]:
        """Node ids of declared invariants whose test does not exist (paths relative to ``root``)."""
        return [inv.test for inv in self.invariants if not node_exists(inv.test, self.root)]

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        """The tolerance of ``dtype`` (``KeyError`` when the family declares none)."""
        if dtype not in self.tolerances:
            raise KeyError(f"family {self.name!r} declares no tolerance for {dtype}")
        return self.tolerances[dtype]


# ------------------------------------------------------------------------------------------- source files

KERNELS_PACKAGE = "provable_kernels"


def _package_dir(name: str) -> Optional[Path]:
    """The directory of the imported package ``name`` (``None`` when it is not imported or not a package)."""
    module = sys.modules.get(name)
    paths = getattr(module, "__path__", None)
    return Path(next(iter(paths))).resolve() if paths else None


def _module_file(name: str, roots: Mapping[str, Path]) -> Optional[Path]:
    """The file of module ``name`` when its top-level package is one of ``roots`` and the module exists."""
    top, *rest = name.split(".")
    if top not in roots:
        return None
    base = roots[top].joinpath(*rest)
    for candidate in (base / "__init__.py", base.with_suffix(".py") if rest else None):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _imported_names(file: Path, module: str) -> set[str]:
    """Names of the modules (and of ``module.attribute`` candidates) that ``file`` (module ``module``) imports,
    anywhere in the file; relative imports resolved."""
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def imported_files(package: ModuleType, *, runtime: bool = False) -> set[Path]:
    """The ``.py`` files of ``package`` (only its ``__init__.py`` when ``runtime``) and of every module of
    ``package``'s top-level package or of the kernel library (``provable_kernels``) that they import, transitively,
    with the ``__init__.py`` of each enclosing package (importing a module runs them)."""
    pkg_dir = Path(next(iter(package.__path__))).resolve()
    roots = {top: d for top in {package.__name__.split(".")[0], KERNELS_PACKAGE}
             if (d := _package_dir(top)) is not None}
    pending = [(f, f"{package.__name__}.{f.stem}" if f.name != "__init__.py" else package.__name__)
               for f in sorted(pkg_dir.glob("__init__.py" if runtime else "*.py"))]
    found: set[Path] = set()
    while pending:
        file, module = pending.pop()
        if file in found:
            continue
        found.add(file)
        parts = module.split(".")
        wanted = _imported_names(file, module) | {".".join(parts[:i]) for i in range(1, len(parts))}
        for name in wanted:
            target = _module_file(name, roots)
            if target is not None and target not in found:
                pending.append((target, name))
    return found
