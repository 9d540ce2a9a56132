"""Score of given segmentations, differentiable (the gold path of the loss; the max-semiring gradient).

A segmentation per sequence is given as two (B, T) tensors: ``starts`` (bool) marks the first position of each
segment and ``labels`` (int64) the label of every position; positions >= ``lengths[b]`` are ignored. The score is
the semi-CRF convention (:mod:`provable_kernels.semicrf.call`; site page "Semi-CRF conventions"): per segment
[s, s+d) with label c,
``cum[s+d, c] - cum[s, c] + duration_bias[d-1, c] + proj_start[s, c] + proj_end[s+d-1, c]``, plus
``trans(d)[c_prev, c]`` for every segment except the first (``trans(d) = transition[d-1]`` when it is 3-D:
indexed by the duration of the segment being entered).
"""
from __future__ import annotations

from typing import Optional

import torch

from provable_kernels import validate
from provable_kernels.semicrf.call import check_scores


def _positions(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) bool: position t lies inside sequence b (t < lengths[b])."""
    return torch.arange(T, device=lengths.device) < lengths[:, None]


def _labels(labels: object, batch: int, T: int, device: torch.device) -> torch.Tensor:
    labels = validate.tensor("labels", labels, ndim=2, dtypes=(torch.int64, torch.int32), device=device)
    validate.shape("labels", labels, (batch, T), "(B, T)")
    return labels.long()


def starts_from_labels(labels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T) bool segment starts for per-position ``labels`` (B, T): a new segment wherever the label changes.

    Position 0 always starts a segment; positions >= ``lengths[b]`` are False.
    """
    labels = validate.tensor("labels", labels, ndim=2, dtypes=(torch.int64, torch.int32))
    B, T = labels.shape
    lengths = validate.lengths("lengths", lengths, B, T, labels.device)
    change = torch.ones_like(labels, dtype=torch.bool)
    change[:, 1:] = labels[:, 1:] != labels[:, :-1]
    return change & _positions(lengths, T)


def _segment_ends(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: for each position t, the end (exclusive) of the segment that would start at t, i.e. the next
    start after t, or ``lengths[b]``. Meaningful at positions < lengths[b]."""
    B, T = starts.shape
    inside = _positions(lengths, T)
    index = torch.arange(T, device=starts.device).expand(B, T)
    boundary = torch.where(starts & inside, index, lengths[:, None].expand(B, T))
    # next boundary at or after u, scanning from the right; the end of a segment at t is the one at or after t+1
    next_at_or_after = boundary.flip(1).cummin(1).values.flip(1)
    return torch.cat([next_at_or_after[:, 1:], lengths[:, None]], dim=1)


def _check_segmentation(starts, labels, lengths, ends, K: int, C: int) -> None:
    """Raise ValueError (naming the argument) unless starts/labels describe a segmentation with durations 1..K."""
    inside = _positions(lengths, starts.shape[1])
    if not bool(starts[:, 0].all()):
        b = int((~starts[:, 0]).nonzero()[0])
        raise ValueError(f"starts[{b}, 0] must be True: the first position always starts a segment")
    bad = inside & ((labels < 0) | (labels >= C))
    if bool(bad.any()):
        b, t = bad.nonzero()[0].tolist()
        raise ValueError(f"labels must lie in 0..{C - 1} inside each sequence, got {int(labels[b, t])} at [{b}, {t}]")
    changed = torch.zeros_like(starts)
    changed[:, 1:] = labels[:, 1:] != labels[:, :-1]
    bad = inside & changed & ~starts
    if bool(bad.any()):
        b, t = bad.nonzero()[0].tolist()
        raise ValueError(f"labels must be constant within a segment: labels[{b}, {t}] differs from labels[{b}, {t - 1}]"
                         f" but starts[{b}, {t}] is False")
    durations = ends - torch.arange(starts.shape[1], device=starts.device)
    bad = inside & starts & (durations > K)
    if bool(bad.any()):
        b, t = bad.nonzero()[0].tolist()
        raise ValueError(f"starts/labels: the segment [{t}, {int(ends[b, t])}) of sequence {b} has duration "
                         f"{int(durations[b, t])} > K = {K} (a gold run longer than K cannot be scored)")


def path_score(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    starts: torch.Tensor,
    labels: torch.Tensor,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Score (B,) of the segmentation given by ``starts`` (B, T) bool and ``labels`` (B, T) int64.

    Shapes as for ``semi_crf_streaming_forward`` with K = ``duration_bias.shape[0]``. Differentiable in every float
    tensor; output dtype is ``cum_scores.dtype``. Raises ValueError if the path is not a segmentation with
    durations 1..K (``starts[b, 0]`` False, labels changing inside a segment, labels outside 0..C-1, a segment
    longer than K). A -inf transition or bias on the path gives -inf.
    """
    duration_bias = validate.tensor("duration_bias", duration_bias, ndim=2, dtypes=validate.FLOAT_DTYPES)
    if duration_bias.shape[0] < 1:
        raise ValueError(f"duration_bias must have shape (K, C) with K >= 1, got {tuple(duration_bias.shape)}")
    K = duration_bias.shape[0]
    call = check_scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
    B, T, C = call.batch, call.T, call.C
    device = call.cum_scores.device
    starts = validate.tensor("starts", starts, ndim=2, dtypes=(torch.bool,), device=device)
    validate.shape("starts", starts, (B, T), "(B, T)")
    labels = _labels(labels, B, T, device)
    lengths = call.lengths.long()
    ends = _segment_ends(starts, lengths)
    _check_segmentation(starts, labels, lengths, ends, K, C)

    chosen = starts & _positions(lengths, T)  # one entry per segment, at its start s
    s = torch.arange(T, device=device).expand(B, T)
    c = torch.where(chosen, labels, 0)
    e = torch.where(chosen, ends, s + 1)  # dummy duration 1 where unused keeps every index in range
    d = e - s
    batch = torch.arange(B, device=device)[:, None]
    cum = call.cum_scores
    terms = cum[batch, e, c] - cum[batch, s, c] + call.duration_bias[d - 1, c]
    if call.proj_start is not None:
        terms = terms + call.proj_start[batch, s, c]
    if call.proj_end is not None:
        terms = terms + call.proj_end[batch, e - 1, c]
    prev = torch.cat([torch.zeros_like(c[:, :1]), labels[:, :-1].clamp(0, C - 1)], dim=1)
    trans = call.transition[d - 1, prev, c] if call.transition.dim() == 3 else call.transition[prev, c]
    terms = terms + torch.where(s > 0, trans, torch.zeros_like(trans))
    return torch.where(chosen, terms, torch.zeros_like(terms)).sum(dim=1)
