"""The verifier is itself tested: a toy family with a planted-wrong route, broken declarations, and bugs planted (as
text mutations) in the real semi-CRF PyTorch backend module behind the torch routes, each of which must make
``verify`` fail naming the route and the check."""
from __future__ import annotations

import dataclasses
import json
import os
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from conftest import planted_failure

from provable_kernels import alloc, validate
from provable_kernels.semicrf import torch_ops
from kernel_sentinel import records, registry, report, rows
from kernel_sentinel.checks import compare
from kernel_sentinel.family import REPO_ROOT, Adversarial, BadInput, Property, Tolerance, node_exists
from kernel_sentinel.generic import GENERIC_CHECKS
from kernel_sentinel.rows import CHECKS, Options, verify_route
from kernel_sentinel.verify import select_routes

SEMICRF = registry.family("semicrf")
CPU = Options(device=torch.device("cpu"), seed=0, examples=3)  # the toy family runs no Triton kernel
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: Triton under the interpreter
QUICK = Options(device=DEVICE, seed=0, examples=2, quick=True)
# after the generic checks: kernel observed, batch invariance, memory, races, opcheck, devices (the toy has no Triton
# kernel and no custom op, and runs on the CPU: observed, memory, races, opcheck and devices pass as not applicable)
NEW_CHECKS = ("observed", "batch", "memory", "races", "opcheck", "devices")


def statuses(result) -> dict[str, str]:
    return {c.name: c.status for c in result.checks}


# ---------------------------------------------------------------------------------------------- toy family


def test_correct_route_passes_every_check(toy_family):
    result = verify_route(toy_family(), "toy.slow", CPU)
    assert [c.name for c in result.checks] == list(CHECKS)
    assert result.passed, [c.detail for c in result.checks if not c.passed]
    reference = result.check("reference")
    assert reference.max_abs is not None and reference.max_abs <= reference.atol


def test_planted_bug_fails_reference_exact_and_properties_with_minimal_example(toy_family):
    family = toy_family()
    result = verify_route(family, "toy.fast", CPU)
    assert statuses(result) == {"route": "pass", "reference": "fail", "exact": "fail", "properties": "fail",
                                "guards": "pass", "bad_input": "pass",
                                **dict.fromkeys(GENERIC_CHECKS + NEW_CHECKS, "pass")}
    x = family.make_case("toy.fast", size="small", dtype=torch.float32, device=CPU.device, seed=0).kwargs["x"]
    assert result.check("reference").max_abs == pytest.approx(1e-3 * float(x[:, 0].abs().max()), rel=1e-3)
    prop = result.check("properties")
    assert "minimal example: 1;" in prop.detail  # shrunk to the smallest row length
    assert prop.repro == ("sentinel verify --family toy --route toy.fast --device cpu --seed 0 --examples 3 "
                          "--dtype float32")


def test_a_property_failure_that_does_not_recur_is_reported_with_its_example_not_as_flaky():
    """A check whose outcome depends on state outside the example (here: it fails only the first time it sees an
    example) is reported as a failure with its example and error, not as hypothesis's FlakyFailure."""
    from hypothesis import strategies as st

    seen: set = set()

    def first_time_only(route_id, example, device, dtype):
        if example >= 3 and example not in seen:
            seen.add(example)
            raise AssertionError(f"wrong at {example}")

    prop = Property("first time only", ("toy.*",), lambda: st.integers(0, 50), first_time_only)
    example, exc = rows.falsify(prop, "toy.slow", CPU, torch.float32)
    text = rows.error_text(exc)
    assert example >= 3 and "AssertionError: wrong at " in text, text
    assert "state outside the example" in text and "Flaky" not in text and "unreliable" not in text, text


def test_property_examples_run_with_allocations_poisoned():
    """Unwritten output elements are NaN in every example, whatever earlier runs left in memory."""
    from hypothesis import strategies as st

    def poisoned(route_id, example, device, dtype):
        assert torch.isnan(alloc.empty((example,), dtype=torch.float32, device=device)).all()

    prop = Property("allocations poisoned", ("toy.*",), lambda: st.integers(1, 8), poisoned)
    assert rows.falsify(prop, "toy.slow", CPU, torch.float32) is None


def test_misdispatched_route_fails_route_check(toy_family):
    def always_slow(route_id, **kw):
        case = toy_family().make_case("toy.slow", **kw)
        return type(case)(route_id, case.entry, case.kwargs, case.description)

    result = verify_route(toy_family(make_case=always_slow), "toy.fast", CPU)
    route = result.check("route")
    assert not route.passed and "intended route 'toy.fast', dispatcher recorded ['toy.slow']" in route.detail
    assert not result.check("reference").passed  # every run asserts the route


def test_unreachable_route_fails_instead_of_skipping(toy_family):
    def unreachable(route_id, **kw):
        raise RuntimeError(f"cannot build inputs for {route_id}")

    result = verify_route(toy_family(make_case=unreachable), "toy.slow", CPU)
    assert not result.passed
    assert [c.name for c in result.checks if not c.passed] == ["route", "reference", "exact", "guards", "bad_input",
                                                               *GENERIC_CHECKS, *NEW_CHECKS]
    assert "cannot build inputs for toy.slow" in result.check("route").detail


