"""``pytest --sentinel``: sentinel's verification as pytest test items, inside a kernel repository's own test suite.

Installed with kernel-sentinel as a pytest plug-in (entry point ``pytest11``); it does nothing without
``--sentinel``. With it, every (route, dtype, check) that ``sentinel verify`` would report for the selected families
is one test item, named ``<route id>:<dtype>:<check>`` under a collector per family (``sentinel:<family>``), plus
one item per family for its registration (it loads, its invariant tests exist, its fixed cases span the blocks it
declares). ``-k``, ``-x``, ``--junitxml`` and
pytest-xdist work as for any test (``--dist loadgroup`` keeps a row's checks in one worker: each row is an
``xdist_group``). The items run the same machinery as ``sentinel verify`` (:func:`kernel_sentinel.rows.verify_route`
with the checks selected in this session, once per row and process), so results and exit codes agree with
``sentinel verify`` on the same selection.

Options: ``--sentinel-family F`` (repeatable; default the families of the current repository, as ``sentinel
verify``), ``--sentinel-route GLOB``, ``--sentinel-dtype DTYPE``, ``--sentinel-quick``, ``--sentinel-examples N``,
``--sentinel-seed N``, ``--sentinel-device {auto,cpu,cuda}`` and ``--sentinel-family-path DIR``.
"""
from __future__ import annotations

from typing import Any, Optional

import pytest

ITEM_SEPARATOR = ":"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sentinel", "kernel verification by sentinel")
    group.addoption("--sentinel", action="store_true", help="collect sentinel's verification as test items")
    group.addoption("--sentinel-family", action="append", default=[], metavar="F",
                    help="families to verify (default: those of the current repository)")
    group.addoption("--sentinel-route", action="append", default=[], metavar="GLOB", help="routes matching GLOB")
    group.addoption("--sentinel-dtype", action="append", default=[], metavar="DTYPE", help="only these dtypes")
    group.addoption("--sentinel-quick", action="store_true", help="tiny inputs, few examples (sentinel verify --quick)")
    group.addoption("--sentinel-examples", type=int, default=None, metavar="N", help="hypothesis examples per property")
    group.addoption("--sentinel-seed", type=int, default=0, metavar="N", help="seed of inputs and hypothesis")
    group.addoption("--sentinel-device", default="auto", choices=("auto", "cpu", "cuda"), help="device to verify on")
    group.addoption("--sentinel-family-path", action="append", default=[], metavar="DIR",
                    help="also find families in DIR (as sentinel's --family-path)")


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("sentinel"):
        return
    from kernel_sentinel import device, registry

    # the Triton interpreter must be on before any kernel module is imported (as the sentinel command does)
    config._sentinel_device = device.prepare(config.getoption("sentinel_device"))
    registry.add_to_search_path(config.getoption("sentinel_family_path"))
    config.addinivalue_line("markers", "sentinel: an item of sentinel's verification")


class SentinelFamily(pytest.Collector):
    """The items of one family: its registration, then one per selected (route, dtype, check)."""

    def __init__(self, *, family: Any = None, broken: Any = None, rows: Any = (), **kwargs: Any):
        super().__init__(**kwargs)
        self.family, self.broken, self.rows = family, broken, rows

    def collect(self) -> list[pytest.Item]:
        from kernel_sentinel.rows import dtype_name

        items: list[pytest.Item] = [Registration.from_parent(self, name="registration")]
        for route_id, dtype in self.rows:
            for check in self.config._sentinel_options.checks:
                name = ITEM_SEPARATOR.join((route_id, dtype_name(dtype), check))
                item = CheckItem.from_parent(self, name=name, route_id=route_id, dtype=dtype, check=check)
                item.add_marker(pytest.mark.sentinel)
                item.add_marker(pytest.mark.xdist_group(f"sentinel-{route_id}-{dtype_name(dtype)}"))
                items.append(item)
        return items


