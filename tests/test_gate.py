"""``sentinel gate`` on a temporary git repository, plus its pure helpers in this process.

The temporary repository holds a copy of the project's ``sentinel/``, the shared ``kernels/*.py`` modules,
``pyproject.toml`` and ``.gitignore``, a README, and two toy families ``kernels/toya`` and ``kernels/toyb`` (one
template: a two-route tree, a trivial ``@triton.jit`` kernel so that the gate demands a GPU record, fast
checks). Fake-but-valid CUDA records of the toys (current blob ids, every route passed) are written with
:mod:`kernel_sentinel.records`, the traces generated, and everything committed on ``main``. Each scenario clones that
repository, makes one change and runs ``python -m kernel_sentinel gate`` there with ``PYTHONPATH`` set to the clone, so
that sentinel's ``REPO_ROOT`` is the clone (checked by every helper run).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kernel_sentinel import gate, layout
from kernel_sentinel.cli import main
from kernel_sentinel.family import REPO_ROOT

TOY_PACKAGE = {
    "__init__.py": '''"""Toy family TOY: row sums of ``x`` (R, D), for testing ``sentinel gate``."""
''',
    "dispatch.py": '''"""Dispatch of ``row_sum``: a fast and a slow route."""
from __future__ import annotations

import torch

from provable_kernels import validate
from provable_kernels.dispatch import Branch, Condition, Route, Tree


def ask_speed(call: dict) -> str:
    """``fast`` when the caller asks for it, else ``slow``."""
    return "fast" if call["fast"] else "slow"


def sum_fast(call: dict) -> torch.Tensor:
    """Row sums in the input dtype."""
    return call["x"].sum(-1)


def sum_slow(call: dict) -> torch.Tensor:
    """Row sums accumulated in float64."""
    return call["x"].double().sum(-1).to(call["x"].dtype)


TREE = Tree("row_sum", Branch(Condition("speed", ask_speed, ("fast", "slow")),
                              {"fast": Route("TOY.fast", sum_fast), "slow": Route("TOY.slow", sum_slow)}))


def row_sum(x: torch.Tensor, fast: bool = False) -> torch.Tensor:
    """Sum of each row of ``x`` (R, D)."""
    validate.tensor("x", x, ndim=2, dtypes=validate.FLOAT_DTYPES)
    if not isinstance(fast, bool):
        raise TypeError(f"fast must be a bool, got {type(fast).__name__}")
    return TREE.dispatch({"x": x, "fast": fast})
''',
    "triton_kernel.py": '''"""A trivial Triton kernel: it makes TOY a family with Triton kernels."""
import triton
import triton.language as tl


@triton.jit
def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst + offsets, tl.load(src + offsets, mask=mask), mask=mask)
''',
    "family.py": '''"""Registration of the toy family TOY for verification."""
import torch

from provable_kernels.TOY.dispatch import TREE, row_sum

ENTRY_POINTS = {"row_sum": row_sum}
TOLERANCES = {torch.float32: (1e-5, 1e-5)}
SIZES = {"small": dict(n=5), "tiny": dict(n=3)}


def case(route_id, p, gen, device):
    fast = TREE.path_to(route_id)["speed"] == "fast"
    return "row_sum", {"x": torch.randn(2, p.n, generator=gen, dtype=torch.float64), "fast": fast}, {}


def reference(kw, case):
    return {"value": kw["x"].sum(-1)}


def loop_sum(kw, case):
    return {"value": torch.tensor([sum(row) for row in kw["x"].tolist()], dtype=torch.float64)}


def example(pick):
    return dict(n=pick(range(1, 5)))


def sum_of_ones(check, case):
    n = case.problem.n
    ones = case.with_kwargs(f"x ones (2, {n})", x=torch.ones(2, n, device=case.device))
    check.close("sum of ones", check.run(ones)["value"], torch.full((2,), float(n)))


ORACLES = (("python loop", "tiny", loop_sum),)
PROPERTIES = (("sum of ones is the row length", "TOY.*", sum_of_ones),)
ADVERSARIAL = (("huge values", {"x": lambda x: x * 1e30}),)
BAD_INPUTS = (("x", "1-D", lambda c: c.kwargs["x"][0]),)
BATCH_ITEMS = (("a row", "TOY.*", {"x": 0, "value": 0}),)
''',
}
TOYS = ("toya", "toyb")

# Run in the temporary repository: print sentinel's REPO_ROOT, write a passing CUDA record of each family named
# after the first argument, then regenerate the traces when the first argument is "trace".
REFRESH = """
import sys
from kernel_sentinel import records, registry
from kernel_sentinel.cli import main
from kernel_sentinel.family import REPO_ROOT

