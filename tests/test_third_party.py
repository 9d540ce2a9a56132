"""The two third-party families of ``examples/third_party`` (``traces/guide/third-party.md``), found through
``SENTINEL_FAMILY_PATH``: what ``sentinel verify --quick`` reports for them on the CPU, as the guide states it.

- ``torch.segment_reduce``: sum passes its float64 reference; max and min give each tied row the whole gradient
  when the upstream gradient is negative (the property's minimal example: one segment of two rows, upstream -1);
  wrong arguments raise ``RuntimeError`` without naming the argument, and offsets ending past the last row are
  accepted (the forward reads past ``x``; the backward corrupts the heap, which kills its process).
- Liger-Kernel's mHC Sinkhorn under the Triton interpreter: the float64 reference holds at n = 4, n = 12 does not
  compile (``arange``'s range must be a power of two), and ``iters = 0`` is accepted (with the stored history the
  forward then writes outside it).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "third_party"


def verify(tmp_path: Path, family: str, dtype: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``sentinel verify --family FAMILY --quick --dtype DTYPE --jobs 2`` from a scratch directory: the checks of
    each row by route id and check name."""
    report = tmp_path / f"{family}.json"
    env = {**os.environ, "SENTINEL_FAMILY_PATH": str(EXAMPLES)}
    done = subprocess.run([sys.executable, "-m", "kernel_sentinel", "verify", "--family", family, "--quick",
                           "--dtype", dtype, "--jobs", "2", "--json", str(report)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert report.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(report.read_text())["routes"]
    return done, {r["id"]: {c["name"]: c for c in r["checks"]} for r in rows}


def test_torch_segment_reduce_ties_and_offsets(tmp_path):
    done, rows = verify(tmp_path, "torch_segment", "float64")
    assert done.returncode == 1
    assert set(rows) == {"torch_segment.torch.sum", "torch_segment.torch.max", "torch_segment.torch.min"}
    assert rows["torch_segment.torch.sum"]["reference"]["status"] == "pass"
    for extreme in ("max", "min"):
        checks = rows[f"torch_segment.torch.{extreme}"]
        assert checks["reference"]["status"] == "fail" and "grad_x" in checks["reference"]["detail"]
        assert checks["exact"]["status"] == "pass"  # the values are right: only the gradient of ties is wrong
        assert checks["properties"]["status"] == "fail"
        assert "upstream -1" in checks["properties"]["detail"] and "'lengths': (2,)" in checks["properties"]["detail"]
    details = [checks["bad_input"]["detail"] for checks in rows.values()]
    assert all(checks["bad_input"]["status"] == "fail" for checks in rows.values())
    # each route's bad inputs: a RuntimeError that names no argument, or the process killed by the heap corruption
    # that offsets past the last row leave (where it aborts varies); the crash fails that check alone
    assert all("RuntimeError" in d or "worker process died (exit code -6 (SIGABRT))" in d for d in details), details


def test_liger_mhc_sinkhorn_under_the_interpreter(tmp_path):
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.fail("liger-kernel is not installed: this test needs the bench extra (pip install -e '.[bench]')")
    done, rows = verify(tmp_path, "liger_mhc", "float32")
    assert done.returncode == 1
    assert set(rows) == {"liger_mhc.liger.recompute", "liger_mhc.liger.history"}
    recompute = rows["liger_mhc.liger.recompute"]
    assert recompute["reference"]["status"] == recompute["exact"]["status"] == "pass"
    assert recompute["guards"]["status"] == "fail" and "power of 2" in recompute["guards"]["detail"]
    assert "iters (0 (below 1)): accepted without error" in recompute["bad_input"]["detail"]
    history = rows["liger_mhc.liger.history"]
    assert history["reference"]["status"] == "pass"
    assert history["bad_input"]["status"] == "fail"
