"""Family discovery: where sentinel finds the registrations (``family.py`` modules) it verifies.

A family is a package with a registration module, ``family.py``, wherever it lives (this module is the only
importer of registrations; :func:`kernel_sentinel.registration.family_of` reads each into a
:class:`~kernel_sentinel.family.Family`). Three places are searched, in this order:

- the kernel library's own families, every ``provable_kernels/<name>/family.py``;
- the directories of ``SENTINEL_FAMILY_PATH`` (``os.pathsep``-separated) and of the commands' ``--family-path``
  option (which adds to the variable, so worker processes see it too): every ``<dir>/<name>/family.py`` is imported
  as ``<name>.family`` with ``<dir>`` put on ``sys.path``. A directory that does not exist is a usage error
  (:class:`SearchPathError`);
- the entry points of the group ``kernel_sentinel.families`` of installed distributions (like pytest's plug-ins):
  name the family, value its registration module, e.g. ``l2norm = "mykernels.l2norm.family"``.

A family's repository (``Family.root``) is the git top level of its package's directory; for a package in no
repository (an installed distribution) it is the current directory's repository. Without ``--family``, a command
handles the families of the current directory's repository (:func:`select`), or every family when none lives
there. A registration that fails to import (or to read) fails that family alone: it is kept as a
:class:`Broken` entry, which ``verify`` reports as a failure and the other commands name, while every other family
runs.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Optional, Sequence

from kernel_sentinel.family import KERNELS_PACKAGE, Family, current_repository, repository_of
from kernel_sentinel.registration import family_of

FAMILY_PATH_VARIABLE = "SENTINEL_FAMILY_PATH"
ENTRY_POINT_GROUP = "kernel_sentinel.families"


class UnknownFamily(KeyError):
    """A family name that no ``family.py`` declares."""


class SearchPathError(ValueError):
    """A directory of the family search path that does not exist (a usage error)."""


@dataclass(frozen=True)
class Broken:
    """A family whose registration could not be loaded: its name, where it was looked for, why (the error's last
    lines), and its repository when known (a search-path directory's; None for the library's and entry points')."""

    name: str
    where: str
    error: str
    root: Optional[Path] = None


@dataclass(frozen=True)
class _Source:
    """One registration to load: the family's name as found, its module, and the repository root when known."""

    name: str
    module: str
    root: Optional[Path]
    where: str


def search_path() -> list[Path]:
    """The directories named by ``SENTINEL_FAMILY_PATH`` (empty when unset); :class:`SearchPathError` for one that
    is not a directory."""
    paths = [Path(p) for p in os.environ.get(FAMILY_PATH_VARIABLE, "").split(os.pathsep) if p]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise SearchPathError(f"family path {', '.join(missing)} is not a directory: fix {FAMILY_PATH_VARIABLE} or "
                              f"--family-path (each names a directory holding <name>/family.py)")
    return paths


def add_to_search_path(directories: Sequence[str]) -> None:
    """Put ``directories`` (``--family-path``) in front of ``SENTINEL_FAMILY_PATH``, absolute, so that worker
    processes and child commands search them too."""
    if directories:
        old = [p for p in os.environ.get(FAMILY_PATH_VARIABLE, "").split(os.pathsep) if p]
        os.environ[FAMILY_PATH_VARIABLE] = os.pathsep.join([str(Path(d).resolve()) for d in directories] + old)


def _sources(package: str, extra: Sequence[Path]) -> list[_Source]:
    """Every registration to load: the library's, then each directory's, then the entry points'."""
    found = [_Source(f.parent.name, f"{package}.{f.parent.name}.family", repository_of(Path(base).resolve()), str(f))
             for base in importlib.import_module(package).__path__ for f in sorted(Path(base).glob("*/family.py"))]
    for directory in extra:
        directory = directory.resolve()
        if str(directory) not in sys.path:
            sys.path.insert(0, str(directory))
        found += [_Source(f.parent.name, f"{f.parent.name}.family", repository_of(directory) or directory, str(f))
                  for f in sorted(directory.glob("*/family.py"))]
    found += [_Source(ep.name, ep.value, None, f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP})")
              for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return found


def _load(source: _Source) -> Family | Broken:
    try:
        module = importlib.import_module(source.module)
        package_dir = Path(module.__file__).resolve().parent
        return family_of(module, root=source.root or repository_of(package_dir) or current_repository())
    except Exception as error:  # noqa: BLE001 - a broken registration fails its own family, never the others
        lines = traceback.format_exception_only(type(error), error)
        return Broken(source.name, source.where, "".join(lines).strip(), source.root)


def discover(package: str = KERNELS_PACKAGE,
             extra: Optional[Sequence[Path]] = None) -> tuple[list[Family], list[Broken]]:
    """Every family that loads, sorted by name, and every registration that does not (:class:`Broken`).

    ``extra`` defaults to :func:`search_path`. ``ValueError`` when two families share a name.
    """
    loaded: dict[str, Family] = {}
    broken: list[Broken] = []
    for source in _sources(package, search_path() if extra is None else extra):
        got = _load(source)
        if isinstance(got, Broken):
            broken.append(got)
        elif got.name in loaded:
            raise ValueError(f"two families are named {got.name!r}: {loaded[got.name].package.__name__} and "
                             f"{got.package.__name__}")
        else:
            loaded[got.name] = got
    return [loaded[name] for name in sorted(loaded)], broken


def families(package: str = KERNELS_PACKAGE, extra: Optional[Sequence[Path]] = None) -> list[Family]:
    """The families that load (:func:`discover`), sorted by name."""
    return discover(package, extra)[0]


def select_with_broken(names: Optional[Sequence[str]],
                       package: str = KERNELS_PACKAGE) -> tuple[list[Family], list[Broken]]:
    """The families named in ``names``, in registry order, and the broken registrations among those names
    (:class:`UnknownFamily` for a name no family has). Without names: the families whose repository is the current
    directory's (every family when none is), and the broken registrations there (or of unknown repository: the
    library's, an entry point's)."""
    every, broken = discover(package)
    if not names:
        here = current_repository()
        mine = [f for f in every if f.root == here]
        return mine or every, [b for b in broken if b.root in (None, here)]
    known = {f.name for f in every} | {b.name for b in broken}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownFamily(f"unknown family {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}")
    return [f for f in every if f.name in names], [b for b in broken if b.name in names]


def select(names: Optional[Sequence[str]], package: str = KERNELS_PACKAGE) -> list[Family]:
    """The families :func:`select_with_broken` selects, broken ones of unnamed families left out; ``RuntimeError``
    naming the error when a family named in ``names`` is broken (it is never dropped silently)."""
    found, broken = select_with_broken(names, package)
    if names and broken:
        raise RuntimeError("; ".join(f"family {b.name!r} failed to load ({b.where}): {b.error}" for b in broken))
    return found


def family(name: str) -> Family:
    """The registered family called ``name`` (:class:`UnknownFamily` when none is; ``RuntimeError`` naming the
    error when its registration is broken)."""
    return select([name])[0]


def by_root(chosen: Sequence[Family]) -> dict[Path, list[Family]]:
    """``chosen`` grouped by repository (``Family.root``), in order of first appearance."""
    groups: dict[Path, list[Family]] = {}
    for f in chosen:
        groups.setdefault(f.root, []).append(f)
    return groups
