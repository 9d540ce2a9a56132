"""Registration of the semi-CRF family for verification (data and plain functions read by
``kernel_sentinel.registration``): the streaming routes (``TREE``) and what is family-wide; the parts
``family_head`` and ``family_exact`` register the head's and the exact backend's trees. Streaming outputs:
``value`` (B,) and, on ``train`` routes, ``grad_<input>`` (weights ``upstream["value"]``); Viterbi: ``score`` (B,),
``labels`` (B, T) (-1 past each length), ``starts`` (B, T). References: :mod:`provable_kernels.semicrf.oracle`.
"""
import math
from typing import Any

import torch

from provable_kernels.semicrf import semiring as semirings
from provable_kernels.semicrf import autograd, oracle, torch_ops
from provable_kernels.semicrf.call import make_call
from provable_kernels.semicrf.dispatch import TREE, semi_crf_streaming_forward, semi_crf_viterbi
from provable_kernels.semicrf.exact import SemiMarkov, edges_from_streaming
from provable_kernels.triton_math import lse_shift

TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-9, 1e-9)}
PARTS = ("family_head", "family_exact")
_TENSORS, _PATH = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end"), ("score", "labels", "starts")
_ROUTES, _TRAIN = ("semicrf.triton.*", "semicrf.torch.*"), "semicrf.*.train"
ENTRY_POINTS = {f.__name__: f for f in (semi_crf_streaming_forward, semi_crf_viterbi)}
_VITERBI = semi_crf_viterbi.__name__
# A problem: sizes, lengths, 3-D transition (None: on the training routes), projections, ``unit_weights``. The small
# case reaches every kernel line (`sentinel verify --coverage`): unequal lengths (the outside recursion starts at each
# sequence's own length; an offset error shows only in b >= 1), 3-D transitions on the training routes, projections.
# The tiny case's last sequence runs the full T: a read one row past an input's end leaves the tensor, and with C = 3
# (padded to 4 lanes) so does an access of its last row without the label mask (memory check).
SIZES = {"small": dict(B=3, T=20, K=3, C=3, lengths=(20, 13, 1), transition_3d=None, proj_start=True, proj_end=True),
         "tiny": dict(B=2, T=5, K=3, C=3, lengths=(3, 5), transition_3d=False, proj_start=True, proj_end=True)}


def fit(route_id: str, p: Any, device: torch.device) -> dict:
    return dict(p, transition_3d=TREE.path_to(route_id).get("grad") == "train") if p.transition_3d is None else p


def inputs(p: Any, gen: torch.Generator) -> dict:
    """The model of problem ``p``, float64: scores ~ N(0, scale^2) summed into ``cum_scores`` (zero first row), the
    rest ~ N(0, 0.25); a projection or a 3-D transition where ``p`` asks."""
    normal = lambda *size: 0.5 * torch.randn(*size, generator=gen, dtype=torch.float64)  # noqa: E731
    scores = p.get("scale", 1.0) * torch.randn(p.B, p.T, p.C, generator=gen, dtype=torch.float64)
    return dict(cum_scores=torch.cat([scores.new_zeros(p.B, 1, p.C), scores.cumsum(1)], 1),
                transition=normal(*((p.K,) if p.transition_3d else ()), p.C, p.C), duration_bias=normal(p.K, p.C),
                proj_start=normal(p.B, p.T, p.C) if p.proj_start else None,
                proj_end=normal(p.B, p.T, p.C) if p.proj_end else None, lengths=torch.tensor(p.lengths), K=p.K)


def case(route_id: str, p: Any, gen: torch.Generator, device: torch.device) -> tuple:
    """Entry point, ``use_triton``, semiring and gradients follow the route's path."""
    path = TREE.path_to(route_id)
    kwargs = dict(inputs(p, gen), use_triton=path["backend"] == "triton", **{n: path[n] for n in ("semiring",)
                                                                              if n in path})
    weights = torch.ones(p.B, dtype=torch.float64) if p.get("unit_weights") else torch.randn(
        p.B, generator=gen.manual_seed(p.seed + 1), dtype=torch.float64)
    entry = _VITERBI if path["op"] == "viterbi" else semi_crf_streaming_forward.__name__
    return entry, kwargs, {"value": weights} if path.get("grad") == "train" else {}


