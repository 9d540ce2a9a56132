"""Registration of the head's routes (``HEAD_TREE``), a part of :mod:`provable_kernels.semicrf.family`.

A case holds a head (C, K, a Linear projection from ``FEATURES`` hidden features, 2-D or 3-D transition), the
method's arguments (``hidden`` (B, T, H), ``lengths``, ...) and the head's four parameters as arguments of their
own, which the entry points use as the head's parameters (``torch.func.functional_call``): their gradients are
reported and the references read the same values. Outputs: ``value`` ((B,), (k, B) for ``kmax:k``; the loss with
``reduction="none"``) with ``grad_<argument>`` on the loss routes; ``decode`` gives ``score``, ``labels``,
``starts``.
"""
from __future__ import annotations

import copy
import functools
import math
from typing import Any

import torch
from torch import nn

from provable_kernels.semicrf import oracle
from provable_kernels.semicrf.head import HEAD_TREE as TREE
from provable_kernels.semicrf.head import SemiMarkovCRFHead

ROUTES, LOSS = "semicrf.head.*", "semicrf.head.*.loss"
FORWARD = tuple(route.id for route, path in TREE.paths() if path[0][1] == "forward")
PARAMETERS = ("transition", "duration_bias", "projection.weight", "projection.bias")
FEATURES, KMAX = 3, 3
METHODS = {m: f"SemiMarkovCRFHead.{m}" for m in ("forward", "compute_loss", "decode")}
# A problem: sizes, lengths, 3-D (duration-indexed) transition, the scale of the hidden states (large scales make
# the stabilising shifts matter), ``given_starts`` (False: the loss finds the segments from the labels).
SIZES = {"small": dict(B=2, T=6, K=3, C=2, lengths=(6, 4), duration_transition=True),
         "tiny": dict(B=2, T=4, K=2, C=2, lengths=(4, 3), duration_transition=False, given_starts=False)}


class _Method(nn.Module):
    """``head.<method>`` as a module's forward, for ``torch.func.functional_call``."""

    def __init__(self, head: SemiMarkovCRFHead, method: str):
        super().__init__()
        self.head, self.method = head, method

    def forward(self, **kwargs: Any) -> Any:
        return getattr(self.head, self.method)(**kwargs)


def _entry(method: str):
    """``head.<method>(...)`` on a case's arguments, the parameter arguments used as the head's parameters;
    unwraps to the method, whose source the traces show."""
    def entry(head: SemiMarkovCRFHead, **kwargs: Any) -> Any:
        parameters = {f"head.{name}": kwargs.pop(name) for name in PARAMETERS}
        return torch.func.functional_call(_Method(head, method), parameters, (), kwargs)

    return functools.update_wrapper(entry, getattr(SemiMarkovCRFHead, method))


ENTRY_POINTS = {name: _entry(method) for method, name in METHODS.items()}


