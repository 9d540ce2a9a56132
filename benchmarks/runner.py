"""The benchmark runner of every family: grid x implementation x phase, through a family adapter.

Phases: ``forward`` (no autograd), ``backward`` (timed after an untimed forward: gradients of every
differentiable input for a fixed random upstream gradient), ``both`` (forward then backward, timed together).

Per configuration the runner builds the problem once, then for each implementation: prepares its inputs
(untimed), times each phase with ``common.Timer`` (CUDA events, L2 flushed before every call), takes its memory
breakdown, and scores the first timed call against the adapter's float64 reference where that is affordable.
Compilation is never timed: the first warm-up call (``first_call_s``) carries it, and ``compiles`` counts the
Triton kernels compiled during the measurement (``triton.knobs.runtime.jit_post_compile_hook``). Configurations
run in the adapter's order, so configurations sharing compiled variants run next to each other.

A median below the hardware floor (``floor_ms`` / ``FLOOR_MARGIN``) is not a speedup but a measurement that
skipped work (or a floor that does not hold): its status is ``invalid: ...`` (``flag_below_floor``, which the
analysis and the site also apply to results written before this rule), so no ratio is computed from it.

Outputs in the output directory, rewritten after every configuration (a run cut short by ``--budget-s`` leaves
valid partial results; ``--resume`` skips every measurement already recorded with a final status):

- ``benchmark_full.csv``: one row per configuration x implementation x phase;
- ``benchmark_full.json``: the header (family, device, versions, commit, git blob ids of the family's sources,
  settings, measured floors, compilation counts);
- ``heatmap_data.json``: the status of every implementation and phase over the grid (feasibility);
- ``memory_breakdown.csv``: inputs, outputs, saved state for backward and workspace per configuration x
  implementation.
"""
from __future__ import annotations

import contextlib
import csv
import itertools
import math
import statistics
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch

from benchmarks.adapters import Adapter, Impl, Prepared
from benchmarks.common import (
    Deadline,
    Floors,
    Timer,
    blob_id,
    environment,
    failure_status,
    fits_in_memory,
    measure_floors,
    normwise_rel_error,
    release_memory,
    write_csv,
    write_json,
)

REFERENCE_SHARE = 0.25  # the float64 reference may take this much of the budget left, estimated
FINAL = ("ok", "oom", "error", "invalid")  # statuses --resume keeps (a skipped measurement is tried again)
# A median below floor / FLOOR_MARGIN cannot be real. The margin covers the floor's own measurement: the bandwidth
# floor divides by the measured device-to-device copy rate, and a read-dominated kernel may stream a little faster
# than a copy (the runs on record reach 0.97 of it); the sequential floor is a measured step latency.
FLOOR_MARGIN = 1.10
ROW_COLUMNS = ("impl", "ours", "phase", "status", "time_ms", "time_min_ms", "time_max_ms", "time_iqr_ms", "reps",
               "first_call_s", "compiles", "peak_mb", "bytes", "steps", "floor_ms", "floor_kind", "floor_fraction",
               "bytes_per_s", "size", "throughput", "rel_err", "ref_status", "route", "notes")
MEMORY_COLUMNS = ("config", "impl", "status", "inputs_mb", "outputs_mb", "saved_mb", "workspace_mb",
                  "forward_peak_mb")


def columns(adapter: Adapter) -> tuple[str, ...]:
    return ("family", "config", *(a.name for a in adapter.axes), *adapter.derived_columns, *ROW_COLUMNS)


def key(row: dict) -> tuple[str, str, str]:
    return str(row["config"]), str(row["impl"]), str(row["phase"])


def final(status: Optional[str]) -> bool:
    return bool(status) and status.split(":")[0] in FINAL


# --------------------------------------------------------------------------------------------- compilation


