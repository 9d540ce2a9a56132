"""Registration of the semi-CRF family with sentinel: cases per route, the float64 reference and the oracles
(from :mod:`provable_kernels.semicrf.oracle`), tolerances, properties, guards, bad inputs, invariants. Only
:mod:`kernel_sentinel.registry` imports this module.

Outputs of a route, by name: partition routes give ``value`` (B,) and, for ``train`` routes, ``grad_<input>``
for each of the five tensors present (weights ``Case.upstream["value"]``, one per sequence); Viterbi routes give
``score`` (B,), ``labels`` (B, T) (-1 past each length) and ``starts`` (B, T).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from hypothesis import strategies as st

import provable_kernels.semicrf as package
from provable_kernels import semiring as semirings
from provable_kernels.semicrf import autograd
from provable_kernels.semicrf import reference as torch_ops
from kernel_sentinel.oracles import semicrf as oracle
from provable_kernels.semicrf.dispatch import make_call
from provable_kernels.semicrf.dispatch import TREE, semi_crf_streaming_forward, semi_crf_viterbi
from provable_kernels.semicrf.exact import SemiMarkov, edges_from_streaming
from provable_kernels.semicrf.triton_forward import _safe as safe_logsumexp
from kernel_sentinel import cases
from kernel_sentinel.checks import expect, expect_close, run_route
from kernel_sentinel.family import Adversarial, BadInput, Case, Family, Guard, Invariant, Oracle, Outputs, Property
from kernel_sentinel.family import Tolerance

TENSORS = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
ENTRY_POINTS = {"partition": semi_crf_streaming_forward, "viterbi": semi_crf_viterbi}  # by the tree's op
ENTRIES = {f.__name__: f for f in ENTRY_POINTS.values()}
VITERBI = semi_crf_viterbi.__name__
TOLERANCES = {torch.float32: Tolerance(atol=1e-5, rtol=1e-5), torch.float64: Tolerance(atol=1e-9, rtol=1e-9)}


@dataclass(frozen=True)
class CaseShape:
    """The problem of a case: sizes, per-sequence lengths, which optional inputs exist, the seed of its values."""

    B: int
    T: int
    K: int
    C: int
    lengths: tuple[int, ...]
    transition_3d: bool
    proj_start: bool
    proj_end: bool
    seed: int = 0


# One 2-D and one 3-D transition: the default run checks both against the references and oracles; --quick (all
# tiny) sees 2-D transitions in the properties' random shapes and the 2-D guard only.
SIZES = {
    "small": CaseShape(B=3, T=12, K=4, C=3, lengths=(12, 7, 1), transition_3d=False, proj_start=True, proj_end=True),
    "tiny": CaseShape(B=2, T=5, K=3, C=2, lengths=(5, 3), transition_3d=True, proj_start=True, proj_end=True),
}


def inputs(shape: CaseShape, dtype: torch.dtype, device: torch.device, grad: bool) -> dict[str, Any]:
    """Random inputs of ``shape`` (tensors require grad when ``grad``): per-position scores ~ N(0, 1) summed into
    ``cum_scores`` (zero first row), transitions, duration biases and projections ~ N(0, 0.5)."""
    gen = torch.Generator().manual_seed(shape.seed)
    B, T, K, C = shape.B, shape.T, shape.K, shape.C

    def normal(*size: int, scale: float = 0.5) -> torch.Tensor:
        return scale * torch.randn(*size, generator=gen, dtype=torch.float64)

    scores = normal(B, T, C, scale=1.0)
    tensors = {
        "cum_scores": torch.cat([scores.new_zeros(B, 1, C), scores.cumsum(1)], 1),
        "transition": normal(K, C, C) if shape.transition_3d else normal(C, C),
        "duration_bias": normal(K, C),
        "proj_start": normal(B, T, C) if shape.proj_start else None,
        "proj_end": normal(B, T, C) if shape.proj_end else None,
    }
    out: dict[str, Any] = {name: None if x is None else x.to(device, dtype).requires_grad_(grad)
                           for name, x in tensors.items()}
    out["lengths"] = torch.tensor(shape.lengths, dtype=torch.int64, device=device)
    out["K"] = K
    return out


def make_case_for(route_id: str, shape: CaseShape, dtype: torch.dtype, device: torch.device,
                  weights: Optional[torch.Tensor] = None) -> Case:
    """A case of ``shape`` that the tree routes to ``route_id``: entry point, ``use_triton``, semiring and
    ``requires_grad`` follow the route's path; partition cases weigh sequence b's value by ``weights[b]``
    (default: random)."""
    path = TREE.path_to(route_id)
    op = path["op"]
    kwargs = inputs(shape, dtype, device, grad=path.get("grad") == "train")
    kwargs["use_triton"] = path["backend"] == "triton"
    upstream = {}
    if op == "partition":
        kwargs["semiring"] = path["semiring"]
        if weights is None:
            weights = torch.randn(shape.B, generator=torch.Generator().manual_seed(shape.seed + 1), dtype=torch.float64)
        upstream = {"value": weights.to(device, dtype)}
    return Case(route_id, ENTRY_POINTS[op].__name__, kwargs, f"{shape} {str(dtype).replace('torch.', '')} on {device}",
                upstream, {"shape": shape})


def make_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    return make_case_for(route_id, dataclasses.replace(SIZES[size], seed=seed), dtype, device)


def viterbi_outputs(scores: torch.Tensor, labels: torch.Tensor, starts: torch.Tensor) -> Outputs:
    return {"score": scores.detach(), "labels": labels, "starts": starts.long()}


def _value(outputs: Outputs) -> torch.Tensor:
    """The partition value, or the Viterbi score."""
    return outputs["value"] if "value" in outputs else outputs["score"]


def run(case: Case) -> Outputs:
    """Call the route's entry point with the case's arguments as they are; backward for training routes."""
    result = ENTRIES[case.entry](**case.kwargs)
    if case.entry == VITERBI:
        return viterbi_outputs(result.scores, *result.padded(case.kwargs["cum_scores"].shape[1] - 1))
    return cases.outputs_and_gradients({"value": result}, case)


def forward_only(case: Case) -> Outputs:
    """The partition value of the route, without running backward."""
    return {"value": ENTRIES[case.entry](**case.kwargs)}


# ---------------------------------------------------------------------------------------------- references


def _arguments(kw: dict[str, Any]) -> tuple:
    return kw["cum_scores"], kw["transition"], kw["duration_bias"], kw["lengths"], kw["K"]


def _projections(kw: dict[str, Any]) -> tuple:
    return kw["proj_start"], kw["proj_end"]


def reference(case: Case) -> Outputs:
    """The independent float64 reference ``oracle.naive_partition`` (the plain recursion keeping every alpha) on
    float64 copies of the inputs, gradients by torch autograd. Viterbi routes: the best score, and the path read
    off the gradient of the best score w.r.t. ``proj_start`` (a zero one when absent): 1 exactly at the
    (start, label) of each best segment (a tie fails loudly)."""
    kw = cases.float64_leaves(case.kwargs)
    with torch.enable_grad():
        if case.entry != VITERBI:
            value = oracle.naive_partition(*_arguments(kw), kw["semiring"], *_projections(kw))
            return cases.outputs_and_gradients({"value": value}, case, kw)
        given = kw["proj_start"]
        leaf = (torch.zeros_like(kw["cum_scores"][:, 1:]) if given is None else given.detach()).requires_grad_(True)
        best = oracle.naive_partition(*_arguments(kw), "max", leaf, kw["proj_end"])
        (starts,) = torch.autograd.grad(best.sum(), leaf)
    segments = oracle.segments_from_starts(starts, kw["lengths"].tolist())
    return viterbi_outputs(best, *oracle.path_tensors(segments, kw["cum_scores"].shape[1] - 1))


def exact_backend(case: Case) -> Outputs:
    """``SemiMarkov(Log or Max).logpartition`` on ``edges_from_streaming`` of float64 copies; gradients by
    autograd through both; the Viterbi path from the Max marginals (the indicator of the best segmentation; a tie
    fails loudly)."""
    kw = cases.float64_leaves(case.kwargs)
    lengths, K = kw["lengths"], kw["K"]
    with torch.enable_grad():
        edge = edges_from_streaming(kw["cum_scores"], kw["transition"], kw["duration_bias"], K, *_projections(kw))
        if case.entry == VITERBI:
            best = SemiMarkov(semirings.Max())
            segments = oracle.segments_from_edge_indicator(best.marginals(edge, lengths))
            return viterbi_outputs(best.logpartition(edge, lengths), *oracle.path_tensors(segments, edge.shape[1]))
        value = SemiMarkov(semirings.Log() if kw["semiring"] == "log" else semirings.Max()).logpartition(edge, lengths)
        return cases.outputs_and_gradients({"value": value}, case, kw)


def brute_force(case: Case) -> Outputs:
    """Enumerate every segmentation (``oracle.all_scores``), score each from the convention, and take logsumexp /
    max; gradients as expectations of each segmentation's feature counts under the Gibbs distribution (log) or
    at the best segmentation (max). Plain Python float64."""
    kw = cases.float64_cpu(case.kwargs)
    scored = oracle.all_scores(*_arguments(kw), *_projections(kw))
    T = kw["cum_scores"].shape[1] - 1
    if case.entry == VITERBI:
        best = oracle.best(scored)
        scores = torch.tensor([s for _, s in best], dtype=torch.float64)
        return viterbi_outputs(scores, *oracle.path_tensors([list(y) for y, _ in best], T))
    log = kw["semiring"] == "log"
    value = oracle.log_partition(scored) if log else [s for _, s in oracle.best(scored)]
    out: dict[str, torch.Tensor] = {"value": torch.tensor(value, dtype=torch.float64)}
    if not case.kwargs["cum_scores"].requires_grad:
        return out
    tensors = {n: kw[n] for n in TENSORS if kw[n] is not None}
    weights = case.upstream["value"].double().tolist()
    return {**out, **oracle.feature_gradients(scored, tensors, weights, kw["semiring"])}


# ---------------------------------------------------------------------------------------------- properties


@st.composite
def shapes(draw: Any, K: Optional[int] = None, projections: Optional[bool] = None) -> CaseShape:
    """Random small shapes: B <= 3, T <= 8, K <= 5 (K > T included), C <= 3, any lengths, 2-D or 3-D
    transitions, projections on or off; ``K``/``projections`` fix those."""
    B, T, C = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 3))
    K = K or draw(st.integers(1, 5))
    lengths = tuple(draw(st.lists(st.integers(1, T), min_size=B, max_size=B)))
    proj = [projections] * 2 if projections is not None else [draw(st.booleans()), draw(st.booleans())]
    return CaseShape(B, T, K, C, lengths, draw(st.booleans()), proj[0], proj[1], draw(st.integers(0, 2**16)))


def _route_run(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype,
               weights: Optional[torch.Tensor] = None, gradients: bool = False) -> tuple[Case, Outputs]:
    """Run the route under test on a case of ``shape`` in ``dtype`` (the dispatcher must record it); partition
    routes run backward only when the property needs ``gradients``."""
    case = make_case_for(route_id, shape, dtype, device, weights)
    return case, run_route(run if gradients or case.entry == VITERBI else forward_only, case)


def _sibling(case: Case) -> dict[str, Any]:
    """The case's arguments detached and without ``semiring``, for a call to the Viterbi entry point."""
    return {n: (x.detach() if isinstance(x, torch.Tensor) else x) for n, x in case.kwargs.items() if n != "semiring"}