def decoded(result: Any, T: int) -> dict:
    """The named outputs of a ``ViterbiResult`` of sequences padded to T."""
    labels, starts = result.padded(T)
    return {"score": result.scores, "labels": labels, "starts": starts.long()}


def outputs(result: Any, case: Any) -> dict:
    return decoded(result, case.kwargs["cum_scores"].shape[1] - 1) if case.entry == _VITERBI else {"value": result}


def _model(kw: dict) -> dict:
    return {n: kw[n] for n in _TENSORS + ("lengths", "K")}


def reference(kw: dict, case: Any) -> dict:
    """``oracle.naive_partition`` (the plain recursion keeping every alpha); Viterbi: ``viterbi_by_gradient``."""
    if case.entry == _VITERBI:
        return dict(zip(_PATH, oracle.viterbi_by_gradient(**_model(kw))))
    return {"value": oracle.naive_partition(**_model(kw), semiring=kw["semiring"])}


def exact_backend(kw: dict, case: Any) -> dict:
    """``SemiMarkov(Log or Max)`` on ``edges_from_streaming``; the Viterbi path from the Max marginals (a tie fails
    loudly)."""
    edge, lengths = edges_from_streaming(**{n: x for n, x in _model(kw).items() if n != "lengths"}), kw["lengths"]
    best = SemiMarkov(semirings.Log() if kw.get("semiring") == "log" else semirings.Max())
    if case.entry != _VITERBI:
        return {"value": best.logpartition(edge, lengths)}
    segments = oracle.segments_from_edge_indicator(best.marginals(edge, lengths))
    return dict(zip(_PATH, (best.logpartition(edge, lengths), *oracle.path_tensors(segments, edge.shape[1]))))


def brute_force(kw: dict, case: Any) -> dict:
    """Every segmentation enumerated and scored from the convention (``oracle.streaming_brute_force``)."""
    return oracle.streaming_brute_force(**_model(kw), semiring=kw.get("semiring"), weights=case.upstream.get("value"))


ORACLES = (("exact backend", "small", exact_backend), ("brute force", "tiny", brute_force))
BATCH_ITEMS = (("a sequence", _ROUTES, dict.fromkeys(("cum_scores", "proj_start", "proj_end", "lengths", "value", *_PATH,
                                                     "grad_cum_scores", "grad_proj_start", "grad_proj_end"), 0),
                ("grad_transition", "grad_duration_bias")),)


def example(pick: Any, K: int = 0, projections: Any = None) -> dict:
    """B <= 3, T <= 8, K <= 5 (K > T included), C <= 3, any lengths, 2-D or 3-D transitions, projections on or off
    (``K`` / ``projections`` fix those)."""
    B, T, C = pick(range(1, 4)), pick(range(1, 9)), pick(range(1, 4))
    K, lengths = K or pick(range(1, 6)), tuple(pick(range(1, T + 1)) for _ in range(B))
    proj = [projections] * 2 if projections is not None else [pick((False, True)), pick((False, True))]
    return dict(B=B, T=T, K=K, C=C, lengths=lengths, transition_3d=pick((False, True)), proj_start=proj[0],
                proj_end=proj[1])


def small_example(pick: Any, **model: Any) -> dict:
    """The parts' problems (enumerated by their references): B <= 2, T <= 4, K <= 3, C <= 2, any lengths, and
    ``model``."""
    B, T = pick(range(1, 3)), pick(range(1, 5))
    return dict(B=B, T=T, K=pick(range(1, 4)), C=pick(range(1, 3)),
                lengths=tuple(pick(range(1, T + 1)) for _ in range(B)), **model)


def viterbi_score(kw: dict, case: Any) -> dict:
    """The best score by the family's Viterbi entry point, as ``value``."""
    kwargs = {n: x.detach() if torch.is_tensor(x) else x for n, x in case.kwargs.items() if n != "semiring"}
    return {"value": semi_crf_viterbi(**kwargs).scores}


def linear_chain(kw: dict, case: Any) -> dict:
    return {"score" if case.entry == _VITERBI else "value": oracle.linear_chain(**_model(kw),
                                                                               semiring=kw.get("semiring", "max"))}


def logz_above_best(check: Any, case: Any) -> None:
    value, best, tol = check.forward(case)["value"].cpu(), viterbi_score({}, case)["value"].cpu(), check.tolerance
    check.expect(bool((value >= best - tol.atol - tol.rtol * best.abs()).all()),
                 f"logZ {value.tolist()} below the Viterbi score {best.tolist()}")