class CompileCounter:
    """Counts Triton compilations (cache misses) while installed; chains any hook already set."""

    def __init__(self):
        self.count = 0
        self.available = False

    @contextlib.contextmanager
    def installed(self) -> Iterator["CompileCounter"]:
        try:
            import triton

            knobs = triton.knobs.runtime
            previous = knobs.jit_post_compile_hook
        except AttributeError:
            yield self
            return

        def hook(*args, **kwargs):
            self.count += 1
            return previous(*args, **kwargs) if previous else None

        knobs.jit_post_compile_hook = hook
        self.available = True
        try:
            yield self
        finally:
            knobs.jit_post_compile_hook = previous


# -------------------------------------------------------------------------------------------------- inputs


def spec_of(out: torch.Tensor) -> tuple:
    """(shape, dtype, device) of an output."""
    return tuple(out.shape), out.dtype, out.device


def upstream_like(spec: tuple, seed: int) -> torch.Tensor:
    """The fixed upstream gradient of an output of ``spec`` (``spec_of``): N(0, 1) from ``seed``, drawn on the CPU
    in float64, so every implementation and the float64 reference get the same values."""
    shape, dtype, device = spec
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


def output_spec(prepared: Prepared) -> tuple:
    """The output's (shape, dtype, device), from one untimed forward."""
    with torch.no_grad():
        return spec_of(prepared.call(*prepared.args))


def leaves_of(prepared: Prepared) -> tuple[tuple, tuple]:
    """(args with fresh leaves requiring grad at the differentiable positions, those leaves)."""
    args = list(prepared.args)
    for i in prepared.differentiable:
        args[i] = args[i].detach().requires_grad_()
    return tuple(args), tuple(args[i] for i in prepared.differentiable)


def phase_calls(prepared: Prepared, phase: str, seed: int, spec: Optional[tuple] = None):
    """(setup, timed) for one phase; ``timed(setup())`` when setup is not None. Results: forward -> output,
    backward -> gradients (tuple), both -> (output, gradients). ``spec``: the output's shape and dtype when
    known (else one untimed forward finds it), for the upstream gradient."""
    call = prepared.call
    if phase == "forward":
        def forward():
            with torch.no_grad():
                return call(*prepared.args)
        return None, forward
    args, leaves = leaves_of(prepared)
    grad_out = upstream_like(output_spec(prepared) if spec is None else spec, seed)
    if phase == "backward":
        return (lambda: call(*args)), (lambda out: torch.autograd.grad(out, leaves, grad_out))

    def both():
        out = call(*args)
        return out.detach(), torch.autograd.grad(out, leaves, grad_out)
    return None, both


def tensor_bytes(tensors: Sequence[Any], exclude: set = frozenset()) -> tuple[int, set]:
    """Total bytes of the distinct storages of ``tensors`` not in ``exclude`` (storage data pointers)."""
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in seen and ptr not in exclude:
                seen.add(ptr)
                total += storage.nbytes()
    return total, seen


def memory_breakdown(prepared: Prepared, device: torch.device) -> dict:
    """Inputs, outputs, saved-for-backward (distinct storages the autograd graph keeps, inputs and output excluded)
    and workspace (CUDA: the forward's peak minus outputs and saved state), in MB."""
    args, _ = leaves_of(prepared)
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = prepared.call(*args)
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
    inputs, input_ptrs = tensor_bytes(args)
    outputs, output_ptrs = tensor_bytes([out])
    saved_bytes, _ = tensor_bytes(saved, input_ptrs | output_ptrs)
    mb = 2.0**-20
    return {"status": "ok", "inputs_mb": inputs * mb, "outputs_mb": outputs * mb, "saved_mb": saved_bytes * mb,
            "workspace_mb": None if peak is None else max(peak - outputs - saved_bytes, 0) * mb,
            "forward_peak_mb": None if peak is None else peak * mb}


# ----------------------------------------------------------------------------------------------- accuracy


def reference_values(adapter: Adapter, problem: Any, config: dict, seed: int) -> tuple[Optional[tuple], str]:
    """(float64 output, float64 gradients of the family's inputs) for the upstream gradient, or why not."""
    try:
        prepared = adapter.reference(problem, config)
        if prepared is None:
            return None, "skipped: too large for the float64 reference"
        args, leaves = leaves_of(prepared)
        out = prepared.call(*args)
        grads = torch.autograd.grad(out, leaves, upstream_like(spec_of(out), seed))
        return (out.detach(), grads), "ok"
    except Exception as exc:  # noqa: BLE001 - reported in every row of the configuration
        return None, failure_status(exc)


