"""Registration of the streaming routes (``TREE`` of :mod:`provable_kernels.semicrf.dispatch`) with sentinel: part
of :mod:`provable_kernels.semicrf.family`, imported by it only.

Outputs: partition routes give ``value`` (B,) and, for ``train`` routes, ``grad_<input>`` of each tensor present
(weights ``Case.upstream["value"]`` (B,)); Viterbi routes give ``score`` (B,), ``labels`` (B, T) (-1 past each
length) and ``starts`` (B, T). References: :mod:`provable_kernels.semicrf.oracle`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from hypothesis import strategies as st

from provable_kernels import semiring as semirings
from provable_kernels.semicrf import oracle
from provable_kernels.semicrf.dispatch import TREE, semi_crf_streaming_forward, semi_crf_viterbi
from provable_kernels.semicrf.exact import SemiMarkov, edges_from_streaming
from provable_kernels.semicrf.family_tolerances import TOLERANCES
from kernel_sentinel import cases
from kernel_sentinel.checks import expect, expect_close
from kernel_sentinel.family import Adversarial, BadInput, Case, Oracle, Outputs, Property, Tolerance

TENSORS = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
STREAMING = ("semicrf.triton.*", "semicrf.torch.*")  # TREE's routes; family_head and family_exact register the others
ENTRY_POINTS = {"partition": semi_crf_streaming_forward, "viterbi": semi_crf_viterbi}  # by the tree's op
ENTRIES = {f.__name__: f for f in ENTRY_POINTS.values()}
VITERBI = semi_crf_viterbi.__name__


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


# 2-D transitions, and 3-D ones in the small case of the training routes (make_case): the default run checks both
# against the references and oracles; --quick (all tiny) sees 3-D transitions in the properties' random shapes
# only. The small case reaches every kernel line (`sentinel verify --coverage`): unequal lengths (the outside
# recursion starts at each sequence's own length, and a per-sequence offset error shows only in sequences b >= 1),
# a 3-D transition on the training routes and both projections.
SIZES = {
    "small": CaseShape(B=3, T=20, K=3, C=3, lengths=(20, 13, 1), transition_3d=False, proj_start=True, proj_end=True),
    "tiny": CaseShape(B=2, T=5, K=3, C=2, lengths=(5, 3), transition_3d=False, proj_start=True, proj_end=True),
}


def inputs(shape: CaseShape, dtype: torch.dtype, device: torch.device, grad: bool) -> dict[str, Any]:
    """Random inputs of ``shape`` (tensors require grad when ``grad``): per-position scores ~ N(0, 1) summed into
    ``cum_scores`` (zero first row), transitions, duration biases and projections ~ N(0, 0.5)."""
    gen = torch.Generator().manual_seed(shape.seed)
    B, T, K, C = shape.B, shape.T, shape.K, shape.C

    def normal(*size: int, scale: float = 0.5, present: bool = True) -> Optional[torch.Tensor]:
        x = scale * torch.randn(*size, generator=gen, dtype=torch.float64)
        return x.to(device, dtype).requires_grad_(grad) if present else None

    scores = torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    cum = torch.cat([scores.new_zeros(B, 1, C), scores.cumsum(1)], 1).to(device, dtype).requires_grad_(grad)
    return dict(cum_scores=cum, transition=normal(*((K,) if shape.transition_3d else ()), C, C),
                duration_bias=normal(K, C), proj_start=normal(B, T, C, present=shape.proj_start),
                proj_end=normal(B, T, C, present=shape.proj_end),
                lengths=torch.tensor(shape.lengths, dtype=torch.int64, device=device), K=K)


def make_case_for(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype = torch.float64,
                  weights: Optional[torch.Tensor] = None) -> Case:
    """A case of ``shape`` that the tree routes to ``route_id``: entry point, ``use_triton``, semiring and
    ``requires_grad`` follow the route's path; partition cases weigh sequence b's value by ``weights[b]``
    (default: random)."""
    path = TREE.path_to(route_id)
    kwargs = inputs(shape, dtype, device, grad=path.get("grad") == "train")
    kwargs.update(use_triton=path["backend"] == "triton", **{n: path[n] for n in ("semiring",) if n in path})
    if weights is None:
        weights = torch.randn(shape.B, generator=torch.Generator().manual_seed(shape.seed + 1), dtype=torch.float64)
    upstream = {"value": weights.to(device, dtype)} if path["op"] == "partition" else {}
    return Case(route_id, ENTRY_POINTS[path["op"]].__name__, kwargs,
                f"{shape} {str(dtype).replace('torch.', '')} on {device}", upstream, {"shape": shape})


BATCH_ITEMS = (cases.batch_along(
    "a sequence", STREAMING, dict.fromkeys(("cum_scores", "proj_start", "proj_end", "lengths", "value",
                                            "grad_cum_scores", "grad_proj_start", "grad_proj_end", "score", "labels",
                                            "starts"), 0), summed=("grad_transition", "grad_duration_bias")),)


def make_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    """The route's case of ``size``; the small case of a training route has a 3-D transition (2-D otherwise)."""
    train = size == "small" and TREE.path_to(route_id).get("grad") == "train"
    return make_case_for(route_id, dataclasses.replace(SIZES[size], seed=seed, transition_3d=train), device, dtype)


