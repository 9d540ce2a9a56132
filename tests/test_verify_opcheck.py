"""The ``opcheck`` check (:mod:`kernel_sentinel.opcheck`): every custom op a route calls passes
``torch.library.opcheck``.

Toy custom ops (:class:`provable_kernels.custom_ops.Op`) applied after the toy family's route: a right one passes,
a wrong fake implementation and a differentiated op without an autograd formula fail; a planted bug in the
semi-CRF training op's fake implementation (the held-out mutant of issue 31) fails ``sentinel verify``'s
``opcheck`` in a scratch copy.
"""
from __future__ import annotations

import re

import pytest
import torch
from conftest import planted_failure, toy_sum

from provable_kernels.custom_ops import Op
from kernel_sentinel import opcheck


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _setup(ctx, inputs, output) -> None:
    pass


def _double_backward(ctx, grad):
    return grad * 2


RIGHT = Op("sentinel_test_double", _double, lambda x: torch.empty_like(x), setup_context=_setup,
           backward=_double_backward)
WRONG_FAKE = Op("sentinel_test_double_wrong_fake", _double, lambda x: x.new_empty(x.shape[0] + 1),
                setup_context=_setup, backward=_double_backward)
NO_FORMULA = Op("sentinel_test_double_no_formula", _double, lambda x: torch.empty_like(x))


def through(op: Op, differentiate: bool = True):
    """The toy family's run with ``op`` applied to the route's value (the gradient taken through it or not)."""
    def run(case):
        value = op(toy_sum(**case.kwargs))
        grad = torch.autograd.grad(value.sum(), case.kwargs["x"])[0] if differentiate else torch.zeros(0)
        return {"value": value.detach(), "grad_x": grad}

    return run


def verdict(family):
    case = family.make_case("toy.slow", size="tiny", dtype=torch.float32, device=torch.device("cpu"), seed=0)
    return opcheck.verdict(family, case)


def test_a_right_op_passes_and_is_named(toy_family):
    v = verdict(toy_family(run=through(RIGHT)))
    assert v.passed, v.problems
    assert v.summary.startswith("1 custom ops (sentinel_test_double) pass torch.library.opcheck")


def test_a_route_without_custom_ops_has_nothing_to_check(toy_family):
    v = verdict(toy_family())
    assert v.passed and v.summary == "no custom op called: nothing to check"


def test_a_wrong_fake_implementation_fails(toy_family):
    v = verdict(toy_family(run=through(WRONG_FAKE)))
    assert not v.passed
    assert any(p.startswith("sentinel_test_double_wrong_fake: test_faketensor:") for p in v.problems), v.problems


def test_only_differentiated_ops_are_checked_with_gradients(toy_family):
    """An op without an autograd formula whose output gets no gradient passes (its arguments are given to opcheck
    without requires_grad); a route that differentiates it fails already while it runs (the check raises)."""
    with pytest.raises(RuntimeError, match="no autograd formula"):
        verdict(toy_family(run=through(NO_FORMULA)))
    family = toy_family(run=through(NO_FORMULA, differentiate=False))
    case = family.make_case("toy.slow", size="tiny", dtype=torch.float32, device=torch.device("cpu"), seed=0)
    calls, differentiated = opcheck.recorded_calls(family, case)
    assert [opcheck._name(op) for op in calls] == ["sentinel_test_double_no_formula"] and not differentiated
    assert opcheck.verdict(family, case).passed


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scratch worker verifies on the CPU")
def test_planted_bug_in_the_training_ops_fake_fails_opcheck():
    """The semi-CRF training op's fake implementation with its torch/Triton branch inverted (a held-out mutant
    that only compile would have met)."""
    route = "semicrf.triton.log.train"
    planted_last = planted_failure(
        "semicrf", route, "opcheck", "kernels/semicrf/autograd.py", r'\n    if backend == "torch":\n        return \[logZ, ',
        "==", "!=")
    assert re.match(rf"{re.escape(route)} \w+ opcheck: semicrf_log_forward: test_faketensor: .*mismatched tensor "
                    r"metadata", planted_last), planted_last
