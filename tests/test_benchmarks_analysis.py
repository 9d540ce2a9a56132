"""``python -m benchmarks analyze`` on a synthetic semi-CRF CSV whose ratios, crossover points, backward/forward
ratios, semiring overheads and speedups over the peer are worked out by hand below; the line plots join only
points of one configuration of the other axes."""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import adapters  # noqa: E402
from benchmarks.analysis import (analyze, line_figure, line_groups, line_plot, speedup_figure, targets,  # noqa: E402
                                 speedup_over_peer)
from benchmarks.common import write_csv  # noqa: E402
from benchmarks.runner import columns, read_results  # noqa: E402

# (T, semiring, impl, phase) -> (time ms, peak MB); B, K, C fixed at 4, 8, 3.
TIMES = {
    (100, "Log", "triton", "forward"): (2.0, 1.0),
    (100, "Log", "triton", "backward"): (6.0, 2.0),
    (100, "Log", "triton", "both"): (8.0, 3.0),
    (100, "Log", "flash-semicrf", "forward"): (1.0, 4.0),
    (100, "Log", "flash-semicrf", "backward"): (12.0, 4.0),
    (100, "Log", "flash-semicrf", "both"): (16.0, 6.0),
    (10000, "Log", "triton", "forward"): (1.0, 1.0),
    (10000, "Log", "triton", "backward"): (5.0, 2.0),
    (10000, "Log", "triton", "both"): (6.0, 3.0),
    (10000, "Log", "flash-semicrf", "forward"): (2.0, 2.0),
    (10000, "Log", "flash-semicrf", "backward"): (20.0, 4.0),
    (10000, "Log", "flash-semicrf", "both"): (24.0, 6.0),
    (100, "Max", "triton", "forward"): (3.0, 1.0),
}


def synthetic_csv(path: Path) -> None:
    adapter = adapters.load("semicrf")
    rows = []
    for (T, semiring, impl, phase), (ms, mb) in TIMES.items():
        config = {"B": 4, "T": T, "K": 8, "C": 3, "semiring": semiring}
        rows.append({"family": "semicrf", "config": adapter.label(config), **config, **adapter.derived(config),
                     "impl": impl, "ours": impl == "triton", "phase": phase, "status": "ok", "time_ms": ms,
                     "peak_mb": mb, "bytes": 1e6, "floor_ms": 0.5, "floor_fraction": 0.5 / ms,
                     "bytes_per_s": 1e6 / (ms / 1e3), "size": 4 * T, "throughput": 4 * T / (ms / 1e3)})
    rows.append({"family": "semicrf", "config": "B=4,T=100,K=8,C=3,semiring=Max", "B": 4, "T": 100, "K": 8,
                 "C": 3, "semiring": "Max", "impl": "flash-semicrf", "ours": False, "phase": "backward",
                 "status": "skipped: flash-semicrf's Max semiring has no gradient"})
    write_csv(path, rows, columns(adapter))