def test_nothing_declared_is_a_failure(toy_family):
    result = verify_route(toy_family(oracles=(), properties=(), adversarial=(), bad_inputs=()), "toy.slow", CPU)
    assert statuses(result) == {"route": "pass", "reference": "pass", "exact": "fail", "properties": "fail",
                                "guards": "fail", "bad_input": "fail",
                                **dict.fromkeys(GENERIC_CHECKS + NEW_CHECKS, "pass")}


def test_guard_catches_undeclared_infinity_and_errors(toy_family):
    huge = Adversarial("huge", ("toy.*",), lambda c: c.with_kwargs("3e38", x=torch.full_like(c.kwargs["x"], 3e38).requires_grad_()))
    guards = verify_route(toy_family(adversarial=(huge,)), "toy.slow", CPU).check("guards")
    assert not guards.passed and "huge: value has inf" in guards.detail  # the float32 sum overflows
    allowed = Adversarial("huge", ("toy.*",), huge.make, allow_inf=("value",))
    assert verify_route(toy_family(adversarial=(allowed,)), "toy.slow", CPU).check("guards").passed
    error_not_allowed = Adversarial("NaN input", ("toy.*",), lambda c: c.with_kwargs(
        "NaN", x=torch.full_like(c.kwargs["x"], math.nan).requires_grad_()))
    guards = verify_route(toy_family(adversarial=(error_not_allowed,)), "toy.slow", CPU).check("guards")
    assert not guards.passed and "raised ValueError: x contains NaN" in guards.detail


def test_bad_input_that_is_accepted_or_not_named_fails(toy_family):
    accepted = BadInput("x", "float64", ("toy.*",), lambda c: c.with_kwargs("x float64", x=c.kwargs["x"].double()))
    unnamed = BadInput("fast", "1-D x", ("toy.*",), lambda c: c.with_kwargs("x 1-D", x=c.kwargs["x"][0]))
    check = verify_route(toy_family(bad_inputs=(accepted, unnamed)), "toy.slow", CPU).check("bad_input")
    assert not check.passed
    assert "x (float64): accepted without error" in check.detail
    assert "fast (1-D x): message does not start with 'fast'" in check.detail


NEGATIVE = BadInput("x", "a negative entry", ("toy.*",), lambda c: c.with_kwargs(
    "x negative", x=(-c.kwargs["x"].detach().abs()).requires_grad_()))


def _rejecting_negative(value_of):
    """A toy route whose host checks reject a negative ``x`` (not in device mode) and whose outputs are
    ``value_of(x, row_sums)`` and the row sums' gradient."""
    def checked(case):
        x = case.kwargs["x"]
        if validate.current_mode() != "device" and bool((x < 0).any()):
            raise ValueError("x must be >= 0")
        total = x.abs().sum(-1)
        (grad,) = torch.autograd.grad(total.sum(), x)
        return {"value": value_of(x, total.detach()), "grad_x": grad}
    return checked


def test_bad_input_that_becomes_a_silent_number_in_device_mode_fails(toy_family):
    """A wrong value the host checks reject must, in device mode (no host read), raise or give NaN or an infinity:
    a route that then returns only finite numbers fails the check; one that poisons its outputs passes."""
    def run(poison: bool):
        return _rejecting_negative(lambda x, total: torch.where((x < 0).any(-1), math.nan, total) if poison
                                   else total)

    silent = verify_route(toy_family(bad_inputs=(NEGATIVE,), run=run(False)), "toy.slow", CPU).check("bad_input")
    assert not silent.passed and "a bad value became a silent number" in silent.detail, silent.detail
    poisoned = verify_route(toy_family(bad_inputs=(NEGATIVE,), run=run(True)), "toy.slow", CPU).check("bad_input")
    assert poisoned.passed and "in device mode 1 of them gave non-finite results" in poisoned.detail, poisoned.detail


def test_bad_input_that_leaves_an_output_unwritten_in_device_mode_fails(toy_family):
    """In device mode a bad input may give NaN, but every element of every output must still be written: a route
    whose poisoned output keeps one element it never wrote (NaN either way under the first poison) fails the check,
    naming the output; the same route writing that element passes."""
    from provable_kernels import alloc

    def run(skip_last: bool):
        def value_of(x, total):
            value, end = alloc.empty(total.shape, dtype=total.dtype, device=total.device), -1 if skip_last else None
            value[:end] = torch.where((x < 0).any(-1), math.nan, total)[:end]
            return value
        return _rejecting_negative(value_of)

    unwritten = verify_route(toy_family(bad_inputs=(NEGATIVE,), run=run(True)), "toy.slow", CPU).check("bad_input")
    assert not unwritten.passed and "device mode left elements unwritten" in unwritten.detail, unwritten.detail
    assert "value: 1/" in unwritten.detail, unwritten.detail
    written = verify_route(toy_family(bad_inputs=(NEGATIVE,), run=run(False)), "toy.slow", CPU).check("bad_input")
    assert written.passed, written.detail