def _gold(p: Any, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random valid gold per sequence as ``(labels, starts)`` (B, T); without ``given_starts`` consecutive
    segments get different labels (the runs of the labels are the segments)."""
    segmentations = []
    for L in p.lengths:
        segments, s = [], 0
        while s < L:
            d = int(torch.randint(1, min(p.K, L - s) + 1, (), generator=gen))
            label = int(torch.randint(0, p.C, (), generator=gen))
            if segments and not p.get("given_starts", True) and label == segments[-1][2]:
                label = (label + 1) % p.C
            segments.append((s, d, label))
            s += d
        segmentations.append(segments)
    return oracle.path_tensors(segmentations, p.T)


def case(route_id: str, p: Any, gen: torch.Generator, device: torch.device) -> tuple:
    """The method, backend and semiring follow the route's path (``backend="auto"`` where it takes the route's
    backend); parameters ~ N(0, 0.5), hidden ~ N(0, scale); loss cases carry a random valid gold."""
    path = TREE.path_to(route_id)
    method = path["method"]
    head = SemiMarkovCRFHead(p.C, p.K, FEATURES, use_triton=False,
                             transition="duration" if p.duration_transition else "static")
    normal = lambda *size, scale=0.5: scale * torch.randn(*size, generator=gen, dtype=torch.float64)  # noqa: E731
    kwargs: dict[str, Any] = {
        "head": head, "hidden": normal(p.B, p.T, FEATURES, scale=p.get("scale", 1.0)),
        "lengths": torch.tensor(p.lengths), "transition": normal(*head.transition.shape),
        "duration_bias": normal(p.K, p.C), "projection.weight": normal(p.C, FEATURES), "projection.bias": normal(p.C)}
    name = route_id.rsplit(".", 1)[1]
    semiring = (f"kmax:{KMAX}" if name == "kmax" else name) if method == "forward" else "log"
    automatic = "streaming" if semiring in ("log", "max") else "exact"  # what backend="auto" takes
    backend = "auto" if path.get("backend") == automatic else path.get("backend")
    if method == "forward":
        kwargs.update(backend=backend, semiring=semiring)
    if method != "compute_loss":
        return METHODS[method], kwargs, {}
    labels, starts = _gold(p, gen)
    kwargs.update(labels=labels.clamp(min=0), starts=starts if p.get("given_starts", True) else None,
                  reduction="none", backend=backend)
    return METHODS[method], kwargs, {"value": torch.randn(p.B, generator=gen, dtype=torch.float64)}


def outputs(result: Any, case: Any) -> dict:
    if case.entry != METHODS["decode"]:
        return {"value": result}
    labels, starts = result.padded(case.kwargs["hidden"].shape[1])
    return {"score": result.scores, "labels": labels, "starts": starts.long()}


def _model(kw: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``cum_scores``, transition and duration_bias, the projection written out (``oracle.head_cum_scores``)."""
    return oracle.head_cum_scores(kw["hidden"], kw["projection.weight"], kw["projection.bias"]), kw["transition"], \
        kw["duration_bias"]


def brute_force(kw: dict, case: Any) -> dict:
    """Every route by enumeration of all segmentations (plain float64 Python); the loss as log Z minus the gold's
    score."""
    cum, transition, duration_bias = (x.detach() for x in _model(kw))
    K, name = kw["head"].max_duration, kw.get("semiring", "max").split(":")[0]
    scored = oracle.all_scores(cum, transition, duration_bias, kw["lengths"], K)
    if case.entry == METHODS["decode"]:
        return dict(zip(("score", "labels", "starts"), oracle.brute_force_viterbi(scored, cum.shape[1] - 1)))
    if case.entry == METHODS["compute_loss"]:
        gold = oracle.gold_segmentations(kw["labels"], kw["starts"], kw["lengths"], K)
        logz = oracle.log_partition(scored)
        return {"value": torch.tensor([z - oracle.score(y, cum[b], transition, duration_bias)
                                       for b, (z, y) in enumerate(zip(logz, gold))], dtype=torch.float64)}
    if name == "counting":  # the number of segmentations of finite score
        scored = [[(y, 0.0 if math.isfinite(s) else -math.inf) for y, s in items] for items in scored]
    return {"value": oracle.semiring_value(name, scored, k=KMAX)}


def reference(kw: dict, case: Any) -> dict:
    """Float64, independent of the head: log and max values by ``oracle.naive_partition``, the loss as naive log Z
    minus the gold score written term by term, decode by ``oracle.viterbi_by_gradient``; entropy, counting and
    kmax by enumeration."""
    cum, transition, duration_bias = _model(kw)
    K, semiring = kw["head"].max_duration, kw.get("semiring", "log")
    if case.entry == METHODS["decode"]:
        best = oracle.viterbi_by_gradient(cum.detach(), transition, duration_bias, kw["lengths"], K)
        return dict(zip(("score", "labels", "starts"), best))
    if semiring not in ("log", "max"):
        return brute_force(kw, case)
    value = oracle.naive_partition(cum, transition, duration_bias, kw["lengths"], K, semiring)
    if case.entry == METHODS["compute_loss"]:
        golds = oracle.gold_segmentations(kw["labels"], kw["starts"], kw["lengths"], K)
        value = value - torch.stack([oracle.gold_score(y, cum[b], transition, duration_bias)
                                     for b, y in enumerate(golds)])
    return {"value": value}