def prop_logz_above_best(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    case, out = _route_run(route_id, shape, device, dtype)
    best, tol = semi_crf_viterbi(**_sibling(case)).scores, TOLERANCES[dtype]
    expect(bool((out["value"].detach() >= best - tol.atol - tol.rtol * best.abs()).all()),
           f"logZ {out['value'].tolist()} below the Viterbi score {best.tolist()}")


def prop_max_is_viterbi(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    case, out = _route_run(route_id, shape, device, dtype)
    expect_close("max vs Viterbi score", out["value"], semi_crf_viterbi(**_sibling(case)).scores, TOLERANCES[dtype])


def prop_linear_chain(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    case, out = _route_run(route_id, shape, device, dtype)
    kw = cases.float64_cpu(case.kwargs)
    want = oracle.linear_chain(*_arguments(kw)[:4], kw.get("semiring", "max"), *_projections(kw))
    expect_close("K=1 vs linear-chain CRF", _value(out), want, TOLERANCES[dtype])


def prop_exact_agreement(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    case, out = _route_run(route_id, shape, device, dtype)
    expect_close("value vs exact backend", out["value"], exact_backend(case)["value"], TOLERANCES[dtype])


def prop_cum_gradient_sums_to_zero(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    _, out = _route_run(route_id, shape, device, dtype, gradients=True)
    total = out["grad_cum_scores"].sum(1)  # (B, C): every segment adds +1 at its end and -1 at its start
    expect_close("sum over t of d/d cum_scores", total, torch.zeros_like(total), TOLERANCES[dtype])


def prop_marginals(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    """With unit weights, d logZ / d proj_start and d proj_end are start / end marginals: in [0, 1], and every
    position t < L lies in exactly one segment in expectation: sum_{s<=t} starts(s) - sum_{e<t} ends(e) = 1."""
    _, out = _route_run(route_id, shape, device, dtype, torch.ones(shape.B, dtype=torch.float64), gradients=True)
    tol = TOLERANCES[dtype]
    starts, ends = out["grad_proj_start"], out["grad_proj_end"]
    for name, m in (("start", starts), ("end", ends)):
        expect(bool(((m >= -tol.atol) & (m <= 1 + tol.atol)).all()),
               f"{name} marginals outside [0, 1]: min {float(m.min())}, max {float(m.max())}")
    opened = starts.sum(2).cumsum(1)
    closed = torch.cat([torch.zeros_like(opened[:, :1]), ends.sum(2).cumsum(1)[:, :-1]], 1)
    inside = torch.arange(shape.T, device=device)[None] < torch.tensor(shape.lengths, device=device)[:, None]
    expect_close("segments covering each position", opened - closed, inside.to(opened.dtype), tol)


def prop_viterbi_path(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    """The decoded segments tile [0, L) with durations 1..K, their score computed by the brute-force oracle's
    scorer equals the Viterbi score, and that equals the exact backend's best score."""
    case, out = _route_run(route_id, shape, device, dtype)
    kw = cases.float64_cpu(case.kwargs)
    labels, starts = out["labels"].cpu(), out["starts"].cpu().bool()
    scores = []
    for b, L in enumerate(shape.lengths):
        expect(bool((labels[b, L:] == -1).all()) and not bool(starts[b, L:].any()),
               f"sequence {b}: path extends past its length {L}")
        begins = starts[b, :L].nonzero().flatten().tolist()
        expect(begins[:1] == [0], f"sequence {b}: no segment starts at 0")
        bounds = begins + [L]
        segmentation = tuple((s, e - s, int(labels[b, s])) for s, e in zip(bounds, bounds[1:]))
        for s, d, c in segmentation:
            expect(1 <= d <= shape.K and bool((labels[b, s : s + d] == c).all()),
                   f"sequence {b}: segment ({s}, {d}, {c}) invalid for K = {shape.K}")
        scores.append(oracle.score(segmentation, kw["cum_scores"][b], kw["transition"], kw["duration_bias"],
                                   *(None if p is None else p[b] for p in _projections(kw))))
    tol = TOLERANCES[dtype]
    expect_close("Viterbi score vs score of its segments", out["score"], torch.tensor(scores, dtype=torch.float64), tol)
    expect_close("Viterbi score vs exact backend", out["score"], exact_backend(case)["score"], tol)


PROPERTIES = (
    Property("logZ >= Viterbi score", ("semicrf.*.log.*",), shapes, prop_logz_above_best),
    Property("max route == Viterbi score", ("semicrf.*.max.*",), shapes, prop_max_is_viterbi),
    Property("K = 1 equals a linear-chain CRF", ("semicrf.*",), lambda: shapes(K=1), prop_linear_chain),
    Property("value equals the exact backend on random shapes", ("semicrf.*.log.*", "semicrf.*.max.*"), shapes,
             prop_exact_agreement),
    Property("gradient wrt cum_scores sums to 0 over t per label", ("semicrf.*.train",), shapes,
             prop_cum_gradient_sums_to_zero),
    Property("start/end marginals in [0, 1], each position covered once", ("semicrf.*.log.train",),
             lambda: shapes(projections=True), prop_marginals),
    cases.finite_difference_property(("semicrf.*.train",), shapes,
                                     lambda route_id, shape, device: make_case_for(route_id, shape, torch.float64, device),
                                     run, forward_only),
    Property("Viterbi path is a valid segmentation scoring the Viterbi score", ("semicrf.*.viterbi",), shapes,
             prop_viterbi_path),
)


# ------------------------------------------------------------------------------------------- guards, bad input


def _rebuilt(case: Case, **changes: Any) -> Case:
    """The route's case rebuilt from its shape with ``changes`` (e.g. T, K, lengths)."""
    shape = dataclasses.replace(case.extra["shape"], **changes)
    x = case.kwargs["cum_scores"]
    return make_case_for(case.route_id, shape, x.dtype, x.device)


def expect_neg_inf_iff_longer_than_K(case: Case, outputs: Outputs) -> None:
    """With every transition -inf only one-segment paths remain: -inf exactly where L > K."""
    value, lengths = _value(outputs).cpu(), case.kwargs["lengths"].cpu()
    impossible = lengths > case.kwargs["K"]
    expect(bool((value[impossible] == -math.inf).all()) and bool(torch.isfinite(value[~impossible]).all()),
           f"values {value.tolist()} for lengths {lengths.tolist()}: want -inf exactly where L > K")


def _all_neg_inf(case: Case) -> Case:
    return cases.transform_argument(case, "transition", lambda x: x.fill_(-math.inf), "all -inf")


def _nan_at_1(x: torch.Tensor) -> torch.Tensor:
    x[0, 1, 0] = math.nan
    return x


ADVERSARIAL = (
    Adversarial("all transitions -inf", ("semicrf.*",), _all_neg_inf, allow_inf=("value", "score"),
                expect=expect_neg_inf_iff_longer_than_K),
    Adversarial("all transitions -inf, 2-D transition", ("semicrf.*",),
                lambda c: _all_neg_inf(_rebuilt(c, transition_3d=False)), allow_inf=("value", "score"),
                expect=expect_neg_inf_iff_longer_than_K),
    Adversarial("self transitions -inf", ("semicrf.*",), lambda c: cases.transform_argument(
        c, "transition", lambda x: x.masked_fill(torch.eye(x.shape[-1], dtype=torch.bool), -math.inf),
        "diagonal -inf")),
    Adversarial("durations > 1 forbidden (-inf bias)", ("semicrf.*",), lambda c: cases.transform_argument(
        c, "duration_bias", lambda x: torch.cat([x[:1], torch.full_like(x[1:], -math.inf)]), "rows 1: = -inf")),
    Adversarial("scores of 1e4", ("semicrf.*",),
                lambda c: cases.transform_argument(c, "cum_scores", lambda x: x * 1e4, "* 1e4")),
    Adversarial("length 1", ("semicrf.*",), lambda c: _rebuilt(c, lengths=(1,) + c.extra["shape"].lengths[1:])),
    Adversarial("all lengths 1", ("semicrf.*",), lambda c: _rebuilt(c, lengths=(1,) * c.extra["shape"].B)),
    Adversarial("T = 1", ("semicrf.*",), lambda c: _rebuilt(c, T=1, lengths=(1,) * c.extra["shape"].B)),
    Adversarial("K > T", ("semicrf.*",), lambda c: _rebuilt(c, K=c.extra["shape"].T + 2)),
    Adversarial("NaN input", ("semicrf.*",), lambda c: cases.transform_argument(c, "cum_scores", _nan_at_1, "a NaN"),
                errors_ok=True),
)


def _bad(argument: str, what: str, fn: Any, routes: tuple[str, ...] = ("semicrf.*",)) -> BadInput:
    return BadInput(argument, what, routes, lambda c: cases.replace_argument(c, argument, fn(c), what))


def _kw(c: Case, name: str) -> Any:
    return c.kwargs[name].detach()


FLOATS = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
BAD_INPUTS = cases.standard_bad_inputs(
    ("semicrf.*",), FLOATS + ("lengths",), other_device=FLOATS[1:] + ("lengths",), rejects_nan=FLOATS,
    rejects_inf=FLOATS) + (
    _bad("cum_scores", "2-D", lambda c: _kw(c, "cum_scores")[0]),
    _bad("cum_scores", "T = 0", lambda c: _kw(c, "cum_scores")[:, :1]),
    _bad("transition", "shape (C+1, C)", lambda c: _kw(c, "transition").new_zeros(c.extra["shape"].C + 1,
                                                                                   c.extra["shape"].C)),
    _bad("transition", "twice as many rows", lambda c: torch.cat([_kw(c, "transition")] * 2)),
    _bad("transition", "other dtype than cum_scores", lambda c: _kw(c, "transition").double()
         if _kw(c, "transition").dtype == torch.float32 else _kw(c, "transition").float()),
    _bad("duration_bias", "shape (K+1, C)", lambda c: torch.cat([_kw(c, "duration_bias")] * 2)),
    _bad("lengths", "0", lambda c: torch.zeros_like(c.kwargs["lengths"])),
    _bad("lengths", "T + 1", lambda c: torch.full_like(c.kwargs["lengths"], _kw(c, "cum_scores").shape[1])),
    _bad("lengths", "shape (B+1,)", lambda c: torch.cat([c.kwargs["lengths"], c.kwargs["lengths"][:1]])),
    _bad("K", "0", lambda c: 0),
    _bad("K", "a float", lambda c: float(c.kwargs["K"])),
    _bad("semiring", "'sum'", lambda c: "sum", routes=("semicrf.*.log.*", "semicrf.*.max.*")),
    _bad("proj_start", "shape (B, T+1, C)", lambda c: torch.cat([_kw(c, "proj_start"), _kw(c, "proj_start")[:, :1]], 1)),
    _bad("proj_end", "shape (B, T, C+1)", lambda c: torch.cat([_kw(c, "proj_end"), _kw(c, "proj_end")[..., :1]], 2)),
    _bad("use_triton", "a string", lambda c: "yes"),
)


REF, EXACT, HEAD = "tests/test_semicrf_reference.py", "tests/test_semicrf_exact.py", "tests/test_semicrf_head.py"
TRITON = "tests/test_semicrf_triton.py"
INVARIANTS = (
    Invariant("Every route is reached by the dispatcher and passes route, reference, exact, property, guard and "
              "bad-input checks.", "tests/test_verify.py::test_every_semicrf_route_passes_quick"),
    Invariant("logZ and the max score equal brute-force enumeration of every segmentation (durations 1..K, K "
              "inclusive; the first segment pays no transition).", f"{REF}::test_partition_matches_oracle"),
    Invariant("Viterbi returns the brute-force best segmentation; ties prefer the shorter duration, then the "
              "smaller label.", f"{REF}::test_viterbi_ties_prefer_shorter_duration_then_smaller_label"),
    Invariant("The hand-written backward equals autograd of a brute force for all five inputs.",
              f"{REF}::test_log_gradients_match_brute_force"),
    Invariant("The max route's gradient is the indicator of the best path.",
              f"{REF}::test_max_gradients_are_the_best_path_indicator"),
    Invariant("A sequence with no finite segmentation gives -inf and zero gradients, never NaN.",
              f"{REF}::test_impossible_sequence_gives_neg_inf_and_zero_gradients"),
    Invariant("Repeated runs are bitwise identical.", f"{REF}::test_repeated_runs_are_bitwise_identical"),
    Invariant("Float32 inputs at T = 100,000: logZ relative error <= 1e-6 against float64.",
              f"{REF}::test_float32_stays_accurate_at_T_100000"),
    Invariant("One edge convention: edges_from_streaming + SemiMarkov score every segmentation like the streaming "
              "convention.", f"{EXACT}::test_edges_mean_the_streaming_convention"),
    Invariant("The counting semiring counts segmentations exactly.", f"{EXACT}::test_counting_gives_exact_counts"),
    Invariant("The loss is normalised: NLL >= 0 for every gold and exp(-NLL) sums to 1 over all segmentations.",
              f"{HEAD}::test_nll_is_a_normalised_negative_log_likelihood"),
    Invariant("Every wrong argument raises ValueError/TypeError naming it.",
              "tests/test_semicrf_api.py::test_bad_argument_raises_naming_it"),
    Invariant("The Triton backward equals autograd of a brute force for all five inputs.",
              f"{TRITON}::test_log_gradients_against_brute_force"),
    Invariant("Triton gradients are bitwise identical on repeated runs (no atomics on outputs).",
              f"{TRITON}::test_gradients_are_bitwise_deterministic"),
    Invariant("Triton Viterbi follows the reference's tie rule.", f"{TRITON}::test_viterbi_against_oracle_with_ties"),
)

FAMILY = Family(
    name="semicrf",
    package=package,
    tree=TREE,
    entry_points=ENTRIES,
    make_case=make_case,
    run=run,
    reference=reference,
    tolerances=TOLERANCES,
    dtypes=(torch.float32, torch.float64),
    oracles=(Oracle("exact backend", "small", exact_backend), Oracle("brute force", "tiny", brute_force)),
    properties=PROPERTIES,
    adversarial=ADVERSARIAL,
    bad_inputs=BAD_INPUTS,
    invariants=INVARIANTS,
    guards=(
        Guard("Arguments are validated before dispatch: wrong type, rank, shape, dtype or device, lengths outside "
              "1..T, K < 1, NaN/+inf scores raise ValueError/TypeError naming the argument.", make_call),
        Guard("A semiring sum over only -inf terms is -inf with zero gradient, never NaN (the exact backend's "
              "safe logsumexp).", semirings.logsumexp),
        Guard("Triton kernels shift every logsumexp by where(max == -inf, 0, max): a slice of only -inf terms gives "
              "-inf, never NaN.", safe_logsumexp.fn),
        Guard("A sequence with no segmentation of finite score (e.g. every transition -inf and L > K) gets logZ "
              "= -inf and zero gradients in the PyTorch backward.", torch_ops.backward),
        Guard("The max route's gradient is the indicator of the decoded path, zero where the best score is -inf.",
              autograd.max_partition),
    ),
    known_issues=(
        "A sequence with no segmentation of finite score gets -inf (partition and Viterbi score) by design; its "
        "decoded Viterbi segments are then some valid segmentation, not a meaningful one.",
        "The exact backend builds the (B, T, K, C, C) edge tensor: it is for verification and small problems only.",
    ),
)
