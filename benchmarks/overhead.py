"""What a public call costs and where its time goes: ``python -m benchmarks overhead`` and ``... breakdown``.

``overhead``: for every family, at its adapter's ``overhead_shapes`` (a launch-bound shape first, then the headline
shape): the wall time per public call (``--calls`` calls back to back, fewer for slow calls, synchronised at the
end, median of ``--repeats`` such loops) for the forward (no autograd) and a training step (forward + backward for a
fixed upstream gradient), the same for the adapter's ``peer`` and for a trivial torch op (``z.add(1)`` on 16
floats) in the same process, and the CUDA launches per call (kernels, copies and memsets in ``torch.profiler``).
Host speed differs from one machine to the next; the ratios to the trivial op do not: the targets are forward <=
2.5x and forward+backward <= 6x. The trivial op's own training step (``torch.autograd.grad(zg * 2, zg, w)``, one
multiply and its backward) is measured too, ``both_x_trivial_step`` = forward+backward / that: autograd's engine
alone (its device thread, the graph) costs 8-14x ``z.add(1)`` on the lent H100 hosts, so no differentiable op
meets 6x, and this ratio says what a call adds over the engine. ``forward_x_trivial``, ``both_x_trivial_step`` and
``host_x_trivial`` are medians of per-repeat ratios, the trivial op's loop timed right before the call's
(:func:`paired_us`: the host's speed drifts within a run on a shared machine); ``both_x_trivial`` divides by the
trivial op's time from the start of the run. ``kernel_us``: the forward captured in a CUDA graph and replayed
(``triton.testing.do_bench_cudagraph``, median: no host work; None where the call cannot be captured, e.g. a host
sync; the reason is recorded). ``host_us``: the forward's host time, the GPU held busy by a sleep kernel so that
the calls only queue work (``host_x_trivial`` against the trivial op's, measured the same way; None with a
``host_note`` for a call that waits for the GPU): the wall time per call is about the larger of the two, so a
host time below the kernel's hides under it. The first call of each family (fresh Triton cache: compilation
included) is ``first_call_s``.

``breakdown``: for every family, this project's first implementation at the adapter's anchors and its launch-bound
overhead shape, forward and forward+backward: warm-up calls, the mean wall time per call (synchronised, ``REPS``
calls), then ``REPS`` calls under ``torch.profiler``: each CUDA kernel's mean device time per call, their sum, and
the hardware floor of the benchmark (``Adapter.floor`` with the floors measured in the same run). The gap between
wall time and the kernels' sum is host time the GPU waited on (validation, dispatch, launches). Kernels summing
to less than the floor are flagged ``invalid`` by the runner's rule (``runner.below_floor``).

Each family's report goes to ``OUT/<family>/<device slug>/overhead.json`` (``breakdown.json``), the layout of
``benchmarks/results/``. Without CUDA ``overhead`` runs on the CPU (the PyTorch routes): a smoke check, not a
measurement; ``breakdown`` needs CUDA.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable, Optional

import torch

from benchmarks import adapters
from benchmarks.common import (Deadline, Timer, device_launches, environment, failure_status, measure_floors,
                               print_table, release_memory, run_dir, write_json)
from benchmarks.runner import below_floor

TARGETS = {"forward": 2.5, "both": 6.0}  # forward / the trivial op's; forward+backward / the trivial op's training step
COLUMNS = [("family", "family", ""), ("config", "shape", ""), ("impl", "impl", ""),
           ("forward_us", "fwd us", ".1f"), ("forward_x_trivial", "fwd / trivial", ".2f"),
           ("both_us", "fwd+bwd us", ".1f"), ("both_x_trivial", "fwd+bwd / trivial", ".2f"),
           ("both_x_trivial_step", "fwd+bwd / trivial step", ".2f"),
           ("kernel_us", "kernel us", ".1f"), ("host_us", "host us", ".1f"),
           ("host_x_trivial", "host / trivial", ".2f"),
           ("forward_launches", "fwd launches", ""), ("both_launches", "fwd+bwd launches", "")]
REPS = 20  # profiled calls per breakdown case


LOOP_S = 0.1  # a timed loop holds fewer than --calls calls when they would take longer than this
SLEEP_CYCLES_PER_S = 2.5e9  # GPU clock cycles per second, rounded up (H100 / H200 SM clocks stay below 2 GHz)
HOST_CALLS = 64  # calls per host-time loop: their launches must not fill the GPU's queue of pending work
HOST_METHOD = "gpu-busy"  # how host_us was measured (older results: forward_us - kernel_us)


def _loop_calls(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> int:
    """``calls``, or as many as fill ``LOOP_S`` (at least 3), from one timed call of ``fn``."""
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return max(3, min(calls, int(LOOP_S / max(time.perf_counter() - start, 1e-9))))


def _loop_us(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    """Wall time per call of a loop of ``calls`` back-to-back calls, synchronised before and after."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def _host_loop_us(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> Optional[float]:
    """Host time per call of a loop of ``calls`` calls with the GPU held busy (CUDA): a sleep kernel queued first
    outlasts the loop, so the calls only queue their work and the loop's time is their Python and launch time
    alone. None when the sleep had ended before the loop did: the calls waited for the GPU (a host sync)."""
    loop_s = _loop_us(fn, calls, sync) * calls * 1e-6  # the loop's time with the GPU free: the sleep outlasts it
    torch.cuda._sleep(int(SLEEP_CYCLES_PER_S * (3 * loop_s + 1e-3)))
    slept = torch.cuda.Event()
    slept.record()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    waited = slept.query()
    sync()
    return None if waited else host


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _loop(host: bool, calls: int) -> tuple[Callable[..., Optional[float]], int]:
    """The loop to time and its calls: wall time, or with ``host`` the host time (at most ``HOST_CALLS`` calls)."""
    return (_host_loop_us, min(calls, HOST_CALLS)) if host else (_loop_us, calls)


