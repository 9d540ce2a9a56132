"""Registration of ``torch.segment_reduce`` (sum, max, min) for verification: cases with empty segments and
integer-valued data (ties), this repository's float64 segment loops (``provable_kernels.segment.oracle``) as the
reference of values and of sum gradients, and the even split of a max / min gradient between tied rows computed
here in float64 from the same loops' extreme values.

Outputs: ``value`` (S, D) and ``grad_x`` (N, D), weights ``Case.upstream["value"]``.
"""
from __future__ import annotations

import math

import torch

from provable_kernels.segment import oracle

from .dispatch import TREE, segment_reduce

ENTRY_POINTS = {"segment_reduce": segment_reduce}
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}
_EMPTY = {"sum": 0.0, "max": -math.inf, "min": math.inf}  # PyTorch's value of an empty segment (no ``initial``)
# A problem: segment lengths (zeros: empty segments), columns, integer data in -2..2 (ties) or N(0, 1).
SIZES = {"small": dict(lengths=(3, 0, 25, 1, 17, 0, 4), cols=3, integers=True),
         "tiny": dict(lengths=(3, 0, 4, 1), cols=2, integers=True)}


def case(route_id, p, gen, device):
    """x (N, cols), the route's reduction, CSR ``offsets`` (S + 1,) int64; upstream weights N(0, 1) (or all ``p.sign``)."""
    size = (sum(p.lengths), p.cols)
    x = torch.randint(-2, 3, size, generator=gen).double() if p.integers else \
        torch.randn(size, generator=gen, dtype=torch.float64)
    weights = torch.randn(len(p.lengths), p.cols, generator=gen, dtype=torch.float64)
    if p.get("sign"):
        weights = torch.full_like(weights, p.sign)
    reduce = TREE.path_to(route_id)["reduce"]
    return "segment_reduce", {"x": x, "reduce": reduce, **oracle.csr_index(p.lengths, "offsets")}, {"value": weights}


def offsets(kw):
    return kw["offsets"].tolist()


def split_grad(x, reduce, bounds, weights):
    """d(sum(weights * reduce(x)))/dx with each segment's gradient split evenly between the rows holding its
    extreme value (the value of ``oracle.segment_reduce``)."""
    top = oracle.segment_reduce(x, reduce, bounds)
    grad = torch.zeros(x.shape, dtype=torch.float64)
    for s in range(len(bounds) - 1):
        rows = x.detach().double()[bounds[s]:bounds[s + 1]]
        tied = (rows == top[s]).double()
        grad[bounds[s]:bounds[s + 1]] = tied * weights.double()[s] / tied.sum(0).clamp(min=1)
    return grad


def reference(kw, case):
    """The float64 loops of ``provable_kernels.segment.oracle``; max / min gradients split between ties."""
    reduce, bounds, weights = kw["reduce"], offsets(kw), case.upstream["value"].cpu()
    grad = oracle.segment_grad(kw["x"], reduce, bounds, weights) if reduce == "sum" else \
        split_grad(kw["x"], reduce, bounds, weights)
    return {"value": oracle.segment_reduce(kw["x"], reduce, bounds, _EMPTY[reduce]), "grad_x": grad}


def dense(kw, case):
    """The same from the oracle's dense membership matrix (values only)."""
    return {"value": oracle.dense_reduce(kw["x"], kw["reduce"], offsets(kw), _EMPTY[kw["reduce"]])}


def example(pick):
    """1..4 segments of 0..6 rows, 1..2 columns, integer data or N(0, 1)."""
    return dict(lengths=tuple(pick(range(7)) for _ in range(pick(range(1, 5)))), cols=pick(range(1, 3)),
                integers=pick([True, False]))


def ties(check, case):
    """Integer data (ties), upstream gradient all +1 and all -1: each within tolerance of the reference."""
    for sign in (1.0, -1.0):
        signed = check.case({**case.problem, "integers": True, "sign": sign})
        check.close(f"grad_x with upstream {sign:+g}", check.run(signed)["grad_x"],
                    check.reference(signed)["grad_x"])


def permutation(check, case):
    """Permuting rows within each segment leaves the value unchanged."""
    gen, perm, start = torch.Generator().manual_seed(case.problem.seed + 1), [], 0
    for n in case.problem.lengths:
        perm += (start + torch.randperm(n, generator=gen)).tolist()
        start += n
    moved = case.transformed("rows permuted within segments", x=lambda x: x[torch.tensor(perm, dtype=torch.int64)])
    check.close("value after permuting rows", check.forward(moved)["value"], check.forward(case)["value"])


_ALL = "torch_segment.*"
ORACLES = (("dense membership matrix", "small", dense),)
PROPERTIES = (("ties: the gradient is split between tied rows, upstream +1 and -1", _ALL, ties),
              ("permuting rows within a segment leaves the value unchanged", _ALL, permutation))
FINITE_DIFFERENCES = "torch_segment.torch.sum"
_EMPTY_OK = {"allow_inf": ("value",)}  # the empty segments' -inf and +inf
ADVERSARIAL = (
    ("N(0, 1) data (no ties)", {"problem": {"integers": False}}, "reference", _EMPTY_OK),
    ("every segment empty", {"problem": {"lengths": (0, 0)}}, "reference", _EMPTY_OK),
)
STANDARD_BAD_INPUTS = dict(tensors=("x",))
BAD_INPUTS = (("offsets", "decreasing", lambda c: c.kwargs["offsets"].flip(0)),
              ("offsets", "ending past the last row", lambda c: c.kwargs["offsets"] + 1),
              ("reduce", "an unknown reduction", "median"))
BATCH_ITEMS = (("a segment", _ALL, {"ragged": dict(rows=("x", "grad_x"), per_item=("value",))}),)
