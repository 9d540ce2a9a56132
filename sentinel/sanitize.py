"""``sentinel verify --sanitize``: every Triton route's cases under NVIDIA compute-sanitizer (GPU only).

Each tool of :data:`TOOLS` is a separate check of the route: ``memcheck`` (out-of-bounds and misaligned
accesses), ``racecheck`` (shared-memory hazards), ``initcheck`` (reads of uninitialised global memory),
``synccheck`` (invalid barrier use). A check runs ``compute-sanitizer --tool <tool>`` over a fresh
``python -m kernel_sentinel.sanitize`` process that runs the route's cases (the ``tiny`` and ``small`` sizes, or
``tiny`` only with ``--quick``) at one dtype, forward and backward, on the GPU (with ``--devices``, the one GPU
its ``CUDA_VISIBLE_DEVICES`` shows it); it passes when the tool reports no error and the process exits 0. PyTorch's caching allocator is switched off in that process
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) so that an out-of-bounds access cannot land in another tensor's block
unseen. The tool's findings (its ``=========`` lines, first ones first) are the check's detail.

A Triton route is one whose id names the ``triton`` backend (``<family>.triton.<variant>``, the route id
convention). Without a CUDA GPU or without ``compute-sanitizer`` (on ``PATH`` or in ``$CUDA_HOME/bin``) the
option is a usage error: it never passes silently.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
ERROR_EXIT = 86  # the exit code compute-sanitizer is told to use when it found an error
TIME_LIMIT = 600.0  # seconds per tool and route
SHOWN_FINDINGS = 6
_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
# racecheck ends with its own summary instead; a hazard it calls a warning counts as a finding too.
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_HEADER = re.compile(r"^=+ (COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Program hit|\s*$)")


def is_triton_route(route_id: str) -> bool:
    """True for ``<family>.triton.<variant>`` route ids."""
    parts = route_id.split(".")
    return len(parts) > 2 and parts[1] == "triton"


def find_tool() -> Optional[Path]:
    """The ``compute-sanitizer`` executable, or None."""
    found = shutil.which("compute-sanitizer")
    if found:
        return Path(found)
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = Path(home) / "bin" / "compute-sanitizer"
    return candidate if candidate.is_file() else None


def unavailable(device_type: str) -> Optional[str]:
    """Why ``--sanitize`` cannot run here (None when it can): it needs the verify device to be a CUDA GPU and the
    compute-sanitizer executable."""
    import torch

    if device_type != "cuda" or not torch.cuda.is_available():
        return ("--sanitize runs compute-sanitizer on a CUDA GPU; this run has no GPU (use --device cuda on a GPU "
                "machine)")
    if find_tool() is None:
        return ("--sanitize needs NVIDIA compute-sanitizer (part of the CUDA toolkit): not on PATH nor in "
                "$CUDA_HOME/bin")
    return None


def findings(output: str) -> tuple[int, list[str]]:
    """The error count of the tool's summary (-1 when it printed none) and its finding lines. The summary is
    ``ERROR SUMMARY: N errors``, or for racecheck ``RACECHECK SUMMARY: H hazards displayed (E errors, W
    warnings)``, counted as E + W."""
    counts = [int(n) for n in _SUMMARY.findall(output)]
    counts += [int(e) + int(w) for e, w in _RACE_SUMMARY.findall(output)]
    lines = [line.strip("= ").strip() for line in output.splitlines()
             if line.startswith("=========") and not _HEADER.match(line)]
    return (sum(counts) if counts else -1), [line for line in lines if line]


def command(tool: str, family: str, route_id: str, dtype: str, seed: int, quick: bool) -> list[str]:
    """The compute-sanitizer command line that runs one route's cases with ``tool``."""
    inner = [sys.executable, "-m", "kernel_sentinel.sanitize", "--family", family, "--route", route_id,
             "--dtype", dtype, "--seed", str(seed)] + (["--quick"] if quick else [])
    return [str(find_tool() or "compute-sanitizer"), "--tool", tool, "--error-exitcode", str(ERROR_EXIT),
            "--print-limit", "100", *inner]


def verdict(tool: str, returncode: int, output: str) -> tuple[bool, str]:
    """Pass/fail and the detail of one tool's run."""
    errors, found = findings(output)
    shown = "; ".join(found[:SHOWN_FINDINGS]) + (f"; ... {len(found) - SHOWN_FINDINGS} more"
                                                  if len(found) > SHOWN_FINDINGS else "")
    if returncode == 0 and errors == 0:
        return True, f"{tool}: 0 errors"
    if errors > 0 or returncode == ERROR_EXIT:
        what = "hazards (errors and warnings)" if tool == "racecheck" else "errors"
        return False, f"{tool}: {max(errors, 1)} {what}: {shown or 'see the tool output'}"
    tail = " ".join(output.strip().splitlines()[-3:])[-400:]
    return False, f"{tool}: the route's process failed (exit {returncode}): {shown or tail}"


def sanitize_route(family: str, route_id: str, dtype: str, seed: int, quick: bool, repro: str,
                   tools: Sequence[str] = TOOLS, visible: Optional[str] = None) -> list:
    """One :class:`~kernel_sentinel.records.CheckResult` per tool for one Triton route at ``dtype``; ``visible``:
    the ``CUDA_VISIBLE_DEVICES`` of the route's process (the one GPU it runs on; None: this process's)."""
    from kernel_sentinel.records import CheckResult

    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    env.pop("TRITON_INTERPRET", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    results = []
    for tool in tools:
        start = time.perf_counter()
        try:
            done = subprocess.run(command(tool, family, route_id, dtype, seed, quick), env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIME_LIMIT)
            passed, detail = verdict(tool, done.returncode, done.stdout)
        except subprocess.TimeoutExpired:
            passed, detail = False, f"{tool}: ran past {TIME_LIMIT:.0f} s"
        results.append(CheckResult(tool, passed, detail, f"{repro} --sanitize", seconds=time.perf_counter() - start))
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The process compute-sanitizer watches: run one route's cases on the GPU, forward and backward."""
    parser = argparse.ArgumentParser(prog="python -m kernel_sentinel.sanitize")
    parser.add_argument("--family", required=True)
    parser.add_argument("--route", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)

    import torch

    from kernel_sentinel import registry
    from kernel_sentinel.checks import run_route

    (family,) = registry.select([args.family])
    dtype = getattr(torch, args.dtype)
    for size in ("tiny",) if args.quick else ("tiny", "small"):
        case = family.make_case(args.route, size=size, dtype=dtype, device=torch.device("cuda"), seed=args.seed)
        run_route(family.run, case)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
