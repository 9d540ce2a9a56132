"""A new family registers without any edit under sentinel/: a toy family written into a temporary directory (in a
git copy of the working tree, outside ``kernels/`` and ``sentinel/``) is found through ``SENTINEL_FAMILY_PATH``,
and ``sentinel routes``, ``verify`` and ``trace`` handle it. Only the toy and semi-CRF families are kept in the copy
(the other families are removed there), so the trace run depends on nothing else in progress."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernel_sentinel import layout

REPO = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=sentinel test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]
IGNORE = shutil.ignore_patterns(".git", "__pycache__", ".hypothesis", ".pytest_cache", "build", "site", ".venv",
                                "*.egg-info", "verification", "benchmarks")

PLUGIN = '''\
"""Toy plug-in family: row sums of x (N, D); differentiable."""
'''

FAMILY = '''\
import torch

from provable_kernels import validate
from provable_kernels.dispatch import Branch, Condition, Route, Tree


def ask_grad(x):
    """``train`` when x requires grad, else ``infer``."""
    return "train" if x.requires_grad else "infer"


def row_sum(x):
    """Row sums in float64, cast back."""
    return x.double().sum(-1).to(x.dtype)


TREE = Tree("plugfam", Branch(Condition("grad", ask_grad, ("infer", "train")),
                              {"infer": Route("plugfam.infer", row_sum), "train": Route("plugfam.train", row_sum)}))


def plug_sum(x):
    """Sum of each row of ``x`` (N, D)."""
    validate.tensor("x", x, ndim=2, dtypes=validate.FLOAT_DTYPES)
    validate.finite("x", x)
    return TREE.dispatch(x)


ENTRY_POINTS = {"plug_sum": plug_sum}
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}
SIZES = {"small": dict(n=6), "tiny": dict(n=2)}


def case(route_id, p, gen, device):
    train = TREE.path_to(route_id)["grad"] == "train"
    upstream = {"value": torch.randn(3, generator=gen, dtype=torch.float64)} if train else {}
    return "plug_sum", {"x": torch.randn(3, p.n, generator=gen, dtype=torch.float64)}, upstream


def reference(kw, case):
    return {"value": kw["x"].sum(-1)}


def loop(kw, case):
    return {"value": torch.tensor([sum(r) for r in kw["x"].tolist()], dtype=torch.float64)}


def example(pick):
    return dict(n=pick(range(1, 10)))


ORACLES = (("python loop", "tiny", loop),)
AGREEMENTS = (("python loop", "plugfam.*", loop),)
FINITE_DIFFERENCES = "plugfam.train"
ADVERSARIAL = (("NaN input", {"x": lambda x: x * float("nan")}, None, {"errors_ok": True}),
               ("huge", {"x": lambda x: x * 1e30}, None, {"allow_inf": ("value",)}))
STANDARD_BAD_INPUTS = dict(tensors=("x",), rejects_nan=("x",), rejects_inf=("x",))
INVARIANTS = ("tests/test_plugfam.py::test_row_sums",)
BATCH_ITEMS = (("a row", "plugfam.*", {"x": 0, "value": 0, "grad_x": 0}),)
'''


def run_cli(repo: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_sentinel", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def plugin_repo(tmp_path: Path) -> tuple[Path, dict]:
    """A git copy of the working tree with only the semi-CRF family, plus the toy family in ``plugins/``."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=IGNORE)
    for other in (repo / "kernels").iterdir():
        if other.is_dir() and (other / "family.py").is_file() and other.name != "semicrf":
            shutil.rmtree(other)
    (repo / "traces" / "verification").mkdir(parents=True, exist_ok=True)
    plugin = repo / "plugins" / "plugfam"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(PLUGIN)
    (plugin / "family.py").write_text(FAMILY)
    (repo / "tests" / "test_plugfam.py").write_text('def test_row_sums():\n    """Row sums equal a Python loop."""\n')
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy with a plug-in family"]):
        subprocess.run(GIT + args, cwd=repo, check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(layout.import_root(repo, tmp_path / "import")),
           "SENTINEL_FAMILY_PATH": str(repo / "plugins"), "TRITON_INTERPRET": "1"}
    return repo, env


def test_plugin_family_routes_verify_and_trace_with_no_edit_under_sentinel(plugin_repo):
    repo, env = plugin_repo
    done = run_cli(repo, env, "routes", "--family", "plugfam", "--json")
    assert done.returncode == 0, done.stderr
    (family,) = json.loads(done.stdout)["families"]
    assert [r["id"] for r in family["routes"]] == ["plugfam.infer", "plugfam.train"]

    done = run_cli(repo, env, "verify", "--family", "plugfam", "--device", "cpu", "--examples", "3",
                   "--json", str(repo.parent / "report.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((repo.parent / "report.json").read_text())["routes"]
    assert sorted((r["id"], r["dtype"], r["status"]) for r in rows) == [
        (route, dtype, "pass") for route in ("plugfam.infer", "plugfam.train") for dtype in ("float32", "float64")]

    done = run_cli(repo, env, "trace")
    assert done.returncode == 0, done.stdout + done.stderr
    page = (repo / "traces" / "plugfam" / "index.md").read_text()
    assert "Toy plug-in family" in page and "plugins/plugfam/family.py" in page
    assert "[plugfam](plugfam/index.md)" in (repo / "traces" / "index.md").read_text()
    subprocess.run(GIT + ["add", "-A"], cwd=repo, check=True, capture_output=True)
    subprocess.run(GIT + ["commit", "-q", "-m", "traces"], cwd=repo, check=True, capture_output=True)
    done = run_cli(repo, env, "trace", "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert subprocess.run(["git", "status", "--short", "--", "sentinel"], cwd=repo, capture_output=True,
                          text=True).stdout == ""
