"""The benchmark pages of the trace site (``python -m benchmarks site``): current with the committed results, and
marked STALE when the family's sources changed since the run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import site, site_plots  # noqa: E402
from benchmarks.analysis import analyze  # noqa: E402
from benchmarks.common import RESULTS, blob_id  # noqa: E402

SYNTHETIC = ROOT / "tests" / "test_benchmarks_analysis.py"


def test_committed_pages_are_current():
    stale = site.write_pages(RESULTS, check=True)
    assert not stale, f"run `python -m benchmarks site` and commit: {stale}"


def test_plots_are_committed_once_and_served_where_the_analysis_wrote_them():
    """No image is committed under traces/ (the site's docs): every plot a committed benchmark page shows is a
    file of benchmarks/results/, which the site's hook serves at the page's link (benchmarks/site_plots.py, named
    in mkdocs.yml)."""
    import re
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "traces"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert not [p for p in tracked if p.endswith((".png", ".pdf", ".svg", ".jpg"))]
    served = site_plots.served()
    links = [(page.name, link) for page in (ROOT / "traces" / "guide" / "benchmarks").glob("*.md")
             for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", page.read_text())]
    assert links, "no committed benchmark page shows a plot"
    for name, link in links:
        assert f"{site_plots.PAGES_URI}/{link}" in served, f"{name} links {link}, which the site does not serve"
    assert "  - benchmarks/site_plots.py\n" in (ROOT / "mkdocs.yml").read_text()


def write_header(run: Path, sources: dict) -> None:
    header = {"family": "semicrf", "device": {"type": "cuda", "name": "Test GPU"}, "commit": "abc123",
              "started": "2026-11-23T00:00:00Z", "versions": {"torch": "2.11"}, "sources": sources,
              "floors": {"description": "copy 3 TB/s", "copy_bytes_per_s": 3e12},
              "settings": {"timing": "CUDA events", "notes": ["a note"]}}
    (run / "benchmark_full.json").write_text(json.dumps(header))


def make_results(tmp_path: Path, sources: dict) -> Path:
    """A results tree with a synthetic semi-CRF run (the CSV of the analysis test) and its plots."""
    sys.path.insert(0, str(SYNTHETIC.parent))
    from test_benchmarks_analysis import synthetic_csv

    run = tmp_path / "results" / "semicrf" / "test-gpu"
    run.mkdir(parents=True)
    synthetic_csv(run / "benchmark_full.csv")
    write_header(run, sources)
    analyze(run / "benchmark_full.csv", run / "plots", "png")
    return tmp_path / "results"


def test_page_shows_run_plots_and_table_and_marks_stale(tmp_path):
    current = site.current_sources("semicrf")
    assert current and all(blob == blob_id(ROOT / p) for p, blob in current.items())
    results = make_results(tmp_path, current)
    pages = tmp_path / "pages"
    assert site.write_pages(results, pages=pages)  # written the first time
    assert site.write_pages(results, check=True, pages=pages) == []  # then current
    text = (pages / "semicrf.md").read_text()
    assert "STALE" not in text and "Test GPU" in text and "`abc123`" in text and "2026-11-23" in text
    assert "| B=4,T=100,K=8,C=3,semiring=Log | forward | 2 ms | 1 ms (0.5x) |" in text
    assert "## Test GPU" in text and "results/semicrf/test-gpu/` (CSV" in text
    images = [line for line in text.splitlines() if line.startswith("![")]
    assert len(images) >= 3
    plots = site_plots.served(results)
    for line in images:
        link = line.split("(")[1].rstrip(")")
        assert plots[f"{site_plots.PAGES_URI}/{link}"].stat().st_size > 0, link
    assert not list(pages.rglob("*.png")), "plots copied next to the page"

    changed = dict(current)
    path = next(iter(changed))
    changed[path] = "0" * 40
    write_header(results / "semicrf" / "test-gpu", changed)
    assert site.write_pages(results, check=True, pages=pages) == [str(pages / "semicrf.md")]
    site.write_pages(results, pages=pages)
    text = (pages / "semicrf.md").read_text()
    assert '!!! warning "STALE"' in text and f"`{path}`" in text


def test_a_benchmark_goes_stale_with_the_runtime_not_the_verification_registration():
    """A benchmark times what a call runs: an edit of the family's registration (cases, checks) or oracle leaves
    it current; an edit of a kernel or its host side makes it stale."""
    header_sources = {**site.current_sources("sinkhorn"), "kernels/sinkhorn/family.py": "0" * 40,
                      "kernels/sinkhorn/oracle.py": "0" * 40}
    assert site.staleness({"sources": header_sources}, "sinkhorn") == []
    kernel = "kernels/sinkhorn/triton_sinkhorn.py"
    assert kernel in header_sources
    assert site.staleness({"sources": {**header_sources, kernel: "0" * 40}}, "sinkhorn") == [kernel]


def test_page_shows_a_result_below_the_floor_as_invalid(tmp_path):
    from test_benchmarks_analysis import with_fake_fast_row

    run = tmp_path / "results" / "semicrf" / "test-gpu"
    run.mkdir(parents=True)
    with_fake_fast_row(run / "benchmark_full.csv")
    write_header(run, site.current_sources("semicrf"))
    site.write_pages(tmp_path / "results", pages=tmp_path / "pages")
    text = (tmp_path / "pages" / "semicrf.md").read_text()
    assert "| B=4,T=100,K=8,C=3,semiring=Log | forward | 2 ms | 1 ms (0.5x) | invalid |" in text
    assert "### Invalid: below the hardware floor" in text
    assert "- B=4,T=100,K=8,C=3,semiring=Log `torch` forward: median 0.05 ms is below the bandwidth floor" in text


def test_page_shows_each_devices_kernel_breakdown_and_checks(tmp_path):
    """A family's page lists the breakdown (wall, kernels, floor, longest kernel, status) and the checks (verdict,
    rows and failed rows) of every device folder that holds them."""
    env = {"device": {"type": "cuda", "name": "Test GPU"}, "commit": "abc123", "versions": {}}
    run = tmp_path / "results" / "sinkhorn" / "test-gpu"
    run.mkdir(parents=True)
    (run / "breakdown.json").write_text(json.dumps({"environment": env, "floors": "copy 3 TB/s", "cases": [
        {"config": "B=4,n=4,iters=20,domain=log,dtype=float32", "phase": "forward", "status": "ok", "wall_us": 12.0,
         "kernels_us": 3.5, "floor_us": 1.25, "kernels": [{"kernel": "sinkhorn_log_kernel", "us": 3.5}]}]}))
    (run / "checks.json").write_text(json.dumps({**env, "checks": {
        "routes": {"passed": False, "seconds": 3.0, "help": "every route", "rows": [{"ok": True}, {"ok": False}]},
        "guards": {"passed": None, "status": "skipped: wall-clock budget spent"}}}))
    site.write_pages(tmp_path / "results", pages=tmp_path / "pages")
    text = (tmp_path / "pages" / "sinkhorn.md").read_text()
    assert "## Kernel breakdown: Test GPU" in text and "## Checks: Test GPU" in text
    assert ("| B=4,n=4,iters=20,domain=log,dtype=float32 | forward | 12.0 | 3.5 | 1.2 | `sinkhorn_log_kernel` 3.5 us "
            "| ok |") in text
    assert "| routes | FAILED | 2 (1) | 3 | every route |" in text
    assert "| guards | skipped: wall-clock budget spent | 0 (0) | - |  |" in text


def test_page_judges_the_adapters_targets(tmp_path, monkeypatch):
    import dataclasses

    from benchmarks import adapters

    results = make_results(tmp_path, site.current_sources("semicrf"))
    load = adapters.load
    fake = dataclasses.replace(load("semicrf"), targets=(
        adapters.Target(">= 1x flash-semicrf at T=100", {"T": 100, "semiring": "Log"}, ("forward", "both"),
                        "speedup:flash-semicrf", 1.0),))
    monkeypatch.setattr(adapters, "load", lambda family: fake if family == "semicrf" else load(family))
    site.write_pages(results, pages=tmp_path / "pages")
    text = (tmp_path / "pages" / "semicrf.md").read_text()
    assert "### Targets" in text and "1 of 2 met (`triton`;" in text
    assert "| >= 1x flash-semicrf at T=100 | B=4,T=100,K=8,C=3,semiring=Log | forward | 0.5 | 1 | **no** |" in text
    assert "| >= 1x flash-semicrf at T=100 | B=4,T=100,K=8,C=3,semiring=Log | both | 2 | 1 | yes |" in text


def test_overhead_targets_name_a_kernel_bound_miss():
    """A forward that misses its target says so; where the kernel alone is above the target (no host path could meet
    it), the miss is marked kernel-bound with the kernel's own ratio, else host-bound with the host part's ratio
    where it was measured; the peers' rows are not judged."""
    targets = {"forward": 2.5, "both": 6.0}
    row = dict(ours=True, forward_us=30.0, forward_x_trivial=4.0, kernel_us=27.0, both_x_trivial_step=5.0)
    assert site._targets_met(row, targets) == (
        "fwd missed (kernel-bound: the kernel alone is 3.6x the trivial op), fwd+bwd met")
    assert site._targets_met(dict(row, kernel_us=6.0), targets) == "fwd missed, fwd+bwd met"
    host_bound = dict(row, kernel_us=6.0, host_x_trivial=3.2)
    assert site._targets_met(host_bound, targets) == (
        "fwd missed (host-bound: the host part is 3.2x the trivial op's), fwd+bwd met")
    assert site._targets_met(dict(row, forward_x_trivial=2.0, forward_us=15.0), targets) == "fwd met, fwd+bwd met"
    assert site._targets_met(dict(row, ours=False), targets) == "-"


