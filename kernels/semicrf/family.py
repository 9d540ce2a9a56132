"""Registration of the semi-CRF family with sentinel: inputs per route, the float64 reference (the independent
recursion of :mod:`kernel_sentinel.oracles.semicrf`), the oracles (exact backend on edges, brute-force enumeration),
tolerances, properties, guards, bad inputs, invariants.

Outputs of a route, by name: partition routes give ``value`` (B,) and, for ``train`` routes, ``grad_<input>``
for each of the five tensors present (the gradient of ``sum_b w_b value_b`` with per-sequence weights ``w``);
Viterbi routes give ``score`` (B,), ``labels`` (B, T) (-1 past each length) and ``starts`` (B, T).
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
from provable_kernels.semicrf import reference as torch_reference
from provable_kernels.semicrf import triton_forward
from provable_kernels.semicrf.dispatch import TREE, make_call, semi_crf_streaming_forward, semi_crf_viterbi
from provable_kernels.semicrf.exact import SemiMarkov, edges_from_streaming
from kernel_sentinel.checks import expect, expect_close, run_route
from kernel_sentinel.family import Adversarial, BadInput, Case, Family, Guard, Invariant, Oracle, Outputs, Property, Tolerance
from kernel_sentinel.oracles import semicrf as oracle

TENSORS = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
ENTRY_POINTS = {"partition": semi_crf_streaming_forward, "viterbi": semi_crf_viterbi}  # by the tree's op
ENTRIES = {f.__name__: f for f in ENTRY_POINTS.values()}
VITERBI = semi_crf_viterbi.__name__
TOLERANCES = {torch.float32: Tolerance(atol=1e-5, rtol=1e-5), torch.float64: Tolerance(atol=1e-9, rtol=1e-9)}
FINITE_DIFFERENCE = Tolerance(atol=1e-7, rtol=1e-6)  # central differences, h = 1e-5, in float64
PROPERTY_DTYPE = torch.float64


@dataclass(frozen=True)
class Shape:
    """A problem: sizes, per-sequence lengths, which optional inputs exist, and the seed of the random values."""

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
    "small": Shape(B=3, T=12, K=4, C=3, lengths=(12, 7, 1), transition_3d=False, proj_start=True, proj_end=True),
    "tiny": Shape(B=2, T=5, K=3, C=2, lengths=(5, 3), transition_3d=True, proj_start=True, proj_end=True),
}


def inputs(shape: Shape, dtype: torch.dtype, device: torch.device, grad: bool) -> dict[str, Any]:
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


def make_case_for(route_id: str, shape: Shape, dtype: torch.dtype, device: torch.device,
                  weights: Optional[torch.Tensor] = None) -> Case:
    """A case of ``shape`` that the tree routes to ``route_id``: entry point, ``use_triton``, semiring and
    ``requires_grad`` follow the route's path. ``extra["weights"]`` (B,) weighs each sequence's gradient."""
    path = TREE.path_to(route_id)
    op, backend = path["op"], path["backend"]
    kwargs = inputs(shape, dtype, device, grad=path.get("grad") == "train")
    kwargs["use_triton"] = backend == "triton"
    if op == "partition":
        kwargs["semiring"] = path["semiring"]
    if weights is None:
        weights = torch.randn(shape.B, generator=torch.Generator().manual_seed(shape.seed + 1), dtype=torch.float64)
    return Case(route_id, ENTRY_POINTS[op].__name__, kwargs, f"{shape} {str(dtype).replace('torch.', '')} on {device}",
                {"weights": weights.to(device, dtype), "shape": shape})


def make_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    return make_case_for(route_id, dataclasses.replace(SIZES[size], seed=seed), dtype, device)


def _present(kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {n: kwargs[n] for n in TENSORS if isinstance(kwargs.get(n), torch.Tensor)}


def _gradients(value: torch.Tensor, kwargs: dict[str, Any], weights: torch.Tensor) -> Outputs:
    """``grad_<name>`` of ``sum_b weights_b value_b`` for each input tensor that requires grad."""
    wanted = {n: x for n, x in _present(kwargs).items() if x.requires_grad}
    if not wanted:
        return {}
    grads = torch.autograd.grad(value, list(wanted.values()), grad_outputs=weights.to(value.dtype))
    return {f"grad_{n}": g for n, g in zip(wanted, grads)}


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
    return {"value": result.detach(), **_gradients(result, case.kwargs, case.extra["weights"])}


def forward_only(case: Case) -> Outputs:
    """The partition value of the route, without running backward."""
    return {"value": ENTRIES[case.entry](**case.kwargs).detach()}


# ---------------------------------------------------------------------------------------------- references


def _float64_cpu(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments with every float tensor detached, in float64 on the CPU (for the Python oracles)."""
    return {n: (x.detach().double().cpu() if n in TENSORS and x is not None else x) for n, x in kwargs.items()}


