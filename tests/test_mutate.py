"""``sentinel mutate``: the mutation operators (never inside comments, docstrings, strings, annotations), the
reviewed-equivalents file, and a seeded sample of real mutants per family that the CPU verifier must kill."""
from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernel_sentinel import layout, mutate, registry
from kernel_sentinel.family import REPO_ROOT

SOURCE = '''"""Module docstring: a < b, x - 1, max(a, b)."""
import triton.language as tl


def kernel(x: "int - 1", n: int = 2) -> "a < b":
    """Docstring with -x and mask=m."""
    # comment: a < b, where(c, a, b), i + 1
    message = f"{n - 1} < {n}"
    if n < 3 and x is None:
        return "a - b"
    y = tl.load(x + n - 1, mask=(n >= 0) & (n < 8), other=0.0)
    z = tl.where(y > 0, y, -y)
    return tl.max(z, 0) + x[n + 1] / 2
'''


def diffs() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in mutate.find_mutants(SOURCE, "k.py"):
        ast.parse(m.apply(SOURCE))  # every mutant is valid Python
        out.setdefault(m.operator, []).append(m.after)
    return out


def test_every_operator_plants_its_bug():
    found = diffs()
    assert set(found) == set(mutate.OPERATORS)
    assert "if n <= 3 and x is None:" in found["comparison"]
    assert "if n < 3 and x is not None:" in found["comparison"]
    assert "y = tl.load(x + n - 2, mask=(n >= 0) & (n < 8), other=0.0)" in found["off-by-one"]
    assert "return tl.max(z, 0) + x[n + 2] / 2" in found["off-by-one"]
    assert "y = tl.load(1 - (x + n), mask=(n >= 0) & (n < 8), other=0.0)" in found["swap"]
    assert "z = tl.where(y > 0, -y, y)" in found["swap"]
    assert "y = tl.load(x + n - 1, other=0.0)" in found["mask"]
    assert "y = tl.load(x + n - 1, mask=(n >= 0), other=0.0)" in found["mask"]
    assert "z = (y)" not in found["mask"] and "z = y" in found["mask"]
    assert "return tl.min(z, 0) + x[n + 1] / 2" in found["reduction"]
    assert "z = tl.where(y > 0, y, y)" in found["sign"]
    assert "return tl.max(z, 0) - (x[n + 1] / 2)" in found["sign"]
    assert "y = tl.load((x + n) + 1, mask=(n >= 0) & (n < 8), other=0.0)" in found["sign"]


def test_comments_docstrings_strings_and_annotations_are_never_mutated():
    for m in mutate.find_mutants(SOURCE, "k.py"):
        changed = SOURCE[m.start:m.end]
        assert m.line >= 8, m.diff()  # nothing in the docstrings, the signature's annotations or the comment
        assert "f\"" not in changed and '"a - b"' not in changed, m.diff()
    assert all(m.line != 10 for m in mutate.find_mutants(SOURCE, "k.py"))  # return "a - b"


def test_equivalents_need_a_reason_and_are_matched_by_file_and_lines(tmp_path):
    path = tmp_path / mutate.EQUIVALENTS
    assert mutate.load_equivalents(path) == {}
    path.write_text(json.dumps([{"file": "k.py", "before": "a", "after": "b", "reason": ""}]))
    with pytest.raises(ValueError, match="entry 0 has no reason"):
        mutate.load_equivalents(path)
    m = mutate.find_mutants(SOURCE, "k.py")[0]
    path.write_text(json.dumps([{"file": m.file, "before": m.before, "after": m.after, "reason": "same value"}]))
    assert mutate.load_equivalents(path) == {(*m.key, ""): "same value"}
    path.write_text(json.dumps([{"file": m.file, "before": m.before, "after": m.after, "reason": r}
                                for r in ("same value", "listed twice")]))
    with pytest.raises(ValueError, match="entry 1 names the mutant of an earlier entry"):
        mutate.load_equivalents(path)