print(REPO_ROOT)
names = sys.argv[2:]
for family in registry.select(names) if names else []:
    passed = (records.CheckResult("route", True, "fake record for the gate tests", "-"),)
    routes = [records.RouteResult(route.id, family.name, passed) for route in family.tree.routes()]
    records.save_record(records.make_record(family, {"type": "cuda", "name": "Fake GPU"}, routes))
sys.exit(main(["trace"]) if sys.argv[1] == "trace" else 0)
"""
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "gate test", "GIT_AUTHOR_EMAIL": "gate@test", "GIT_COMMITTER_NAME": "gate test",
                "GIT_COMMITTER_EMAIL": "gate@test"}


def environment(repo: Path) -> dict[str, str]:
    """Imports resolve to ``repo`` (its ``sentinel`` and ``kernels`` folders); wide consoles so messages stay on a
    line."""
    root = layout.import_root(repo, repo.parent / f"{repo.name}-import")
    return {**os.environ, **GIT_IDENTITY, "PYTHONPATH": str(root), "COLUMNS": "400"}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "commit.gpgsign=false", *args], cwd=repo, env=environment(repo),
                          capture_output=True, text=True, check=True)
    return done.stdout


def python(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=repo, env=environment(repo), capture_output=True, text=True)


def refresh(repo: Path, trace: bool, *families: str) -> None:
    """Write fake CUDA records of ``families`` and, when ``trace``, run ``sentinel trace``, inside ``repo``."""
    done = python(repo, "-c", REFRESH, "trace" if trace else "records", *families)
    assert done.returncode == 0, done.stdout + done.stderr
    assert Path(done.stdout.splitlines()[0]) == repo.resolve()  # kernel_sentinel.family.REPO_ROOT is the temporary repo


def run_gate(repo: Path, *args: str) -> tuple[int, dict, subprocess.CompletedProcess]:
    """``python -m kernel_sentinel gate ARGS --json`` in ``repo``: exit code, JSON result, the finished process."""
    result = repo.parent / f"{repo.name}-gate.json"
    done = python(repo, "-m", "kernel_sentinel", "gate", *args, "--json", str(result))
    return done.returncode, json.loads(result.read_text()), done


def steps(result: dict) -> dict[tuple[str, str], dict]:
    return {(s["name"], s["family"]): s for s in result["steps"]}


def edit(repo: Path, path: str, old: str, new: str) -> None:
    file = repo / path
    text = file.read_text()
    assert old in text
    file.write_text(text.replace(old, new, 1))


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed temporary repository (branch ``main``): project copy, toy families, records, traces."""
    repo = tmp_path_factory.mktemp("gate") / "origin"
    project = [*sorted((REPO_ROOT / "sentinel").rglob("*.py")), *sorted((REPO_ROOT / "kernels").glob("*.py")),
               REPO_ROOT / "pyproject.toml", REPO_ROOT / ".gitignore"]
    for source in project:
        target = repo / source.relative_to(REPO_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    (repo / "README.md").write_text("# Toy copy of kernel-sentinel\n")
    for toy in TOYS:
        for name, text in TOY_PACKAGE.items():
            (repo / "kernels" / toy).mkdir(exist_ok=True)
            (repo / "kernels" / toy / name).write_text(text.replace("TOY", toy))
    git(repo, "init", "-q", "-b", "main")
    refresh(repo, True, *TOYS)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "toy families, GPU records, traces")
    return repo


@pytest.fixture
def clone(origin: Path, tmp_path: Path) -> Path:
    """A fresh clone of ``origin`` (its ``main`` is ``origin/main``) to change in one scenario."""
    repo = tmp_path / "repo"
    git(origin, "clone", "-q", str(origin), str(repo))
    return repo


