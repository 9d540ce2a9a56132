"""A thin entry point over ``torch.segment_reduce`` with a decision tree of one condition (the reduction), so
that sentinel verifies each reduction as a route. No validation of its own: what the checks see is PyTorch's."""
from __future__ import annotations

from typing import NamedTuple

import torch

from provable_kernels.dispatch import Branch, Condition, Route, Tree

REDUCTIONS = ("sum", "max", "min")


class SegmentCall(NamedTuple):
    x: torch.Tensor
    reduce: str
    offsets: torch.Tensor


def ask_reduce(call: SegmentCall) -> str:
    """The reduction asked for: ``sum``, ``max`` or ``min`` (anything else is PyTorch's to reject, on the sum
    route)."""
    return call.reduce if call.reduce in REDUCTIONS else "sum"


def torch_segment_reduce(call: SegmentCall) -> torch.Tensor:
    """``torch.segment_reduce(x, reduce, offsets=offsets)`` (axis 0, PyTorch's own checks, ``unsafe=False``)."""
    return torch.segment_reduce(call.x, call.reduce, offsets=call.offsets)


TREE = Tree("segment_reduce", Branch(Condition("reduce", ask_reduce, REDUCTIONS), {
    reduce: Route(f"torch_segment.torch.{reduce}", torch_segment_reduce) for reduce in REDUCTIONS}))


def segment_reduce(x: torch.Tensor, reduce: str, offsets: torch.Tensor) -> torch.Tensor:
    """``torch.segment_reduce`` of ``x`` (N, ...) over the segments of CSR ``offsets`` (S + 1,); (S, ...)."""
    return TREE.dispatch(SegmentCall(x, reduce, offsets))