def test_an_entry_naming_the_next_line_picks_one_of_identical_lines(tmp_path):
    source = "def f(x, y):\n    if x > 0:\n        y = 1\n    if x > 0:\n        y = 2\n    return y\n"
    first, second = [m for m in mutate.find_mutants(source, "k.py") if m.after == "if x >= 0:"]
    assert (first.following, second.following) == ("y = 1", "y = 2")
    path = tmp_path / mutate.EQUIVALENTS
    entry = {"file": "k.py", "before": "if x > 0:", "after": "if x >= 0:", "reason": "y is 1 either way"}
    path.write_text(json.dumps([{**entry, "next": "y = 1"}]))
    listed = mutate.load_equivalents(path)
    assert mutate.listed_reason(listed, first) == "y is 1 either way" and mutate.listed_reason(listed, second) is None
    path.write_text(json.dumps([entry]))  # without "next": every identical line
    listed = mutate.load_equivalents(path)
    assert mutate.listed_reason(listed, first) == mutate.listed_reason(listed, second) == "y is 1 either way"


def test_rescore_takes_survivors_listed_since_out_of_the_counts(tmp_path):
    (tmp_path / "k.py").write_text(SOURCE)
    mutants = mutate.find_mutants(SOURCE, "k.py")[:4]
    outcomes = [mutate.Outcome(mutants[0], "killed"), mutate.Outcome(mutants[1], "survived"),
                mutate.Outcome(mutants[2], "survived"), mutate.Outcome(mutants[3], "unreached")]
    record = mutate.summarize("toy", outcomes, candidates=10, excluded=1, seed=0)
    record = {k: v for k, v in record.items() if k != "mutants"}
    listed = {(*mutants[1].key, mutants[1].following): "the same program",
              (*mutants[3].key, ""): "listed, but no route runs it"}
    rescored = mutate.rescore(record, listed, tmp_path)
    shown = mutate.summarize("toy", mutate.with_equivalents(outcomes, listed), candidates=10, excluded=1, seed=0)
    assert rescored == {k: v for k, v in shown.items() if k != "mutants"}  # as if listed by the run's end
    assert (rescored["kill_rate"], rescored["equivalent_sampled"], len(rescored["survivors"])) == (33.3, 1, 2)
    older = {k: v for k, v in record.items() if k != "equivalent_sampled"}  # a record from before the key
    assert mutate.rescore(older, listed, tmp_path) == rescored
    (tmp_path / "k.py").write_text(SOURCE.replace("n < 3", "n < 4"))
    with pytest.raises(ValueError, match="survivor not among the mutants"):
        mutate.rescore(record, listed, tmp_path)


def test_summary_counts_unreached_and_survivors_against_the_kill_rate():
    mutants = mutate.find_mutants(SOURCE, "k.py")[:4]
    outcomes = [mutate.Outcome(mutants[0], "killed"), mutate.Outcome(mutants[1], "timeout"),
                mutate.Outcome(mutants[2], "survived"), mutate.Outcome(mutants[3], "unreached")]
    summary = mutate.summarize("toy", outcomes, candidates=10, excluded=1, seed=0)
    assert summary["kill_rate"] == 50.0 and summary["files"]["k.py"] == {"mutants": 4, "killed": 2, "kill_rate": 50.0}
    assert [s["status"] for s in summary["survivors"]] == ["survived", "unreached"]
    assert summary["survivors"][0]["diff"] == mutants[2].diff()
    reviewed = {(*mutants[2].key, ""): "the same program", (*mutants[0].key, ""): "listed, but the run killed it"}
    shown = mutate.with_equivalents(outcomes, reviewed)  # a survivor shown equivalent since
    assert [o.status for o in shown] == ["killed", "timeout", "equivalent", "unreached"]
    summary = mutate.summarize("toy", shown, candidates=10, excluded=1, seed=0)
    assert (summary["kill_rate"], summary["killed"], summary["sampled"], summary["equivalent_sampled"]) == \
        (66.7, 2, 4, 1)
    assert [s["status"] for s in summary["survivors"]] == ["unreached"]


