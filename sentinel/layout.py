"""The repository's folders and the names they import as.

The folders are ``kernels/`` (the kernel library) and ``sentinel/`` (this toolkit); they install as
``provable_kernels`` and ``kernel_sentinel`` (``setup.py``), because PyPI's ``kernels`` (Hugging Face) and
``sentinel`` are other projects. :func:`import_root` makes a checkout importable without installing it: for a
scratch copy of the repository, a GPU machine's copy of the tree, or a test's temporary repository.

Tools that read imports statically and take folder names for package names (an import-graph drawer such as
``farm-studio look``) see no arrow between ``kernels/`` and ``sentinel/`` in the tree itself. :func:`import_view`
writes a copy of the tree with the folders under their import names; ``python -m kernel_sentinel.layout DIR``
makes one in DIR (an empty or new directory) and prints its path:

    python -m kernel_sentinel.layout /tmp/import-view && farm-studio look --repo /tmp/import-view
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping

IMPORT_NAMES = {"kernels": "provable_kernels", "sentinel": "kernel_sentinel"}  # folder -> import name
GIT = ["git", "-c", "user.name=import view", "-c", "user.email=view@example.invalid", "-c", "commit.gpgsign=false"]


def import_root(repo: Path, into: Path, folders: Mapping[str, str] = IMPORT_NAMES) -> Path:
    """Make ``into`` a directory of symlinks ``<import name> -> repo/<folder>``, one for each of ``folders``
    (``{folder relative to repo: import name}``, default this repository's :data:`IMPORT_NAMES`), and return it: put
    it on ``PYTHONPATH`` (or ``sys.path``) to import ``repo``'s code under those names."""
    into.mkdir(parents=True, exist_ok=True)
    for folder, name in folders.items():
        link = into / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(repo).resolve() / folder, target_is_directory=True)
    return into


def import_view(repo: Path, into: Path) -> Path:
    """Copy the files git tracks in ``repo`` (the working-tree versions) into ``into``, each top-level folder of
    :data:`IMPORT_NAMES` under its import name, and commit them there as a new git repository (tools that measure
    a repository want one); return ``into``. ``ValueError`` when ``into`` exists and is not empty."""
    into = Path(into)
    if into.exists() and any(into.iterdir()):
        raise ValueError(f"into must be an empty or new directory, got {into} (not empty)")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        top, _, rest = name.partition("/")
        source, target = Path(repo) / name, into / (f"{IMPORT_NAMES[top]}/{rest}" if top in IMPORT_NAMES else name)
        if source.is_file():  # a tracked file deleted in the working tree is left out
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", f"import view of {Path(repo).resolve()}"]):
        subprocess.run(GIT + args, cwd=into, check=True, capture_output=True)
    return into


def main(argv: list[str]) -> int:
    """``python -m kernel_sentinel.layout DIR``: the import view of this checkout in DIR; exit 2 on a usage error."""
    if len(argv) != 1:
        print("usage: python -m kernel_sentinel.layout DIR  (an empty or new directory)", file=sys.stderr)
        return 2
    try:
        print(import_view(Path(__file__).resolve().parent.parent, Path(argv[0])))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