def _float64_leaves(case: Case) -> dict[str, Any]:
    """The case's arguments with every tensor a fresh float64 leaf (requiring grad like the original)."""
    kwargs = dict(case.kwargs)
    for name, x in _present(kwargs).items():
        kwargs[name] = x.detach().double().requires_grad_(x.requires_grad)
    return kwargs


def _naive(kwargs: dict[str, Any], semiring: str, **changes: Any) -> torch.Tensor:
    """``oracle.naive_partition`` on the arguments (with ``changes``), autograd enabled."""
    kw = {**kwargs, **changes}
    with torch.enable_grad():
        return oracle.naive_partition(kw["cum_scores"], kw["transition"], kw["duration_bias"], kw["lengths"], kw["K"],
                                      semiring, kw["proj_start"], kw["proj_end"])


def reference(case: Case) -> Outputs:
    """The independent float64 reference ``kernel_sentinel.oracles.semicrf.naive_partition`` (the plain recursion keeping
    every alpha; no code shared with any route) on float64 copies of the inputs, gradients by torch autograd.
    Viterbi routes: the best score, and the path read off the gradient of the best score w.r.t. ``proj_start``
    (a zero one when absent): 1 exactly at the (start, label) of each best segment (a tie fails loudly)."""
    kwargs = _float64_leaves(case)
    if case.entry != VITERBI:
        value = _naive(kwargs, kwargs["semiring"])
        return {"value": value.detach(), **_gradients(value, kwargs, case.extra["weights"].double())}
    cum = kwargs["cum_scores"]
    given = kwargs["proj_start"]
    leaf = (torch.zeros_like(cum[:, 1:]) if given is None else given.detach()).requires_grad_(True)
    best = _naive(kwargs, "max", proj_start=leaf)
    (starts,) = torch.autograd.grad(best.sum(), leaf)
    return viterbi_outputs(best, *_path_tensors(_segments_from_starts(starts, kwargs["lengths"].tolist()),
                                                cum.shape[1] - 1))


def _segments_from_starts(starts: torch.Tensor, lengths: list[int]) -> list[list[tuple[int, int, int]]]:
    """``(start, duration, label)`` per sequence from a (B, T, C) 0/1 indicator of each segment's (start, label):
    a segment runs to the next start, the last one to the sequence's length."""
    found: list[list[tuple[int, int]]] = [[] for _ in lengths]
    for b, s, c in _ones(starts, "d best / d proj_start"):
        found[b].append((s, c))
    return [[(s, end - s, c) for (s, c), end in zip(marks, [s for s, _ in marks[1:]] + [L])]
            for marks, L in zip(found, lengths)]


