"""The ``races`` check (:mod:`kernel_sentinel.races`): races between the programs of a Triton launch caught on the
CPU.

Toy kernels with a known protocol check the mechanism: an element stored by two programs, atomics sharing an
element (and a plain store among them), a cross-program reduction with and without ``tl.atomic_add``, a publish
protocol (a partial written, then its flag released; the last program acquires the flags, then reads the partials)
kept, with its wait removed, and with a partial stored after its flag; two declared protocols, each needing its own
flag; a wait that no order satisfies (a deadlock).
Planted races in the library's own kernels (the ``_wait_published`` mutant that survived ``sentinel mutate``, and
the write races the one-writer rule was made for) must fail ``sentinel verify``'s ``races`` check in a scratch
copy, and the unmutated sources must pass it.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import triton
import triton.language as tl

from provable_kernels import launch
from kernel_sentinel import memory, races, registry, rows

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the check runs the Triton interpreter (CPU)")


def findings(run, schedule=None, guards={}):
    """Run ``run()`` with every access recorded (programs in ``schedule``, else program order): the conflicts
    found in its launches (``guards``: declared publish protocols, data argument: flag argument)."""
    with memory.recording(schedule) as launches:
        run()
    assert launches, "no interpreted launch was recorded"
    return [c for one in launches for c in races.conflicts(one, guards)]


@triton.jit
def last_kernel(src_ptr, dst_ptr, n, SHARED: tl.constexpr, BLOCK: tl.constexpr):
    """Program p writes dst[p] = src[p]; with SHARED every program also writes dst[n - 1] = src[n - 1] (the same
    value, so the interpreter's result is right: only the second writer shows)."""
    p = tl.program_id(0)
    tl.store(dst_ptr + p, tl.load(src_ptr + p))
    i = tl.arange(0, BLOCK)
    tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i == n - 1), mask=(i == n - 1) & SHARED)


def test_an_element_stored_by_two_programs_is_a_race():
    src = torch.arange(4.0)
    for shared in (False, True):
        dst = torch.zeros(4)
        found = findings(lambda: launch.launcher(last_kernel)[(3,)](src, dst, 4, SHARED=shared, BLOCK=4))
        assert torch.equal(dst, src if shared else torch.tensor([0.0, 1, 2, 0]))
        if not shared:
            assert found == []
            continue
        assert found == ["last_kernel: store by program (0, 0, 0) and store by program (1, 0, 0) of argument dst_ptr "
                         "((4,) float32) at byte 12, unordered (no release and acquire between them): a race on a "
                         "GPU"]


@triton.jit
def count_kernel(dst_ptr, PLAIN: tl.constexpr):
    """Every program adds 1 to dst[0] atomically; with PLAIN program 0 also stores 0 there with a plain store."""
    tl.atomic_add(dst_ptr, 1.0)
    if PLAIN:
        if tl.program_id(0) == 0:
            tl.store(dst_ptr, 0.0)


def test_atomics_may_share_an_element_a_plain_store_among_them_may_not():
    for plain in (False, True):
        dst = torch.zeros(1)
        found = findings(lambda: launch.launcher(count_kernel)[(3,)](dst, PLAIN=plain))
        if not plain:
            assert found == [] and dst.item() == 3.0
            continue
        assert found == ["count_kernel: store by program (0, 0, 0) and atomic_rmw by program (1, 0, 0) of argument "
                         "dst_ptr ((1,) float32) at byte 0, unordered (no release and acquire between them): a race "
                         "on a GPU"]