def table(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("analysis")
    synthetic_csv(out / "benchmark_full.csv")
    written = analyze(out / "benchmark_full.csv", out / "plots", "png")
    assert all(p.stat().st_size > 0 for p in written)
    return out / "plots"


def test_baseline_ratios(analyzed):
    got = {(int(r["T"]), r["phase"]): (float(r["time_ratio"]), float(r["memory_ratio"]))
           for r in table(analyzed / "baseline_ratios.csv")}
    # flash time / triton time and flash peak / triton peak, by hand from TIMES
    assert got == {(100, "forward"): (0.5, 4.0), (100, "backward"): (2.0, 2.0), (100, "both"): (2.0, 2.0),
                   (10000, "forward"): (2.0, 2.0), (10000, "backward"): (4.0, 2.0), (10000, "both"): (4.0, 2.0)}
    assert {r["impl"] for r in table(analyzed / "baseline_ratios.csv")} == {"flash-semicrf"}


def test_crossover_points(analyzed):
    rows = [r for r in table(analyzed / "crossover_points.csv") if r["axis"] == "T"]
    # forward: ratio 0.5 at T = 100, 2 at T = 10000; log-log interpolation crosses 1 halfway in log T: T = 1000
    assert len(rows) == 1
    r = rows[0]
    assert (r["impl"], r["phase"], r["baseline_faster"]) == ("flash-semicrf", "forward", "above")
    assert math.isclose(float(r["crossover"]), 1000.0, rel_tol=1e-12)
    assert r["fixed"] == "B=4,K=8,C=3,semiring=Log"


def test_backward_forward_ratios(analyzed):
    got = {(r["config"].split(",")[1], r["impl"]): (float(r["backward_over_forward"]), float(r["both_over_forward"]))
           for r in table(analyzed / "backward_forward_ratios.csv")}
    assert got == {("T=100", "triton"): (3.0, 4.0), ("T=100", "flash-semicrf"): (12.0, 16.0),
                   ("T=10000", "triton"): (5.0, 6.0), ("T=10000", "flash-semicrf"): (10.0, 12.0)}


def test_semiring_overhead_and_summary(analyzed):
    overhead = table(analyzed / "semiring_overhead.csv")
    assert [(r["impl"], r["phase"], r["semiring"], float(r["overhead"])) for r in overhead] == [
        ("triton", "forward", "Max", 1.5)]  # 3 ms / 2 ms
    summary = {(r["impl"], r["phase"]): r for r in table(analyzed / "summary_stats.csv")}
    flash_fwd = summary[("flash-semicrf", "forward")]
    assert math.isclose(float(flash_fwd["geomean_time_ratio"]), 1.0)  # sqrt(0.5 * 2)
    assert math.isclose(float(summary[("flash-semicrf", "backward")]["geomean_time_ratio"]), math.sqrt(8.0))
    assert summary[("flash-semicrf", "backward")]["skipped"] == "1"
    assert summary[("triton", "forward")]["ok"] == "3" and summary[("triton", "forward")]["peak_mb_max"] == "1.0"


def test_every_plot_is_drawn(analyzed):
    names = {p.name for p in analyzed.glob("*.png")}
    assert {"speedup_over_peer.png", "time_vs_T.png", "time_vs_KC.png", "throughput_vs_T.png", "bandwidth_vs_T.png",
            "memory_per_unit_vs_T.png", "backward_forward.png", "semiring_overhead.png",
            "ratio_heatmap_forward.png", "ratio_heatmap_backward.png", "ratio_heatmap_both.png"} <= names


def test_baseline_must_be_in_the_csv(tmp_path):
    synthetic_csv(tmp_path / "benchmark_full.csv")
    with pytest.raises(ValueError, match="--baseline"):
        analyze(tmp_path / "benchmark_full.csv", tmp_path / "plots", "png", "nope", plots=False)
    written = analyze(tmp_path / "benchmark_full.csv", tmp_path / "plots", "png", "flash-semicrf", plots=False)
    assert all(p.suffix == ".csv" for p in written)
    ratios = table(tmp_path / "plots" / "baseline_ratios.csv")
    assert {r["impl"] for r in ratios} == {"triton"}
    assert {(r["T"], r["phase"]): float(r["time_ratio"]) for r in ratios}[("100", "forward")] == 2.0


def test_pdf_format(tmp_path):
    synthetic_csv(tmp_path / "benchmark_full.csv")
    rows = table(tmp_path / "benchmark_full.csv")
    path = line_plot(tmp_path / "time.pdf", rows, "T", lambda r: float(r["time_ms"]) if r["time_ms"] else None,
                     "median time (ms)", "time", "T")
    assert path.read_bytes().startswith(b"%PDF")


# ------------------------------------------------------------------------------- like with like, and the speedup

AXES = ["B", "T", "K", "C", "semiring"]


def varying_rows(path: Path) -> list[dict]:
    """Rows of one implementation and phase whose B, K, C change along T, as in a run of anchor shapes: a series
    (B=4, K=8, C=3) at T = 100, 1000, 10000, and at T = 1000 and 1024 configurations of other B, K, C, and the
    series at T = 1000 in the Max semiring. Every time is distinct, so a point names its row."""
    adapter = adapters.load("semicrf")
    configs = [(4, 100, 8, 3, "Log"), (4, 1000, 8, 3, "Log"), (4, 10000, 8, 3, "Log"), (64, 1000, 100, 24, "Log"),
               (4, 1024, 16, 12, "Log"), (4, 1000, 8, 3, "Max"), (16, 4096, 32, 24, "Log")]
    rows = []
    for n, values in enumerate(configs):
        config = dict(zip(AXES, values))
        for m, impl in enumerate(("triton", "flash-semicrf")):
            ms = (n + 1) * 1.5 + 100 * m
            rows.append({"family": "semicrf", "config": adapter.label(config), **config, **adapter.derived(config),
                         "impl": impl, "ours": impl == "triton", "phase": "forward", "status": "ok",
                         "time_ms": ms})
    write_csv(path, rows, columns(adapter))
    return table(path)


def test_a_line_joins_only_points_of_one_configuration_of_the_other_axes(tmp_path):
    rows = varying_rows(tmp_path / "benchmark_full.csv")
    by_point = {(float(r["T"]), float(r["time_ms"])): r for r in rows}
    fig = line_figure(rows, "T", lambda r: float(r["time_ms"]), "median time (ms)", "time", "T")
    lines = [line for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata()) > 0]
    joined = [line for line in lines if line.get_linestyle() != "None" and len(line.get_xdata()) > 1]
    drawn = set()
    for line in lines:
        points = [by_point[(float(x), float(y))] for x, y in zip(line.get_xdata(), line.get_ydata())]
        drawn.update(r["config"] + r["impl"] for r in points)
        assert len({r["impl"] for r in points}) == 1
        assert len({tuple(r[a] for a in AXES if a != "T") for r in points}) == 1, [r["config"] for r in points]
        assert [float(r["T"]) for r in points] == sorted(float(r["T"]) for r in points)
    assert drawn == {r["config"] + r["impl"] for r in rows}  # every row is drawn, once
    # the one series of the Log semiring at B=4, K=8, C=3 is the only line, one per implementation
    assert sorted((line.get_xdata().tolist(), line.get_color()) for line in joined) == [
        ([100.0, 1000.0, 10000.0], "C0"), ([100.0, 1000.0, 10000.0], "C1")]
    # every other configuration is an unconnected marker
    assert all(len(line.get_xdata()) == 1 and line.get_linestyle() == "None" for line in lines if line not in joined)
    # the legend: one entry per implementation, then the other axes that differ (semiring among them)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend.count("triton") == 1 and legend.count("flash-semicrf") == 1
    assert "B=4, K=8, C=3, semiring=Log" in legend and "B=4, K=8, C=3, semiring=Max (one point)" in legend


