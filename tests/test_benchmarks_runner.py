"""The benchmark runner (``python -m benchmarks run``) on the CPU: a tiny grid per family through the PyTorch and
interpreter routes, the outputs it writes, --resume, and the command line. No timing assertions; accuracy is
checked against each adapter's float64 reference (independent of the code under test: the PyTorch route for
semi-CRF, the naive loop for Sinkhorn, scatter_reduce for segments).
"""
from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import adapters  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402
from benchmarks.common import blob_id  # noqa: E402
from benchmarks.runner import Runner, grid, read_rows  # noqa: E402

CPU = torch.device("cpu")


def run(adapter, impls, configs, out: Path, phases=adapters.PHASES, **kw) -> list[dict]:
    runner = Runner(adapter, [adapter.impl(i) if isinstance(i, str) else i for i in impls], phases, CPU, out, 300,
                    min_reps=1, target_s=0.005, progress=False, **kw)
    return runner.run(configs)


def check_outputs(out: Path, adapter, rows: list[dict], impls: list[str], configs: list[dict], phases) -> None:
    """Every configuration x implementation x phase measured and accurate; the side files written."""
    labels = [adapter.label(c) for c in configs]
    assert {(r["config"], r["impl"], r["phase"]) for r in rows} == {
        (c, i, p) for c in labels for i in impls for p in phases}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["time_ms"] > 0 and r["reps"] >= 1 and r["bytes"] > 0 and r["floor_fraction"] > 0, r
        assert r["ref_status"] == "ok" and r["rel_err"] < 1e-5, r
    written = read_rows(out / "benchmark_full.csv")
    assert len(written) == len(rows) and {r["family"] for r in written} == {adapter.name}
    header = json.loads((out / "benchmark_full.json").read_text())
    assert header["family"] == adapter.name and header["settings"]["impls"] == impls
    assert header["floors"]["copy_bytes_per_s"] > 0 and header["compile"]["counted"] is True
    assert header["sources"] or header["sources_note"]
    for path, blob in header["sources"].items():
        assert blob == blob_id(ROOT / path), path
    memory = read_rows(out / "memory_breakdown.csv")
    assert {(m["config"], m["impl"]) for m in memory} == {(c, i) for c in labels for i in impls}
    for m in memory:
        assert m["status"] == "ok" and float(m["inputs_mb"]) > 0 and float(m["outputs_mb"]) > 0, m
    heat = json.loads((out / "heatmap_data.json").read_text())["feasibility"]
    assert set(heat) == set(impls) and all(e["feasible"] for i in impls for p in phases for e in heat[i][p])


def test_semicrf_tiny_grid_interpreter_and_torch_routes(tmp_path):
    adapter = adapters.load("semicrf")
    configs = grid(adapter, {"B": [2], "T": [4], "K": [2], "C": [2], "semiring": ["Log"]})
    rows = run(adapter, ["triton", "torch"], configs, tmp_path)
    check_outputs(tmp_path, adapter, rows, ["triton", "torch"], configs, adapters.PHASES)
    assert "kernels/semicrf/dispatch.py" in json.loads((tmp_path / "benchmark_full.json").read_text())["sources"]
    routes = {(r["impl"], r["phase"]): r["route"] for r in rows}
    assert routes[("triton", "forward")] == "semicrf.triton.log.infer"
    assert routes[("torch", "both")] == "semicrf.torch.log.train"


def test_sinkhorn_tiny_grid(tmp_path, monkeypatch):
    adapter = adapters.load("sinkhorn")
    configs = grid(adapter, {"B": [2], "n": [3], "iters": [2], "domain": ["log", "prob"]})
    rows = run(adapter, ["ours", "naive"], configs, tmp_path / "interpreter")
    check_outputs(tmp_path / "interpreter", adapter, rows, ["ours", "naive"], configs, adapters.PHASES)
    assert {r["route"].split(".")[1] for r in rows if r["impl"] == "ours"} == {"triton"}
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the PyTorch route (the dispatch reads it per call)
    rows = run(adapter, ["ours"], configs, tmp_path / "torch", phases=("forward", "both"))
    assert {r["route"].split(".")[1] for r in rows} == {"torch"} and all(r["rel_err"] < 1e-5 for r in rows)


def test_segment_tiny_grid(tmp_path, monkeypatch):
    adapter = adapters.load("segment")
    impls = ["ours", "torch-offsets", "torch-lengths", "scatter-reduce"]
    configs = grid(adapter, {"N": [40], "D": [3], "S": [5], "dist": ["powerlaw"], "reduce": ["sum", "max"]})
    rows = run(adapter, impls, configs, tmp_path / "interpreter")
    check_outputs(tmp_path / "interpreter", adapter, rows, impls, configs, adapters.PHASES)
    assert {r["route"].split(".")[1] for r in rows if r["impl"] == "ours"} == {"triton"}
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    rows = run(adapter, ["ours", "ours-ids"], configs, tmp_path / "torch", phases=("both",))
    assert {r["route"].split(".")[1] for r in rows} == {"torch"}
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-5 for r in rows), rows


def test_segment_lengths_cover_every_row_and_no_segment_is_empty():
    from benchmarks.adapters.segment import segment_lengths

    for dist in ("random", "powerlaw"):
        lengths = segment_lengths(1000, 37, dist, torch.Generator().manual_seed(0))
        assert lengths.shape == (37,) and int(lengths.sum()) == 1000 and int(lengths.min()) >= 1
    assert segment_lengths(10, 1, "random", torch.Generator()).tolist() == [10]


