"""The ``memory`` check (:mod:`kernel_sentinel.memory`): out-of-bounds accesses and write races of Triton kernels
caught on the CPU.

Toy kernels with a known access pattern check the mechanism (a masked read past the end that ``other`` would hide,
a store past the end, a correct kernel, a launch around the launcher, changed interpreter internals, a changed
guard, an element stored by two programs); planted bugs in the library's own kernels (out-of-bounds mutants the
issue names, and mutants that make two programs store to one element) must fail ``sentinel verify``'s ``memory``
check in a scratch copy, and the unmutated sources must pass it.
"""
from __future__ import annotations

import re

import pytest
import torch
import triton
import triton.language as tl

from provable_kernels import launch
from kernel_sentinel import memory, mutate
from kernel_sentinel.family import REPO_ROOT

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the check runs the Triton interpreter (CPU)")


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, READ_PAST: tl.constexpr, WRITE_PAST: tl.constexpr, BLOCK: tl.constexpr):
    """dst[i] = src[i] for i < n; READ_PAST reads src[n] too (masked back to 0 by ``other``, so no value shows
    it), WRITE_PAST writes dst[n]."""
    i = tl.arange(0, BLOCK)
    v = tl.load(src_ptr + i, mask=i < n + READ_PAST, other=0.0)
    v = tl.where(i < n, v, 0.0)
    tl.store(dst_ptr + i, v, mask=i < n + WRITE_PAST)


def copy(src: torch.Tensor, read_past: int = 0, write_past: int = 0, direct: bool = False) -> torch.Tensor:
    dst = torch.zeros_like(src)
    meta = dict(READ_PAST=read_past, WRITE_PAST=write_past, BLOCK=triton.next_power_of_2(src.numel() + 1))
    if direct:  # around the launcher
        copy_kernel[(1,)](src, dst, src.numel(), **meta)
    else:
        launch.launcher(copy_kernel)[(1,)](src, dst, src.numel(), **meta)
    return dst


def test_a_correct_kernel_passes_and_its_results_come_back():
    src = torch.arange(5.0)
    with memory.watching() as watch:
        dst = copy(src)
    assert torch.equal(dst, src)
    assert watch.problems == [] and watch.launches == 1 and watch.accesses == 2


def test_a_masked_read_past_the_end_is_caught_though_other_hides_its_value():
    src = torch.arange(5.0)
    with memory.watching() as watch:
        dst = copy(src, read_past=1)
    assert torch.equal(dst, src)  # nothing in the result shows the read
    (problem,) = watch.problems
    assert problem.startswith("copy_kernel program (0, 0, 0): load of 4 bytes, 1 lanes outside every tensor argument")
    assert problem.endswith("first 4 bytes (1 elements) past the end of argument src_ptr ((5,) float32)")


def test_a_store_past_the_end_is_caught_and_kept_from_memory():
    src = torch.arange(5.0)
    with memory.watching() as watch:
        dst = copy(src, write_past=1)
    (problem,) = watch.problems  # the lane was switched off: the guard after dst holds its canaries
    assert "store of 4 bytes, 1 lanes outside" in problem and "past the end of argument dst_ptr" in problem


def test_a_launch_around_the_launcher_is_reported():
    with memory.watching() as watch:
        copy(torch.arange(5.0), direct=True)
    assert watch.problems and all("outside a launch through provable_kernels.launch.Launcher" in p
                                  for p in watch.problems)


def test_changed_interpreter_internals_fail_loudly(monkeypatch):
    from triton.runtime import interpreter

    class Bare:  # an interpreter module that reaches memory some other way
        pass

    monkeypatch.setattr(interpreter, "_interpreter", Bare())
    with pytest.raises(memory.Unavailable, match="lacks load, store, atomic_rmw, atomic_cas"):
        with memory.watching():
            pass


def test_a_launch_without_checked_accesses_fails():
    """A Triton whose interpreter no longer calls the wrapped functions: the launch makes no checked access."""
    from triton.runtime import interpreter

    with memory.watching() as watch:
        interpreter._interpreter = interpreter._interpreter._inner  # watching() puts it back
        copy(torch.arange(5.0))
    assert watch.problems == ["copy_kernel: the launch made no checked load or store (the Triton interpreter "
                              "reaches memory another way: its internals changed)"]


def test_a_changed_guard_is_a_problem():
    x = torch.arange(6, dtype=torch.int32)
    zone = memory._Redzone.around(x)
    assert zone.finish("x") == []
    raw = memory._bytes(zone.padded.untyped_storage())
    raw[zone.guard + zone.size + 3] = 7
    (problem,) = zone.finish("x")
    assert problem.startswith("1 guard bytes around argument x changed, the first 3 bytes past the storage")


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
        with memory.watching() as watch:
            launch.launcher(last_kernel)[(3,)](src, dst, 4, SHARED=shared, BLOCK=4)
        assert torch.equal(dst, src if shared else torch.tensor([0.0, 1, 2, 0]))
        if not shared:
            assert watch.problems == []
            continue
        (problem,) = watch.problems
        assert problem == ("last_kernel: 1 elements stored by more than one program (a write race on a GPU); the "
                           "first, byte 12 of argument dst_ptr ((4,) float32), by programs (0, 0, 0) and (1, 0, 0)")


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
        with memory.watching() as watch:
            launch.launcher(count_kernel)[(3,)](dst, PLAIN=plain)
        if not plain:
            assert watch.problems == [] and dst.item() == 3.0
            continue
        (problem,) = watch.problems
        assert problem.startswith("count_kernel: 1 elements stored by more than one program (a write race on a GPU); "
                                  "the first, byte 0 of argument dst_ptr ((1,) float32), by programs (0, 0, 0) and "
                                  "(1, 0, 0)")


