"""The consoles every command prints to (results on stdout, progress and errors on stderr), and usage errors.

When stdout is not a terminal (CI logs, pipes) and ``COLUMNS`` is unset, results are laid out 132 columns wide
rather than rich's default 80, so that tables keep one line per row.
"""
from __future__ import annotations

import os
import re
import sys

from rich.console import Console

out = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 132)
err = Console(stderr=True)

USAGE = 2


def usage_error(message: str) -> int:
    """Print ``message`` as a usage error on stderr; return exit code 2."""
    err.print(f"[bold red]usage error:[/] {message}", highlight=False, soft_wrap=True)  # one line, never wrapped
    return USAGE


def plain(doc: str) -> str:
    """A docstring as terminal text for ``--help``: reStructuredText and Markdown markup removed (``**bold**``,
    ````literal````, `` `code` ``, ``:func:`name``` roles), the words kept."""
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)  # :func:`name`, :class:`~x.Y`
    doc = re.sub(r"``([^`]+)``", r"\1", doc)
    doc = re.sub(r"(?<![`\w])`([^`\n]+)`", r"\1", doc)
    return re.sub(r"\*\*([^*]+)\*\*", r"\1", doc)
