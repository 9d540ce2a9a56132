"""Brute-force semi-Markov CRF oracle.

Enumerates every labeled segmentation of [0, L) (durations 1..K inclusive, C labels) and scores each one
straight from the convention in shared/DESIGN.md, in float64 Python arithmetic, independently of every
recursion in ``kernels``:

    score(y) = sum_i [cum[s_i+d_i, c_i] - cum[s_i, c_i] + duration_bias[d_i-1, c_i]
                      + proj_start[s_i, c_i] + proj_end[s_i+d_i-1, c_i]]
             + sum_{i>=1} trans(d_i)[c_{i-1}, c_i]          (the first segment pays no transition)

A segmentation is a tuple of ``(start, duration, label)``. Keep L, K, C tiny: the count grows like (C K)^L.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterator, Optional, Sequence

import torch

Segmentation = tuple[tuple[int, int, int], ...]


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
    """Score of one segmentation for one sequence (unbatched tensors: cum (T+1, C), transition (C, C) or (K, C, C))."""
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


def cross_entropy(scored_p, scored_q) -> list[float]:
    """H(p, q) = -sum_y p(y) log q(y) per batch element (both lists enumerate the same segmentations)."""
    out = []
    for items_p, items_q in zip(scored_p, scored_q):
        p, q = probabilities(items_p), probabilities(items_q)
        out.append(-sum(pi * math.log(qi) for pi, qi in zip(p, q) if pi > 0))
    return out


def kl_divergence(scored_p, scored_q) -> list[float]:
    """KL(p || q) = sum_y p(y) (log p(y) - log q(y)) per batch element."""
    out = []
    for items_p, items_q in zip(scored_p, scored_q):
        p, q = probabilities(items_p), probabilities(items_q)
        out.append(sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q) if pi > 0))
    return out


def count(length: int, K: int, C: int) -> int:
    """Number of labeled segmentations of [0, length)."""
    return len(segmentations(length, K, C))


def segment_marginals(scored, T: int, K: int, C: int) -> torch.Tensor:
    """P(segment (s, d, c) is in y), as a (B, T, K, C) float64 tensor indexed [b, s, d-1, c]."""
    out = torch.zeros(len(scored), T, K, C, dtype=torch.float64)
    for b, items in enumerate(scored):
        for (y, _), p in zip(items, probabilities(items)):
            for s, d, c in y:
                out[b, s, d - 1, c] += p
    return out
