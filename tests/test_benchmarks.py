"""The benchmark suite's machinery on the CPU at tiny sizes: family discovery, the results layout (the latest run
per family and device), the floor rule, timing guards and floors, and the semi-CRF peers' input mappings against a
brute force (value and every gradient, pulled back to our parameters: the path the runner times and scores).

No timing assertions. The peers need the bench extra (``pip install -e '.[bench]'``).
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from provable_kernels.semicrf import oracle

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import adapters, common  # noqa: E402
from benchmarks.__main__ import main, pack  # noqa: E402
from benchmarks.adapters import semicrf  # noqa: E402
from benchmarks.runner import FLOOR_MARGIN, below_floor, flag_below_floor, read_results  # noqa: E402

CPU = torch.device("cpu")
TINY = semicrf.Shape(2, 6, 3, 2)


def require_peers() -> None:
    missing = [m for m in ("flash_semicrf", "torch_struct") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"{missing} not installed: the benchmark tests need the bench extra (pip install -e '.[bench]')")


def brute_force(problem: semicrf.Problem) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
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


def oracle_logz(problem: semicrf.Problem, proj_start=None) -> torch.Tensor:
    scored = oracle.all_scores(*problem.params, problem.lengths, problem.shape.K, proj_start=proj_start)
    return torch.tensor(oracle.log_partition(scored), dtype=torch.float64)


@pytest.mark.parametrize("peer", ["flash-semicrf", "torch-struct"])
def test_peer_mapping_and_pullback_compute_our_model(peer):
    """The peer's call on its mapped inputs, and its gradients pulled back to our parameters, match the brute
    force."""
    require_peers()
    config = {"B": TINY.B, "T": TINY.T, "K": TINY.K, "C": TINY.C, "semiring": "Log"}
    problem = semicrf.make_problem(TINY, CPU, seed=1).float64()
    want_logz, want_grads = brute_force(problem)
    assert torch.allclose(want_logz, oracle_logz(problem), rtol=1e-12, atol=1e-12)
    prepared = semicrf.ADAPTER.impl(peer).prepare(problem, config)
    args = list(prepared.args)
    leaves = [args[i].detach().requires_grad_() for i in prepared.differentiable]
    for i, leaf in zip(prepared.differentiable, leaves):
        args[i] = leaf
    logz = prepared.call(*args)
    torch.testing.assert_close(logz.detach(), want_logz, rtol=1e-9, atol=1e-9)
    grads = prepared.pullback(torch.autograd.grad(logz.sum(), leaves))
    for name, got, want in zip(("cum_scores", "transition", "duration_bias"), grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-9, msg=lambda m: f"{peer} {name}: {m}")


def test_flash_convention_differs_without_the_mapping():
    """flash-semicrf's first segment pays logsumexp_c' transition[c', c]; our model's pays nothing."""
    require_peers()
    from flash_semicrf.streaming import semi_crf_streaming_forward as flash_forward

    problem = semicrf.make_problem(TINY, CPU, seed=2).float64()
    raw = flash_forward(*problem.params, problem.lengths, TINY.K)
    assert (raw - oracle_logz(problem)).abs().min() > 1e-3
    first_pays = torch.zeros(TINY.B, TINY.T, TINY.C, dtype=torch.float64)
    first_pays[:, 0] = torch.logsumexp(problem.transition, dim=0)
    torch.testing.assert_close(raw, oracle_logz(problem, proj_start=first_pays), rtol=1e-10, atol=1e-10)


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


def test_floors_pick_the_binding_one():
    floors = common.Floors(copy_bytes_per_s=1e12, copy_method="-", step_s=1e-6, step_method="-")
    assert floors.floor(1e9, 10) == (pytest.approx(1e-3), "bandwidth")
    assert floors.floor(1e3, 10_000) == (pytest.approx(1e-2), "sequential")
    config = {"B": TINY.B, "T": TINY.T, "K": TINY.K, "C": TINY.C, "semiring": "Log"}
    bytes_fwd, steps_fwd = semicrf.floor(config, "forward")
    bytes_both, steps_both = semicrf.floor(config, "both")
    # fp32 inputs (B*(T+1)*C + C*C + K*C values) and int64 lengths + an int32 per sequence read; gradients written
    inputs = 4 * (2 * 7 * 2 + 2 * 2 + 3 * 2)
    assert bytes_fwd == inputs + 12 * 2 and bytes_both == bytes_fwd + inputs
    assert steps_both == 2 * steps_fwd == 2 * TINY.T


# ------------------------------------------------------------------------------------------------ discovery


def test_families_are_the_adapter_modules_of_the_package():
    """Every public module or package in benchmarks/adapters/ is a family, and there is no list to edit."""
    folder = ROOT / "benchmarks" / "adapters"
    on_disk = sorted({p.stem for p in folder.glob("*.py") if not p.name.startswith("_")}
                     | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()})
    assert list(adapters.families()) == on_disk and {"semicrf", "sinkhorn", "segment"} <= set(on_disk)
    for family in on_disk:
        assert adapters.load(family).name == family
    assert not hasattr(adapters, "FAMILIES")
    with pytest.raises(ValueError, match="family must be one of"):
        adapters.load("nope")


def test_a_new_adapter_module_is_discovered(tmp_path, monkeypatch):
    """A module dropped into the adapters package becomes a family of every phase (the run command's choices)."""
    monkeypatch.setattr(adapters, "__path__", [str(ROOT / "benchmarks" / "adapters"), str(tmp_path)])
    (tmp_path / "probe.py").write_text("from benchmarks.adapters.sinkhorn import ADAPTER as _A\n"
                                       "import dataclasses\nADAPTER = dataclasses.replace(_A, name='probe')\n")
    assert "probe" in adapters.families() and not (ROOT / "benchmarks" / "adapters" / "probe.py").exists()
    assert adapters.load("probe").name == "probe"
    sys.modules.pop("benchmarks.adapters.probe", None)


def test_gpu_session_names_no_family():
    """gpu_session.sh loops over the discovered families; no family is named in it."""
    script = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    for family in adapters.families():
        assert not re.search(rf"\b{family}\b", script), family
    assert "adapters.families()" in script
    done = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_session.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------- results layout


def test_device_slug_and_run_dir():
    assert common.device_slug({"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}) == "nvidia-h100-80gb-hbm3"
    assert common.device_slug({"type": "cuda", "name": "NVIDIA H200"}) == "nvidia-h200"
    assert common.device_slug({"type": "cpu", "name": "x86_64"}) == "cpu-x86-64"
    for bad in ({}, {"type": "cuda"}, "NVIDIA H200"):
        with pytest.raises(ValueError, match="identity"):
            common.device_slug(bad)
    slug = common.device_slug(common.device_identity(CPU))
    assert common.run_dir(Path("r"), "segment", CPU) == Path("r") / "segment" / slug
    with pytest.raises(ValueError, match="family"):
        common.run_dir(Path("r"), "a/b", CPU)


def test_committed_results_keep_the_latest_run_per_family_and_device():
    """benchmarks/results/ holds only <family>/<device slug>/ folders of discovered families, each with the files a
    phase writes (one run per family and device: a new run replaces them)."""
    results = ROOT / "benchmarks" / "results"
    known = {"benchmark_full.csv", "benchmark_full.json", "heatmap_data.json", "memory_breakdown.csv", "plots",
             "overhead.json", "breakdown.json", "checks.json"}
    assert {p.name for p in results.iterdir()} <= set(adapters.families())
    for family in results.iterdir():
        for device in family.iterdir():
            assert device.is_dir() and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", device.name), device
            assert {p.name for p in device.iterdir()} <= known, device
            for name in ("benchmark_full.json", "overhead.json", "breakdown.json", "checks.json"):
                if (device / name).exists():
                    run = json.loads((device / name).read_text())
                    identity = run.get("device") or run["environment"]["device"]
                    assert common.device_slug(identity) == device.name, (device, name)


def test_a_new_run_replaces_the_devices_results(tmp_path):
    """``run`` writes to results/<family>/<device slug>/ by default; a second run of the same family on the same
    device replaces the first (one CSV, the second run's rows, the first run's plots gone), and ``pack`` carries
    that layout."""
    out = tmp_path / "results"
    stale_plot = common.run_dir(out, "semicrf", CPU) / "plots" / "time_vs_T.png"
    for T in ("4", "3"):
        assert main(["run", "--family", "semicrf", "--device", "cpu", "--B", "1", "--T", T, "--K", "2", "--C", "2",
                     "--backends", "torch", "--phases", "forward", "--repeats", "1", "--target-s", "0.005",
                     "--output-dir", str(common.run_dir(out, "semicrf", CPU)), "--no-progress"]) == 0
        assert not stale_plot.exists()  # the previous run's analysis went with it
        stale_plot.parent.mkdir(exist_ok=True)
        stale_plot.write_bytes(b"a plot of the run at T = 4")
    runs = list(out.glob("*/*/benchmark_full.csv"))
    assert runs == [common.run_dir(out, "semicrf", CPU) / "benchmark_full.csv"]
    assert [r["T"] for r in read_results(runs[0])] == ["3"]
    import tarfile

    pack(out, tmp_path / "a.tar.gz")
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        assert f"semicrf/{runs[0].parent.name}/benchmark_full.csv" in tar.getnames()


# ----------------------------------------------------------------------------------------------- floor rule


def test_a_time_below_the_floor_is_invalid_not_a_speedup(tmp_path):
    """A fake result 10x faster than the copy-bandwidth floor is flagged invalid, enters no ratio, and the
    analysis lists it; a time at the floor within the margin stays ok."""
    floor_ms = 1.0
    fast = {"config": "c", "impl": "fake", "phase": "forward", "status": "ok", "time_ms": "0.1",
            "floor_ms": str(floor_ms), "floor_kind": "bandwidth"}
    near = {**fast, "impl": "near", "time_ms": str(floor_ms / (FLOOR_MARGIN * 1.01))}
    at_margin = {**fast, "impl": "edge", "time_ms": str(floor_ms / FLOOR_MARGIN * 1.001)}
    assert "below the bandwidth floor 1 ms (10x)" in below_floor(fast)
    assert below_floor(near) is not None and below_floor(at_margin) is None
    flagged = flag_below_floor([fast, at_margin, {**fast, "status": "oom"}])
    assert flagged[0]["status"].startswith("invalid: median 0.1 ms is below the bandwidth floor")
    assert flagged[1]["status"] == "ok" and flagged[2]["status"] == "oom" and fast["status"] == "ok"
    assert below_floor({**fast, "floor_ms": ""}) is None and below_floor({**fast, "time_ms": None}) is None
    with pytest.raises(TypeError, match="row"):
        below_floor(["not", "a", "row"])


def test_the_committed_semicrf_backward_that_skips_its_recursion_is_invalid():
    """The committed H200 run times the Triton route's ``backward`` phase, which only scales gradients saved by
    the forward: its medians lie below the T-step sequential floor, and the rule flags them (the run's own
    ``both`` rows, which do the work, stay ok)."""
    csv_path = ROOT / "benchmarks" / "results" / "semicrf" / "nvidia-h200" / "benchmark_full.csv"
    rows = read_results(csv_path)
    invalid = {(r["config"], r["phase"]) for r in rows if r["impl"] == "triton" and r["status"].startswith("invalid")}
    assert invalid and {phase for _, phase in invalid} == {"backward"}
    for r in rows:
        if r["impl"] == "triton" and r["phase"] == "both":
            assert r["status"] == "ok", r




# ------------------------------------------------------------------------------------------------- checks


def test_check_phase_records_verdicts_and_skips_gpu_checks_on_the_cpu(tmp_path, monkeypatch):
    """``python -m benchmarks check``: each check's rows and verdict go to <family>/<device slug>/checks.json; a
    failed row or an exception fails the phase (exit 1) without stopping the other checks; a check that needs
    CUDA is recorded as skipped on the CPU."""
    import dataclasses

    def passing(out, device, budget_s):
        out.record(True, {"case": "fine", "device": device.type})

    def failing(out, device, budget_s):
        out.record(True, {"case": "fine"})
        out.record(False, {"case": "off by 1e-3"})

    def raising(out, device, budget_s):
        raise RuntimeError("kaput")

    checks = (adapters.Check("passing", passing, cpu=True), adapters.Check("failing", failing, cpu=True),
              adapters.Check("raising", raising, cpu=True), adapters.Check("gpu-only", passing))
    fake = dataclasses.replace(adapters.load("sinkhorn"), checks=checks)
    monkeypatch.setattr(adapters, "load", lambda family: fake)
    assert main(["check", "--out", str(tmp_path), "--families", "sinkhorn"]) == 1
    report = json.loads((common.run_dir(tmp_path, "sinkhorn", CPU) / "checks.json").read_text())
    results = report["checks"]
    assert results["passing"]["passed"] is True and results["passing"]["rows"] == [
        {"case": "fine", "device": "cpu", "ok": True}]
    assert results["failing"]["passed"] is False and [r["ok"] for r in results["failing"]["rows"]] == [True, False]
    assert results["raising"] == {"passed": False, "status": "error: RuntimeError: kaput"}
    assert results["gpu-only"] == {"passed": None, "status": "skipped: needs CUDA"}
    assert report["device"]["type"] == "cpu" and report["smoke_only"] is True
    assert main(["check", "--out", str(tmp_path), "--families", "sinkhorn", "--only", "passing"]) == 0
    with pytest.raises(SystemExit):
        main(["check", "--out", str(tmp_path), "--families", "nope"])


def test_a_check_without_rows_does_not_pass():
    evidence = adapters.Evidence()
    assert evidence.passed is False
    evidence.record(1, {"a": 1})
    assert evidence.passed is True and evidence.rows == [{"a": 1, "ok": True}]
    with pytest.raises(TypeError, match="row"):
        evidence.record(True, "not a dict")


def test_a_ported_gpu_check_runs_under_the_interpreter():
    """The semi-CRF ``mixed`` check (moved from the earlier training script) on the CPU, Triton kernels
    interpreted: bf16/fp16/fp32 arguments give a float32 logZ equal to the float32 run and per-argument gradient
    dtypes. (On a GPU, ``python -m benchmarks check`` runs it with the others.)"""
    mixed = next(c for c in adapters.load("semicrf").checks if c.name == "mixed")
    result = mixed.run(CPU, 60)
    assert result["passed"] is True, result
    assert result["rows"][0]["grad_dtypes"] == ["torch.bfloat16", "torch.float16", "torch.float32", "torch.bfloat16",
                                                "torch.float16"]


def test_the_semicrf_gpu_checks_reach_the_apis_they_use():
    """The pieces the GPU-only semi-CRF checks call (the precision comparison against float64, a prebuilt call's
    Viterbi and max partition on both backends, the forward chains the host-stage check times), on a tiny CPU
    problem: an API they use that moves fails here, not only on the GPU."""
    from provable_kernels.semicrf import torch_ops, triton_ops

    from benchmarks.adapters.semicrf import checks

    evidence = adapters.Evidence()
    checks.against_float64(evidence, checks.model(2, 6, 3, 2, CPU, proj=True, trans3d=True), {"case": "tiny"})
    assert evidence.passed and evidence.rows[0]["logZ_rel"] <= checks.LOGZ_TOL, evidence.rows
    args = checks.model(2, 6, 3, 2, CPU, dtype=torch.float64)
    got, want = triton_ops.viterbi(checks.call_of(args, "max", "viterbi")), torch_ops.viterbi(
        checks.call_of(args, "max", "viterbi"))
    assert torch.equal(got.labels, want.labels) and torch.equal(got.durations, want.durations)
    best = triton_ops.partition(checks.call_of(args, "max", "partition"))
    torch.testing.assert_close(best, want.scores, rtol=0, atol=1e-12)
    call = checks.call_of(checks.model(2, 6, 3, 2, CPU, variable=False), "log", "partition")
    plan = triton_ops._plan(call)
    assert triton_ops.partition_runner(plan, True, torch.float64)(*plan.inputs()).shape == (2,)
    assert triton_ops.train_forward(call) is not None


def test_gpu_session_refuses_to_run_without_the_commit_it_stamps():
    """Results and records are stamped with SENTINEL_COMMIT: without it the session stops at once (usage error)."""
    # no PATH: should the check ever be lost, the script finds no program to install or run anything with
    done = subprocess.run(["/bin/bash", str(ROOT / "benchmarks" / "gpu_session.sh"), "overhead"], capture_output=True,
                          text=True, env={"PATH": "/nonexistent", "OUT": "/nonexistent"})
    assert done.returncode == 2 and "SENTINEL_COMMIT must name the commit" in done.stderr
