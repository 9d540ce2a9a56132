"""Shared benchmark machinery: timing, peak memory, hardware floors, a wall-clock guard, errors, reports.

Used by every phase of the suite (``python -m benchmarks``). Conventions:

- Times are medians in seconds. On CUDA each timed call is bracketed by CUDA events after warm-up, and the L2
  cache is flushed (a 256 MiB buffer is zeroed) before every timed call, as ``triton.testing.do_bench`` does,
  so inputs that fit in L2 are never timed hot. On CPU, ``time.perf_counter`` (for testing the machinery).
- Peak memory is the ``torch.cuda.max_memory_allocated`` delta around the first timed call (None on CPU).
- A failure never disappears: every measurement carries a ``status`` (``ok``, ``oom``, ``error: ...``,
  ``skipped: ...``, ``invalid: ...`` for a time below the hardware floor) that reports print and write.
- Results keep the latest run per family and device: ``results/<family>/<device slug>/`` (``run_dir``); a new run
  replaces the folder's files, and history lives in git.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import platform
import re
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import triton
import triton.language as tl

L2_FLUSH_BYTES = 256 * 1024 * 1024
RESULTS = Path(__file__).resolve().parent / "results"


# ------------------------------------------------------------------------------------------- wall-clock guard


class Deadline:
    """A wall-clock budget for a whole benchmark run, started at construction."""

    def __init__(self, budget_s: float):
        if not budget_s > 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        self.budget_s = float(budget_s)
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()


# ------------------------------------------------------------------------------------------------ failures


def device_launches(fn: Callable[[], Any]) -> int:
    """CUDA kernels, copies and memsets that one call of ``fn`` puts on the device (``torch.profiler``, after a
    warm-up call)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def failure_status(exc: BaseException) -> str:
    """``oom`` for an out-of-memory error (CUDA or host), else ``error: Type: message`` (one line, truncated)."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in message.lower() \
            or "can't allocate memory" in message.lower():
        return "oom"
    return f"error: {type(exc).__name__}: {message[:200]}"


def release_memory(device: torch.device) -> None:
    """Give cached blocks back after a failure or between implementations."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def fits_in_memory(needed_bytes: float, device: torch.device, cpu_limit_bytes: float = 4 * 2**30) -> Optional[str]:
    """None when ``needed_bytes`` fits in 80% of the device's free memory (CPU: ``cpu_limit_bytes``), else why not."""
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else cpu_limit_bytes
    if needed_bytes <= 0.8 * free:
        return None
    return f"needs ~{needed_bytes / 2**30:.1f} GiB (estimate) > 80% of {free / 2**30:.1f} GiB available: not run"


# -------------------------------------------------------------------------------------------------- timing


@dataclass
class Measurement:
    """One timed quantity: ``result`` is what the first timed call returned, ``warmup_result`` what the first
    warm-up call returned."""

    status: str
    median_s: Optional[float] = None
    reps: int = 0
    peak_bytes: Optional[int] = None
    first_call_s: Optional[float] = None  # the first warm-up call, compilation included
    times: list[float] = field(default_factory=list)  # every timed call, seconds
    result: Any = None
    warmup_result: Any = None
    notes: list[str] = field(default_factory=list)