def exact_backend(case: Case) -> Outputs:
    """``SemiMarkov(Log or Max).logpartition`` on ``edges_from_streaming`` of float64 copies; gradients by
    autograd through both; the Viterbi path from the Max marginals (the indicator of the best segmentation; a tie
    fails loudly)."""
    kwargs = _float64_leaves(case)
    lengths, K = kwargs["lengths"], kwargs["K"]
    with torch.enable_grad():
        edge = edges_from_streaming(kwargs["cum_scores"], kwargs["transition"], kwargs["duration_bias"], K,
                                    kwargs["proj_start"], kwargs["proj_end"])
        if case.entry == VITERBI:
            best = SemiMarkov(semirings.Max())
            return viterbi_outputs(best.logpartition(edge, lengths), *_decode(best.marginals(edge, lengths)))
        value = SemiMarkov(semirings.Log() if kwargs["semiring"] == "log" else semirings.Max()).logpartition(
            edge, lengths)
        return {"value": value.detach(), **_gradients(value, kwargs, case.extra["weights"].double())}


def _path_tensors(segments: list[list[tuple[int, int, int]]], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``labels`` (B, T) (-1 past the end) and ``starts`` (B, T) of ``(start, duration, label)`` segments."""
    labels = torch.full((len(segments), T), -1, dtype=torch.int64)
    starts = torch.zeros(len(segments), T, dtype=torch.bool)
    for b, path in enumerate(segments):
        for s, d, c in path:
            labels[b, s : s + d], starts[b, s] = c, True
    return labels, starts


def _ones(indicator: torch.Tensor, what: str) -> list[list[int]]:
    """The indices of the 1s of a 0/1 tensor, in lexicographic order. A value neither 0 nor 1 fails loudly: the
    gradient of a max is split between exactly tied best segmentations, and no single path can be read off."""
    expect(bool(((indicator == 0) | (indicator == 1)).all()),
           f"{what}: not a 0/1 indicator (values {sorted(set(indicator.flatten().tolist()))[:6]}); the best "
           f"segmentation is tied")
    return (indicator == 1).nonzero().tolist()


def _decode(indicator: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``labels`` and ``starts`` of the segments marked in a (B, T, K, C, C) 0/1 indicator."""
    B, T = indicator.shape[:2]
    segments: list[list[tuple[int, int, int]]] = [[] for _ in range(B)]
    for b, s, d0, _, c in _ones(indicator, "the Max marginals"):
        segments[b].append((s, d0 + 1, c))
    return _path_tensors(segments, T)


def brute_force(case: Case) -> Outputs:
    """Enumerate every segmentation (``kernel_sentinel.oracles.semicrf``), score each from the convention, and take
    logsumexp / max; gradients as expectations of each segmentation's feature counts under the Gibbs
    distribution (log) or at the best segmentation (max). Plain Python float64."""
    kw = _float64_cpu(case.kwargs)
    scored = oracle.all_scores(kw["cum_scores"], kw["transition"], kw["duration_bias"], kw["lengths"], kw["K"],
                               kw["proj_start"], kw["proj_end"])
    T = kw["cum_scores"].shape[1] - 1
    if case.entry == VITERBI:
        best = oracle.best(scored)
        scores = torch.tensor([s for _, s in best], dtype=torch.float64)
        return viterbi_outputs(scores, *_path_tensors([list(y) for y, _ in best], T))
    log = kw["semiring"] == "log"
    value = oracle.log_partition(scored) if log else [s for _, s in oracle.best(scored)]
    out: dict[str, torch.Tensor] = {"value": torch.tensor(value, dtype=torch.float64)}
    if not case.kwargs["cum_scores"].requires_grad:
        return out
    grads = {n: torch.zeros_like(x) for n, x in kw.items() if n in TENSORS and x is not None}
    weights = case.extra["weights"].double().tolist()
    for b, items in enumerate(scored):
        if log:
            probs = oracle.probabilities(items)
        else:
            top = max(range(len(items)), key=lambda i: items[i][1])
            probs = [float(i == top) for i in range(len(items))]
        for (segmentation, _), p in zip(items, probs):
            _add_features(grads, b, segmentation, p * weights[b])
    return {**out, **{f"grad_{n}": g for n, g in grads.items()}}


def _add_features(grads: dict[str, torch.Tensor], b: int, segmentation: oracle.Segmentation, weight: float) -> None:
    """Add ``weight`` times the derivative of the segmentation's score w.r.t. each input (its feature counts)."""
    prev = None
    for s, d, c in segmentation:
        grads["cum_scores"][b, s + d, c] += weight
        grads["cum_scores"][b, s, c] -= weight
        grads["duration_bias"][d - 1, c] += weight
        if "proj_start" in grads:
            grads["proj_start"][b, s, c] += weight
        if "proj_end" in grads:
            grads["proj_end"][b, s + d - 1, c] += weight
        if prev is not None:
            trans = grads["transition"]
            (trans[d - 1] if trans.dim() == 3 else trans)[prev, c] += weight
        prev = c


# ---------------------------------------------------------------------------------------------- properties


@st.composite
def shapes(draw: Any, K: Optional[int] = None, projections: Optional[bool] = None) -> Shape:
    """Random small shapes: B <= 3, T <= 8, K <= 5 (K > T included), C <= 3, any lengths, 2-D or 3-D
    transitions, projections on or off; ``K``/``projections`` fix those."""
    B, T, C = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 3))
    K = K or draw(st.integers(1, 5))
    lengths = tuple(draw(st.lists(st.integers(1, T), min_size=B, max_size=B)))
    proj = [projections] * 2 if projections is not None else [draw(st.booleans()), draw(st.booleans())]
    return Shape(B, T, K, C, lengths, draw(st.booleans()), proj[0], proj[1], draw(st.integers(0, 2**16)))