class Registration(pytest.Item):
    """The family loads and every invariant test it declares exists (``sentinel verify`` fails otherwise)."""

    def runtest(self) -> None:
        parent = self.parent
        if parent.broken is not None:
            raise SentinelFailure(f"the family failed to load ({parent.broken.where}): {parent.broken.error}")
        missing = parent.family.missing_tests()
        if missing:
            raise SentinelFailure(f"invariant tests do not exist in {parent.family.root}: {', '.join(missing)}")
        one_block = parent.family.one_block_cases()
        if one_block:
            raise SentinelFailure("fixed cases inside one block: " + "; ".join(one_block))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return str(excinfo.value) if excinfo.errisinstance(SentinelFailure) else super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, Optional[int], str]:
        return self.path, None, f"sentinel: {self.parent.name} registration"


class CheckItem(pytest.Item):
    """One check of one route at one dtype: passes when ``sentinel verify`` would report it passed."""

    def __init__(self, *, route_id: str, dtype: Any, check: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.route_id, self.dtype, self.check = route_id, dtype, check

    def runtest(self) -> None:
        result = _row(self.config, self.parent.family, self.route_id, self.dtype)
        found = [c for c in result.checks if c.name == self.check]
        if not found:
            raise SentinelFailure(f"{self.check}: the row reported no such check")
        if not found[0].passed:
            raise SentinelFailure(f"{self.check} failed at {result.dtype}: {found[0].detail}\n"
                                  f"reproduce: {found[0].repro}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return str(excinfo.value) if excinfo.errisinstance(SentinelFailure) else super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, Optional[int], str]:
        return self.path, None, f"sentinel: {self.name}"


class SentinelFailure(AssertionError):
    """A check sentinel reported failed (shown as its detail and reproduce command, without a traceback)."""


def _row(config: pytest.Config, family: Any, route_id: str, dtype: Any) -> Any:
    """The row's :class:`~kernel_sentinel.records.RouteResult`, verified once per process with every check of the
    row that this session selected."""
    import warnings

    from kernel_sentinel.rows import INTERPRETER_WARNINGS, verify_route

    cache = config._sentinel_rows
    key = (family.name, route_id, str(dtype))
    if key not in cache:
        import dataclasses

        checks = tuple(c for c in config._sentinel_options.checks if c in config._sentinel_selected.get(key, ()))
        options = dataclasses.replace(config._sentinel_options, checks=checks)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", **INTERPRETER_WARNINGS)
            cache[key] = verify_route(family, route_id, options, dtype=dtype)
    return cache[key]


@pytest.hookimpl(tryfirst=True)  # before pytest's own -k / -m deselection, which then applies to these items too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("sentinel"):
        return
    from kernel_sentinel import registry, verify
    from kernel_sentinel.rows import DEFAULT_EXAMPLES, QUICK_EXAMPLES, Options

    quick = config.getoption("sentinel_quick")
    examples = config.getoption("sentinel_examples") or (QUICK_EXAMPLES if quick else DEFAULT_EXAMPLES)
    config._sentinel_options = Options(device=config._sentinel_device, seed=config.getoption("sentinel_seed"),
                                       examples=examples, quick=quick)
    config._sentinel_rows, config._sentinel_selected = {}, {}
    try:
        families, broken = registry.select_with_broken(config.getoption("sentinel_family") or None)
        dtypes = [verify.parse_dtype(d) for d in config.getoption("sentinel_dtype")]
    except (registry.UnknownFamily, registry.SearchPathError) as exc:
        raise pytest.UsageError(str(exc.args[0])) from None
    except Exception as exc:  # argparse's error for a dtype that is not one
        raise pytest.UsageError(f"--sentinel-dtype: {exc}") from None
    globs = config.getoption("sentinel_route")
    for family in families:
        rows = [(route_id, dtype) for _, route_id, dtype in verify.select_rows([family], globs, dtypes)]
        items += SentinelFamily.from_parent(session, name=f"sentinel:{family.name}", nodeid=f"sentinel:{family.name}",
                                            family=family, rows=rows).collect()
    for b in broken:
        items += SentinelFamily.from_parent(session, name=f"sentinel:{b.name}", nodeid=f"sentinel:{b.name}",
                                            broken=b).collect()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Which checks of each row this session runs (after ``-k`` / ``-m``): a row verifies those, and only those."""
    if not session.config.getoption("sentinel"):
        return
    for item in session.items:
        if isinstance(item, CheckItem):
            key = (item.parent.family.name, item.route_id, str(item.dtype))
            session.config._sentinel_selected.setdefault(key, set()).add(item.check)