def test_the_last_records_survivors_run_again_outside_the_kill_rate(tmp_path):
    """The survivors of the committed record, found again by file, lines and operator after the lines moved, run
    beside the sample and are reported apart from it; one already in the sample runs once, as part of it."""
    class Toy:
        name, root = "toy", tmp_path
    mutants = mutate.find_mutants(SOURCE, "k.py")
    record = tmp_path / "traces" / "verification" / "mutation" / "toy.json"
    record.parent.mkdir(parents=True)
    moved = [m.diff().replace(f"k.py:{m.line}:", f"k.py:{m.line + 7}:") for m in mutants[1:3]]
    record.write_text(json.dumps({"survivors": [{"diff": d, "status": "survived"} for d in moved]
                                  + [{"diff": mutants[3].diff(), "status": "unreached"}]}))
    assert mutate.earlier_survivors(Toy, mutants, [mutants[0], mutants[2]]) == [mutants[1]]
    assert mutate.earlier_survivors(Toy, mutants[2:], []) == [mutants[2]]  # kept: none listed equivalent
    sample = [mutate.Outcome(mutants[0], "killed"), mutate.Outcome(mutants[2], "survived")]
    summary = mutate.summarize("toy", sample, candidates=10, excluded=0, seed=0,
                               earlier=[mutate.Outcome(mutants[1], "killed", "races")])
    assert (summary["sampled"], summary["killed"], summary["kill_rate"]) == (2, 1, 50.0)
    assert summary["earlier_survivors"] == [{"diff": mutants[1].diff(), "status": "killed", "by": "races"}]
    older = tmp_path / "older.json"  # --rerun: another record, with a survivor that a run of it kept
    older.write_text(json.dumps({"survivors": [], "earlier_survivors": [{"diff": moved[1], "status": "survived"},
                                                                        {"diff": moved[0], "status": "killed"}]}))
    assert mutate.earlier_survivors(Toy, mutants, [], older) == [mutants[2]]
    record.unlink()
    assert mutate.earlier_survivors(Toy, mutants, []) == []


def test_rerun_names_a_record_of_the_one_family_mutated(tmp_path):
    from kernel_sentinel.cli import main

    other = tmp_path / "sinkhorn.json"
    other.write_text(json.dumps({"family": "sinkhorn", "survivors": []}))
    assert main(["mutate", "--family", "segment", "--rerun", str(tmp_path / "none.json")]) == 2
    assert main(["mutate", "--family", "segment", "--rerun", str(other)]) == 2
    assert main(["mutate", "--family", "segment", "sinkhorn", "--rerun", str(other)]) == 2


class _FakeScratch:
    """A scratch whose worker records that each of its routes reaches line 3 (and import-time line 1), or fails."""

    def __init__(self, directory: Path, fails: bool = False):
        directory.mkdir()
        self.dir, self.fails, self.ran = directory, fails, []

    def worker(self, family, routes, seed, timeout, coverage_to=None):
        self.ran += routes
        coverage_to.write_text(json.dumps({"lines": {"k.py": {"3": list(routes), "1": [mutate.ALL_ROUTES]}},
                                           "seconds": dict.fromkeys(routes, 1.0),
                                           "launch_seconds": dict.fromkeys(routes, 0.25)}))
        return (1, "route r2 float32 reference: off", False) if self.fails else (0, "", False)

    def cancel(self):  # its worker answers at once: nothing to stop
        pass


def test_baseline_deals_the_routes_out_over_the_workers_and_merges_their_coverage(tmp_path):
    a, b = _FakeScratch(tmp_path / "a"), _FakeScratch(tmp_path / "b")
    baseline = mutate.run_baseline([a, b], "fam", ["r1", "r2", "r3"], 0)
    assert sorted(a.ran + b.ran) == ["r1", "r2", "r3"] and a.ran and b.ran
    assert baseline.lines == {"k.py": {3: {"r1", "r2", "r3"}, 1: {mutate.ALL_ROUTES}}}
    assert baseline.seconds == dict.fromkeys(["r1", "r2", "r3"], 1.0)
    assert baseline.launch_seconds == dict.fromkeys(["r1", "r2", "r3"], 0.25)
    with pytest.raises(RuntimeError, match="unmutated run of fam fails.*reference: off"):
        mutate.run_baseline([_FakeScratch(tmp_path / "c"), _FakeScratch(tmp_path / "d", fails=True)], "fam",
                            ["r1", "r2"], 0)


def test_baseline_deals_the_routes_by_their_recorded_seconds(tmp_path):
    """The unmutated run balances its workers by each route's seconds in the family's CPU record: the long route
    gets a worker of its own."""
    a, b = _FakeScratch(tmp_path / "a"), _FakeScratch(tmp_path / "b")
    mutate.run_baseline([a, b], "fam", ["r1", "r2", "r3"], 0, {"r1": 1.0, "r2": 10.0, "r3": 1.0})
    assert sorted([a.ran, b.ran]) == [["r1", "r3"], ["r2"]]
    recorded = mutate.recorded_seconds("segment")
    assert set(recorded) == {r.id for r in registry.select(["segment"])[0].routes()}
    assert all(seconds > 0 for seconds in recorded.values())
    assert mutate.recorded_seconds("no-such-family") == {}


