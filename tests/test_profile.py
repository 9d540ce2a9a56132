"""kernel_sentinel.profile (``sentinel verify --profile``): seconds and Triton launches per check, family and row."""
from __future__ import annotations

import json

import pytest
import torch

from kernel_sentinel import profile, registry
from kernel_sentinel.cli import main
from kernel_sentinel.records import CheckResult, RouteResult


def row(family: str, route: str, seconds: dict[str, float]) -> RouteResult:
    return RouteResult(route, family, tuple(CheckResult(n, True, "", "", seconds=s) for n, s in seconds.items()),
                       "float32")


def test_summary_sums_seconds_and_launches_per_check_family_and_row_largest_first():
    results = [row("a", "a.one", {"route": 1.0, "memory": 5.0}), row("b", "b.one", {"route": 2.0, "memory": 0.5})]
    counts = {("a", "a.one", "float32", "memory"): (7, 4.0), ("b", "b.one", "float32", "route"): (2, 1.5)}
    got = profile.summary(results, counts, 9.0)
    assert (got["wall_seconds"], got["check_seconds"], got["launches"], got["rows_verified"]) == (9.0, 8.5, 9, 2)
    assert got["cpu_seconds"] == 5.5 and [c["cpu_seconds"] for c in got["checks"]] == [4.0, 1.5]
    assert [(c["name"], c["seconds"], c["launches"]) for c in got["checks"]] == [("memory", 5.5, 7), ("route", 3.0, 2)]
    assert [(f["name"], f["seconds"], f["share"]) for f in got["families"]] == [("a", 6.0, round(6 / 8.5, 4)),
                                                                               ("b", 2.5, round(2.5 / 8.5, 4))]
    assert [(r["route"], r["seconds"], r["launches"]) for r in got["rows"]] == [("a.one", 6.0, 7), ("b.one", 2.5, 2)]
    assert got["rows"][0]["checks"]["memory"] == {"seconds": 5.0, "launches": 7, "cpu_seconds": 4.0}


def test_counting_counts_launches_under_its_key_and_take_empties_them():
    from provable_kernels.launch import Launcher

    class Kernel:  # what Launcher.launch calls under the interpreter: kernel[grid](*args, **meta)
        fn = lambda: None  # noqa: E731
        __name__ = "toy_kernel"

        def __getitem__(self, grid):
            return lambda *args, **meta: None

    launcher = Launcher(Kernel())
    key = ("toy", "toy.slow", "float32", "reference")
    with profile.counting(key):
        for _ in range(3):
            launcher[(1,)]()
    profile.add({key: (2, 1.0)})
    (launches, cpu), = profile.take().values()
    assert launches == 5 and cpu >= 1.0 and profile.take() == {}


@pytest.fixture
def only_toy(monkeypatch, toy_family):
    monkeypatch.setattr(registry, "discover", lambda package="provable_kernels": ([toy_family()], []))


def test_verify_profile_prints_the_tables_and_writes_them_to_the_json_report(only_toy, tmp_path, capsys):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert main(["verify", "--device", device, "--examples", "2", "--route", "toy.slow", "--profile", "--jobs", "0",
                 "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "profile: 1 rows" in out and "the 1 most expensive rows" in out
    report = json.loads((tmp_path / "r.json").read_text())["profile"]
    assert report["rows_verified"] == 1 and report["rows"][0]["route"] == "toy.slow"
    assert {c["name"] for c in report["checks"]} == set(report["rows"][0]["checks"])
    assert main(["verify", "--device", device, "--examples", "2", "--route", "toy.slow", "--jobs", "0",
                 "--json", str(tmp_path / "plain.json")]) == 0
    assert "profile" not in json.loads((tmp_path / "plain.json").read_text())
