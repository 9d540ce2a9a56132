"""Family discovery: every ``kernels/<name>/family.py`` that exports ``FAMILY`` is a family.

Adding a family means adding its package with a ``family.py``; nothing here changes.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from kernel_sentinel.family import Family


class UnknownFamily(KeyError):
    """A family name that no ``family.py`` declares."""


def families(package: str = "provable_kernels") -> list[Family]:
    """The ``FAMILY`` of every ``<package>/<name>/family.py``, sorted by family name.

    Raises ``TypeError`` when a ``family.py`` lacks ``FAMILY`` or it is not a :class:`Family`, and ``ValueError``
    when two families share a name.
    """
    root = importlib.import_module(package)
    found: dict[str, Family] = {}
    for base in root.__path__:
        for family_file in sorted(Path(base).glob("*/family.py")):
            module_name = f"{package}.{family_file.parent.name}.family"
            family = getattr(importlib.import_module(module_name), "FAMILY", None)
            if not isinstance(family, Family):
                raise TypeError(f"{module_name} must export FAMILY, a kernel_sentinel.family.Family")
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