class Timer:
    """Times callables on one device (see the module docstring for the method)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.flush = (torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=self.device)
                      if self.device.type == "cuda" else None)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wall(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Run ``fn`` once, untimed by events; return (seconds until the device finished, its result)."""
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - start, out

    def timed_call(self, fn: Callable[..., Any], track_peak: bool = False,
                   setup: Optional[Callable[[], Any]] = None) -> tuple[float, Any, Optional[int]]:
        """One timed call: (seconds, result, peak-memory delta in bytes if ``track_peak`` on CUDA, else None).

        With ``setup``, ``setup()`` runs untimed first (e.g. the forward whose backward is timed) and the timed call
        is ``fn(setup())``; the peak delta is then measured from after the setup."""
        if setup is not None:
            state = setup()
            fn = functools.partial(fn, state)
        if self.device.type != "cuda":
            seconds, out = self.wall(fn)
            return seconds, out, None
        self.flush.zero_()
        if track_peak:
            self.sync()
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device) - base if track_peak else None
        return start.elapsed_time(end) / 1e3, out, peak

    def median(self, fn: Callable[[], Any], reps: int) -> float:
        """Median seconds of ``reps`` timed calls."""
        return statistics.median(self.timed_call(fn)[0] for _ in range(reps))

    def measure(
        self,
        warmup: Callable[[], Any],
        timed: Callable[[], Any],
        deadline: Deadline,
        *,
        scale: float = 1.0,
        target_s: float = 1.0,
        min_reps: int = 3,
        max_reps: int = 200,
        slow_s: float = 2.0,
        setup: Optional[Callable[[], Any]] = None,
    ) -> Measurement:
        """Warm up, then time ``timed`` (``timed(setup())`` with ``setup``, see ``timed_call``); exceptions become
        the measurement's status.

        ``warmup`` runs the same work on a problem ``scale`` times smaller (compiles kernels, costs little), twice;
        the second call times ``scale`` estimate ``timed``. A call estimated to outlast the deadline is not made
        (status ``skipped: ...``); one estimated under ``slow_s`` gets an untimed full call first (kernels
        specialised on the full size compile there). Timed calls then stop after ``target_s`` of timed calls once
        there are ``min_reps``, at ``max_reps``, or before the deadline would pass (at least one); the median is
        robust to one slow first call of a slow implementation.
        """
        if deadline.remaining() <= 0:
            return Measurement(status="skipped: wall-clock budget spent")
        m = Measurement(status="ok")
        times: list[float] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                m.first_call_s, m.warmup_result = self.wall(warmup)
                estimate = self.wall(warmup)[0] * scale
                if estimate > deadline.remaining():
                    m.status = (f"skipped: one call would take ~{estimate:.3g} s (estimate), "
                                f"{max(deadline.remaining(), 0):.3g} s of the budget left")
                    return m
                if scale > 1 and estimate < slow_s:
                    self.wall(timed if setup is None else lambda: timed(setup()))
                wanted = max_reps
                while len(times) < wanted and (not times or deadline.remaining() > max(times)) \
                        and not (len(times) >= min_reps and sum(times) >= target_s):
                    seconds, out, peak = self.timed_call(timed, track_peak=not times, setup=setup)
                    if not times:
                        m.result, m.peak_bytes = out, peak
                    del out
                    times.append(seconds)
                    wanted = max(min_reps, min(max_reps, int(target_s / max(min(times), 1e-9))))
            m.notes = sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0][:160]}" for w in caught})
        except Exception as exc:  # noqa: BLE001 - every failure is reported, never dropped
            m.status = failure_status(exc)
            m.result = m.warmup_result = None
            release_memory(self.device)
            return m
        m.reps = len(times)
        m.times = times
        m.median_s = statistics.median(times)
        if m.reps < min_reps:
            m.notes.append(f"only {m.reps} timed call(s): wall-clock budget")
        return m


# ----------------------------------------------------------------------------------------- hardware floors


@triton.jit
def _dependent_lse_steps(x_ptr, out_ptr, n_steps, BLOCK: tl.constexpr):
    """``n_steps`` dependent warp-wide logsumexps: s <- logsumexp(x + s/2)."""
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    s = tl.max(x, axis=0) * 0.0
    for _ in range(n_steps):
        y = x + 0.5 * s
        m = tl.max(y, axis=0)
        s = m + tl.log(tl.sum(tl.exp(y - m), axis=0))
    tl.store(out_ptr, s)


@dataclass(frozen=True)
class Floors:
    """Measured device constants for hardware floors.

    ``copy_bytes_per_s``: device-to-device copy bandwidth (bytes read + written per second).
    ``step_s``: latency of one dependent step of a sequential recursion (one warp-wide logsumexp).
    """

    copy_bytes_per_s: float
    copy_method: str
    step_s: float
    step_method: str

    def bandwidth_floor(self, nbytes: float) -> float:
        return nbytes / self.copy_bytes_per_s

    def sequential_floor(self, steps: int) -> float:
        return steps * self.step_s

    def floor(self, nbytes: float, steps: int) -> tuple[float, str]:
        """The larger of the two floors and which one it is (``bandwidth`` or ``sequential``)."""
        bw, seq = self.bandwidth_floor(nbytes), self.sequential_floor(steps)
        return (bw, "bandwidth") if bw >= seq else (seq, "sequential")

    def describe(self) -> str:
        return (f"bandwidth floor = bytes / {self.copy_bytes_per_s / 1e12:.3f} TB/s ({self.copy_method}); "
                f"sequential floor = steps x {self.step_s * 1e9:.1f} ns ({self.step_method}); "
                "each row uses the larger")