def test_kept_runs_go_on_where_they_stopped_only_for_the_same_key(tmp_path):
    path, runs = tmp_path / "kept.json", []
    mutant = mutate.find_mutants(SOURCE, "k.py")[0]

    def run() -> mutate.Baseline:
        runs.append(1)
        return mutate.Baseline({"k.py": {3: {"r1"}, 1: {mutate.ALL_ROUTES}}}, {"r1": 2.0})

    key = {"family": "fam", "sources": {"kernels/fam/k.py": "abc"}, "verifier": {}, "routes": ["r1"], "seed": 0}
    first = mutate.Kept(path, key)
    baseline = first.baseline(run)
    assert first.outcome(mutant) is None
    first.add(mutate.Outcome(mutant, "killed", "r1 float32 reference: off", 3.0))
    again = mutate.Kept(path, key)  # a later run of the same sources
    assert again.baseline(run) == baseline and runs == [1]
    assert again.outcome(mutant) == mutate.Outcome(mutant, "killed", "r1 float32 reference: off", 3.0)
    changed = mutate.Kept(path, {**key, "sources": {"kernels/fam/k.py": "def"}})  # a source changed: start over
    assert changed.outcome(mutant) is None
    changed.baseline(run)
    mutate.Kept(None, key).baseline(run)  # nothing kept
    assert runs == [1, 1, 1]


class _PlantedScratch:
    """A scratch holding ``k.py`` whose worker records the routes it ran and the source it saw, and answers
    ``(code, last line, timed out)`` for the first of its routes named in ``answers`` (else passes)."""

    def __init__(self, directory: Path, answers: dict):
        directory.mkdir()
        (directory / "k.py").write_text(SOURCE)
        self.dir, self.answers, self.ran, self.seen, self.timeouts = directory, answers, [], [], []

    def worker(self, family, routes, seed, timeout, route_limits=None, launch_limits=None):
        self.ran += routes
        self.seen.append((self.dir / "k.py").read_text())
        self.timeouts.append(timeout)
        return next((self.answers[r] for r in routes if r in self.answers), (0, "4 routes pass", False))

    def cancel(self):  # its worker answers at once: nothing to stop
        pass


class _SlowScratch(_PlantedScratch):
    """A scratch that answers like a :class:`_PlantedScratch` for the routes named in ``answers``, once a worker of
    ``slow_started`` has begun another route; on the others its worker runs until it is cancelled (or 60 s pass:
    then it passes)."""

    def __init__(self, directory: Path, answers: dict, slow_started: threading.Event):
        super().__init__(directory, answers)
        self.stop, self.slow_started = threading.Event(), slow_started

    def worker(self, family, routes, seed, timeout, route_limits=None, launch_limits=None):
        answer = super().worker(family, routes, seed, timeout, route_limits, launch_limits)
        if any(r in self.answers for r in routes):
            self.slow_started.wait(10)  # the slow group runs when this one settles the mutant
            if isinstance(answer, Exception):
                raise answer
            return answer
        self.slow_started.set()
        return (mutate.CANCELLED, "cancelled", False) if self.stop.wait(60) else (0, "passed", False)

    def cancel(self):
        self.stop.set()


def _run(scratches, work, baseline, cap=None) -> tuple[dict, list]:
    """``mutate.run_mutants`` on ``work``: ``({mutant: outcome}, every (mutant, outcome, passed) reported)``."""
    reports = []
    mutate.run_mutants(scratches, "fam", work, baseline, 0, lambda *r: reports.append(r), cap=cap)
    return {m: o for m, o, _ in reports if o is not None}, reports