def test_line_groups_along_a_derived_axis_join_nothing(tmp_path):
    """K*C is no grid axis: two points of one K*C differ in K or C, so no line joins them."""
    rows = varying_rows(tmp_path / "benchmark_full.csv")
    groups = line_groups(rows, "KC", lambda r: float(r["time_ms"]), AXES)
    assert groups and all(len(points) == 1 for points in groups.values())
    groups = line_groups(rows, "T", lambda r: float(r["time_ms"]), AXES)
    assert groups[("forward", "triton", ("4", "8", "3", "Log"))] == [(100.0, 1.5), (1000.0, 3.0), (10000.0, 4.5)]


def test_speedup_over_the_peer_is_peer_time_over_our_time(tmp_path):
    synthetic_csv(tmp_path / "benchmark_full.csv")
    adapter = adapters.load("semicrf")
    speedups = speedup_over_peer(table(tmp_path / "benchmark_full.csv"), adapter)
    got = {(int(r["T"]), r["semiring"], r["phase"]): r["speedup"] for r in speedups}
    # flash-semicrf (the adapter's peer) time / triton time, by hand from TIMES, forward and forward+backward only
    # (the backward alone splits work differently per implementation); Max: the peer did not run
    assert got == {(100, "Log", "forward"): 0.5, (100, "Log", "both"): 2.0,
                   (10000, "Log", "forward"): 2.0, (10000, "Log", "both"): 4.0,
                   (100, "Max", "forward"): None}
    assert {(r["ours"], r["peer"]) for r in speedups} == {("triton", "flash-semicrf")}
    notes = {r["phase"]: r["note"] for r in speedups if r["semiring"] == "Max"}
    assert "flash-semicrf" in notes["forward"]

    fig = speedup_figure(speedups, adapter)
    (ax,) = fig.axes
    assert ax.get_xlabel() == "speedup over flash-semicrf (x)"
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [1.0]  # the line at 1x
    bars = {}
    for patch in ax.patches:
        config, phase = patch.get_gid().split("|")
        assert patch.get_x() == 1.0  # bars start at 1x
        bars[(config, phase)] = 1.0 + patch.get_width()
    expected = {(r["config"], r["phase"]): r["speedup"] for r in speedups if r["speedup"] is not None}
    assert bars.keys() == expected.keys()
    assert all(math.isclose(bars[k], v) for k, v in expected.items())
    texts = [t.get_text() for t in ax.texts]
    assert "0.5x" in texts and "4x" in texts
    analyze(tmp_path / "benchmark_full.csv", tmp_path / "plots", plots=False)
    csv_speedups = table(tmp_path / "plots" / "speedup_over_peer.csv")
    assert [float(r["speedup"]) for r in csv_speedups if r["speedup"]] == [0.5, 2.0, 2.0, 4.0]


