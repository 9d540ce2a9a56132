"""The head's routes (``HEAD_TREE``): a part of :mod:`provable_kernels.semicrf.family`. A case holds a head (C, K, a
Linear projection from ``_FEATURES`` hidden features, 2-D or 3-D transition), the method's arguments and the head's four
parameters as arguments of their own, used as its parameters (``torch.func.functional_call``): their gradients are
reported and the references read the same values. Outputs: ``value`` ((B,), (k, B) for ``kmax:k``; the loss with
``reduction="none"``) and ``grad_<argument>`` on the loss routes; ``decode``: ``score``, ``labels``, ``starts``.

Hidden states and parameters lie on a grid of 1/16 (:data:`_GRID`): the projection's products and sums are then exact
in float32, so its result does not depend on how torch's matrix product orders them. That order changes with the
number of rows on some CPUs (measured with AVX-512: ``F.linear`` of one sequence differs in the last bit from its
rows in a batch of 4 for about one element in four), which would fail the batch check on torch's Linear rather
than on the head.
"""
import copy
import functools
import math
from typing import Any

import torch

from provable_kernels.semicrf import oracle
from provable_kernels.semicrf.family import _ALL_LENGTHS_1, _LENGTH, decoded, small_example
from provable_kernels.semicrf.head import HEAD_TREE as TREE
from provable_kernels.semicrf.head import SemiMarkovCRFHead

_ROUTES, _LOSS, _DECODE = "semicrf.head.*", "semicrf.head.*.loss", "semicrf.head.decode"
_FORWARD = tuple(route.id for route, path in TREE.paths() if path[0][1] == "forward")
_PARAMETERS = ("transition", "duration_bias", "projection.weight", "projection.bias")
_FEATURES, _KMAX = 3, 3
_GRID = 16  # hidden states and parameters are multiples of 1 / _GRID (module docstring)
_METHODS = {m: f"SemiMarkovCRFHead.{m}" for m in ("forward", "compute_loss", "decode")}
# A problem: sizes, lengths, 3-D (duration-indexed) transition, the scale of the hidden states (large scales make the
# stabilising shifts matter), ``given_starts`` (False: the loss finds the segments from the labels).
SIZES = {"small": dict(B=2, T=6, K=3, C=2, lengths=(6, 4), duration_transition=True),
         "tiny": dict(B=2, T=4, K=2, C=2, lengths=(4, 3), duration_transition=False, given_starts=False)}


class _Method(torch.nn.Module):
    """``head.<method>`` as a module's forward, for ``torch.func.functional_call``."""

    def __init__(self, head: SemiMarkovCRFHead, method: str):
        super().__init__()
        self.head, self.method = head, method

    def forward(self, **kwargs: Any) -> Any:
        return getattr(self.head, self.method)(**kwargs)


def _entry(method: str):
    """``head.<method>`` on a case's arguments, the parameter arguments as the head's parameters; unwraps to the
    method, whose source the traces show."""
    def entry(head: SemiMarkovCRFHead, **kwargs: Any) -> Any:
        parameters = {f"head.{name}": kwargs.pop(name) for name in _PARAMETERS}
        return torch.func.functional_call(_Method(head, method), parameters, (), kwargs)

    return functools.update_wrapper(entry, getattr(SemiMarkovCRFHead, method))


ENTRY_POINTS = {name: _entry(method) for method, name in _METHODS.items()}


def case(route_id: str, p: Any, gen: torch.Generator, device: torch.device) -> tuple:
    """Method, backend and semiring follow the route's path (``backend="auto"`` where it takes the route's backend);
    parameters ~ N(0, 0.25), hidden ~ N(0, scale^2), both rounded to multiples of 1 / _GRID; loss cases carry a random gold (without ``given_starts``,
    consecutive segments differ in label)."""
    path, name = TREE.path_to(route_id), route_id.rsplit(".", 1)[1]
    method, given = path["method"], p.get("given_starts", True)
    head = SemiMarkovCRFHead(p.C, p.K, _FEATURES, use_triton=False,
                             transition="duration" if p.duration_transition else "static")
    normal = lambda *size, scale=0.5: torch.round(  # noqa: E731
        _GRID * scale * torch.randn(*size, generator=gen, dtype=torch.float64)) / _GRID
    kwargs: dict[str, Any] = {
        "head": head, "hidden": normal(p.B, p.T, _FEATURES, scale=p.get("scale", 1.0)),
        "lengths": torch.tensor(p.lengths), "transition": normal(*head.transition.shape), "duration_bias": normal(p.K, p.C),
        "projection.weight": normal(p.C, _FEATURES), "projection.bias": normal(p.C)}
    semiring = (f"kmax:{_KMAX}" if name == "kmax" else name) if method == "forward" else "log"
    backend = "auto" if path.get("backend") == ("streaming" if semiring in ("log", "max") else "exact") else \
        path.get("backend")  # "auto" takes the streaming backend for log and max, the exact one for the others
    if method == "forward":
        kwargs.update(backend=backend, semiring=semiring)
    if method != "compute_loss":
        return _METHODS[method], kwargs, {}
    golds = [[y for y in oracle.segmentations(L, p.K, p.C) if given or all(a[2] != b[2] for a, b in zip(y, y[1:]))]
             for L in p.lengths]
    labels, starts = oracle.path_tensors([g[int(torch.randint(len(g), (), generator=gen))] for g in golds], p.T)
    kwargs.update(labels=labels.clamp(min=0), starts=starts if given else None, reduction="none", backend=backend)
    return _METHODS[method], kwargs, {"value": torch.randn(p.B, generator=gen, dtype=torch.float64)}