def test_a_mutant_spread_over_workers_runs_each_route_once_and_fails_when_one_group_fails(tmp_path):
    """``--split-after``: a mutant's groups of routes run over the copies, the bug planted in each copy only while
    that copy runs it; killed when any group fails; a run stopped at the cap is unfinished, not a timeout (which
    counts as killed); each group that passes is reported with the routes passed so far."""
    assert mutate.deal(["a", "b", "c", "d"], {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0}, 2) == [["a", "d"], ["b", "c"]]
    assert mutate.deal(["a"], {"a": 1.0}, 3) == [["a"]]
    mutant = next(m for m in mutate.find_mutants(SOURCE, "k.py") if m.line == 11)
    routes = ["r1", "r2", "r3", "r4"]
    baseline = mutate.Baseline({"k.py": {11: set(routes)}}, dict.fromkeys(routes, 1.0))

    def run(answers: dict, cap=None, copies: int = 2) -> tuple[mutate.Outcome, list, list]:
        scratches = [_PlantedScratch(tmp_path / f"{len(list(tmp_path.iterdir()))}", answers) for _ in range(copies)]
        groups = mutate.deal(routes, baseline.seconds, copies)
        outcomes, reports = _run(scratches, [(mutant, groups)], baseline, cap)
        for scratch in scratches:
            assert set(scratch.seen) <= {mutant.apply(SOURCE)} and (scratch.dir / "k.py").read_text() == SOURCE
        return outcomes[mutant], scratches, reports

    survived, scratches, reports = run({})
    assert survived.status == "survived" and sorted(r for s in scratches for r in s.ran) == routes
    assert [(o, p) for _, o, p in reports] == [(None, ["r1", "r3"]), (survived, routes)] or \
        [(o, p) for _, o, p in reports] == [(None, ["r2", "r4"]), (survived, routes)]
    assert run({"r3": (1, "r3 float32 reference: off", False)})[0].status == "killed"
    # two groups settle it: the first to finish names the outcome, killed either way
    assert run({"r3": (1, "r3 float32 reference: off", False), "r2": (-9, "ran past 5 s", True)})[0].status in \
        ("killed", "timeout")
    assert run({"r2": (-11, "Segmentation fault", False)})[0].status == "crashed"
    assert run({"r2": (mutate.ROUTE_TIMEOUT, "r2: ran past 64 s (a hang?)", False)})[0].status == "timeout"
    assert run({"r2": (-9, "ran past 5 s", True)}, cap=5.0, copies=1)[0].status == "unfinished"
    assert run({"r2": (-9, "ran past 520 s", True)}, cap=1e6, copies=1)[0].status == "timeout"


@pytest.mark.parametrize("verdict, status", [((1, "r1 float32 reference: off", False), "killed"),
                                             ((-11, "Segmentation fault", False), "crashed"),
                                             ((mutate.ROUTE_TIMEOUT, "r1: ran past 64 s (a hang?)", False), "timeout")])
def test_the_first_group_that_settles_a_mutant_stops_the_others(tmp_path, verdict, status):
    """A mutant killed by one group of its routes is settled: the groups still running are cancelled at once (a
    cancelled group counts for nothing), so a killed mutant costs the time of its fastest kill."""
    mutant = next(m for m in mutate.find_mutants(SOURCE, "k.py") if m.line == 11)
    baseline = mutate.Baseline({"k.py": {11: {"r1", "r2"}}}, {"r1": 1.0, "r2": 2.0})
    started = threading.Event()
    copies = [_SlowScratch(tmp_path / name, {"r1": verdict}, started) for name in ("a", "b")]  # r2: until cancelled
    start = time.perf_counter()
    outcomes, _ = _run(copies, [(mutant, [["r1"], ["r2"]])], baseline)
    assert (outcomes[mutant].status, outcomes[mutant].by) == (status, verdict[1])
    (slow,) = [s for s in copies if s.ran == ["r2"]]
    assert slow.stop.is_set() and time.perf_counter() - start < 30
    assert sorted(r for s in copies for r in s.ran) == ["r1", "r2"]
    assert all((s.dir / "k.py").read_text() == SOURCE for s in copies)


def test_a_group_that_raises_stops_the_others_and_no_verdict_is_made(tmp_path):
    """A fork server killed from outside raises: the other groups are cancelled, the error propagates, nothing is
    reported and every copy holds its source again."""
    mutant = next(m for m in mutate.find_mutants(SOURCE, "k.py") if m.line == 11)
    baseline = mutate.Baseline({"k.py": {11: {"r1", "r2"}}}, {"r1": 1.0, "r2": 2.0})
    started = threading.Event()
    copies = [_SlowScratch(tmp_path / name, {"r1": RuntimeError("the fork server exited")}, started)
              for name in ("a", "b")]
    reports = []
    with pytest.raises(RuntimeError, match="the fork server exited"):
        mutate.run_mutants(copies, "fam", [(mutant, [["r1"], ["r2"]])], baseline, 0, lambda *r: reports.append(r))
    (slow,) = [s for s in copies if s.ran == ["r2"]]  # r1 answers once r2 has started
    assert reports == [] and slow.stop.is_set()
    assert all((s.dir / "k.py").read_text() == SOURCE for s in copies)


