"""Smoke tests of the benchmark machinery (benchmarks/common.py, benchmarks/semicrf.py) on the CPU at tiny sizes.

No timing assertions. The peers' input mappings are checked against the brute-force oracle and a differentiable
brute force written here (they need the bench extra: ``pip install -e '.[bench]'``).
"""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from provable_kernels.semicrf import oracle

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402
from benchmarks import semicrf as bench  # noqa: E402

CPU = torch.device("cpu")
TINY = bench.Shape(2, 6, 3, 2)


def require_peers() -> None:
    missing = [m for m in ("flash_semicrf", "torch_struct") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"{missing} not installed: the benchmark tests need the bench extra (pip install -e '.[bench]')")


def bench_args() -> SimpleNamespace:
    return SimpleNamespace(target_s=0.01, min_reps=1, floors=common.Floors(1e9, "test", 1e-9, "test"))


def brute_force(problem: bench.Problem) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """logZ (B,) by enumeration, written with torch ops so autograd gives the gradients of its sum."""
    leaves = tuple(p.detach().double().clone().requires_grad_() for p in problem.params)
    cum, trans, dur = leaves
    C, K = cum.shape[2], problem.shape.K
    logz = []
    for b, L in enumerate(problem.lengths.tolist()):
        scores = []
        for seg in oracle.segmentations(L, K, C):
            total, prev = cum.new_zeros(()), None
            for s, d, c in seg:
                total = total + cum[b, s + d, c] - cum[b, s, c] + dur[d - 1, c]
                if prev is not None:
                    total = total + trans[prev, c]
                prev = c
            scores.append(total)
        logz.append(torch.logsumexp(torch.stack(scores), 0))
    logz = torch.stack(logz)
    return logz.detach(), torch.autograd.grad(logz.sum(), leaves)


def oracle_logz(problem: bench.Problem, proj_start=None) -> torch.Tensor:
    scored = oracle.all_scores(*problem.params, problem.lengths, problem.shape.K, proj_start=proj_start)
    return torch.tensor(oracle.log_partition(scored), dtype=torch.float64)


@pytest.mark.parametrize("peer", ["flash", "struct"])
def test_peer_timed_path_computes_our_model(peer):
    """The timed call on pre-mapped inputs, with gradients pulled back to our parameters, matches the brute force."""
    require_peers()
    problem = bench.make_problem(TINY, CPU, seed=1).float64()
    want_logz, want_grads = brute_force(problem)
    assert torch.allclose(want_logz, oracle_logz(problem), rtol=1e-12, atol=1e-12)
    entries = bench.bench_impl(bench.PEERS[peer], problem, common.Timer(CPU), common.Deadline(60), bench_args())
    assert [row["pass"] for row, _ in entries] == list(bench.PASSES)
    for row, sample in entries:
        assert row["status"] == "ok" and row["reps"] >= 1 and row["time_ms"] > 0
        torch.testing.assert_close(sample.logz, want_logz, rtol=1e-9, atol=1e-9)
    grads = entries[1][1].grads
    for name, got, want in zip(bench.GRAD_NAMES, grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-9, msg=lambda m: f"{peer} {name}: {m}")


def test_flash_convention_differs_without_the_mapping():
    """flash-semicrf's first segment pays logsumexp_c' transition[c', c]; our model's pays nothing."""
    require_peers()
    problem = bench.make_problem(TINY, CPU, seed=2).float64()
    raw = bench.flash_call(*problem.params, problem.lengths, TINY.K)
    assert (raw - oracle_logz(problem)).abs().min() > 1e-3
    first_pays = torch.zeros(TINY.B, TINY.T, TINY.C, dtype=torch.float64)
    first_pays[:, 0] = torch.logsumexp(problem.transition, dim=0)
    torch.testing.assert_close(raw, oracle_logz(problem, proj_start=first_pays), rtol=1e-10, atol=1e-10)


