"""Sentinel reads a registration (``kernel_sentinel.registration``): a toy registration, written as a package's
``family.py`` the way the families write theirs, becomes a family whose cases, references and checks behave as
declared; a planted bug in one of its routes fails verify."""
from __future__ import annotations

import importlib
import math
import textwrap

import pytest
import torch

from kernel_sentinel import registration
from kernel_sentinel.family import Case, Problem
from kernel_sentinel.rows import Options, verify_route

CPU = torch.device("cpu")
REGISTRATION = '''
import math

import torch

from conftest import TOY_TREE as TREE, toy_sum

ENTRY_POINTS = {"toy_sum": toy_sum}
TOLERANCES = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-5)}
SIZES = {"small": dict(n=8), "tiny": dict(n=3)}


def case(route_id, p, gen, device):
    fast = TREE.path_to(route_id)["speed"] == "fast"
    x = torch.randn(3, p.n, generator=gen, dtype=torch.float64)
    return "toy_sum", {"x": x, "fast": fast}, {"value": torch.randn(3, generator=gen, dtype=torch.float64)}


def reference(kw, case):
    return {"value": kw["x"].sum(-1)}


def example(pick):
    return dict(n=pick(range(1, 6)))


def ones(check, case):
    n = case.problem.n
    check.close("sum of ones", check.forward(case.transformed("ones", x=torch.ones_like))["value"],
                torch.full((3,), float(n)))


ORACLES = (("python loop", "tiny", lambda kw, case: {"value": torch.tensor([math.fsum(r) for r in kw["x"].tolist()],
                                                                           dtype=torch.float64)}),)
PROPERTIES = (("sum of ones is the row length", "toy.*", ones),)
FINITE_DIFFERENCES = "toy.*"
ADVERSARIAL = (("huge values", {"x": lambda x: x * 1e30}, "reference"),
               ("NaN input", {"x": lambda x: x * math.nan}, None, {"errors_ok": True}))
STANDARD_BAD_INPUTS = dict(tensors=("x",), rejects_nan=("x",), rejects_inf=("x",))
BAD_INPUTS = (("fast", "a string", "yes"),)
BATCH_ITEMS = (("a row", "toy.*", {"x": 0, "value": 0, "grad_x": 0}),)
FAILURE_MODES = {"backend mismatch": ("regtoy/index.md#routes", "guide/index.md", "reference check", "toy.slow")}
'''