@triton.jit
def sum_kernel(x_ptr, total_ptr, n, ATOMIC: tl.constexpr, BLOCK: tl.constexpr):
    """total += the sum of program p's block of x: with ``tl.atomic_add`` (ATOMIC), else a load, an add and a
    store (the planted race: the interpreter, one program after another, still gives the right sum)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    part = tl.sum(tl.load(x_ptr + i, mask=i < n, other=0.0), axis=0)
    if ATOMIC:
        tl.atomic_add(total_ptr, part)
    else:
        tl.store(total_ptr, tl.load(total_ptr) + part)


def test_a_cross_program_reduction_without_its_atomic_add_is_a_race():
    x = torch.arange(10.0)
    for atomic in (True, False):
        total = torch.zeros(1)
        found = findings(lambda: launch.launcher(sum_kernel)[(3,)](x, total, 10, ATOMIC=atomic, BLOCK=4))
        assert total.item() == 45.0  # right in program order either way
        if atomic:
            assert found == []
            continue
        assert found[0] == ("sum_kernel: store by program (0, 0, 0) and load by program (1, 0, 0) of argument "
                            "total_ptr ((1,) float32) at byte 0, unordered (no release and acquire between them): a "
                            "race on a GPU")


@triton.jit
def publish_kernel(x_ptr, partial_ptr, flag_ptr, out_ptr, n, WAIT: tl.constexpr, LATE: tl.constexpr,
                   BLOCK: tl.constexpr):
    """Programs 0 .. n - 2 each write partial[p] = 2 x[p] and release flag[p]; the last program acquires every
    flag (WAIT: polling until all are set), then writes out = the sum of the partials. LATE: program 0 stores its
    partial again after releasing its flag."""
    p = tl.program_id(0)
    if p < n - 1:
        tl.store(partial_ptr + p, 2 * tl.load(x_ptr + p))
        tl.atomic_xchg(flag_ptr + p, 1, sem="release")
        if LATE:
            if p == 0:
                tl.store(partial_ptr + p, 2 * tl.load(x_ptr + p))
    else:
        i = tl.arange(0, BLOCK)
        live = i < n - 1
        seen = tl.atomic_or(flag_ptr + i, 0, mask=live, sem="acquire")
        if WAIT:
            while tl.sum(tl.where(live, seen, 1), axis=0) < BLOCK:
                seen = tl.atomic_or(flag_ptr + i, 0, mask=live, sem="acquire")
        tl.store(out_ptr, tl.sum(tl.load(partial_ptr + i, mask=live, other=0.0), axis=0))


def published(wait: bool = True, late: bool = False):
    """The launch of :func:`publish_kernel` on 4 programs; returns (run, out)."""
    x, out = torch.arange(1.0, 4.0), torch.zeros(1)

    def run():
        partial, flag = torch.zeros(3), torch.zeros(3, dtype=torch.int32)
        launch.launcher(publish_kernel)[(4,)](x, partial, flag, out, 4, WAIT=wait, LATE=late, BLOCK=4)

    return run, out


def test_a_publish_protocol_orders_the_reads_in_every_schedule():
    for schedule in (None, races.Schedule("reversed"), races.Schedule("shuffled 1", seed=3)):
        run, out = published()
        assert findings(run, schedule) == []
        assert out.item() == 12.0


def test_a_wait_removed_passes_in_program_order_and_races_in_reversed_order():
    """The `_wait_published` mutant's toy: program order happens to publish every flag before the last program
    reads it; in reversed order it reads the partials first."""
    run, out = published(wait=False)
    assert findings(run) == [] and out.item() == 12.0
    run, out = published(wait=False)
    found = findings(run, races.Schedule("reversed"))
    assert out.item() == 0.0
    assert ("publish_kernel: load by program (3, 0, 0) and store by program (2, 0, 0) of argument partial_ptr ((3,) "
            "float32) at byte 8, unordered") in found[0]


def test_a_declared_protocol_holds_only_for_the_flag_that_guards_the_reads():
    """PUBLISHES: the partials are read after acquiring flag_ptr, so a protocol naming flag_ptr holds in every
    schedule; one naming another argument (x_ptr: read, never released) fails the cross-program reads it does
    not order, though the kernel has no race."""
    for schedule in (None, races.Schedule("reversed")):
        run, _ = published()
        assert findings(run, schedule, {"partial_ptr": "flag_ptr"}) == []
    run, _ = published()
    assert findings(run, guards={"partial_ptr": "x_ptr"}) == [
        "publish_kernel: program (3, 0, 0) reads argument partial_ptr ((3,) float32) at byte 0, written by program "
        "(0, 0, 0), with no acquire of x_ptr ordering the read after the write: the declared publish protocol "
        "(PUBLISHES) does not guard it"]


@triton.jit
def _acquire_all(flag_ptr, i, live, BLOCK: tl.constexpr):
    seen = tl.atomic_or(flag_ptr + i, 0, mask=live, sem="acquire")
    while tl.sum(tl.where(live, seen, 1), axis=0) < BLOCK:
        seen = tl.atomic_or(flag_ptr + i, 0, mask=live, sem="acquire")


@triton.jit
def two_flags_kernel(x_ptr, a_ptr, b_ptr, fa_ptr, fb_ptr, out_ptr, n, ACQUIRE_B: tl.constexpr, BLOCK: tl.constexpr):
    """Programs 0 .. n - 2 write a[p] = 2 x[p] and b[p] = 3 x[p], then release fa[p] and fb[p]; the last program
    acquires every flag of fa (and with ACQUIRE_B of fb), then writes out = the sum of a and b. Without ACQUIRE_B
    the kernel has no race (both writes come before the release of fa), but b's reads are not ordered through fb."""
    p = tl.program_id(0)
    if p < n - 1:
        v = tl.load(x_ptr + p)
        tl.store(a_ptr + p, 2 * v)
        tl.store(b_ptr + p, 3 * v)
        tl.atomic_xchg(fa_ptr + p, 1, sem="release")
        tl.atomic_xchg(fb_ptr + p, 1, sem="release")
    else:
        i = tl.arange(0, BLOCK)
        live = i < n - 1
        _acquire_all(fa_ptr, i, live, BLOCK)
        if ACQUIRE_B:
            _acquire_all(fb_ptr, i, live, BLOCK)
        a = tl.load(a_ptr + i, mask=live, other=0.0)
        b = tl.load(b_ptr + i, mask=live, other=0.0)
        tl.store(out_ptr, tl.sum(a + b, axis=0))