def outputs(result: Any, case: Any) -> dict:
    return decoded(result, case.kwargs["hidden"].shape[1]) if case.entry == _METHODS["decode"] else {"value": result}


def _model(kw: dict) -> tuple:
    """``cum_scores`` of the projection written out (``oracle.head_cum_scores``), transition, duration_bias."""
    cum = oracle.head_cum_scores(kw["hidden"], kw["projection.weight"], kw["projection.bias"])
    return cum, kw["transition"], kw["duration_bias"]


def _golds(kw: dict) -> list:
    return oracle.gold_segmentations(kw["labels"], kw["starts"], kw["lengths"], kw["head"].max_duration)


def brute_force(kw: dict, case: Any) -> dict:
    """Every route by enumeration of all segmentations (plain float64 Python); the loss as log Z minus the gold's
    score; counting: the segmentations of finite score."""
    cum, transition, duration_bias = (x.detach() for x in _model(kw))
    scored = oracle.all_scores(cum, transition, duration_bias, kw["lengths"], kw["head"].max_duration)
    if case.entry == _METHODS["decode"]:
        return dict(zip(("score", "labels", "starts"), oracle.brute_force_viterbi(scored, cum.shape[1] - 1)))
    if case.entry == _METHODS["compute_loss"]:
        gold = [oracle.score(y, cum[b], transition, duration_bias) for b, y in enumerate(_golds(kw))]
        return {"value": torch.tensor([z - g for z, g in zip(oracle.log_partition(scored), gold)], dtype=torch.float64)}
    name = kw["semiring"].split(":")[0]
    if name == "counting":
        scored = [[(y, 0.0 if math.isfinite(s) else -math.inf) for y, s in items] for items in scored]
    return {"value": oracle.semiring_value(name, scored, k=_KMAX)}


def reference(kw: dict, case: Any) -> dict:
    """Independent of the head: log and max by ``oracle.naive_partition``, the loss as naive log Z minus the gold
    score written term by term, decode by ``oracle.viterbi_by_gradient``, the other semirings by enumeration."""
    (cum, transition, duration_bias), K = _model(kw), kw["head"].max_duration
    if case.entry == _METHODS["decode"]:
        return dict(zip(("score", "labels", "starts"), oracle.viterbi_by_gradient(
            cum.detach(), transition, duration_bias, kw["lengths"], K)))
    if kw.get("semiring", "log") not in ("log", "max"):
        return brute_force(kw, case)
    value = oracle.naive_partition(cum, transition, duration_bias, kw["lengths"], K, kw.get("semiring", "log"))
    if case.entry == _METHODS["compute_loss"]:
        value = value - torch.stack([oracle.gold_score(y, cum[b], transition, duration_bias)
                                     for b, y in enumerate(_golds(kw))])
    return {"value": value}


ORACLES = (("brute force", "tiny", brute_force),)
_PER_SEQUENCE = ("hidden", "lengths", "labels", "starts", "grad_hidden", "score")
BATCH_ITEMS = tuple(("a sequence", routes, {**dict.fromkeys(_PER_SEQUENCE, 0), "value": value_dim},
                     tuple(f"grad_{name}" for name in _PARAMETERS))
                    for routes, value_dim in (("semicrf.head.exact.kmax", 1), (_ROUTES, 0)))  # kmax: (k, B)


def example(pick: Any) -> dict:
    """``small_example`` with a 2-D or 3-D transition."""
    return small_example(pick, duration_transition=pick((False, True)))


