"""The trace site's offline assets: an mkdocs hook (``hooks:`` in ``site.yml``, sentinel's default configuration of
a trace site, and in mkdocs.yml) that serves Mermaid and the site's stylesheet from the site.

mkdocs-material renders ``pre.mermaid`` blocks itself and loads ``mermaid.min.js`` from a CDN unless
``window.mermaid`` already exists when the first diagram is mounted. The hook adds three files to every build
(``mkdocs build`` and ``mkdocs serve``), the two scripts listed in ``extra_javascript`` so they run before
material mounts any diagram:

- ``assets/javascripts/mermaid.min.js`` from the npm package ``mermaid@MERMAID_VERSION`` (``npm pack``, checked
  against the pinned integrity, cached for every repository in ``mermaid-<version>/`` of :func:`cache_root`);
- ``assets/javascripts/mermaid-init.js``, which turns off Mermaid's own render-on-load pass so that material alone
  renders the diagrams (with its theme colours, light and dark);
- ``assets/stylesheets/sentinel.css`` (``extra_css``): code in tables, route ids above all, never breaks mid-word;
  the content takes the window's width and wraps table cells and code lines, so that no page scrolls sideways at
  desktop widths; the home page's grid cells are coloured by status (the Mermaid colours of
  :data:`kernel_sentinel.dashboard.COLOURS`).

Generated pages (their opening says "do not edit") hide the table of contents, for the width of their tables.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from kernel_sentinel.dashboard import COLOURS

MERMAID_VERSION = "11.17.2"
MERMAID_INTEGRITY = "sha512-V6K3C8EBdEsPFZXSKMJe6ppQOENxuHARr9GvHX4hh47lAbhMRD9qf4oEK7LoaRQxULMa80/qt5gHO73aCleBBg=="
MERMAID_URI = "assets/javascripts/mermaid.min.js"
INIT_URI = "assets/javascripts/mermaid-init.js"
INIT_JS = "// Material renders the diagrams (see sentinel/site.py); Mermaid must not start on its own.\n" \
          "mermaid.initialize({ startOnLoad: false });\n"
CSS_URI = "assets/stylesheets/sentinel.css"
CSS = """/* The trace site's stylesheet (sentinel/site.py). */
/* Route ids and other code in tables never break mid-word. */
.md-typeset table code { white-space: nowrap; word-break: keep-all; }
/* Nothing scrolls sideways at desktop widths: the content takes the window's width, table cells and code lines
   wrap where they must. */
.md-grid { max-width: 100%; }
.md-typeset table:not([class]) { font-size: .6rem; }
.md-typeset table:not([class]) th, .md-typeset table:not([class]) td { padding: .4em .3em; min-width: 0;
  overflow-wrap: break-word; }
.md-typeset table:not([class]) th { overflow-wrap: anywhere; }
.md-typeset pre > code { white-space: pre-wrap; overflow-wrap: anywhere; }
/* The home page's family x device grid: each cell coloured by its status (sentinel.dashboard.GRID_CLASS). */
.sentinel-pass, .sentinel-fail, .sentinel-stale, .sentinel-not-run { display: block; padding: .2em .5em;
  border-radius: .2em; border-left: .3em solid; font-weight: 700; white-space: nowrap; }
"""
CSS += "".join(f".sentinel-{name.replace(' ', '-')} {{ background: {fill}; border-color: {stroke}; color: {text}; }}\n"
               for name, (fill, stroke, text) in COLOURS.items())
GENERATED = "do not edit"  # the first lines of every generated page (trace documents, benchmark pages) say so


def integrity(data: bytes) -> str:
    """npm's integrity string (``sha512-<base64>``) of a tarball."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def cache_root() -> Path:
    """Where downloads are kept between builds: ``kernel-sentinel`` in ``$XDG_CACHE_HOME`` (default ``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernel-sentinel"


def mermaid_js(cache_dir: Path) -> Path:
    """Path of ``mermaid.min.js`` of the pinned release, fetched with ``npm pack`` into ``cache_dir`` once."""
    target = cache_dir / f"mermaid-{MERMAID_VERSION}" / "mermaid.min.js"
    if target.is_file():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise PluginError(f"npm not found: the docs build fetches mermaid@{MERMAID_VERSION} from the npm registry "
                          "with `npm pack` (install it: apt-get install npm)")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([npm, "pack", f"mermaid@{MERMAID_VERSION}", "--json", "--pack-destination", tmp],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise PluginError(f"npm pack mermaid@{MERMAID_VERSION} failed: {done.stderr.strip()}")
        tarball = Path(tmp) / json.loads(done.stdout)[0]["filename"]
        if integrity(tarball.read_bytes()) != MERMAID_INTEGRITY:
            raise PluginError(f"{tarball.name} does not match the pinned integrity {MERMAID_INTEGRITY}")
        with tarfile.open(tarball) as archive:
            script = archive.extractfile("package/dist/mermaid.min.js").read()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.write_bytes(script)
    partial.replace(target)
    return target


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """mkdocs hook: a generated page (its opening says ``GENERATED``) hides the table of contents, so that its
    wide tables have the width of the window."""
    if GENERATED in markdown[:500]:
        page.meta.setdefault("hide", ["toc"])
    return markdown


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """mkdocs hook: add the pinned Mermaid, its init script and the stylesheet to the site."""
    files.append(File.generated(config, MERMAID_URI, abs_src_path=str(mermaid_js(cache_root()))))
    files.append(File.generated(config, INIT_URI, content=INIT_JS))
    files.append(File.generated(config, CSS_URI, content=CSS))
    return files
