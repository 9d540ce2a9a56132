"""``sentinel new`` makes a working family in a kernel author's own repository: generated into a temporary git
repository outside this one, the family is found through ``SENTINEL_FAMILY_PATH`` and ``sentinel routes``,
``verify --quick``, ``trace``, ``trace --check`` and ``gate --no-cpu-verify`` work there, run from that
repository's top level, writing nothing into this repository; wrong usage is exit 2 with what to do."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernel_sentinel import new

REPO = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=sentinel test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]
NAME = "rownorm"
ROUTES = [f"{NAME}.triton.rows", f"{NAME}.torch.rows"]
FILES = {"__init__.py", "call.py", "dispatch.py", "torch_ops.py", f"triton_{NAME}.py", "triton_ops.py", "autograd.py",
         "oracle.py", "family.py", f"test_{NAME}.py"}


def sentinel(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_sentinel", *args], cwd=cwd, env=env or os.environ,
                          capture_output=True, text=True, timeout=900)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(GIT + list(args), cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def author(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A kernel author's git repository with a README, the family made by ``sentinel new NAME kernels_dir`` there
    and committed; the environment that finds it."""
    repo = tmp_path_factory.mktemp("author") / "mykernels"
    (repo / "families").mkdir(parents=True)
    (repo / "README.md").write_text("# my kernels\n")
    git(repo, "init", "-q", "-b", "main")
    done = sentinel(repo, "new", NAME, "families")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"sentinel verify --family {NAME} --quick" in done.stdout  # the next steps are printed
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"the {NAME} family")
    env = {**os.environ, "SENTINEL_FAMILY_PATH": str(repo / "families")}
    env.pop("TRITON_INTERPRET", None)  # sentinel switches the interpreter on itself
    return repo, env


def test_the_family_has_the_layout_files_and_names_its_invariant_test_from_the_repository_root(author):
    repo, _ = author
    package = repo / "families" / NAME
    assert {p.name for p in package.iterdir() if p.is_file()} == FILES
    assert not list(package.rglob("*l2norm*")) and "l2norm" not in "".join(
        p.read_text() for p in package.glob("*.py"))
    assert f'"families/{NAME}/test_{NAME}.py"' in (package / "family.py").read_text()


def test_routes_verify_trace_and_gate_from_the_authors_repository(author):
    repo, env = author
    done = sentinel(repo, "routes", "--family", NAME, "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    (family,) = json.loads(done.stdout)["families"]
    assert [r["id"] for r in family["routes"]] == ROUTES
    assert all(r["where"].startswith(f"families/{NAME}/") for r in family["routes"])

    report = repo.parent / "report.json"
    done = sentinel(repo, "verify", "--family", NAME, "--quick", "--json", str(report), env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(report.read_text())["routes"]
    assert sorted((r["id"], r["dtype"], r["status"]) for r in rows) == sorted(
        (route, dtype, "pass") for route in ROUTES for dtype in ("float32", "float64"))

    done = sentinel(repo, "trace", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"families/{NAME}/dispatch.py" in (repo / "traces" / NAME / "index.md").read_text()
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "traces")
    done = sentinel(repo, "trace", "--check", env=env)
    assert done.returncode == 0, done.stdout + done.stderr

    gate = repo.parent / "gate.json"
    done = sentinel(repo, "gate", "--no-cpu-verify", "--json", str(gate), env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    steps = {(s["name"], s["family"]): s for s in json.loads(gate.read_text())["steps"]}
    assert steps["gpu-record", NAME]["status"] == "fail"
    assert f"no GPU verification record of {NAME}" in steps["gpu-record", NAME]["detail"]
    assert all(s["status"] == "pass" for key, s in steps.items() if key[0] != "gpu-record")
    assert not (REPO / "traces" / NAME).exists()
    assert not list((REPO / "traces" / "verification").glob(f"{NAME}-*"))


def test_a_planted_bug_in_the_generated_kernel_fails_verify(author, tmp_path):
    """The generated family's checks see its kernels: a backward that drops the projection term fails."""
    repo, env = author
    kernel = repo / "families" / NAME / f"triton_{NAME}.py"
    right = kernel.read_text()
    kernel.write_text(right.replace("r * (g - (x * r) * (r * dots))", "r * g", 1))
    assert kernel.read_text() != right
    try:
        done = sentinel(repo, "verify", "--family", NAME, "--route", ROUTES[0], "--dtype", "float64", "--quick",
                        "--json", str(tmp_path / "report.json"), env=env)
    finally:
        kernel.write_text(right)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = json.loads((tmp_path / "report.json").read_text())["routes"]
    assert {"reference", "properties", "guards"} <= {c["name"] for c in row["checks"] if c["status"] != "pass"}


@pytest.mark.parametrize("args, says", [
    (["new", "2fast"], "lower-case Python identifier"),
    (["new", "Norm"], "lower-case Python identifier"),
    (["new", "class"], "lower-case Python identifier"),
    (["new", "torch"], "importable module"),
    (["new", NAME, "missing"], "not a directory"),
])
def test_wrong_usage_is_exit_2_saying_what_to_do(tmp_path, args, says):
    git(tmp_path, "init", "-q")
    done = sentinel(tmp_path, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and "usage error" in done.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / ".git"]


def test_an_existing_non_empty_directory_or_no_git_repository_is_a_usage_error(tmp_path):
    (tmp_path / NAME).mkdir()
    done = sentinel(tmp_path, "new", NAME)
    assert done.returncode == 2 and "not inside a git repository" in done.stderr and "git init" in done.stderr
    git(tmp_path, "init", "-q")
    (tmp_path / NAME / "mine.py").write_text("")
    done = sentinel(tmp_path, "new", NAME)
    assert done.returncode == 2 and "exists and is not empty" in done.stderr
    assert [p.name for p in (tmp_path / NAME).iterdir()] == ["mine.py"]
    (tmp_path / NAME / "mine.py").unlink()
    assert new.scaffold(NAME, tmp_path)  # an empty directory is filled
    assert {p.name for p in (tmp_path / NAME).iterdir()} == FILES


@pytest.mark.slow  # builds a wheel in an isolated build environment
def test_the_templates_are_installed_as_package_data(tmp_path):
    """The template family's files are in the wheel (package data), not only in this checkout."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("kernel_sentinel-*.whl")
    inside = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("kernel_sentinel/templates/")}
    assert inside == {f"kernel_sentinel/templates/{new.PLACEHOLDER}/{f.replace(NAME, new.PLACEHOLDER)}" for f in FILES}
