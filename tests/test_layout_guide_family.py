"""The recipe of the guide page "Adding a kernel family" (``traces/guide/adding-a-family.md``) runs as written: its
code blocks titled with a path, written into a scratch copy of the repository (``kernels/`` and ``sentinel/`` of the
working tree), make a family that sentinel discovers and ``sentinel verify`` passes, and a planted bug in its
Triton kernel fails it."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_sentinel import layout
from test_layout_imports import upward_imports

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "traces" / "guide" / "adding-a-family.md"
BLOCK = re.compile(r'^```python title="([^"]+)"\n(.*?)^```$', re.S | re.M)
GIT = ["git", "-c", "user.name=sentinel test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]
ROUTES = ["softplus.triton.elementwise", "softplus.torch.logaddexp"]


def guide_files() -> dict[str, str]:
    """The guide's code blocks by the path in their title."""
    return dict(BLOCK.findall(GUIDE.read_text()))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A git repository with the working tree's ``kernels/`` and ``sentinel/`` and the guide's files; the
    environment that imports from it (the Triton interpreter on)."""
    repo = tmp_path_factory.mktemp("guide") / "repo"
    for folder in layout.IMPORT_NAMES:
        shutil.copytree(REPO / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in guide_files().items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the guide's family"]):
        subprocess.run(GIT + args, cwd=repo, check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(layout.import_root(repo, repo.parent / "import")), "TRITON_INTERPRET": "1"}
    return repo, env


def sentinel(scratch: tuple[Path, dict], *args: str) -> subprocess.CompletedProcess:
    repo, env = scratch
    return subprocess.run([sys.executable, "-m", "kernel_sentinel", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=900)


def test_the_guide_holds_a_whole_family_that_imports_no_sentinel(scratch):
    assert set(guide_files()) == {f"kernels/softplus/{name}.py" for name in (
        "__init__", "call", "triton_softplus", "triton_ops", "autograd", "torch_ops", "dispatch", "oracle", "family")
    } | {"tests/test_softplus.py"}
    assert upward_imports(scratch[0]) == []
    done = sentinel(scratch, "routes", "--family", "softplus", "--json")
    assert done.returncode == 0, done.stderr
    (family,) = json.loads(done.stdout)["families"]
    assert [r["id"] for r in family["routes"]] == ROUTES


def test_the_guide_family_passes_verify_and_a_planted_bug_fails(scratch):
    repo = scratch[0]
    report = repo.parent / "report.json"
    done = sentinel(scratch, "verify", "--family", "softplus", "--quick", "--json", str(report))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(report.read_text())["routes"]
    assert sorted((r["id"], r["dtype"], r["status"]) for r in rows) == sorted(
        (route, dtype, "pass") for route in ROUTES for dtype in ("float32", "float64"))

    kernel = repo / "kernels" / "softplus" / "triton_softplus.py"
    right = kernel.read_text()
    kernel.write_text(right.replace("tl.log(1.0 + tl.exp(-tl.abs(x)))", "tl.log(1.0 + tl.exp(-x))", 1))
    assert kernel.read_text() != right
    try:
        done = sentinel(scratch, "verify", "--family", "softplus", "--route", ROUTES[0], "--dtype", "float64",
                        "--quick", "--json", str(report))
    finally:
        kernel.write_text(right)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = json.loads(report.read_text())["routes"]
    failed = {c["name"] for c in row["checks"] if c["status"] != "pass"}
    assert {"reference", "exact", "properties"} <= failed
