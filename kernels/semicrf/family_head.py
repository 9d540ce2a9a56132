"""Registration of the head's routes (``HEAD_TREE`` of :mod:`provable_kernels.semicrf.head`) with sentinel: part of
:mod:`provable_kernels.semicrf.family`, imported by it only.

A case holds a head (its configuration: C, K, a Linear projection from ``FEATURES`` hidden features, 2-D or 3-D
transition, ``use_triton``, ``exact_max_bytes``), the method's arguments (``hidden`` (B, T, H), ``lengths``, ...)
and the head's four parameters as arguments of their own (``transition``, ``duration_bias``,
``projection.weight``, ``projection.bias``): :func:`run` calls the method with them through
``torch.func.functional_call``, so that their gradients are reported and the references read the same values.

Outputs: ``forward`` routes give ``value`` ((B,), or (k, B) for ``kmax:k``); loss routes ``value`` (B,)
(``reduction="none"``) and ``grad_<argument>`` for ``hidden`` and the four parameters (weights
``Case.upstream["value"]``); ``decode`` gives ``score`` (B,), ``labels`` and ``starts`` (B, T).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from hypothesis import strategies as st
from torch import nn

from provable_kernels.semicrf import oracle
from provable_kernels.semicrf.family_tolerances import TOLERANCES
from provable_kernels.semicrf.head import HEAD_TREE, SemiMarkovCRFHead
from provable_kernels.semicrf.structures import Segment, ViterbiResult
from kernel_sentinel import cases
from kernel_sentinel.checks import expect, expect_close, run_route
from kernel_sentinel.family import Adversarial, BadInput, Case, Oracle, Outputs, Property, Tolerance

ROUTES = ("semicrf.head.*",)
LOSS = ("semicrf.head.*.loss",)
FORWARD = tuple(route.id for route, path in HEAD_TREE.paths() if path[0][1] == "forward")
PARAMETERS = ("transition", "duration_bias", "projection.weight", "projection.bias")
FEATURES = 3
KMAX = 3
METHODS = {"forward": "SemiMarkovCRFHead.forward", "compute_loss": "SemiMarkovCRFHead.compute_loss",
           "decode": "SemiMarkovCRFHead.decode"}


@dataclass(frozen=True)
class HeadShape:
    """A head problem: sizes, lengths, 3-D (duration-indexed) transition or not, the seed of its values, and the
    scale of the hidden states (large scales make the stabilising shifts matter)."""

    B: int
    T: int
    K: int
    C: int
    lengths: tuple[int, ...]
    duration_transition: bool
    seed: int = 0
    scale: float = 1.0
    given_starts: bool = True  # False: the loss finds the segments from the labels (consecutive labels differ)


SIZES = {"small": HeadShape(B=2, T=6, K=3, C=2, lengths=(6, 4), duration_transition=True),
         "tiny": HeadShape(B=2, T=4, K=2, C=2, lengths=(4, 3), duration_transition=False, given_starts=False)}


def _semiring(route_id: str) -> str:
    """The semiring name a forward route's case asks for (``kmax:3`` for the kmax route)."""
    name = route_id.rsplit(".", 1)[1]
    return f"kmax:{KMAX}" if name == "kmax" else name