def test_an_incomplete_run_shows_what_is_missing_and_no_numbers(tmp_path):
    """A run whose budget ran out before every measurement (a plot of it would draw the missing points as 'not
    run' next to data) shows the missing measurements and the command of a complete run; no plot, median or
    target of it."""
    import csv

    results = make_results(tmp_path, site.current_sources("semicrf"))
    run = results / "semicrf" / "test-gpu"
    with open(run / "benchmark_full.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows[0]["status"], rows[1]["status"] = "skipped: wall-clock budget spent", \
        "skipped: one call would take ~31.9 s (estimate), 3 s of the budget left"
    with open(run / "benchmark_full.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    site.write_pages(results, pages=tmp_path / "pages")
    text = (tmp_path / "pages" / "semicrf.md").read_text()
    assert '!!! warning "INCOMPLETE"' in text and f"2 of {len(rows)} measurements were not made" in text
    assert "`python -m benchmarks gpu --out benchmarks/results --families semicrf`" in text
    assert f"- {rows[0]['config']}: {rows[0]['impl']} ({rows[0]['phase']}" in text
    assert "![" not in text and "### Medians" not in text and "### Targets" not in text
    assert not (tmp_path / "pages" / "semicrf").exists()  # no plot copied


def test_every_committed_run_names_its_commit_by_id():
    """A run stamped with anything but a commit id (two were stamped 'ref: refs/heads/main', .git/HEAD's text)
    shows as such on its page; the committed results hold none."""
    from benchmarks.common import COMMIT_ID

    assert site.commit_text("180963c32fd368220bf787e99056461ac91187cf") == "`180963c32fd368220bf787e99056461ac91187cf`"
    assert site.commit_text("ref: refs/heads/main").startswith("**not a commit id**")
    stamps = [(path, data.get("commit") or data.get("environment", {}).get("commit"))
              for path in RESULTS.rglob("*.json") if isinstance(data := json.loads(path.read_text()), dict)]
    stamps = [(path, commit) for path, commit in stamps if commit is not None]
    assert len(stamps) >= 4
    assert [(str(p), c) for p, c in stamps if not COMMIT_ID.fullmatch(c)] == []


def test_results_are_stamped_with_a_commit_id_or_not_at_all(monkeypatch):
    from benchmarks.common import current_commit

    monkeypatch.setenv("SENTINEL_COMMIT", "ref: refs/heads/main")
    with pytest.raises(ValueError, match=r"^SENTINEL_COMMIT must be a commit id .*got 'ref: refs/heads/main'"):
        current_commit()
    monkeypatch.setenv("SENTINEL_COMMIT", "180963c32fd368220bf787e99056461ac91187cf")
    assert current_commit() == "180963c32fd368220bf787e99056461ac91187cf"
