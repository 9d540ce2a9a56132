"""The registration schema: every name a ``family.py`` (or one of its ``PARTS``) may declare, what it must be, and
the check run on load (:func:`check`).

:data:`FAMILY_NAMES` are read from ``family.py`` only; :data:`PART_NAMES` from ``family.py`` and from each part
(one per dispatch tree). What each name means is documented in :mod:`kernel_sentinel.registration` and on the guide
page ``traces/guide/registration.md``; a test holds the page to these tables. A registration's own constants start
with an underscore: an upper-case name that the schema does not know is an error naming the nearest schema name
(``PROPERTES: did you mean PROPERTIES?``), never a silently dropped check, and so is a declared name of the wrong
type, or a family-wide name in a part.
"""
from __future__ import annotations

import ast
import difflib
import inspect
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import torch


class RegistrationError(TypeError):
    """A registration that does not follow the schema."""


def _callable(x: Any) -> bool:
    return callable(x)


def _text(x: Any) -> bool:
    return isinstance(x, str)


def _globs(x: Any) -> bool:
    return isinstance(x, str) or (isinstance(x, Sequence) and all(isinstance(g, str) for g in x))


def _sequence_of(item: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda x: isinstance(x, Sequence) and not isinstance(x, str) and all(item(i) for i in x)


def _tuple_of(*fields: Callable[[Any], bool], optional: int = 0) -> Callable[[Any], bool]:
    """A tuple (or list) of ``len(fields)`` entries, the last ``optional`` of which may be left out, each checked."""
    def holds(x: Any) -> bool:
        return (isinstance(x, (tuple, list)) and len(fields) - optional <= len(x) <= len(fields)
                and all(check(v) for check, v in zip(fields, x)))
    return holds


def _anything(x: Any) -> bool:
    return True


def _tree(x: Any) -> bool:
    from provable_kernels.dispatch import Tree

    return isinstance(x, Tree)


def _tolerances(x: Any) -> bool:
    return isinstance(x, Mapping) and bool(x) and all(
        isinstance(d, torch.dtype) and _tuple_of(_number, _number)(t) for d, t in x.items())


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _sizes(x: Any) -> bool:
    return isinstance(x, Mapping) and {"small", "tiny"} <= set(x) and all(isinstance(v, Mapping) for v in x.values())


def _invariants(x: Any) -> bool:
    if isinstance(x, Mapping):
        return all(isinstance(f, str) and _sequence_of(_text)(names) for f, names in x.items())
    return _sequence_of(_text)(x)


def _standard_bad_inputs(x: Any) -> bool:
    return isinstance(x, Mapping) or _sequence_of(lambda m: isinstance(m, Mapping))(x)


def _known_issue(x: Any) -> bool:
    return isinstance(x, str) or _tuple_of(_text, _text, _text, _text, _text, optional=1)(x)


# name: (what it must be, in words; the check)
FAMILY_NAMES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "TOLERANCES": ("a non-empty {torch.dtype: (atol, rtol)}", _tolerances),
    "INVARIANTS": ("pytest node ids, or {test file: test names}", _invariants),
    "GUARDS": ("(text, function) pairs", _sequence_of(_tuple_of(_text, _callable))),
    "KNOWN_ISSUES": ("texts, or (text, severity, frequency, resolution[, commit])", _sequence_of(_known_issue)),
    "FAILURE_MODES": ("{symptom: (page, page, what covers it[, routes])}",
                      lambda x: isinstance(x, Mapping) and all(_tuple_of(_text, _text, _text, _globs, optional=1)(v)
                                                               for v in x.values())),
    "ALIASING": ("(output, argument, routes, why) tuples", _sequence_of(_tuple_of(_text, _text, _globs, _text))),
    "REJECTED_LAYOUTS": ("(argument, layout, routes, why) tuples",
                         _sequence_of(_tuple_of(_text, _text, _globs, _text))),
    "PARTS": ("module names of the package", _sequence_of(_text)),
    "BLOCKS": ("(routes, argument, dim, block[, sizes]) tuples",
               _sequence_of(_tuple_of(_globs, _text, lambda d: isinstance(d, int), lambda b: isinstance(b, int),
                                      _sequence_of(_text), optional=1))),
    "PUBLISHES": ("(kernel, data argument, flag argument, why) tuples",
                  _sequence_of(_tuple_of(_text, _text, _text, _text))),
}
PART_NAMES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "TREE": ("a provable_kernels.dispatch.Tree", _tree),
    "ENTRY_POINTS": ("{name: function}", lambda x: isinstance(x, Mapping) and all(
        isinstance(k, str) and callable(v) for k, v in x.items())),
    "SIZES": ('{"small": problem, "tiny": problem}, each a dict', _sizes),
    "case": ("a function (route_id, problem, gen, device) -> (entry, kwargs, upstream)", _callable),
    "reference": ("a function (kw, case) -> outputs", _callable),
    "fit": ("a function (route_id, problem, device) -> problem", _callable),
    "outputs": ("a function (result, case) -> outputs", _callable),
    "example": ("a function (pick) -> problem", _callable),
    "pinned": ("a function (name, direction) -> direction", _callable),
    "ORACLES": ("(name, size, function[, routes]) tuples",
                _sequence_of(_tuple_of(_text, _text, _callable, _globs, optional=1))),
    "PROPERTIES": ("(name, routes, holds[, dtypes[, example]]) tuples",
                   _sequence_of(_tuple_of(_text, _globs, _callable, _anything, _anything, optional=2))),
    "AGREEMENTS": ("(name, routes, function[, dtypes[, example]]) tuples",
                   _sequence_of(_tuple_of(_text, _globs, _callable, _anything, _anything, optional=2))),
    "FINITE_DIFFERENCES": ("route globs", _globs),
    "ADVERSARIAL": ("(name, change[, expect[, options]]) tuples",
                    _sequence_of(_tuple_of(_text, lambda c: callable(c) or isinstance(c, Mapping), _anything,
                                           lambda o: o is None or isinstance(o, Mapping), optional=2))),
    "STANDARD_BAD_INPUTS": ("keyword arguments of kernel_sentinel.cases.standard_bad_inputs (a dict), or a tuple "
                            "of them", _standard_bad_inputs),
    "BAD_INPUTS": ("(argument, what, value[, routes[, device_mode]]) tuples",
                   _sequence_of(_tuple_of(_text, _text, _anything, lambda r: r is None or _globs(r), _anything,
                                          optional=2))),
    "BATCH_ITEMS": ("(what, routes, dims[, summed]) tuples",
                    _sequence_of(_tuple_of(_text, _globs, _anything, _anything, optional=1))),
}
REQUIRED = ("TREE", "ENTRY_POINTS", "SIZES", "case", "reference")  # in every part; TOLERANCES in family.py
FUNCTIONS = tuple(n for n in PART_NAMES if n.islower())


