"""Tables and plots from a ``benchmark_full.csv`` of any family (``python -m benchmarks analyze``).

Definitions (every ratio is computed here, at analysis time, from the medians in the CSV):

- ``time_ratio`` = time of the implementation / time of the baseline at the same configuration and phase (> 1:
  the baseline is faster); ``memory_ratio`` likewise with peak memory. The baseline defaults to this project's
  first implementation in the CSV (``--baseline`` overrides).
- ``backward_over_forward`` = backward time / forward time, ``both_over_forward`` = both / forward, per
  configuration and implementation.
- Variant overhead (semiring, domain or reduction: the adapter's ``variant_axis``) = time of the variant / time of
  the axis's first default value, at the same other axes, implementation and phase.
- Crossover points: along each grid axis of ``plot_axes``, the other axes fixed, between consecutive values x0 < x1
  whose time ratios r0, r1 lie on opposite sides of 1, the point where the ratio crosses 1 interpolated linearly
  in log x and log r: ``x = exp(log x0 + (log x1 - log x0) * log r0 / (log r0 - log r1))``.
- Summary: per implementation and phase, how many configurations ran and how (statuses), the geometric mean of
  ``time_ratio``, the median and best floor fraction, the largest peak memory.

Outputs: summary_stats.csv, baseline_ratios.csv, backward_forward_ratios.csv, <variant>_overhead.csv,
crossover_points.csv, and plots (time and floor bytes/s, with the copy-bandwidth floor, against each plot axis;
throughput and memory per unit of size against the first; backward/forward ratios; ratio heatmaps per phase;
variant overhead), one legend entry per implementation.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Optional

from benchmarks import adapters
from benchmarks.common import write_csv
from benchmarks.runner import finite, read_rows

PHASES = adapters.PHASES


def geomean(values: list[float]) -> Optional[float]:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def timed(rows: list[dict]) -> dict[tuple, float]:
    """(config, impl, phase) -> median time in ms, for rows with status ok."""
    return {(r["config"], r["impl"], r["phase"]): finite(r["time_ms"]) for r in rows
            if r["status"] == "ok" and finite(r["time_ms"]) is not None}


def default_baseline(adapter: adapters.Adapter, rows: list[dict]) -> str:
    present = {r["impl"] for r in rows}
    for impl in adapter.impls:
        if impl.ours and impl.name in present:
            return impl.name
    raise ValueError(f"no implementation of this project in the CSV (present: {sorted(present)}): give --baseline")


def baseline_ratios(rows: list[dict], baseline: str) -> list[dict]:
    times = timed(rows)
    peaks = {(r["config"], r["impl"], r["phase"]): finite(r["peak_mb"]) for r in rows if r["status"] == "ok"}
    out = []
    for r in rows:
        k, b = (r["config"], r["impl"], r["phase"]), (r["config"], baseline, r["phase"])
        if r["impl"] == baseline or k not in times or b not in times:
            continue
        mem = peaks.get(k), peaks.get(b)
        out.append({**{c: r[c] for c in r if c not in ("status",)}, "baseline": baseline,
                    "time_ratio": times[k] / times[b],
                    "memory_ratio": mem[0] / mem[1] if mem[0] is not None and mem[1] else None})
    return out


def backward_forward(rows: list[dict]) -> list[dict]:
    times = timed(rows)
    out = []
    seen = set()
    for r in rows:
        k = (r["config"], r["impl"])
        if k in seen or (*k, "forward") not in times:
            continue
        seen.add(k)
        fwd = times[(*k, "forward")]
        bwd, both = times.get((*k, "backward")), times.get((*k, "both"))
        if bwd is None and both is None:
            continue
        out.append({"config": k[0], "impl": k[1], "forward_ms": fwd, "backward_ms": bwd, "both_ms": both,
                    "backward_over_forward": None if bwd is None else bwd / fwd,
                    "both_over_forward": None if both is None else both / fwd})
    return out


def variant_overhead(rows: list[dict], adapter: adapters.Adapter) -> list[dict]:
    axis = adapter.variant_axis
    reference = next(a for a in adapter.axes if a.name == axis).default[0]
    others = [a.name for a in adapter.axes if a.name != axis]
    times = {(tuple(r[a] for a in others), r["impl"], r["phase"], r[axis]): finite(r["time_ms"])
             for r in rows if r["status"] == "ok" and finite(r["time_ms"]) is not None}
    out = []
    for (fixed, impl, phase, variant), t in times.items():
        ref = times.get((fixed, impl, phase, str(reference)))
        if variant == str(reference) or ref is None:
            continue
        out.append({**dict(zip(others, fixed)), "impl": impl, "phase": phase, axis: variant,
                    "reference": reference, "time_ms": t, "reference_ms": ref, "overhead": t / ref})
    return out


def crossovers(ratios: list[dict], adapter: adapters.Adapter) -> list[dict]:
    axes = [a.name for a in adapter.axes]
    out = []
    for axis in (a for a in adapter.plot_axes if a in axes):
        others = [a for a in axes if a != axis]
        series: dict[tuple, list[tuple[float, float]]] = {}
        for r in ratios:
            x = finite(r[axis])
            if x is None or x <= 0:
                continue
            series.setdefault((r["impl"], r["phase"], tuple(r[a] for a in others)), []).append((x, r["time_ratio"]))
        for (impl, phase, fixed), points in sorted(series.items()):
            points.sort()
            for (x0, r0), (x1, r1) in zip(points, points[1:]):
                if (r0 - 1) * (r1 - 1) >= 0 or x0 == x1:
                    continue
                lr0, lr1 = math.log(r0), math.log(r1)
                x = math.exp(math.log(x0) + (math.log(x1) - math.log(x0)) * lr0 / (lr0 - lr1))
                out.append({"impl": impl, "baseline": ratios[0]["baseline"], "phase": phase, "axis": axis,
                            "fixed": ",".join(f"{a}={v}" for a, v in zip(others, fixed)), "x0": x0, "x1": x1,
                            "ratio0": r0, "ratio1": r1, "crossover": x,
                            "baseline_faster": "above" if r1 > 1 else "below"})
    return out


def summary(rows: list[dict], ratios: list[dict]) -> list[dict]:
    out = []
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    for impl in impls:
        for phase in PHASES:
            mine = [r for r in rows if r["impl"] == impl and r["phase"] == phase]
            if not mine:
                continue
            kinds = [r["status"].split(":")[0] for r in mine]
            fractions = [f for f in (finite(r["floor_fraction"]) for r in mine if r["status"] == "ok") if f]
            peaks = [p for p in (finite(r["peak_mb"]) for r in mine if r["status"] == "ok") if p is not None]
            out.append({"impl": impl, "phase": phase, "configs": len(mine),
                        **{k: kinds.count(k) for k in ("ok", "oom", "skipped", "error")},
                        "geomean_time_ratio": geomean([x["time_ratio"] for x in ratios
                                                       if x["impl"] == impl and x["phase"] == phase]),
                        "floor_fraction_median": statistics.median(fractions) if fractions else None,
                        "floor_fraction_best": max(fractions) if fractions else None,
                        "peak_mb_max": max(peaks) if peaks else None})
    return out


# -------------------------------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _spans_decades(values: list[float]) -> bool:
    values = [v for v in values if v and v > 0]
    return bool(values) and max(values) / min(values) >= 10


def line_plot(path: Path, rows: list[dict], x: str, y, ylabel: str, title: str, xlabel: str,
              hline: Optional[tuple[float, str]] = None) -> Optional[Path]:
    """One subplot per phase present; per implementation, markers at every row and a line through the geometric
    mean at each x (rows differing in other axes share an x). ``y(row)`` -> value or None. One legend entry per
    implementation (plus the horizontal reference line, when given)."""
    plt = _pyplot()
    phases = [p for p in PHASES if any(r["phase"] == p for r in rows)]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    points = {(p, i): [(finite(r[x]), y(r)) for r in rows if r["phase"] == p and r["impl"] == i
                       and r["status"] == "ok"] for p in phases for i in impls}
    points = {k: [(a, b) for a, b in v if a is not None and b is not None and b > 0] for k, v in points.items()}
    if not any(points.values()):
        return None
    fig, axes = plt.subplots(1, len(phases), figsize=(5.0 * len(phases), 4.0), squeeze=False)
    colors = {i: f"C{n % 10}" for n, i in enumerate(impls)}
    xs_all = [a for v in points.values() for a, _ in v]
    ys_all = [b for v in points.values() for _, b in v]
    for ax, phase in zip(axes[0], phases):
        for impl in impls:
            pts = points[(phase, impl)]
            if not pts:
                continue
            ax.scatter([a for a, _ in pts], [b for _, b in pts], color=colors[impl], s=14, alpha=0.6)
            by_x: dict[float, list[float]] = {}
            for a, b in pts:
                by_x.setdefault(a, []).append(b)
            line = sorted((a, geomean(bs)) for a, bs in by_x.items())
            ax.plot([a for a, _ in line], [b for _, b in line], color=colors[impl], marker="o", markersize=3,
                    label=impl)
        if hline:
            ax.axhline(hline[0], color="black", linestyle="--", linewidth=0.8, label=hline[1])
        ax.set_xscale("log" if _spans_decades(xs_all) else "linear")
        ax.set_yscale("log" if _spans_decades(ys_all) else "linear")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} ({phase})")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bar_plot(path: Path, groups: list[str], series: dict[str, list[Optional[float]]], ylabel: str,
             title: str) -> Optional[Path]:
    """Grouped bars (log y, a line at 1), one legend entry per series."""
    if not groups or not any(v for vs in series.values() for v in vs):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(groups) * max(1, len(series)) / 2), 4.0))
    width = 0.8 / max(1, len(series))
    for n, (label, values) in enumerate(series.items()):
        xs = [g + (n - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def heatmap(path: Path, ratios: list[dict], phase: str, baseline: str) -> Optional[Path]:
    """Configurations x implementations, colour = log2(time ratio), each cell annotated with the ratio."""
    mine = [r for r in ratios if r["phase"] == phase]
    if not mine:
        return None
    plt = _pyplot()
    configs = list(dict.fromkeys(r["config"] for r in mine))
    impls = list(dict.fromkeys(r["impl"] for r in mine))
    value = {(r["config"], r["impl"]): r["time_ratio"] for r in mine}
    grid = [[math.log2(value[(c, i)]) if (c, i) in value else float("nan") for i in impls] for c in configs]
    fig, ax = plt.subplots(figsize=(2.0 + 1.3 * len(impls), 1.0 + 0.32 * len(configs)))
    bound = max([abs(v) for row in grid for v in row if not math.isnan(v)] + [1.0])
    image = ax.imshow(grid, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
    for y, c in enumerate(configs):
        for x, i in enumerate(impls):
            if (c, i) in value:
                ax.text(x, y, f"{value[(c, i)]:.3g}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(impls)), impls, fontsize=8)
    ax.set_yticks(range(len(configs)), configs, fontsize=6)
    fig.colorbar(image, ax=ax, label=f"log2(time / {baseline} time)")
    ax.set_title(f"time / {baseline} ({phase}); > 1: {baseline} faster")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------- entry


def analyze(csv_path: Path, out_dir: Path, fmt: str = "png", baseline: Optional[str] = None,
            plots: bool = True) -> list[Path]:
    """Write the tables and (unless not ``plots``) plots of ``csv_path`` (its family from the ``family`` column;
    the copy bandwidth from ``benchmark_full.json`` beside it when present) into ``out_dir``; returns the files
    written."""
    rows = read_rows(Path(csv_path))
    if not rows:
        raise ValueError(f"{csv_path}: no rows")
    families = {r["family"] for r in rows}
    if len(families) != 1:
        raise ValueError(f"{csv_path}: expected one family, found {sorted(families)}")
    adapter = adapters.load(families.pop())
    baseline = baseline or default_baseline(adapter, rows)
    if baseline not in {r["impl"] for r in rows}:
        raise ValueError(f"--baseline {baseline!r} is not in the CSV")
    header_path = Path(csv_path).with_name("benchmark_full.json")
    header = json.loads(header_path.read_text()) if header_path.exists() else {}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    ratios = baseline_ratios(rows, baseline)
    tables = {
        "summary_stats.csv": summary(rows, ratios),
        "baseline_ratios.csv": ratios,
        "backward_forward_ratios.csv": backward_forward(rows),
        f"{adapter.variant_axis}_overhead.csv": variant_overhead(rows, adapter),
        "crossover_points.csv": crossovers(ratios, adapter) if ratios else [],
    }
    for name, table in tables.items():
        cols = list(dict.fromkeys(k for row in table for k in row)) or ["empty"]
        write_csv(out_dir / name, table, cols)
        written.append(out_dir / name)
    if not plots:
        return written

    size, unit = adapter.size_column, adapter.size_unit
    labels = {a.name: f"{a.name}: {a.help}" for a in adapter.axes}
    memory_column = adapter.memory_column or size
    first = adapter.plot_axes[0]
    figures = [line_plot(out_dir / f"time_vs_{axis}.{fmt}", rows, axis, lambda r: finite(r["time_ms"]),
                       "median time (ms)", f"{adapter.title}: time", labels.get(axis, axis))
             for axis in adapter.plot_axes]
    figures.append(line_plot(out_dir / f"throughput_vs_{first}.{fmt}", rows, first, lambda r: finite(r["throughput"]),
                           f"throughput ({unit} / s)", f"{adapter.title}: throughput", labels.get(first, first)))
    copy = (header.get("floors") or {}).get("copy_bytes_per_s")
    figures += [line_plot(out_dir / f"bandwidth_vs_{axis}.{fmt}", rows, axis,
                        lambda r: finite(r["bytes_per_s"]) and finite(r["bytes_per_s"]) / 1e9,
                        "floor bytes / time (GB/s)", f"{adapter.title}: bytes/s vs the floor", labels.get(axis, axis),
                        hline=(copy / 1e9, "copy bandwidth (floor)") if copy else None)
              for axis in adapter.plot_axes]
    figures.append(line_plot(out_dir / f"memory_per_unit_vs_{first}.{fmt}", rows, first,
                           lambda r: finite(r["peak_mb"]) and finite(r[memory_column])
                           and finite(r["peak_mb"]) * 2**20 / finite(r[memory_column]),
                           f"peak bytes per {memory_column}", f"{adapter.title}: memory per {memory_column}",
                           labels.get(first, first)))
    bf = tables["backward_forward_ratios.csv"]
    impls = list(dict.fromkeys(r["impl"] for r in bf))
    figures.append(bar_plot(out_dir / f"backward_forward.{fmt}", impls,
                          {"backward / forward": [geomean([r["backward_over_forward"] for r in bf if r["impl"] == i])
                                                  for i in impls],
                           "both / forward": [geomean([r["both_over_forward"] for r in bf if r["impl"] == i])
                                              for i in impls]},
                          "time ratio (geometric mean over configurations)",
                          f"{adapter.title}: backward / forward"))
    overhead = tables[f"{adapter.variant_axis}_overhead.csv"]
    variants = list(dict.fromkeys(r[adapter.variant_axis] for r in overhead))
    o_impls = list(dict.fromkeys(r["impl"] for r in overhead))
    figures.append(bar_plot(out_dir / f"{adapter.variant_axis}_overhead.{fmt}", o_impls,
                          {v: [geomean([r["overhead"] for r in overhead if r["impl"] == i
                                        and r[adapter.variant_axis] == v]) for i in o_impls] for v in variants},
                          "time / reference variant (geometric mean)", f"{adapter.title}: {adapter.variant_axis} "
                          "overhead"))
    figures += [heatmap(out_dir / f"ratio_heatmap_{phase}.{fmt}", ratios, phase, baseline) for phase in PHASES]
    written += [p for p in figures if p is not None]
    return written