def test_views_of_one_storage_share_one_copy():
    """Two arguments on one storage (an in-place kernel) see each other's writes, as without the check."""
    buf = torch.arange(10.0)
    with memory.watching() as watch:
        launch.launcher(copy_kernel)[(1,)](buf[:5], buf[5:], 5, READ_PAST=0, WRITE_PAST=0, BLOCK=8)
    assert watch.problems == []
    assert torch.equal(buf, torch.cat([torch.arange(5.0), torch.arange(5.0)]))


# ------------------------------------------------------------------------------------------ planted bugs

# (family, file, pattern of the line, the text replaced, its replacement, routes): each must fail ``memory``
# (:func:`kernel_sentinel.mutate.plant` says clearly when the line is no longer there).
PLANTED = {
    "segment backward reads ids one row past the tile's last row": (
        "segment", "kernels/segment/triton_segment.py", r"tl\.load\(ids_ptr \+ rows, mask=rows <= last_row\b",
        "rows <= last_row", "rows <= last_row + 1", ["segment.triton.sum.train.ids"]),
    "segment's own ids check (device mode) reading its rows without their mask": (
        "segment", "kernels/segment/triton_segment.py", r"tl\.load\(ids_ptr \+ rows, mask=live, other=0\) != seg",
        ", mask=live, other=0", "", ["segment.triton.sum.train.ids"]),
    "Sinkhorn's row mask b < B as b <= B (a matrix past the end, rows at n <= 4)": (
        "sinkhorn", "kernels/sinkhorn/triton_sinkhorn.py", r"\n    mask = b < B\n", "b < B", "b <= B",
        ["sinkhorn.triton.log.train"]),
    "semi-CRF forward reads proj_start one row past T (the last sequence of the tiny case runs the full T)": (
        "semicrf", "kernels/semicrf/triton_forward.py", r"ps_t = tl\.load\(ps \+ row \* C \+ cols, mask=cmask & "
        r"\(row >= 0\) & \(row < T\)", "(row < T)", "(row <= T)", ["semicrf.triton.log.infer"]),
    "semi-CRF Viterbi stores its best previous labels without the label mask (the padded lane of the last row of the "
    "last sequence, C = 3 in the tiny case)": (
        "semicrf", "kernels/semicrf/triton_forward.py", r"tl\.store\(bp_prev \+ t \* C \+ cols, tl\.argmax\(paths, 0, "
        r"tie_break_left=True\)\.to\(tl\.int32\), mask=cmask\)", ", mask=cmask", "", ["semicrf.triton.viterbi"]),
    "Sinkhorn's tile store mask b < B as b <= B (a matrix written past the end)": (
        "sinkhorn", "kernels/sinkhorn/triton_sinkhorn.py", r"mask=\(b < B\) & \(i < N\) & \(j < N\)\)\n",
        "b < B", "b <= B", ["sinkhorn.triton.prob.train"]),
}


# (family, file, pattern, old, new, routes): two programs storing to one element, each must fail ``memory``
PLANTED_RACES = {
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
    "segment writes the ids form's bounds from every column block, not only the first (equal values: only the "
    "one-writer rule sees it)": (
        "segment", "kernels/segment/triton_segment.py", r"writes = \(sg < S\) & _block\(tl\.program_id\(1\) == 0, sg\)",
        "writes = (sg < S) & _block(tl.program_id(1) == 0, sg)", "writes = (sg < S)",
        ["segment.triton.sum.infer.one_block"]),
}


@pytest.fixture(scope="module")
def scratch():
    copy = mutate.Scratch(REPO_ROOT)
    yield copy
    copy.remove()


def test_the_unmutated_sources_pass_memory(scratch):
    for family in sorted({family for family, *_ in PLANTED.values()}):
        routes = sorted({r for f, *_, rs in PLANTED.values() if f == family for r in rs})
        code, last, _ = scratch.worker(family, routes, seed=0, timeout=600, checks=["memory"])
        assert code == 0, last


OUT_OF_BOUNDS = r"\w+ program \(\d+, \d+, \d+\): (load|store) of \d+ bytes, \d+ lanes outside every tensor argument"
RACE = r"\w+: \d+ elements stored by more than one program"


@pytest.mark.parametrize("name, finding", [(name, OUT_OF_BOUNDS) for name in PLANTED] +
                         [(name, RACE) for name in PLANTED_RACES])
def test_planted_bug_fails_memory(scratch, name, finding):
    family, file, pattern, old, new, routes = {**PLANTED, **PLANTED_RACES}[name]
    with scratch.planted(file, pattern, old, new):
        code, last, _ = scratch.worker(family, routes, seed=0, timeout=600, checks=["memory"])
    assert code == 1, last
    assert re.match(rf"{re.escape(routes[0])} \w+ memory: {finding}", last), last