def viterbi_outputs(scores: torch.Tensor, labels: torch.Tensor, starts: torch.Tensor) -> Outputs:
    return {"score": scores.detach(), "labels": labels, "starts": starts.long()}


def run(case: Case) -> Outputs:
    """Call the route's entry point with the case's arguments as they are; backward for training routes."""
    result = ENTRIES[case.entry](**case.kwargs)
    if case.entry == VITERBI:
        return viterbi_outputs(result.scores, *result.padded(case.kwargs["cum_scores"].shape[1] - 1))
    return cases.outputs_and_gradients({"value": result}, case)


def forward_only(case: Case) -> Outputs:
    """The route's outputs without running backward (the partition value, or the Viterbi outputs)."""
    return run(case) if case.entry == VITERBI else {"value": ENTRIES[case.entry](**case.kwargs)}


# ---------------------------------------------------------------------------------------------- references


def _model(kw: dict[str, Any]) -> dict[str, Any]:
    """The model's keyword arguments (the five tensors, lengths, K), as the oracle functions take them."""
    return {n: kw[n] for n in TENSORS + ("lengths", "K")}


def reference(case: Case) -> Outputs:
    """The independent float64 reference ``oracle.naive_partition`` (the plain recursion keeping every alpha) on
    float64 copies of the inputs, gradients by torch autograd; Viterbi routes: ``oracle.viterbi_by_gradient``."""
    kw = cases.float64_leaves(case.kwargs)
    if case.entry == VITERBI:
        return viterbi_outputs(*oracle.viterbi_by_gradient(**_model(kw)))
    with torch.enable_grad():
        value = oracle.naive_partition(**_model(kw), semiring=kw["semiring"])
    return cases.outputs_and_gradients({"value": value}, case, kw)


def exact_backend(case: Case) -> Outputs:
    """``SemiMarkov(Log or Max).logpartition`` on ``edges_from_streaming`` of float64 copies; gradients by
    autograd through both; the Viterbi path from the Max marginals (a tie fails loudly)."""
    kw, lengths = cases.float64_leaves(case.kwargs), case.kwargs["lengths"]
    with torch.enable_grad():
        edge = edges_from_streaming(**{n: x for n, x in _model(kw).items() if n != "lengths"})
        if case.entry == VITERBI:
            best = SemiMarkov(semirings.Max())
            segments = oracle.segments_from_edge_indicator(best.marginals(edge, lengths))
            return viterbi_outputs(best.logpartition(edge, lengths), *oracle.path_tensors(segments, edge.shape[1]))
        value = SemiMarkov(semirings.Log() if kw["semiring"] == "log" else semirings.Max()).logpartition(edge, lengths)
        return cases.outputs_and_gradients({"value": value}, case, kw)


