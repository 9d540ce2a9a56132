"""Triton code that the interpreter runs but a GPU compiler refuses.

The CPU interpreter (tests, CI) executes ``@triton.jit`` functions as Python, so it accepts module-level globals of
any kind; the compiler on a GPU (Triton 3.6) only accepts globals made with ``tl.constexpr(...)`` and fails at the
first launch. This test reads every ``kernels/*/triton_*.py`` with ``ast`` and flags a plain numeric global used
inside a jitted function.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNEL_FILES = sorted(Path(__file__).resolve().parents[1].glob("kernels/**/triton_*.py"))


def jitted(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        "jit" in ast.unparse(d) for d in node.decorator_list)


def plain_numeric_globals(tree: ast.Module) -> set[str]:
    """Module-level names bound to a number literal (not ``tl.constexpr(...)``)."""
    found = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Constant, ast.UnaryOp)):
            value = stmt.value.operand if isinstance(stmt.value, ast.UnaryOp) else stmt.value
            if isinstance(value, ast.Constant) and isinstance(value.value, (int, float)):
                found.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return found


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_jitted_code_uses_only_constexpr_globals(path: Path):
    tree = ast.parse(path.read_text())
    plain = plain_numeric_globals(tree)
    used = {(fn.name, n.id) for fn in tree.body if jitted(fn)
            for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in plain}
    assert not used, f"{path.name}: globals used in @triton.jit code must be tl.constexpr(...): {sorted(used)}"


def test_the_check_catches_a_plain_global():
    tree = ast.parse("import triton\nLIMIT = -1e5\n@triton.jit\ndef k(x):\n    return x + LIMIT\n")
    assert plain_numeric_globals(tree) == {"LIMIT"}
    assert any(jitted(fn) for fn in tree.body)
