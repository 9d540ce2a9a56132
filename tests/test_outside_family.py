"""A family in a kernel author's own git repository, outside this one: found through ``--family-path``,
``SENTINEL_FAMILY_PATH`` or an entry point, every command works from that repository's root, its paths resolve
there, traces and records are written there, and nothing is written into this repository. A broken registration
beside it fails alone; a search-path directory that does not exist is a usage error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_layout_plugin_family import FAMILY, GIT, PLUGIN

REPO = Path(__file__).resolve().parents[1]


def sentinel(cwd: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_sentinel", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def commit(repo: Path, message: str) -> None:
    for args in (["add", "-A"], ["commit", "-q", "-m", message]):
        subprocess.run(GIT + args, cwd=repo, check=True, capture_output=True)


@pytest.fixture
def outside(tmp_path: Path) -> tuple[Path, dict]:
    """A git repository with the toy family in ``kernels_of_mine/plugfam`` and its invariant test in ``tests/``;
    the environment runs the installed sentinel on the CPU with no family path."""
    repo = tmp_path / "mine"
    package = repo / "kernels_of_mine" / "plugfam"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN)
    (package / "family.py").write_text(FAMILY)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_plugfam.py").write_text('def test_row_sums():\n    """Row sums equal a Python loop."""\n')
    subprocess.run(GIT + ["init", "-q"], cwd=repo, check=True, capture_output=True)
    commit(repo, "a family of my own")
    env = {k: v for k, v in os.environ.items() if k != "SENTINEL_FAMILY_PATH"}
    return repo, {**env, "TRITON_INTERPRET": "1"}


def this_repository_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True).stdout


def test_every_command_works_from_the_outside_repository_and_writes_only_there(outside):
    repo, env = outside
    before = this_repository_state()
    path = ("--family-path", "kernels_of_mine")

    done = sentinel(repo, env, "routes", "--json", *path)
    assert done.returncode == 0, done.stderr
    assert [f["family"] for f in json.loads(done.stdout)["families"]] == ["plugfam"]  # the repository's own only
    route = json.loads(done.stdout)["families"][0]["routes"][0]
    assert route["where"].startswith("kernels_of_mine/plugfam/family.py:"), route

    done = sentinel(repo, env, "verify", *path, "--record", "--jobs", "1")
    assert done.returncode == 0, done.stdout + done.stderr  # its invariant test is found in its own repository
    record = json.loads((repo / "traces" / "verification" / "plugfam-cpu.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert record["commit"] == head
    assert set(record["sources"]) == {"kernels_of_mine/plugfam/__init__.py", "kernels_of_mine/plugfam/family.py"}

    done = sentinel(repo, env, "trace", *path)
    assert done.returncode == 0, done.stdout + done.stderr
    page = (repo / "traces" / "plugfam" / "index.md").read_text()
    assert "Toy plug-in family" in page and "kernels_of_mine/plugfam/family.py" in page
    assert "tests/test_plugfam.py::test_row_sums" in page
    commit(repo, "traces and record")
    done = sentinel(repo, env, "trace", "--check", *path)
    assert done.returncode == 0, done.stdout + done.stderr
    done = sentinel(repo, env, "gate", "--no-cpu-verify", *path)
    assert done.returncode == 0, done.stdout + done.stderr

    (repo / "kernels_of_mine" / "plugfam" / "family.py").write_text(FAMILY + "\n# edited\n")
    done = sentinel(repo, env, "trace", "--check", *path)
    assert done.returncode == 1 and "kernels_of_mine/plugfam/family.py" in done.stdout  # stale, named
    assert this_repository_state() == before


def test_the_variable_leaves_this_repository_traces_alone(outside):
    repo, env = outside
    done = sentinel(REPO, {**env, "SENTINEL_FAMILY_PATH": str(repo / "kernels_of_mine")}, "routes", "--json")
    assert done.returncode == 0, done.stderr
    assert [f["family"] for f in json.loads(done.stdout)["families"]] == ["segment", "semicrf", "sinkhorn"]
    done = sentinel(REPO, {**env, "SENTINEL_FAMILY_PATH": str(repo / "kernels_of_mine")}, "routes", "--json",
                    "--family", "plugfam")
    assert done.returncode == 0 and json.loads(done.stdout)["families"][0]["family"] == "plugfam"


def test_a_broken_registration_fails_alone(outside):
    repo, env = outside
    broken = repo / "kernels_of_mine" / "broken"
    broken.mkdir()
    (broken / "__init__.py").write_text('"""A family whose registration does not import."""\n')
    (broken / "family.py").write_text("import no_such_module_anywhere\n")
    env = {**env, "SENTINEL_FAMILY_PATH": str(repo / "kernels_of_mine")}

    done = sentinel(repo, env, "routes", "--family", "plugfam")
    assert done.returncode == 0, done.stderr
    done = sentinel(REPO, env, "routes", "--family", "sinkhorn")
    assert done.returncode == 0, done.stderr
    done = sentinel(repo, env, "verify", "--quick", "--dtype", "float32", "--json", str(repo.parent / "r.json"))
    assert done.returncode == 1
    report = json.loads((repo.parent / "r.json").read_text())
    assert {r["id"] for r in report["routes"]} == {"plugfam.infer", "plugfam.train"}
    assert all(r["status"] == "pass" for r in report["routes"])  # the healthy family ran, and passed
    assert any("broken" in p and "no_such_module_anywhere" in p for p in report["problems"]), report["problems"]
    done = sentinel(repo, env, "mutate", "--family", "broken", "-n", "1")  # named: never dropped silently
    assert done.returncode == 1 and "no_such_module_anywhere" in done.stderr, done.stderr


def test_a_search_path_that_does_not_exist_is_a_usage_error(outside):
    repo, env = outside
    done = sentinel(repo, env, "routes", "--family-path", "no/such/dir")
    assert done.returncode == 2
    assert "no/such/dir" in done.stderr and "not a directory" in done.stderr
    done = sentinel(repo, {**env, "SENTINEL_FAMILY_PATH": str(repo / "nowhere")}, "verify", "--quick")
    assert done.returncode == 2 and "nowhere" in done.stderr


def test_an_installed_package_is_found_by_its_entry_point(outside, tmp_path):
    repo, env = outside
    dist = tmp_path / "site" / "plugfam_kernels-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugfam-kernels\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[kernel_sentinel.families]\nplugfam = plugfam.family\n")
    pythonpath = os.pathsep.join([str(tmp_path / "site"), str(repo / "kernels_of_mine"), env.get("PYTHONPATH", "")])
    done = sentinel(repo, {**env, "PYTHONPATH": pythonpath}, "routes", "--json")
    assert done.returncode == 0, done.stderr
    assert [f["family"] for f in json.loads(done.stdout)["families"]] == ["plugfam"]
