"""The shape every family shares: no import cycle in the kernel library nor in sentinel, imports that point down
from benchmarks/ to sentinel/ to kernels/ (the library, registrations included, never imports its verifier),
registration only through the registry, shared modules that serve several families, and GPU records scoped to
exactly what a family imports."""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_sentinel import layout, registry
from kernel_sentinel.family import REPO_ROOT, imported_files

KERNELS = REPO_ROOT / "kernels"
SENTINEL = REPO_ROOT / "sentinel"


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Every module under ``root`` (the folder that imports as ``package``) by its dotted name."""
    def name(path: Path) -> str:
        parts = list(path.relative_to(root).with_suffix("").parts)
        return ".".join([package] + (parts[:-1] if parts[-1] == "__init__" else parts))

    return {name(p): p for p in sorted(root.rglob("*.py"))}


def _imports(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The ``modules`` that ``path`` (module ``module``) imports anywhere (module top and inside functions); a
    ``from package import name`` counts ``package.name`` when that is a module, else ``package``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(n for n in names if n in modules and n != module)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Who imports whom among ``modules``. A package's ``__init__`` importing its own submodules is the one edge
    kind left out (Python runs the package first, so a submodule importing its package's API would otherwise
    always look like a cycle)."""
    return {m: {t for t in _imports(p, m, modules) if not (p.name == "__init__.py" and t.startswith(m + "."))}
            for m, p in modules.items()}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """An import cycle of ``graph`` as the modules along it, first one repeated at the end; empty when the graph
    is a DAG."""
    state: dict[str, str] = {}

    def visit(module: str, stack: list[str]) -> list[str]:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target, stack + [target])):
                return found
        state[module] = "done"
        return []

    for module in graph:
        if module not in state and (found := visit(module, [module])):
            return found
    return []


MODULES = _modules(KERNELS, "provable_kernels")


def test_kernel_library_has_no_import_cycle():
    """Every module under kernels/, every import statement (top level and inside functions): the graph is a DAG."""
    graph = import_graph(MODULES)
    assert cycle(graph) == []
    # dispatch's route bodies call the custom ops of autograd, which import both backends at module top
    assert "provable_kernels.semicrf.autograd" in graph["provable_kernels.semicrf.dispatch"]
    assert graph["provable_kernels.semicrf.autograd"] >= {"provable_kernels.semicrf.torch_ops",
                                                          "provable_kernels.semicrf.triton_ops"}


def test_sentinel_has_no_import_cycle():
    """Every module under sentinel/, imports inside functions included: the graph is a DAG (``verify`` and its
    ``--jobs`` workers both import the row engine, ``rows``, and neither imports the other's caller)."""
    graph = import_graph(_modules(SENTINEL, "kernel_sentinel"))
    assert cycle(graph) == []
    assert "kernel_sentinel.workers" in graph["kernel_sentinel.verify"]
    assert "kernel_sentinel.rows" in graph["kernel_sentinel.workers"]


def test_a_cycle_is_found_with_the_modules_along_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycle(graph) == ["a", "b", "c", "a"]
    assert cycle({**graph, "c": {"d"}}) == []


