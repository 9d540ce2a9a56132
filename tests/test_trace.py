"""``sentinel trace``: documents drawn from the code, deterministic, and ``--check`` catching drift.

The git-level properties run ``python -m kernel_sentinel trace`` in a copy of the working tree turned into its own git
repository (the real working tree and its git state are never touched).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provable_kernels.semicrf.dispatch import TREE
from kernel_sentinel import layout, registry, trace
from kernel_sentinel.family import Invariant

REPO = Path(__file__).resolve().parents[1]
GIT_IDENTITY = ["-c", "user.name=sentinel test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]
COPY_IGNORE = shutil.ignore_patterns(".git", "__pycache__", ".hypothesis", ".pytest_cache", "build", "site", ".venv",
                                     "*.egg-info", ".whl")


def importable(repo: Path) -> Path:
    """A directory that imports ``repo``'s code under the installed package names."""
    return layout.import_root(repo, repo.parent / f"{repo.name}-import")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def blob_id(path: Path) -> str:
    return subprocess.run(["git", "hash-object", str(path)], check=True, capture_output=True, text=True).stdout.strip()


def sentinel_trace(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m kernel_sentinel trace ARGS`` importing the code of ``repo``."""
    env = {**os.environ, "PYTHONPATH": str(importable(repo)), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "kernel_sentinel", "trace", *args], cwd=repo, env=env, capture_output=True,
                          text=True)


def parse_flowchart(text: str) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """Mermaid ``flowchart`` text -> (node id -> label, node id -> [(edge label, child id)])."""
    labels = dict(re.findall(r'^\s+(n\d+)[{(\[]+"([^"]+)"', text, re.M))
    edges: dict[str, list[tuple[str, str]]] = {}
    for parent, outcome, child in re.findall(r'^\s+(n\d+) -->\|"([^"]+)"\| (n\d+)$', text, re.M):
        edges.setdefault(parent, []).append((outcome, child))
    return labels, edges


def leaf_paths(labels: dict[str, str], edges: dict[str, list[tuple[str, str]]]) -> dict[str, dict[str, str]]:
    """Route label -> {condition label: outcome} along the drawn edges from the root."""
    children = {child for kids in edges.values() for _, child in kids}
    (root,) = [node for node in labels if node not in children]
    found: dict[str, dict[str, str]] = {}

    def walk(node: str, path: dict[str, str]) -> None:
        if node not in edges:
            found[labels[node]] = path
        for outcome, child in edges.get(node, ()):
            walk(child, {**path, labels[node]: outcome})

    walk(root, {})
    return found


def test_decision_tree_diagram_is_the_dispatch_tree() -> None:
    whole = trace.Group((), TREE.root)
    labels, edges = parse_flowchart(trace.mermaid(whole))
    drawn = leaf_paths(labels, edges)
    assert drawn == {route.id: TREE.path_to(route.id) for route in TREE.routes()}
    assert sum(len(kids) for kids in edges.values()) == len(labels) - 1  # a tree: one edge into every non-root


def test_route_groups_cut_the_tree_at_depth_two() -> None:
    groups = trace.route_groups(TREE)
    assert [g.slug for g in groups] == ["partition-triton", "partition-torch", "viterbi"]
    for group in groups:  # each group's diagram shows the path to it and exactly its routes
        drawn = leaf_paths(*parse_flowchart(trace.mermaid(group)))
        on_path = [r for r in TREE.routes()
                   if all(TREE.path_to(r.id)[cond.name] == outcome for cond, outcome in group.path)]
        assert drawn == {r.id: TREE.path_to(r.id) for r in on_path}
    assert sorted(r for g in groups for r in leaf_paths(*parse_flowchart(trace.mermaid(g)))) == \
        sorted(r.id for r in TREE.routes())


def test_locations_are_read_from_the_source() -> None:
    where = trace.locate(TREE.root.condition.ask)
    lines = (REPO / where.path).read_text().splitlines()
    assert lines[where.line - 1].startswith(f"def {TREE.root.condition.ask.__name__}(")
    assert where.source.splitlines()[0] == lines[where.line - 1]


def test_overview_has_every_section_and_every_route_at_its_definition(tmp_path) -> None:
    (family,) = [f for f in registry.families() if f.name == "semicrf"]
    text = trace.generate([family], tmp_path)["semicrf/index.md"]
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == ["Summary", "Status", "Decision tree", "Dispatch conditions", "Entry points", "Routes",
                        "Critical invariants", "Numerical guards", "Failure modes", "Known issues", "Verification",
                        "Version history", "Provenance"]
    for route in family.tree.routes():
        file = Path(sys.modules[route.fn.__module__].__file__).resolve()
        lines = file.read_text().splitlines()
        line = next(i for i, text_line in enumerate(lines, 1) if text_line.startswith(f"def {route.fn.__name__}("))
        where = f"{file.relative_to(REPO).as_posix()}:{line}"
        assert re.search(rf"^\| `{re.escape(route.id)}` \|.*\| `{re.escape(where)}` \|", text, re.M), route.id


def test_generation_is_deterministic_and_fails_on_a_missing_linked_test(toy_family, tmp_path) -> None:
    linked = Invariant("the diagram is the dispatch tree",
                       "tests/test_trace.py::test_decision_tree_diagram_is_the_dispatch_tree")
    family = toy_family(invariants=(linked,))
    first = trace.generate([family], tmp_path)
    assert first == trace.generate([family], tmp_path)
    assert set(first) == {"index.md", "toy/index.md", "toy/fast.md", "toy/slow.md"}
    assert all(f"`{linked.test}`" in text for name, text in first.items() if name != "index.md")
    for missing in ("tests/test_trace.py::test_that_does_not_exist", "tests/test_nothing_here.py::test_x",
                    "tests/test_trace.py::TestNoSuchClass::test_x"):
        with pytest.raises(trace.TraceError, match=re.escape(missing)):
            trace.generate([toy_family(invariants=(linked, Invariant("gone", missing)))], tmp_path)


def test_drift_names_stale_missing_and_extra_documents(toy_family, tmp_path) -> None:
    docs = trace.generate([toy_family()], tmp_path)
    trace.write(docs, tmp_path)
    record = tmp_path / "verification" / "toy-cpu.json"
    record.parent.mkdir()
    record.write_text("{}")  # records are not documents: never extra, never deleted
    assert trace.drift(docs, tmp_path) == []
    (tmp_path / "toy" / "fast.md").write_text(docs["toy/fast.md"].replace("toy.fast", "toy.quick", 1))
    (tmp_path / "toy" / "slow.md").unlink()
    (tmp_path / "toy" / "old.md").write_text("# an old trace\n")
    found = {d.path: d for d in trace.drift(docs, tmp_path)}
    assert {p: d.kind for p, d in found.items()} == {"toy/fast.md": "stale", "toy/slow.md": "missing",
                                                     "toy/old.md": "extra"}
    assert re.search(r"^-.*toy\.quick", found["toy/fast.md"].diff, re.M)
    assert re.search(r"^\+.*toy\.fast", found["toy/fast.md"].diff, re.M)
    trace.write(docs, tmp_path)
    assert trace.drift(docs, tmp_path) == [] and record.read_text() == "{}"


def test_verification_results_per_device_and_staleness(toy_family, tmp_path) -> None:
    family = toy_family()
    sources = {p.as_posix(): blob_id(REPO / p) for p in family.source_files()}
    check = {"name": "reference", "status": "pass", "max_abs": 1.5e-7, "max_rel": 2.5e-8, "atol": 1e-5,
             "rtol": 1e-5, "detail": "", "repro": ""}
    failed = {**check, "name": "exact", "status": "fail", "max_abs": 0.01, "detail": "value differs",
              "repro": "sentinel verify --route toy.fast --seed 3"}
    routes = [{"id": "toy.fast", "family": "toy", "status": "fail", "checks": [check, failed]}]
    edited = dict(sources, **{"kernels/dispatch.py": "0" * 40})
    for slug, blobs, name in (("cpu", sources, "CPU (Triton interpreter)"), ("cuda-h9", edited, "H9")):
        record = {"family": "toy", "device": {"type": slug.split("-")[0], "name": name}, "commit": "a" * 40,
                  "versions": {"torch": "2.0"}, "sources": blobs, "routes": routes}
        (tmp_path / "verification").mkdir(exist_ok=True)
        (tmp_path / "verification" / f"toy-{slug}.json").write_text(json.dumps(record))
    text = trace.generate([family], tmp_path)["toy/index.md"]
    results = text.split("## Verification", 1)[1].split("## Version history", 1)[0]
    cpu, cuda = results.split("### H9")
    assert "### CPU (Triton interpreter) (`cpu`)" in cpu and "**current**" in cpu and "**stale**" not in cpu
    assert "**stale**" in cuda and "`kernels/dispatch.py`" in cuda
    assert "(../verification/toy-cuda-h9.json)" in cuda
    for part in (cpu, cuda):
        assert ("| `toy.fast` | float32 | **fail** | pass (abs 1.50e-07, rel 2.50e-08) | fail (abs 1.00e-02, rel "
                "2.50e-08) |" in part)  # a record without dtypes (older format) verified float32
        assert "| `toy.slow` | float32 | not run |" in part
        assert "repro: `sentinel verify --route toy.fast --seed 3`" in part


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """The working tree copied into its own git repository with one commit."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=COPY_IGNORE)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first version")
    probe = subprocess.run([sys.executable, "-c", "import kernel_sentinel.family as f; print(f.REPO_ROOT)"], cwd=repo,
                           env={**os.environ, "PYTHONPATH": str(importable(repo))}, capture_output=True, text=True, check=True)
    assert Path(probe.stdout.strip()) == repo.resolve()  # the copy's code runs, not the real tree's
    return repo