def wall_us(fn: Callable[[], Any], calls: int, repeats: int, device: torch.device,
            host: bool = False) -> Optional[float]:
    """Median over ``repeats`` loops of back-to-back calls (``calls``, or as many as fill ``LOOP_S``, at least 3)
    of the wall time per call in microseconds, or with ``host`` of the host time with the GPU held busy
    (:func:`_host_loop_us`, CUDA; None when a loop waited for the GPU)."""
    sync = _sync(device)
    loop, calls = _loop(host, calls)
    calls = _loop_calls(fn, calls, sync)
    times = [loop(fn, calls, sync) for _ in range(repeats)]
    return None if None in times else statistics.median(times)


def paired_us(fn: Callable[[], Any], baseline: Callable[[], Any], calls: int, repeats: int, device: torch.device,
              host: bool = False) -> tuple[Optional[float], Optional[float]]:
    """(the median time per call of ``fn`` as :func:`wall_us` measures it, the median over the repeats of its ratio
    to ``baseline``'s; (None, None) when a host loop waited for the GPU). Each repeat times a loop of ``baseline``
    right before a loop of ``fn``, so that the host's speed, which drifts within a run on a shared machine,
    cancels in the ratio."""
    sync = _sync(device)
    loop, calls = _loop(host, calls)
    calls, base_calls = _loop_calls(fn, calls, sync), _loop_calls(baseline, calls, sync)
    times, ratios = [], []
    for _ in range(repeats):
        base, time_us = loop(baseline, base_calls, sync), loop(fn, calls, sync)
        if base is None or time_us is None:
            return None, None
        times.append(time_us)
        ratios.append(time_us / base)
    return statistics.median(times), statistics.median(ratios)


def graph_us(fn: Callable[[], Any]) -> tuple[Optional[float], Optional[str]]:
    """(device time of ``fn`` from CUDA-graph replays, median, in microseconds; None and why when the call cannot
    be captured)."""
    import triton.testing

    fn()
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3, None
    except Exception as exc:  # noqa: BLE001 - a call that cannot be captured (host sync) is reported, not fatal
        torch.cuda.synchronize()
        return None, f"no CUDA-graph capture: {failure_status(exc)}"


def calls_of(adapter: adapters.Adapter, impl: adapters.Impl, config: dict,
             device: torch.device) -> tuple[Callable[[], Any], Optional[Callable[[], Any]]]:
    """The forward (no autograd) and the training step (forward + backward) of ``impl`` at ``config``."""
    prepared = impl.prepare(adapter.build(config, device, 0), config)
    args = list(prepared.args)

    def forward() -> Any:  # no input requires grad: no autograd graph, and no no_grad() context to pay for
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
                   trivial: Callable[[], Any], trivial_step: Callable[[], Any], trivial_us: float) -> list[dict]:
    rows = []
    for n, config in enumerate(adapter.overhead_shapes):
        for impl in (next(i for i in adapter.impls if i.ours), adapter.impl(adapter.peer)):
            why = impl.unavailable(device) or impl.unsupported(config)
            row = dict(family=adapter.name, config=adapter.label(config), impl=impl.name, ours=impl.ours)
            if why:
                rows.append({**row, "skipped": why})
                continue
            started = time.perf_counter()
            forward, both = calls_of(adapter, impl, config, device)
            if both is not None:
                both()
            if n == 0 and impl.ours:
                row["first_call_s"] = time.perf_counter() - started
            row["forward_us"], row["forward_x_trivial"] = paired_us(forward, trivial, calls, repeats, device)
            if both is not None:
                row["both_us"], row["both_x_trivial_step"] = paired_us(both, trivial_step, calls, repeats, device)
                row["both_x_trivial"] = row["both_us"] / trivial_us
            if device.type == "cuda":
                row["forward_launches"] = device_launches(forward)
                row["both_launches"] = None if both is None else device_launches(both)
                row["host_us"], row["host_x_trivial"] = paired_us(forward, trivial, calls, repeats, device, True)
                if row["host_us"] is None:
                    row["host_note"] = "not measured: the calls waited for the GPU (a host sync)"
                row["kernel_us"], why = graph_us(forward)
                if why:
                    row["kernel_note"] = why
            rows.append(row)
    return rows


