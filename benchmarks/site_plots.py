"""The benchmark plots of the trace site, served from where the analysis writes them, never copied: an mkdocs hook
(``hooks:`` in mkdocs.yml). Each ``benchmarks/results/<family>/<device slug>/plots/<name>.png`` is the site's
``guide/benchmarks/<family>/<device slug>/<name>.png``, the path the family's benchmark page links
(:func:`plot_link`, written by ``python -m benchmarks site``)."""
from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PAGES_URI = "guide/benchmarks"  # the benchmark pages' folder in the site's docs_dir (traces/)


def plot_link(family: str, run_dir: Path, name: str) -> str:
    """The link from the family's page (``guide/benchmarks/<family>.md``) to the plot ``name`` of the run in
    ``run_dir`` (``results/<family>/<device slug>/``)."""
    return f"{family}/{run_dir.name}/{name}"


def served(results: Path = RESULTS) -> dict[str, Path]:
    """Every plot of ``results`` by its path in the site."""
    return {f"{PAGES_URI}/{plot_link(path.parents[2].name, path.parents[1], path.name)}": path
            for path in sorted(results.glob("*/*/plots/*.png"))}


def on_files(files, config):
    """mkdocs hook: add every plot of :data:`RESULTS` to the build (``mkdocs build`` and ``mkdocs serve``)."""
    from mkdocs.structure.files import File

    for uri, path in served().items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