def _route_run(route_id: str, shape: Shape, device: torch.device, weights: Optional[torch.Tensor] = None,
               gradients: bool = False) -> tuple[Case, Outputs]:
    """Run the route under test on a float64 case of ``shape`` (the dispatcher must record it); partition routes
    run backward only when the property needs ``gradients``."""
    case = make_case_for(route_id, shape, PROPERTY_DTYPE, device, weights)
    return case, run_route(run if gradients or case.entry == VITERBI else forward_only, case)


def _plain(case: Case) -> dict[str, Any]:
    """The case's tensor arguments detached, for calls to sibling routes."""
    return {n: (x.detach() if isinstance(x, torch.Tensor) else x) for n, x in case.kwargs.items()
            if n not in ("semiring",)}


def prop_logz_above_best(route_id: str, shape: Shape, device: torch.device) -> None:
    case, out = _route_run(route_id, shape, device)
    best = semi_crf_viterbi(**_plain(case)).scores
    tol = TOLERANCES[PROPERTY_DTYPE]
    expect(bool((out["value"] >= best - tol.atol - tol.rtol * best.abs()).all()),
           f"logZ {out['value'].tolist()} below the Viterbi score {best.tolist()}")


def prop_max_is_viterbi(route_id: str, shape: Shape, device: torch.device) -> None:
    case, out = _route_run(route_id, shape, device)
    expect_close("max vs Viterbi score", out["value"], semi_crf_viterbi(**_plain(case)).scores,
                 TOLERANCES[PROPERTY_DTYPE])


def linear_chain(kwargs: dict[str, Any], reduce: Any) -> torch.Tensor:
    """A linear-chain CRF (forward algorithm, per-position emissions), written independently of the semi-CRF
    recursions: what K = 1 must equal. ``reduce(x, dim)`` is logsumexp or amax. Float64, (B,)."""
    kw = _float64_cpu(kwargs)
    cum, trans = kw["cum_scores"], kw["transition"]
    trans = trans[0] if trans.dim() == 3 else trans
    emit = cum[:, 1:] - cum[:, :-1] + kw["duration_bias"][0]
    for name in ("proj_start", "proj_end"):
        if kw[name] is not None:
            emit = emit + kw[name]
    out = []
    for b, L in enumerate(kw["lengths"].tolist()):
        alpha = emit[b, 0]
        for t in range(1, L):
            alpha = reduce(alpha[:, None] + trans, 0) + emit[b, t]
        out.append(reduce(alpha, 0))
    return torch.stack(out)


