"""The generic checks (kernel_sentinel.generic) on the toy family: the right route passes all five; each planted
defect (in-place input write, aliased output, unwritten output element, nondeterministic reduction, stride bug)
fails exactly the check written for it."""
from __future__ import annotations

from typing import Callable

import pytest
import torch

from conftest import toy_entry
from provable_kernels import alloc
from kernel_sentinel.family import Aliasing, LayoutRejection, Tolerance
from kernel_sentinel.generic import GENERIC_CHECKS, LAYOUTS, Probe, bitwise_equal, differences

CPU = torch.device("cpu")
TOLERANCE = Tolerance(1e-5, 1e-5)


def planted_family(toy_family, body: Callable[[dict], object], **changes):
    """The toy family with route ``toy.slow`` running ``body(call)``, which returns the row sums or
    ``(row sums, extra output)``; ``run`` reports ``value``, ``grad_x`` and the extra output as ``extra``."""
    tree, toy_sum = toy_entry(slow=body)

    def run(case):
        result = toy_sum(**case.kwargs)
        value, extra = result if isinstance(result, tuple) else (result, None)
        (grad,) = torch.autograd.grad(value.sum(), case.kwargs["x"])
        out = {"value": value.detach(), "grad_x": grad}
        return out if extra is None else {**out, "extra": extra.detach()}

    return toy_family(tree=tree, entry_points={"toy_sum": toy_sum}, run=run, **changes)


def probe(family, size="small"):
    case = family.make_case("toy.slow", size=size, dtype=torch.float32, device=CPU, seed=0)
    return Probe(family, case, TOLERANCE)


def failing(p: Probe) -> dict[str, tuple[str, ...]]:
    torch.manual_seed(0)
    verdicts = {name: getattr(p, name)() for name in GENERIC_CHECKS}
    return {name: v.problems for name, v in verdicts.items() if not v.passed}


def correct(call):
    """Row sums in float64, the right answer in every layout."""
    return call["x"].double().sum(-1).to(call["x"].dtype)


def test_correct_route_passes_every_generic_check(toy_family):
    p = probe(planted_family(toy_family, correct))
    assert failing(p) == {}
    summary = p.layouts().summary
    assert all(layout.name in summary for layout in LAYOUTS), summary


def test_inplace_input_write_fails_inputs(toy_family):
    def writes_input(call):
        out = correct(call)
        call["x"].data[0, 0] = 0.0
        return out

    problems = failing(probe(planted_family(toy_family, writes_input)))
    assert set(problems) == {"inputs"}
    assert problems["inputs"][0].startswith("x written by the forward (toy_sum): 1/24 elements differ, first at [0, 0]")


def test_aliased_output_fails_aliasing_unless_declared(toy_family):
    def returns_input(call):
        return correct(call), call["x"].contiguous()  # contiguous() of a contiguous tensor is the tensor itself

    problems = failing(probe(planted_family(toy_family, returns_input)))
    assert problems == {"aliasing": ("extra shares storage with argument x",)}
    declared = planted_family(toy_family, returns_input,
                              aliasing=(Aliasing("extra", "x", ("toy.*",), "the input as the kernel read it"),))
    verdict = probe(declared).aliasing()
    assert verdict.passed and "declared: extra shares storage with argument x" in verdict.summary


def test_unwritten_output_element_fails_written(toy_family):
    def skips_first_row(call):
        x = call["x"]
        out = alloc.empty((x.shape[0],), dtype=x.dtype, device=x.device)
        out[1:] = x[1:].double().sum(-1).to(x.dtype)
        return out

    problems = failing(probe(planted_family(toy_family, skips_first_row)))
    assert "written" in problems
    assert problems["written"][0].startswith("value: 1/3 elements differ, first at [0]: nan vs ")


def test_nondeterministic_reduction_fails_determinism(toy_family):
    def random_order(call):
        x = call["x"]
        total = torch.zeros_like(x[:, 0])
        for j in torch.randperm(x.shape[1]).tolist():  # the order of an atomic-add race
            total = total + x[:, j]
        return total

    problems = failing(probe(planted_family(toy_family, random_order)))
    assert "determinism" in problems and set(problems) <= {"determinism", "written"}  # written compares two runs
    assert "run 2 vs run 1: value:" in problems["determinism"][0]


def test_stride_bug_fails_layouts(toy_family):
    def assumes_contiguous(call):
        x = call["x"]
        return correct({"x": x.as_strided(x.shape, (x.shape[1], 1))})

    problems = failing(probe(planted_family(toy_family, assumes_contiguous)))
    assert set(problems) == {"layouts"}
    assert [p.split(":")[0] for p in problems["layouts"]] == ["transposed", "strided", "expanded"]
    transposed, strided, expanded = problems["layouts"]
    assert transposed.startswith("transposed: transposed view vs contiguous copy: value: abs ")
    assert "non-finite values differ" in strided  # the poisoned gaps were read
    assert "grad_x" in expanded  # an offset view has contiguous strides: the bug cannot show there


def test_layout_rejection_must_be_declared_and_named(toy_family):
    def rejects_views(call):
        if not call["x"].is_contiguous():
            raise ValueError("x must be contiguous")
        return correct(call)

    family = planted_family(toy_family, rejects_views)
    problems = probe(family).layouts().problems
    assert [p.split(":")[0] for p in problems] == ["transposed", "strided", "expanded"]
    assert "rejected without a declaration: ValueError: x must be contiguous" in problems[0]
    declared = planted_family(toy_family, rejects_views, rejected_layouts=tuple(
        LayoutRejection("x", name, ("toy.*",), "the kernel reads rows as contiguous blocks")
        for name in ("transposed", "strided", "expanded")))
    verdict = probe(declared).layouts()
    assert verdict.passed and "rejected as declared: x transposed, x strided, x expanded" in verdict.summary
    accepted = planted_family(toy_family, correct, rejected_layouts=(
        LayoutRejection("x", "transposed", ("toy.*",), "stale declaration"),))
    assert probe(accepted).layouts().problems == (
        "x transposed (declared rejected): accepted; drop the declaration or reject it",)


def test_views_within_tolerance_pass_with_the_error_measured(toy_family):
    def rounds_by_layout(call):
        x = call["x"]
        out = correct(call)
        return out if x.is_contiguous() else out * (1 + 1e-7)

    verdict = probe(planted_family(toy_family, rounds_by_layout)).layouts()
    assert verdict.passed and verdict.measurements
    assert max(m.max_rel for m in verdict.measurements) == pytest.approx(1e-7, rel=0.5)


def test_bitwise_comparison_sees_nan_bits_and_signed_zero():
    assert bitwise_equal(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not bitwise_equal(torch.tensor([1], dtype=torch.int32), torch.tensor([1], dtype=torch.int64))
    assert differences({"a": torch.ones(2)}, {"a": torch.ones(2), "b": torch.ones(1)}) == ["b: missing"]