ORACLES = (("brute force", "tiny", brute_force),)
PER_SEQUENCE = ("hidden", "lengths", "labels", "starts", "grad_hidden", "score")
BATCH_ITEMS = tuple(("a sequence", routes, {**dict.fromkeys(PER_SEQUENCE, 0), "value": value_dim},
                     tuple(f"grad_{name}" for name in PARAMETERS))
                    for routes, value_dim in (("semicrf.head.exact.kmax", 1), (ROUTES, 0)))  # kmax: (k, B)


# ---------------------------------------------------------------------------------------------- properties


def example(pick: Any) -> dict:
    """Random tiny heads: B <= 2, T <= 4, K <= 3, C <= 2, any lengths, 2-D or 3-D transition."""
    B, T = pick(range(1, 3)), pick(range(1, 5))
    return dict(B=B, T=T, K=pick(range(1, 4)), C=pick(range(1, 3)),
                lengths=tuple(pick(range(1, T + 1)) for _ in range(B)), duration_transition=pick((False, True)))


def decodes_a_best_path(check: Any, case: Any) -> None:
    """The best score equals enumeration's, and the decoded segments (an exact tie may pick another best
    segmentation, e.g. C = 1) are a segmentation of [0, L) with durations 1..K that scores it."""
    got = check.forward(case)
    check.close("score vs enumeration", got["score"], check.computed(brute_force, case)["score"])

    def path_score(kw: dict, case: Any) -> dict:
        return {"score": oracle.path_scores(got["labels"].cpu(), got["starts"].cpu(), *_model(kw), kw["lengths"],
                                            case.problem.K)}

    check.close("score of the decoded segments", check.computed(path_score, case)["score"], got["score"])


def normalised(check: Any, case: Any) -> None:
    """Every segmentation of sequence 0 as the gold, all in one batch: each NLL >= 0 and sum exp(-NLL) = 1."""
    p = case.problem
    one = check.case({**p, "B": 1, "lengths": p.lengths[:1]})
    golds = oracle.segmentations(p.lengths[0], p.K, p.C)
    labels, starts = oracle.path_tensors([list(y) for y in golds], p.T)
    G, kw = len(golds), one.kwargs
    batch = one.with_kwargs(f"{one.description}; all {G} golds", hidden=kw["hidden"].detach().expand(G, -1, -1),
                            lengths=kw["lengths"].expand(G), labels=labels.clamp(min=0).to(case.device),
                            starts=starts.to(case.device))
    nll = check.forward(batch)["value"].detach().double()
    check.expect(bool((nll >= -check.tolerance.atol).all()), f"negative NLL: min {float(nll.min())} over {G} golds")
    check.close("logsumexp(-NLL) over every gold", torch.logsumexp(-nll, 0), torch.zeros((), dtype=torch.float64))


ENUMERATED = "agrees with enumeration of every segmentation on random heads"
AGREEMENTS = ((ENUMERATED, FORWARD + (LOSS,), brute_force),)
PROPERTIES = ((ENUMERATED, "semicrf.head.decode", decodes_a_best_path),
              ("NLL >= 0 for every gold and exp(-NLL) sums to 1", LOSS, normalised))
FINITE_DIFFERENCES = LOSS


# ------------------------------------------------------------------------------------------- guards, bad input


