"""The exact backend's routes (``EXACT_TREE``): a part of :mod:`provable_kernels.semicrf.family`. A case holds the
arguments of ``SemiMarkov(semiring).logpartition`` / ``.marginals``: ``semiring`` (an instance), ``edge`` (B, T, K,
C, C) built by ``edges_from_streaming`` from random streaming parameters (the pair ``(edge_p, edge_q)`` for
cross-entropy and KL; counting takes the weights ``exp(edge)``) and ``lengths``. Outputs: ``value`` ((B,), (k, B)
for KMax) or ``marginals``. The reference enumerates every segmentation scored from the edges; the oracle scores
them from the streaming parameters by the convention, which also checks ``edges_from_streaming``.
"""
import functools
import math
from typing import Any

import torch

from provable_kernels.semicrf import semiring as semirings
from provable_kernels.semicrf import oracle
from provable_kernels.semicrf.exact import EXACT_TREE as TREE
from provable_kernels.semicrf.exact import SemiMarkov, edges_from_streaming
from provable_kernels.semicrf.family import _ALL_LENGTHS_1, _K_ABOVE_T, _LENGTH, inputs, small_example

_ROUTES, _MARGINALS = "semicrf.exact.*", "semicrf.exact.marginals.*"
_LOGPARTITION = tuple(route.id for route, path in TREE.paths() if path[0][1] == "logpartition")
_PAIRS = ("semicrf.exact.cross_entropy", "semicrf.exact.kl_divergence")
_SINGLE = tuple(r for r in _LOGPARTITION if r not in _PAIRS) + (_MARGINALS,)
_KMAX = 3
_SEMIRINGS = {"log": semirings.Log, "max": semirings.Max, "counting": semirings.Counting, "entropy": semirings.Entropy,
             "cross_entropy": semirings.CrossEntropy, "kl_divergence": semirings.KLDivergence,
             "kmax": lambda: semirings.KMax(_KMAX)}
_MODEL = dict(transition_3d=True, proj_start=True, proj_end=True)  # the streaming parameters the edges come from
SIZES = {"small": dict(B=2, T=5, K=3, C=2, lengths=(5, 3), **_MODEL), "tiny": dict(B=2, T=4, K=2, C=2, lengths=(4, 2),
                                                                                  **_MODEL)}


def _entry(method: str):
    """``SemiMarkov(semiring).<method>(edge, lengths)``; unwraps to the method, whose source the traces show."""
    def entry(semiring: Any, edge: Any, lengths: torch.Tensor) -> torch.Tensor:
        return getattr(SemiMarkov(semiring), method)(edge, lengths)

    return functools.update_wrapper(entry, getattr(SemiMarkov, method))


ENTRY_POINTS = {f"SemiMarkov.{method}": _entry(method) for method in ("logpartition", "marginals")}


def _parameters(p: Any, pair: bool) -> list[dict]:
    """The streaming parameters of the edges of problem ``p`` (two sets for a pair), float64, from its seed."""
    gen = torch.Generator().manual_seed(p.seed)
    return [{n: x for n, x in inputs(p, gen).items() if n not in ("lengths", "K")} for _ in range(1 + pair)]


def case(route_id: str, p: Any, gen: torch.Generator, device: torch.device) -> tuple:
    name = route_id.rsplit(".", 1)[1]
    edges = [edges_from_streaming(K=p.K, **q) for q in _parameters(p, route_id in _PAIRS)]
    edge = tuple(edges) if route_id in _PAIRS else edges[0].exp() if name == "counting" else edges[0]
    semiring = semirings.Max if name == "max" else _SEMIRINGS[name]()  # the class itself, as torch-struct writes it
    return f"SemiMarkov.{TREE.path_to(route_id)['method']}", {"semiring": semiring, "edge": edge,
                                                              "lengths": torch.tensor(p.lengths)}, {}


def outputs(result: torch.Tensor, case: Any) -> dict:
    return {"marginals" if case.entry == "SemiMarkov.marginals" else "value": result}


def _enumerated(case: Any, scored: list) -> dict:
    """The route's outputs from the enumerated log-scores (the last list: of q, for the pair semirings)."""
    name = case.route_id.rsplit(".", 1)[1]
    if case.entry == "SemiMarkov.marginals":
        return {"marginals": oracle.edge_marginals(scored[0], case.kwargs["edge"].shape, best_only=name == "max")}
    return {"value": oracle.semiring_value(name, scored[0], scored[-1], _KMAX)}


def reference(kw: dict, case: Any) -> dict:
    """Enumeration of every segmentation scored from the case's edges (counting: from ``log`` of its weights)."""
    edges = list(kw["edge"]) if isinstance(kw["edge"], tuple) else [kw["edge"]]
    edges = [edges[0].log()] if case.route_id.endswith(".counting") else edges
    return _enumerated(case, [oracle.all_scores_from_edges(e, kw["lengths"]) for e in edges])


def from_parameters(kw: dict, case: Any) -> dict:
    """Enumeration of every segmentation scored by the convention from the streaming parameters of the edges
    (``oracle.all_scores``): independent of ``edges_from_streaming`` and of the scan."""
    return _enumerated(case, [oracle.all_scores(lengths=kw["lengths"], K=case.problem.K, **q)
                              for q in _parameters(case.problem, case.route_id in _PAIRS)])