def test_kernel_change_without_fresh_gpu_record_fails(clone: Path) -> None:
    """A committed change to a Triton kernel, traces regenerated, GPU record not: the gpu-record step fails,
    naming the file and what to do; verification runs for that family only."""
    edit(clone, "kernels/toya/triton_kernel.py", "mask = offsets < n", "mask = n > offsets")
    refresh(clone, True)
    git(clone, "commit", "-q", "-am", "toya: rewrite the mask")
    junit = clone.parent / "gate.xml"
    code, result, done = run_gate(clone, "--base", "origin/main", "--junit", str(junit))
    assert code == 1, done.stdout + done.stderr
    # the home page's status matrix marks toya's rows stale too, so it is regenerated with the family's traces
    assert result["changed"] == ["kernels/toya/triton_kernel.py", "traces/index.md", "traces/toya/fast.md",
                                 "traces/toya/index.md", "traces/toya/slow.md"]
    assert result["affected"] == {"toya": ["kernels/toya/triton_kernel.py"]}
    by_step = steps(result)
    assert set(by_step) == {("verify-cpu", "toya"), ("gpu-record", "toya"), ("trace-check", "*")}
    failed = [key for key, s in by_step.items() if s["status"] == "fail"]
    assert failed == [("gpu-record", "toya")]
    assert by_step["gpu-record", "toya"]["detail"] == (
        "kernels/toya/triton_kernel.py has changed since the last GPU verification on Fake GPU: "
        "run `sentinel verify --device cuda --record` on a GPU, then `sentinel trace`, and commit both")
    assert "kernels/toya/triton_kernel.py has changed since the last GPU verification" in done.stdout
    cases = ET.parse(junit).getroot().iter("testcase")
    assert {(c.get("classname"), c.get("name")): c.find("failure") is not None for c in cases} == {
        ("gate.toya", "verify-cpu"): False, ("gate.toya", "gpu-record"): True, ("gate.*", "trace-check"): False}


def test_stale_trace_fails(clone: Path) -> None:
    """A source change with a fresh GPU record but traces not regenerated: only the trace check fails."""
    edit(clone, "kernels/toya/dispatch.py", "Row sums in the input dtype.", "Row sums, in the input dtype.")
    refresh(clone, False, "toya")
    code, result, done = run_gate(clone, "--base", "HEAD")
    assert code == 1, done.stdout + done.stderr
    by_step = steps(result)
    assert [key for key, s in by_step.items() if s["status"] == "fail"] == [("trace-check", "*")]
    assert ("verify-cpu", "toya") in by_step and ("verify-cpu", "toyb") not in by_step
    headline, _, diff = by_step["trace-check", "*"]["detail"].partition("\n")
    assert headline.startswith("traces out of date: traces/index.md (stale), traces/toya/")  # home page matrix
    assert "traces/toya/index.md (stale)" in headline
    assert headline.endswith("run `sentinel trace` and commit the result")
    assert "-| `toya.fast` |" in diff and "+| `toya.fast` |" in diff and "Row sums, in the input dtype." in diff


def test_docs_only_change_passes_without_verification(clone: Path) -> None:
    """A README change affects no family: the gate checks the traces and runs no verification."""
    (clone / "README.md").write_text("# Toy copy of kernel-sentinel\n\nMore words.\n")
    (clone / "NOTES.md").write_text("untracked notes\n")
    code, result, done = run_gate(clone, "--base", "HEAD")
    assert code == 0, done.stdout + done.stderr
    assert result["changed"] == ["NOTES.md", "README.md"]
    assert result["affected"] == {}
    assert [(s["name"], s["status"]) for s in result["steps"]] == [("trace-check", "pass")]
    assert "affected families: none (verification not needed)" in done.stderr


