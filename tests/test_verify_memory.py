"""The guard and the ``memory`` check (:mod:`kernel_sentinel.memory`): out-of-bounds accesses of Triton kernels
caught on the CPU before they are made.

Toy kernels with a known access pattern check the mechanism (a masked read past the end that ``other`` would hide,
a store past the end, a correct kernel, a launch around the launcher, changed interpreter internals, a changed
guard, the guard outside the check); a toy family with an off-by-one store mask must fail ``sentinel verify`` with
rc 1 and a ``memory`` failure, not take it down; planted bugs in the library's own kernels (out-of-bounds mutants
the issue names) must fail ``sentinel verify``'s ``memory`` check in a scratch copy, and the unmutated sources must
pass it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from provable_kernels import launch
from kernel_sentinel import memory
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
        copy(src, write_past=1)
    (problem,) = watch.problems  # the lane was switched off: the guard after dst holds its canaries
    assert "store of 4 bytes, 1 lanes outside" in problem and "past the end of argument dst_ptr" in problem


def test_a_store_into_an_empty_argument_names_it():
    with memory.watching() as watch:
        launch.launcher(copy_kernel)[(1,)](torch.arange(5.0), torch.empty(0), 5, READ_PAST=0, WRITE_PAST=0, BLOCK=8)
    (problem,) = watch.problems
    assert problem.startswith("copy_kernel program (0, 0, 0): store of 4 bytes, 5 lanes outside every tensor argument "
                              "(empty: dst_ptr ((0,) float32)); first ")


def test_a_launch_around_the_launcher_is_checked_too():
    with memory.watching() as watch:
        copy(torch.arange(5.0), write_past=1, direct=True)
    (problem,) = watch.problems
    assert "store of 4 bytes, 1 lanes outside" in problem and "past the end of argument dst_ptr" in problem


@pytest.mark.parametrize("direct", [False, True])
def test_outside_the_check_an_out_of_bounds_store_raises_and_writes_nothing(direct):
    """The guard in every other check: the lane past the end is masked off (the element after the view keeps its
    value) and the launch raises, naming the kernel, the program, the argument and the offset."""
    memory.install()
    src, buf = torch.arange(5.0), torch.full((6,), -1.0)
    dst = buf[:5]
    meta = dict(READ_PAST=0, WRITE_PAST=1, BLOCK=8)
    with pytest.raises(memory.OutOfBounds) as raised:
        if direct:
            copy_kernel[(1,)](src, dst, 5, **meta)
        else:
            launch.launcher(copy_kernel)[(1,)](src, dst, 5, **meta)
    assert str(raised.value).startswith("copy_kernel program (0, 0, 0): store of 4 bytes, 1 lanes outside every "
                                        "tensor argument; first 4 bytes (1 elements) past the end of argument "
                                        "dst_ptr ((5,) float32) (masked off: nothing was read or written there")
    assert "the memory check names them" in str(raised.value)
    assert buf[5].item() == -1.0 and torch.equal(dst, src)
    launch.launcher(copy_kernel)[(1,)](src, buf[:5], 5, READ_PAST=0, WRITE_PAST=0, BLOCK=8)  # a correct one runs


def test_changed_interpreter_internals_fail_loudly(monkeypatch):
    from triton.runtime import interpreter

    class Bare:  # an interpreter module that reaches memory some other way
        pass

    monkeypatch.setattr(interpreter, "_interpreter", Bare())
    with pytest.raises(memory.Unavailable, match="lacks load, store, atomic_rmw, atomic_cas"):
        with memory.watching():
            pass


def test_a_launch_without_checked_accesses_fails(monkeypatch):
    """A Triton whose interpreter no longer calls the wrapped functions: the launch makes no checked access."""
    from triton.runtime import interpreter

    memory.install()
    with memory.watching() as watch:
        monkeypatch.setattr(interpreter, "_interpreter", interpreter._interpreter._inner)
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


@pytest.mark.slow  # the memory check of these routes, unmutated: CI's README verify runs it on every route
def test_the_unmutated_sources_pass_memory(scratch):
    for family in sorted({family for family, *_ in PLANTED.values()}):
        routes = sorted({r for f, *_, rs in PLANTED.values() if f == family for r in rs})
        code, last, _ = scratch.worker(family, routes, seed=0, timeout=600, checks=["memory"])
        assert code == 0, last


OUT_OF_BOUNDS = r"\w+ program \(\d+, \d+, \d+\): (load|store) of \d+ bytes, \d+ lanes outside every tensor argument"


@pytest.mark.parametrize("name", PLANTED)
def test_planted_bug_fails_memory(scratch, name):
    family, file, pattern, old, new, routes = PLANTED[name]
    with scratch.planted(file, pattern, old, new):
        code, last, _ = scratch.worker(family, routes, seed=0, timeout=600, checks=["memory"])
    assert code == 1, last
    assert re.match(rf"{re.escape(routes[0])} \w+ memory: {OUT_OF_BOUNDS}", last), last


# ------------------------------------------------------------------------- a kernel author's off-by-one store

L2_FAMILY = '''\
import torch
import triton
import triton.language as tl

from provable_kernels import validate
from provable_kernels.dispatch import Route, Tree


@triton.jit
def l2_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    """Row ``program_id(0)`` of x (rows, cols) divided by its L2 norm."""
    offs = tl.arange(0, BLOCK)
    base = tl.program_id(0) * cols
    x = tl.load(x_ptr + base + offs, mask=offs < cols, other=0.0)
    tl.store(y_ptr + base + offs, x / tl.sqrt(tl.sum(x * x, axis=0)), mask=offs STORE_MASK cols)


def l2_triton(x):
    """One program per row."""
    x = x.contiguous()
    y = torch.empty_like(x)
    l2_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1] + 1))
    return {"value": y}


TREE = Tree("l2fam", Route("l2fam.triton.infer", l2_triton))


def l2_normalize(x):
    """Each row of ``x`` (rows, cols) divided by its L2 norm."""
    validate.tensor("x", x, ndim=2, dtypes=validate.FLOAT_DTYPES)
    return TREE.dispatch(x)["value"]


ENTRY_POINTS = {"l2_normalize": l2_normalize}
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}
SIZES = {"small": dict(cols=5), "tiny": dict(cols=3)}


def case(route_id, p, gen, device):
    return "l2_normalize", {"x": torch.rand(4, p.cols, generator=gen, dtype=torch.float64) + 0.5}, {}


def reference(kw, case):
    return {"value": kw["x"] / kw["x"].norm(dim=-1, keepdim=True)}


def example(pick):
    return dict(cols=pick(range(1, 9)))


ORACLES = (("float64 division", "tiny", reference),)
AGREEMENTS = (("float64 division", "l2fam.*", reference),)
ADVERSARIAL = (("huge", {"x": lambda x: x * 1e30}, None, {"errors_ok": True}),)
STANDARD_BAD_INPUTS = dict(tensors=("x",))
INVARIANTS = ("tests/test_verify_memory.py::test_an_off_by_one_store_mask_fails_verify_and_does_not_take_it_down",)
BATCH_ITEMS = (("a row", "l2fam.*", {"x": 0, "value": 0}),)
'''


def verify_l2(tmp_path, store_mask: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``sentinel verify --quick`` of the toy L2 family with ``store_mask`` in its kernel's store mask."""
    plugin = tmp_path / "plugins" / "l2fam"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text('"""Toy family: row-wise L2 normalisation (Triton)."""\n')
    (plugin / "family.py").write_text(L2_FAMILY.replace("STORE_MASK", store_mask))
    report = tmp_path / "report.json"
    env = {**os.environ, "SENTINEL_FAMILY_PATH": str(tmp_path / "plugins"), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "kernel_sentinel", "verify", "--family", "l2fam", "--device", "cpu",
                           "--dtype", "float32", "--quick", "--jobs", "1", "--json", str(report)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert report.is_file(), done.stdout + done.stderr
    (row,) = json.loads(report.read_text())["routes"]
    return done, {c["name"]: c for c in row["checks"]}


def test_an_off_by_one_store_mask_fails_verify_and_does_not_take_it_down(tmp_path):
    """The issue's planted bug (``offs <= cols``): rc 1 with the report written, a ``memory`` failure naming the
    program, the argument and the offset, and each other check that ran the kernel failed pointing at it; the
    same family with ``offs < cols`` passes those checks."""
    done, checks = verify_l2(tmp_path / "good", "<")
    ran_the_kernel = ("route", "reference", "exact", "memory", "inputs", "determinism", "layouts")
    assert all(checks[name]["status"] == "pass" for name in ran_the_kernel), done.stdout + done.stderr

    done, checks = verify_l2(tmp_path / "bad", "<=")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Fatal" not in done.stderr and "died" not in done.stdout + done.stderr
    memory_detail = checks["memory"]["detail"]
    assert checks["memory"]["status"] == "fail"
    assert re.search(r"l2_kernel program \(3, 0, 0\): store of 4 bytes, 1 lanes outside every tensor argument; "
                     r"first 4 bytes \(1 elements\) past the end of argument y_ptr \(\(4, 3\) float32\)",
                     memory_detail), memory_detail
    for name in set(ran_the_kernel) - {"memory"}:
        assert checks[name]["status"] == "fail", name
        assert "OutOfBounds: l2_kernel program (3, 0, 0): store of 4 bytes" in checks[name]["detail"], name
        assert "the memory check names them" in checks[name]["detail"], name