@pytest.fixture
def package(tmp_path, monkeypatch):
    """Imports of the toy registration as ``regtoy.family`` (``extra`` appended to its source)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "regtoy").mkdir()
    (tmp_path / "regtoy" / "__init__.py").write_text('"""Toy row sums, registered for the registration tests."""\n')

    def imported(extra: str = "") -> object:
        (tmp_path / "regtoy" / "family.py").write_text(REGISTRATION + textwrap.dedent(extra))
        for name in ("regtoy.family", "regtoy"):
            monkeypatch.delitem(__import__("sys").modules, name, raising=False)
        importlib.invalidate_caches()
        return importlib.import_module("regtoy.family")

    return imported


def test_a_registration_becomes_the_family_it_declares(package):
    family = registration.family_of(package())
    assert family.name == "regtoy" and family.summary.startswith("Toy row sums")
    assert [r.id for r in family.routes()] == ["toy.fast", "toy.slow"]
    assert family.dtypes == (torch.float64, torch.float32)
    assert [(m.symptom, m.routes, m.checks) for m in family.failure_modes] == [
        ("backend mismatch", ("toy.slow",), ("reference", "exact")),
        ("wrong route taken", ("*",), ("route",))]
    assert family.failure_modes[1].read_first == "regtoy/index.md#dispatch-conditions"

    case = family.make_case("toy.slow", size="tiny", dtype=torch.float32, device=CPU, seed=4)
    assert case.problem == {"n": 3, "seed": 4} and case.problem.n == 3
    assert (case.dtype, case.device, case.description) == (torch.float32, CPU, "toy_sum n=3 seed=4 float32 on cpu")
    x = case.kwargs["x"]
    assert x.dtype == torch.float32 and x.shape == (3, 3) and x.requires_grad and case.kwargs["fast"] is False
    assert case.upstream["value"].dtype == torch.float32
    want = family.reference(case)  # float64 on the CPU; the gradient added by autograd: the weight of each row
    assert want["value"].dtype == torch.float64 and not want["value"].requires_grad
    assert torch.equal(want["grad_x"], case.upstream["value"].double()[:, None].expand(3, 3))
    assert {b.argument for b in family.bad_inputs} == {"x", "fast"} and len(family.bad_inputs) == 6
    assert [p.name for p in family.properties] == ["sum of ones is the row length",
                                                   "gradients match finite differences (float64)"]


def test_a_planted_bug_fails_the_checks_the_registration_declares(package):
    family = registration.family_of(package())
    options = Options(device=CPU, seed=0, examples=3, quick=True)
    right = verify_route(family, "toy.slow", options, dtype=torch.float64)
    assert right.passed, [(c.name, c.detail) for c in right.checks if not c.passed]
    planted = verify_route(family, "toy.fast", options, dtype=torch.float64)  # adds 1e-3 * x[:, 0]
    assert {c.name for c in planted.checks if not c.passed} >= {"reference", "exact", "properties", "guards"}


def test_what_is_not_a_registration_is_refused(package):
    with pytest.raises(TypeError, match="^module must be a module"):
        registration.family_of("regtoy.family")
    module = package("del TREE, reference\n")
    with pytest.raises(TypeError, match="^registration regtoy.family does not follow .*declares no TREE, reference"):
        registration.family_of(module)
    with pytest.raises(ValueError, match="failure modes of unknown symptoms \\['slow'\\]"):
        registration.family_of(package("FAILURE_MODES = {'slow': ('a.md', 'b.md', 'c')}\n"))
    family = registration.family_of(package())
    with pytest.raises(ValueError, match="^route_id 'toy.other' is no route of family 'regtoy'"):
        family.make_case("toy.other", size="tiny", dtype=torch.float32, device=CPU, seed=0)


@pytest.mark.parametrize("extra, error", [
    ("PROPERTES = PROPERTIES\n", "PROPERTES: did you mean PROPERTIES?"),
    ("TOLERANCE = TOLERANCES\n", "TOLERANCE: did you mean TOLERANCES?"),
    ("ROWS = 3\n", "ROWS: not a schema name (a registration's own constants start with _)"),
    ("SIZES = {'small': dict(n=8)}\n", "SIZES: must be {\"small\": problem, \"tiny\": problem}, each a dict, got dict"),
    ("TOLERANCES = {'float32': (1e-5, 1e-5)}\n", "TOLERANCES: must be a non-empty {torch.dtype: (atol, rtol)}"),
    ("PROPERTIES = (('ones', 'toy.*'),)\n", "PROPERTIES: must be (name, routes, holds[, dtypes[, example]]) tuples"),
    ("example = 3\n", "example: must be a function (pick) -> problem"),
])
def test_a_registration_off_the_schema_is_an_error_naming_the_entry(package, extra, error):
    """A misspelled or unknown upper-case name, or a declared name of the wrong type, is an error naming it (never
    a silently dropped check)."""
    with pytest.raises(registration.schema.RegistrationError) as raised:
        registration.family_of(package(extra))
    assert error in str(raised.value) and "traces/guide/registration.md" in str(raised.value)


def test_own_constants_start_with_an_underscore_and_family_wide_names_live_in_family_py(package, tmp_path):
    """A registration's own upper-case constants are private (``_ROWS``); a family-wide name in a part is an
    error, since only ``family.py`` is read for it."""
    assert registration.family_of(package("_ROWS = 3\n")).name == "regtoy"
    (tmp_path / "regtoy" / "family_more.py").write_text("from regtoy.family import *\nfrom regtoy.family import "
                                                         "case, reference, example\nINVARIANTS = ()\n")
    with pytest.raises(registration.schema.RegistrationError, match="INVARIANTS: a family-wide name, read from "
                                                                    "family.py only"):
        registration.family_of(package("PARTS = ('family_more',)\n"))


def test_an_invariant_is_stated_by_its_tests_docstring(package):
    """Each invariant is a test's node id (or a test named under its file); its text is the first paragraph of that
    test's docstring, a test without one is refused, and a missing test keeps its node id (the trace check then
    names it)."""
    here = "tests/test_registration.py"
    family = registration.family_of(package(f"INVARIANTS = ('{here}::test_an_invariant_is_stated_by_its_tests_"
                                            f"docstring', '{here}::test_no_such_test')\n"))
    assert [(i.text, i.test) for i in family.invariants] == [
        ("Each invariant is a test's node id (or a test named under its file); its text is the first paragraph of that "
         "test's docstring, a test without one is refused, and a missing test keeps its node id (the trace check then "
         "names it).",
         f"{here}::test_an_invariant_is_stated_by_its_tests_docstring"),
        (f"{here}::test_no_such_test", f"{here}::test_no_such_test")]
    assert family.missing_tests() == [f"{here}::test_no_such_test"]
    by_file = registration.family_of(package(f"INVARIANTS = {{'{here}': ('test_an_invariant_is_stated_by_its_tests_"
                                             f"docstring', 'test_no_such_test')}}\n"))
    assert [(i.text, i.test) for i in by_file.invariants] == [(i.text, i.test) for i in family.invariants]
    with pytest.raises(ValueError, match=f"the invariant test {here}::test_problem_keys_read_as_attributes has no "
                                         f"docstring"):
        registration.family_of(package(f"INVARIANTS = ('{here}::test_problem_keys_read_as_attributes',)\n"))


def test_examples_are_drawn_by_pick_with_a_seed(package):
    from hypothesis import given, settings

    (prop, _) = registration.family_of(package()).properties
    drawn = []

    def keep(problem):
        drawn.append(problem)

    settings(max_examples=20, database=None)(given(prop.example())(keep))()
    assert all(isinstance(p, Problem) and set(p) == {"n", "seed"} and 1 <= p.n <= 5 for p in drawn)
    assert len({p.n for p in drawn}) > 1 and len({p.seed for p in drawn}) > 1


def test_transformed_passes_float64_copies_on_the_cpu_and_casts_back():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_(True)
    case = Case("toy.slow", "toy_sum", {"x": x, "pair": (x, x), "fast": False}, "x")
    seen = []
    moved = case.transformed("doubled", x=lambda v: seen.append(v) or v * 2, pair=lambda v: -v, fast=lambda f: not f)
    assert seen[0].dtype == torch.float64 and seen[0].device == CPU and not seen[0].requires_grad
    assert moved.kwargs["x"].dtype == torch.float32 and moved.kwargs["x"].requires_grad and moved.kwargs["x"].is_leaf
    assert torch.equal(moved.kwargs["x"], 2 * x.detach()) and torch.equal(moved.kwargs["pair"][1], -x.detach())
    assert moved.kwargs["fast"] is True and moved.description == "x; doubled" and torch.equal(case.kwargs["x"], x)
    with pytest.raises(ValueError, match="^functions name arguments the case of toy.slow lacks: y"):
        case.transformed("y", y=abs)


def test_problem_keys_read_as_attributes():
    p = Problem({"n": 3}, seed=1)
    assert (p.n, p.seed, str(p)) == (3, 1, "n=3 seed=1")
    with pytest.raises(AttributeError):
        p.missing
    assert math.isnan(Problem(v=math.nan).v)


def _csr_case(form: str, lengths=(2, 0, 3)) -> Case:
    counts = torch.tensor(lengths)
    index = ({"offsets": torch.cat([counts.new_zeros(1), counts.cumsum(0)])} if form == "offsets"
             else {"ids": torch.repeat_interleave(torch.arange(len(lengths)), counts), "num_segments": len(lengths)})
    x = torch.arange(float(sum(lengths) * 2)).reshape(-1, 2)
    return Case("toy.slow", "toy_sum", {"x": x, **index}, "csr", upstream={"value": torch.arange(3.0)[:, None]})


@pytest.mark.parametrize("form", ["offsets", "ids"])
def test_ragged_items_split_by_the_index_and_join_back(form):
    from kernel_sentinel.cases import batch_ragged

    items = batch_ragged("a segment", ("toy.*",), rows=("x", "grad_x"), per_item=("value",))
    case = _csr_case(form)
    parts = items.split(case)
    assert [p.kwargs["x"].shape[0] for p in parts] == [2, 0, 3]
    assert all(torch.equal(p.upstream["value"], case.upstream["value"][s:s + 1]) for s, p in enumerate(parts))
    assert parts[2].kwargs[form].tolist() == ([0, 3] if form == "offsets" else [0, 0, 0])
    assert parts[2].kwargs.get("num_segments") == (1 if form == "ids" else None)
    joined = items.join(case, [parts[2], parts[0]])
    assert joined.kwargs[form].tolist() == ([0, 3, 5] if form == "offsets" else [0, 0, 0, 1, 1])
    assert torch.equal(joined.kwargs["x"], torch.cat([case.kwargs["x"][2:5], case.kwargs["x"][:2]]))
    got = {"value": torch.tensor([[7.0], [8.0]]), "grad_x": torch.arange(5.0)}
    assert [{n: v.tolist() for n, v in o.items()} for o in items.outputs(joined, got)] == [
        {"value": [[7.0]], "grad_x": [0.0, 1.0, 2.0]}, {"value": [[8.0]], "grad_x": [3.0, 4.0]}]


def test_csr_bad_inputs_change_the_index_in_the_form_they_name():
    from kernel_sentinel.cases import csr_bad_inputs

    bad = {(b.argument, b.what): b for b in csr_bad_inputs(("toy.*",), in_form=lambda c, name: _csr_case(name))}
    assert len(bad) == 13 and {a for a, _ in bad} == {"offsets", "ids"}
    case = _csr_case("ids")
    assert bad["offsets", "decreasing"].make(case).kwargs["offsets"].tolist() == [0, 3, 2, 5]  # made in its form
    assert bad["offsets", "ending below N"].make(case).kwargs["offsets"].tolist() == [0, 2, 2, 4]
    assert bad["ids", "unsorted"].make(case).kwargs["ids"].tolist() == [2, 2, 2, 0, 0]
    assert bad["ids", "int16"].make(case).kwargs["ids"].dtype == torch.int16
    with pytest.raises(TypeError, match="no 'ids' and no in_form"):
        next(b for b in csr_bad_inputs(("toy.*",)) if b.argument == "ids").make(_csr_case("offsets"))


def test_csr_bad_inputs_misplace_ids_a_search_as_if_sorted_can_miss():
    from kernel_sentinel.cases import csr_bad_inputs

    made = csr_bad_inputs(("toy.*",), segments=lambda c: c.kwargs["num_segments"], tile_rows=lambda device: 4)
    bad = {b.what: b for b in made if b.argument == "ids"}
    case = _csr_case("ids", lengths=(2, 0, 6))  # ids 0 0 2 2 2 2 2 2: the last segment holds rows 2 .. 7
    assert bad["the last alone at S"].make(case).kwargs["ids"].tolist() == [0, 0, 2, 2, 2, 2, 2, 3]
    assert bad["S at rows inside the last segment"].make(case).kwargs["ids"].tolist() == [0, 0, 2, 3, 2, 2, 3, 3]
    assert bad["the first segment's id inside the last segment"].make(case).kwargs["ids"].tolist() == [
        0, 0, 2, 0, 2, 2, 2, 2]
    for lengths, rows in (((2, 1), 1), ((2, 3, 0), 0)):  # the last segment: one row; none (not segment 1's three)
        with pytest.raises(ValueError, match=f"a last segment of two rows or more, the case's has {rows}"):
            bad["S at rows inside the last segment"].make(_csr_case("ids", lengths=lengths))


def test_standard_bad_inputs_of_ranges_counts_flags_and_choices():
    from kernel_sentinel.cases import standard_bad_inputs

    made = standard_bad_inputs(("toy.*",), in_range={"lengths": (1, lambda c: c.kwargs["x"].shape[0])},
                               counts={"K": 1}, flags=("fast",), choices=("mode",), shapes={"x": (0, -1)})
    case = Case("toy.slow", "toy_sum", {"x": torch.arange(8.0).reshape(4, 2), "lengths": torch.tensor([2, 4]),
                                        "K": 3, "fast": False, "mode": "sum"}, "toy")
    got = {(b.argument, b.what): b.make(case).kwargs[b.argument] for b in made}
    assert {k: v.tolist() for k, v in got.items() if k[0] == "lengths"} == {
        ("lengths", "0 (below 1)"): [0, 0], ("lengths", "one past the largest allowed"): [5, 5]}
    assert {k: v.tolist() for k, v in got.items() if k[0] == "x"} == {
        ("x", "one longer along dim 0"): [[0, 1], [2, 3], [4, 5], [6, 7], [0, 1]],
        ("x", "one longer along dim -1"): [[0, 1, 0], [2, 3, 2], [4, 5, 4], [6, 7, 6]]}
    assert [(k, v) for k, v in got.items() if k[0] not in ("lengths", "x")] == [
        (("K", "0 (below 1)"), 0), (("K", "a float"), 2.0), (("K", "a bool"), True), (("fast", "an int"), 1),
        (("fast", "a string"), "yes"), (("mode", "a name of no option"), "no such option")]
    near = standard_bad_inputs(("toy.*",), choices={"mode": "prod"})
    assert [(b.what, b.make(case).kwargs["mode"]) for b in near] == [("'prod', not an option", "prod")]
    assert all(type(got["K", w]) is t for w, t in (("0 (below 1)", int), ("a float", float), ("a bool", bool)))
    with pytest.raises(TypeError, match="the case has no tensor 'lengths'"):
        made[0].make(Case("toy.slow", "toy_sum", {"lengths": [2, 4]}, "toy"))
    with pytest.raises(KeyError, match="no argument 'K'"):
        next(b for b in made if b.argument == "K").make(Case("toy.slow", "toy_sum", {}, "toy"))


def test_the_schema_page_documents_every_schema_name_and_no_other():
    """The guide page of the registration schema names every name the schema checks, and each name a bullet of the
    page declares is one the schema knows (the page and the check cannot drift apart)."""
    import re

    from kernel_sentinel.family import REPO_ROOT

    page = (REPO_ROOT / "traces" / "guide" / "registration.md").read_text()
    names = {*registration.schema.FAMILY_NAMES, *registration.schema.PART_NAMES}
    assert {n for n in names if f"`{n}`" not in page and f"`{n}(" not in page} == set()
    declared = set(re.findall(r"^- `([A-Z_]+)`", page, flags=re.M)) | set(re.findall(r"\. `([A-Z_]+)`:", page))
    assert declared and declared <= names


def test_declared_blocks_make_the_fixed_cases_cross_a_block_edge(package):
    """A registration declaring that a kernel tiles an argument in blocks (``BLOCKS``) has fixed cases that reach a
    second block; a size inside one block is reported with the route, the size and the argument."""
    inside = registration.family_of(package("BLOCKS = (('toy.*', 'x', 1, 8),)\n"))  # small: n = 8 columns
    assert inside.one_block_cases() == [
        f"toy.{r} (small): x.shape[1] = 8 fits in one block of 8: make SIZES['small'] span two blocks, so that the "
        f"edge between them runs" for r in ("fast", "slow")]
    assert registration.family_of(package("BLOCKS = (('toy.slow', 'x', 1, 4, ('small',)),)\n")).one_block_cases() == []
    both = registration.family_of(package("BLOCKS = (('toy.slow', 'x', -1, 4, ('small', 'tiny')),)\n"))
    assert [line.split(":")[0] for line in both.one_block_cases()] == ["toy.slow (tiny)"]


def test_an_invariants_statement_is_read_again_when_its_test_file_changes(tmp_path):
    """Test files are parsed once per version (modification time and size): an edited docstring is what the next
    lookup reads."""
    from kernel_sentinel.family import statement_of

    test_file = tmp_path / "tests" / "test_x.py"
    test_file.parent.mkdir()
    test_file.write_text('def test_a():\n    """It holds."""\n')
    assert statement_of("tests/test_x.py::test_a", tmp_path) == "It holds."
    assert statement_of("tests/test_x.py::test_a", tmp_path) == "It holds."
    test_file.write_text('def test_a():\n    """It holds, and more."""\n')
    assert statement_of("tests/test_x.py::test_a", tmp_path) == "It holds, and more."
    assert statement_of("tests/test_x.py::test_b", tmp_path) is None
