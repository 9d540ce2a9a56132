"""``sentinel verify --coverage`` (kernel_sentinel.coverage): markers, the measurement of a toy family whose package
holds a Triton kernel (measured under the interpreter), verdicts of complete and partial runs, stale and broken
declarations, the table and the JSON."""
from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from rich.console import Console

from kernel_sentinel import coverage
from kernel_sentinel.family import Family, Tolerance

OPS = '''\
"""Toy kernels for the coverage tests."""
import torch
import triton
import triton.language as tl

from provable_kernels.dispatch import Branch, Condition, Route, Tree


@triton.jit
def _double_kernel(x, y, n, BLOCK: tl.constexpr, NEGATE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask)
    if NEGATE:
        v = -v
    tl.store(y + offs, 2 * v, mask=mask)


def double(x):
    """Twice ``x`` (1-D float32) with a Triton kernel."""
    y = torch.empty_like(x)
    _double_kernel[(1,)](x, y, x.numel(), BLOCK=16, NEGATE=False)
    if x.numel() > 2**40:  # verify: unreached (needs more memory than any test machine)
        raise MemoryError("too large")
    return y


def triple(x):
    """Three times ``x``."""
    return 3 * x


def never_called(x):
    """Not reached by anything."""
    y = x + 1
    return y


def ask(call):
    """``double`` or ``triple``."""
    return call["how"]


TREE = Tree("toy_scale", Branch(Condition("how", ask, ("double", "triple")),
                                {"double": Route("toy.double", lambda c: double(c["x"])),
                                 "triple": Route("toy.triple", lambda c: triple(c["x"]))}))
'''


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """A fresh package ``covtoy`` (``ops.py`` as above, a ``family.py`` and its part), importable, and a function that
    builds its :class:`Family` (``ops`` may replace the source of ``ops.py``)."""
    created = []

    def make(ops: str = OPS) -> tuple[Family, object]:
        name = f"covtoy{len(created)}"
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text('"""A toy family."""\n')
        (pkg / "ops.py").write_text(ops)
        (pkg / "family.py").write_text(f"from {name} import family_part, ops  # noqa: F401\n")
        (pkg / "family_part.py").write_text('"""A part of the registration."""\n')
        created.append(name)
        importlib.invalidate_caches()
        package = importlib.import_module(name)
        module = importlib.import_module(f"{name}.ops")
        family = Family(name=name, package=package, tree=module.TREE, entry_points={}, make_case=None, run=None,
                        reference=None, tolerances={torch.float32: Tolerance(0, 0)}, root=tmp_path)
        return family, module

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in created:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def measure(family, module, tmp_root: Path, complete: bool = True):
    with coverage.measuring([tmp_root]) as measured:
        x = torch.arange(5.0)
        assert torch.equal(module.TREE.dispatch({"how": "double", "x": x}), 2 * x)
        assert torch.equal(module.TREE.dispatch({"how": "triple", "x": x}), 3 * x)
    return coverage.report([family], [family], measured, lambda f: complete)


def ops_row(cov, family):
    (row,) = [f for f in cov.files if f.path.endswith(f"{family.name}/ops.py")]
    return row


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_kernel_sources_leave_out_the_registration_module(toy_package):
    family, _ = toy_package()
    names = {p.name for p in coverage.kernel_sources(family)}
    assert "ops.py" in names and "__init__.py" in names
    assert "family.py" not in names and "family_part.py" not in names


def test_triton_kernel_lines_are_measured_and_unreached_ones_listed(toy_package, tmp_path):
    family, module = toy_package()
    row = ops_row(measure(family, module, tmp_path), family)
    kernel_store = line_of(OPS, "tl.store(y + offs")
    negate = line_of(OPS, "v = -v")
    assert row.judged and row.statements > row.reached
    unreached = {(s.first, s.last, s.function) for s in row.unreached}
    body = line_of(OPS, "y = x + 1")
    assert unreached == {(negate, negate, "_double_kernel"), (body, body + 1, "never_called")}
    assert kernel_store not in {line for s in row.unreached for line in range(s.first, s.last + 1)}
    raise_line = line_of(OPS, 'raise MemoryError')
    assert [(s.first, s.last, reason) for s, reason in row.declared] == [
        (raise_line, raise_line, "needs more memory than any test machine")]
    assert row.problems == [f"{row.path}: lines {negate} (_double_kernel) unreached by verification and not "
                            f"declared", f"{row.path}: lines {body}-{body + 1} (never_called) unreached by "
                            f"verification and not declared"]
    assert not row.stale and not row.broken


