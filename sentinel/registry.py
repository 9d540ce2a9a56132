"""Family discovery: every ``kernels/<name>/family.py`` is a family's registration.

This module is the only importer of ``family.py`` modules (the library never imports its registrations; they
import nothing of sentinel); :func:`kernel_sentinel.registration.family_of` reads each into a
:class:`~kernel_sentinel.family.Family`. Adding a family means adding its package with a ``family.py``; nothing
here changes. Families outside the kernel library (a plug-in, a test's toy family) are
found in the directories listed in the environment variable ``SENTINEL_FAMILY_PATH`` (``os.pathsep``-separated):
each ``<dir>/<name>/family.py`` there is imported as ``<name>.family`` with ``<dir>`` put on ``sys.path``.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from kernel_sentinel.family import Family
from kernel_sentinel.registration import family_of

FAMILY_PATH_VARIABLE = "SENTINEL_FAMILY_PATH"


class UnknownFamily(KeyError):
    """A family name that no ``family.py`` declares."""


def search_path() -> list[Path]:
    """The extra directories named by ``SENTINEL_FAMILY_PATH`` (empty when unset)."""
    return [Path(p) for p in os.environ.get(FAMILY_PATH_VARIABLE, "").split(os.pathsep) if p]


def _family_modules(package: str, extra: Sequence[Path]) -> list[str]:
    """Module names of every ``family.py``: ``<package>.<name>.family``, then ``<name>.family`` per extra dir."""
    names = [f"{package}.{f.parent.name}.family"
             for base in importlib.import_module(package).__path__ for f in sorted(Path(base).glob("*/family.py"))]
    for directory in extra:
        if str(directory) not in sys.path:
            sys.path.insert(0, str(directory))
        names += [f"{f.parent.name}.family" for f in sorted(Path(directory).glob("*/family.py"))]
    return names


def families(package: str = "provable_kernels", extra: Optional[Sequence[Path]] = None) -> list[Family]:
    """The family of every ``<package>/<name>/family.py`` and of every family in ``extra`` (default:
    :func:`search_path`), sorted by family name.

    Raises ``TypeError`` when a ``family.py`` is not a registration (:mod:`kernel_sentinel.registration`), and
    ``ValueError`` when two families share a name.
    """
    found: dict[str, Family] = {}
    for module_name in _family_modules(package, search_path() if extra is None else extra):
        family = family_of(importlib.import_module(module_name))
        if family.name in found:
            raise ValueError(f"two families are named {family.name!r}")
        found[family.name] = family
    return [found[name] for name in sorted(found)]


def select(names: list[str] | None, package: str = "provable_kernels") -> list[Family]:
    """The families named in ``names`` (all when None or empty), in registry order; :class:`UnknownFamily` for a
    name no family has."""
    every = families(package)
    if not names:
        return every
    known = {f.name for f in every}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownFamily(f"unknown family {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}")
    return [f for f in every if f.name in names]


def family(name: str) -> Family:
    """The registered family called ``name`` (:class:`UnknownFamily` when none is)."""
    return select([name])[0]