def test_the_groups_of_every_mutant_share_the_copies_and_a_settled_mutant_starts_no_more(tmp_path):
    """Spread mutants run together: a free copy takes the next group of any mutant (the longest routes first), so
    one slow route does not hold the other copies idle; a mutant killed by its first group never starts the rest."""
    by_line = {}
    for m in mutate.find_mutants(SOURCE, "k.py"):
        by_line.setdefault(m.line, m)
    doomed, other = by_line[11], by_line[12]
    baseline = mutate.Baseline({"k.py": {11: {"a", "b", "c"}, 12: {"x", "y"}}},
                               {"a": 5.0, "b": 1.0, "c": 1.0, "x": 4.0, "y": 3.0})
    scratch = _PlantedScratch(tmp_path / "one", {"a": (1, "a float32 reference: off", False)})
    outcomes, reports = _run([scratch], [(doomed, [["a"], ["b"], ["c"]]), (other, [["x"], ["y"]])], baseline)
    assert scratch.ran == ["a", "x", "y"]  # longest first; b and c never ran
    assert outcomes[doomed].status == "killed" and outcomes[other].status == "survived"
    assert scratch.seen == [doomed.apply(SOURCE), other.apply(SOURCE), other.apply(SOURCE)]
    assert (scratch.dir / "k.py").read_text() == SOURCE


def test_a_kept_unfinished_mutant_keeps_the_routes_it_passed(tmp_path):
    mutant = mutate.find_mutants(SOURCE, "k.py")[0]
    key = {"family": "fam", "sources": {}, "verifier": {}, "routes": ["r1", "r2"], "seed": 0}
    mutate.Kept(tmp_path / "kept.json", key).add(mutate.Outcome(mutant, "unfinished", "stopped"), ["r2"])
    again = mutate.Kept(tmp_path / "kept.json", key)
    assert again.outcome(mutant).status == "unfinished" and again.passed(mutant) == ["r2"]
    again.add(mutate.Outcome(mutant, "unfinished", "stopped"), ["r1"])  # a later sitting: both stay passed
    assert mutate.Kept(tmp_path / "kept.json", key).passed(mutant) == ["r1", "r2"]
    assert mutate.Kept(tmp_path / "other.json", key).passed(mutant) == []


