"""``sentinel verify --sanitize`` without a GPU: a usage error, never a silent pass; the parsing of the tool's output
and the command it runs (the GPU path itself runs on the lead's GPU machine)."""
from __future__ import annotations

import sys

import pytest
import torch

from kernel_sentinel import sanitize

MEMCHECK_OUTPUT = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at 0x1a0 in _semicrf_forward_kernel
=========     by thread (3,0,0) in block (1,0,0)
=========     Address 0x7f3a00000410 is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""
CLEAN_OUTPUT = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
# racecheck's own summary, as compute-sanitizer printed it on an H100 (CUDA 13.0) for a clean Sinkhorn route
CLEAN_RACECHECK = ("========= COMPUTE-SANITIZER\n"
                   "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
# a hazard in racecheck's format (constructed: no route of ours has shown one)
RACECHECK_OUTPUT = """\
========= COMPUTE-SANITIZER
========= Warning: (Warp Level Programming) Potential RAW hazard detected at __shared__ 0x10 in block (0,0,0) :
=========     Write Thread (1,0,0) at 0x2b0 in _sinkhorn_kernel
=========     Read Thread (0,0,0) at 0x2d0 in _sinkhorn_kernel
=========
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""


def test_triton_routes_are_named_by_backend():
    assert sanitize.is_triton_route("semicrf.triton.log.train")
    assert not sanitize.is_triton_route("semicrf.torch.log.train")
    assert not sanitize.is_triton_route("triton.x")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU behaviour; a GPU machine runs the tool")
def test_without_a_gpu_sanitize_is_unavailable_with_the_reason():
    reason = sanitize.unavailable("cpu")
    assert reason is not None and "no GPU" in reason


def test_without_the_tool_sanitize_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert sanitize.find_tool() is None
    assert "compute-sanitizer" in sanitize.unavailable("cuda")


def test_findings_and_verdicts():
    assert sanitize.findings(CLEAN_OUTPUT) == (0, [])
    errors, lines = sanitize.findings(MEMCHECK_OUTPUT)
    assert errors == 1 and lines[0] == "Invalid __global__ read of size 4 bytes" and len(lines) == 4
    assert sanitize.verdict("memcheck", 0, CLEAN_OUTPUT) == (True, "memcheck: 0 errors")
    passed, detail = sanitize.verdict("memcheck", sanitize.ERROR_EXIT, MEMCHECK_OUTPUT)
    assert not passed and detail.startswith("memcheck: 1 errors: Invalid __global__ read of size 4 bytes; at 0x1a0")
    passed, detail = sanitize.verdict("racecheck", 1, "Traceback ...\nRuntimeError: boom\n")
    assert not passed and "process failed (exit 1)" in detail and "RuntimeError: boom" in detail
    assert not sanitize.verdict("initcheck", 0, "no summary at all")[0]  # no summary: never a pass


def test_racecheck_summary_counts_errors_and_warnings():
    assert sanitize.findings(CLEAN_RACECHECK) == (0, [])
    assert sanitize.verdict("racecheck", 0, CLEAN_RACECHECK) == (True, "racecheck: 0 errors")
    errors, lines = sanitize.findings(RACECHECK_OUTPUT)
    assert errors == 1 and lines[0].startswith("Warning: (Warp Level Programming) Potential RAW hazard")
    passed, detail = sanitize.verdict("racecheck", sanitize.ERROR_EXIT, RACECHECK_OUTPUT)
    assert not passed and detail.startswith("racecheck: 1 hazards (errors and warnings): Warning: (Warp Level")


def test_command_runs_the_route_process_under_each_tool():
    cmd = sanitize.command("racecheck", "semicrf", "semicrf.triton.log.train", "float32", 0, True)
    assert cmd[1:5] == ["--tool", "racecheck", "--error-exitcode", str(sanitize.ERROR_EXIT)]
    inner = cmd[cmd.index(sys.executable):]
    assert inner[1:3] == ["-m", "kernel_sentinel.sanitize"] and inner[-1] == "--quick"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU behaviour; a GPU machine runs the tool")
def test_verify_sanitize_without_a_gpu_is_a_usage_error(capsys):
    from kernel_sentinel.cli import main

    assert main(["verify", "--sanitize", "--family", "semicrf", "--route", "semicrf.triton.log.infer"]) == 2
    assert "--sanitize runs compute-sanitizer on a CUDA GPU" in capsys.readouterr().err