def test_two_declared_protocols_each_need_their_own_flag():
    """With two declarations (a guarded by fa, b by fb) an acquire of fa orders a's reads only: b's reads, ordered
    by fa alone, fail fb's protocol; acquiring fb as well satisfies both, in every schedule."""
    x, guards = torch.arange(1.0, 4.0), {"a_ptr": "fa_ptr", "b_ptr": "fb_ptr"}

    def run(acquire_b):
        out = torch.zeros(1)
        a, b = torch.zeros(3), torch.zeros(3)
        fa, fb = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
        launch.launcher(two_flags_kernel)[(4,)](x, a, b, fa, fb, out, 4, ACQUIRE_B=acquire_b, BLOCK=4)
        assert out.item() == 30.0

    for schedule in (None, races.Schedule("reversed")):
        assert findings(lambda: run(True), schedule, guards) == []
    assert findings(lambda: run(False)) == []  # no race: fa's release follows both writes
    assert findings(lambda: run(False), guards=guards) == [
        "two_flags_kernel: program (3, 0, 0) reads argument b_ptr ((3,) float32) at byte 0, written by program "
        "(0, 0, 0), with no acquire of fb_ptr ordering the read after the write: the declared publish protocol "
        "(PUBLISHES) does not guard it"]


def test_a_partial_stored_after_its_flag_is_a_race():
    run, _ = published(late=True)
    found = findings(run)
    assert found == ["publish_kernel: store by program (0, 0, 0) and load by program (3, 0, 0) of argument "
                     "partial_ptr ((3,) float32) at byte 0, unordered (no release and acquire between them): a race "
                     "on a GPU"]


@triton.jit
def cycle_kernel(flag_ptr, POLLS: tl.constexpr):
    """Programs 0 and 1 each wait (at most POLLS polls) for the other's flag, then set their own."""
    p = tl.program_id(0)
    seen = tl.atomic_or(flag_ptr + 1 - p, 0, sem="acquire")
    polls = 0
    while (seen == 0) & (polls < POLLS):
        seen = tl.atomic_or(flag_ptr + 1 - p, 0, sem="acquire")
        polls += 1
    tl.atomic_xchg(flag_ptr + p, 1, sem="release")