def test_a_cancelled_fork_stops_and_the_server_runs_the_next_request(tmp_path, monkeypatch):
    """The fork server kills the worker it runs on ``Scratch.cancel`` and answers CANCELLED; a cancel that comes
    while it is idle does not cancel the next request."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the server's temporary files: a worker's output file shows it runs
    scratch = mutate.Scratch(REPO_ROOT)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # the segment family's slowest route: minutes under the interpreter, unless cancelled
            running = pool.submit(scratch.worker, "segment", ["segment.triton.max.infer.blocked"], 0, 600.0)
            deadline = time.monotonic() + 120
            while not list(tmp_path.glob("sentinel-mutant-*")) and time.monotonic() < deadline:
                time.sleep(0.2)  # until the server has imported torch and forked the worker
            forked = bool(list(tmp_path.glob("sentinel-mutant-*")))
            start = time.perf_counter()
            scratch.cancel()  # also when the worker never started: the with block then ends at once
            code, last, timed_out = running.result(timeout=60)
        assert forked, "the fork server never started the worker"
        assert (code, timed_out) == (mutate.CANCELLED, False) and time.perf_counter() - start < 30
        scratch.cancel()  # idle: nothing to stop
        time.sleep(0.5)
        code, last, timed_out = scratch.worker("segment", ["no.such.route"], 0, 600.0)
        assert code != mutate.CANCELLED and not timed_out, last
    finally:
        scratch.remove()


def test_a_kernel_launch_past_its_limit_ends_the_worker_as_a_hang():
    """An endless loop inside one kernel launch ends the worker at the launch's limit (seconds), not at its route's
    (minutes for a route of hundreds of launches)."""
    route = "segment.triton.sum.train.ids"
    scratch = mutate.Scratch(REPO_ROOT)
    try:
        with scratch.planted("kernels/segment/triton_segment.py", r"lo, hi = tl\.where\(c > 0, last \+ 1, lo\).*",
                             "tl.where(c > 0, last + 1, lo)", "lo"):  # the search's lower end never moves
            start = time.perf_counter()
            # 15 s: seven times the route's longest launch here (2.1 s, every check and dtype): only the loop gets there
            code, last, timed_out = scratch.worker("segment", [route], 0, 600.0, route_limits={route: 500.0},
                                                   launch_limits={route: 15.0})
        assert (code, timed_out) == (mutate.ROUTE_TIMEOUT, False), last
        assert last == f"{route}: a kernel launch ran past 15 s (a hang?)"
        assert time.perf_counter() - start < 120
    finally:
        scratch.remove()


def test_a_route_past_its_cpu_deadline_stops_the_block():
    with pytest.raises(mutate._RouteTimeout, match="^ran past 0 s$"):
        with mutate._deadline(0.05):
            while True:  # a hang that spins
                try:
                    sum(range(1000))
                except Exception:  # what a check catching errors would do: the deadline still ends the block
                    pass
    start = time.perf_counter()
    with mutate._deadline(0.05):
        time.sleep(0.2)  # wall time, no CPU time: no timeout
    assert time.perf_counter() - start >= 0.2
    with mutate._deadline(None):
        sum(range(1000))
    # a launch's deadline on the user-time timer inside its route's: the inner one ends the spin, both disarmed
    with pytest.raises(mutate._RouteTimeout, match="^a kernel launch ran past 0 s$"):
        with mutate._deadline(60.0):
            with mutate._deadline(0.05, "a kernel launch ran past", signal.ITIMER_VIRTUAL):
                while True:
                    sum(range(1000))
    assert signal.getitimer(signal.ITIMER_PROF) == signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0)


def test_a_scratch_copy_for_this_repository_families_holds_kernels_and_sentinel():
    assert mutate.scratch_packages(registry.family("sinkhorn")) == layout.IMPORT_NAMES


def test_a_worker_refuses_to_run_outside_a_scratch_copy(tmp_path, monkeypatch, capsys):
    """Without a scratch copy named, or with the family's package imported from the working tree, nothing runs."""
    monkeypatch.delenv(mutate.SCRATCH_VARIABLE, raising=False)
    assert mutate.start_in_scratch(None) is None
    assert "refusing to run outside a scratch copy" in capsys.readouterr().out
    (tmp_path / mutate.IMPORT_DIR).mkdir()
    monkeypatch.setenv(mutate.SCRATCH_VARIABLE, str(tmp_path))
    here, cov = mutate.start_in_scratch(None)
    assert (here, cov) == (tmp_path.resolve(), None)
    assert mutate.scratch_family("sinkhorn", here) is None
    assert f"provable_kernels.sinkhorn is {REPO_ROOT / 'kernels' / 'sinkhorn'}" in capsys.readouterr().out


FAMILIES = [f.name for f in registry.families()]


@pytest.mark.slow  # real mutants verified in scratch copies: ~1 min in all
@pytest.mark.parametrize("family", FAMILIES)
def test_seeded_sample_of_real_mutants_is_killed(family, tmp_path):
    """Three seeded mutants of the family's PyTorch backend, in a scratch copy, each killed by the CPU verifier
    (the full measurement, Triton sources included, is `sentinel mutate --record`; see the site)."""
    report, scratch = tmp_path / "mutants.json", tmp_path / "tmp"  # its own temporary directory: others run too
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-m", "kernel_sentinel", "mutate", "--family", family, "--files",
                           f"kernels/{family}/torch_ops.py", "--route", f"{family}.torch.*", "-n", "3", "--seed", "0",
                           "--min-kill", "100", "--jobs", "2", "--json", str(report)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stdout + done.stderr
    (summary,) = json.loads(report.read_text())
    assert summary["sampled"] == 3 and summary["killed"] == 3
    assert all(m["file"] == f"kernels/{family}/torch_ops.py" and m["by"] for m in summary["mutants"])
    assert not list(scratch.glob("sentinel-mutate-*")), "scratch copies left behind"


def test_rescore_refuses_the_options_of_a_run(capsys):
    from kernel_sentinel.cli import main

    for extra in (["--record"], ["--route", "segment.torch.sum"], ["--keep", "kept.json", "--family", "segment"]):
        assert main(["mutate", "--rescore", *extra]) == 2
        assert "usage error: --rescore rewrites the committed records" in capsys.readouterr().err