def test_trace_commit_check_cycle(repo_copy: Path) -> None:
    """Generate -> check passes (a second process makes the same bytes) -> commit -> a source edit fails the check
    naming the stale documents -> regenerate, commit source and traces together -> check passes."""
    repo = repo_copy
    generated = sentinel_trace(repo)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    docs = sorted(p.relative_to(repo).as_posix() for p in (repo / "traces").rglob("*.md"))
    assert {"traces/index.md", "traces/semicrf/index.md"} <= set(docs)
    assert all(str(repo) not in (repo / d).read_text() for d in docs)  # nothing depends on where the tree lives
    checked = sentinel_trace(repo, "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "traces")

    dispatch = repo / "kernels" / "semicrf" / "dispatch.py"
    dispatch.write_text("# one more line\n" + dispatch.read_text())
    stale = sentinel_trace(repo, "--check")
    assert stale.returncode == 1
    found = set(re.findall(r"stale: \S*?(traces/\S+\.md)", stale.stdout))
    semicrf_docs = {d for d in docs if d.startswith("traces/semicrf/")}
    assert semicrf_docs <= found <= semicrf_docs | {"traces/index.md"}  # the home page's status reads the records
    assert f"+| `kernels/semicrf/dispatch.py` | `{blob_id(dispatch)}` |" in stale.stdout

    assert sentinel_trace(repo).returncode == 0
    ask_op_line = dispatch.read_text().splitlines().index("def ask_op(call: StreamingCall) -> str:") + 1
    overview = (repo / "traces" / "semicrf" / "index.md").read_text()
    assert f"`kernels/semicrf/dispatch.py:{ask_op_line}`" in overview
    previous = git(repo, "log", "-1", "--format=%H", "--", "kernels")
    assert f"follows commit `{previous[:12]}`" in overview  # the version before this one
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "edit dispatch and regenerate traces in one commit")
    after = sentinel_trace(repo, "--check")
    assert after.returncode == 0, after.stdout + after.stderr


