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
- Speedup over the peer = time of the adapter's ``peer`` / time of this project's first implementation in the CSV,
  per configuration and phase (> 1: ours is faster).
- Targets (the adapter's ``targets``): per target, matching configuration and phase, the metric of this project's
  first implementation (``floor_fraction`` = floor / time, or ``speedup:<impl>`` = time of <impl> / ours), the
  minimum and ``met``; a configuration where either side has no valid time is not met, and the note says why.
- Summary: per implementation and phase, how many configurations ran and how (statuses), the geometric mean of
  ``time_ratio``, the median and best floor fraction, the largest peak memory.
- Floor sanity: a row whose median is below its hardware floor is ``invalid`` (``runner.flag_below_floor``, applied
  when the CSV is read, so results written before the rule are flagged too): it enters no ratio, speedup or plot,
  and ``invalid_rows.csv`` lists it with the reason.

Outputs: summary_stats.csv, invalid_rows.csv, targets.csv, baseline_ratios.csv, backward_forward_ratios.csv,
<variant>_overhead.csv, crossover_points.csv, speedup_over_peer.csv, and plots (speedup over the peer per
configuration and phase; time and floor bytes/s, with the copy-bandwidth floor, against each plot axis; throughput and memory per unit of size
against the first; backward/forward ratios; ratio heatmaps per phase; variant overhead).

Line plots compare like with like: one subplot per phase, one per row; a line joins only points of one
implementation and phase whose other grid axes (every axis of the adapter but the x axis) are all equal; a
configuration with no such neighbour is an unconnected marker. Colour is the implementation (one legend entry
each), the marker the configuration of the other axes, labelled in the legend with the axes that differ.
"""
from __future__ import annotations

import json
import math
import statistics
import textwrap
from pathlib import Path
from typing import Optional, Sequence

from benchmarks import adapters
from benchmarks.common import write_csv
from benchmarks.runner import finite, read_results

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


def targets(rows: list[dict], adapter: adapters.Adapter) -> list[dict]:
    """Every target of the adapter judged at each matching configuration and phase in the CSV (module docstring)."""
    if not adapter.targets:
        return []
    ours = default_baseline(adapter, rows)
    times = timed(rows)
    by_key = {(r["config"], r["impl"], r["phase"]): r for r in rows}
    out = []
    for target in adapter.targets:
        configs = dict.fromkeys(r["config"] for r in rows
                                if all(str(r[axis]) == str(value) for axis, value in target.where.items()))
        for config in configs:
            for phase in target.phases:
                mine = by_key.get((config, ours, phase))
                if mine is None:
                    continue
                value, note = None, ""
                if target.metric == "floor_fraction":
                    value = finite(mine["floor_fraction"]) if mine["status"] == "ok" else None
                    note = "" if value is not None else f"{ours} {mine['status']}"
                else:
                    other = target.metric.split(":", 1)[1]
                    t_ours, t_other = times.get((config, ours, phase)), times.get((config, other, phase))
                    if t_ours is not None and t_other is not None:
                        value = t_other / t_ours
                    else:
                        note = "; ".join(f"{impl} {by_key[(config, impl, phase)]['status']}"
                                         if (config, impl, phase) in by_key else f"{impl} not in the CSV"
                                         for impl, t in ((ours, t_ours), (other, t_other)) if t is None)
                out.append({"target": target.name, "config": config, "phase": phase, "metric": target.metric,
                            "value": value, "minimum": target.minimum,
                            "met": value is not None and value >= target.minimum, "note": note})
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
                        **{k: kinds.count(k) for k in ("ok", "oom", "skipped", "error", "invalid")},
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


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p", "d", "8", "H")
LINESTYLES = ("-", "--", ":", "-.")
FILLS = ("full", "none", "left", "bottom")


def fixed_axes(axes: Sequence[str], x: str) -> list[str]:
    """The axes a line holds fixed: every grid axis but ``x`` (all of them when ``x`` is a derived column, so
    that points of a derived x are never joined)."""
    return [a for a in axes if a != x]


def line_groups(rows: list[dict], x: str, y, axes: Sequence[str]) -> dict[tuple, list[tuple[float, float]]]:
    """(phase, impl, values of ``fixed_axes(axes, x)``) -> [(x, y)] sorted by x, from the rows with status ok and a
    positive y: the points one line may join. Repeated measurements of one configuration (same x in a group) are
    merged into their geometric mean."""
    fixed = fixed_axes(axes, x)
    groups: dict[tuple, dict[float, list[float]]] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        a, b = finite(r[x]), y(r)
        if a is None or b is None or b <= 0:
            continue
        key = (r["phase"], r["impl"], tuple(str(r[f]) for f in fixed))
        groups.setdefault(key, {}).setdefault(a, []).append(b)
    return {k: sorted((a, bs[0] if len(bs) == 1 else geomean(bs)) for a, bs in v.items()) for k, v in groups.items()}


def short_labels(values: list[tuple], names: Sequence[str]) -> tuple[dict[tuple, str], str]:
    """Labels of configurations (``values``: tuples over ``names``) naming only the axes that differ between them,
    and a description of the axes they share."""
    values = list(dict.fromkeys(values))
    differ = [n for i, n in enumerate(names) if len({v[i] for v in values}) > 1]
    same = ", ".join(f"{n}={values[0][i]}" for i, n in enumerate(names) if n not in differ) if values else ""
    return {v: ", ".join(f"{n}={v[names.index(n)]}" for n in differ) for v in values}, same


def _family_adapter(rows: list[dict]) -> Optional[adapters.Adapter]:
    families = {r.get("family") for r in rows}
    family = families.pop() if len(families) == 1 else None
    return adapters.load(family) if family in adapters.families() else None


def line_figure(rows: list[dict], x: str, y, ylabel: str, title: str, xlabel: str,
                hline: Optional[tuple[float, str]] = None, axes: Optional[Sequence[str]] = None,
                variant: Optional[str] = None):
    """The figure of ``line_plot`` (None when there is nothing to draw): one subplot per phase present, one per
    row. A line joins only the points of one implementation and phase whose other axes (``fixed_axes``) are
    equal; a group with one point is an unconnected marker. Colour: implementation; marker: the group's fixed
    axes (line style and marker fill: its variant, when the variant axis differs between groups). The figure legend,
    above the plots, has one entry per implementation, then one per group labelled with the axes that differ
    between groups, then the axes every group shares. ``axes``/``variant`` default to the grid axes and
    ``variant_axis`` of the rows' family."""
    if axes is None or variant is None:
        adapter = _family_adapter(rows)
        if adapter is None:
            raise ValueError("line_figure: rows of one known family, or axes and variant, are needed")
        axes = [a.name for a in adapter.axes] if axes is None else axes
        variant = adapter.variant_axis if variant is None else variant
    axes = list(axes)
    series = line_groups(rows, x, y, axes)
    if not series:
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fixed = fixed_axes(axes, x)
    phases = [p for p in PHASES if any(k[0] == p for k in series)]
    impls = list(dict.fromkeys(r["impl"] for r in rows if any(k[1] == r["impl"] for k in series)))
    colors = {i: f"C{n % 10}" for n, i in enumerate(impls)}
    labels, same = short_labels([k[2] for k in series], fixed)
    groups = list(labels)
    v = fixed.index(variant) if variant in fixed else None
    variants = list(dict.fromkeys(g[v] for g in groups)) if v is not None else []
    styled_by_variant = len(variants) > 1
    rest = list(dict.fromkeys(g[:v] + g[v + 1:] if styled_by_variant else g for g in groups))
    style = {}  # group -> (marker, line style, marker fill)
    for g in groups:
        m = rest.index(g[:v] + g[v + 1:] if styled_by_variant else g)
        k = variants.index(g[v]) if styled_by_variant else m // len(MARKERS)
        style[g] = (MARKERS[m % len(MARKERS)], LINESTYLES[k % len(LINESTYLES)], FILLS[k % len(FILLS)])

    fig, subplots = plt.subplots(len(phases), 1, figsize=(9.0, 3.4 * len(phases) + 0.25 * (len(groups) + 2)),
                                 squeeze=False, layout="constrained")
    xs_all = [a for pts in series.values() for a, _ in pts]
    ys_all = [b for pts in series.values() for _, b in pts]
    for ax, phase in zip(subplots[:, 0], phases):
        for impl in impls:
            for g in groups:
                pts = series.get((phase, impl, g))
                if not pts:
                    continue
                marker, ls, fill = style[g]
                ax.plot([a for a, _ in pts], [b for _, b in pts], color=colors[impl], marker=marker, markersize=7,
                        fillstyle=fill, markeredgewidth=1.3, linestyle=ls if len(pts) > 1 else "none",
                        linewidth=1.5, alpha=0.9, gid=f"{phase}|{impl}|{','.join(g)}")
        if hline:
            ax.axhline(hline[0], color="black", linestyle="--", linewidth=0.8)
        ax.set_xscale("log" if _spans_decades(xs_all) else "linear")
        if _spans_decades(xs_all) and max(xs_all) < 1e4 and max(xs_all) / min(xs_all) < 1e3:
            # a short log axis: plain numbers at 1, 2, 5 x 10^k rather than 2 x 10^1
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log" if _spans_decades(ys_all) else "linear")
        ax.set_xlabel(xlabel, fontsize=11)
        ax.set_ylabel(ylabel, fontsize=11)
        ax.set_title(f"{title} ({phase})", fontsize=12)
        ax.tick_params(labelsize=10)
        ax.grid(True, which="major", alpha=0.3)
    # the legend, above the plots: implementations (and the reference line) in the first column, the groups of the
    # other axes in the second
    header = lambda text: Line2D([], [], linestyle="none", label=text)  # noqa: E731 - a legend line without a symbol
    first = [header("implementation:")] + [Line2D([], [], color=colors[i], linewidth=2.5, label=i) for i in impls]
    if hline:
        first.append(Line2D([], [], color="black", linestyle="--", linewidth=0.8, label=hline[1]))
    second = []
    if any(labels.values()):
        joined = {k[2] for k, pts in series.items() if len(pts) > 1}
        second.append(header("other axes (a line holds them all fixed):" if joined else
                             f"other axes (no two runs differ only in {x}: unconnected):"))
        second += [Line2D([], [], color="0.35", marker=style[g][0], fillstyle=style[g][2], markeredgewidth=1.3,
                          markersize=7, linestyle=style[g][1] if g in joined else "none",
                          label=labels[g] + ("" if g in joined or not joined else " (one point)")) for g in groups]
    if same:
        first += [header(""), header("the same in every run:")] + [header(f"  {t}") for t in same.split(", ")]
    rows_ = max(len(first), len(second))
    handles = first + [header("")] * (rows_ - len(first)) + second + [header("")] * (rows_ - len(second) if second
                                                                                        else 0)
    fig.legend(handles=handles, loc="outside upper center", ncol=2 if second else 1, fontsize=10, frameon=False,
               handlelength=2.5, columnspacing=3.0)
    return fig


def _save(fig, path: Path) -> Path:
    plt = _pyplot()
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def line_plot(path: Path, rows: list[dict], x: str, y, ylabel: str, title: str, xlabel: str,
              hline: Optional[tuple[float, str]] = None, axes: Optional[Sequence[str]] = None,
              variant: Optional[str] = None) -> Optional[Path]:
    """``line_figure`` written to ``path`` (None when there is nothing to draw). ``y(row)`` -> value or None."""
    fig = line_figure(rows, x, y, ylabel, title, xlabel, hline, axes, variant)
    return None if fig is None else _save(fig, path)


SPEEDUP_PHASES = ("forward", "both")  # what a user pays; the backward alone splits work differently per implementation


def speedup_over_peer(rows: list[dict], adapter: adapters.Adapter) -> list[dict]:
    """Per configuration and phase (forward, forward+backward: :data:`SPEEDUP_PHASES`; the backward alone is no
    like-for-like comparison, e.g. the semi-CRF runs its backward recursion inside a training forward):
    ``speedup`` = the peer's time / ours' time (peer: the adapter's ``peer``; ours: this project's first
    implementation in the CSV), None with a ``note`` when either did not run."""
    present = {r["impl"] for r in rows}
    if not adapter.peer or adapter.peer not in present:
        return []
    ours = default_baseline(adapter, rows)
    times = timed(rows)
    status = {(r["config"], r["impl"], r["phase"]): r["status"] for r in rows}
    names = [a.name for a in adapter.axes]
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        first = next(r for r in rows if r["config"] == config)
        for phase in SPEEDUP_PHASES:
            keys = [(config, ours, phase), (config, adapter.peer, phase)]
            if not any(k in status for k in keys):
                continue
            t_ours, t_peer = times.get(keys[0]), times.get(keys[1])
            missing = [f"{k[1]} {status.get(k, 'not in the CSV')}" for k, t in zip(keys, (t_ours, t_peer)) if t is None]
            out.append({"config": config, **{n: first[n] for n in names}, "phase": phase, "ours": ours,
                        "peer": adapter.peer, "ours_ms": t_ours, "peer_ms": t_peer,
                        "speedup": t_peer / t_ours if not missing else None, "note": "; ".join(missing)})
    return out


def _why(note: str) -> str:
    """'flash-semicrf skipped' of 'flash-semicrf skipped: one call would take ...' (each of '; '-joined notes)."""
    return "; ".join(part.split(":")[0] for part in note.split("; "))


def speedup_figure(table: list[dict], adapter: adapters.Adapter):
    """Horizontal bars from 1x to each speedup (log scale), one row of bars per configuration (labelled with the
    axes that differ between configurations), one colour per phase; a line at 1x; each bar annotated with its
    value, a configuration-phase that did not run with why (once per configuration when no phase ran). None when
    the table has no speedup."""
    if not any(r["speedup"] for r in table):
        return None
    plt = _pyplot()
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    names = [a.name for a in adapter.axes]
    configs = list(dict.fromkeys(r["config"] for r in table))
    first = {r["config"]: tuple(str(r[n]) for n in names) for r in table}
    labels, same = short_labels([first[c] for c in configs], names)
    phases = [p for p in PHASES if any(r["phase"] == p for r in table)]
    colors = {p: f"C{n}" for n, p in enumerate(phases)}
    ours, peer = table[0]["ours"], table[0]["peer"]
    height = 0.8 / len(phases)
    fig, ax = plt.subplots(figsize=(9.0, 1.8 + 0.3 * len(configs) * len(phases)), layout="constrained")
    values = [r["speedup"] for r in table if r["speedup"]]
    for c, config in enumerate(configs):
        mine = {r["phase"]: r for r in table if r["config"] == config}
        if not any(r["speedup"] for r in mine.values()):
            notes = list(dict.fromkeys(part for r in mine.values() for part in r["note"].split("; ")))
            ax.text(1.06, c, textwrap.fill("not run: " + "; ".join(notes), 48), va="center", ha="left",
                    fontsize=9, color="0.35")
            continue
        for n, phase in enumerate(phases):
            r = mine.get(phase)
            if r is None:
                continue
            yc = c + (n - (len(phases) - 1) / 2) * height
            if r["speedup"]:
                sp = r["speedup"]
                ax.barh(yc, sp - 1.0, height, left=1.0, color=colors[phase], gid=f"{config}|{phase}")
                ax.text(sp * (1.06 if sp >= 1 else 1 / 1.06), yc, f"{sp:,.0f}x" if sp >= 100 else f"{sp:.3g}x",
                        va="center", ha="left" if sp >= 1 else "right", fontsize=9)
            else:
                ax.text(1.06, yc, f"{phase}: {_why(r['note'])}", va="center", ha="left", fontsize=9,
                        color="0.35")
    for text in ax.texts:  # annotations inside the axes: they must not squeeze the layout
        text.set_in_layout(False)
    ax.axvline(1.0, color="black", linewidth=1.0)
    ax.set_xscale("log")
    lo, hi = min(values + [1.0]) / 4.0, max(values + [5.0]) * 4.0  # room right of 1x for the notes
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5) if hi / lo < 1e3 else (1,)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_ylim(len(configs) - 0.5, -0.5)
    ax.set_yticks(range(len(configs)), [textwrap.fill(labels[first[c]] or c, 30) for c in configs], fontsize=10)
    ax.tick_params(axis="x", labelsize=10)
    ax.set_xlabel(f"speedup over {peer} (x)", fontsize=11)
    fig.suptitle(f"{adapter.title}: speedup of {ours} over {peer}\n{peer} time / {ours} time per configuration "
                 f"(> 1: {ours} faster)" + (f"\nthe same in every run: {same}" if same else ""), fontsize=12)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    fig.legend(handles=[Patch(color=colors[p], label=p) for p in phases], title="phase", fontsize=10,
               title_fontsize=10, loc="outside right upper", frameon=False)
    return fig


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
    rows = read_results(Path(csv_path))
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
        "invalid_rows.csv": [{k: r[k] for k in ("config", "impl", "phase", "time_ms", "floor_ms", "floor_kind",
                                                 "status")} for r in rows if r["status"].startswith("invalid")],
        "targets.csv": targets(rows, adapter),
        "baseline_ratios.csv": ratios,
        "backward_forward_ratios.csv": backward_forward(rows),
        f"{adapter.variant_axis}_overhead.csv": variant_overhead(rows, adapter),
        "crossover_points.csv": crossovers(ratios, adapter) if ratios else [],
        "speedup_over_peer.csv": speedup_over_peer(rows, adapter),
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
    grid = {"axes": [a.name for a in adapter.axes], "variant": adapter.variant_axis}
    speedup = speedup_figure(tables["speedup_over_peer.csv"], adapter)
    figures = [None if speedup is None else _save(speedup, out_dir / f"speedup_over_peer.{fmt}")]
    figures += [line_plot(out_dir / f"time_vs_{axis}.{fmt}", rows, axis, lambda r: finite(r["time_ms"]),
                       "median time (ms)", f"{adapter.title}: time", labels.get(axis, axis), **grid)
             for axis in adapter.plot_axes]
    figures.append(line_plot(out_dir / f"throughput_vs_{first}.{fmt}", rows, first, lambda r: finite(r["throughput"]),
                           f"throughput ({unit} / s)", f"{adapter.title}: throughput", labels.get(first, first),
                           **grid))
    copy = (header.get("floors") or {}).get("copy_bytes_per_s")
    figures += [line_plot(out_dir / f"bandwidth_vs_{axis}.{fmt}", rows, axis,
                        lambda r: finite(r["bytes_per_s"]) and finite(r["bytes_per_s"]) / 1e9,
                        "floor bytes / time (GB/s)", f"{adapter.title}: bytes/s vs the floor", labels.get(axis, axis),
                        hline=(copy / 1e9, "copy bandwidth (floor)") if copy else None, **grid)
              for axis in adapter.plot_axes]
    figures.append(line_plot(out_dir / f"memory_per_unit_vs_{first}.{fmt}", rows, first,
                           lambda r: finite(r["peak_mb"]) and finite(r[memory_column])
                           and finite(r["peak_mb"]) * 2**20 / finite(r[memory_column]),
                           f"peak bytes per {memory_column}", f"{adapter.title}: memory per {memory_column}",
                           labels.get(first, first), **grid))
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