def cum_gradient_sums_to_zero(check: Any, case: Any) -> None:
    total = check.run(case)["grad_cum_scores"].sum(1)  # (B, C): every segment adds +1 at its end and -1 at its start
    check.close("sum over t of d/d cum_scores", total, torch.zeros_like(total))


def marginals(check: Any, case: Any) -> None:
    """With unit weights, d logZ / d proj_start and d proj_end are start / end marginals: in [0, 1], and every
    position t < L lies in exactly one segment in expectation: sum_{s<=t} starts(s) - sum_{e<t} ends(e) = 1."""
    out, atol = check.run(case), check.tolerance.atol
    starts, ends = out["grad_proj_start"], out["grad_proj_end"]
    for name, m in (("start", starts), ("end", ends)):
        check.expect(bool(((m >= -atol) & (m <= 1 + atol)).all()),
                     f"{name} marginals outside [0, 1]: min {float(m.min())}, max {float(m.max())}")
    opened = starts.sum(2).cumsum(1)
    closed = torch.cat([torch.zeros_like(opened[:, :1]), ends.sum(2).cumsum(1)[:, :-1]], 1)
    inside = torch.arange(opened.shape[1], device=opened.device)[None] < case.kwargs["lengths"][:, None]
    check.close("segments covering each position", opened - closed, inside.to(opened.dtype))


def viterbi_path(check: Any, case: Any) -> None:
    """The decoded segments tile [0, L) with durations 1..K, and the oracle's score of them, the Viterbi score and
    the exact backend's best score agree."""
    got = check.forward(case)
    path = lambda kw, c: {"score": oracle.path_scores(got["labels"].cpu(), got["starts"].cpu(), **_model(kw))}  # noqa
    check.close("Viterbi score vs score of its segments", got["score"], check.computed(path, case)["score"])
    check.close("Viterbi score vs exact backend", got["score"], check.computed(exact_backend, case)["score"])


def pinned(name: str, direction: torch.Tensor) -> torch.Tensor:
    """A finite-difference direction keeping the convention ``cum_scores[:, 0] = 0``."""
    return torch.cat([direction[:, :1] * 0, direction[:, 1:]], 1) if name == "cum_scores" else direction


AGREEMENTS = (
    ("max route == Viterbi score", "semicrf.*.max.*", viterbi_score),
    ("K = 1 equals a linear-chain CRF", _ROUTES, linear_chain, (), lambda pick: example(pick, K=1)),
    ("value equals the exact backend on random shapes", ("semicrf.*.log.*", "semicrf.*.max.*"),
     lambda kw, case: {"value": exact_backend(kw, case)["value"]}))
PROPERTIES = (
    ("logZ >= Viterbi score", "semicrf.*.log.*", logz_above_best),
    ("gradient wrt cum_scores sums to 0 over t per label", _TRAIN, cum_gradient_sums_to_zero),
    ("start/end marginals in [0, 1], each position covered once", "semicrf.*.log.train", marginals, (),
     lambda pick: {**example(pick, projections=True), "unit_weights": True}),
    ("Viterbi path is a valid segmentation scoring the Viterbi score", "semicrf.*.viterbi", viterbi_path))
FINITE_DIFFERENCES = _TRAIN


def neg_inf_iff_longer_than_K(check: Any, case: Any, outputs: dict) -> None:
    """With every transition -inf only one-segment paths remain: -inf exactly where L > K."""
    value, lengths = outputs.get("value", outputs.get("score")).cpu(), case.kwargs["lengths"].cpu()
    impossible = lengths > case.kwargs["K"]
    check.expect(bool((value[impossible] == -math.inf).all()) and bool(torch.isfinite(value[~impossible]).all()),
                 f"values {value.tolist()} for lengths {lengths.tolist()}: want -inf exactly where L > K")


def _large(scale: float, offset: float) -> dict:
    """Scores, transitions and duration biases times ``scale``, then ``offset`` added per position to every label and
    to every transition, subtracted from every duration bias: each segmentation's score moves by the same amount,
    so the marginals (gradients) stay far from 0/1."""
    return {"cum_scores": lambda x: x * scale + offset * torch.arange(x.shape[1], dtype=x.dtype)[None, :, None],
            "transition": lambda x: x * scale + offset, "duration_bias": lambda x: x * scale - offset}