def test_status_at_a_glance_rolls_up_per_device_and_splits_dtypes_only_where_they_differ():
    """A row per family and device (per dtype where they differ): status, routes passed, whether the record is
    current, the GPUs it ran on, and its cross-device evidence (none from a record made on one GPU)."""
    from kernel_sentinel import dashboard

    def record(kind, statuses, sources, gpus=1, devices="not applicable: 1 GPU"):
        device = {"type": kind, "name": "Big GPU" if kind == "cuda" else "cpu"}
        checks = [{"name": "devices", "status": "pass", "detail": devices}]
        return {"device": {**device, "gpus": ["Big GPU"] * gpus} if kind == "cuda" else device, "commit": "",
                "sources": sources,
                "routes": [{"id": r, "dtype": d, "status": s, "checks": checks} for (r, d), s in statuses.items()]}

    blobs = {"kernels/toy.py": "1"}
    same = {("toy.a", "float32"): "pass", ("toy.a", "float64"): "pass", ("toy.b", "float32"): "pass",
            ("toy.b", "float64"): "pass"}
    differ = {**same, ("toy.b", "float64"): "fail"}
    status = dashboard.FamilyStatus("toy", [("toy.a", "toy.md", False), ("toy.b", "toy.md", True)],
                                    [record("cpu", same, blobs), record("cuda", differ, blobs),
                                     record("cuda", same, {"kernels/toy.py": "0"}, 4, "every input ...")], blobs, None)
    header, rows = dashboard.rollup([status], "#every-route")
    assert header[:7] == ["family", "device", "status", "routes passed", "current", "GPUs", "cross-device"]
    current, stale = ":material-check-circle: current", dashboard.SYMBOL["stale"].replace(" stale", " **STALE**")
    no_evidence = ":material-minus-circle-outline: not applicable: 1 GPU (no evidence)"
    assert [row[1:7] for row in rows] == [
        ["[CPU (interpreter)](#every-route)", dashboard.SYMBOL["pass"], "2/2", current, "n/a", "n/a"],
        ["[Big GPU, float32](#every-route)", dashboard.SYMBOL["pass"], "2/2", current, "1", no_evidence],
        ["[Big GPU, float64](#every-route)", dashboard.SYMBOL["fail"], "1/2", current, "1", no_evidence],
        ["[Big GPU](#every-route)", dashboard.SYMBOL["pass"], "2/2", stale, "4", dashboard.SYMBOL["pass"]],
    ]


