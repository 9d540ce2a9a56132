"""Rules of the family layout that read the source text: registrations are data and plain functions (no kernel in
a ``family*.py``, no write to another module's state), and no file of the library or of sentinel cites a benchmark
file (design documents are pages of the site, ``traces/guide/<family>-design.md``)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from kernel_sentinel.family import REPO_ROOT


def _root_name(node: ast.expr) -> str | None:
    """The name an attribute or subscript chain starts from (``a`` of ``a.b[c].d``), None for another start."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _assigned(node: ast.AST) -> list[ast.expr]:
    """The attribute targets an assignment statement writes (tuples unpacked)."""
    targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
               if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
    out = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets += target.elts
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            out.append(target)
    return out


def registration_offences(kernels: Path) -> list[str]:
    """Every kernel (a function decorated by ``triton.*`` or ``*.jit``) and every write to a module the file
    imports (``module.name = ...``, ``module.table[k] = ...``, ``setattr`` / ``delattr`` on it) in a ``family*.py``
    under ``kernels``, as ``path:line: what``."""
    found = []
    for path in sorted(kernels.rglob("family*.py")):
        tree = ast.parse(path.read_text())
        imported = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
        where = path.relative_to(kernels.parent).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    name = ast.unparse(decorator.func if isinstance(decorator, ast.Call) else decorator).split(".")
                    if name[0] == "triton" or name[-1] == "jit":
                        found.append(f"{where}:{decorator.lineno}: kernel {node.name}")
            for target in _assigned(node):
                if _root_name(target) in imported:
                    found.append(f"{where}:{node.lineno}: writes {ast.unparse(target)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("setattr", "delattr") and node.args and _root_name(node.args[0]) in imported:
                found.append(f"{where}:{node.lineno}: {node.func.id} on {ast.unparse(node.args[0])}")
    return found


def test_registrations_define_no_kernel_and_write_no_other_module():
    """A registration is data and plain functions that sentinel reads: a test kernel it runs lives in the family's
    test module (segment: ``probes.py``), and a state it sets goes through a documented function of the family's
    host code (segment: ``triton_ops.restart_epochs``)."""
    assert registration_offences(REPO_ROOT / "kernels") == []
    assert len(list((REPO_ROOT / "kernels").rglob("family*.py"))) >= 5  # semicrf's three, segment, sinkhorn


def test_a_kernel_or_a_write_to_another_module_in_a_registration_is_found(tmp_path):
    (tmp_path / "kernels" / "foo").mkdir(parents=True)
    (tmp_path / "kernels" / "foo" / "family.py").write_text(
        "import itertools\nimport triton\nfrom triton import jit\nfrom provable_kernels.foo import triton_ops as ops\n"
        "@triton.jit\ndef k(x):\n    pass\n"
        "@jit(do_not_specialize=('n',))\ndef j(x):\n    pass\n"
        "def wrap():\n    ops._COUNT = itertools.count(7)\n    ops.TABLE['a'] += 1\n    setattr(ops, 'X', 1)\n"
        "def fine(case):\n    case.x = 1\n    local = {}\n    local['a'] = 2\n    return case\n"
        "fine.__doc__ = 'a plain function'\n")
    (tmp_path / "kernels" / "foo" / "oracle.py").write_text("import triton\n@triton.jit\ndef k(x):\n    pass\n")
    assert registration_offences(tmp_path / "kernels") == [
        "kernels/foo/family.py:5: kernel k", "kernels/foo/family.py:8: kernel j",
        "kernels/foo/family.py:12: writes ops._COUNT", "kernels/foo/family.py:13: writes ops.TABLE['a']",
        "kernels/foo/family.py:14: setattr on ops"]


# a path under benchmarks/ (its notes, adapters, results) or a notes file by name
BENCHMARK_FILE = re.compile(r"\bbenchmarks/[\w.*<>-]|\bNOTES[\w-]*\.md\b")


def benchmark_citations(repo: Path) -> list[str]:
    """Every line of a text file under ``repo``'s ``kernels/`` and ``sentinel/`` that cites a benchmark file, as
    ``path:line``."""
    found = []
    for folder in ("kernels", "sentinel"):
        for path in sorted((repo / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                lines = path.read_text().splitlines()
            except UnicodeDecodeError:
                continue
            found += [f"{path.relative_to(repo).as_posix()}:{n}" for n, line in enumerate(lines, 1)
                      if BENCHMARK_FILE.search(line)]
    return found


def test_library_and_sentinel_cite_no_benchmark_file():
    """Design, floors and measurements are the design pages of the site (``traces/guide/<family>-design.md``);
    ``benchmarks/`` holds benchmark code and results only, which no library or verifier file cites."""
    assert benchmark_citations(REPO_ROOT) == []
    assert not list((REPO_ROOT / "benchmarks").glob("NOTES*"))
    assert {p.name for p in (REPO_ROOT / "traces" / "guide").glob("*-design.md")} >= {
        "segment-design.md", "semicrf-design.md", "sinkhorn-design.md"}


def test_a_benchmark_citation_is_found(tmp_path):
    for path, text in {"kernels/foo/triton_ops.py": '"""Measured on an H200 (benchmarks/NOTES-foo.md)."""\n',
                       "kernels/foo/call.py": "# see NOTES-foo.md, run 2\n",
                       "sentinel/report.py": "PATH = 'benchmarks/results/foo/x.json'\n",
                       "sentinel/ok.py": "# ``python -m benchmarks`` times the public calls\n"}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "kernels" / "blob.bin").write_bytes(b"\xff\xfe benchmarks/x")
    assert benchmark_citations(tmp_path) == ["kernels/foo/call.py:1", "kernels/foo/triton_ops.py:1",
                                             "sentinel/report.py:1"]