def _gold(shape: HeadShape, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random valid gold segmentation per sequence as ``(labels, starts)`` (B, T) (-1 / False past each length);
    without ``given_starts`` consecutive segments get different labels (the runs of the labels are the segments)."""
    segmentations = []
    for L in shape.lengths:
        segments, s = [], 0
        while s < L:
            d = int(torch.randint(1, min(shape.K, L - s) + 1, (), generator=gen))
            label = int(torch.randint(0, shape.C, (), generator=gen))
            if segments and not shape.given_starts and label == segments[-1][2]:
                label = (label + 1) % shape.C
            segments.append((s, d, label))
            s += d
        segmentations.append(segments)
    return oracle.path_tensors(segmentations, shape.T)


def make_case_for(route_id: str, shape: HeadShape, dtype: torch.dtype, device: torch.device) -> Case:
    """A case of ``shape`` that ``HEAD_TREE`` routes to ``route_id``: the method, backend and semiring follow the
    route's path (``backend="auto"`` where it takes the route's backend); parameters ~ N(0, 0.5), hidden ~ N(0,
    scale); loss cases carry a random valid gold."""
    path = HEAD_TREE.path_to(route_id)
    method = path["method"]
    gen = torch.Generator().manual_seed(shape.seed)
    head = SemiMarkovCRFHead(shape.C, shape.K, FEATURES, use_triton=False,
                             transition="duration" if shape.duration_transition else "static")
    grad = method == "compute_loss"

    def normal(*size: int, scale: float = 0.5) -> torch.Tensor:
        x = scale * torch.randn(*size, generator=gen, dtype=torch.float64)
        return x.to(device, dtype).requires_grad_(grad)

    kwargs: dict[str, Any] = {
        "head": head.to(device, dtype),
        "hidden": normal(shape.B, shape.T, FEATURES, scale=shape.scale),
        "lengths": torch.tensor(shape.lengths, dtype=torch.int64, device=device),
        "transition": normal(*tuple(head.transition.shape)), "duration_bias": normal(shape.K, shape.C),
        "projection.weight": normal(shape.C, FEATURES), "projection.bias": normal(shape.C),
    }
    upstream = {}
    semiring = _semiring(route_id) if method == "forward" else "log"
    automatic = "streaming" if semiring in ("log", "max") else "exact"  # what backend="auto" takes
    backend = "auto" if path.get("backend") == automatic else path.get("backend")
    if method == "forward":
        kwargs.update(backend=backend, semiring=semiring)
    elif method == "compute_loss":
        labels, starts = _gold(shape, gen)
        kwargs.update(labels=labels.clamp(min=0).to(device), starts=starts.to(device) if shape.given_starts else None,
                      reduction="none", backend=backend)
        upstream = {"value": torch.randn(shape.B, generator=gen, dtype=torch.float64).to(device, dtype)}
    name = str(dtype).removeprefix("torch.")
    return Case(route_id, METHODS[method], kwargs, f"head {shape} {name} on {device}", upstream, {"shape": shape})


_PER_SEQUENCE = ("hidden", "lengths", "labels", "starts", "value", "grad_hidden", "score")
BATCH_ITEMS = tuple(cases.batch_along("a sequence", routes, {**dict.fromkeys(_PER_SEQUENCE, 0), "value": value_dim},
                                      summed=tuple(f"grad_{name}" for name in PARAMETERS))
                    for routes, value_dim in ((("semicrf.head.exact.kmax",), 1), (ROUTES, 0)))  # kmax: (k, B)


def make_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    return make_case_for(route_id, dataclasses.replace(SIZES[size], seed=seed), dtype, device)


class _Method(nn.Module):
    """``head.<method>`` as a module's forward, for ``torch.func.functional_call``."""

    def __init__(self, head: SemiMarkovCRFHead, method: str):
        super().__init__()
        self.head, self.method = head, method

    def forward(self, **kwargs: Any) -> Any:
        return getattr(self.head, self.method)(**kwargs)


def invoke(method: str, **arguments: Any) -> Any:
    """``head.<method>(...)`` on a case's arguments: the head, the method's arguments, and the parameter arguments
    used as the head's parameters."""
    kwargs = dict(arguments)
    head = kwargs.pop("head")
    parameters = {f"head.{name}": kwargs.pop(name) for name in PARAMETERS}
    return torch.func.functional_call(_Method(head, method), parameters, (), kwargs)


def call(case: Case) -> Any:
    """The head method of the case, called with the case's arguments."""
    return invoke(case.entry.rpartition(".")[2], **case.kwargs)