def measure_floors(timer: Timer) -> Floors:
    """Measure copy bandwidth and dependent-step latency on ``timer``'s device, in this run."""
    device = timer.device
    nbytes = L2_FLUSH_BYTES if device.type == "cuda" else 32 * 2**20
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer.wall(lambda: dst.copy_(src))
    copy_bw = 2 * nbytes / timer.median(lambda: dst.copy_(src), 10)
    if device.type == "cuda":
        x = torch.linspace(-1.0, 1.0, 32, device=device)
        out = torch.empty(1, device=device)

        def steps(n: int) -> Callable[[], Any]:
            return lambda: _dependent_lse_steps[(1,)](x, out, n, BLOCK=32, num_warps=1)

        short, long = 2**12, 2**16
        steps(short)()  # compile
        t_short, t_long = timer.median(steps(short), 5), timer.median(steps(long), 5)
        step_s = max(t_long - t_short, 1e-12) / (long - short)
        step_method = "dependent Triton loop, one warp-wide logsumexp per step"
    else:
        x = torch.linspace(-1.0, 1.0, 32, dtype=torch.float64)
        n = 2000

        def host_loop() -> None:
            s = torch.zeros((), dtype=torch.float64)
            for _ in range(n):
                s = torch.logsumexp(x + 0.5 * s, 0)

        step_s = timer.median(host_loop, 3) / n
        step_method = "dependent loop of torch ops on the host (cpu)"
    return Floors(copy_bw, f"{nbytes // 2**20} MiB device-to-device copy", step_s, step_method)


# ------------------------------------------------------------------------------------------------ accuracy


def normwise_rel_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference||_2 / ||reference||_2 in float64 (0 when both are zero), on ``value``'s device."""
    v, r = value.double(), reference.double().to(value.device)
    diff, norm = float(torch.linalg.vector_norm(v - r)), float(torch.linalg.vector_norm(r))
    return diff / norm if norm > 0 else diff


# -------------------------------------------------------------------------------------------- environment


def device_identity(device: torch.device) -> dict:
    """``{"type": ..., "name": ...}`` of ``device`` (the CUDA device name, else the host's processor)."""
    device = torch.device(device)
    if device.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(device)}
    return {"type": device.type, "name": platform.processor() or platform.machine()}


def device_slug(identity: dict) -> str:
    """The folder name of a device's results: its name in lower case, runs of other characters as one ``-``
    (``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``), prefixed by the type unless it is CUDA
    (``cpu-x86-64``)."""
    if not isinstance(identity, dict) or not identity.get("name") or not identity.get("type"):
        raise ValueError(f"identity must be a dict with a type and a name, got {identity!r}")
    name = identity["name"] if identity["type"] == "cuda" else f"{identity['type']} {identity['name']}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_dir(results: Path, family: str, device: torch.device) -> Path:
    """Where the latest run of ``family`` on ``device`` lives: ``results/<family>/<device slug>/``."""
    if not family or "/" in family:
        raise ValueError(f"family must be a family name, got {family!r}")
    return Path(results) / family / device_slug(device_identity(device))


def environment(device: torch.device, packages: Sequence[str] = ()) -> dict:
    """Device name, library versions (``packages`` by distribution name, 'absent' if not installed), commit."""
    from importlib import metadata

    versions = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    return {"device": device_identity(device), "versions": versions, "commit": current_commit()}


COMMIT_ID = re.compile(r"[0-9a-f]{4,40}")  # a git commit id, full or abbreviated


def current_commit() -> str:
    """The commit results are stamped with: the verification records' rule
    (:func:`kernel_sentinel.records.head_commit`: ``SENTINEL_COMMIT`` when set, else git's HEAD); a ``ValueError``
    when that is no commit id (a tree copied without its git checkout, or ``SENTINEL_COMMIT`` set to
    ``.git/HEAD``'s text)."""
    from kernel_sentinel.records import head_commit

    commit = head_commit()
    if not COMMIT_ID.fullmatch(commit):
        raise ValueError(f"SENTINEL_COMMIT must be a commit id (export SENTINEL_COMMIT=$(git rev-parse HEAD) where "
                         f"the tree was copied from), got {commit!r}")
    return commit


def blob_id(path: Path) -> str:
    """The git blob id of a file's content (what ``git hash-object`` prints), computed without git."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ------------------------------------------------------------------------------------------------- reports


def fmt(value: Any, spec: str = ".3g") -> str:
    """Table cell text: '-' for None, numbers formatted with ``spec``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else format(value, spec)
    return str(value)


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})


def _strict_json(value: Any) -> Any:
    """Non-finite floats become the strings 'nan', 'inf', '-inf' (strict JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    return value


def write_json(path: Path, payload: dict) -> None:
    """Indented strict JSON (non-finite numbers written as strings), trailing newline."""
    path.write_text(json.dumps(_strict_json(payload), indent=2, allow_nan=False) + "\n")


def print_table(title: str, rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> None:
    """A rich table; ``columns`` are (row key, header, number format)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for _, header, _ in columns:
        table.add_column(header, overflow="ellipsis", no_wrap=True, max_width=32)
    for row in rows:
        table.add_row(*(fmt(row.get(key), spec) for key, _, spec in columns))
    Console(width=200).print(table)