def test_resume_skips_finished_measurements(tmp_path):
    """A run cut short (a skipped row) resumes by measuring only what is missing; finished rows stay as they were."""
    adapter = adapters.load("semicrf")
    calls = []
    torch_route = adapter.impl("torch")

    def counting(problem, config):
        calls.append(config["T"])
        return torch_route.prepare(problem, config)

    counted = dataclasses.replace(adapter, impls=(dataclasses.replace(torch_route, prepare=counting),))
    configs = grid(adapter, {"B": [2], "T": [4, 6], "K": [2], "C": [2]})
    first = run(counted, ["torch"], configs, tmp_path, phases=("forward",))
    assert sorted(set(calls)) == [4, 6]
    # cut short: the T=6 row was skipped by the budget
    path = tmp_path / "benchmark_full.csv"
    rows = read_rows(path)
    cut = next(r for r in rows if r["T"] == "6")
    cut.update(status="skipped: wall-clock budget spent", time_ms="")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    calls.clear()
    again = run(counted, ["torch"], configs, tmp_path, phases=("forward",), resume=True)
    assert set(calls) == {6}
    kept = next(r for r in again if r["T"] == "4")
    assert kept["time_ms"] == str(next(r for r in first if r["T"] == 4)["time_ms"])
    assert next(r for r in again if r["T"] == 6)["status"] == "ok"
    calls.clear()
    run(counted, ["torch"], configs, tmp_path, phases=("forward",), resume=True)
    assert calls == []


def test_failures_and_hopeless_configurations_are_recorded(tmp_path):
    adapter = adapters.load("semicrf")

    def boom(problem, config):
        raise RuntimeError("boom")

    impls = (adapters.Impl("boom", boom), adapters.Impl("huge", adapter.impl("torch").prepare,
                                                           memory_bytes=lambda c: 1e18),
             adapters.Impl("absent", boom, unavailable=lambda d: "not here"))
    broken = dataclasses.replace(adapter, impls=impls)
    rows = run(broken, ["boom", "huge", "absent"], grid(adapter, {"B": [1], "T": [3], "K": [2], "C": [2]}),
               tmp_path, phases=("forward", "both"))
    status = {(r["impl"], r["phase"]): r["status"] for r in rows}
    assert status[("boom", "forward")] == status[("boom", "both")] == "error: RuntimeError: boom"
    assert status[("huge", "forward")].startswith("skipped: needs ~") and "estimate" in status[("huge", "forward")]
    assert status[("absent", "both")] == "skipped: not here"


def test_command_line(tmp_path):
    """``run`` then ``analyze`` through the command-line entry point (in-process), and usage errors."""
    out = tmp_path / "run"
    assert main(["run", "--family", "semicrf", "--device", "cpu", "--B", "2", "--T", "4", "--K", "2", "--C", "2",
                 "--semirings", "Log", "--backends", "torch", "--phases", "forward,backward", "--repeats", "1",
                 "--target-s", "0.005", "--output-dir", str(out), "--no-progress"]) == 0
    assert len(read_rows(out / "benchmark_full.csv")) == 2
    assert main(["analyze", "--input", str(out / "benchmark_full.csv"), "--output-dir", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "summary_stats.csv").exists() and (tmp_path / "plots" / "time_vs_T.png").exists()
    for bad in (["--family", "semicrf", "--n", "4"], ["--family", "semicrf", "--backends", "nope"],
                ["--family", "semicrf", "--phases", "sideways"], ["--family", "nope"],
                ["--family", "semicrf", "--T", "x"]):
        with pytest.raises(SystemExit):
            main(["run", "--device", "cpu", *bad])


@pytest.mark.parametrize("semiring", ["Log", "Max"])
@pytest.mark.parametrize("peer", ["flash-semicrf", "torch-struct"])
def test_semicrf_peer_mappings_compute_our_model_in_both_semirings(peer, semiring):
    """Each peer, fed the adapter's mapped inputs, returns our model's logZ (Log) or best score (Max): checked
    against enumeration of every segmentation (provable_kernels.semicrf.oracle)."""
    from provable_kernels.semicrf import oracle

    adapter = adapters.load("semicrf")
    config = {"B": 2, "T": 5, "K": 3, "C": 2, "semiring": semiring}
    problem = adapter.build(config, CPU, 4).float64()
    scored = oracle.all_scores(*problem.params, problem.lengths, config["K"])
    want = oracle.log_partition(scored) if semiring == "Log" else [score for _, score in oracle.best(scored)]
    prepared = adapter.impl(peer).prepare(problem, config)
    got = prepared.call(*prepared.args)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-10)


def test_liger_peer_computes_the_prob_domain_definition():
    """Liger-Kernel's mHC Sinkhorn with alpha 1, bias 0 (the adapter's mapping, run by the Triton interpreter)
    gives the prob-domain Sinkhorn of the definition and its gradient (float64 loop written in the adapter)."""
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.fail("liger-kernel is not installed: the benchmark tests need the bench extra "
                    "(pip install -e '.[bench]')")
    from benchmarks.adapters import sinkhorn

    config = {"B": 3, "n": 4, "iters": 5, "domain": "prob", "dtype": "float32"}
    x = sinkhorn.build(config, CPU, 0)
    prepared = sinkhorn.prepare_liger(x, config)
    leaf = x.detach().requires_grad_()
    out = prepared.call(leaf)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grad, = torch.autograd.grad(out, leaf, upstream)
    x64 = x.double().requires_grad_()
    want = sinkhorn.naive(x64, config["iters"], "prob")
    want_grad, = torch.autograd.grad(want, x64, upstream.double())
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), want_grad, rtol=1e-5, atol=1e-6)