def with_fake_fast_row(path: Path) -> None:
    """The synthetic CSV plus a 'torch' forward at T = 100 measured 0.05 ms against a 0.5 ms floor (10x below)."""
    synthetic_csv(path)
    rows = table(path)
    fake = {**next(r for r in rows if r["impl"] == "triton" and r["phase"] == "forward" and r["T"] == "100"
                   and r["semiring"] == "Log"), "impl": "torch", "time_ms": "0.05", "floor_kind": "bandwidth"}
    write_csv(path, rows + [fake], columns(adapters.load("semicrf")))


def test_a_result_below_the_floor_is_flagged_not_a_speedup(tmp_path):
    with_fake_fast_row(tmp_path / "benchmark_full.csv")
    analyze(tmp_path / "benchmark_full.csv", tmp_path / "plots", "png", plots=False)
    invalid = table(tmp_path / "plots" / "invalid_rows.csv")
    assert [(r["impl"], r["phase"], r["config"]) for r in invalid] == [
        ("torch", "forward", "B=4,T=100,K=8,C=3,semiring=Log")]
    assert invalid[0]["status"].startswith("invalid: median 0.05 ms is below the bandwidth floor 0.5 ms (10x)")
    assert not [r for r in table(tmp_path / "plots" / "baseline_ratios.csv") if r["impl"] == "torch"]
    summary = {(r["impl"], r["phase"]): r for r in table(tmp_path / "plots" / "summary_stats.csv")}
    assert summary[("torch", "forward")]["invalid"] == "1" and summary[("torch", "forward")]["ok"] == "0"
    assert summary[("triton", "forward")]["invalid"] == "0"


def test_targets_are_judged_per_matching_configuration_and_phase(tmp_path):
    """A speedup target and a floor-fraction target on the synthetic run: values from the CSV's medians (written
    here), met when at least the minimum, not met with a note where a side has no time."""
    import dataclasses

    synthetic_csv(tmp_path / "benchmark_full.csv")
    adapter = dataclasses.replace(adapters.load("semicrf"), targets=(
        adapters.Target(">= 1x flash at T=100", {"T": 100}, ("forward", "both"), "speedup:flash-semicrf", 1.0),
        adapters.Target("floor share at T=10000", {"T": 10000, "semiring": "Log"}, ("forward",), "floor_fraction",
                        0.4)))
    judged = targets(read_results(tmp_path / "benchmark_full.csv"), adapter)
    got = {(t["target"][:4], t["config"].split(",")[1], t["config"].split(",")[-1], t["phase"]):
           (t["value"], t["met"], t["note"]) for t in judged}
    assert got == {
        (">= 1", "T=100", "semiring=Log", "forward"): (0.5, False, ""),  # flash 1 ms / triton 2 ms
        (">= 1", "T=100", "semiring=Log", "both"): (2.0, True, ""),  # 16 ms / 8 ms
        (">= 1", "T=100", "semiring=Max", "forward"): (None, False, "flash-semicrf not in the CSV"),
        ("floo", "T=10000", "semiring=Log", "forward"): (0.5, True, ""),  # floor 0.5 ms / 1 ms
    }
    analyze(tmp_path / "benchmark_full.csv", tmp_path / "plots", "png", plots=False)
    assert table(tmp_path / "plots" / "targets.csv") == []  # the real adapter's targets name the anchors only
    for bad in (dict(metric="speed"), dict(phases=("sideways",)), dict(phases=())):
        with pytest.raises(ValueError):
            adapters.Target(**{**dict(name="t", where={}, phases=("forward",), metric="floor_fraction",
                                      minimum=1.0), **bad})
