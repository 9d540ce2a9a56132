"""What a public call costs, host time included: ``python -m benchmarks overhead --out DIR``.

For every family, at its adapter's ``overhead_shapes`` (a launch-bound shape first, then the headline shape): the
wall time per public call (``--calls`` calls back to back, fewer for slow calls, synchronised at the end, median
of ``--repeats`` such loops) for the forward (no autograd) and a training step (forward + backward for a fixed upstream gradient), the
same for the adapter's ``peer`` and for a trivial torch op (``z.add(1)`` on 16 floats) in the same process, and the
CUDA launches per call (kernels, copies and memsets in ``torch.profiler``). Host speed differs from one machine to
the next; the ratios to the trivial op do not: the targets are forward <= 2.5x and forward+backward <= 6x. The
first call of each family (fresh Triton cache: compilation included) is reported as ``first_call_s``.

Writes DIR/overhead.json and prints a table. Without CUDA it runs on the CPU (the PyTorch routes): a smoke check of
the script, not a measurement.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from benchmarks import adapters
from benchmarks.common import device_launches, environment, print_table, write_json

TARGETS = {"forward": 2.5, "both": 6.0}  # wall per call / trivial op's
COLUMNS = [("family", "family", ""), ("config", "shape", ""), ("impl", "impl", ""),
           ("forward_us", "fwd us", ".1f"), ("forward_x_trivial", "fwd / trivial", ".2f"),
           ("both_us", "fwd+bwd us", ".1f"), ("both_x_trivial", "fwd+bwd / trivial", ".2f"),
           ("forward_launches", "fwd launches", ""), ("both_launches", "fwd+bwd launches", "")]


LOOP_S = 0.1  # a timed loop holds fewer than --calls calls when they would take longer than this


def wall_us(fn: Callable[[], Any], calls: int, repeats: int, device: torch.device) -> float:
    """Median over ``repeats`` loops of back-to-back calls (``calls``, or as many as fill ``LOOP_S``, at least 3)
    of the wall time per call, in microseconds."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    calls = max(3, min(calls, int(LOOP_S / max(time.perf_counter() - start, 1e-9))))
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def calls_of(adapter: adapters.Adapter, impl: adapters.Impl, config: dict,
             device: torch.device) -> tuple[Callable[[], Any], Optional[Callable[[], Any]]]:
    """The forward (no autograd) and the training step (forward + backward) of ``impl`` at ``config``."""
    prepared = impl.prepare(adapter.build(config, device, 0), config)
    args = list(prepared.args)

    def forward() -> Any:
        with torch.no_grad():
            return prepared.call(*args)

    if not prepared.differentiable or impl.no_gradient(config):
        return forward, None
    leaves = list(args)
    for i in prepared.differentiable:
        leaves[i] = args[i].detach().requires_grad_()
    wrt = [leaves[i] for i in prepared.differentiable]
    upstream = torch.ones_like(forward())

    def both() -> Any:
        return torch.autograd.grad(prepared.call(*leaves), wrt, upstream)

    return forward, both


def measure_family(adapter: adapters.Adapter, device: torch.device, calls: int, repeats: int,
                   trivial_us: float) -> list[dict]:
    rows = []
    for n, config in enumerate(adapter.overhead_shapes):
        for impl in (next(i for i in adapter.impls if i.ours), adapter.impl(adapter.peer)):
            why = impl.unavailable(device) or impl.unsupported(config)
            row = dict(family=adapter.name, config=adapter.label(config), impl=impl.name)
            if why:
                rows.append({**row, "skipped": why})
                continue
            started = time.perf_counter()
            forward, both = calls_of(adapter, impl, config, device)
            if both is not None:
                both()
            if n == 0 and impl.ours:
                row["first_call_s"] = time.perf_counter() - started
            row["forward_us"] = wall_us(forward, calls, repeats, device)
            row["forward_x_trivial"] = row["forward_us"] / trivial_us
            if both is not None:
                row["both_us"] = wall_us(both, calls, repeats, device)
                row["both_x_trivial"] = row["both_us"] / trivial_us
            if device.type == "cuda":
                row["forward_launches"] = device_launches(forward)
                row["both_launches"] = None if both is None else device_launches(both)
            rows.append(row)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="directory for overhead.json")
    parser.add_argument("--families", default=",".join(adapters.FAMILIES))
    parser.add_argument("--calls", type=int, default=None, help="calls per timed loop (CUDA 300, CPU 3)")
    parser.add_argument("--repeats", type=int, default=None, help="timed loops (CUDA 5, CPU 1)")


def run(opts: argparse.Namespace) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    calls, repeats = opts.calls or (300 if cuda else 3), opts.repeats or (5 if cuda else 1)
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="overhead-triton-"))  # first call compiles
    z = torch.zeros(16, device=device)
    trivial_us = wall_us(lambda: z.add(1), calls, repeats, device)
    rows = [dict(family="-", config="16 floats", impl="z.add(1)", forward_us=trivial_us, forward_x_trivial=1.0,
                 forward_launches=device_launches(lambda: z.add(1)) if cuda else None)]
    for family in opts.families.split(","):
        rows += measure_family(adapters.load(family), device, calls, repeats, trivial_us)
    opts.out.mkdir(parents=True, exist_ok=True)
    write_json(opts.out / "overhead.json", dict(environment=environment(device), calls=calls, repeats=repeats,
                                                 smoke_only=not cuda, targets_x_trivial=TARGETS, rows=rows))
    print_table(f"public calls against z.add(1) ({device.type}{'' if cuda else ': smoke check'})", rows, COLUMNS)
    return 0
