"""Registration of the l2norm family for verification: data and plain functions that sentinel reads (every
name's schema: the guide page "The registration schema"). It imports nothing of sentinel.

Outputs of a route, by name: ``value`` (shaped like ``x``) and ``grad_x`` (weights ``Case.upstream["value"]``).
"""
from __future__ import annotations

import math

import torch

from . import oracle
from .call import check
from .dispatch import TREE, l2norm
from .triton_l2norm import l2norm_forward_kernel
from .triton_ops import MAX_BLOCK

ENTRY_POINTS = {"l2norm": l2norm}
TOLERANCES = {torch.float32: (1e-6, 1e-5), torch.float64: (1e-12, 1e-12)}
# A problem: leading dims and cols. small: two blocks per row, the second partial; tiny: one partial block.
SIZES = {"small": dict(lead=(2, 3), cols=MAX_BLOCK + 5), "tiny": dict(lead=(3,), cols=5)}


def case(route_id, p, gen, device):
    """x ~ N(0, 1) of (*lead, cols); every case trains, its gradient weighted by ``upstream["value"]``."""
    x = torch.randn(*p.lead, p.cols, generator=gen, dtype=torch.float64)
    kwargs = {"x": x, "use_triton": TREE.path_to(route_id)["backend"] == "triton"}
    return "l2norm", kwargs, {"value": torch.randn(*p.lead, p.cols, generator=gen, dtype=torch.float64)}


def reference(kw, case):
    """The float64 formula and its closed-form gradient (``oracle.l2norm``, ``oracle.l2norm_grad``)."""
    return {"value": oracle.l2norm(kw["x"]), "grad_x": oracle.l2norm_grad(kw["x"], case.upstream["value"].cpu())}


def example(pick):
    """Leading dims (), (1,) or (2, 3), 1..70 columns."""
    return dict(lead=pick([(), (1,), (2, 3)]), cols=pick(range(1, 71)))


def squared_norms(check, case):
    """Each output row's squared norm is s / (s + 1e-6), s the input row's sum of squares."""
    x = case.kwargs["x"].detach().double().cpu()
    s = (x * x).sum(-1)
    out = check.forward(case)["value"].detach().double().cpu()
    check.close("squared norm of each output row", (out * out).sum(-1), s / (s + oracle.EPS))


ORACLES = (("Python loop", "tiny", lambda kw, case: {"value": oracle.python_loop(kw["x"])}),)
PROPERTIES = (("each output row's squared norm is s / (s + eps)", "l2norm.*", squared_norms),)
FINITE_DIFFERENCES = "l2norm.*"
ADVERSARIAL = (
    ("a zero row (eps keeps it finite)", {"x": lambda x: x.index_fill(-2, torch.tensor([0]), 0.0)}, "reference"),
    ("entries of +-1e15 (squares near 1e30)", {"x": lambda x: x * 1e15}, "reference"),
    ("one column", {"problem": {"cols": 1}}, "reference"),
    ("no rows", {"problem": {"lead": (0,)}}),
    ("NaN input", {"x": lambda x: x * math.nan}, None, {"errors_ok": True}))
STANDARD_BAD_INPUTS = dict(tensors=("x",), rejects_nan=("x",), rejects_inf=("x",), flags=("use_triton",))
BAD_INPUTS = (("x", "0-D", lambda c: c.kwargs["x"].sum()),
              ("x", "no columns", lambda c: c.kwargs["x"][..., :0]))
BATCH_ITEMS = (("a row", "l2norm.*", {"x": 0, "value": 0, "grad_x": 0}),)
BLOCKS = (("l2norm.triton.*", "x", -1, MAX_BLOCK),)  # the small case's rows cross a block edge
INVARIANTS = {"l2norm/test_l2norm.py": ("test_routes_equal_the_formula",)}
GUARDS = (("Arguments are validated before dispatch: dtype, rank, cols >= 1; NaN or +inf in x raise ValueError "
           "naming x on the CPU.", check),
          ("eps = 1e-6 is added to each row's sum of squares: a zero row gives zeros and a finite gradient.",
           l2norm_forward_kernel.fn))