def matches_reference(check: Any, case: Any, outputs: dict) -> None:
    """Outputs equal the float64 reference, within the dtype's tolerance relative to the size of the scores (a
    sum of T terms of size |hidden| carries that much rounding)."""
    cum = _model(case.kwargs)[0].detach().double()
    scale = float((cum[:, 1:] - cum[:, :-1]).abs().amax()) * cum.shape[1]
    check.matches_reference(case, outputs, (check.tolerance.atol + check.tolerance.rtol * scale, check.tolerance.rtol))


ADVERSARIAL = (
    ("hidden states of 1e3", ROUTES, {"problem": {"scale": 1e3}}, matches_reference),
    ("hidden states of 1e4", ROUTES, {"problem": {"scale": 1e4}}, matches_reference),
    ("length 1", ROUTES, {"problem": lambda c: {"lengths": (1,) * c.problem.B}}, matches_reference,
     {"allow_inf": ("value",)}),
    ("every transition -inf", ROUTES, {"transition": lambda x: x.fill_(-math.inf)}, None,
     {"errors_ok": True, "allow_inf": ("value", "score")}),
)


def _positions(case: Any) -> torch.Tensor:
    return torch.arange(case.kwargs["labels"].shape[1], device=case.device).expand_as(case.kwargs["labels"])


def _small_budget(case: Any) -> Any:
    head = copy.copy(case.kwargs["head"])
    head.exact_max_bytes = 64
    return case.with_kwargs(f"{case.description}; exact_max_bytes 64", head=head)


STANDARD_BAD_INPUTS = dict(tensors=("hidden", "lengths"), rejects_nan=("hidden",), rejects_inf=("hidden",))
LABELS = lambda c: c.kwargs["labels"]  # noqa: E731
BAD_INPUTS = (
    ("hidden", "wrong number of features", ROUTES, lambda c: c.kwargs["hidden"][..., :-1]),
    ("lengths", "0", ROUTES, lambda c: torch.zeros_like(c.kwargs["lengths"])),
    ("lengths", "T + 1", ROUTES, lambda c: torch.full_like(c.kwargs["lengths"], c.problem.T + 1)),
    ("backend", "'fast'", ("semicrf.head.streaming.*", "semicrf.head.exact.*"), "fast"),
    ("backend", "'streaming' for a semiring it lacks",
     tuple(r for r in FORWARD if r.rsplit(".", 1)[1] not in ("log", "max") and ".exact." in r), "streaming"),
    ("semiring", "'sum'", FORWARD, "sum"),
    ("labels", "a float tensor", LOSS, lambda c: LABELS(c).double()),
    ("labels", "shape (B, T+1)", LOSS, lambda c: torch.cat([LABELS(c), LABELS(c)[:, :1]], 1)),
    ("labels", "a label C", LOSS, lambda c: torch.full_like(LABELS(c), c.problem.C)),
    ("starts", "no start at 0", LOSS, lambda c: torch.zeros_like(LABELS(c), dtype=torch.bool)),
    ("starts", "an int64 tensor", LOSS, lambda c: torch.ones_like(LABELS(c))),
    ("starts", "one segment longer than K", LOSS, lambda c: c.with_kwargs(
        f"{c.description}; one segment of label 0", labels=torch.zeros_like(LABELS(c)), starts=_positions(c) == 0)),
    ("labels", "changing inside a segment", LOSS, lambda c: c.with_kwargs(
        f"{c.description}; labels alternate inside segments of 2", labels=_positions(c) % 2,
        starts=_positions(c) % 2 == 0)),
    ("reduction", "'avg'", LOSS, "avg"),
    ("hidden", "an empty batch with reduction='mean'", LOSS, lambda c: c.with_kwargs(
        f"{c.description}; B = 0, mean", hidden=c.kwargs["hidden"].detach()[:0], reduction="mean")),
    ("exact_max_bytes", "below the edge tensor", "semicrf.head.exact.*", _small_budget),
)