def prop_linear_chain(route_id: str, shape: Shape, device: torch.device) -> None:
    case, out = _route_run(route_id, shape, device)
    log = case.kwargs.get("semiring") == "log"
    expect_close("K=1 vs linear-chain CRF", _value(out), linear_chain(case.kwargs, torch.logsumexp if log else torch.amax),
                 TOLERANCES[PROPERTY_DTYPE])


def prop_exact_agreement(route_id: str, shape: Shape, device: torch.device) -> None:
    case, out = _route_run(route_id, shape, device)
    expect_close("value vs exact backend", out["value"], exact_backend(case)["value"], TOLERANCES[PROPERTY_DTYPE])


def prop_cum_gradient_sums_to_zero(route_id: str, shape: Shape, device: torch.device) -> None:
    _, out = _route_run(route_id, shape, device, gradients=True)
    total = out["grad_cum_scores"].sum(1)  # (B, C): every segment adds +1 at its end and -1 at its start
    expect_close("sum over t of d/d cum_scores", total, torch.zeros_like(total), TOLERANCES[PROPERTY_DTYPE])


def prop_marginals(route_id: str, shape: Shape, device: torch.device) -> None:
    """With unit weights, d logZ / d proj_start and d proj_end are start / end marginals: in [0, 1], and every
    position t < L lies in exactly one segment in expectation: sum_{s<=t} starts(s) - sum_{e<t} ends(e) = 1."""
    _, out = _route_run(route_id, shape, device, torch.ones(shape.B, dtype=torch.float64), gradients=True)
    tol = TOLERANCES[PROPERTY_DTYPE]
    starts, ends = out["grad_proj_start"], out["grad_proj_end"]
    for name, m in (("start", starts), ("end", ends)):
        expect(bool(((m >= -tol.atol) & (m <= 1 + tol.atol)).all()),
               f"{name} marginals outside [0, 1]: min {float(m.min())}, max {float(m.max())}")
    opened = starts.sum(2).cumsum(1)
    closed = torch.cat([torch.zeros_like(opened[:, :1]), ends.sum(2).cumsum(1)[:, :-1]], 1)
    inside = torch.arange(shape.T, device=device)[None] < torch.tensor(shape.lengths, device=device)[:, None]
    expect_close("segments covering each position", opened - closed, inside.to(opened.dtype), tol)


def prop_finite_differences(route_id: str, shape: Shape, device: torch.device) -> None:
    """<gradient, v> equals (f(x + h v) - f(x - h v)) / 2h for a random direction v over every input tensor,
    f = sum_b w_b value_b, h = 1e-5, values computed by the route itself in float64."""
    case, out = _route_run(route_id, shape, device, gradients=True)
    gen = torch.Generator().manual_seed(shape.seed + 2)
    direction = {n: torch.randn(x.shape, generator=gen, dtype=torch.float64).to(device)
                 for n, x in _present(case.kwargs).items()}
    h, weights = 1e-5, case.extra["weights"]

    def f(step: float) -> torch.Tensor:
        moved = {n: (x.detach() + step * direction[n]).requires_grad_(True) for n, x in _present(case.kwargs).items()}
        return (run_route(forward_only, case.with_kwargs(case.description, **moved))["value"] * weights).sum()

    numeric = (f(h) - f(-h)) / (2 * h)
    analytic = sum((out[f"grad_{n}"] * v).sum() for n, v in direction.items())
    expect_close("directional derivative vs finite differences", analytic, numeric, FINITE_DIFFERENCE)


