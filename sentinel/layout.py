"""The repository's folders and the names they import as.

The folders are ``kernels/`` (the kernel library) and ``sentinel/`` (this toolkit); they install as
``provable_kernels`` and ``kernel_sentinel`` (``setup.py``), because PyPI's ``kernels`` (Hugging Face) and
``sentinel`` are other projects. :func:`import_root` makes a checkout importable without installing it: for a
scratch copy of the repository, a GPU machine's copy of the tree, or a test's temporary repository.
"""
from __future__ import annotations

from pathlib import Path

IMPORT_NAMES = {"kernels": "provable_kernels", "sentinel": "kernel_sentinel"}  # folder -> import name


def import_root(repo: Path, into: Path) -> Path:
    """Make ``into`` a directory of symlinks ``<import name> -> repo/<folder>`` and return it: put it on
    ``PYTHONPATH`` (or ``sys.path``) to import ``repo``'s code under the installed names."""
    into.mkdir(parents=True, exist_ok=True)
    for folder, name in IMPORT_NAMES.items():
        link = into / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(repo).resolve() / folder, target_is_directory=True)
    return into
