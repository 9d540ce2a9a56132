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


# verify: unreached (public helper for users' own golds; the head uses label_starts and segmentation_score)
def _labels(labels: object, batch: int, T: int, device: torch.device) -> torch.Tensor:
    labels = validate.tensor("labels", labels, ndim=2, dtypes=(torch.int64, torch.int32), device=device)
    validate.shape("labels", labels, (batch, T), "(B, T)")
    return labels.long()


# verify: unreached (public helper for users' own golds; the head uses label_starts and segmentation_score)
def starts_from_labels(labels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T) bool segment starts for per-position ``labels`` (B, T) int32/int64 and ``lengths`` (B,) int32/int64
    in 1..T: a new segment wherever the label changes.

    Position 0 always starts a segment; positions >= ``lengths[b]`` are False.
    """
    labels = validate.tensor("labels", labels, ndim=2, dtypes=(torch.int64, torch.int32))
    B, T = labels.shape
    return label_starts(labels, validate.lengths("lengths", lengths, B, T, labels.device))


def label_starts(labels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """:func:`starts_from_labels` for arguments already validated."""
    change = torch.cat([torch.ones_like(labels[:, :1], dtype=torch.bool), labels[:, 1:] != labels[:, :-1]], 1)
    return change & _positions(lengths, labels.shape[1])


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


def check_segmentation(checks: validate.DataChecks, starts, labels, lengths, K: int, C: int) -> None:
    """Queue on ``checks`` (one decision for all, see :class:`~provable_kernels.validate.DataChecks`) that
    starts/labels describe a segmentation with durations 1..K; each failure is a ValueError naming the argument."""
    inside = _positions(lengths, starts.shape[1])
    ends = _segment_ends(starts, lengths)

    def first(bad: torch.Tensor) -> tuple[int, ...]:
        return tuple(bad.nonzero()[0].tolist())

    checks.expect(starts[:, 0].all(), lambda: f"starts[{first(~starts[:, 0])[0]}, 0] must be True: the first "
                                              f"position always starts a segment")
    bad_label = inside & ((labels < 0) | (labels >= C))
    checks.expect(~bad_label.any(), lambda: "labels must lie in 0..{} inside each sequence, got {} at [{}, {}]".format(
        C - 1, int(labels[first(bad_label)]), *first(bad_label)))
    changed = torch.zeros_like(starts)
    changed[:, 1:] = labels[:, 1:] != labels[:, :-1]
    bad_change = inside & changed & ~starts
    checks.expect(~bad_change.any(), lambda: "labels must be constant within a segment: labels[{0}, {1}] differs from "
                  "labels[{0}, {2}] but starts[{0}, {1}] is False".format(*first(bad_change), first(bad_change)[1] - 1))
    durations = ends - torch.arange(starts.shape[1], device=starts.device)
    too_long = inside & starts & (durations > K)
    checks.expect(~too_long.any(), lambda: "starts/labels: the segment [{1}, {2}) of sequence {0} has duration {3} > "
                  "K = {4} (a gold run longer than K cannot be scored)".format(
                      *first(too_long), int(ends[first(too_long)]), int(durations[first(too_long)]), K))


def segmentation_score(cum_scores, transition, duration_bias, lengths, starts, labels, proj_start=None,
                       proj_end=None) -> torch.Tensor:
    """:func:`path_score` without any validation, for segmentations that are valid by construction (a decoded
    path): the same shapes, (B,) in ``cum_scores.dtype``."""
    B, T, C = cum_scores.shape[0], cum_scores.shape[1] - 1, cum_scores.shape[2]
    device = cum_scores.device
    lengths = lengths.long()
    labels = labels.long()
    ends = _segment_ends(starts, lengths)
    chosen = starts & _positions(lengths, T)  # one entry per segment, at its start s
    s = torch.arange(T, device=device).expand(B, T)
    c = torch.where(chosen, labels, 0)
    e = torch.where(chosen, ends, s + 1)  # dummy duration 1 where unused keeps every index in range
    d = e - s
    batch = torch.arange(B, device=device)[:, None]
    row = (d - 1).clamp(max=duration_bias.shape[0] - 1)  # a no-op on valid paths; in range on poisoned ones
    terms = cum_scores[batch, e, c] - cum_scores[batch, s, c] + duration_bias[row, c]
    if proj_start is not None:
        terms = terms + proj_start[batch, s, c]
    if proj_end is not None:
        terms = terms + proj_end[batch, e - 1, c]
    prev = torch.cat([torch.zeros_like(c[:, :1]), labels[:, :-1].clamp(0, C - 1)], dim=1)
    trans = transition[row, prev, c] if transition.dim() == 3 else transition[prev, c]
    terms = terms + torch.where(s > 0, trans, torch.zeros_like(trans))
    return torch.where(chosen, terms, torch.zeros_like(terms)).sum(dim=1)


# verify: unreached (public helper for users' own golds; the head uses label_starts and segmentation_score)
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
    """Score (B,) of the segmentation given by ``starts`` (B, T) bool and ``labels`` (B, T) int64 or int32.

    ``cum_scores`` (B, T+1, C), ``transition`` (C, C) or (K, C, C), ``duration_bias`` (K, C), ``lengths`` (B,)
    int32/int64, ``proj_start``/``proj_end`` (B, T, C) or None, as for ``semi_crf_streaming_forward`` with
    K = ``duration_bias.shape[0]`` (float16/bfloat16/float32/float64, computed in float32 or float64).
    Differentiable in every float tensor; output dtype is the compute dtype. Raises ValueError if the path is not
    a segmentation with durations 1..K (``starts[b, 0]`` False, labels changing inside a segment, labels outside
    0..C-1, a segment longer than K); under device-mode value checks (CUDA, compile, capture) such a path gives
    NaN instead (see the host-sync policy). A -inf transition or bias on the path gives -inf.
    """
    duration_bias = validate.tensor("duration_bias", duration_bias, ndim=2, dtypes=validate.FLOAT_DTYPES)
    if duration_bias.shape[0] < 1:  # verify: unreached (a direct call with K = 0; the head passes K >= 1)
        raise ValueError(f"duration_bias must have shape (K, C) with K >= 1, got {tuple(duration_bias.shape)}")
    K = duration_bias.shape[0]
    call = check_scores(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
    B, T, C = call.batch, call.T, call.C
    device = call.cum_scores.device
    starts = validate.tensor("starts", starts, ndim=2, dtypes=(torch.bool,), device=device)
    validate.shape("starts", starts, (B, T), "(B, T)")
    labels = _labels(labels, B, T, device)
    lengths = call.lengths.long()
    checks = validate.DataChecks()
    check_segmentation(checks, starts, labels, lengths, K, C)
    ok = checks.flag()
    score = segmentation_score(call.cum_scores, call.transition, call.duration_bias, lengths, starts,
                               labels.clamp(0, C - 1), call.proj_start, call.proj_end)
    return validate.poison(ok, validate.poison(call.ok, score))
