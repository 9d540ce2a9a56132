"""``sentinel site``: build the trace site of the current repository (the ``traces/`` that ``sentinel trace`` writes)
with mkdocs, strictly, into ``site/`` (``--out DIR``), or serve it on 127.0.0.1 (``--serve``, rebuilt on change).

The repository's own ``mkdocs.yml`` configures the build when it has one; else sentinel's default configuration
does, ``site.yml`` beside this module (mkdocs-material, Mermaid and the stylesheet served from the site by the hook
:mod:`kernel_sentinel.site`, where kernel_sentinel is installed), with ``docs_dir`` the repository's ``traces/``.
This repository's ``mkdocs.yml`` inherits that file: the theme and extensions have one source. Needs the ``docs``
extra (without it, a usage error naming :data:`DOCS_EXTRA`). Exit codes: 0 built (or served until stopped), 1 when
the build fails (under ``strict`` any warning does: a broken link, a page left out of the navigation), 2 on usage
errors.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
from pathlib import Path
from typing import Any

from kernel_sentinel import console
from kernel_sentinel.cli import COMMANDS
from kernel_sentinel.trace import TRACES_DIR_NAME

DEFAULT_CONFIG = Path(__file__).resolve().parent / "site.yml"
DOCS_EXTRA = "pip install 'kernel-sentinel[docs]'"


def site_config(repo: Path, out: Path) -> tuple[Path, dict[str, Any]]:
    """The mkdocs configuration file of ``repo``'s trace site and the settings that override it: the repository's
    ``mkdocs.yml``, else :data:`DEFAULT_CONFIG` with ``docs_dir`` ``repo/traces`` and the repository's name in
    ``site_name``; ``site_dir`` ``out`` and ``strict`` either way."""
    if not isinstance(repo, Path) or not isinstance(out, Path):
        raise TypeError(f"repo and out must be paths, got {type(repo).__name__} and {type(out).__name__}")
    settings: dict[str, Any] = {"site_dir": str(out.resolve()), "strict": True}
    own = repo / "mkdocs.yml"
    if own.is_file():
        return own, settings
    return DEFAULT_CONFIG, {**settings, "docs_dir": str((repo / TRACES_DIR_NAME).resolve()),
                            "site_name": f"{repo.resolve().name} traces"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("site", help=COMMANDS["site"][1],
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="where the site goes, emptied first (default: site/ in the repository)")
    p.add_argument("--serve", action="store_true", help="serve the site on 127.0.0.1 instead, rebuilt on change")
    p.add_argument("--port", type=int, default=8000, help="the port --serve listens on (default 8000)")


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from kernel_sentinel.family import project_root

    missing = [name for name in ("mkdocs", "material") if importlib.util.find_spec(name) is None]
    if missing:
        return console.usage_error(f"sentinel site needs the docs extra ({' and '.join(missing)} not installed): "
                                   f"{escape(DOCS_EXTRA)}")
    if not 0 < args.port < 65536:
        return console.usage_error(f"--port must be in 1..65535, got {args.port}")
    repo = project_root()
    config_file, settings = site_config(repo, args.out or repo / "site")
    if config_file == DEFAULT_CONFIG and not (repo / TRACES_DIR_NAME / "index.md").is_file():
        return console.usage_error(f"{repo} has no {TRACES_DIR_NAME}/index.md: run `sentinel trace` first")
    from mkdocs.commands.build import build
    from mkdocs.commands.serve import serve
    from mkdocs.config import load_config
    from mkdocs.exceptions import MkDocsException

    log = logging.getLogger("mkdocs")
    log.setLevel(logging.INFO)
    log.addHandler(logging.StreamHandler())
    try:
        if args.serve:
            serve(config_file=str(config_file), dev_addr=f"127.0.0.1:{args.port}",
                  **{k: v for k, v in settings.items() if k != "site_dir"})  # serve builds into a directory of its own
        else:
            build(load_config(str(config_file), **settings))
    except MkDocsException as exc:
        console.err.print(f"[bold red]sentinel site:[/] {escape(exc.format_message())}", highlight=False)
        return 1
    return 0