def accuracy(result: Any, phase: str, prepared: Prepared, reference: tuple) -> float:
    """Worst norm-wise relative error of the phase's results (output and/or gradients in the family's inputs)."""
    ref_out, ref_grads = reference
    errors = []
    if phase in ("forward", "both"):
        out = result if phase == "forward" else result[0]
        errors.append(normwise_rel_error(out, ref_out))
    if phase in ("backward", "both"):
        grads = result if phase == "backward" else result[1]
        if prepared.pullback is not None:
            grads = prepared.pullback(grads)
        errors += [normwise_rel_error(g, r) for g, r in zip(grads, ref_grads)]
    return max(errors)


# ----------------------------------------------------------------------------------------------------- grid


def grid(adapter: Adapter, values: dict[str, list]) -> list[dict]:
    """Configurations: the adapter's anchors when ``values`` is empty, else the product of the given values
    (defaults for the axes not given); sorted by the adapter's order, duplicates dropped."""
    if not values:
        configs = [dict(c) for c in adapter.anchors]
    else:
        axes = [values.get(a.name, list(a.default)) for a in adapter.axes]
        configs = [dict(zip((a.name for a in adapter.axes), combo)) for combo in itertools.product(*axes)]
    unique = {adapter.label(c): c for c in configs}
    return sorted(unique.values(), key=adapter.order)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def spread(times: list[float]) -> tuple[float, float, float]:
    """(min, max, interquartile range) in seconds."""
    if len(times) < 2:
        return times[0], times[0], 0.0
    q = statistics.quantiles(times, n=4, method="inclusive")
    return min(times), max(times), q[2] - q[0]


# ---------------------------------------------------------------------------------------------------- runner