def brute_force(case: Case) -> Outputs:
    """Enumerate every segmentation (``oracle.all_scores``), score each from the convention, and take logsumexp /
    max; gradients as expectations of each segmentation's feature counts (``oracle.feature_gradients``)."""
    kw = cases.float64_cpu(case.kwargs)
    scored = oracle.all_scores(**_model(kw))
    if case.entry == VITERBI:
        return viterbi_outputs(*oracle.brute_force_viterbi(scored, kw["cum_scores"].shape[1] - 1))
    value = {"value": oracle.brute_force_value(scored, kw["semiring"])}
    if not case.kwargs["cum_scores"].requires_grad:
        return value
    present = {n: kw[n] for n in TENSORS if kw[n] is not None}
    return value | oracle.feature_gradients(scored, present, case.upstream["value"].tolist(), kw["semiring"])


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


def _viterbi_score(case: Case) -> Outputs:
    return {"value": semi_crf_viterbi(**cases.detached(case.kwargs, drop=("semiring",))).scores}


def _linear_chain(case: Case) -> Outputs:
    kw = cases.float64_cpu(case.kwargs)
    value = oracle.linear_chain(**_model(kw), semiring=kw.get("semiring", "max"))
    return {"score" if case.entry == VITERBI else "value": value}


def logz_above_best(case: Case, out: Outputs, tol: Tolerance) -> None:
    value, best = out["value"].detach(), _viterbi_score(case)["value"]
    expect(bool((value >= best - tol.atol - tol.rtol * best.abs()).all()),
           f"logZ {value.tolist()} below the Viterbi score {best.tolist()}")


def cum_gradient_sums_to_zero(case: Case, out: Outputs, tol: Tolerance) -> None:
    total = out["grad_cum_scores"].sum(1)  # (B, C): every segment adds +1 at its end and -1 at its start
    expect_close("sum over t of d/d cum_scores", total, torch.zeros_like(total), tol)


def marginals(case: Case, out: Outputs, tol: Tolerance) -> None:
    """With unit weights, d logZ / d proj_start and d proj_end are start / end marginals: in [0, 1], and every
    position t < L lies in exactly one segment in expectation: sum_{s<=t} starts(s) - sum_{e<t} ends(e) = 1."""
    starts, ends = out["grad_proj_start"], out["grad_proj_end"]
    for name, m in (("start", starts), ("end", ends)):
        expect(bool(((m >= -tol.atol) & (m <= 1 + tol.atol)).all()),
               f"{name} marginals outside [0, 1]: min {float(m.min())}, max {float(m.max())}")
    opened = starts.sum(2).cumsum(1)
    closed = torch.cat([torch.zeros_like(opened[:, :1]), ends.sum(2).cumsum(1)[:, :-1]], 1)
    inside = torch.arange(opened.shape[1], device=opened.device)[None] < case.kwargs["lengths"][:, None]
    expect_close("segments covering each position", opened - closed, inside.to(opened.dtype), tol)


def viterbi_path(case: Case, out: Outputs, tol: Tolerance) -> None:
    """The decoded segments tile [0, L) with durations 1..K, their score computed by the brute-force oracle's
    scorer equals the Viterbi score, and that equals the exact backend's best score."""
    kw = cases.float64_cpu(case.kwargs)
    scores = oracle.path_scores(out["labels"].cpu(), out["starts"].cpu(), **_model(kw))
    expect_close("Viterbi score vs score of its segments", out["score"], scores, tol)
    expect_close("Viterbi score vs exact backend", out["score"], exact_backend(case)["score"], tol)


def _property(name: str, routes: tuple[str, ...], holds: Any, runner: Any = run, example: Any = shapes) -> Property:
    return cases.route_property(name, routes, example, make_case_for, runner, holds, TOLERANCES)


def _agreement(name: str, routes: tuple[str, ...], want: Any, example: Any = shapes) -> Property:
    return cases.agreement_property(name, routes, example, make_case_for, forward_only, want, TOLERANCES)


def _zero_row_held(name: str, direction: torch.Tensor) -> torch.Tensor:
    """A finite-difference direction that keeps the convention ``cum_scores[:, 0] = 0``."""
    if name == "cum_scores":
        direction = direction.clone()
        direction[:, 0] = 0
    return direction