def prop_viterbi_path(route_id: str, shape: Shape, device: torch.device) -> None:
    """The decoded segments tile [0, L) with durations 1..K, their score computed by the brute-force oracle's
    scorer equals the Viterbi score, and that equals the exact backend's best score."""
    case, out = _route_run(route_id, shape, device)
    kw = _float64_cpu(case.kwargs)
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
                                   None if kw["proj_start"] is None else kw["proj_start"][b],
                                   None if kw["proj_end"] is None else kw["proj_end"][b]))
    tol = TOLERANCES[PROPERTY_DTYPE]
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
    Property("gradients match finite differences (float64)", ("semicrf.*.train",), shapes, prop_finite_differences),
    Property("Viterbi path is a valid segmentation scoring the Viterbi score", ("semicrf.*.viterbi",), shapes,
             prop_viterbi_path),
)


# ------------------------------------------------------------------------------------------- guards, bad input


def _like(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` as a leaf with the dtype, device and requires_grad of ``x``."""
    return values.to(x.device, x.dtype).detach().requires_grad_(x.requires_grad)


def _rebuilt(case: Case, **changes: Any) -> Case:
    """The route's case rebuilt from its shape with ``changes`` (e.g. T, K, lengths)."""
    shape = dataclasses.replace(case.extra["shape"], **changes)
    x = case.kwargs["cum_scores"]
    return make_case_for(case.route_id, shape, x.dtype, x.device)


def _with(case: Case, description: str, name: str, fn: Any) -> Case:
    """The case with tensor ``name`` replaced by ``fn(detached float64 copy)`` (same dtype, device, grad flag)."""
    x = case.kwargs[name]
    return case.with_kwargs(description, **{name: _like(x, fn(x.detach().double().clone()))})


def expect_neg_inf_iff_longer_than_K(case: Case, outputs: Outputs) -> None:
    """With every transition -inf only one-segment paths remain: -inf exactly where L > K."""
    value, lengths = _value(outputs).cpu(), case.kwargs["lengths"].cpu()
    impossible = lengths > case.kwargs["K"]
    expect(bool((value[impossible] == -math.inf).all()) and bool(torch.isfinite(value[~impossible]).all()),
           f"values {value.tolist()} for lengths {lengths.tolist()}: want -inf exactly where L > K")


def _with_nan(x: torch.Tensor) -> torch.Tensor:
    x[0, 1, 0] = math.nan
    return x


ADVERSARIAL = (
    Adversarial("all transitions -inf", ("semicrf.*",),
                lambda c: _with(c, "transition = -inf", "transition", lambda x: torch.full_like(x, -math.inf)),
                allow_inf=("value", "score"), expect=expect_neg_inf_iff_longer_than_K),
    Adversarial("all transitions -inf, 2-D transition", ("semicrf.*",),
                lambda c: _with(_rebuilt(c, transition_3d=False), "2-D transition = -inf", "transition",
                                lambda x: torch.full_like(x, -math.inf)),
                allow_inf=("value", "score"), expect=expect_neg_inf_iff_longer_than_K),
    Adversarial("self transitions -inf", ("semicrf.*",),
                lambda c: _with(c, "transition diagonal = -inf", "transition",
                                lambda x: x.masked_fill(torch.eye(x.shape[-1], dtype=torch.bool, device=x.device),
                                                       -math.inf))),
    Adversarial("durations > 1 forbidden (-inf bias)", ("semicrf.*",),
                lambda c: _with(c, "duration_bias[1:] = -inf", "duration_bias",
                                lambda x: torch.cat([x[:1], torch.full_like(x[1:], -math.inf)]))),
    Adversarial("scores of 1e4", ("semicrf.*",),
                lambda c: _with(c, "cum_scores * 1e4", "cum_scores", lambda x: x * 1e4)),
    Adversarial("length 1", ("semicrf.*",), lambda c: _rebuilt(c, lengths=(1,) + c.extra["shape"].lengths[1:])),
    Adversarial("all lengths 1", ("semicrf.*",), lambda c: _rebuilt(c, lengths=(1,) * c.extra["shape"].B)),
    Adversarial("T = 1", ("semicrf.*",), lambda c: _rebuilt(c, T=1, lengths=(1,) * c.extra["shape"].B)),
    Adversarial("K > T", ("semicrf.*",), lambda c: _rebuilt(c, K=c.extra["shape"].T + 2)),
    Adversarial("NaN input", ("semicrf.*",), lambda c: _with(c, "cum_scores with a NaN", "cum_scores", _with_nan),
                errors_ok=True),
)


def _bad(argument: str, what: str, fn: Any, routes: tuple[str, ...] = ("semicrf.*",)) -> BadInput:
    return BadInput(argument, what, routes, lambda c: c.with_kwargs(f"{argument}: {what}", **{argument: fn(c)}))


def _kw(c: Case, name: str) -> Any:
    return c.kwargs[name].detach()


BAD_INPUTS = (
    _bad("cum_scores", "a list", lambda c: _kw(c, "cum_scores").tolist()),
    _bad("cum_scores", "2-D", lambda c: _kw(c, "cum_scores")[0]),
    _bad("cum_scores", "int64", lambda c: _kw(c, "cum_scores").long()),
    _bad("cum_scores", "T = 0", lambda c: _kw(c, "cum_scores")[:, :1]),
    _bad("transition", "shape (C+1, C)", lambda c: _kw(c, "transition").new_zeros(c.extra["shape"].C + 1,
                                                                                   c.extra["shape"].C)),
    _bad("transition", "twice as many rows", lambda c: torch.cat([_kw(c, "transition")] * 2)),
    _bad("transition", "other dtype than cum_scores", lambda c: _kw(c, "transition").double()
         if _kw(c, "transition").dtype == torch.float32 else _kw(c, "transition").float()),
    _bad("transition", "on another device", lambda c: _kw(c, "transition").to("meta")),
    _bad("duration_bias", "shape (K+1, C)", lambda c: torch.cat([_kw(c, "duration_bias")] * 2)),
    _bad("duration_bias", "NaN", lambda c: _kw(c, "duration_bias") * math.nan),
    _bad("lengths", "0", lambda c: torch.zeros_like(c.kwargs["lengths"])),
    _bad("lengths", "T + 1", lambda c: torch.full_like(c.kwargs["lengths"], _kw(c, "cum_scores").shape[1])),
    _bad("lengths", "float", lambda c: c.kwargs["lengths"].double()),
    _bad("lengths", "on another device", lambda c: c.kwargs["lengths"].to("meta")),
    _bad("lengths", "shape (B+1,)", lambda c: torch.cat([c.kwargs["lengths"], c.kwargs["lengths"][:1]])),
    _bad("K", "0", lambda c: 0),
    _bad("K", "a float", lambda c: float(c.kwargs["K"])),
    _bad("semiring", "'sum'", lambda c: "sum", routes=("semicrf.*.log.*", "semicrf.*.max.*")),
    _bad("proj_start", "shape (B, T+1, C)", lambda c: torch.cat([_kw(c, "proj_start"), _kw(c, "proj_start")[:, :1]], 1)),
    _bad("proj_end", "shape (B, T, C+1)", lambda c: torch.cat([_kw(c, "proj_end"), _kw(c, "proj_end")[..., :1]], 2)),
    _bad("proj_end", "+inf", lambda c: _kw(c, "proj_end") + math.inf),
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
              "-inf, never NaN.", triton_forward._safe.fn),
        Guard("A sequence with no segmentation of finite score (e.g. every transition -inf and L > K) gets logZ "
              "= -inf and zero gradients in the reference backward.", torch_reference.backward),
        Guard("The max route's gradient is the indicator of the decoded path, zero where the best score is -inf.",
              autograd.max_partition),
    ),
    known_issues=(
        "A sequence with no segmentation of finite score gets -inf (partition and Viterbi score) by design; its "
        "decoded Viterbi segments are then some valid segmentation, not a meaningful one.",
        "The exact backend builds the (B, T, K, C, C) edge tensor: it is for verification and small problems only.",
    ),
)
