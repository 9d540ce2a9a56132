"""``pytest --sentinel`` (the plug-in :mod:`kernel_sentinel.pytest_plugin`) collects each (route, dtype, check) of
sentinel's verification as a test item, and its results and exit codes agree with ``sentinel verify`` on the same
selection, for a passing family and for one with a planted bug, in a kernel author's own repository."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from kernel_sentinel.rows import CHECKS
from test_layout_plugin_family import FAMILY, GIT, PLUGIN

REPO = Path(__file__).resolve().parents[1]
# the installed package registers the plug-in through its pytest11 entry point; a checkout imported without
# installing (no entry point) names it
INSTALLED = any(ep.value == "kernel_sentinel.pytest_plugin" for ep in entry_points(group="pytest11"))
LOAD_PLUGIN = () if INSTALLED else ("-p", "kernel_sentinel.pytest_plugin")
# the planted bug: the training route adds 1e-3 to every row sum
BUGGY = FAMILY.replace("plugfam", "plugbug").replace(
    'Route("plugbug.train", row_sum)', 'Route("plugbug.train", lambda x: row_sum(x) + 1e-3)')


@pytest.fixture
def kernel_repo(tmp_path: Path) -> tuple[Path, dict]:
    repo = tmp_path / "mine"
    for name, source in (("plugfam", FAMILY), ("plugbug", BUGGY)):
        (repo / "fams" / name).mkdir(parents=True)
        (repo / "fams" / name / "__init__.py").write_text(PLUGIN)
        (repo / "fams" / name / "family.py").write_text(source.replace(f"tests/test_{name}.py", "tests/test_rows.py"))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_rows.py").write_text('def test_row_sums():\n    """Row sums equal a Python loop."""\n')
    subprocess.run(GIT + ["init", "-q"], cwd=repo, check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "SENTINEL_FAMILY_PATH"}
    return repo, {**env, "SENTINEL_FAMILY_PATH": str(repo / "fams"), "TRITON_INTERPRET": "1"}


def sentinel_statuses(repo: Path, env: dict, family: str) -> tuple[int, dict]:
    report = repo.parent / f"{family}.json"
    done = subprocess.run([sys.executable, "-m", "kernel_sentinel", "verify", "--family", family, "--quick",
                           "--dtype", "float32", "--jobs", "1", "--json", str(report)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    rows = json.loads(report.read_text())["routes"]
    return done.returncode, {f"{r['id']}:{r['dtype']}:{c['name']}": c["status"] for r in rows for c in r["checks"]}


def pytest_statuses(repo: Path, env: dict, family: str, *more: str) -> tuple[int, dict]:
    junit = repo.parent / f"{family}.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", *LOAD_PLUGIN, "-p", "no:cacheprovider", "--sentinel", "--sentinel-family", family, "--sentinel-quick",
                           "--sentinel-dtype", "float32", "--junitxml", str(junit), "-q", *more, "tests"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    statuses = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.get("classname", "").startswith(f"sentinel:{family}"):
            failed = case.find("failure") is not None or case.find("error") is not None
            # pytest-xdist's loadgroup appends "@group" to a grouped item's id (under pytest < 9.2): not our name
            statuses[case.get("name").partition("@sentinel-")[0]] = "fail" if failed else "pass"
    return done.returncode, statuses


@pytest.mark.parametrize("family, code", [("plugfam", 0), ("plugbug", 1)])
def test_pytest_items_agree_with_sentinel_verify(kernel_repo, family, code):
    repo, env = kernel_repo
    verify_code, verified = sentinel_statuses(repo, env, family)
    pytest_code, tested = pytest_statuses(repo, env, family)
    assert verify_code == pytest_code == code
    assert tested.pop("registration") == "pass"
    assert tested == verified and len(verified) == 2 * len(CHECKS)  # every check of both routes, as verify ran it
    if code:
        assert verified["plugbug.train:float32:reference"] == "fail"


def test_pytest_selects_items_with_k_and_stops_with_x(kernel_repo):
    repo, env = kernel_repo
    code, tested = pytest_statuses(repo, env, "plugbug", "-k", "reference or exact")
    assert set(tested) == {f"plugbug.{r}:float32:{c}" for r in ("infer", "train") for c in ("reference", "exact")}
    assert code == 1 and tested["plugbug.infer:float32:reference"] == "pass"
    assert tested["plugbug.train:float32:reference"] == "fail"


def test_pytest_xdist_runs_the_items_in_workers(kernel_repo):
    repo, env = kernel_repo
    code, tested = pytest_statuses(repo, env, "plugbug", "-n", "2", "--dist", "loadgroup", "-k", "reference")
    assert code == 1
    assert tested == {"plugbug.infer:float32:reference": "pass", "plugbug.train:float32:reference": "fail"}


def test_the_plugin_is_registered_by_its_entry_point():
    """Installing kernel-sentinel registers the plug-in with pytest (entry point group ``pytest11``), so a kernel
    repository's ``pytest --sentinel`` needs no ``-p``."""
    text = (REPO / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\nsentinel = "kernel_sentinel.pytest_plugin"\n' in text