def test_a_wait_no_order_satisfies_is_a_deadlock_not_a_hang():
    flag = torch.zeros(2, dtype=torch.int32)
    launch.launcher(cycle_kernel)[(2,)](flag, POLLS=3)  # program order: program 0 gives up after its polls
    with pytest.raises(Exception) as raised:
        findings(lambda: launch.launcher(cycle_kernel)[(2,)](torch.zeros(2, dtype=torch.int32), POLLS=10 ** 9),
                 races.Schedule("reversed"))
    deadlock = raised.value.__cause__
    assert isinstance(deadlock, races.Deadlock), raised.value
    assert str(deadlock) == ("cycle_kernel in reversed order: program (1, 0, 0) waits forever, polling argument "
                             "flag_ptr ((2,) int32) at byte 0 (atomic_rmw); program (0, 0, 0) waits forever, "
                             "polling argument flag_ptr ((2,) int32) at byte 4 (atomic_rmw)")


@triton.jit
def plain_spin_kernel(flag_ptr):
    """Program 0 sets the flag with a plain store; program 1 spins on it with plain loads."""
    if tl.program_id(0) == 0:
        tl.store(flag_ptr, 1)
    else:
        while tl.load(flag_ptr) == 0:
            pass


def test_a_spin_on_plain_loads_runs_into_the_access_limit(monkeypatch):
    monkeypatch.setattr(races, "STEP_LIMIT", 50)
    findings(lambda: launch.launcher(plain_spin_kernel)[(2,)](torch.zeros(1, dtype=torch.int32)))  # program order
    with pytest.raises(Exception) as raised:
        findings(lambda: launch.launcher(plain_spin_kernel)[(2,)](torch.zeros(1, dtype=torch.int32)),
                 races.Schedule("reversed"))
    assert str(raised.value.__cause__) == ("plain_spin_kernel in reversed order: program (1, 0, 0) made more than 50 "
                                           "accesses without finishing (a spin wait never satisfied?), the last on "
                                           "argument flag_ptr ((1,) int32) at byte 0 (load)")


def test_a_launch_too_large_to_check_says_so(monkeypatch):
    monkeypatch.setattr(races, "MAX_SHADOW", 4)
    found = findings(lambda: launch.launcher(count_kernel)[(3,)](torch.zeros(2), PLAIN=False))
    assert found == ["count_kernel: 3 programs accessing 4 bytes, too many to check for races (programs x bytes at "
                     "most 4): the route's tiny case should be smaller"]


def test_a_schedule_name_is_checked():
    with pytest.raises(ValueError, match="name: 'sideways' is no schedule"):
        races.Schedule("sideways")


def test_one_run_of_the_bad_inputs_serves_the_bad_input_memory_and_races_checks(monkeypatch):
    """In one row each bad input runs in device mode once (two allocation poisons) for the bad_input, memory and
    races checks: after bad_input the other two run none of their own, memory counts what the guard saw of those
    runs, and races checks the launches they recorded."""
    family = registry.family("segment")
    run = rows.RouteRun(family, "segment.triton.sum.train.ids", rows.Options(device=torch.device("cpu"), quick=True),
                        torch.float32)
    assert rows.check_bad_input(run, "").passed
    shared = run.bad_input_runs()
    assert len(shared.launches) == len(shared.outcomes) == len(rows.bad_inputs_of(family, run.route_id))
    assert any(launch.trace for launches in shared.launches for launch in launches)
    assert shared.watch is not None and shared.watch.launches and not shared.watch.problems
    monkeypatch.setattr(rows, "_device_mode_run", lambda *args: pytest.fail("the bad inputs ran again"))
    seen = []
    monkeypatch.setattr(races, "conflicts", lambda launch, guards: seen.append(launch) or [])
    checked = rows.check_memory(run, "")
    assert checked.passed and f"and {len(shared.outcomes)} bad inputs in device mode checked" in checked.detail
    assert rows.check_races(run, "").passed
    assert all(any(launch is s for s in seen) for launches in shared.launches for launch in launches)


