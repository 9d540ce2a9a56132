"""Registration of the exact backend's routes (``EXACT_TREE`` of :mod:`provable_kernels.semicrf.exact`) with
sentinel: part of :mod:`provable_kernels.semicrf.family`, imported by it only.

A case holds the arguments of ``SemiMarkov(semiring).logpartition`` / ``.marginals``: ``semiring`` (an
instance), ``edge`` (B, T, K, C, C), or the pair ``(edge_p, edge_q)`` for cross-entropy and KL, and ``lengths``.
The edges are built by ``edges_from_streaming`` from random streaming parameters (3-D transition, projections),
kept in ``Case.extra`` for the oracle; counting takes the real weights ``exp(edge)``.

Outputs: ``value`` ((B,), (k, B) for KMax) for ``logpartition``; ``marginals`` (B, T, K, C, C) for
``marginals``. The reference enumerates every segmentation scored from the edges; the oracle enumerates them
scored from the streaming parameters by the convention (``oracle.all_scores``), which also checks
``edges_from_streaming``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from hypothesis import strategies as st

from provable_kernels import semiring as semirings
from provable_kernels.semicrf import oracle
from provable_kernels.semicrf.exact import EXACT_TREE, SemiMarkov, edges_from_streaming
from provable_kernels.semicrf.family_tolerances import TOLERANCES
from kernel_sentinel import cases
from kernel_sentinel.checks import expect_close, run_route
from kernel_sentinel.family import Adversarial, BadInput, Case, Oracle, Outputs, Property, Tolerance

ROUTES = ("semicrf.exact.*",)
MARGINALS = ("semicrf.exact.marginals.*",)
LOGPARTITION = tuple(route.id for route, path in EXACT_TREE.paths() if path[0][1] == "logpartition")
PAIRS = ("semicrf.exact.cross_entropy", "semicrf.exact.kl_divergence")
KMAX = 3
SEMIRINGS: dict[str, Callable[[], semirings.Semiring]] = {
    "log": semirings.Log, "max": semirings.Max, "counting": semirings.Counting, "entropy": semirings.Entropy,
    "cross_entropy": semirings.CrossEntropy, "kl_divergence": semirings.KLDivergence,
    "kmax": lambda: semirings.KMax(KMAX)}


@dataclass(frozen=True)
class EdgeShape:
    """An exact-backend problem: sizes, lengths, the seed and the scale of the streaming parameters."""

    B: int
    T: int
    K: int
    C: int
    lengths: tuple[int, ...]
    seed: int = 0
    scale: float = 1.0


SIZES = {"small": EdgeShape(B=2, T=5, K=3, C=2, lengths=(5, 3)),
         "tiny": EdgeShape(B=2, T=4, K=2, C=2, lengths=(4, 2))}


def _parameters(shape: EdgeShape, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random float64 streaming parameters: scores ~ N(0, scale) summed into cum_scores, the rest ~ N(0, 0.5)."""
    B, T, K, C = shape.B, shape.T, shape.K, shape.C
    scores = shape.scale * torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    normal = lambda *size: 0.5 * torch.randn(*size, generator=gen, dtype=torch.float64)  # noqa: E731
    return {"cum_scores": torch.cat([scores.new_zeros(B, 1, C), scores.cumsum(1)], 1), "transition": normal(K, C, C),
            "duration_bias": normal(K, C), "proj_start": normal(B, T, C), "proj_end": normal(B, T, C)}