ORACLES = (("enumeration from the streaming parameters", "tiny", from_parameters),)
BATCH_ITEMS = tuple(("a sequence", routes, {"edge": 0, "lengths": 0, "marginals": 0, "value": value_dim})
                    for routes, value_dim in (("semicrf.exact.kmax", 1), (_ROUTES, 0)))  # kmax: value (k, B)


def example(pick: Any) -> dict:
    """``small_example`` of the edges' streaming parameters (:data:`_MODEL`)."""
    return small_example(pick, **_MODEL)


def positions_covered_once(check: Any, case: Any) -> None:
    """Summed over the segments that cover position t, the marginals are 1 for t < L and 0 after."""
    marginals = check.forward(case)["marginals"].double().cpu().sum((3, 4))  # (B, T, K): segment [s, s+d)
    B, T, K = marginals.shape
    covered = torch.zeros(B, T, dtype=torch.float64)
    for s in range(T):
        for d in range(1, min(K, T - s) + 1):
            covered[:, s:s + d] += marginals[:, s, d - 1, None]
    inside = torch.arange(T)[None] < torch.tensor(case.problem.lengths)[:, None]
    check.close("marginal mass covering each position", covered, inside.double())


def counts_allowed(check: Any, case: Any) -> None:
    """With 0/1 weights (some edges forbidden) counting gives the number of allowed segmentations."""
    weights = (case.kwargs["edge"].log() > 0).to(case.dtype)  # about half of the edges allowed
    counted = check.forward(case.with_kwargs(f"{case.description}; 0/1 weights", edge=weights))["value"]
    scored = oracle.all_scores_from_edges(weights.double().log().cpu(), case.kwargs["lengths"].cpu())
    check.close("count of allowed segmentations", counted, oracle.semiring_value("counting", scored))


AGREEMENTS = (("agrees with enumeration from the streaming parameters on random shapes", _ROUTES, from_parameters),)
PROPERTIES = (("marginal mass covers each position once", _MARGINALS, positions_covered_once),
              ("0/1 weights count the allowed segmentations", "semicrf.exact.counting", counts_allowed))


def matches_enumeration(check: Any, case: Any, outputs: dict) -> None:
    """The reference within the dtype's tolerance relative to the size of a path's score."""
    edges = case.kwargs["edge"] if isinstance(case.kwargs["edge"], tuple) else (case.kwargs["edge"],)
    scale = max([float(e[torch.isfinite(e)].abs().max()) for e in edges if torch.isfinite(e).any()] + [0.0])
    tol = check.tolerance
    check.matches_reference(case, outputs, (tol.atol + tol.rtol * scale * case.problem.T, tol.rtol), "enumeration")


def _forbid_sequence(case: Any) -> Any:
    """Every edge of sequence 0 forbidden (log space: -inf; counting: weight 0)."""
    value = 0.0 if case.route_id.endswith(".counting") else -math.inf
    return case.transformed("sequence 0 forbidden", edge=lambda e: e.index_fill(0, torch.tensor([0]), value))


_LOG_SPACE = tuple(r for r in _LOGPARTITION if not r.endswith(".counting")) + (_MARGINALS,)  # counting: exp(edge)
_INF = {"allow_inf": ("value",)}
ADVERSARIAL = (
    ("scores of 1e3", {"problem": {"scale": 1e3}}, matches_enumeration, {"routes": _LOG_SPACE}),
    ("scores of 1e4", {"problem": {"scale": 1e4}}, matches_enumeration,  # the pairs' float32 stops at 1e3: known issue
     {"routes": tuple(r for r in _LOG_SPACE if r not in _PAIRS)}),
    ("every segmentation of a sequence forbidden", _forbid_sequence, None, _INF),
    ("length 1", _ALL_LENGTHS_1, matches_enumeration, _INF),
    ("K > T", _K_ABOVE_T, matches_enumeration))

STANDARD_BAD_INPUTS = (dict(tensors=("edge",), rejects_nan=("edge",), rejects_inf=("edge",), shapes={"edge": (-1,)},
                            routes=_SINGLE),
                       dict(tensors=("lengths",), in_range={"lengths": (1, _LENGTH)}, shapes={"lengths": (0,)}))
_EDGE = lambda c: c.kwargs["edge"]  # noqa: E731
BAD_INPUTS = (
    ("semiring", "the string 'log'", "log"),
    ("semiring", "the base class Semiring()", lambda c: semirings.Semiring(), _LOGPARTITION),
    ("semiring", "the KMax class (k missing)", lambda c: semirings.KMax, _LOGPARTITION),
    ("edge", "4-D", lambda c: _EDGE(c)[0], _SINGLE),
    ("edge", "one tensor, not a pair", lambda c: _EDGE(c)[0], _PAIRS),
    ("edge", "edge[1] of another shape", lambda c: (_EDGE(c)[0], _EDGE(c)[1][:, :-1]), _PAIRS),
    ("edge", "edge[0] with NaN", lambda c: (_EDGE(c)[0].clone().fill_(math.nan), _EDGE(c)[1]), _PAIRS),
    ("semiring", "Entropy() for marginals", lambda c: semirings.Entropy(), _MARGINALS))