PROPERTIES = (
    _property("logZ >= Viterbi score", ("semicrf.*.log.*",), logz_above_best, forward_only),
    _agreement("max route == Viterbi score", ("semicrf.*.max.*",), _viterbi_score),
    _agreement("K = 1 equals a linear-chain CRF", STREAMING, _linear_chain, lambda: shapes(K=1)),
    _agreement("value equals the exact backend on random shapes", ("semicrf.*.log.*", "semicrf.*.max.*"),
               lambda case: {"value": exact_backend(case)["value"]}),
    _property("gradient wrt cum_scores sums to 0 over t per label", ("semicrf.*.train",), cum_gradient_sums_to_zero),
    cases.route_property("start/end marginals in [0, 1], each position covered once", ("semicrf.*.log.train",),
                         lambda: shapes(projections=True), lambda r, shape, device, dtype: make_case_for(
                             r, shape, device, dtype, torch.ones(shape.B, dtype=torch.float64)), run, marginals,
                         TOLERANCES),
    cases.finite_difference_property(("semicrf.*.train",), shapes, make_case_for, run, forward_only,
                                     pinned=_zero_row_held),
    _property("Viterbi path is a valid segmentation scoring the Viterbi score", ("semicrf.*.viterbi",), viterbi_path),
)


# ------------------------------------------------------------------------------------------- guards, bad input


def _rebuilt(case: Case, **changes: Any) -> Case:
    """The route's case rebuilt from its shape with ``changes`` (e.g. T, K, lengths)."""
    x = case.kwargs["cum_scores"]
    return make_case_for(case.route_id, dataclasses.replace(case.extra["shape"], **changes), x.device, x.dtype)


def expect_neg_inf_iff_longer_than_K(case: Case, outputs: Outputs) -> None:
    """With every transition -inf only one-segment paths remain: -inf exactly where L > K."""
    value, lengths = outputs.get("value", outputs.get("score")).cpu(), case.kwargs["lengths"].cpu()
    impossible = lengths > case.kwargs["K"]
    expect(bool((value[impossible] == -math.inf).all()) and bool(torch.isfinite(value[~impossible]).all()),
           f"values {value.tolist()} for lengths {lengths.tolist()}: want -inf exactly where L > K")


def _transformed(name: str, argument: str, fn: Any, what: str, **options: Any) -> Adversarial:
    return cases.transformed_input(name, STREAMING, argument, fn, what, **options)


def _large(case: Case, scale: float, offset: float) -> Case:
    """Scores, transitions and duration biases times ``scale``; then ``offset`` added per position to every label
    and to every transition, subtracted from every duration bias: every segmentation's score moves by the same
    amount, so the marginals (gradients) stay far from 0/1."""
    def per_position(x: torch.Tensor) -> torch.Tensor:
        return x * scale + offset * torch.arange(x.shape[1], dtype=x.dtype, device=x.device)[None, :, None]

    case = cases.transform_argument(case, "cum_scores", per_position, f"* {scale:g}, + {offset:g} per position")
    case = cases.transform_argument(case, "transition", lambda x: x * scale + offset, f"* {scale:g} + {offset:g}")
    return cases.transform_argument(case, "duration_bias", lambda x: x * scale - offset, f"* {scale:g} - {offset:g}")


LARGE = dict(expect=cases.agrees_with_reference(reference))  # logZ 1e-6, gradients 1e-4: as for O(1) scores


