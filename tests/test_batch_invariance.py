"""The ``batch`` check (kernel_sentinel.invariance): the toy family's rows are batch invariant; a route whose result
depends on an item's position, or on its neighbours, fails at the positions where it does; undeclared items and
outputs fail; the item descriptions of the real families split and join cases faithfully, and real routes of
every family pass."""
from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch

from conftest import TOY_ROWS, toy_entry, toy_slow
from kernel_sentinel import registry
from kernel_sentinel.generic import bitwise_equal
from kernel_sentinel.invariance import batch_invariance, items_of

CPU = torch.device("cpu")


def toy_with(toy_family, body: Callable[[dict], torch.Tensor], **changes):
    """The toy family with route ``toy.fast`` running ``body(call)`` (row sums of ``call["x"]``)."""
    tree, toy_sum = toy_entry(fast=body)

    def run(case):
        value = toy_sum(**case.kwargs)
        (grad,) = torch.autograd.grad(value.sum(), case.kwargs["x"])
        return {"value": value.detach(), "grad_x": grad}

    return toy_family(tree=tree, entry_points={"toy_sum": toy_sum}, run=run, **changes)


def verdict(family, route_id="toy.fast"):
    return batch_invariance(family, route_id, dtype=torch.float32, device=CPU, seed=0)


def test_batch_invariant_route_passes(toy_family):
    found = verdict(toy_family(), "toy.slow")
    assert found.passed, found.problems
    assert found.summary == ("a row alone (tiny case) vs first, middle and last of 4 with other random items: "
                             "bitwise equal (value, grad_x)")


def test_position_dependent_rounding_fails_where_it_happens(toy_family):
    def first_row_in_float64(call):
        """Rows after the first scaled by 1 + 2**-20: right within tolerance, and the item alone (row 0) differs
        from the same item further down the batch."""
        x = call["x"]
        return torch.cat([x[:1].sum(-1), x[1:].sum(-1) * (1 + 2 ** -20)])

    found = verdict(toy_with(toy_family, first_row_in_float64))
    where = [p.split(":")[0] for p in found.problems]
    assert where == ["middle of 4"] * 2 + ["last of 4"] * 2, found.problems  # value and grad_x; first: row 0
    assert found.problems[0].startswith("middle of 4: value: 1/1 elements differ, first at [0]")


def test_leak_from_a_neighbour_fails(toy_family):
    def adds_the_next_row(call):
        x = call["x"]
        return toy_slow(call) + 1e-6 * torch.roll(x.detach(), -1, 0).sum(-1)  # within the reference's tolerance

    found = verdict(toy_with(toy_family, adds_the_next_row))
    assert [p.split(":")[0] for p in found.problems] == ["first of 4", "middle of 4", "last of 4"], found.problems


def test_route_without_declared_items_fails(toy_family):
    found = verdict(toy_family(batch_items=()), "toy.slow")
    assert found.problems == ("no BatchItems declared for this route (Family.batch_items)",)


def test_output_neither_per_item_nor_summed_fails(toy_family):
    rows_only = dataclasses.replace(TOY_ROWS, outputs=lambda case, got: [
        {"value": got["value"][i:i + 1]} for i in range(got["value"].shape[0])])
    with pytest.raises(ValueError, match="outputs neither split per item nor declared summed .*: grad_x"):
        verdict(toy_family(batch_items=(rows_only,)), "toy.slow")


def _same(a, b) -> bool:
    """Bitwise for tensors (``a`` in ``b``'s shape: Sinkhorn's items come back with the leading dims flattened)
    and tuples of them, ``is`` or ``==`` otherwise."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.numel() == b.numel() and bitwise_equal(a.reshape(b.shape), b)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    return a is b or a == b


def _bitwise_same_case(a, b) -> bool:
    return (set(a.kwargs) == set(b.kwargs) and all(_same(a.kwargs[n], b.kwargs[n]) for n in a.kwargs)
            and set(a.upstream) == set(b.upstream) and all(_same(a.upstream[n], b.upstream[n]) for n in a.upstream))


SEGMENTS = lambda case: len(case.problem.lengths)  # noqa: E731  (the lengths the case was built from)
MATRICES = lambda case: case.kwargs["x"][..., 0, 0].numel()  # noqa: E731
SEQUENCES = lambda case: case.kwargs["lengths"].numel()  # noqa: E731


@pytest.mark.parametrize("family_name, route_id, count", [
    ("segment", "segment.torch.sum", SEGMENTS),  # offsets form, upstream weights, empty segments
    ("segment", "segment.torch.mean", SEGMENTS),  # ids form with num_segments
    ("segment", "segment.torch.max_backward", SEGMENTS),  # grad_output per segment
    ("sinkhorn", "sinkhorn.torch.log.train", MATRICES),
    ("semicrf", "semicrf.torch.log.train", SEQUENCES),
    ("semicrf", "semicrf.exact.cross_entropy", SEQUENCES),  # a pair of edges
])
def test_items_split_and_join_back_to_the_case(family_name, route_id, count):
    family = registry.family(family_name)
    items = items_of(family, route_id)
    for size in ("tiny", "small"):
        case = family.make_case(route_id, size=size, dtype=torch.float32, device=CPU, seed=0)
        parts = items.split(case)
        assert len(parts) == count(case) > 1
        assert _bitwise_same_case(items.join(case, parts), case)


@pytest.mark.parametrize("family_name, route_id", [
    ("segment", "segment.torch.max"), ("segment", "segment.triton.min_backward"),
    ("sinkhorn", "sinkhorn.triton.prob.train"), ("semicrf", "semicrf.torch.log.train"),
    ("semicrf", "semicrf.triton.viterbi"), ("semicrf", "semicrf.head.streaming.loss"),
    ("semicrf", "semicrf.exact.kmax"),
])
def test_real_routes_are_batch_invariant(family_name, route_id):
    found = batch_invariance(registry.family(family_name), route_id, dtype=torch.float32, device=CPU, seed=0)
    assert found.passed, found.problems
