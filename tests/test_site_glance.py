"""The home page's first screen and the text of the generated pages, without a browser: the headline and the
family x device grid (sentinel.dashboard), and docstrings' Sphinx roles as code spans."""
from __future__ import annotations

import pytest

from kernel_sentinel import dashboard

BLOBS = {"kernels/toy.py": "1"}


def record(name: str, statuses: dict[str, str], sources: dict[str, str]) -> dict:
    device = {"type": "cpu", "name": "cpu"} if name == "cpu" else {"type": "cuda", "name": name, "gpus": [name]}
    return {"device": device, "commit": "", "sources": sources,
            "routes": [{"id": r, "dtype": "float32", "status": s, "checks": []} for r, s in statuses.items()]}


def family(name: str, *records: dict, kill_rate: float = 90.0) -> dashboard.FamilyStatus:
    routes = [(f"{name}.a", f"{name}.md", False), (f"{name}.b", f"{name}.md", True)]
    mutation = {"kill_rate": kill_rate, "files": {}, "commit": "0" * 40}
    return dashboard.FamilyStatus(name, routes, list(records), BLOBS, mutation)


@pytest.fixture
def statuses() -> list[dashboard.FamilyStatus]:
    """toy: current and passing on the CPU, a stale GPU record; other: current on both, failing one route on the
    GPU; neither is recorded on a second GPU model but toy."""
    both = {"a": "pass", "b": "pass"}
    return [family("toy", record("cpu", {f"toy.{r}": s for r, s in both.items()}, BLOBS),
                   record("Big GPU", {f"toy.{r}": s for r, s in both.items()}, {"kernels/toy.py": "0"}),
                   record("Small GPU", {f"toy.{r}": s for r, s in both.items()}, BLOBS)),
            family("other", record("cpu", {"other.a": "pass", "other.b": "pass"}, BLOBS),
                   record("Big GPU", {"other.a": "pass", "other.b": "fail"}, BLOBS), kill_rate=75.0)]


def test_the_headline_says_what_is_stale_what_fails_and_what_is_missing(statuses):
    line = dashboard.headline(statuses)
    parts = line.split(" · ")
    assert parts[0] == "**2 families, 4 routes, 3 devices**"
    assert parts[1] == "CPU (interpreter): :material-check-circle: all current"
    assert parts[2] == "Big GPU: :material-clock-alert-outline: **STALE** (toy)"
    assert parts[3] == "Small GPU: :material-minus-circle-outline: not run (other)"
    assert parts[4] == ":material-close-circle: fail: other on Big GPU"
    assert parts[5] == "mutants killed: toy 90%, other 75%"


def test_the_grid_has_a_coloured_cell_per_family_and_device(statuses):
    header, rows = dashboard.grid(statuses)
    assert header == ["family", "CPU (interpreter)", "Big GPU", "Small GPU", "mutants killed"]
    assert rows[0] == ["[toy](toy/index.md)",
                       '<span class="sentinel-pass">:material-check-circle: pass 2/2</span>',
                       '<span class="sentinel-stale">:material-clock-alert-outline: stale (pass 2/2)</span>',
                       '<span class="sentinel-pass">:material-check-circle: pass 2/2</span>', "90%"]
    assert rows[1][2:4] == ['<span class="sentinel-fail">:material-close-circle: fail 1/2</span>',
                            '<span class="sentinel-not-run">:material-minus-circle-outline: not run</span>']


def test_the_stylesheet_colours_every_status_of_the_grid():
    from kernel_sentinel import site

    for status, (fill, stroke, text) in dashboard.COLOURS.items():
        css = dashboard.GRID_CLASS.format(status.replace(" ", "-"))
        assert f".{css} {{ background: {fill}; border-color: {stroke}; color: {text}; }}" in site.CSS


@pytest.mark.parametrize("text, shown", [
    ("Modules: :class:`SinkhornKnopp`, and :class:`FusedMHC`", "Modules: `SinkhornKnopp`, and `FusedMHC`"),
    ("a :class:`~provable_kernels.semicrf.structures.Segment` list", "a `Segment` list"),
    ("as for :func:`semi_crf_streaming_forward` and :py:meth:`a.b`", "as for `semi_crf_streaming_forward` and `a.b`"),
    ("see :ref:`the ladder <ladder>` and :data:`SEMIRING_KINDS`", "see `the ladder` and `SEMIRING_KINDS`"),
    ("```python\n:class:`Kept` in code\n```\nafter :mod:`x`", "```python\n:class:`Kept` in code\n```\nafter `x`"),
    ("no role: a `code span`, ``double``, time 10:30", "no role: a `code span`, ``double``, time 10:30"),
])
def test_sphinx_roles_become_code_spans_outside_code_blocks(text, shown):
    assert dashboard.without_roles(text) == shown


def test_the_verification_tables_show_the_criterion_where_the_record_has_it():
    """A check recorded with ``of_tol`` reads like the verify table (``0.21 of tol``); older records keep abs and
    rel, the only numbers they hold."""
    from kernel_sentinel import trace

    assert trace.error_text({"max_abs": 4.29e-08, "max_rel": 2.95e-04, "of_tol": 0.2134}) == " (0.21 of tol)"
    assert trace.error_text({"max_abs": 4.29e-08, "max_rel": 2.95e-04}) == " (abs 4.29e-08, rel 2.95e-04)"
    assert trace.error_text({"max_abs": None, "max_rel": None}) == ""