# The Triton kernels reduce durations in chunks of DB rows, DB * CP (2-D) or DB * CP^2 (3-D) <= 4096 elements
# (triton_ops.config; CP = C padded to a power of two): many labels give several chunks per step, merged online.
CHUNKED = dict(expect=cases.matches_reference(reference, lambda c: TOLERANCES[c.kwargs["cum_scores"].dtype]))
NO_PATH = dict(allow_inf=("value", "score"), expect=expect_neg_inf_iff_longer_than_K)
ADVERSARIAL = (
    _transformed("all transitions -inf", "transition", lambda x: x.fill_(-math.inf), "all -inf", **NO_PATH),
    Adversarial("all transitions -inf, 2-D transition", STREAMING, lambda c: cases.transform_argument(
        _rebuilt(c, transition_3d=False), "transition", lambda x: x.fill_(-math.inf), "all -inf"), **NO_PATH),
    _transformed("self transitions -inf", "transition", lambda x: x.masked_fill(
        torch.eye(x.shape[-1], dtype=torch.bool, device=x.device), -math.inf), "diagonal -inf"),
    _transformed("durations > 1 forbidden (-inf bias)", "duration_bias", lambda x: torch.cat(
        [x[:1], torch.full_like(x[1:], -math.inf)]), "rows 1: = -inf"),
    Adversarial("scores, transitions, duration biases * 1e4", STREAMING, lambda c: _large(c, 1e4, 0), **LARGE),
    Adversarial("offsets of 1e4 keeping the distribution", STREAMING, lambda c: _large(c, 1, 1e4), **LARGE),
    Adversarial("length 1", STREAMING, lambda c: _rebuilt(c, lengths=(1,) + c.extra["shape"].lengths[1:])),
    Adversarial("all lengths 1", STREAMING, lambda c: _rebuilt(c, lengths=(1,) * c.extra["shape"].B)),
    Adversarial("T = 1", STREAMING, lambda c: _rebuilt(c, T=1, lengths=(1,) * c.extra["shape"].B)),
    Adversarial("K > T", STREAMING, lambda c: _rebuilt(c, K=c.extra["shape"].T + 2)),
    Adversarial("C = 33, 3-D transitions: one duration per chunk", STREAMING,
                lambda c: _rebuilt(c, C=33, transition_3d=True), **CHUNKED),
    Adversarial("C = 40, K = T = 65, 2-D transitions: two duration chunks", STREAMING,
                lambda c: _rebuilt(c, T=65, K=65, C=40, lengths=(65, 30)), **CHUNKED),
    _transformed("NaN input", "cum_scores", lambda x: x.index_fill(1, torch.tensor([1], device=x.device), math.nan),
                 "NaN at t = 1", errors_ok=True),
)


def _bad(argument: str, what: str, fn: Any, routes: tuple[str, ...] = STREAMING) -> BadInput:
    """``argument`` replaced by ``fn(the case's arguments detached, its shape)``."""
    return cases.bad_input(argument, what, routes, lambda c: fn(cases.detached(c.kwargs), c.extra["shape"]))


BAD_INPUTS = cases.standard_bad_inputs(STREAMING, TENSORS + ("lengths",), other_device=TENSORS[1:] + ("lengths",),
                                       rejects_nan=TENSORS, rejects_inf=TENSORS) + (
    _bad("cum_scores", "T = 0", lambda kw, sh: kw["cum_scores"][:, :1]),
    _bad("cum_scores", "C = 0", lambda kw, sh: kw["cum_scores"][..., :0]),
    _bad("cum_scores", "a nonzero first row (scores.cumsum(1) without the zero row)",
         lambda kw, sh: kw["cum_scores"] + 1.0),
    _bad("transition", "shape (C+1, C)", lambda kw, sh: kw["transition"].new_zeros(sh.C + 1, sh.C)),
    _bad("transition", "twice as many rows", lambda kw, sh: torch.cat([kw["transition"]] * 2)),
    _bad("duration_bias", "shape (K+1, C)", lambda kw, sh: torch.cat([kw["duration_bias"]] * 2)),
    _bad("lengths", "0", lambda kw, sh: torch.zeros_like(kw["lengths"])),
    _bad("lengths", "T + 1", lambda kw, sh: torch.full_like(kw["lengths"], sh.T + 1)),
    _bad("lengths", "shape (B+1,)", lambda kw, sh: torch.cat([kw["lengths"], kw["lengths"][:1]])),
    _bad("K", "0", lambda kw, sh: 0),
    _bad("K", "a float", lambda kw, sh: float(kw["K"])),
    _bad("semiring", "'sum'", lambda kw, sh: "sum", routes=("semicrf.*.log.*", "semicrf.*.max.*")),
    _bad("proj_start", "shape (B, T+1, C)", lambda kw, sh: torch.cat([kw["proj_start"], kw["proj_start"][:, :1]], 1)),
    _bad("proj_end", "shape (B, T, C+1)", lambda kw, sh: torch.cat([kw["proj_end"], kw["proj_end"][..., :1]], 2)),
    _bad("use_triton", "a string", lambda kw, sh: "yes"),
)

ORACLES = (Oracle("exact backend", "small", exact_backend, STREAMING),
           Oracle("brute force", "tiny", brute_force, STREAMING))
