"""The ``observed`` check (kernel_sentinel.observed): a toy route whose Triton kernel writes its output passes; a
route launching a kernel whose output nothing reads fails naming that kernel; a PyTorch route is not applicable;
a kernel-less run that crashes or hangs counts as noticed; real routes of every family notice each kernel."""
from __future__ import annotations

import functools
import os
import time
from typing import Callable

import pytest
import torch
import triton
import triton.language as tl

from conftest import toy_entry, toy_slow
from provable_kernels import alloc
from provable_kernels.launch import Launcher, launcher
from kernel_sentinel import registry
from kernel_sentinel.observed import _spawned_run, in_child, kernel_launches, observe

CPU = torch.device("cpu")


@triton.jit
def row_sum_kernel(x, out, D, BD: tl.constexpr):
    """out[r] = sum of row r of x (rows of D contiguous elements)."""
    r = tl.program_id(0)
    offs = tl.arange(0, BD)
    tl.store(out + r, tl.sum(tl.load(x + r * D + offs, mask=offs < D, other=0.0), 0))


def row_sums(x: torch.Tensor) -> torch.Tensor:
    """Row sums of ``x`` (N, D) by :func:`row_sum_kernel`, into a fresh :func:`provable_kernels.alloc.empty`."""
    x = x.detach().contiguous()
    out = alloc.empty((x.shape[0],), dtype=x.dtype, device=x.device)
    launcher(row_sum_kernel)[(x.shape[0],)](x, out, x.shape[1], BD=triton.next_power_of_2(x.shape[1]))
    return out


@triton.jit
def copy_kernel(src, dst, N, B: tl.constexpr):
    """dst[:N] = src[:N]."""
    offs = tl.arange(0, B)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)


def copied(v: torch.Tensor) -> torch.Tensor:
    """A copy of the 1-D ``v`` made by :func:`copy_kernel`."""
    out = alloc.empty_like(v)
    launcher(copy_kernel)[(1,)](v, out, v.numel(), B=triton.next_power_of_2(v.numel()))
    return out


def kernel_family(toy_family, body: Callable[[dict], torch.Tensor]):
    """The toy family with route ``toy.fast`` running ``body(call)``; ``run`` reports ``value`` only."""
    tree, toy_sum = toy_entry(fast=body)

    def reference(case):
        return {"value": case.kwargs["x"].detach().double().sum(-1)}

    return toy_family(tree=tree, entry_points={"toy_sum": toy_sum}, run=lambda c: {"value": toy_sum(**c.kwargs)},
                      reference=reference)


def verdict(family, route_id="toy.fast"):
    case = family.make_case(route_id, size="small", dtype=torch.float32, device=CPU, seed=0)
    return observe(family, case, size="small", dtype=torch.float32, seed=0)


def test_kernel_writing_the_output_is_noticed(toy_family):
    found = verdict(kernel_family(toy_family, lambda call: row_sums(call["x"])))
    assert found.passed, found.problems
    assert found.summary.startswith("1/1 kernels noticed") and "row_sum_kernel: reference comparison fails (value)" \
        in found.summary


def test_kernel_whose_output_nothing_reads_fails_naming_it(toy_family):
    def ignores_kernel(call):
        row_sums(call["x"])  # launched, result dropped: the checks cannot see this kernel
        return toy_slow(call)

    found = verdict(kernel_family(toy_family, ignores_kernel))
    assert found.problems == ("without row_sum_kernel the route's checks still pass: outputs still match the float64 "
                              "reference (the checks do not see it)",)


def test_each_kernel_is_removed_on_its_own(toy_family):
    both = verdict(kernel_family(toy_family, lambda call: copied(row_sums(call["x"]))))
    assert both.passed and both.summary.startswith("2/2 kernels noticed"), both
    assert "row_sum_kernel: reference" in both.summary and "copy_kernel: reference" in both.summary

    def copy_unused(call):
        copied(call["x"].detach().sum(-1))
        return row_sums(call["x"])

    found = verdict(kernel_family(toy_family, copy_unused))
    assert found.summary.startswith("1/2 kernels noticed") and "row_sum_kernel: reference" in found.summary
    assert len(found.problems) == 1 and found.problems[0].startswith("without copy_kernel the route's checks still")