def profile_kernels(fn: Callable[[], Any], reps: int = REPS) -> dict:
    """Mean wall time per call (synchronised before and after the loop) and each CUDA kernel's mean device time
    per call, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / reps * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels[event.name]
            entry[0] += event.device_time / reps
            entry[1] += 1
    rows = sorted(({"kernel": k, "us": v[0], "launches": v[1] / reps} for k, v in kernels.items()),
                  key=lambda r: -r["us"])
    return {"wall_us": wall, "kernels_us": sum(r["us"] for r in rows), "kernels": rows}


def breakdown_family(adapter: adapters.Adapter, device: torch.device, floors, deadline: Deadline) -> list[dict]:
    """The kernel breakdown of this project's first implementation at the adapter's anchors and launch-bound
    shape (see the module docstring)."""
    impl = next(i for i in adapter.impls if i.ours)
    configs = list(adapter.overhead_shapes[:1]) + [c for c in adapter.anchors if c not in adapter.overhead_shapes[:1]]
    cases = []
    for config in configs:
        row = {"family": adapter.name, "config": adapter.label(config), "impl": impl.name}
        if deadline.remaining() <= 0:
            cases.append({**row, "status": "skipped: wall-clock budget spent"})
            continue
        try:
            forward, both = calls_of(adapter, impl, config, device)
        except Exception as exc:  # noqa: BLE001 - reported
            cases.append({**row, "status": failure_status(exc)})
            continue
        for phase, fn in (("forward", forward), ("both", both)):
            if fn is None:
                continue
            case = {**row, "phase": phase}
            try:
                case.update(status="ok", **profile_kernels(fn))
            except Exception as exc:  # noqa: BLE001 - reported
                case["status"] = failure_status(exc)
            floor_s, kind = floors.floor(*adapter.floor(config, phase))
            case.update(floor_us=floor_s * 1e6, floor_kind=kind)
            invalid = case["status"] == "ok" and below_floor(
                {"time_ms": case["kernels_us"] / 1e3, "floor_ms": floor_s * 1e3, "floor_kind": kind})
            if invalid:
                case["status"] = f"invalid: {invalid}"
            cases.append(case)
            print(f"[{adapter.name}] {case['config']} {phase}: {case['status']}"
                  + (f", wall {case['wall_us']:.1f} us, kernels {case['kernels_us']:.1f} us, floor "
                     f"{case['floor_us']:.1f} us" if "wall_us" in case else ""), flush=True)
        del forward, both
        release_memory(device)
    return cases


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=None, help="calls per timed loop (CUDA 300, CPU 3)")
    parser.add_argument("--repeats", type=int, default=None, help="timed loops (CUDA 5, CPU 1)")


def run_breakdown(opts: argparse.Namespace) -> int:
    """``python -m benchmarks breakdown``: every family of ``opts.families`` into OUT/<family>/<device slug>/."""
    if not torch.cuda.is_available():
        print("breakdown needs a CUDA GPU (torch.profiler device times)")
        return 2
    device = torch.device("cuda")
    timer = Timer(device)
    floors = measure_floors(timer)
    for family in opts.families:
        adapter = adapters.load(family)
        cases = breakdown_family(adapter, device, floors, Deadline(opts.budget_s))
        out = run_dir(opts.out, family, device)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "breakdown.json", {"environment": environment(device), "floors": floors.describe(),
                                            "copy_bytes_per_s": floors.copy_bytes_per_s, "reps": REPS,
                                            "cases": cases})
    return 0


def run(opts: argparse.Namespace) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    calls, repeats = opts.calls or (300 if cuda else 3), opts.repeats or (5 if cuda else 1)
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="overhead-triton-"))  # first call compiles
    z = torch.zeros(16, device=device)
    zg, w = torch.zeros(16, device=device, requires_grad=True), torch.ones(16, device=device)
    op, step = (lambda: z.add(1)), (lambda: torch.autograd.grad(zg * 2, [zg], w))
    trivial_us = wall_us(op, calls, repeats, device)
    step_us = wall_us(step, calls, repeats, device)
    trivial = dict(config="16 floats", impl="z.add(1); zg * 2 with autograd", forward_us=trivial_us,
                   forward_x_trivial=1.0, both_us=step_us, both_x_trivial=step_us / trivial_us,
                   both_x_trivial_step=1.0, forward_launches=device_launches(op) if cuda else None)
    if cuda:
        trivial["host_us"], trivial["host_x_trivial"] = wall_us(op, calls, repeats, device, host=True), 1.0
    rows: list[dict] = []
    for family in opts.families:
        family_rows = [{**trivial, "family": family}] + measure_family(adapters.load(family), device, calls, repeats,
                                                                        op, step, trivial_us)
        out = run_dir(opts.out, family, device)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "overhead.json", dict(environment=environment(device), calls=calls, repeats=repeats,
                                               smoke_only=not cuda, targets_x_trivial=TARGETS,
                                               host_method=HOST_METHOD, rows=family_rows))
        rows += family_rows
    print_table(f"public calls against z.add(1) ({device.type}{'' if cuda else ': smoke check'})", rows, COLUMNS)
    return 0
