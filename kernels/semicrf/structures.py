"""Result types shared by every semi-CRF route: decoded segments and the Viterbi result."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from provable_kernels import validate


@dataclass(frozen=True)
class Segment:
    """One decoded segment [start, end) with ``label``.

    ``score`` is the segment's contribution to the path score: its emission (``cum[end] - cum[start]``), duration
    bias, boundary projections, and the transition paid entering it (none for the first segment). The scores of a
    path's segments sum to the path score.
    """

    start: int
    end: int
    label: int
    score: float

    @property
    def duration(self) -> int:  # verify: unreached (a user's accessor; verify compares start, end and label)
        return self.end - self.start


class ViterbiResult(NamedTuple):
    """``scores`` (B,): best path score per sequence; ``segments[b]``: its segments in order."""

    scores: torch.Tensor
    segments: list[list[Segment]]

    def padded(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same paths as tensors for export: ``labels`` (B, T) int64 with -1 past each length, and
        ``starts`` (B, T) bool marking the first position of each segment, on the device of ``scores``. ``T``
        must be at least the longest path (ValueError otherwise)."""
        T = validate.positive_int("T", T)
        longest = max((path[-1].end for path in self.segments if path), default=0)
        if T < longest:  # verify: unreached (a caller's T shorter than a path; verify pads to the case's T)
            raise ValueError(f"T must be >= the longest path ({longest}), got {T}")
        B = len(self.segments)
        labels = torch.full((B, T), -1, dtype=torch.int64)
        starts = torch.zeros((B, T), dtype=torch.bool)
        for b, path in enumerate(self.segments):
            for seg in path:
                labels[b, seg.start : seg.end] = seg.label
                starts[b, seg.start] = True
        return labels.to(self.scores.device), starts.to(self.scores.device)


class ViterbiPath(NamedTuple):
    """What a Viterbi route returns: fixed-size tensors, cheap to produce on any device.

    ``scores`` (B,): best path score. ``durations`` (B, T) int64: ``durations[b, e] = d > 0`` when a segment of
    the best path ends at position ``e`` (covers [e-d+1, e]), else 0. ``labels`` (B, T) int64: that segment's
    label (0 where no segment ends).
    """

    scores: torch.Tensor
    durations: torch.Tensor
    labels: torch.Tensor


def path_segments(path: ViterbiPath) -> list[list[tuple[int, int, int]]]:
    """``(start, duration, label)`` triples per sequence, in order."""
    durations, labels = path.durations.cpu(), path.labels.cpu()
    out = []
    for b in range(durations.shape[0]):
        ends = torch.nonzero(durations[b] > 0).flatten().tolist()
        out.append([(e + 1 - int(durations[b, e]), int(durations[b, e]), int(labels[b, e])) for e in ends])
    return out


def to_result(call, path: ViterbiPath) -> ViterbiResult:
    """Turn a route's :class:`ViterbiPath` into a :class:`ViterbiResult`, scoring each segment in float64."""
    cum = call.cum_scores.detach().double().cpu()
    trans = call.transition.detach().double().cpu()
    dur = call.duration_bias.detach().double().cpu()
    ps = None if call.proj_start is None else call.proj_start.detach().double().cpu()
    pe = None if call.proj_end is None else call.proj_end.detach().double().cpu()
    segments = []
    for b, triples in enumerate(path_segments(path)):
        segs, prev = [], None
        for s, d, c in triples:
            score = float(cum[b, s + d, c] - cum[b, s, c] + dur[d - 1, c])
            score += 0.0 if ps is None else float(ps[b, s, c])
            score += 0.0 if pe is None else float(pe[b, s + d - 1, c])
            if prev is not None:
                score += float((trans[d - 1] if trans.dim() == 3 else trans)[prev, c])
            segs.append(Segment(s, s + d, c, score))
            prev = c
        segments.append(segs)
    return ViterbiResult(path.scores, segments)