def test_pytorch_route_is_not_applicable(toy_family):
    found = verdict(kernel_family(toy_family, lambda call: row_sums(call["x"])), "toy.slow")
    assert found.passed and found.summary.startswith("not applicable: the route launches no Triton kernel")


def test_launches_are_recorded_removed_and_restored():
    x = torch.arange(6.0).reshape(2, 3)
    original = Launcher.launch
    with kernel_launches(removed="row_sum_kernel") as launched:
        with alloc.poisoned():
            out = row_sums(x)
    assert launched == ["row_sum_kernel"] and torch.isnan(out).all()
    assert Launcher.launch is original
    with kernel_launches() as launched:
        assert torch.equal(row_sums(x), torch.tensor([3.0, 12.0]))
    assert launched == ["row_sum_kernel"]
    with pytest.raises(TypeError, match="removed must be"):
        with kernel_launches(removed=row_sum_kernel):
            pass


def test_prepared_launches_are_recorded_and_removed_too():
    """A launch prepared once per signature (``launch.Bound``, the direct runners': on a GPU its fast path does not
    pass through ``Launcher.launch``) is recorded once and removed like any other."""
    from provable_kernels.launch import Bound, launcher, options

    x = torch.arange(6.0).reshape(2, 3)
    out = torch.empty(2)
    bound = launcher(row_sum_kernel).bind((2,), (3,), options(BD=4))
    call = Bound.__call__
    with kernel_launches(removed="row_sum_kernel") as launched:
        assert Bound.__call__ is not call  # watched itself: the compiled fast path never reaches Launcher.launch
        bound(x, out.fill_(float("nan")))
    assert launched == ["row_sum_kernel"] and torch.isnan(out).all() and Bound.__call__ is call  # once, not twice
    with kernel_launches() as launched:
        bound(x, out)
    assert launched == ["row_sum_kernel"] and torch.equal(out, torch.tensor([3.0, 12.0]))


def test_a_child_that_dies_or_hangs_counts_as_noticed():
    assert in_child(lambda: (False, "fine"), "fork") == (False, "fine")
    assert in_child(lambda: os._exit(3), "fork") == (True, "the process died (exit code 3)")
    start = time.perf_counter()
    assert in_child(lambda: time.sleep(30), "fork", limit=1.0) == (True, "ran past 1 s (killed)")
    assert time.perf_counter() - start < 10


def test_a_spawned_child_rebuilds_the_case_as_on_a_gpu():
    """The GPU path (a spawned process rebuilds the family, case and reference by name), run on the CPU."""
    job = functools.partial(_spawned_run, "sinkhorn", "sinkhorn.triton.prob.infer", "tiny", "float32", "cpu", 0,
                            "prob_forward_kernel")
    assert in_child(job, "spawn") == (True, "reference comparison fails (out)")
    job = functools.partial(_spawned_run, "sinkhorn", "sinkhorn.triton.prob.infer", "tiny", "float32", "cpu", 0,
                            "no_such_kernel")
    assert in_child(job, "spawn") == (False, "outputs still match the float64 reference")


@pytest.mark.parametrize("family_name, route_id, kernels", [
    ("segment", "segment.triton.max.train.offsets",
     ("segment_chunk_kernel", "segment_backward_kernel")),
    ("sinkhorn", "sinkhorn.triton.log.train", ("log_forward_kernel", "log_backward_kernel")),
    ("semicrf", "semicrf.triton.viterbi", ("value_checks_kernel", "semicrf_forward_kernel",
                                           "semicrf_backtrack_kernel")),
])
def test_real_routes_notice_every_kernel(family_name, route_id, kernels):
    family = registry.family(family_name)
    case = family.make_case(route_id, size="small", dtype=torch.float32, device=CPU, seed=0)  # verify's size
    found = observe(family, case, size="small", dtype=torch.float32, seed=0)
    assert found.passed, found.problems
    assert found.summary.startswith(f"{len(kernels)}/{len(kernels)} kernels noticed")
    assert all(f"{k}: " in found.summary for k in kernels), found.summary
