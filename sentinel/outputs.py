"""Output paths of the commands, checked before the work: an unwritable ``--json`` / ``--junit`` / ``--record``
target is a usage error (exit code 2, one line) up front, not a traceback after the whole run that loses the
report."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


def file_problem(path: PathLike) -> Optional[str]:
    """Why a file cannot be written at ``path`` (replacing any file there), or None when it can. Tries it: an
    existing file is opened for appending (its content unchanged), a missing one is created and removed."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a directory"
    if not path.parent.is_dir():
        return f"its directory {path.parent} does not exist" if not path.parent.exists() else \
            f"{path.parent} is not a directory"
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    if not existed:
        path.unlink()
    return None


def directory_problem(directory: PathLike) -> Optional[str]:
    """Why files cannot be written in ``directory`` (created with its parents when missing), or None."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return f"{directory}: {exc.strerror or exc}"
    return None


def unwritable(files: Mapping[str, Optional[PathLike]],
               directories: Optional[Mapping[str, Optional[PathLike]]] = None) -> Optional[str]:
    """One line naming the first option whose target cannot be written, or None. ``files`` maps an option
    (``"--json"``) to the file it writes (None: not given); ``directories`` maps one to the folder it writes into."""
    for option, path in files.items():
        problem = None if path is None else file_problem(path)
        if problem:
            return f"{option} {path}: cannot write there ({problem})"
    for option, directory in (directories or {}).items():
        problem = None if directory is None else directory_problem(directory)
        if problem:
            return f"{option}: cannot write the record ({problem})"
    return None