_NO_PATH, _NEG_INF = {"allow_inf": ("value", "score")}, lambda x: x.fill_(-math.inf)
_ALL_LENGTHS_1 = {"problem": lambda c: {"lengths": (1,) * c.problem.B}}
_K_ABOVE_T = {"problem": lambda c: {"K": c.problem.T + 2}}
# Triton kernels reduce durations in chunks of DB rows, DB * CP (2-D) or DB * CP^2 (3-D) <= 4096 elements
# (triton_ops.config; CP = C padded to a power of two): many labels give several chunks per step, merged online.
# Huge scores: logZ within 1e-6 relative, gradients 1e-4 ("agrees"), as for O(1) scores.
ADVERSARIAL = (
    ("all transitions -inf, 3-D transition", {"problem": {"transition_3d": True}, "transition": _NEG_INF},
     neg_inf_iff_longer_than_K, _NO_PATH),
    ("all transitions -inf, 2-D transition", {"problem": {"transition_3d": False}, "transition": _NEG_INF},
     neg_inf_iff_longer_than_K, _NO_PATH),
    ("self transitions -inf", {"transition": lambda x: x.masked_fill(torch.eye(x.shape[-1], dtype=torch.bool),
                                                                     -math.inf)}),
    ("durations > 1 forbidden (-inf bias)", {"duration_bias": lambda x: torch.cat([x[:1], _NEG_INF(x[1:])])}),
    ("scores, transitions, duration biases * 1e4", _large(1e4, 0), "agrees"),
    ("offsets of 1e4 keeping the distribution", _large(1, 1e4), "agrees"),
    ("length 1", {"problem": lambda c: {"lengths": (1,) + c.problem.lengths[1:]}}),
    ("all lengths 1", _ALL_LENGTHS_1),
    ("T = 1", {"problem": lambda c: {"T": 1, "lengths": (1,) * c.problem.B}}),
    ("K > T", _K_ABOVE_T),
    ("C = 33, 3-D transitions: one duration per chunk", {"problem": {"C": 33, "transition_3d": True}}, "reference"),
    ("C = 40, K = T = 65, 2-D transitions: two duration chunks",
     {"problem": {"T": 65, "K": 65, "C": 40, "lengths": (65, 30)}}, "reference"),
    ("NaN input", {"cum_scores": lambda x: x.index_fill(1, torch.tensor([1]), math.nan)}, None, {"errors_ok": True}))

_LENGTH = lambda c: c.problem.T  # noqa: E731  (the longest length allowed)
_SHAPES = {"transition": (0, -1), "duration_bias": (0, 1), "lengths": (0,), "proj_start": (0, 1, 2),
          "proj_end": (0, 1, 2)}  # the dims that cum_scores, lengths and K fix
STANDARD_BAD_INPUTS = (dict(tensors=_TENSORS + ("lengths",), other_device=_TENSORS[1:] + ("lengths",),
                            rejects_nan=_TENSORS, rejects_inf=_TENSORS, in_range={"lengths": (1, _LENGTH)},
                            counts={"K": 1}, flags=("use_triton",), shapes=_SHAPES),
                       dict(choices={"semiring": "viterbi"}, routes=("semicrf.*.log.*", "semicrf.*.max.*")))
arg = lambda c, name: c.kwargs[name].detach()  # noqa: E731


def _nan_in_padding(c: Any) -> torch.Tensor:
    """``cum_scores`` with NaN in the last row of the shortest sequence (shorter than T in every size)."""
    x = arg(c, "cum_scores").clone()
    x[int(c.kwargs["lengths"].argmin()), -1] = math.nan
    return x


BAD_INPUTS = (
    ("cum_scores", "T = 0", lambda c: arg(c, "cum_scores")[:, :1]),
    ("cum_scores", "C = 0", lambda c: arg(c, "cum_scores")[..., :0]),
    ("cum_scores", "a nonzero first row (scores.cumsum(1) without the zero row)", lambda c: arg(c, "cum_scores") + 1),
    ("cum_scores", "NaN in the last row of the shortest sequence (padding past its length)", _nan_in_padding),
    # where a case's transition is 2-D, _SHAPES covers this; where it is 3-D, a 2-D one of the wrong size
    ("transition", "2-D of shape (C+1, C)", lambda c: arg(c, "transition").new_zeros(c.problem.C + 1, c.problem.C)))

