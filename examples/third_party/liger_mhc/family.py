"""Registration of Liger-Kernel's mHC Sinkhorn for verification: this repository's float64 Sinkhorn loop
(``provable_kernels.sinkhorn.oracle.sinkhorn_oracle``, probability domain, the same convention) as reference, its
scaling-form derivation as oracle, the properties of a doubly-stochastic normalisation, the matrix sizes Liger's
users meet (n = 4; n = 12, not a power of two) and a token count that changes from call to call.

Outputs: ``out`` (N, n, n) and ``grad_x`` (weights ``Case.upstream["out"]``).
"""
from __future__ import annotations

import math

import torch
from liger_kernel.ops import mhc

from provable_kernels.sinkhorn.oracle import sinkhorn_oracle, sinkhorn_scaling_oracle

from .dispatch import TREE, liger_sinkhorn

ENTRY_POINTS = {"liger_sinkhorn": liger_sinkhorn}
TOLERANCES = {torch.float32: (2e-5, 2e-5)}  # this repository's Sinkhorn float32 tolerance; Liger computes float32
_EPS = 1e-3
_ALL = "liger_mhc.*"
# A problem: tokens N, matrix size n, iterations. n = 4: mHC's four streams.
SIZES = {"small": dict(tokens=6, n=4, iters=3), "tiny": dict(tokens=2, n=4, iters=2)}


def case(route_id, p, gen, device):
    """Logits N(0, 1) of (tokens, n, n); every case trains, weighted by ``upstream["out"]``."""
    size = (p.tokens, p.n, p.n)
    history = TREE.path_to(route_id)["backward"] == "history"
    kwargs = {"x": torch.randn(size, generator=gen, dtype=torch.float64), "iters": p.iters, "eps": _EPS,
              "keep_history": history}
    return "liger_sinkhorn", kwargs, {"out": torch.randn(size, generator=gen, dtype=torch.float64)}


def outputs(result, case):
    return {"out": result}


def reference(kw, case):
    """The float64 loop of the probability domain (``sinkhorn_oracle``)."""
    return {"out": sinkhorn_oracle(kw["x"], kw["iters"], "prob", kw["eps"])}


def scaling_form(kw, case):
    return {"out": sinkhorn_scaling_oracle(kw["x"], kw["iters"], "prob", kw["eps"])}


def example(pick):
    """1..5 tokens, n in 1, 2, 4, 8, 1..4 iterations."""
    return dict(tokens=pick(range(1, 6)), n=pick([1, 2, 4, 8]), iters=pick(range(1, 5)))


def row_shift(check, case):
    """Adding a constant to every logit of a row leaves the output unchanged (the softmax removes it)."""
    shift = torch.randint(-8, 9, (*case.kwargs["x"].shape[:-1], 1),
                          generator=torch.Generator().manual_seed(case.problem.seed + 1)).float()
    moved = case.transformed("rows shifted", x=lambda x: x + shift.to(x.device))
    check.close("output after a row shift", check.forward(moved)["out"], check.forward(case)["out"])


def compiled_kernels():
    """The compiled variants of Liger's forward kernel (None under the Triton interpreter, which compiles none)."""
    caches = getattr(mhc._mhc_split_sinkhorn_fwd_kernel, "device_caches", None)
    return None if caches is None else sum(len(cache[0]) for cache in caches.values())


def one_compilation(check, case):
    """Token counts not seen before compile no new kernel once one has run: N, then N + 7 and N + 13 tokens (a
    token count changes with every batch of a language model). On CUDA; the interpreter compiles nothing."""
    check.forward(case)
    before = compiled_kernels()
    for more in (7, 13):
        check.forward(check.case({**case.problem, "tokens": case.problem.tokens + more}))
    after = compiled_kernels()
    check.expect(before == after, f"{after - before if before is not None else 0} kernels compiled for 2 new "
                                  f"token counts ({before} before)")


ORACLES = (("scaling form (float64)", "small", scaling_form),)
PROPERTIES = (("adding a constant to a row leaves the output unchanged", _ALL, row_shift),
              ("a new token count compiles no new kernel", _ALL, one_compilation))
FINITE_DIFFERENCES = _ALL
ADVERSARIAL = (
    ("n = 12 (not a power of two)", {"problem": {"n": 12}}, "reference"),
    ("n = 1", {"problem": {"n": 1}}, "reference"),
    ("logits of +-1e4", {"x": lambda x: x * 1e4}, "reference"),
    ("-inf entries", {"x": lambda x: x.index_fill(-1, torch.tensor([0]), -math.inf)}, "reference"),
    ("iters = 20", {"problem": {"iters": 20}}, "reference"),
)
STANDARD_BAD_INPUTS = dict(tensors=("x",), counts={"iters": 1})
BAD_INPUTS = (("x", "not square", lambda c: c.kwargs["x"][..., :-1]),
              ("eps", "negative", -1.0))
BATCH_ITEMS = (("a token", _ALL, {"x": 0, "out": 0, "grad_x": 0}),)