def _defined_here(module: ModuleType) -> list[str]:
    """Names the module's own top-level statements assign (imports left out), in source order."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):  # no source (a module built in memory): every attribute counts
        return list(vars(module))
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for target in targets:
            names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
    return list(dict.fromkeys(names))


def _nearest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, [k for k in known if k.isupper()], n=1, cutoff=0.75)
    return f"did you mean {close[0]}?" if close else "not a schema name"


def problems(module: ModuleType, first: bool) -> list[str]:
    """What is wrong with the registration module ``module`` (``first``: it is ``family.py``, else a part)."""
    allowed = {**PART_NAMES, **(FAMILY_NAMES if first else {})}
    every = [*FAMILY_NAMES, *PART_NAMES]
    found = []
    for name in _defined_here(module):
        if name.startswith("_") or not hasattr(module, name):
            continue
        if name.isupper() and name not in allowed:
            if name in FAMILY_NAMES:
                found.append(f"{name}: a family-wide name, read from family.py only (move it there)")
            else:
                found.append(f"{name}: {_nearest(name, every)} (a registration's own constants start with _)")
        elif name in FUNCTIONS and name in allowed and not callable(getattr(module, name)):
            found.append(f"{name}: must be {PART_NAMES[name][0]}")
    for name, (what, holds) in allowed.items():
        if hasattr(module, name) and not holds(getattr(module, name)):
            value = getattr(module, name)
            found.append(f"{name}: must be {what}, got {type(value).__name__} {_shown(value)}")
    missing = [n for n in (*REQUIRED, *(("TOLERANCES",) if first else ())) if not hasattr(module, n)]
    if missing:
        found.append(f"declares no {', '.join(missing)} (required)")
    return found


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check(module: ModuleType, first: bool = True) -> None:
    """Raise :class:`RegistrationError` listing every problem of ``module`` (:func:`problems`)."""
    found = problems(module, first)
    if found:
        raise RegistrationError(f"registration {module.__name__} does not follow the schema "
                                f"(traces/guide/registration.md): " + "; ".join(found))