INVARIANTS = {"tests/test_verify.py": ("test_every_semicrf_route_passes_quick",), "tests/test_semicrf_reference.py": (
    "test_partition_matches_oracle", "test_viterbi_ties_prefer_shorter_duration_then_smaller_label",
    "test_log_gradients_match_brute_force", "test_max_gradients_are_the_best_path_indicator",
    "test_impossible_sequence_gives_neg_inf_and_zero_gradients", "test_repeated_runs_are_bitwise_identical",
    "test_float32_stays_accurate_at_T_100000"), "tests/test_semicrf_exact.py": (
    "test_edges_mean_the_streaming_convention", "test_counting_gives_exact_counts"),
    "tests/test_semicrf_head.py": ("test_nll_is_a_normalised_negative_log_likelihood",),
    "tests/test_semicrf_api.py": ("test_bad_argument_raises_naming_it",), "tests/test_semicrf_triton.py": (
    "test_log_gradients_against_brute_force", "test_gradients_are_bitwise_deterministic",
    "test_viterbi_against_oracle_with_ties")}

_GUIDE, _TRACE = "guide/semicrf", "semicrf/partition-triton.md"
FAILURE_MODES = {  # symptom: the trace section to read first, a second page, what covers it[, routes]
    "NaN in the loss": (f"{_TRACE}#numerical-guards", f"{_GUIDE}-training.md#value-checks-and-host-syncs",
                        "guards check (-inf transitions, huge scores, length 1); written check (poisoned allocations); "
                        "NaN inputs rejected by validation"),
    "NaN in the backward": (f"{_TRACE}#numerical-guards", f"{_GUIDE}-training.md#accuracy-and-score-magnitude",
                            "guards check on the training routes; the -inf-safe logsumexp shift (Numerical guards)",
                            _TRAIN),
    "wrong gradients": (f"{_TRACE}#routes", f"{_GUIDE}-conventions.md#loss-and-decoding", "reference and exact checks "
                        "(every gradient vs the float64 oracle); finite-difference property", _TRAIN),
    "out of memory": ("semicrf/index.md#known-issues", f"{_GUIDE}-conventions.md#exact-backend-edges",
                      "the streaming routes' O(T*C) per sequence (the Triton training route's saved gradients, the "
                      "PyTorch route's float64 inputs); the exact backend is for small problems"),
    "backend mismatch": (f"{_TRACE}#verification", "semicrf/partition-torch.md#routes",
                         "reference and exact checks: both backends against the same float64 oracle", _ROUTES)}

GUARDS = (
    ("Arguments are validated before dispatch: wrong type, rank, shape, dtype or device, lengths outside 1..T, "
     "K < 1, NaN/+inf scores raise ValueError/TypeError naming the argument.", make_call),
    ("A semiring sum over only -inf terms is -inf with zero gradient, never NaN (the exact backend's safe "
     "logsumexp).", semirings.logsumexp),
    ("Triton kernels shift every logsumexp by where(max == -inf, 0, max): a slice of only -inf terms gives -inf, "
     "never NaN (the shared provable_kernels.triton_math helpers).", lse_shift.fn),
    ("A sequence with no segmentation of finite score (e.g. every transition -inf and L > K) gets logZ = -inf and "
     "zero gradients in the PyTorch backward.", torch_ops.backward),
    ("The max route's gradient is the indicator of the decoded path, zero where the best score is -inf.",
     autograd.max_partition))

KNOWN_ISSUES = (
    ("A sequence with no segmentation of finite score gets -inf (partition and Viterbi score); its decoded Viterbi "
     "segments are then some valid segmentation, not a meaningful one.", "low",
     "only when -inf scores forbid every segmentation of a sequence",
     "by design and documented; the guards check gives -inf there, never NaN"),
    ("The exact backend builds the (B, T, K, C, C) edge tensor: it is for verification and small problems only.",
     "medium", "every exact-backend call; memory grows as B*T*K*C^2",
     "use the streaming routes (the head chooses them above its memory threshold)"),
    "The exact backend's cross-entropy and KL semirings in float32 lose accuracy at scores of 1e4 (about 3e-4 "
    "relative against the float64 enumeration): their verification stops at scores of 1e3; use float64 there.")