# ------------------------------------------------------------------------------------------ planted bugs

# (family, file, pattern of the line, the text replaced, its replacement, routes): each must fail ``races``
PLANTED = {
    "segment's _wait_published advancing without waiting (the mutant that survived sentinel mutate)": (
        "segment", "kernels/segment/triton_segment.py", r"t = tl\.where\(tl\.max\(\(live & \(seen != epoch\)\)\.to\(tl\.int32\), axis=0\) == 0, t \+ LANES, t\)",
        "t = tl.where(tl.max((live & (seen != epoch)).to(tl.int32), axis=0) == 0, t + LANES, t)", "t = t + LANES",
        ["segment.triton.sum.infer.blocked"]),
    "segment writes every segment's start into the offsets, not only segment 0's (sorted ids: each start is also "
    "the previous segment's end, which another program writes)": (
        "segment", "kernels/segment/triton_segment.py",
        r"tl\.store\(offsets_ptr \+ sg, ag, mask=writes & \(sg == 0\)\)",
        "mask=writes & (sg == 0)", "mask=writes", ["segment.triton.sum.train.ids"]),
    "segment's last-chunk test clamps a found id to S + 1 (unsorted ids: a segment written by its short and its "
    "long program)": (
        "segment", "kernels/segment/triton_segment.py",
        r"found = tl\.minimum\(tl\.maximum\(found, 0\), tl\.maximum\(S - 1, 0\)\)", "S - 1", "S + 1",
        ["segment.triton.sum.train.ids"]),
    "segment writes the ids form's bounds from every column block, not only the first (equal values: only a "
    "write race shows it)": (
        "segment", "kernels/segment/triton_segment.py", r"writes = \(sg < S\) & _block\(tl\.program_id\(1\) == 0, sg\)",
        "writes = (sg < S) & _block(tl.program_id(1) == 0, sg)", "writes = (sg < S)",
        ["segment.triton.sum.infer.one_block"]),
}


@pytest.mark.slow  # the races check of these routes, unmutated: CI's README verify runs it on every route
def test_the_unmutated_sources_pass_races(scratch):
    routes = sorted({r for *_, rs in PLANTED.values() for r in rs})
    code, last, _ = scratch.worker("segment", routes, seed=0, timeout=600, checks=["races"])
    assert code == 0, last


@pytest.mark.parametrize("name", PLANTED)
def test_planted_race_fails_races(scratch, name):
    family, file, pattern, old, new, routes = PLANTED[name]
    with scratch.planted(file, pattern, old, new):
        code, last, _ = scratch.worker(family, routes, seed=0, timeout=600, checks=["races"])
    assert code == 1, last
    assert re.match(rf"{re.escape(routes[0])} \w+ races: ", last), last


def test_segment_declares_its_publish_protocol_and_a_wrong_guard_fails_it():
    """segment's PUBLISHES (ws_ptr guarded by flags_ptr) holds on a several-block route, which runs the protocol
    (long chunks publish their partials); naming another argument as the flag fails it there, and naming an
    argument the kernel lacks is reported, not a crash."""
    family = registry.family("segment")
    assert [(p.kernel, p.data, p.flag) for p in family.publishes] == [
        ("segment_chunk_kernel", "ws_ptr", "flags_ptr")]
    route = "segment.triton.sum.infer.blocked"
    case = family.make_case(route, size="tiny", dtype=torch.float32, device=torch.device("cpu"), seed=0)
    verdict = races.verdict(family, case, torch.device("cpu"))
    assert verdict.problems == () and "segment_chunk_kernel reads ws_ptr after acquiring flags_ptr" in verdict.summary
    for flag, expected in (("offsets_ptr", "with no acquire of offsets_ptr ordering the read after the write"),
                           ("no_such_ptr", "PUBLISHES names argument(s) no_such_ptr, which this launch")):
        wrong = dataclasses.replace(family, publishes=[dataclasses.replace(family.publishes[0], flag=flag)])
        problems = races.verdict(wrong, case, torch.device("cpu")).problems
        assert problems and all(expected in p for p in problems), problems
