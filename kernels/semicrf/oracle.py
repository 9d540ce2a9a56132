"""Independent semi-CRF references: the brute-force oracle and the float64 recursion. Imports only torch and the
standard library; shares no code with the routes it checks.

Enumerates every labeled segmentation of [0, L) (durations 1..K inclusive, C labels) and scores each one
straight from the convention (site page "Semi-CRF conventions"), in float64 Python arithmetic, independently of
every recursion of the library:

    score(y) = sum_i [cum[s_i+d_i, c_i] - cum[s_i, c_i] + duration_bias[d_i-1, c_i]
                      + proj_start[s_i, c_i] + proj_end[s_i+d_i-1, c_i]]
             + sum_{i>=1} trans(d_i)[c_{i-1}, c_i]          (the first segment pays no transition)

A segmentation is a tuple of ``(start, duration, label)``. Keep L, K, C tiny: the count grows like (C K)^L.

A differentiable float64 reference in torch, also independent of the routes, for larger problems and for
gradients by autograd: :func:`naive_partition`, the plain alpha recursion keeping every alpha (no ring buffer,
no checkpoints, no hand-written backward), O(T K) Python steps.

Every function here serves ``sentinel verify`` (the family's references and oracles); references only the tests
use live in the tests.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Iterator, Optional, Sequence

import torch

Segmentation = tuple[tuple[int, int, int], ...]


def log_sum(values: torch.Tensor, dim: int) -> torch.Tensor:
    """``logsumexp`` over ``dim`` with the project's rule for a line of only -inf terms written out (relying on no
    torch behaviour there): its value is -inf and it passes no gradient (torch's own gives a NaN gradient)."""
    top = values.detach().amax(dim, keepdim=True)
    empty = top == -math.inf
    shift = torch.where(empty, torch.zeros_like(top), top)
    weights = torch.exp(torch.where(empty, torch.full_like(values, -math.inf), values - shift))
    total = weights.sum(dim, keepdim=True)
    out = torch.where(empty, top, shift + torch.log(torch.where(empty, torch.ones_like(total), total)))
    return out.squeeze(dim)


# ⊕ over a dim. max: torch.amax splits the gradient evenly between exactly tied maxima (torch's documented rule)
REDUCE: dict[str, Callable[..., torch.Tensor]] = {"log": log_sum, "max": torch.amax}


@lru_cache(maxsize=None)
def segmentations(length: int, K: int, C: int) -> tuple[Segmentation, ...]:
    """Every labeled segmentation of [0, length) with durations in 1..K and labels in 0..C-1."""

    def extend(start: int) -> Iterator[Segmentation]:
        if start == length:
            yield ()
            return
        for d in range(1, min(K, length - start) + 1):
            for c in range(C):
                for rest in extend(start + d):
                    yield ((start, d, c),) + rest

    return tuple(extend(0))


def score(
    seg: Segmentation,
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> float:
    """Score of one segmentation for one sequence (unbatched tensors: cum (T+1, C), transition (C, C) or (K, C, C)):
    a Python float, no gradient."""
    cum_scores, transition, duration_bias, proj_start, proj_end = (
        None if x is None else x.detach() for x in (cum_scores, transition, duration_bias, proj_start, proj_end))
    cum = cum_scores.double().tolist()
    total = 0.0
    prev = None
    for s, d, c in seg:
        total += cum[s + d][c] - cum[s][c] + float(duration_bias[d - 1, c])
        if proj_start is not None:
            total += float(proj_start[s, c])
        if proj_end is not None:
            total += float(proj_end[s + d - 1, c])
        if prev is not None:
            trans = transition[d - 1] if transition.dim() == 3 else transition
            total += float(trans[prev, c])
        prev = c
    return total


def all_scores(cum_scores, transition, duration_bias, lengths, K, proj_start=None, proj_end=None):
    """Per batch element, the list of ``(segmentation, score)`` over every segmentation of [0, L_b)."""
    B, _, C = cum_scores.shape
    out = []
    for b in range(B):
        L = int(lengths[b])
        out.append(
            [
                (
                    y,
                    score(
                        y,
                        cum_scores[b],
                        transition,
                        duration_bias,
                        None if proj_start is None else proj_start[b],
                        None if proj_end is None else proj_end[b],
                    ),
                )
                for y in segmentations(L, K, C)
            ]
        )
    return out


def score_edges(seg: Segmentation, edge: torch.Tensor) -> float:
    """Score of one segmentation under an exact-backend edge tensor (T, K, C, C) of one sequence.

    ``edge[s, d-1, c_prev, c]`` scores segment [s, s+d) with label c after a segment labeled c_prev; the first
    segment reads row ``c_prev = 0`` (the virtual start state).
    """
    total = 0.0
    prev = 0
    for s, d, c in seg:
        total += float(edge[s, d - 1, prev, c])
        prev = c
    return total


def all_scores_from_edges(edge: torch.Tensor, lengths) -> list:
    """Per batch element, ``(segmentation, score)`` for every segmentation, scored from edges (B, T, K, C, C)."""
    B, _, K, C, _ = edge.shape
    return [
        [(y, score_edges(y, edge[b])) for y in segmentations(int(lengths[b]), K, C)]
        for b in range(B)
    ]


def logsumexp(values: Sequence[float]) -> float:
    m = max(values)
    if m == -math.inf:
        return -math.inf
    return m + math.log(sum(math.exp(v - m) for v in values))


def log_partition(scored) -> list[float]:
    """logZ per batch element from :func:`all_scores`."""
    return [logsumexp([s for _, s in items]) for items in scored]


def best(scored) -> list[tuple[Segmentation, float]]:
    """Best segmentation and score per batch element (ties: first in enumeration order)."""
    out = []
    for items in scored:
        y, s = max(items, key=lambda p: p[1])
        out.append((y, s))
    return out


def top_k(scored, k: int) -> list[list[float]]:
    """The k best scores per batch element, descending (padded with -inf)."""
    out = []
    for items in scored:
        vals = sorted((s for _, s in items), reverse=True)[:k]
        out.append(vals + [-math.inf] * (k - len(vals)))
    return out


def probabilities(items) -> list[float]:
    logz = logsumexp([s for _, s in items])
    return [math.exp(s - logz) for _, s in items]


def entropy(scored) -> list[float]:
    """Entropy of the Gibbs distribution per batch element."""
    out = []
    for items in scored:
        p = probabilities(items)
        out.append(-sum(pi * math.log(pi) for pi in p if pi > 0))
    return out


# ------------------------------------------------------------------------------ differentiable torch references


def _float64_inputs(cum_scores, transition, duration_bias, proj_start, proj_end):
    """The five tensors in float64 (graph kept, for autograd); absent projections as zeros (B, T, C)."""
    cum = cum_scores.to(torch.float64)
    zeros = cum.new_zeros(cum.shape[0], cum.shape[1] - 1, cum.shape[2])
    as64 = [None if x is None else x.to(torch.float64) for x in (transition, duration_bias, proj_start, proj_end)]
    trans, dur, ps, pe = as64
    return cum, trans, dur, zeros if ps is None else ps, zeros if pe is None else pe


def naive_partition(cum_scores, transition, duration_bias, lengths, K: int, semiring: str = "log",
                    proj_start=None, proj_end=None) -> torch.Tensor:
    """logZ (``semiring="log"``) or the best score (``"max"``) per sequence, (B,) float64, by the plain recursion

        alpha[t, c] = ⊕_{d=1..min(K,t)} seg(t-d, d, c) + [t-d > 0] ⊕_{c'} (alpha[t-d, c'] + trans(d)[c', c])
        result[b]   = ⊕_c alpha[L_b, c]

    keeping every alpha in a Python list, on the device of the inputs; differentiable by torch autograd in every
    tensor argument (shapes as ``semi_crf_streaming_forward``). For ``"max"`` the gradient is the indicator of
    the best segmentation's features (``torch.amax`` splits it evenly between exactly tied maxima, so at a tie
    it is not an indicator). Values are exact with -inf entries; a ⊕ of only -inf terms is -inf and passes no
    gradient (:func:`log_sum`).
    """
    reduce = REDUCE[semiring]
    cum, trans, dur, ps, pe = _float64_inputs(cum_scores, transition, duration_bias, proj_start, proj_end)
    alpha: list[Optional[torch.Tensor]] = [None]  # alpha[t] (B, C); no segment ends at 0
    for t in range(1, cum.shape[1]):
        terms = []
        for d in range(1, min(K, t) + 1):
            s = t - d
            term = cum[:, t] - cum[:, s] + dur[d - 1] + ps[:, s] + pe[:, t - 1]
            if s > 0:  # the first segment pays no transition
                trans_d = trans[d - 1] if trans.dim() == 3 else trans
                term = term + reduce(alpha[s][:, :, None] + trans_d, 1)
            terms.append(term)
        alpha.append(reduce(torch.stack(terms), 0))
    return torch.stack([reduce(alpha[int(L)][b], 0) for b, L in enumerate(torch.as_tensor(lengths).tolist())])


# ---------------------------------------------------------------------- gradients, paths, linear chain


def feature_gradients(scored, tensors: dict[str, torch.Tensor], weights: Sequence[float],
                      semiring: str) -> dict[str, torch.Tensor]:
    """``grad_<name>`` of ``sum_b weights[b] * result_b`` for each of ``tensors`` (float64, batched as the inputs;
    present projections only), with ``result_b`` the logsumexp (``"log"``) or max (``"max"``) over
    :func:`all_scores` ``scored``: the expectation of each segmentation's feature counts under the Gibbs
    distribution, or the counts of the best segmentation (the first in enumeration order at a tie)."""
    grads = {n: torch.zeros_like(x) for n, x in tensors.items()}
    for b, items in enumerate(scored):
        if semiring == "log":
            probs = probabilities(items)
        else:
            top = max(range(len(items)), key=lambda i: items[i][1])
            probs = [float(i == top) for i in range(len(items))]
        for (segmentation, _), p in zip(items, probs):
            _add_features(grads, b, segmentation, p * weights[b])
    return {f"grad_{n}": g for n, g in grads.items()}


def _add_features(grads: dict[str, torch.Tensor], b: int, segmentation: Segmentation, weight: float) -> None:
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


def streaming_brute_force(cum_scores, transition, duration_bias, lengths, K: int, proj_start=None, proj_end=None,
                          semiring: Optional[str] = None, weights=None) -> dict[str, torch.Tensor]:
    """The streaming entry points' outputs by enumeration (:func:`all_scores`), float64: for ``semiring`` "log" or
    "max" the ``value`` and, given ``weights`` (B,), ``grad_<tensor>`` of sum_b weights[b] * value_b
    (:func:`feature_gradients`); for None (Viterbi) the ``score``, ``labels`` and ``starts`` of the best path."""
    scored = all_scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
    if semiring is None:
        return dict(zip(("score", "labels", "starts"), brute_force_viterbi(scored, cum_scores.shape[1] - 1)))
    value = {"value": brute_force_value(scored, semiring)}
    named = {"cum_scores": cum_scores, "transition": transition, "duration_bias": duration_bias,
             "proj_start": proj_start, "proj_end": proj_end}
    present = {n: x.detach() for n, x in named.items() if x is not None}
    return value if weights is None else value | feature_gradients(scored, present, weights.tolist(), semiring)


def path_tensors(segments: Sequence[Sequence[tuple[int, int, int]]], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``labels`` (B, T) int64 (-1 past the end) and ``starts`` (B, T) bool of ``(start, duration, label)``
    segments per sequence."""
    labels = torch.full((len(segments), T), -1, dtype=torch.int64)
    starts = torch.zeros(len(segments), T, dtype=torch.bool)
    for b, path in enumerate(segments):
        for s, d, c in path:
            labels[b, s : s + d], starts[b, s] = c, True
    return labels, starts


def indicator_ones(indicator: torch.Tensor, what: str) -> list[list[int]]:
    """The indices of the 1s of a 0/1 tensor, in lexicographic order. A value neither 0 nor 1 raises
    ``AssertionError``: the gradient of a max is split between exactly tied best segmentations, and no single
    path can be read off."""
    if not bool(((indicator == 0) | (indicator == 1)).all()):
        raise AssertionError(f"{what}: not a 0/1 indicator (values {sorted(set(indicator.flatten().tolist()))[:6]});"
                             f" the best segmentation is tied")
    return (indicator == 1).nonzero().tolist()


def segments_from_starts(starts: torch.Tensor, lengths: Sequence[int]) -> list[list[tuple[int, int, int]]]:
    """``(start, duration, label)`` per sequence from a (B, T, C) 0/1 indicator of each segment's (start, label)
    (e.g. the gradient of the best score w.r.t. ``proj_start``): a segment runs to the next start, the last one
    to the sequence's length."""
    found: list[list[tuple[int, int]]] = [[] for _ in lengths]
    for b, s, c in indicator_ones(starts, "d best / d proj_start"):
        found[b].append((s, c))
    return [[(s, end - s, c) for (s, c), end in zip(marks, [s for s, _ in marks[1:]] + [L])]
            for marks, L in zip(found, lengths)]


def segments_from_edge_indicator(indicator: torch.Tensor) -> list[list[tuple[int, int, int]]]:
    """``(start, duration, label)`` per sequence of the segments marked in a (B, T, K, C, C) 0/1 edge indicator
    (the Max-semiring marginals of the exact backend)."""
    segments: list[list[tuple[int, int, int]]] = [[] for _ in range(indicator.shape[0])]
    for b, s, d0, _, c in indicator_ones(indicator, "the Max marginals"):
        segments[b].append((s, d0 + 1, c))
    return segments


def linear_chain(cum_scores, transition, duration_bias, lengths, K: int = 1, semiring: str = "log", proj_start=None,
                 proj_end=None) -> torch.Tensor:
    """A linear-chain CRF (forward algorithm over per-position emissions), written independently of the
    semi-CRF recursions: what the semi-CRF with K = 1 (the only K accepted) must equal. (B,) float64 on the CPU."""
    if K != 1:
        raise ValueError(f"K must be 1 for a linear-chain CRF, got {K}")
    reduce = REDUCE[semiring]
    cum, trans, dur, ps, pe = (x.detach().cpu() for x in _float64_inputs(cum_scores, transition, duration_bias,
                                                                           proj_start, proj_end))
    trans = trans[0] if trans.dim() == 3 else trans
    emit = cum[:, 1:] - cum[:, :-1] + dur[0] + ps + pe
    out = []
    for b, L in enumerate(torch.as_tensor(lengths).tolist()):
        alpha = emit[b, 0]
        for t in range(1, L):
            alpha = reduce(alpha[:, None] + trans, 0) + emit[b, t]
        out.append(reduce(alpha, 0))
    return torch.stack(out)


def path_segmentation(labels: Sequence[int], starts: Sequence[bool], length: int, K: int) -> Segmentation:
    """The segmentation of one sequence given per position as ``labels`` and ``starts`` (-1 / False past
    ``length``); ``AssertionError`` unless it tiles [0, length) with durations 1..K and one label per segment."""
    labels, starts = [int(x) for x in labels], [bool(x) for x in starts]
    if any(x != -1 for x in labels[length:]) or any(starts[length:]):
        raise AssertionError(f"path extends past its length {length}: labels {labels}, starts {starts}")
    begins = [t for t in range(length) if starts[t]]
    if begins[:1] != [0]:
        raise AssertionError(f"no segment starts at 0: starts {starts}")
    bounds = begins + [length]
    segmentation = tuple((s, e - s, labels[s]) for s, e in zip(bounds, bounds[1:]))
    for s, d, c in segmentation:
        if not (1 <= d <= K and all(x == c for x in labels[s : s + d])):
            raise AssertionError(f"segment ({s}, {d}, {c}) invalid for K = {K}: labels {labels}")
    return segmentation


def viterbi_by_gradient(cum_scores, transition, duration_bias, lengths, K: int, proj_start=None, proj_end=None):
    """``(best score (B,), labels (B, T), starts (B, T))`` from :func:`naive_partition` in the max semiring: the
    path is read off the gradient of the best score w.r.t. ``proj_start`` (zeros when absent), 1 exactly at the
    (start, label) of each best segment (``AssertionError`` at a tie). Float64 inputs."""
    given = proj_start
    leaf = (torch.zeros_like(cum_scores[:, 1:]) if given is None else given.detach()).requires_grad_(True)
    with torch.enable_grad():
        best = naive_partition(cum_scores, transition, duration_bias, lengths, K, "max", leaf, proj_end)
        (starts,) = torch.autograd.grad(best.sum(), leaf)
    segments = segments_from_starts(starts, torch.as_tensor(lengths).tolist())
    return (best.detach(), *path_tensors(segments, cum_scores.shape[1] - 1))


def brute_force_viterbi(scored, T: int):
    """``(best score (B,), labels (B, T), starts (B, T))`` of the :func:`all_scores` ``scored``, float64."""
    best_ = best(scored)
    return (torch.tensor([s for _, s in best_], dtype=torch.float64),
            *path_tensors([list(y) for y, _ in best_], T))


def brute_force_value(scored, semiring: str) -> torch.Tensor:
    """logZ (``"log"``) or the best score (``"max"``) per sequence of ``scored``, (B,) float64."""
    value = log_partition(scored) if semiring == "log" else [s for _, s in best(scored)]
    return torch.tensor(value, dtype=torch.float64)


def path_scores(labels, starts, cum_scores, transition, duration_bias, lengths, K: int, proj_start=None,
                proj_end=None) -> torch.Tensor:
    """The score (B,) float64 of each sequence's decoded path (``labels`` / ``starts`` (B, T) as Viterbi returns
    them), checked to be a segmentation (:func:`path_segmentation`) and scored by :func:`score`."""
    return torch.tensor([score(path_segmentation(labels[b].tolist(), starts[b].tolist(), L, K), cum_scores[b],
                               transition, duration_bias, None if proj_start is None else proj_start[b],
                               None if proj_end is None else proj_end[b])
                         for b, L in enumerate(torch.as_tensor(lengths).tolist())], dtype=torch.float64)


# ------------------------------------------------------------------------ the exact backend's semirings, the head


def _expected_log(items_p, items_q) -> tuple[float, float]:
    """``(E_p[log p(y)], E_p[log q(y)])`` of one sequence, log-probabilities as score minus log Z (no log of an
    underflowed probability)."""
    log_zp, log_zq = logsumexp([s for _, s in items_p]), logsumexp([s for _, s in items_q])
    p = probabilities(items_p)
    return (math.fsum(pi * (sp - log_zp) for pi, (_, sp) in zip(p, items_p) if pi > 0),
            math.fsum(pi * (sq - log_zq) for pi, (_, sq) in zip(p, items_q) if pi > 0))


def semiring_value(name: str, scored, scored_q=None, k: int = 3) -> torch.Tensor:
    """The exact backend's value per sequence under semiring ``name``, float64, from the enumerated log-scores
    ``scored`` (of p; ``scored_q``: of q, for ``cross_entropy`` and ``kl_divergence``): ``log`` (log Z), ``max``,
    ``counting`` (the total weight, sum of exp(score)), ``entropy``, ``cross_entropy`` (-E_p log q),
    ``kl_divergence`` (E_p log p - E_p log q), ``kmax`` ((k, B): the k best scores)."""
    values: dict[str, Callable[[], list]] = {
        "log": lambda: log_partition(scored), "max": lambda: [s for _, s in best(scored)],
        "counting": lambda: [math.fsum(math.exp(s) for _, s in items) for items in scored],
        "entropy": lambda: entropy(scored),
        "cross_entropy": lambda: [-log_q for _, log_q in map(_expected_log, scored, scored_q)],
        "kl_divergence": lambda: [log_p - log_q for log_p, log_q in map(_expected_log, scored, scored_q)],
        "kmax": lambda: [list(row) for row in zip(*top_k(scored, k))]}
    return torch.tensor(values[name](), dtype=torch.float64)


def edge_marginals(scored, shape: Sequence[int], best_only: bool = False) -> torch.Tensor:
    """P(segment (s, d, c) entered from c_prev) (the first segment from row 0), float64 of ``shape`` (B, T, K, C,
    C), from the enumerated log-scores; with ``best_only`` the indicator of the best segmentation."""
    out = torch.zeros(tuple(shape), dtype=torch.float64)
    for b, items in enumerate(scored):
        top = best([items])[0][0]
        weights = [float(y == top) for y, _ in items] if best_only else probabilities(items)
        for (y, _), p in zip(items, weights):
            prev = 0
            for s, d, c in y:
                out[b, s, d - 1, prev, c] += p
                prev = c
    return out


def head_cum_scores(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``cum_scores`` (B, T+1, C) of a head's linear projection, written out: scores = hidden @ weight^T + bias, a
    zero row, a cumulative sum (differentiable)."""
    scores = torch.einsum("bth,ch->btc", hidden, weight) + bias
    return torch.cat([scores.new_zeros(scores.shape[0], 1, scores.shape[2]), scores.cumsum(1)], 1)


def gold_segmentations(labels: torch.Tensor, starts: Optional[torch.Tensor], lengths, K: int) -> list[Segmentation]:
    """The gold segmentation of each sequence from ``labels`` and ``starts`` (B, T) (None: a segment starts where
    the label changes), checked by :func:`path_segmentation`."""
    out = []
    for b, L in enumerate(torch.as_tensor(lengths).tolist()):
        row = [x if t < L else -1 for t, x in enumerate(labels[b].tolist())]
        begins = (starts[b].tolist() if starts is not None else
                  [t < L and (t == 0 or row[t] != row[t - 1]) for t in range(len(row))])
        out.append(path_segmentation(row, begins, L, K))
    return out


def gold_score(seg: Segmentation, cum: torch.Tensor, transition: torch.Tensor,
               duration_bias: torch.Tensor) -> torch.Tensor:
    """Differentiable score of one segmentation of one sequence, term by term from the convention (first segment:
    no transition; no projections)."""
    total, prev = cum.new_zeros(()), None
    for s, d, c in seg:
        total = total + cum[s + d, c] - cum[s, c] + duration_bias[d - 1, c]
        if prev is not None:
            total = total + (transition[d - 1] if transition.dim() == 3 else transition)[prev, c]
        prev = c
    return total
