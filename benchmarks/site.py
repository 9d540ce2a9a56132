"""The benchmark pages of the trace site, from committed results (``python -m benchmarks site``).

For each family (``adapters.families()``), ``traces/guide/benchmarks/<family>.md`` shows the committed run of
every device in ``benchmarks/results/<family>/<device slug>/`` (the latest run per device; latest device first):
device, commit, date, versions, floors; a table of medians and ratios per configuration and phase, where a median
below the hardware floor reads ``invalid`` and is listed with the reason (``runner.flag_below_floor``); the
adapter's targets, each met or not (``analysis.targets``); the key
plots, linked where the analysis wrote them and served from there by the site's hook ``benchmarks/site_plots.py``
(nothing is copied), shown one per row at the full width of the content), then each device's kernel breakdown
(``breakdown.json``) and checks (``checks.json``). ``overhead.md`` gathers every family's public-call report
(``results/<family>/<device slug>/overhead.json``).
A run that its wall-clock budget cut short (a measurement ``skipped`` for the budget) is marked INCOMPLETE and
shows what is missing and the command that makes a complete run, none of its numbers (no plot, median or target:
a missing point is no data). A commit that is no commit id reads **not a commit id**.
A page is marked STALE when a source file of the family changed since the run: the git blob ids stored in the
run's header (``sources``) are compared with those of ``Family.source_files()`` now. Pages are deterministic
(no generation time), so ``--check`` (and tests/test_benchmarks_site.py) can tell whether they are current.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from benchmarks import adapters
from benchmarks.adapters import PHASES
from benchmarks.analysis import baseline_ratios, default_baseline, targets
from benchmarks.common import COMMIT_ID, blob_id, fmt
from benchmarks.runner import finite, read_results
from benchmarks.site_plots import plot_link

REPO = Path(__file__).resolve().parents[1]
PAGES = REPO / "traces" / "guide" / "benchmarks"
BUDGET = "budget"  # the word of both statuses of a measurement the run's budget left out (benchmarks.common)
KEY_PLOTS = ("speedup_over_peer.png", "time_vs_{first}.png", "ratio_heatmap_both.png", "ratio_heatmap_forward.png",
             "bandwidth_vs_{first}.png", "backward_forward.png")
# The plots are shown one per row at the full width of the content (md_in_html keeps the images Markdown, so their
# links are resolved like any other)
PLOT_STYLE = "<style>.benchmark-plot img { display: block; width: 100%; height: auto; }</style>"


def current_sources(family: str) -> Optional[dict[str, str]]:
    """Blob ids of the files a call of the family runs, now (``Family.runtime_files()``; None when the family
    does not import)."""
    try:
        from kernel_sentinel.registry import families

        found = next((f for f in families() if f.name == family), None)
    except Exception:  # noqa: BLE001 - a broken registry means freshness cannot be told (the page says so)
        return None
    if found is None:
        return None
    return {str(p): blob_id(REPO / p) for p in found.runtime_files()}


def staleness(header: dict, family: str) -> Optional[list[str]]:
    """The files a call runs that changed or were added since the run (None: cannot tell). A removed module
    changes the file that imported it. Files of the run's header outside today's runtime set (e.g. the
    verification registration, recorded by older runs) are ignored."""
    now = current_sources(family)
    then = header.get("sources") or {}
    if now is None or not then:
        return None
    return sorted(p for p in now if now[p] != then.get(p))


def commit_text(commit: object) -> str:
    """A run's commit as Markdown code, or ``**not a commit id**`` with what the run stored instead."""
    return f"`{commit}`" if isinstance(commit, str) and COMMIT_ID.fullmatch(commit) else \
        f"**not a commit id** (the run stored `{commit!r}`)"


def unmeasured(rows: list[dict]) -> list[dict]:
    """The rows the run's wall-clock budget left unmeasured (``skipped:`` for the budget: spent, or too little of
    it left for one call); a run without them is complete."""
    return [r for r in rows if r["status"].startswith("skipped:") and BUDGET in r["status"]]


def missing_section(family: str, run_dir: Path, header: dict, rows: list[dict], missing: list[dict]) -> list[str]:
    """Markdown of an incomplete run: what is missing (per configuration, the implementations and phases) and the
    command that makes a complete run; none of its numbers are shown."""
    budget = header.get("settings", {}).get("budget_s")
    lines = ['!!! warning "INCOMPLETE"',
             f"    The run's wall-clock budget{f' ({budget:g} s)' if budget else ''} ran out: {len(missing)} of "
             f"{len(rows)} measurements {'was' if len(missing) == 1 else 'were'} not made, so its plots, medians and targets are not shown. Rerun it "
             f"on a GPU with the default budget (`python -m benchmarks gpu --out benchmarks/results --families "
             f"{family}`, then `python -m benchmarks site`).", "", "### Not measured", ""]
    by_config: dict[str, dict[str, list[str]]] = {}
    for r in missing:
        by_config.setdefault(r["config"], {}).setdefault(r["impl"], []).append(r["phase"])
    lines += [f"- {config}: " + "; ".join(f"{impl} ({', '.join(phases)})" for impl, phases in impls.items())
              for config, impls in by_config.items()]
    rel = run_dir.relative_to(REPO) if run_dir.is_relative_to(REPO) else run_dir
    return lines + ["", f"Partial results: `{rel}/`.", ""]