def test_change_to_one_family_verifies_only_that_family(clone: Path) -> None:
    """A toyb change with its GPU record and traces refreshed: toyb is verified and passes; toya is untouched."""
    edit(clone, "kernels/toyb/dispatch.py", "Row sums accumulated in float64.", "Row sums, accumulated in float64.")
    refresh(clone, True, "toyb")
    code, result, done = run_gate(clone, "--base", "HEAD")
    assert code == 0, done.stdout + done.stderr
    assert result["affected"] == {"toyb": ["kernels/toyb/dispatch.py"]}
    assert [(s["name"], s["family"], s["status"]) for s in result["steps"]] == [
        ("verify-cpu", "toyb", "pass"), ("gpu-record", "toyb", "pass"), ("trace-check", "*", "pass")]
    assert steps(result)["verify-cpu", "toyb"]["detail"] == "2 routes passed on the CPU"


def test_without_base_every_family_is_checked_and_a_missing_record_fails(clone: Path) -> None:
    """No ``--base``: both families are verified; toya, whose GPU record is gone (traces regenerated), fails
    with the no-record message."""
    (clone / "traces/verification/toya-cuda-fake-gpu.json").unlink()
    refresh(clone, True)
    code, result, done = run_gate(clone)
    assert code == 1, done.stdout + done.stderr
    assert result["affected"] == {"toya": ["no --base: every family"], "toyb": ["no --base: every family"]}
    by_step = steps(result)
    assert {key: s["status"] for key, s in by_step.items()} == {
        ("verify-cpu", "toya"): "pass", ("gpu-record", "toya"): "fail", ("verify-cpu", "toyb"): "pass",
        ("gpu-record", "toyb"): "pass", ("trace-check", "*"): "pass"}
    assert by_step["gpu-record", "toya"]["detail"] == (
        "no GPU verification record of toya in traces/verification/: its Triton kernels "
        "(kernels/toya/triton_kernel.py) ran only under the CPU interpreter here; "
        "run `sentinel verify --device cuda --record` on a GPU, then `sentinel trace`, and commit both")
    assert "gate failed: 4/5 steps passed" in done.stdout


def test_no_cpu_verify_checks_records_and_traces_only(clone: Path) -> None:
    """``--no-cpu-verify`` (CI after its own full ``sentinel verify``): no verify step, the missing GPU record of
    toya still fails the gate."""
    (clone / "traces/verification/toya-cuda-fake-gpu.json").unlink()
    refresh(clone, True)
    code, result, done = run_gate(clone, "--no-cpu-verify")
    assert code == 1, done.stdout + done.stderr
    assert {key: s["status"] for key, s in steps(result).items()} == {
        ("gpu-record", "toya"): "fail", ("gpu-record", "toyb"): "pass", ("trace-check", "*"): "pass"}
    assert "gate failed: 2/3 steps passed" in done.stdout


def test_unknown_base_is_a_usage_error() -> None:
    assert main(["gate", "--base", "no-such-ref-anywhere"]) == 2


@pytest.mark.parametrize("path, affects", [
    ("kernels/dispatch.py", True),           # a shared source of every family
    ("kernels/removed_helper.py", True),     # a .py file where its sources live: added or deleted
    ("sentinel/verify.py", True),            # sentinel itself
    ("pyproject.toml", True),
    ("kernels/semicrf/dispatch.py", False),  # another family's package
    ("kernels/notes.md", False),
    ("README.md", False),
    ("traces/index.md", False),
])
def test_affected_maps_files_through_the_family(toy_family, path: str, affects: bool) -> None:
    """The conftest toy family's package is ``kernels`` itself: its sources are ``kernels/*.py``."""
    assert gate.affected(toy_family(), ["README.md", path]) == ([path] if affects else [])


RECORD_SOURCES = {"kernels/dispatch.py": "1111", "kernels/validate.py": "2222"}


def record(sources: dict[str, str], routes: dict[str, str]) -> dict:
    return {"device": {"type": "cuda", "name": "Big GPU"}, "sources": sources,
            "routes": [{"id": route_id, "status": status} for route_id, status in routes.items()]}