def test_device_mode_bad_input_in_a_spawned_process_matches_in_process():
    """On a GPU the device-mode half of bad_input runs the bad inputs in a spawned process (a device assertion ends
    the CUDA context it fires in): one process rebuilds the family and case by name and runs the bad inputs one
    after the other (a new one goes on after a device assertion), reporting what the same runs in this process
    report (here on the CPU)."""
    import functools

    from kernel_sentinel import registry
    from kernel_sentinel.observed import in_child
    from kernel_sentinel.rows import _device_mode_run, _spawned_device_mode_runs, bad_inputs_of

    family, route = registry.family("sinkhorn"), "sinkhorn.torch.log.train"
    base = family.make_case(route, size="tiny", dtype=torch.float32, device=torch.device("cpu"), seed=0)
    count = len(bad_inputs_of(family, route))
    assert count >= 2
    indices = tuple(range(count))
    job = functools.partial(_spawned_device_mode_runs, "sinkhorn", route, "tiny", "float32", "cpu", 0, indices)
    assert in_child(job, "spawn") == [_device_mode_run(family, route, base, index) for index in indices]


def test_device_mode_processes_go_on_after_a_death_and_fail_when_the_route_cannot_be_set_up():
    """The device-mode runs in child processes (on a GPU): a child that stops after a bad input (a device assertion)
    or dies hands the rest to a new one, a death counting as raised; a child that cannot set the route up at all
    fails the check instead of counting every bad input as raised."""
    import os

    from kernel_sentinel.observed import in_child
    from kernel_sentinel.rows import _in_turn

    children = []

    def asserts_at_1(pending):  # bad input 1 fires a device assertion: the child reports up to it and stops
        children.append(pending)
        done = [(index == 1, False) for index in pending]
        return done[:pending.index(1) + 1] if 1 in pending else done

    assert _in_turn(asserts_at_1, (0, 1, 2)) == {0: (False, False), 1: (True, False), 2: (False, False)}
    assert children == [(0, 1, 2), (2,)]
    assert _in_turn(lambda pending: in_child(lambda: os._exit(3), "fork"), (4, 5)) == {4: (True, False, (), ""),
                                                                                       5: (True, False, (), "")}
    with pytest.raises(RuntimeError, match="could not run the route's bad inputs: raised KeyError"):
        _in_turn(lambda pending: in_child(lambda: {}["no such family"], "fork"), (0,))


def test_a_child_process_prints_nothing_here_and_a_death_reports_its_last_line(capfd, monkeypatch, tmp_path):
    """What a child process prints (a kernel-less run or a device assertion losing its CUDA context prints
    "terminate called without an active exception" as it dies) stays out of the verifier's output: a child that
    died is reported with its exit code and last line, and its temporary file is gone."""
    import os
    import tempfile

    from kernel_sentinel.observed import in_child

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the children's files, apart from other workers'

    def dies() -> None:
        os.write(1, b"a kernel's printf\n")
        os.write(2, b"terminate called without an active exception\n")
        os.abort()

    def answers() -> tuple[bool, str]:
        os.write(2, b"a warning\n")
        return False, "outputs still match the float64 reference"

    assert in_child(dies, "fork") == (True, "the process died (exit code -6: terminate called without an active "
                                            "exception)")
    assert in_child(answers, "fork") == (False, "outputs still match the float64 reference")
    assert in_child(lambda: os._exit(3), "fork") == (True, "the process died (exit code 3)")
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert list(tmp_path.iterdir()) == []


def test_compare_measures_errors_and_handles_infinities():
    tol = Tolerance(atol=1e-6, rtol=1e-3)
    m = compare("v", torch.tensor([1.0, -math.inf, 2.0], dtype=torch.float64),
                torch.tensor([1.0005, -math.inf, 2.0], dtype=torch.float64), tol)
    assert m.ok and m.max_abs == pytest.approx(5e-4, rel=1e-3) and m.max_rel == pytest.approx(5e-4 / 1.0005)
    assert not compare("v", torch.tensor([math.nan]), torch.tensor([1.0]), tol).ok
    assert not compare("v", torch.tensor([math.inf]), torch.tensor([1.0]), tol).ok
    assert not compare("v", torch.tensor([-math.inf]), torch.tensor([math.inf]), tol).ok
    assert not compare("v", torch.zeros(2), torch.zeros(3), tol).ok
    assert not compare("v", torch.tensor([1.01]), torch.tensor([1.0]), tol).ok


def test_node_exists_parses_test_files():
    assert node_exists("tests/test_verify.py::test_node_exists_parses_test_files")
    assert node_exists("tests/test_verify.py::test_node_exists_parses_test_files[param]")
    assert not node_exists("tests/test_verify.py::test_no_such_test")
    assert not node_exists("tests/no_such_file.py::test_x")


# ---------------------------------------------------------------------------------------------- registry