class Runner:
    """One family's run into ``out_dir`` (see the module docstring)."""

    def __init__(self, adapter: Adapter, impls: Sequence[Impl], phases: Sequence[str], device: torch.device,
                 out_dir: Path, budget_s: float, *, seed: int = 0, min_reps: int = 3, target_s: float = 0.25,
                 max_reps: int = 100, resume: bool = False, progress: bool = True):
        self.adapter, self.impls, self.phases = adapter, list(impls), list(phases)
        self.device, self.out_dir, self.seed = torch.device(device), Path(out_dir), seed
        self.min_reps, self.target_s, self.max_reps = min_reps, target_s, max_reps
        self.deadline = Deadline(budget_s)
        self.timer = Timer(self.device)
        self.compiles = CompileCounter()
        self.columns = columns(adapter)
        previous = read_rows(self.out_dir / "benchmark_full.csv") if resume else []
        self.rows: dict[tuple, dict] = {key(r): r for r in previous if final(r.get("status"))}
        self.resumed = len(self.rows)
        self.memory: dict[tuple, dict] = {(r["config"], r["impl"]): r
                                          for r in read_rows(self.out_dir / "memory_breakdown.csv")} if resume else {}
        self.progress = progress
        self.floors: Optional[Floors] = None
        self.header: dict = {}

    # -- header

    def sources(self) -> dict:
        """``sources``: git blob ids of the files a call of the family runs (``Family.runtime_files()``: not its
        verification registration), for staleness checks; empty, with ``sources_note`` saying why, when the
        family is not registered."""
        try:
            from kernel_sentinel.family import REPO_ROOT
            from kernel_sentinel.registry import families

            family = next((f for f in families() if f.name == self.adapter.name), None)
            if family is None:
                return {"sources": {}, "sources_note": f"no family {self.adapter.name!r} in the sentinel registry"}
            return {"sources": {str(p): blob_id(Path(REPO_ROOT) / p) for p in family.runtime_files()}}
        except Exception as exc:  # noqa: BLE001 - a broken registry must not cost the benchmark; recorded
            return {"sources": {}, "sources_note": f"the sentinel registry failed: {type(exc).__name__}: {exc}"}

    def make_header(self, configs: list[dict]) -> dict:
        floors = self.floors
        return {
            "family": self.adapter.name,
            "title": self.adapter.title,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **environment(self.device, self.adapter.packages),
            **self.sources(),
            "settings": {"configs": [self.adapter.label(c) for c in configs],
                         "impls": [i.name for i in self.impls], "ours": [i.name for i in self.impls if i.ours],
                         "phases": self.phases, "seed": self.seed, "budget_s": self.deadline.budget_s,
                         "min_reps": self.min_reps, "target_s": self.target_s, "max_reps": self.max_reps,
                         "variant_axis": self.adapter.variant_axis, "size_column": self.adapter.size_column,
                         "size_unit": self.adapter.size_unit, "plot_axes": list(self.adapter.plot_axes),
                         "notes": list(self.adapter.notes),
                         "timing": "median of CUDA-event timed calls after warm-up, L2 flushed before each call"
                                   if self.device.type == "cuda" else "median of perf_counter timed calls (cpu)"},
            "floors": {"copy_bytes_per_s": floors.copy_bytes_per_s, "copy_method": floors.copy_method,
                       "step_s": floors.step_s, "step_method": floors.step_method, "description": floors.describe()},
        }

    # -- outputs

    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        rows = list(self.rows.values())
        write_csv(self.out_dir / "benchmark_full.csv", rows, self.columns)
        write_csv(self.out_dir / "memory_breakdown.csv", list(self.memory.values()), MEMORY_COLUMNS)
        heatmap: dict = {}
        for r in rows:
            heatmap.setdefault(r["impl"], {}).setdefault(r["phase"], []).append(
                {"config": r["config"], **{a.name: r[a.name] for a in self.adapter.axes},
                 "status": r["status"], "feasible": str(r["status"]) == "ok"})
        write_json(self.out_dir / "heatmap_data.json", {"family": self.adapter.name, "feasibility": heatmap})
        self.header.update(elapsed_s=self.deadline.elapsed(), resumed_rows=self.resumed,
                           compile={"counted": self.compiles.available, "triton_compilations": self.compiles.count,
                                    "per_impl": {i.name: sum(int(r.get("compiles") or 0) for r in rows
                                                             if r["impl"] == i.name) for i in self.impls}})
        write_json(self.out_dir / "benchmark_full.json", self.header)

    # -- measuring

    def base_row(self, config: dict, impl: Impl, phase: str) -> dict:
        return {"family": self.adapter.name, "config": self.adapter.label(config), **config,
                **self.adapter.derived(config), "impl": impl.name, "ours": impl.ours, "phase": phase}

    def blocked(self, config: dict, impl: Impl) -> Optional[str]:
        """Why ``impl`` cannot run ``config`` at all (unavailable, unsupported, hopeless memory), else None."""
        reason = impl.unavailable(self.device) or impl.unsupported(config)
        if reason:
            return f"skipped: {reason}"
        need = self.adapter.floor(config, "both")[0]
        if impl.memory_bytes is not None:
            need = max(need, impl.memory_bytes(config))
        too_big = fits_in_memory(need, self.device)
        return f"skipped: {too_big}" if too_big else None

    def measure(self, config: dict, impl: Impl, phase: str, prepared: Prepared, small: Prepared, scale: float,
                reference: Optional[tuple], ref_status: str) -> dict:
        from provable_kernels.dispatch import recording

        row = self.base_row(config, impl, phase)
        spec = self.spec.get(impl.name)
        setup, timed = phase_calls(prepared, phase, self.seed, spec)
        small_setup, small_timed = phase_calls(small, phase, self.seed)
        warmup = small_timed if small_setup is None else (lambda: small_timed(small_setup()))
        before = self.compiles.count
        with recording() as taken:
            m = self.timer.measure(warmup, timed, self.deadline, scale=scale, target_s=self.target_s,
                                   min_reps=self.min_reps, max_reps=self.max_reps, setup=setup)
        nbytes, steps = self.adapter.floor(config, phase)
        floor_s, floor_kind = self.floors.floor(nbytes, steps)
        size = self.adapter.derived(config).get(self.adapter.size_column, config.get(self.adapter.size_column))
        row.update(status=m.status, reps=m.reps, first_call_s=m.first_call_s, compiles=self.compiles.count - before,
                   peak_mb=None if m.peak_bytes is None else m.peak_bytes / 2**20, bytes=nbytes, steps=steps,
                   floor_ms=floor_s * 1e3, floor_kind=floor_kind, size=size, ref_status=ref_status,
                   route=",".join(sorted(set(taken))) or None, notes="; ".join(m.notes) or None)
        if m.median_s is not None:
            lo, hi, iqr = spread(m.times)
            row.update(time_ms=m.median_s * 1e3, time_min_ms=lo * 1e3, time_max_ms=hi * 1e3, time_iqr_ms=iqr * 1e3,
                       floor_fraction=floor_s / m.median_s, bytes_per_s=nbytes / m.median_s,
                       throughput=size / m.median_s)
        if m.status == "ok" and phase == "forward":
            self.spec[impl.name] = spec_of(m.result)
        row = flag_below_floor([row])[0]
        if m.status == "ok" and reference is not None:
            try:
                row["rel_err"] = accuracy(m.result, phase, prepared, reference)
            except Exception as exc:  # noqa: BLE001 - reported
                row["ref_status"] = f"accuracy not computed: {failure_status(exc)}"
        m.result = m.warmup_result = None
        return row

    def reference(self, problem: Any, small: Any, scale: float, config: dict) -> tuple[Optional[tuple], str]:
        """The float64 reference values, unless its cost (timed on the shrunk problem and scaled, where the adapter
        shrinks) would take more than REFERENCE_SHARE of the budget left."""
        if self.deadline.remaining() <= 0:
            return None, "skipped: wall-clock budget spent"
        if small is not problem:
            seconds, (_, status) = self.timer.wall(lambda: reference_values(self.adapter, small, config, self.seed))
            if status != "ok":
                return None, status
            if seconds * scale > REFERENCE_SHARE * self.deadline.remaining():
                return None, (f"skipped: float64 reference would take ~{seconds * scale:.3g} s (estimate), "
                              f"{self.deadline.remaining():.3g} s of the budget left")
        return reference_values(self.adapter, problem, config, self.seed)

    def run_config(self, config: dict, report) -> None:
        label = self.adapter.label(config)
        todo = [(impl, phase) for impl in self.impls for phase in self.phases
                if (label, impl.name, phase) not in self.rows]
        if not todo:
            return
        reason = fits_in_memory(self.adapter.floor(config, "forward")[0], self.device)
        problem = None
        if reason is None and self.deadline.remaining() > 0:
            try:
                problem = self.adapter.build(config, self.device, self.seed)
            except Exception as exc:  # noqa: BLE001 - reported
                reason = failure_status(exc)
        elif reason is None:
            reason = "wall-clock budget spent"
        if problem is None:
            for impl, phase in todo:
                self.rows[(label, impl.name, phase)] = {**self.base_row(config, impl, phase),
                                                        "status": reason if reason.startswith(("oom", "error"))
                                                        else f"skipped: {reason}"}
                report(1)
            return
        small, scale = self.adapter.shrink(problem, config) if self.adapter.shrink else (problem, 1.0)
        reference, ref_status = self.reference(problem, small, scale, config)
        self.spec: dict[str, tuple] = {}
        for impl in self.impls:
            phases = [p for i, p in todo if i is impl]
            if not phases:
                continue
            status = self.blocked(config, impl)
            prepared = small_prepared = None
            if status is None:
                try:
                    prepared = impl.prepare(problem, config)
                    small_prepared = prepared if small is problem else impl.prepare(small, config)
                except Exception as exc:  # noqa: BLE001 - reported
                    status = failure_status(exc)
            for phase in phases:
                report(0, f"{label} {impl.name} {phase}")
                no_gradient = phase != "forward" and impl.no_gradient(config)
                if status is None and no_gradient:
                    row = {**self.base_row(config, impl, phase), "status": f"skipped: {no_gradient}"}
                elif status is None:
                    try:
                        row = self.measure(config, impl, phase, prepared, small_prepared, scale, reference,
                                           ref_status)
                    except Exception as exc:  # noqa: BLE001 - e.g. building the upstream gradient failed
                        row = {**self.base_row(config, impl, phase), "status": failure_status(exc)}
                else:
                    row = {**self.base_row(config, impl, phase), "status": status}
                self.rows[(label, impl.name, phase)] = row
                report(1, line=row)
            if prepared is not None and status is None and "forward" in self.phases \
                    and (label, impl.name) not in self.memory and self.deadline.remaining() > 0:
                try:
                    breakdown = memory_breakdown(prepared, self.device)
                except Exception as exc:  # noqa: BLE001 - reported
                    breakdown = {"status": failure_status(exc)}
                self.memory[(label, impl.name)] = {"config": label, "impl": impl.name, **breakdown}
            del prepared, small_prepared
            release_memory(self.device)
        del problem, small, reference
        release_memory(self.device)

    def run(self, configs: list[dict]) -> list[dict]:
        """Measure every configuration (resumed ones skipped), writing the outputs after each; returns the rows."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        console = Console(stderr=True)
        self.floors = measure_floors(self.timer)
        self.header = self.make_header(configs)
        console.print(f"[{self.adapter.name}] floors: {self.floors.describe()}")
        total = len(configs) * len(self.impls) * len(self.phases)
        columns_ = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn())
        with self.compiles.installed(), Progress(*columns_, console=console, disable=not self.progress) as bar:
            task = bar.add_task(self.adapter.name, total=total)
            bar.advance(task, sum(1 for k in self.rows if k[0] in {self.adapter.label(c) for c in configs}))

            def report(n: int, description: Optional[str] = None, line: Optional[dict] = None) -> None:
                if description:
                    bar.update(task, description=f"{self.adapter.name} {description}")
                if line is not None:
                    t = line.get("time_ms")
                    console.print(f"{line['config']} {line['impl']} {line['phase']}: {line['status']}"
                                  + ("" if t is None else f" {t:.4g} ms"), highlight=False, soft_wrap=True)
                bar.advance(task, n)

            for config in configs:
                self.run_config(config, report)
                self.write()
        self.write()
        return list(self.rows.values())


def ours_failed(rows: list[dict]) -> bool:
    return any(str(r.get("ours")) == "True" and str(r.get("status", "")).startswith(("error", "oom")) for r in rows)


def below_floor(row: dict) -> Optional[str]:
    """Why ``row``'s median cannot be real (it is below ``floor_ms`` / FLOOR_MARGIN), or None (it can, or the row
    has no time or no floor)."""
    if not isinstance(row, dict):
        raise TypeError(f"row must be a dict, got {type(row).__name__}")
    time_ms, floor_ms = finite(row.get("time_ms")), finite(row.get("floor_ms"))
    if time_ms is None or not floor_ms or time_ms * FLOOR_MARGIN >= floor_ms:
        return None
    return (f"median {time_ms:.4g} ms is below the {row.get('floor_kind') or 'hardware'} floor {floor_ms:.4g} ms "
            f"({floor_ms / time_ms:.3g}x): work was skipped or the floor does not hold")


def flag_below_floor(rows: list[dict]) -> list[dict]:
    """``rows`` with every ``ok`` row whose median is below the floor (``below_floor``) turned ``invalid: ...``
    (copies; the others unchanged)."""
    out = []
    for row in rows:
        reason = below_floor(row) if row.get("status") == "ok" else None
        out.append({**row, "status": f"invalid: {reason}"} if reason else row)
    return out


def read_results(path: Path) -> list[dict]:
    """The rows of a ``benchmark_full.csv`` with the floor rule applied (``flag_below_floor``)."""
    return flag_below_floor(read_rows(Path(path)))


def finite(value: Any) -> Optional[float]:
    """A CSV cell as a float (None when empty or not a finite number)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