def results_table(rows: list[dict], adapter: adapters.Adapter, baseline: str) -> list[str]:
    """Markdown: per configuration and phase, each implementation's median (ms) and its time / baseline."""
    ratio = {(r["config"], r["impl"], r["phase"]): r["time_ratio"] for r in baseline_ratios(rows, baseline)}
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cell = {(r["config"], r["impl"], r["phase"]): r for r in rows}
    lines = ["| configuration | phase | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    for config in dict.fromkeys(r["config"] for r in rows):
        for phase in PHASES:
            if not any((config, i, phase) in cell for i in impls):
                continue
            parts = []
            for impl in impls:
                r = cell.get((config, impl, phase))
                if r is None:
                    parts.append("")
                elif r["status"] != "ok":
                    parts.append(r["status"].split(":")[0])
                else:
                    t = f"{fmt(finite(r['time_ms']), '.4g')} ms"
                    rt = ratio.get((config, impl, phase))
                    parts.append(t if rt is None else f"{t} ({rt:.3g}x)")
            lines.append(f"| {config} | {phase} | " + " | ".join(parts) + " |")
    return lines


def device_runs(results: Path, family: str, name: str = "benchmark_full.json") -> list[tuple[Path, dict]]:
    """(folder, JSON) of every device's run of ``family`` that holds ``name``: latest first by the run's
    ``started`` stamp, runs without one after them in folder-name order."""
    found = [(path.parent, json.loads(path.read_text())) for path in sorted(Path(results, family).glob(f"*/{name}"))]
    return sorted(found, key=lambda run: run[1].get("started", ""), reverse=True)


def run_section(family: str, adapter: adapters.Adapter, run_dir: Path, header: dict) -> list[str]:
    """The Markdown lines of one device's run."""
    rows = read_results(run_dir / "benchmark_full.csv")
    lines = [f"## {header.get('device', {}).get('name', run_dir.name)}", ""]
    changed = staleness(header, family)
    if changed:
        lines += ['!!! warning "STALE"', f"    The family's sources changed since this benchmark ({len(changed)} "
                  "file(s)): " + ", ".join(f"`{p}`" for p in changed) + ". Rerun it on a GPU.", ""]
    elif changed is None:
        lines += ['!!! note "Freshness unknown"', "    The family's source files could not be compared.", ""]
    device, versions = header.get("device", {}), header.get("versions", {})
    baseline = default_baseline(adapter, rows)
    lines += [f"- **Device**: {device.get('name', '?')} ({device.get('type', '?')})",
              f"- **Commit**: {commit_text(header.get('commit'))}",
              f"- **Date**: {header.get('started', '?')}",
              "- **Versions**: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
              f"- **Floors**: {header.get('floors', {}).get('description', '?')}",
              f"- **Timing**: {header.get('settings', {}).get('timing', '?')}",
              f"- **Ratios**: time / time of `{baseline}` at the same configuration and phase (> 1: `{baseline}` "
              "is faster)", ""]
    lines += [f"- {note}" for note in header.get("settings", {}).get("notes", [])] + [""]
    missing = unmeasured(rows)
    if missing:
        return lines + missing_section(family, run_dir, header, rows, missing)
    shown = [name for name in (plot.format(first=adapter.plot_axes[0]) for plot in KEY_PLOTS)
             if (run_dir / "plots" / name).exists()]
    lines += [PLOT_STYLE, ""] if shown else []
    for name in shown:
        lines += ['<div class="benchmark-plot" markdown="1">', "",
                  f"![{Path(name).stem.replace('_', ' ')}]({plot_link(family, run_dir, name)})", "", "</div>", ""]
    lines += ["### Medians", ""] + results_table(rows, adapter, baseline) + [""]
    judged = targets(rows, adapter)
    if judged:
        met = sum(t["met"] for t in judged)
        lines += ["### Targets", "", f"{met} of {len(judged)} met (`{baseline}`; a configuration without a valid time "
                  "on either side is not met).", "", "| target | configuration | phase | value | required | met |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {t['target']} | {t['config']} | {t['phase']} | "
                  f"{fmt(t['value'], '.3g') if t['value'] is not None else t['note'].split(':')[0]} | "
                  f"{t['minimum']:g} | {'yes' if t['met'] else '**no**'} |" for t in judged]
        lines += [""]
    invalid = [r for r in rows if r["status"].startswith("invalid")]
    if invalid:
        lines += ["### Invalid: below the hardware floor", "",
                  "These medians are faster than the floor allows, so they are not reported as speedups:", ""]
        lines += [f"- {r['config']} `{r['impl']}` {r['phase']}: {r['status'][len('invalid: '):]}" for r in invalid]
        lines += [""]
    rel = run_dir.relative_to(REPO) if run_dir.is_relative_to(REPO) else run_dir
    lines += [f"Full results: `{rel}/` (CSV, JSON header, memory breakdown, all plots and tables).", ""]
    return lines


def breakdown_section(run: dict) -> list[str]:
    """Markdown of one device's kernel breakdown (``python -m benchmarks breakdown``): per configuration and phase
    the call's wall time, its kernels' device time, the floor, the longest kernel and the status."""
    env = run["environment"]
    lines = [f"## Kernel breakdown: {env['device']['name']}", "", f"- **Commit**: {commit_text(env['commit'])}",
             f"- **Floors**: {run.get('floors', '?')}", "",
             "Per call (mean of the profiled calls): wall time (synchronised), the sum of its CUDA kernels' device "
             "times, the floor, the longest kernel.", "",
             "| configuration | phase | wall us | kernels us | floor us | longest kernel | status |",
             "|---|---|---|---|---|---|---|"]
    for case in run["cases"]:
        top = (case.get("kernels") or [None])[0]
        longest = "-" if top is None else f"`{top['kernel'][:48]}` {top['us']:.1f} us"
        cells = [case["config"], case.get("phase", "-"), fmt(case.get("wall_us"), ".1f"),
                 fmt(case.get("kernels_us"), ".1f"), fmt(case.get("floor_us"), ".1f"), longest,
                 case["status"].split(":")[0]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def checks_section(run: dict) -> list[str]:
    """Markdown of one device's checks (``python -m benchmarks check``): verdict, evidence rows, time."""
    lines = [f"## Checks: {run['device']['name']}", "", f"- **Commit**: {commit_text(run['commit'])}", "",
             "| check | verdict | rows (failed) | seconds | requirement |", "|---|---|---|---|---|"]
    for name, result in run["checks"].items():
        rows = result.get("rows", [])
        verdict = {True: "passed", False: "FAILED", None: result.get("status", "-")}[result.get("passed")]
        failed = sum(1 for r in rows if not r.get("ok"))
        lines.append(f"| {name} | {verdict} | {len(rows)} ({failed}) | {fmt(result.get('seconds'), '.0f')} | "
                     f"{result.get('help', '')} |")
    return lines + [""]


def page(family: str, results: Path) -> str:
    """The Markdown page of one family: its benchmark runs, then its kernel breakdowns and checks, each device's
    latest."""
    adapter = adapters.load(family)
    lines = [f"# Benchmark: {adapter.title}", "",
             f"<!-- generated by `python -m benchmarks site` from benchmarks/results/{family}/; do not edit -->", ""]
    runs = device_runs(results, family)
    if not runs:
        lines += ["No GPU benchmark of this family is committed yet. To make one on a GPU:", "",
                  "```bash", f"python -m benchmarks run --family {family}",
                  f"python -m benchmarks analyze --input benchmarks/results/{family}/<device>/benchmark_full.csv "
                  f"--output-dir benchmarks/results/{family}/<device>/plots", "python -m benchmarks site", "```", ""]
    for run_dir, header in runs:
        lines += run_section(family, adapter, run_dir, header)
    for _, run in device_runs(results, family, "breakdown.json"):
        lines += breakdown_section(run)
    for _, run in device_runs(results, family, "checks.json"):
        lines += checks_section(run)
    return "\n".join(lines)


OVERHEAD_COLUMNS = (("forward_us", ".1f"), ("forward_x_trivial", ".2f"), ("both_us", ".1f"), ("both_x_trivial", ".2f"),
                    ("both_x_trivial_step", ".2f"), ("kernel_us", ".1f"), ("host_us", ".1f"),
                    ("host_x_trivial", ".2f"),
                    ("forward_launches", "d"), ("both_launches", "d"), ("first_call_s", ".2f"))


def _targets_met(row: dict, targets: dict) -> str:
    """Whether a row of this project meets the overhead targets: forward against the trivial op, forward+backward
    against its training step; ``-`` for the trivial op and the peers."""
    if not row.get("ours") or row.get("forward_x_trivial") is None:
        return "-"
    forward_ok = row["forward_x_trivial"] <= targets["forward"]
    parts = [f"fwd {'met' if forward_ok else 'missed'}"]
    kernel_x = row["kernel_us"] / (row["forward_us"] / row["forward_x_trivial"]) if row.get("kernel_us") else None
    if not forward_ok and kernel_x is not None and kernel_x > targets["forward"]:
        parts[0] += f" (kernel-bound: the kernel alone is {kernel_x:.1f}x the trivial op)"
    elif not forward_ok and row.get("host_x_trivial") is not None:
        parts[0] += f" (host-bound: the host part is {row['host_x_trivial']:.1f}x the trivial op's)"
    if row.get("both_x_trivial_step") is not None:
        parts.append(f"fwd+bwd {'met' if row['both_x_trivial_step'] <= targets['both'] else 'missed'}")
    return ", ".join(parts)


def overhead_page(results: Path) -> Optional[str]:
    """The public-call page from every ``results/<family>/<device slug>/overhead.json`` (``python -m benchmarks
    overhead``), one section per device, or None when no run is committed."""
    by_device: dict[str, list[dict]] = {}
    for family in adapters.families():
        for run_dir, run in device_runs(results, family, "overhead.json"):
            by_device.setdefault(run_dir.name, []).append(run)
    if not by_device:
        return None
    lines = ["# Public calls: what the host costs", "",
             "<!-- generated by `python -m benchmarks site` from benchmarks/results/<family>/<device>/overhead.json; "
             "do not edit -->", "",
             "Wall time per public call: calls back to back, synchronised at the end, median of a few loops, in one "
             "process with a trivial torch op (`z.add(1)` on 16 floats), so host speed cancels in the ratio. "
             "Forward+backward is also divided by the trivial op's own training step (`zg * 2` and its backward "
             "through `torch.autograd.grad`): autograd's engine alone costs several times `z.add(1)`. Kernel: "
             "the forward captured in a CUDA graph and replayed (no host work; `-` where the call cannot be "
             "captured). Host (newer runs): the forward's host time with the GPU held busy by a sleep kernel (the "
             "calls only queue their work; `-` for a call that waits for the GPU), against the trivial op's "
             "measured the same way; the wall time per call is about the larger of kernel and host. Forward, "
             "forward+backward per training step and host ratios (newer runs): the median of per-repeat ratios, "
             "the trivial op timed right before the call (the host's speed drifts within a run). Launches: CUDA "
             "kernels, copies and memsets per call (`torch.profiler`). First call: the family's first "
             "forward+backward in the process, with an empty Triton cache (compilation included).", ""]
    for slug in sorted(by_device):
        runs = by_device[slug]
        env, targets = runs[0]["environment"], runs[0]["targets_x_trivial"]
        commits = ", ".join(dict.fromkeys(commit_text(r["environment"]["commit"]) for r in runs))
        gpu_busy = all(r.get("host_method") == "gpu-busy" for r in runs)
        host = ("the forward's host time with the GPU held busy" if gpu_busy else
                "forward - kernel (an older run: a host time shorter than the kernel hides under it)")
        lines += [f"## {env['device']['name']} ({env['device']['type']})", "", f"- **Commit**: {commits}",
                  f"- **Versions**: torch {env['versions']['torch']}, triton {env['versions']['triton']}",
                  f"- **Host**: {host}",
                  f"- **Targets**: forward <= {targets['forward']}x the trivial op, forward+backward <= "
                  f"{targets['both']}x the trivial op's training step (a training step through autograd costs "
                  f"several times `z.add(1)` before any kernel runs)", "",
                  "| family | shape | implementation | forward us | / trivial | fwd+bwd us | / trivial | / trivial step | "
                  "kernel us | host us | host / trivial | launches fwd | launches fwd+bwd | first call s | "
                  "targets |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in (row for run in runs for row in run["rows"]):
            cells = [row["family"], row["config"], row["impl"]] + [
                fmt(row.get(k), spec) if row.get(k) is not None else row.get("skipped", "-") if k == "forward_us"
                else "-" for k, spec in OVERHEAD_COLUMNS] + [_targets_met(row, targets)]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_pages(results: Path, check: bool = False, pages: Path = PAGES) -> list[str]:
    """Write (or with ``check``, compare) every family's page and the public-call page, and remove any plot copied
    into ``pages`` (the site serves them from ``results``: :mod:`benchmarks.site_plots`); returns the paths that
    were not current."""
    not_current = []
    text = overhead_page(Path(results))
    if text is not None:
        path = pages / "overhead.md"
        if not path.exists() or path.read_text() != text:
            not_current.append(str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path))
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    for family in adapters.families():
        path, text = pages / f"{family}.md", page(family, Path(results))
        if not path.exists() or path.read_text() != text:
            not_current.append(str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path))
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        for copied in sorted((pages / family).rglob("*.png")) if (pages / family).exists() else []:
            not_current.append(str(copied))
            if not check:
                copied.unlink()
    return not_current