def decodes_a_best_path(check: Any, case: Any) -> None:
    """The best score is enumeration's, and the decoded segments (an exact tie may pick another best segmentation,
    e.g. C = 1) are a segmentation of [0, L) with durations 1..K that scores it."""
    got = check.forward(case)
    check.close("score vs enumeration", got["score"], check.computed(brute_force, case)["score"])
    path = lambda kw, c: {"score": oracle.path_scores(got["labels"].cpu(), got["starts"].cpu(), *_model(kw),  # noqa
                                                      kw["lengths"], c.problem.K)}
    check.close("score of the decoded segments", check.computed(path, case)["score"], got["score"])


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


_ENUMERATED = "agrees with enumeration of every segmentation on random heads"
AGREEMENTS = ((_ENUMERATED, _FORWARD + (_LOSS,), brute_force),)
PROPERTIES = ((_ENUMERATED, _DECODE, decodes_a_best_path), ("NLL >= 0 for every gold and exp(-NLL) sums to 1", _LOSS,
                                                          normalised))
FINITE_DIFFERENCES = _LOSS


def matches_reference(check: Any, case: Any, outputs: dict) -> None:
    """The float64 reference within the dtype's tolerance relative to the size of the scores (a sum of T terms of
    size |hidden| carries that much rounding)."""
    cum, tol = _model(case.kwargs)[0].detach().double(), check.tolerance
    scale = float((cum[:, 1:] - cum[:, :-1]).abs().amax()) * cum.shape[1]
    check.matches_reference(case, outputs, (tol.atol + tol.rtol * scale, tol.rtol))


def _small_budget(case: Any) -> Any:
    head = copy.copy(case.kwargs["head"])
    head.exact_max_bytes = 64
    return case.with_kwargs(f"{case.description}; exact_max_bytes 64", head=head)


ADVERSARIAL = (
    ("hidden states of 1e3", {"problem": {"scale": 1e3}}, matches_reference),
    ("hidden states of 1e4", {"problem": {"scale": 1e4}}, matches_reference),
    ("length 1", _ALL_LENGTHS_1, matches_reference, {"allow_inf": ("value",)}),
    ("every transition -inf", {"transition": lambda x: x.fill_(-math.inf)}, None,
     {"errors_ok": True, "allow_inf": ("value", "score")}))

STANDARD_BAD_INPUTS = (dict(tensors=("hidden", "lengths"), rejects_nan=("hidden",), rejects_inf=("hidden",),
                            in_range={"lengths": (1, _LENGTH)}, shapes={"hidden": (-1,), "lengths": (0,)}),
                       dict(choices={"backend": "triton"}, routes=("semicrf.head.streaming.*", "semicrf.head.exact.*")),
                       dict(choices={"semiring": "viterbi"}, routes=_FORWARD),
                       dict(choices={"reduction": "avg"}, shapes={"labels": (0, 1)}, routes=_LOSS))
_LABELS = lambda c: c.kwargs["labels"]  # noqa: E731
_AT = lambda c: torch.arange(_LABELS(c).shape[1], device=c.device).expand_as(_LABELS(c))  # noqa: E731  (positions)
BAD_INPUTS = (
    ("backend", "'streaming' for a semiring it lacks", "streaming",
     tuple(r for r in _FORWARD if r.rsplit(".", 1)[1] not in ("log", "max") and ".exact." in r)),
    ("labels", "a float tensor", lambda c: _LABELS(c).double(), _LOSS),
    ("labels", "a label C", lambda c: torch.full_like(_LABELS(c), c.problem.C), _LOSS),
    ("starts", "no start at 0", lambda c: torch.zeros_like(_LABELS(c), dtype=torch.bool), _LOSS),
    ("starts", "an int64 tensor", lambda c: torch.ones_like(_LABELS(c)), _LOSS),
    ("starts", "one segment longer than K", lambda c: c.with_kwargs(
        f"{c.description}; one segment of label 0", labels=torch.zeros_like(_LABELS(c)), starts=_AT(c) == 0), _LOSS),
    ("labels", "changing inside a segment", lambda c: c.with_kwargs(
        f"{c.description}; labels alternate inside segments of 2", labels=_AT(c) % 2, starts=_AT(c) % 2 == 0), _LOSS),
    ("hidden", "an empty batch with reduction='mean'", lambda c: c.with_kwargs(
        f"{c.description}; B = 0, mean", hidden=c.kwargs["hidden"].detach()[:0], reduction="mean"), _LOSS),
    ("exact_max_bytes", "below the edge tensor", _small_budget, "semicrf.head.exact.*"))