def test_registry_discovers_family_modules(tmp_path, monkeypatch):
    package = tmp_path / "fakekernels"
    (package / "copy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "copy" / "family.py").write_text("from provable_kernels.sinkhorn.family import *  # noqa: F401,F403\n")
    (package / "notafamily").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [f.name for f in registry.families("fakekernels")] == ["copy"]
    with pytest.raises(registry.UnknownFamily):
        registry.select(["nope"], "fakekernels")


def test_semicrf_is_registered_with_existing_invariant_tests():
    assert "semicrf" in [f.name for f in registry.families()]
    assert SEMICRF.missing_tests() == []
    assert SEMICRF.summary.startswith("Semi-Markov CRF")
    assert Path("kernels/semicrf/family.py") in SEMICRF.source_files()


# ----------------------------------------------------------------------------------------- reports, records


def test_json_junit_and_record_formats(tmp_path, monkeypatch, toy_family):
    family = toy_family()
    results = [verify_route(family, r, CPU) for r in ("toy.fast", "toy.slow")]
    device = {"type": "cpu", "name": "CPU (Triton interpreter)"}
    data = report.json_report(results, "abc", device)
    report.write_json(tmp_path / "r.json", data)
    loaded = json.loads((tmp_path / "r.json").read_text())
    assert set(loaded) == {"commit", "device", "routes"}
    assert [r["status"] for r in loaded["routes"]] == ["fail", "pass"]
    assert set(loaded["routes"][0]["checks"][1]) == {"name", "status", "max_abs", "max_rel", "atol", "rtol",
                                                    "of_tol", "detail", "repro", "seconds"}
    assert loaded["routes"][0]["checks"][1]["seconds"] >= 0
    report.write_junit(tmp_path / "j.xml", results)
    cases = ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
    failed = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    assert failed == [("toy.fast", "reference[float32]"), ("toy.fast", "exact[float32]"),
                      ("toy.fast", "properties[float32]")]

    monkeypatch.setattr(records, "record_dir", lambda: tmp_path / "verification")
    path = records.save_record(records.make_record(family, device, results))
    assert path == tmp_path / "verification" / "toy-cpu.json"
    text = path.read_text()
    assert text.endswith("}\n") and text == records.dumps(json.loads(text))
    record = records.load_record(path)
    assert record["commit"] == records.head_commit() and record["routes"] == loaded["routes"]
    some = str(family.source_files()[0])
    blob = subprocess.run(["git", "hash-object", some], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert record["sources"][some] == blob.strip()


def test_problems_are_failing_junit_testcases_and_json_entries(tmp_path, toy_family):
    """Every route passing but an invariant test missing: the exit code is 1, so the JUnit file must fail too."""
    results = [verify_route(toy_family(), "toy.slow", CPU)]
    problems = ["toy: invariant test tests/test_x.py::test_gone does not exist"]
    report.write_junit(tmp_path / "j.xml", results, problems)
    root = ET.parse(tmp_path / "j.xml").getroot()
    failed = [(c.get("classname"), c.get("name")) for c in root.iter("testcase") if c.find("failure") is not None]
    assert failed == [(report.PROBLEMS_CLASS, problems[0])]
    assert root.get("tests") == str(len(CHECKS) + 1) and root.get("failures") == "1"
    assert report.json_report(results, "abc", {"type": "cpu", "name": "CPU"}, problems)["problems"] == problems


def test_device_slug():
    assert records.device_slug({"type": "cpu", "name": "CPU (Triton interpreter)"}) == "cpu"
    assert records.device_slug({"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}) == "cuda-nvidia-h100-80gb-hbm3"


def test_route_selection_by_glob():
    chosen = [r for _, r in select_routes([SEMICRF], ["semicrf.*.viterbi"])]
    assert chosen == ["semicrf.triton.viterbi", "semicrf.torch.viterbi"]
    assert len(select_routes([SEMICRF], [])) == len(SEMICRF.routes())


# ------------------------------------------------------------------------------------- semi-CRF, planted bugs


TORCH_ROUTES = [r.id for r in SEMICRF.tree.routes() if r.id.startswith("semicrf.torch.")]


@pytest.mark.slow  # ~2.5 min; CI's lowest environment runs `sentinel verify --quick --dtype float32`
def test_every_semicrf_route_passes_quick():
    """Every route is reached by the dispatcher and passes route, reference, exact, property, guard and bad-input
    checks.

    Every leaf of the tree; without a GPU the Triton ones run under the interpreter (conftest.py switches it
    on)."""
    for route_id in [r.id for r in SEMICRF.tree.routes()]:
        result = verify_route(SEMICRF, route_id, dataclasses.replace(QUICK, examples=1))
        assert result.passed, (route_id, [c.detail for c in result.checks if not c.passed])


def test_semicrf_references_refuse_to_decode_a_tied_best_path():
    """All-zero scores tie every segmentation: the float64 reference and the exact backend fail loudly instead of
    decoding one of the tied paths."""
    case = SEMICRF.make_case("semicrf.torch.viterbi", size="tiny", dtype=torch.float64, device=torch.device("cpu"),
                             seed=0)
    zeros = {n: torch.zeros_like(x) for n, x in case.kwargs.items()
             if isinstance(x, torch.Tensor) and x.is_floating_point()}
    tied = case.with_kwargs("all scores 0", **zeros)
    exact_backend = next(o.compute for o in SEMICRF.oracles if o.name == "exact backend")
    for decode in (SEMICRF.reference, exact_backend):
        with pytest.raises(AssertionError, match="not a 0/1 indicator.*tied"):
            decode(tied)


def plant(monkeypatch: pytest.MonkeyPatch, old: str, new: str) -> None:
    """Plant a bug in the real ``provable_kernels.semicrf.torch_ops`` module for one test: its source with ``old``
    replaced by ``new`` (which must occur exactly once) is executed and every name of the result replaces the
    module's (monkeypatch restores them). The torch routes, which read that module, run the mutant; the family's
    reference (``provable_kernels.semicrf.oracle``) must not see it."""
    source = Path(torch_ops.__file__).read_text()
    assert source.count(old) == 1, f"mutation target {old!r} not found once in torch_ops.py"
    namespace: dict = {"__name__": torch_ops.__name__}
    exec(compile(source.replace(old, new), torch_ops.__file__, "exec"), namespace)
    for name, value in namespace.items():
        if not name.startswith("__"):
            monkeypatch.setattr(torch_ops, name, value, raising=False)


FORWARD = {"reference", "exact"}  # the checks a planted bug must fail on each route it breaks
LOG_AND_MAX_PARTITION = ["semicrf.torch.log.infer", "semicrf.torch.log.train", "semicrf.torch.max.infer"]
PLANTED = {  # bug: (text in torch_ops.py, its mutation, the torch routes it breaks); the other torch routes pass
    "ring-buffer index off by one": ("i = first % self.K", "i = (first + 1) % self.K", TORCH_ROUTES),
    "transposed transition": ("reduce(alpha[:, :, None] + self.trans_2d, 1)",
                              "reduce(alpha[:, :, None] + self.trans_2d.T, 1)",
                              {**dict.fromkeys(LOG_AND_MAX_PARTITION, FORWARD),  # max.train and Viterbi follow
                               "semicrf.torch.log.train": {"exact"}}),  # backpointers; training routes' small
    # case has a 3-D transition, so the 2-D one is their tiny case's, checked against brute force (exact)
    "wrong duration index": ("self.dur_by_w = self.dur.flip(0)", "self.dur_by_w = self.dur", TORCH_ROUTES),
    "missing length mask": ("self.lengths: list[int] = call.lengths.tolist()", "self.lengths: list[int] = [T] * B",
                            TORCH_ROUTES),
    "dropped proj_end": ("cum[:, 1:] + proj_end, pad]", "cum[:, 1:], pad]", TORCH_ROUTES),
    "wrong proj_start gradient": ("g_ps = self.starts[:, :-1]", "g_ps = self.ends[:, 1:]",
                                  ["semicrf.torch.log.train"]),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_in_torch_ops_fails_the_right_routes_and_checks(bug, monkeypatch):
    """Default sizes (not --quick): the small case has a 2-D transition (3-D on the training routes), the tiny one
    a 2-D transition. Only the checks that compare with the references run (the others would only cost time)."""
    old, new, broken = PLANTED[bug]
    plant(monkeypatch, old, new)
    options = dataclasses.replace(QUICK, quick=False, checks=("route", "reference", "exact"))
    for route_id in TORCH_ROUTES:
        result = verify_route(SEMICRF, route_id, options)
        failed = {c.name for c in result.checks if not c.passed}
        expected = (broken.get(route_id, set()) if isinstance(broken, dict)
                    else FORWARD if route_id in broken else set())
        assert failed == expected, (
            route_id, [c.detail for c in result.checks if not c.passed])


def test_rows_per_route_and_dtype(toy_family):
    """Every route at every dtype of its family (dtype-major), ``--dtype`` narrowing it; each row reports its dtype
    and checks at that dtype's tolerance."""
    from kernel_sentinel.verify import select_rows

    family = toy_family(dtypes=(torch.float32, torch.float64))
    rows = [(r, str(d)) for _, r, d in select_rows([family], [])]
    assert rows == [("toy.fast", "torch.float32"), ("toy.slow", "torch.float32"), ("toy.fast", "torch.float64"),
                    ("toy.slow", "torch.float64")]
    assert [(r, d) for _, r, d in select_rows([family], ["toy.slow"], [torch.float64])] == [("toy.slow", torch.float64)]
    result = verify_route(family, "toy.slow", CPU, dtype=torch.float64)
    assert result.dtype == "float64" and result.passed and result.check("reference").atol == 1e-12
    with pytest.raises(ValueError, match="no tolerance"):
        toy_family(dtypes=(torch.float16,))


def test_dtype_no_family_declares_is_a_usage_error(capsys):
    from kernel_sentinel.cli import main

    assert main(["verify", "--family", "semicrf", "--dtype", "bfloat16", "--device", "cpu"]) == 2
    assert "--dtype bfloat16: no selected family declares it" in capsys.readouterr().err


def test_a_record_names_the_commit_and_sources_at_the_start_of_the_run(tmp_path, monkeypatch):
    """A commit made while a long verification runs must not be named for it: the record and the JSON report carry
    the commit and source blob ids taken when the run began."""
    from kernel_sentinel import workers
    from kernel_sentinel.cli import main

    head = ["before0"]
    verify_here = workers.verify_here

    def committing_while_running(*args, **kwargs):
        results = verify_here(*args, **kwargs)
        head[0] = "after00"  # a commit lands while the run goes on
        return results

    monkeypatch.setattr(records, "head_commit", lambda: head[0])
    monkeypatch.setattr(workers, "verify_here", committing_while_running)
    assert main(["verify", "--family", "sinkhorn", "--route", "sinkhorn.torch.log.infer", "--device", "cpu",
                 "--quick", "--jobs", "0", "--json", str(tmp_path / "report.json")]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["commit"] == "before0"
    family = registry.family("sinkhorn")
    record = records.make_record(family, {"type": "cpu"}, [], ("before0", {"kernels/x.py": "0" * 40}))
    assert (record["commit"], record["sources"]) == ("before0", {"kernels/x.py": "0" * 40})


def test_records_name_the_commit_given_by_sentinel_commit(monkeypatch):
    """A copy of the tree sent to a GPU machine names its commit in SENTINEL_COMMIT; a git checkout found there
    (another commit) must not override it."""
    monkeypatch.setenv("SENTINEL_COMMIT", "0123abc")
    assert records.head_commit() == "0123abc"
    monkeypatch.delenv("SENTINEL_COMMIT")
    assert records.head_commit() == records.git("rev-parse", "HEAD")


def test_jobs_give_the_rows_of_one_process_in_order(tmp_path):
    """``--jobs 2`` runs the rows in spawned worker processes: the same results (checks, errors, details) in the
    same order as one process."""
    from kernel_sentinel.cli import main

    selection = ["verify", "--family", "sinkhorn", "--route", "sinkhorn.torch.*", "--dtype", "float32",
                 "--device", "cpu", "--quick"]
    assert main([*selection, "--jobs", "1", "--json", str(tmp_path / "one.json")]) == 0
    assert main([*selection, "--jobs", "2", "--json", str(tmp_path / "two.json")]) == 0
    one, two = (json.loads((tmp_path / f"{n}.json").read_text())["routes"] for n in ("one", "two"))
    for row in one + two:  # wall times differ from run to run
        for check in row["checks"]:
            assert check.pop("seconds") >= 0
    assert len(one) == 5 and one == two  # the five torch routes


@pytest.mark.slow  # two fresh verify processes, one with two workers: ~1 min
def test_coverage_with_jobs_is_the_union_of_the_workers_lines(tmp_path):
    """``--coverage --jobs 2`` reports the same lines as one process: each worker measures its units (and its own
    imports) and the parent adds their lines to its own."""
    def covered(jobs: str) -> list[dict]:
        report = tmp_path / f"jobs{jobs}.json"
        done = subprocess.run([sys.executable, "-m", "kernel_sentinel", "verify", "--family", "sinkhorn", "--route",
                               "sinkhorn.torch.*", "--dtype", "float32", "--device", "cpu", "--quick", "--coverage",
                               "--jobs", jobs, "--json", str(report)], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(report.read_text())["coverage"]["files"]

    one, two = covered("1"), covered("2")
    assert [f["path"] for f in one] == [f["path"] for f in two]
    assert any(f["reached"] for f in one)
    for a, b in zip(one, two):
        assert (a["reached"], a["unreached"]) == (b["reached"], b["unreached"]), a["path"]


def test_jobs_auto_starts_processes_only_for_much_work(monkeypatch):
    import os

    from kernel_sentinel import workers
    from kernel_sentinel.verify import AUTO_JOBS, AUTO_MIN_UNITS, resolve_jobs

    assert resolve_jobs("auto", AUTO_MIN_UNITS - 1) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert resolve_jobs("auto", AUTO_MIN_UNITS) == AUTO_JOBS
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert resolve_jobs("auto", 500) == 2
    # ten semi-CRF Triton rows (a GPU run's slowest part) are enough work for workers: a unit per property
    semicrf = registry.family("semicrf")
    rows = [(semicrf, route_id, dtype) for dtype in semicrf.dtypes
            for _, route_id in select_routes([semicrf], ["semicrf.triton.*"])]
    assert len(rows) == 10 and workers.unit_count(rows, CPU) >= AUTO_MIN_UNITS


class _InProcessPool:
    """Stands in for the spawned pool of ``--jobs``: runs each unit when submitted, in this process (so a family
    built here needs no registry entry)."""

    def __init__(self, jobs, mp_context=None, initializer=None, initargs=()):
        initializer(*initargs)

    def submit(self, fn, *args):
        from concurrent.futures import Future

        future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, wait=True, cancel_futures=False):
        pass


def _raise(route_id, example, device, dtype):
    raise RuntimeError("boom")


def _no_strategy():
    raise RuntimeError("no strategy")


@pytest.fixture
def in_process_jobs(monkeypatch, toy_family):
    """The toy family with a property that raises and one whose strategy cannot be built, served to the
    ``--jobs`` machinery in this process."""
    from hypothesis import strategies as st

    from kernel_sentinel import workers
    from kernel_sentinel.family import Property

    family = toy_family()
    family = toy_family(properties=family.properties + (
        Property("always raises", ("toy.*",), lambda: st.integers(1, 2), _raise),
        Property("strategy cannot be built", ("toy.*",), _no_strategy, _raise)))
    monkeypatch.setattr(workers, "ProcessPoolExecutor", _InProcessPool)
    monkeypatch.setattr(registry, "family", lambda name: family)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    return family


def in_processes(selected, jobs: int = 2):
    """``workers.verify_in_processes`` of ``selected`` in ``jobs`` unpinned workers, on the CPU."""
    from kernel_sentinel import workers

    pinned = workers.slots(jobs, (), 100)
    return workers.verify_in_processes(selected, CPU, pinned, workers.shares(pinned))


def test_jobs_assemble_failing_and_raising_properties_as_one_process(in_process_jobs):
    from kernel_sentinel import workers

    family = in_process_jobs
    selected = [(family, route_id, dtype) for dtype in family.dtypes for route_id in ("toy.fast", "toy.slow")]
    one = [verify_route(family, route_id, CPU, dtype=dtype) for _, route_id, dtype in selected]
    assert in_processes(selected) == one  # CheckResult equality leaves out the seconds
    properties = one[1].check("properties")  # toy.slow: the sum property holds, the other two fail
    assert not properties.passed and properties.detail.count("fails; minimal example") == 2
    assert "RuntimeError: no strategy" in properties.detail and "RuntimeError: boom" in properties.detail


CRASHING = '''
import ctypes

import torch

from provable_kernels.dispatch import Branch, Condition, Route, Tree


def crashes(call):
    """The route of a kernel whose compiled code crashes on NaN (as a heap corruption would)."""
    x, _ = call
    if torch.isnan(x).any():
        print("about to crash on a NaN", flush=True)
        ctypes.string_at(0)  # a read of address 0: SIGSEGV
    return x.double().sum(-1).to(x.dtype)


def sums(call):
    return call[0].double().sum(-1).to(call[0].dtype)


def ask(call):
    """The route the call names."""
    return call[1]


TREE = Tree("crashy", Branch(Condition("which", ask, ("crashes", "sums")),
                             {"crashes": Route("crashy.crashes", crashes), "sums": Route("crashy.sums", sums)}))


def row_sum(x, which):
    """Sum of each row of ``x`` (N, D)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise TypeError("x must be a 2-D tensor")
    return TREE.dispatch((x, which))


ENTRY_POINTS = {"row_sum": row_sum}
TOLERANCES = {torch.float64: (1e-12, 1e-12)}
SIZES = {"small": dict(n=6), "tiny": dict(n=2)}


def case(route_id, p, gen, device):
    return "row_sum", {"x": torch.randn(3, p.n, generator=gen, dtype=torch.float64),
                       "which": route_id.rpartition(".")[2]}, {}


def reference(kw, case):
    return {"value": kw["x"].sum(-1)}


def example(pick):
    return dict(n=pick(range(1, 4)))


def holds(check, case):
    check.matches_reference(case, check.forward(case))


ORACLES = (("python loop", "tiny", lambda kw, case: {"value": torch.tensor([sum(r) for r in kw["x"].tolist()],
                                                                           dtype=torch.float64)}),)
PROPERTIES = (("matches the reference", "crashy.*", holds),)
ADVERSARIAL = (("huge", {"x": lambda x: x * 1e30}, None, {"allow_inf": ("value",)}),
               ("NaN", {"x": lambda x: x * float("nan")}, None, {"routes": "crashy.crashes"}))
BAD_INPUTS = (("x", "a list", [1.0]),)
BATCH_ITEMS = (("a row", "crashy.*", {"x": 0, "value": 0}),)
'''


def test_jobs_a_crashing_worker_fails_only_the_unit_it_ran(tmp_path):
    """A worker process that dies (a segfault in code the route calls) fails the check it was running alone, with
    its exit code and the last lines of its output; the checks before and after it, and every other unit, keep
    their results, and the report is written."""
    import subprocess
    import sys

    (tmp_path / "crashy").mkdir()
    (tmp_path / "crashy" / "__init__.py").write_text('"""A family with a route that crashes its process."""\n')
    (tmp_path / "crashy" / "family.py").write_text(CRASHING)
    env = {**os.environ, "SENTINEL_FAMILY_PATH": str(tmp_path), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "kernel_sentinel", "verify", "--family", "crashy", "--jobs", "2",
                           "--examples", "2", "--json", str(tmp_path / "report.json")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {r["id"]: r for r in json.loads((tmp_path / "report.json").read_text())["routes"]}
    assert rows["crashy.sums"]["status"] == "pass"  # beside the crash, untouched
    checks = {c["name"]: c for c in rows["crashy.crashes"]["checks"]}
    assert [name for name, c in checks.items() if c["status"] == "fail"] == ["guards"]  # the NaN input crashed
    assert "died (exit code -11 (SIGSEGV))" in checks["guards"]["detail"]
    assert "about to crash on a NaN" in checks["guards"]["detail"]


def test_jobs_a_stalled_unit_prints_which_it_is_and_its_stack(in_process_jobs, monkeypatch, capsys):
    """A unit still running after STALL_SECONDS says so once, with the stack of where it is; its result stands."""
    import time

    from kernel_sentinel import workers

    family, unit_result = in_process_jobs, workers._unit_result

    def stalls_in_other_checks(family_name, route_id, dtype, unit):
        if unit == workers.OTHER_CHECKS:
            time.sleep(0.5)
        return unit_result(family_name, route_id, dtype, unit)

    monkeypatch.setattr(workers, "STALL_SECONDS", 0.1)
    monkeypatch.setattr(workers, "_unit_result", stalls_in_other_checks)
    (row,) = in_processes([(family, "toy.fast", torch.float32)])
    assert row == verify_route(family, "toy.fast", CPU, dtype=torch.float32)
    err = capsys.readouterr().err  # a property unit may pass 0.1 s as well: it says so for itself
    stalled = "still running after 0.1 s: toy.fast float32, its checks other than properties; its stack:"
    assert err.count(stalled) == 1, err
    assert "in stalls_in_other_checks" in err and "time.sleep(0.5)" in err


def test_log_row_prints_one_line_per_row_off_a_terminal(capsys, toy_family):
    import re

    result = verify_route(toy_family(), "toy.slow", CPU)
    report.log_row(result, 2, 5)
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(r"\[2/5\] toy\.slow float32: pass in \d+\.\d s", line), line


@pytest.mark.parametrize("value", ["-1", "x"])
def test_bad_jobs_is_a_usage_error(value, capsys):
    from kernel_sentinel.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["verify", "--jobs", value])
    assert exit_info.value.code == 2 and "argument --jobs: must be" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scratch worker verifies on the CPU")
def test_planted_short_value_scan_fails_bad_input_in_device_mode():
    """The semi-CRF forward's scan of ``cum_scores`` stopping two rows short: a NaN in the padding of a short
    sequence then comes out as a finite logZ in device mode, so ``bad_input`` must fail (and pass unmutated)."""
    route = "semicrf.triton.log.infer"
    planted_last = planted_failure(
        "semicrf", route, "bad_input", "kernels/semicrf/triton_forward.py", r"span_nonfinite\(cum, \(T \+ 1\) \* C",
        "(T + 1) * C", "(T - 1) * C")
    assert planted_last.startswith(f"{route} float32 bad_input: cum_scores (NaN in the last row of the shortest "
                                   f"sequence (padding past its length)): device mode returned only numbers"), \
        planted_last


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scratch worker verifies on the CPU")
def test_planted_nan_flag_bug_fails_bad_input_in_device_mode():
    """Sinkhorn's NaN/+inf flag reduced with min along a row (a matrix is flagged only when a whole row is bad): host
    mode still rejects the NaN by name, but in device mode the matrix comes out as finite numbers, so ``bad_input``
    must fail on the Triton route (and passes on the unmutated sources)."""
    route = "sinkhorn.triton.prob.infer"
    planted_last = planted_failure(
        "sinkhorn", route, "bad_input", "kernels/sinkhorn/triton_sinkhorn.py", r"bad = tl\.max\(tl\.max\(bad_entry",
        "tl.max(tl.max(bad_entry", "tl.max(tl.min(bad_entry")
    assert planted_last.startswith(f"{route} float32 bad_input: x (NaN): device mode returned only numbers"), planted_last


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scratch worker verifies on the CPU")
def test_planted_unwritten_segment_fails_bad_input_in_device_mode():
    """Segment's short programs trusting that a long segment's last-chunk program finishes it without checking that
    this program finds the same segment: with unsorted ids in device mode that segment's output is then never
    written. The two-poison comparison of ``bad_input`` sees it (NaN is a correct output there), and so does the
    family's rule for where bad ids put NaN (the unwritten value is a number in the finite-poison run)."""
    route = "segment.triton.sum.train.ids"
    planted_last = planted_failure(
        "segment", route, "bad_input", "kernels/segment/triton_segment.py", r"return exists & \(found == s\)",
        "exists & (found == s)", "exists")
    assert planted_last.startswith(f"{route} float32 bad_input: ids (unsorted): device mode: value: NaN at"), \
        planted_last
    assert "ids (unsorted): device mode left elements unwritten" in planted_last, planted_last


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scratch worker verifies on the CPU")
def test_planted_gradient_of_a_row_past_its_segment_fails_bad_input_in_device_mode():
    """The backward keeping the gradient of a row that lies past its id's segment (``rows < end`` dropped from
    ``inside``): other rows stay NaN, so only the family's rule for where bad ids put NaN sees it."""
    route = "segment.triton.max_backward"
    planted_last = planted_failure(
        "segment", route, "bad_input", "kernels/segment/triton_segment.py",
        r"inside = \(start <= rows\) & \(rows < end\) & ", "(rows < end) & ", "")
    assert planted_last.startswith(f"{route} float32 bad_input: ids (unsorted): device mode: grad_x: NaN at"), \
        planted_last


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scratch worker verifies on the CPU")
def test_planted_bug_in_the_kernels_own_id_check_fails_reference_in_device_mode():
    """The kernels' own ids check (device mode, the CUDA default) reading the wrong rows, before ``ids``: on the CPU
    only the device-mode run of ``reference`` reaches that code with valid inputs, and the memory guard stops the
    reads before they are made."""
    route = "segment.triton.sum.train.ids"
    planted_last = planted_failure(
        "segment", route, "reference", "kernels/segment/triton_segment.py",
        r"tl\.load\(ids_ptr \+ rows, mask=live, other=0\) != seg", "ids_ptr + rows", "ids_ptr - rows")
    assert planted_last.startswith(f"{route} float32 reference: OutOfBounds: segment_chunk_kernel program"), \
        planted_last
    assert "before the start of argument ids_ptr" in planted_last, planted_last


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scratch worker verifies on the CPU")
def test_planted_short_search_step_fails_guards():
    """The FAN-ary search's step rounded down loses the last id of a window of FAN k + 1: the guard with
    N = 1 (mod FAN) rows in the ids form must see the last segment one row short."""
    route = "segment.triton.sum.train.ids"
    planted_last = planted_failure(
        "segment", route, "guards", "kernels/segment/triton_segment.py", r"step = \(hi - lo \+ FAN - 1\) // FAN",
        "FAN - 1", "FAN - 2")
    assert planted_last.startswith(f"{route} float32 guards: N = 1 (mod 32) rows in the ids form"), planted_last


def test_a_worker_loads_each_family_once(monkeypatch):
    """A worker process loads a family at its first unit of it and keeps it for the next ones (loading finds every
    registration and parses its invariants' test files: half a second a unit before)."""
    from kernel_sentinel import registry, workers

    loaded = []
    real = registry.family
    monkeypatch.setattr(workers, "_families", {})
    monkeypatch.setattr(registry, "family", lambda name: loaded.append(name) or real(name))
    first = workers._family("sinkhorn")
    assert workers._family("sinkhorn") is first and first.name == "sinkhorn" and loaded == ["sinkhorn"]