def test_library_imports_neither_sentinel_nor_hypothesis():
    """A fresh interpreter imports every module of the library, the family registrations included: nothing of
    kernel_sentinel and no hypothesis may be loaded."""
    code = ("import importlib, json, os, sys\n"
            "os.environ.setdefault('TRITON_INTERPRET', '1')\n"
            f"for name in {sorted(MODULES)!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('kernel_sentinel', 'hypothesis'))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert {"provable_kernels.semicrf.family", "provable_kernels.semicrf.family_head"} <= set(MODULES)


# Bottom to top: a folder may import only the folders below it (by their import names); the library imports no
# hypothesis either (its registrations describe property inputs as data, sentinel draws them).
LAYERS = {**layout.IMPORT_NAMES, "benchmarks": "benchmarks"}  # folder -> import name
NEVER = {"kernels": ("hypothesis",)}


def absolute_imports(path: Path) -> set[str]:
    """The absolute module names ``path`` imports anywhere (``from a import b``: ``a``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module)
    return names


def upward_imports(repo: Path) -> list[str]:
    """Every import in ``repo``'s ``kernels/``, ``sentinel/`` and ``benchmarks/`` (module top and inside functions)
    of a folder above the importing one, or of a module its folder must never import, as ``path: name``."""
    found = []
    for level, folder in enumerate(LAYERS):
        banned = {*list(LAYERS.values())[level + 1:], *NEVER.get(folder, ())}
        for path in sorted((repo / folder).rglob("*.py")):
            found += [f"{path.relative_to(repo)}: {n}" for n in sorted(absolute_imports(path))
                      if n.split(".")[0] in banned]
    return found


def test_imports_point_down_from_benchmarks_to_sentinel_to_kernels():
    """The import graph of the three folders is a stack, every arrow pointing down: no kernels/ module (a
    registration included) imports kernel_sentinel, benchmarks or hypothesis, no sentinel/ module imports
    benchmarks."""
    assert upward_imports(REPO_ROOT) == []


def test_an_upward_import_is_found(tmp_path):
    for folder, text in {"kernels/foo/family.py": "def f():\n    from kernel_sentinel import cases\n",
                         "kernels/foo/oracle.py": "import hypothesis.strategies as st\n",
                         "sentinel/report.py": "from benchmarks.common import x\n",
                         "benchmarks/run.py": "import kernel_sentinel, provable_kernels\n"}.items():
        (tmp_path / folder).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / folder).write_text(text)
    assert upward_imports(tmp_path) == ["kernels/foo/family.py: kernel_sentinel", "kernels/foo/oracle.py: "
                                        "hypothesis.strategies", "sentinel/report.py: benchmarks.common"]


def test_sentinel_imports_no_triton_before_the_interpreter_switch():
    """``sentinel`` switches the Triton interpreter on (``TRITON_INTERPRET=1``) after parsing its arguments, so no
    sentinel module may import Triton (or a kernel module) when it is imported: kernels then built for a GPU driver
    fail under the interpreter ("Cannot call @triton.jit'd outside of the scope of a kernel")."""
    modules = sorted(f"kernel_sentinel.{p.stem}" for p in (REPO_ROOT / "sentinel").glob("*.py")
                     if p.stem not in ("__main__", "mutate"))
    code = ("import importlib, json, os, sys\n"
            "os.environ.pop('TRITON_INTERPRET', None)\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'triton')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_only_the_registry_imports_family_modules():
    """No file of the library (but the registration's parts, ``family_*.py``), of sentinel (but the registry) or of
    the tests imports a ``family.py`` module."""
    offenders = []
    for root in ("kernels", "sentinel", "tests", "benchmarks"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            if path == REPO_ROOT / "sentinel" / "registry.py" or path.name.startswith("family_"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
                         if isinstance(node, ast.ImportFrom) else [])
                if any(n.endswith(".family") and n.split(".")[0] == "provable_kernels" for n in names):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert offenders == []


# ------------------------------------------------------------------------------------------ record scope


def test_source_files_follow_imports_not_a_glob():
    sources = {p.as_posix() for p in registry.family("semicrf").source_files()}
    for wanted in ("kernels/semicrf/oracle.py", "kernels/semicrf/family.py", "kernels/semicrf/call.py",
                   "kernels/triton_math.py", "kernels/dispatch.py", "kernels/validate.py", "kernels/__init__.py"):
        assert wanted in sources
    assert not any(s.startswith(("kernels/sinkhorn/", "kernels/segment/")) for s in sources)


def test_every_shared_module_serves_at_least_two_families():
    """A module at the top of ``kernels/`` is shared: at least two families import it (directly or through
    another module); what one family alone uses lives in that family's package."""
    families = registry.families()
    for module in sorted(KERNELS.glob("*.py")):
        if module.name == "__init__.py":
            continue
        path = module.relative_to(REPO_ROOT).as_posix()
        users = [f.name for f in families if path in {p.as_posix() for p in f.source_files()}]
        assert len(users) >= 2, f"{path} is used by {users or 'no family'}: move it into its family, or delete it"


@pytest.fixture
def scratch_library(tmp_path: Path) -> Path:
    """A copy of the kernel library (only ``.py`` files) importable as ``provable_kernels`` from ``tmp_path``."""
    copy = tmp_path / "repo" / "kernels"
    for path in KERNELS.rglob("*.py"):
        target = copy / path.relative_to(KERNELS)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    return copy


def _semicrf_sources(library: Path) -> list[str]:
    """``imported_files`` of the semi-CRF package of ``library``, in a fresh interpreter, relative to it."""
    root = library.parent.parent / "import-root"
    root.mkdir(exist_ok=True)
    if not (root / "provable_kernels").exists():
        (root / "provable_kernels").symlink_to(library, target_is_directory=True)
    code = ("import json, os, sys\n"
            f"sys.path.insert(0, {str(root)!r})\n"
            "os.environ.setdefault('TRITON_INTERPRET', '1')\n"
            "import provable_kernels.semicrf as package\n"
            "from kernel_sentinel.family import imported_files\n"
            f"print(json.dumps(sorted(str(p.relative_to({str(library.resolve())!r})) for p in imported_files(package))))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_shared_module_of_another_family_leaves_semicrf_record_current(scratch_library):
    before = _semicrf_sources(scratch_library)
    (scratch_library / "only_other_family.py").write_text('"""A helper only another family imports."""\n')
    (scratch_library / "other").mkdir()
    (scratch_library / "other" / "__init__.py").write_text("from provable_kernels import only_other_family\n")
    assert _semicrf_sources(scratch_library) == before
    assert "only_other_family.py" not in before and "oracle.py" not in before  # paths relative to kernels/
    assert "semicrf/oracle.py" in before and "triton_math.py" in before


def test_record_goes_stale_when_the_oracle_changes(tmp_path, monkeypatch):
    """An edit to the semi-CRF oracle changes the blob ids a record compares: the gate and the traces call the
    record stale."""
    from kernel_sentinel import gate, records

    family = registry.family("semicrf")
    sources = records.blob_ids(family.source_files())
    assert "kernels/semicrf/oracle.py" in sources
    record = {"device": {"type": "cuda", "name": "H9"}, "sources": sources,
              "routes": [{"id": r.id, "dtype": str(d).removeprefix("torch."), "status": "pass"}
                         for d in family.dtypes for r in family.routes()]}
    assert gate.record_problem(family, record, sources) is None
    edited = dict(sources, **{"kernels/semicrf/oracle.py": "0" * 40})
    problem = gate.record_problem(family, record, edited)
    assert problem is not None and "kernels/semicrf/oracle.py" in problem
    single = dataclasses.replace(family, dtypes=(family.dtypes[0],))
    assert gate.record_problem(single, dict(record, routes=record["routes"][:1]), sources).startswith(
        "the GPU record from H9 lacks routes")


def test_import_view_puts_the_folders_under_their_import_names(tmp_path):
    """The view of the tree for import-graph tools: every folder under its import name, every absolute import of
    ``provable_kernels`` / ``kernel_sentinel`` in it names a file of the view, one commit; a non-empty target is
    refused."""
    view = layout.import_view(REPO_ROOT, tmp_path / "view")
    assert not (view / "kernels").exists() and not (view / "sentinel").exists()
    assert (view / "provable_kernels" / "semicrf" / "family.py").read_bytes() == \
        (KERNELS / "semicrf" / "family.py").read_bytes()
    unresolved = []
    for path in sorted(view.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                    node.module.split(".")[0] in layout.IMPORT_NAMES.values():
                base = view.joinpath(*node.module.split("."))
                if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
                    unresolved.append(f"{path.relative_to(view)}: {node.module}")
    assert unresolved == []
    log = subprocess.run(["git", "log", "--oneline"], cwd=view, capture_output=True, text=True, check=True).stdout
    assert len(log.splitlines()) == 1
    with pytest.raises(ValueError, match="^into must be an empty or new directory"):
        layout.import_view(REPO_ROOT, view)


# ------------------------------------------------------------------------------------------- family layout

FAMILIES = sorted(p for p in KERNELS.iterdir() if (p / "__init__.py").is_file())
LAYOUT_FILES = ("__init__", "call", "dispatch", "torch_ops", "triton_ops", "autograd", "oracle", "family")
# what each file kind of a family may import of the family's own file kinds (family-layout.md's rules)
MAY_IMPORT = {"call": set(), "kernels": {"kernels"}, "torch_ops": {"call"}, "triton_ops": {"call", "kernels"},
              "autograd": {"call", "torch_ops", "triton_ops"},
              "dispatch": {"call", "torch_ops", "triton_ops", "autograd"}}


def _kind(module: str) -> str:
    """The file kind of a family module's last name: ``kernels`` for a ``triton_*`` kernel module."""
    return "kernels" if module.startswith("triton_") and module != "triton_ops" else module


def test_every_family_has_the_layout_files_and_a_kernel_module():
    assert {"segment", "semicrf", "sinkhorn"} <= {f.name for f in FAMILIES}
    for family in FAMILIES:
        missing = [name for name in LAYOUT_FILES if not (family / f"{name}.py").is_file()]
        assert missing == [], f"{family.name} lacks {missing}"
        assert any(_kind(p.stem) == "kernels" for p in family.glob("triton_*.py")), family.name


def layering_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` (module -> imported modules) from a family's file kind to one of the same family
    that :data:`MAY_IMPORT` does not allow, as ``importer -> imported``."""
    found = []
    for module, targets in sorted(graph.items()):
        parts = module.split(".")
        if len(parts) != 3 or _kind(parts[2]) not in MAY_IMPORT:
            continue
        family, kind = parts[1], _kind(parts[2])
        for target in sorted(targets):
            tparts = target.split(".")
            if len(tparts) == 3 and tparts[1] == family and _kind(tparts[2]) in MAY_IMPORT and \
                    _kind(tparts[2]) not in MAY_IMPORT[kind]:
                found.append(f"{module} -> {target}")
    return found


def test_family_files_import_only_the_kinds_below_them():
    """call.py imports no backend; the backends (torch_ops, triton_ops) may import call.py, never each other;
    autograd.py imports the backends, never dispatch.py; dispatch.py reaches the backends directly or through
    autograd.py; the kernel modules import only kernel modules (of the family's own files: the rule table
    :data:`MAY_IMPORT`)."""
    graph = import_graph(MODULES)
    assert layering_breaks(graph) == []
    # both ways to the backends are in use: semi-CRF through its custom ops only, segment and Sinkhorn also directly
    assert "provable_kernels.semicrf.torch_ops" not in graph["provable_kernels.semicrf.dispatch"]
    assert {"provable_kernels.sinkhorn.torch_ops", "provable_kernels.sinkhorn.autograd"} <= \
        graph["provable_kernels.sinkhorn.dispatch"]


def test_a_layering_break_is_found():
    graph = {"provable_kernels.foo.call": {"provable_kernels.foo.triton_ops", "provable_kernels.foo.structures"},
             "provable_kernels.foo.torch_ops": {"provable_kernels.foo.call", "provable_kernels.foo.triton_ops"},
             "provable_kernels.foo.autograd": {"provable_kernels.foo.dispatch", "provable_kernels.bar.dispatch"},
             "provable_kernels.foo.triton_kernels": {"provable_kernels.foo.triton_more", "provable_kernels.foo.call"},
             "provable_kernels.foo.dispatch": {"provable_kernels.foo.autograd", "provable_kernels.foo.torch_ops"}}
    assert layering_breaks(graph) == [
        "provable_kernels.foo.autograd -> provable_kernels.foo.dispatch",
        "provable_kernels.foo.call -> provable_kernels.foo.triton_ops",
        "provable_kernels.foo.torch_ops -> provable_kernels.foo.triton_ops",
        "provable_kernels.foo.triton_kernels -> provable_kernels.foo.call"]


def test_oracles_import_only_torch_and_the_standard_library():
    for family in FAMILIES:
        imported = absolute_imports(family / "oracle.py")
        assert {n for n in imported if n.split(".")[0] not in sys.stdlib_module_names | {"torch"}} == set(), family


def test_kernel_modules_hold_jit_functions_and_their_constants_only():
    """A ``triton_*.py`` kernel module: ``@triton.jit`` functions and module constants, importing Triton, the
    shared ``triton_math`` and the family's other kernel modules only."""
    for family in FAMILIES:
        for path in sorted(p for p in family.glob("triton_*.py") if _kind(p.stem) == "kernels"):
            tree = ast.parse(path.read_text())
            plain = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not any(
                ast.unparse(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in
                getattr(n, "decorator_list", []))]
            assert plain == [], f"{path.name}: not @triton.jit: {plain}"
            allowed = {"__future__", "triton", "triton.language", "provable_kernels.triton_math"}
            others = {n for n in absolute_imports(path) if n not in allowed and not (
                n.startswith(f"provable_kernels.{family.name}.triton_") and _kind(n.rpartition(".")[2]) == "kernels")}
            assert others == set(), f"{path.name} imports {others}"


def test_sentinel_imports_only_shared_modules_of_the_library():
    """sentinel holds nothing family-specific: of the library it imports the shared modules at the top of
    ``kernels/`` only (and the package itself, for its path), and reaches a family through its registration, which
    the registry loads by name."""
    shared = {f"provable_kernels.{p.stem}" for p in KERNELS.glob("*.py") if p.stem != "__init__"} | {"provable_kernels"}
    found = []
    for path in sorted(SENTINEL.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" if node.module == "provable_kernels" else node.module
                      for a in node.names] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "provable_kernels" and n not in shared]
    assert found == []


def test_the_guides_semicrf_import_list_is_the_import_graph():
    """``family-layout.md`` lists what each semi-CRF module imports of the library: the list is the graph."""
    page = (REPO_ROOT / "traces" / "guide" / "family-layout.md").read_text()
    def module(name: str) -> str:  # `kernels/alloc`: a shared module; `call`: a semi-CRF one
        return name.replace("kernels/", "provable_kernels.") if "/" in name else f"provable_kernels.semicrf.{name}"

    listed = {m: {module(t) for t in re.findall(r"`([\w/]+)`", rest)}
              for m, rest in re.findall(r"^- `(\w+)` -> (.+)$", page, re.M)}
    graph = import_graph(MODULES)
    actual = {m.rpartition(".")[2]: graph[m] for m in graph
              if m.startswith("provable_kernels.semicrf.") and m != "provable_kernels.semicrf"}
    assert listed == actual