def test_failures_are_reported_not_dropped(tmp_path):
    problem = bench.make_problem(TINY, CPU, seed=3)

    def boom(*args):
        raise RuntimeError("boom")

    def oom(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")

    identity = bench.OURS.to_inputs
    impls = [bench.Impl("boom", identity, boom), bench.Impl("oom", identity, oom),
             bench.Impl("huge", identity, bench.ours_call, memory_bytes=lambda shape: 1e18)]
    rows = []
    for impl in impls:
        entries = bench.bench_impl(impl, problem, common.Timer(CPU), common.Deadline(60), bench_args())
        assert all(sample is None for _, sample in entries)
        rows += [row for row, _ in entries]
    statuses = {(r["impl"], r["pass"]): r["status"] for r in rows}
    assert statuses[("boom", "fwd")] == statuses[("boom", "fwd+bwd")] == "error: RuntimeError: boom"
    assert statuses[("oom", "fwd")] == statuses[("oom", "fwd+bwd")] == "oom"
    assert statuses[("huge", "fwd")].startswith("skipped: needs ~")
    bench.add_ratios(rows)
    rows[0]["logz_rel_err"] = float("nan")  # strict JSON has no NaN: written as a string
    meta = {"settings": {"shapes": [TINY.label]}}
    bench.report(tmp_path, rows, meta, final=False)
    written = json.loads((tmp_path / "semicrf.json").read_text())["rows"]
    assert {(r["impl"], r["pass"], r["status"]) for r in written} == {(i, p, s) for (i, p), s in statuses.items()}
    assert written[0]["logz_rel_err"] == "nan"
    with open(tmp_path / "semicrf.csv") as f:
        assert len(list(csv.DictReader(f))) == 6


def test_wall_clock_guard():
    timer = common.Timer(CPU)
    spent = common.Deadline(1e-9)
    time.sleep(1e-3)
    assert timer.measure(lambda: None, lambda: None, spent).status == "skipped: wall-clock budget spent"
    m = timer.measure(lambda: None, lambda: time.sleep(0.06), common.Deadline(0.2), min_reps=5)
    assert m.status == "ok" and 1 <= m.reps < 5 and m.median_s >= 0.06
    assert any("wall-clock budget" in note for note in m.notes)
    too_slow = timer.measure(lambda: time.sleep(0.01), lambda: None, common.Deadline(5), scale=1000)
    assert too_slow.status.startswith("skipped: one call would take ~") and too_slow.reps == 0
    part = common.Deadline(100).share(0.25)
    assert 24 < part.remaining() <= 25


def test_floors_pick_the_binding_one():
    floors = common.Floors(copy_bytes_per_s=1e12, copy_method="-", step_s=1e-6, step_method="-")
    assert floors.floor(1e9, 10) == (pytest.approx(1e-3), "bandwidth")
    assert floors.floor(1e3, 10_000) == (pytest.approx(1e-2), "sequential")
    bytes_fwd, steps_fwd = bench.floor_inputs(TINY, "fwd")
    bytes_both, steps_both = bench.floor_inputs(TINY, "fwd+bwd")
    assert steps_both == 2 * steps_fwd == 2 * TINY.T and bytes_both > bytes_fwd


def test_bad_arguments_are_usage_errors():
    with pytest.raises(SystemExit):
        bench.parse_args(["--peers", "flash,nope"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--budget-s", "0", "--device", "cpu"])
    if torch.cuda.is_available():
        assert bench.parse_args([]).device.type == "cuda"
    else:
        with pytest.raises(SystemExit):
            bench.parse_args(["--device", "cuda"])


def test_script_writes_csv_json_and_chart(tmp_path):
    """The script end to end on the CPU (PyTorch route: the Triton interpreter is off in its environment)."""
    require_peers()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "semicrf.py"), "--device", "cpu", "--shapes", "tiny",
           "--out", str(tmp_path), "--target-s", "0.02", "--budget-s", "120"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "floors:" in done.stdout and "semi-CRF partition" in done.stdout

    shapes = [s.label for s in bench.SHAPE_SETS["tiny"]]
    impls = ["ours", "flash-semicrf", "torch-struct"]
    with open(tmp_path / "semicrf.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["shape"], r["impl"], r["pass"]) for r in rows} == {
        (s, i, p) for s in shapes for i in impls for p in bench.PASSES}
    assert all(r["status"] == "ok" and float(r["time_ms"]) > 0 for r in rows)

    report = json.loads((tmp_path / "semicrf.json").read_text())
    assert report["settings"]["shapes"] == shapes and report["device"]["type"] == "cpu"
    assert report["floors"]["copy_bytes_per_s"] > 0 and report["floors"]["step_s"] > 0
    for row in report["rows"]:
        assert row["ref_status"] == "ok" and row["floor_kind"] in ("bandwidth", "sequential")
        assert row["logz_rel_err"] < 1e-6, row
        if row["pass"] == "fwd+bwd":
            assert row["grad_rel_err"] < 1e-5, row
        if row["impl"] == "ours":
            assert row["route"] == {"fwd": "semicrf.torch.log.infer", "fwd+bwd": "semicrf.torch.log.train"}[row["pass"]]
            assert row["ratio"] == 1.0
        else:
            assert row["ratio"] > 0 and not math.isnan(row["ratio"])
    assert len(report["ratios"]) == len(shapes) * 2 * len(bench.PASSES)
    if importlib.util.find_spec("matplotlib") is not None:
        assert report["chart"] == "semicrf_ratios.png" and (tmp_path / "semicrf_ratios.png").stat().st_size > 0
    else:
        assert report["chart"].startswith("no chart")