def test_partial_run_reports_without_verdict(toy_package, tmp_path):
    family, module = toy_package()
    cov = measure(family, module, tmp_path, complete=False)
    row = ops_row(cov, family)
    assert not row.judged and row.unreached and row.problems == [] and cov.problems == []


def test_declared_block_and_stale_declaration(toy_package, tmp_path):
    ops = OPS.replace("    if NEGATE:\n", "    if NEGATE:  # verify: unreached (no route negates)\n")
    ops = ops.replace('    return 3 * x\n', '    return 3 * x  # verify: unreached (wrongly declared)\n')
    ops = ops.replace('def never_called(x):\n', '# verify: unreached (kept for the test of own-line markers)\n'
                                                'def never_called(x):\n')
    family, module = toy_package(ops)
    row = ops_row(measure(family, module, tmp_path), family)
    assert row.unreached == ()
    reasons = {reason for _, reason in row.declared}
    assert reasons == {"no route negates", "needs more memory than any test machine",
                       "kept for the test of own-line markers"}
    triple = line_of(ops, "return 3 * x")
    assert [(s.first, reason) for s, reason in row.stale] == [(triple, "wrongly declared")]
    assert row.problems == [f"{row.path}: lines {triple} (triple) declared unreached (wrongly declared) but reached"]


def test_marker_without_reason_or_statement_is_broken():
    text = textwrap.dedent('''\
        def f(x):
            if x:  # verify: unreached
                return 1
            # verify: unreached (nothing follows)
        ''')
    source = coverage.analyse(text, [2, 3])
    assert source.declarations == ()
    assert [line for line, _ in source.broken] == [2, 4]
    assert "without a reason" in source.broken[0][1] and "no statement" in source.broken[1][1]


def test_a_marker_before_a_decorator_declares_the_function():
    text = textwrap.dedent('''\
        import functools


        # verify: unreached (a decorated function nothing calls)
        @functools.lru_cache()
        def f(x):
            return x
        ''')
    source = coverage.analyse(text, [1, 5, 7])
    assert [(d.first, d.last, d.reason) for d in source.declarations] == [(6, 7, "a decorated function nothing calls")]


def test_else_and_finally_clauses_declare_their_blocks():
    text = textwrap.dedent('''\
        def f(x):
            try:
                if x:
                    y = 1
                else:  # verify: unreached (x is always true)
                    y = 2
                    y += 1
            finally:  # verify: unreached (reason two)
                z = (1 +
                     2)
            return y + z
        ''')
    source = coverage.analyse(text, [2, 3, 4, 6, 7, 9, 11])
    assert [(d.first, d.last, d.reason) for d in source.declarations] == [
        (5, 7, "x is always true"), (8, 10, "reason two")]
    assert source.measured == (2, 3, 4, 6, 7, 9, 11)  # the def line runs at import: not measured


def test_table_and_json(toy_package, tmp_path):
    family, module = toy_package()
    cov = measure(family, module, tmp_path)
    console = Console(width=250, record=True)
    console.print(coverage.table(cov))
    text = console.export_text()
    assert "ops.py" in text and "never_called" in text and "needs more memory" in text
    data = json.loads(json.dumps(cov.as_dict()))
    (row,) = [f for f in data["files"] if f["path"].endswith("ops.py")]
    assert row["judged"] and row["percent"] < 100 and row["declared"][0]["reason"].startswith("needs more")
    assert {s["function"] for s in row["unreached"]} == {"_double_kernel", "never_called"}
    assert cov.for_family(family.name).files == cov.files and cov.for_family("other").files == ()
    page = coverage.markdown(data)
    assert "| file | statements reached |" in page and "(`never_called`)" in page
    assert "(`double`: needs more memory than any test machine)" in page


def test_verify_coverage_reports_a_partial_run_without_verdict(tmp_path):
    from kernel_sentinel.cli import main

    out = tmp_path / "report.json"
    code = main(["verify", "--family", "semicrf", "--route", "semicrf.exact.log", "--dtype", "float64",
                 "--examples", "1", "--device", "cpu", "--coverage", "--json", str(out)])
    assert code == 0
    files = {f["path"]: f for f in json.loads(out.read_text())["coverage"]["files"]}
    exact = files["kernels/semicrf/exact.py"]
    assert not exact["judged"] and 0 < exact["reached"] < exact["statements"]
    assert "kernels/semicrf/family.py" not in files