def test_the_sanitizer_column_reads_current_records_and_marks_a_stale_result_stale(monkeypatch):
    """A Triton route's sanitizer cell shows the compute-sanitizer result of the GPU records made on the current
    sources; where none of them ran the tools, the newest stale record's result that did, marked stale with its
    commit."""
    from kernel_sentinel import dashboard

    def record(sources, tools, commit="abcdef0123"):
        checks = [{"name": t, "status": s} for t, s in tools.items()]
        return {"device": {"type": "cuda", "name": "Big GPU"}, "commit": commit, "sources": sources,
                "routes": [{"id": "toy.b", "dtype": "float32", "status": "pass", "checks": checks}]}

    monkeypatch.setattr(dashboard, "commit_time", {"abcdef0123": 2, "0ld0ld0ld0": 1}.get)
    now, old = {"kernels/toy.py": "1"}, {"kernels/toy.py": "0"}
    every = dict.fromkeys(dashboard.SANITIZER_TOOLS, "pass")
    cell = lambda *records: dashboard.sanitizer(records, "toy.b", True, now)  # noqa: E731
    assert cell(record(now, every), record(old, {**every, "racecheck": "fail"})) == dashboard.SYMBOL["pass"]
    assert cell(record(now, {**every, "memcheck": "fail"})) == dashboard.SYMBOL["fail"] + ": memcheck"
    assert cell(record(now, {}), record(old, every)) == dashboard.SYMBOL["stale"] + " (pass)<br>`abcdef0`"
    assert cell(record(now, {}), record(old, {"memcheck": "pass"})) == (
        dashboard.SYMBOL["stale"] + " (pass (not run: racecheck, initcheck, synccheck))<br>`abcdef0`")
    older_failure = record(old, {**every, "memcheck": "fail"}, "0ld0ld0ld0")
    assert cell(older_failure, record(old, every)) == dashboard.SYMBOL["stale"] + " (pass)<br>`abcdef0`"
    assert cell(record(now, {})) == dashboard.SYMBOL["not run"]
    assert dashboard.sanitizer([record(now, every)], "toy.b", False, now) == "n/a"


def test_a_mutation_record_is_stale_once_a_file_it_sampled_changes(monkeypatch):
    """The kill rate shown is marked stale when a sampled file's blob at the record's commit differs from the
    working tree's (and current when they match). The working tree is made to hold the file as at its last commit,
    so that local edits do not matter."""
    from kernel_sentinel import dashboard
    from kernel_sentinel.records import git

    path = "kernels/sinkhorn/triton_sinkhorn.py"
    last_change = git("log", "-1", "--format=%H", "--", path)
    before_it = git("rev-parse", f"{last_change}^")
    monkeypatch.setattr(dashboard, "blob_ids", lambda paths: {str(p): git("rev-parse", f"{last_change}:{p}")
                                                             for p in paths})
    record = {"kill_rate": 90.0, "killed": 54, "sampled": 60, "date": "2026-01-01", "files": {path: {}}}
    assert dashboard.mutation_is_current({**record, "commit": last_change})
    assert not dashboard.mutation_is_current({**record, "commit": before_it})
    assert dashboard.kill_rate({**record, "commit": before_it}, short=True) == \
        f"90% {dashboard.SYMBOL['stale']} (sources changed since)"
    assert dashboard.kill_rate({**record, "commit": last_change}).startswith("90.0% (54/60)<br>2026-01-01")