def _entry(method: str) -> Callable[..., Any]:
    """The entry point of a method for sentinel: takes a case's arguments; unwraps (``__wrapped__``) to the
    method, whose source the traces show."""
    def entry(**arguments: Any) -> Any:
        return invoke(method, **arguments)

    return functools.update_wrapper(entry, getattr(SemiMarkovCRFHead, method))


ENTRY_POINTS = {name: _entry(method) for method, name in METHODS.items()}


def _decoded(result: ViterbiResult, T: int) -> Outputs:
    labels, starts = result.padded(T)
    return {"score": result.scores.detach(), "labels": labels, "starts": starts.long()}


def run(case: Case) -> Outputs:
    """Call the method; backward for the loss routes."""
    result = call(case)
    if case.entry == METHODS["decode"]:
        return _decoded(result, case.kwargs["hidden"].shape[1])
    return cases.outputs_and_gradients({"value": result}, case)


# ---------------------------------------------------------------------------------------------- references


def _model(kw: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``cum_scores`` (B, T+1, C), transition and duration_bias in float64 from float64 arguments, written here:
    scores = hidden @ weight^T + bias, a zero row, a cumulative sum."""
    scores = torch.einsum("bth,ch->btc", kw["hidden"], kw["projection.weight"]) + kw["projection.bias"]
    cum = torch.cat([scores.new_zeros(scores.shape[0], 1, scores.shape[2]), scores.cumsum(1)], 1)
    return cum, kw["transition"], kw["duration_bias"]


def _gold_segmentations(kw: dict[str, Any], K: int) -> list[oracle.Segmentation]:
    """The gold of each sequence from ``labels`` and ``starts`` (None: a segment starts where the label changes)."""
    out = []
    for b, L in enumerate(kw["lengths"].tolist()):
        labels = [x if t < L else -1 for t, x in enumerate(kw["labels"][b].tolist())]
        starts = (kw["starts"][b].tolist() if kw["starts"] is not None else
                  [t < L and (t == 0 or labels[t] != labels[t - 1]) for t in range(len(labels))])
        out.append(oracle.path_segmentation(labels, starts, L, K))
    return out


def _gold_score(seg: oracle.Segmentation, cum: torch.Tensor, transition: torch.Tensor,
                duration_bias: torch.Tensor) -> torch.Tensor:
    """Differentiable score of one segmentation, term by term from the convention (first segment: no
    transition)."""
    total, prev = cum.new_zeros(()), None
    for s, d, c in seg:
        total = total + cum[s + d, c] - cum[s, c] + duration_bias[d - 1, c]
        if prev is not None:
            total = total + (transition[d - 1] if transition.dim() == 3 else transition)[prev, c]
        prev = c
    return total


def _enumerated(case: Case, kw: dict[str, Any]) -> Outputs:
    """Forward routes of every semiring from brute-force enumeration (``oracle.all_scores``, plain float64)."""
    cum, transition, duration_bias = (x.detach().cpu() for x in _model(kw))
    K, lengths = kw["head"].max_duration, kw["lengths"].cpu()
    scored = oracle.all_scores(cum, transition, duration_bias, lengths, K)
    semiring = kw.get("semiring", "max")
    if case.entry == METHODS["decode"]:
        score, labels, starts = oracle.brute_force_viterbi(scored, cum.shape[1] - 1)
        return {"score": score, "labels": labels.long(), "starts": starts.long()}
    if semiring.startswith("kmax"):
        value = torch.tensor(oracle.top_k(scored, KMAX), dtype=torch.float64).T
    elif semiring == "entropy":
        value = torch.tensor(oracle.entropy(scored), dtype=torch.float64)
    elif semiring == "counting":
        value = torch.tensor([sum(math.isfinite(s) for _, s in items) for items in scored], dtype=torch.float64)
    else:
        value = oracle.brute_force_value(scored, semiring)
    return {"value": value}


def reference(case: Case) -> Outputs:
    """Float64, independent of the head: the model written out (:func:`_model`); log and max values by
    ``oracle.naive_partition`` (gradients by autograd), the loss as naive log Z minus the gold score written term
    by term, decode by ``oracle.viterbi_by_gradient``, entropy / counting / kmax by enumeration."""
    kw = cases.float64_leaves(case.kwargs)
    K, lengths = kw["head"].max_duration, kw["lengths"]
    semiring = kw.get("semiring", "log")
    if case.entry == METHODS["decode"]:
        with torch.no_grad():
            cum, transition, duration_bias = _model(kw)
        score, labels, starts = oracle.viterbi_by_gradient(cum, transition, duration_bias, lengths, K)
        return {"score": score, "labels": labels, "starts": starts.long()}
    if semiring not in ("log", "max"):
        return _enumerated(case, kw)
    with torch.enable_grad():
        cum, transition, duration_bias = _model(kw)
        value = oracle.naive_partition(cum, transition, duration_bias, lengths, K, semiring)
        if case.entry == METHODS["compute_loss"]:
            gold = [_gold_score(seg, cum[b], transition, duration_bias)
                    for b, seg in enumerate(_gold_segmentations(kw, K))]
            value = value - torch.stack(gold)
        return cases.outputs_and_gradients({"value": value}, case, kw)


def brute_force(case: Case) -> Outputs:
    """Every route by enumeration of all segmentations (plain float64 Python); the loss as log Z minus the gold's
    score (``oracle.score``)."""
    kw = cases.float64_cpu(case.kwargs)
    if case.entry != METHODS["compute_loss"]:
        return _enumerated(case, kw)
    cum, transition, duration_bias = _model(kw)
    K = kw["head"].max_duration
    scored = oracle.all_scores(cum, transition, duration_bias, kw["lengths"], K)
    gold = [oracle.score(seg, cum[b], transition, duration_bias) for b, seg in enumerate(_gold_segmentations(kw, K))]
    return {"value": torch.tensor([z - g for z, g in zip(oracle.log_partition(scored), gold)], dtype=torch.float64)}


ORACLES = (Oracle("brute force", "tiny", brute_force, ROUTES),)


# ---------------------------------------------------------------------------------------------- properties


@st.composite
def shapes(draw: Any) -> HeadShape:
    """Random tiny heads: B <= 2, T <= 4, K <= 3, C <= 2, any lengths, 2-D or 3-D transition."""
    B, T = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    lengths = tuple(draw(st.lists(st.integers(1, T), min_size=B, max_size=B)))
    return HeadShape(B, T, draw(st.integers(1, 3)), draw(st.integers(1, 2)), lengths, draw(st.booleans()),
                     draw(st.integers(0, 2**16)))


def tolerance(dtype: torch.dtype) -> Tolerance:
    """The family's tolerance for ``dtype``."""
    return TOLERANCES[dtype]


def prop_matches_enumeration(route_id: str, shape: HeadShape, device: torch.device, dtype: torch.dtype) -> None:
    """Values equal enumeration; decode: the best score, and its segments (an exact tie may pick another best
    segmentation, e.g. C = 1) are a segmentation that scores it."""
    case = make_case_for(route_id, shape, dtype, device)
    if case.entry != METHODS["decode"]:
        got = run_route(run, case)
        for name, want in brute_force(case).items():
            expect_close(f"{name} vs enumeration", got[name], want, tolerance(dtype))
        return
    result = run_route(lambda c: {"decoded": call(c)}, case)["decoded"]
    kw = cases.float64_cpu(case.kwargs)
    cum, transition, duration_bias = _model(kw)
    expect_close("score vs enumeration", result.scores, brute_force(case)["score"], tolerance(dtype))
    for b, L in enumerate(shape.lengths):
        segmentation = tuple((seg.start, seg.duration, seg.label) for seg in result.segments[b])
        expect(segmentation in oracle.segmentations(L, shape.K, shape.C),
               f"sequence {b}: decoded {segmentation} is not a segmentation of [0, {L}) with durations 1..{shape.K}")
        scored = oracle.score(segmentation, cum[b], transition, duration_bias)
        expect_close(f"sequence {b}: score of the decoded segments", torch.tensor(scored, dtype=torch.float64),
                     result.scores[b], tolerance(dtype))


def prop_normalised(route_id: str, shape: HeadShape, device: torch.device, dtype: torch.dtype) -> None:
    """Every segmentation of sequence 0 as the gold, all in one batch: each NLL >= 0 and sum exp(-NLL) = 1."""
    case = make_case_for(route_id, dataclasses.replace(shape, B=1, lengths=shape.lengths[:1]), dtype, device)
    L = case.extra["shape"].lengths[0]
    golds = oracle.segmentations(L, shape.K, shape.C)
    labels, starts = oracle.path_tensors([list(y) for y in golds], shape.T)
    G = len(golds)
    kw = case.kwargs
    batch = case.with_kwargs(f"{case.description}; all {G} golds", hidden=kw["hidden"].detach().expand(G, -1, -1),
                             lengths=kw["lengths"].expand(G), labels=labels.clamp(min=0).to(device),
                             starts=starts.to(device))
    nll = run_route(lambda c: {"value": call(c).detach()}, batch)["value"].double()
    tol = tolerance(dtype)
    expect(bool((nll >= -tol.atol).all()), f"negative NLL: min {float(nll.min())} over {G} golds")
    expect_close("logsumexp(-NLL) over every gold", torch.logsumexp(-nll, 0), torch.zeros((), dtype=torch.float64),
                 tol)


PROPERTIES = (
    Property("agrees with enumeration of every segmentation on random heads", ROUTES, shapes,
             prop_matches_enumeration),
    Property("NLL >= 0 for every gold and exp(-NLL) sums to 1", LOSS, shapes, prop_normalised),
    cases.finite_difference_property(LOSS, shapes, lambda route_id, shape, device: make_case_for(
        route_id, shape, torch.float64, device), run),
)


# ------------------------------------------------------------------------------------------- guards, bad input


def _rescaled(case: Case, scale: float) -> Case:
    shape = dataclasses.replace(case.extra["shape"], scale=scale)
    x = case.kwargs["hidden"]
    return make_case_for(case.route_id, shape, x.dtype, x.device)


def expect_reference(case: Case, outputs: Outputs) -> None:
    """Outputs equal the float64 reference, within the dtype's tolerance relative to the size of the scores (a
    sum of T terms of size |hidden| carries that much rounding)."""
    tol = tolerance(case.kwargs["hidden"].dtype)
    scores = _model(cases.float64_cpu(case.kwargs))[0]
    scale = float((scores[:, 1:] - scores[:, :-1]).abs().amax()) * scores.shape[1]
    scaled = Tolerance(tol.atol + tol.rtol * scale, tol.rtol)
    for name, want in reference(case).items():
        expect_close(f"{name} vs float64 reference", outputs[name], want, scaled)


def _forbid_all_transitions(case: Case) -> Case:
    return cases.transform_argument(case, "transition", lambda x: x.fill_(-math.inf), "all -inf")


ADVERSARIAL = (
    Adversarial("hidden states of 1e3", ROUTES, lambda c: _rescaled(c, 1e3), expect=expect_reference),
    Adversarial("hidden states of 1e4", ROUTES, lambda c: _rescaled(c, 1e4), expect=expect_reference),
    Adversarial("length 1", ROUTES, lambda c: make_case_for(
        c.route_id, dataclasses.replace(c.extra["shape"], lengths=(1,) * c.extra["shape"].B),
        c.kwargs["hidden"].dtype, c.kwargs["hidden"].device), allow_inf=("value",), expect=expect_reference),
    Adversarial("every transition -inf", ROUTES, _forbid_all_transitions,
                errors_ok=True, allow_inf=("value", "score")),
)


def _bad(argument: str, what: str, routes: tuple[str, ...], fn: Any) -> BadInput:
    return BadInput(argument, what, routes, lambda c: cases.replace_argument(c, argument, fn(c), what))


def _label_inside_segment(case: Case) -> Case:
    """Segments of length 2 from position 0 on, labels 0, 1, 0, 1, ... (each segment changes label inside)."""
    positions = torch.arange(_kw(case, "labels").shape[1], device=case.kwargs["labels"].device).expand_as(
        case.kwargs["labels"])
    labels, starts = positions % 2, positions % 2 == 0
    return case.with_kwargs(f"{case.description}; labels alternate inside segments of 2", labels=labels,
                            starts=starts)


def _one_long_segment(case: Case) -> Case:
    """Label 0 everywhere and one segment per sequence (longer than K for a sequence of length > K)."""
    positions = torch.arange(_kw(case, "labels").shape[1], device=case.kwargs["labels"].device).expand_as(
        case.kwargs["labels"])
    return case.with_kwargs(f"{case.description}; one segment of label 0", labels=torch.zeros_like(positions),
                            starts=positions == 0)


def _small_budget(case: Case) -> Case:
    head = copy.copy(case.kwargs["head"])
    head.exact_max_bytes = 64
    return case.with_kwargs(f"{case.description}; exact_max_bytes 64", head=head)


def _kw(case: Case, name: str) -> torch.Tensor:
    return case.kwargs[name].detach()


BAD_INPUTS = cases.standard_bad_inputs(ROUTES, ("hidden", "lengths"), rejects_nan=("hidden",),
                                       rejects_inf=("hidden",)) + (
    _bad("hidden", "wrong number of features", ROUTES, lambda c: _kw(c, "hidden")[..., :-1]),
    _bad("lengths", "0", ROUTES, lambda c: torch.zeros_like(c.kwargs["lengths"])),
    _bad("lengths", "T + 1", ROUTES, lambda c: torch.full_like(c.kwargs["lengths"], _kw(c, "hidden").shape[1] + 1)),
    _bad("backend", "'fast'", ("semicrf.head.streaming.*", "semicrf.head.exact.*"), lambda c: "fast"),
    _bad("backend", "'streaming' for a semiring it lacks", tuple(r for r in FORWARD if r.rsplit(".", 1)[1] not in
                                                                 ("log", "max") and ".exact." in r),
         lambda c: "streaming"),
    _bad("semiring", "'sum'", FORWARD, lambda c: "sum"),
    _bad("labels", "a float tensor", LOSS, lambda c: _kw(c, "labels").double()),
    _bad("labels", "shape (B, T+1)", LOSS, lambda c: torch.cat([_kw(c, "labels"), _kw(c, "labels")[:, :1]], 1)),
    _bad("labels", "a label C", LOSS, lambda c: torch.full_like(c.kwargs["labels"], c.extra["shape"].C)),
    _bad("starts", "no start at 0", LOSS, lambda c: torch.zeros_like(c.kwargs["labels"], dtype=torch.bool)),
    _bad("starts", "an int64 tensor", LOSS, lambda c: torch.ones_like(c.kwargs["labels"])),
    BadInput("starts", "one segment longer than K", LOSS, _one_long_segment),
    BadInput("labels", "changing inside a segment", LOSS, _label_inside_segment),
    _bad("reduction", "'avg'", LOSS, lambda c: "avg"),
    BadInput("hidden", "an empty batch with reduction='mean'", LOSS, lambda c: c.with_kwargs(
        f"{c.description}; B = 0, mean", hidden=c.kwargs["hidden"].detach()[:0], reduction="mean")),
    BadInput("exact_max_bytes", "below the edge tensor", ("semicrf.head.exact.*",), _small_budget),
)