@pytest.mark.parametrize("sources, routes, problem", [
    (RECORD_SOURCES, {"toy.fast": "pass", "toy.slow": "pass"}, None),
    ({**RECORD_SOURCES, "kernels/validate.py": "3333"}, {"toy.fast": "pass", "toy.slow": "pass"},
     "kernels/validate.py has changed since the last GPU verification on Big GPU: run"),
    ({"kernels/dispatch.py": "1111", "kernels/gone.py": "4444"}, {"toy.fast": "pass", "toy.slow": "pass"},
     "kernels/gone.py, kernels/validate.py have changed since the last GPU verification on Big GPU: run"),
    (RECORD_SOURCES, {"toy.fast": "pass"}, "the GPU record from Big GPU lacks routes toy.slow: run"),
    (RECORD_SOURCES, {"toy.fast": "fail", "toy.slow": "pass"}, "routes toy.fast failed on Big GPU: fix them, then run"),
])
def test_record_problem_says_what_is_wrong(toy_family, sources, routes, problem) -> None:
    found = gate.record_problem(toy_family(), record(sources, routes), RECORD_SOURCES)
    if problem is None:
        assert found is None
    else:
        assert found.startswith(problem) and found.endswith(gate.RECORD_HINT)


def model_record(name: str, gpus: int, sources: dict[str, str], devices_detail: str) -> dict:
    """A passing record of the conftest toy family from ``gpus`` GPUs of model ``name``."""
    check = {"name": "devices", "status": "pass", "detail": devices_detail}
    return {"family": "toy", "device": {"type": "cuda", "name": name, "gpus": [name] * gpus}, "commit": "c" * 40,
            "sources": sources, "routes": [{"id": route_id, "dtype": "float32", "status": "pass", "checks": [check]}
                                           for route_id in ("toy.fast", "toy.slow")]}


def test_gpu_record_step_says_of_each_models_record_whether_it_is_current(toy_family, monkeypatch) -> None:
    """Any current passing record passes the step (one with cross-device evidence preferred); the detail has a line
    per GPU model; a record made on one GPU holds no cross-device evidence and says so."""
    monkeypatch.setattr(gate.records, "blob_ids", lambda paths: RECORD_SOURCES)
    h100 = model_record("H100", 4, RECORD_SOURCES, "every input on another GPU than the current one: ...")
    h200 = model_record("H200", 1, {**RECORD_SOURCES, "kernels/validate.py": "3333"}, "not applicable: 1 GPU")
    monkeypatch.setattr(gate.records, "load_records", lambda: [h200, h100])
    step = gate.gpu_record_step(toy_family())
    no_evidence = ("no cross-device evidence (the devices check was not applicable: 1 GPU; record on a host with two "
                   "GPUs or more)")
    assert step.passed and step.detail.splitlines() == [
        "current record from 4 x H100 (commit cccccccccccc); cross-device check passed",
        f"H200: kernels/validate.py has changed since the last GPU verification on H200: {gate.RECORD_HINT}; "
        f"{no_evidence}",
        "4 x H100: current, every route passed; cross-device check passed"]
    monkeypatch.setattr(gate.records, "load_records", lambda: [{**h200, "sources": RECORD_SOURCES}])
    step = gate.gpu_record_step(toy_family())
    assert step.passed and step.headline == f"current record from H200 (commit cccccccccccc); {no_evidence}"
    monkeypatch.setattr(gate.records, "load_records", lambda: [h200])
    assert not gate.gpu_record_step(toy_family()).passed


def test_ci_workflow_runs_the_gate_on_kernel_changes() -> None:
    """The example workflow: triggered by kernel and sentinel changes, full history for ``--base``, the gate's
    JUnit report uploaded, the site built strictly."""
    import yaml  # installed with mkdocs (the docs extra)

    workflow = yaml.safe_load((REPO_ROOT / ".github/workflows/sentinel.yml").read_text())
    paths = workflow[True]["pull_request"]["paths"]  # YAML 1.1 reads the key `on` as True
    assert {"kernels/**", "sentinel/**"} <= set(paths)
    (job,) = workflow["jobs"].values()
    (checkout,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"]["fetch-depth"] == 0
    gate_step = next(s for s in job["steps"] if s.get("run", "").startswith("sentinel gate"))
    assert gate_step["env"]["BASE_REF"] == "${{ github.base_ref }}"
    assert '--base "origin/$BASE_REF"' in gate_step["run"] and "--junit sentinel-gate.xml" in gate_step["run"]
    uploads = [s["with"]["path"] for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert any("sentinel-gate.xml" in path for path in uploads)
    assert any(s.get("run") == "mkdocs build --strict" for s in job["steps"])