def _edge(parameters: dict[str, torch.Tensor], K: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    p = {n: x.to(device, dtype) for n, x in parameters.items()}
    return edges_from_streaming(p["cum_scores"], p["transition"], p["duration_bias"], K, p["proj_start"],
                                p["proj_end"]).detach()


def make_case_for(route_id: str, shape: EdgeShape, dtype: torch.dtype, device: torch.device) -> Case:
    """A case of ``shape`` that ``EXACT_TREE`` routes to ``route_id``."""
    path = EXACT_TREE.path_to(route_id)
    method, name = path["method"], route_id.rsplit(".", 1)[1]
    gen = torch.Generator().manual_seed(shape.seed)
    params = [_parameters(shape, gen) for _ in range(2 if route_id in PAIRS else 1)]
    edges = [_edge(p, shape.K, dtype, device) for p in params]
    edge: Any = tuple(edges) if route_id in PAIRS else edges[0].exp() if name == "counting" else edges[0]
    semiring = semirings.Max if name == "max" else SEMIRINGS[name]()  # the class itself, as torch-struct writes it
    kwargs = {"semiring": semiring, "edge": edge,
              "lengths": torch.tensor(shape.lengths, dtype=torch.int64, device=device)}
    entry = f"SemiMarkov.{method}"
    text = f"{entry} {name} {shape} {str(dtype).removeprefix('torch.')} on {device}"
    return Case(route_id, entry, kwargs, text, {}, {"shape": shape, "parameters": params, "dtype": dtype})


BATCH_ITEMS = tuple(cases.batch_along("a sequence", routes,
                                      {"edge": 0, "lengths": 0, "marginals": 0, "value": value_dim})
                    for routes, value_dim in ((("semicrf.exact.kmax",), 1), (ROUTES, 0)))  # kmax: value (k, B)


def make_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    return make_case_for(route_id, dataclasses.replace(SIZES[size], seed=seed), dtype, device)


def _entry(method: str) -> Callable[..., Any]:
    """``SemiMarkov(semiring).<method>(edge, lengths)`` on a case's arguments; unwraps (``__wrapped__``) to the
    method, whose source the traces show."""
    def entry(semiring: Any, edge: Any, lengths: Any) -> torch.Tensor:
        return getattr(SemiMarkov(semiring), method)(edge, lengths)

    return functools.update_wrapper(entry, getattr(SemiMarkov, method))


ENTRY_POINTS = {f"SemiMarkov.{method}": _entry(method) for method in ("logpartition", "marginals")}


def run(case: Case) -> Outputs:
    """The case's method with its arguments: ``value``, or ``marginals``."""
    out = ENTRY_POINTS[case.entry](**case.kwargs)
    return {"marginals" if case.entry == "SemiMarkov.marginals" else "value": out}


# ---------------------------------------------------------------------------------------------- references


def _edge_marginals(scored: list, like: torch.Tensor, best_only: bool) -> torch.Tensor:
    """P(segment (s, d, c) entered from c_prev) (the first segment from row 0), (B, T, K, C, C) float64; with
    ``best_only`` the indicator of the best segmentation."""
    out = torch.zeros(like.shape, dtype=torch.float64)
    for b, items in enumerate(scored):
        top = oracle.best([items])[0][0]
        weights = [float(y == top) for y, _ in items] if best_only else oracle.probabilities(items)
        for (y, _), p in zip(items, weights):
            prev = 0
            for s, d, c in y:
                out[b, s, d - 1, prev, c] += p
                prev = c
    return out


def _expected_log_q(scored: list[list], scored_q: list[list]) -> list[tuple[float, float]]:
    """Per sequence, ``(E_p[log p(y)], E_p[log q(y)])`` with log-probabilities as score minus log Z (no log of an
    underflowed probability)."""
    out = []
    for items_p, items_q in zip(scored, scored_q):
        log_zp, log_zq = oracle.logsumexp([s for _, s in items_p]), oracle.logsumexp([s for _, s in items_q])
        p = oracle.probabilities(items_p)
        out.append((math.fsum(pi * (sp - log_zp) for pi, (_, sp) in zip(p, items_p) if pi > 0),
                    math.fsum(pi * (sq - log_zq) for pi, (_, sq) in zip(p, items_q) if pi > 0)))
    return out


def _enumerated(case: Case, scored: list[list], scored_q: list[list]) -> Outputs:
    """Every route's output from enumerated log-scores of the segmentations (``scored_q``: of the second
    distribution, for the pair semirings)."""
    name = case.route_id.rsplit(".", 1)[1]
    if case.entry == "SemiMarkov.marginals":
        return {"marginals": _edge_marginals(scored, case.kwargs["edge"], best_only=name == "max")}
    values: dict[str, Callable[[], Any]] = {
        "log": lambda: oracle.log_partition(scored), "max": lambda: [s for _, s in oracle.best(scored)],
        "counting": lambda: [math.fsum(math.exp(s) for _, s in items) for items in scored],
        "entropy": lambda: oracle.entropy(scored),
        "cross_entropy": lambda: [-log_q for _, log_q in _expected_log_q(scored, scored_q)],
        "kl_divergence": lambda: [log_p - log_q for log_p, log_q in _expected_log_q(scored, scored_q)],
        "kmax": lambda: [list(row) for row in zip(*oracle.top_k(scored, KMAX))]}
    return {"value": torch.tensor(values[name](), dtype=torch.float64)}


def reference(case: Case) -> Outputs:
    """Enumeration of every segmentation scored from the case's edges (``oracle.all_scores_from_edges``, float64;
    counting from ``log`` of its weights)."""
    kw = cases.float64_cpu(case.kwargs)
    edges = list(kw["edge"]) if isinstance(kw["edge"], tuple) else [kw["edge"]]
    if case.route_id.endswith(".counting"):
        edges = [edges[0].log()]
    scored = [oracle.all_scores_from_edges(e, kw["lengths"]) for e in edges]
    return _enumerated(case, scored[0], scored[-1])


def from_parameters(case: Case) -> Outputs:
    """Enumeration of every segmentation scored from the streaming parameters the edges were built from (rounded
    to the case's dtype, as the edges were), by the convention (``oracle.all_scores``, float64): independent of
    ``edges_from_streaming`` and of the scan."""
    K, lengths = case.extra["shape"].K, case.kwargs["lengths"].cpu()
    dtype = case.extra["dtype"]
    scored = []
    for p in case.extra["parameters"]:
        p = {n: x.to(dtype).double() for n, x in p.items()}
        scored.append(oracle.all_scores(p["cum_scores"], p["transition"], p["duration_bias"], lengths, K,
                                        p["proj_start"], p["proj_end"]))
    return _enumerated(case, scored[0], scored[-1])


ORACLES = (Oracle("enumeration from the streaming parameters", "tiny", from_parameters, ROUTES),)


# ---------------------------------------------------------------------------------------------- properties


@st.composite
def shapes(draw: Any) -> EdgeShape:
    """Random tiny problems: B <= 2, T <= 4, K <= 3, C <= 2, any lengths."""
    B, T = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    lengths = tuple(draw(st.lists(st.integers(1, T), min_size=B, max_size=B)))
    return EdgeShape(B, T, draw(st.integers(1, 3)), draw(st.integers(1, 2)), lengths, draw(st.integers(0, 2**16)))


def tolerance(dtype: torch.dtype) -> Tolerance:
    """The family's tolerance for ``dtype``."""
    return TOLERANCES[dtype]


def prop_matches_enumeration(route_id: str, shape: EdgeShape, device: torch.device, dtype: torch.dtype) -> None:
    case = make_case_for(route_id, shape, dtype, device)
    got = run_route(run, case)
    for name, want in from_parameters(case).items():
        expect_close(f"{name} vs enumeration", got[name], want, tolerance(dtype))


def prop_positions_covered_once(route_id: str, shape: EdgeShape, device: torch.device, dtype: torch.dtype) -> None:
    """Summed over the segments that cover position t, the marginals are 1 for t < L and 0 after."""
    case = make_case_for(route_id, shape, dtype, device)
    marginals = run_route(run, case)["marginals"].double().sum((3, 4))  # (B, T, K): segment [s, s+d)
    B, T, K = marginals.shape
    covered = torch.zeros(B, T, dtype=torch.float64)
    for s in range(T):
        for d in range(1, min(K, T - s) + 1):
            covered[:, s:s + d] += marginals[:, s, d - 1, None].cpu()
    inside = torch.arange(T)[None] < torch.tensor(shape.lengths)[:, None]
    expect_close("marginal mass covering each position", covered, inside.double(), tolerance(dtype))


def prop_counts_allowed(route_id: str, shape: EdgeShape, device: torch.device, dtype: torch.dtype) -> None:
    """With 0/1 weights (some edges forbidden) counting gives the number of allowed segmentations."""
    case = make_case_for(route_id, shape, dtype, device)
    weights = (case.kwargs["edge"].log() > 0).to(dtype)  # about half of the edges allowed
    counted = run_route(run, case.with_kwargs(f"{case.description}; 0/1 weights", edge=weights))["value"]
    scored = oracle.all_scores_from_edges(weights.double().log().cpu(), case.kwargs["lengths"].cpu())
    want = torch.tensor([sum(math.isfinite(s) for _, s in items) for items in scored], dtype=torch.float64)
    expect_close("count of allowed segmentations", counted, want, tolerance(dtype))


PROPERTIES = (
    Property("agrees with enumeration from the streaming parameters on random shapes", ROUTES, shapes,
             prop_matches_enumeration),
    Property("marginal mass covers each position once", MARGINALS, shapes, prop_positions_covered_once),
    Property("0/1 weights count the allowed segmentations", ("semicrf.exact.counting",), shapes,
             prop_counts_allowed),
)


# ------------------------------------------------------------------------------------------- guards, bad input


def _rebuilt(case: Case, **changes: Any) -> Case:
    x = case.kwargs["lengths"]
    return make_case_for(case.route_id, dataclasses.replace(case.extra["shape"], **changes), case.extra["dtype"],
                         x.device)


def expect_reference(case: Case, outputs: Outputs) -> None:
    """Outputs equal the reference within the dtype's tolerance relative to the size of a path's score."""
    tol = tolerance(case.extra["dtype"])
    edges = case.kwargs["edge"] if isinstance(case.kwargs["edge"], tuple) else (case.kwargs["edge"],)
    finite = [e[torch.isfinite(e)].abs() for e in edges]
    scale = max(float(f.max()) if f.numel() else 0.0 for f in finite) * case.extra["shape"].T
    scaled = Tolerance(tol.atol + tol.rtol * scale, tol.rtol)
    for name, want in reference(case).items():
        expect_close(f"{name} vs enumeration", outputs[name], want, scaled)


def _forbid_sequence(case: Case) -> Case:
    """Every edge of sequence 0 forbidden (log space: -inf; counting: weight 0)."""
    def forbid(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().clone()
        x[0] = 0.0 if case.route_id.endswith(".counting") else -math.inf
        return x

    edge = case.kwargs["edge"]
    new = tuple(forbid(e) for e in edge) if isinstance(edge, tuple) else forbid(edge)
    return case.with_kwargs(f"{case.description}; sequence 0 forbidden", edge=new)


LOG_SPACE = tuple(r for r in (*LOGPARTITION, *MARGINALS) if not r.endswith(".counting"))  # counting: exp(edge)
ADVERSARIAL = (
    Adversarial("scores of 1e3", LOG_SPACE, lambda c: _rebuilt(c, scale=1e3), expect=expect_reference),
    Adversarial("scores of 1e4", tuple(r for r in LOG_SPACE if r not in PAIRS), lambda c: _rebuilt(c, scale=1e4),
                expect=expect_reference),  # pairs in float32 at 1e4: see KNOWN_ISSUES
    Adversarial("every segmentation of a sequence forbidden", ROUTES, _forbid_sequence,
                allow_inf=("value",)),
    Adversarial("length 1", ROUTES, lambda c: _rebuilt(c, lengths=(1,) * c.extra["shape"].B), allow_inf=("value",),
                expect=expect_reference),
    Adversarial("K > T", ROUTES, lambda c: _rebuilt(c, K=c.extra["shape"].T + 2), expect=expect_reference),
)


def _bad(argument: str, what: str, routes: tuple[str, ...], fn: Callable[[Case], Any]) -> BadInput:
    return BadInput(argument, what, routes, lambda c: cases.replace_argument(c, argument, fn(c), what))


SINGLE = tuple(r for r in LOGPARTITION if r not in PAIRS) + MARGINALS
BAD_INPUTS = (cases.standard_bad_inputs(SINGLE, ("edge",), rejects_nan=("edge",), rejects_inf=("edge",))
              + cases.standard_bad_inputs(ROUTES, ("lengths",)) + (
    _bad("semiring", "the string 'log'", ROUTES, lambda c: "log"),
    _bad("semiring", "the base class Semiring()", LOGPARTITION, lambda c: semirings.Semiring()),
    _bad("semiring", "the KMax class (k missing)", LOGPARTITION, lambda c: semirings.KMax),
    _bad("edge", "4-D", SINGLE, lambda c: c.kwargs["edge"][0]),
    _bad("edge", "shape (B, T, K, C, C+1)", SINGLE, lambda c: torch.cat([c.kwargs["edge"], c.kwargs["edge"][..., :1]],
                                                                       -1)),
    _bad("lengths", "0", ROUTES, lambda c: torch.zeros_like(c.kwargs["lengths"])),
    _bad("lengths", "T + 1", ROUTES, lambda c: c.kwargs["lengths"] + c.extra["shape"].T),
    _bad("edge", "one tensor, not a pair", PAIRS, lambda c: c.kwargs["edge"][0]),
    _bad("edge", "edge[1] of another shape", PAIRS, lambda c: (c.kwargs["edge"][0], c.kwargs["edge"][1][:, :-1])),
    _bad("edge", "edge[0] with NaN", PAIRS, lambda c: (c.kwargs["edge"][0].clone().fill_(math.nan),
                                                       c.kwargs["edge"][1])),
    _bad("semiring", "Entropy() for marginals", MARGINALS, lambda c: semirings.Entropy()),
))


KNOWN_ISSUES = (
    "The exact backend's cross-entropy and KL semirings in float32 lose accuracy at scores of 1e4 (about 3e-4 "
    "relative against the float64 enumeration): their verification stops at scores of 1e3; use float64 there.",
)
