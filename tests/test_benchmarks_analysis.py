"""``python -m benchmarks analyze`` on a synthetic semi-CRF CSV whose ratios, crossover points, backward/forward
ratios and semiring overheads are worked out by hand below."""
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
from benchmarks.analysis import analyze, line_plot  # noqa: E402
from benchmarks.common import write_csv  # noqa: E402
from benchmarks.runner import columns  # noqa: E402

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
    assert {"time_vs_T.png", "time_vs_KC.png", "throughput_vs_T.png", "bandwidth_vs_T.png",
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
