"""Independent float64 oracle of the segment reductions: plain Python loops over segments and columns.

Imports only torch and the standard library. Conventions as in :mod:`provable_kernels.segment` (sum, mean,
max, min over rows ``offsets[s] .. offsets[s+1]``; empty segments give ``empty`` and no gradient; max / min
give the whole upstream gradient to the first row holding the extreme value, the first NaN when there is one).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def offsets_from_ids(ids: torch.Tensor, num_segments: int) -> list[int]:
    """CSR offsets (S+1 ints) of sorted ``ids``, counted row by row."""
    counts = [0] * num_segments
    for s in ids.tolist():
        counts[s] += 1
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    return offsets


def csr_index(lengths: Sequence[int], form: str) -> dict[str, torch.Tensor]:
    """The index of segments of ``lengths`` rows in ``form``: ``{"offsets": (S+1,)}`` or ``{"ids": (N,)}``, int64."""
    counts = torch.tensor(lengths, dtype=torch.int64)
    if form == "offsets":
        return {"offsets": torch.cat([counts.new_zeros(1), counts.cumsum(0)])}
    return {"ids": torch.repeat_interleave(torch.arange(len(lengths)), counts)}


def searched_below(values: list[int], target: int, fan: int) -> int:
    """How many of ``values`` lie below ``target`` as a search probing ``fan`` values a step counts them (the Triton
    kernels' search of the ids): the count of sorted values, for unsorted ones whatever the probes meet."""
    lo, hi = 0, len(values)
    while hi > lo:
        step = -(-(hi - lo) // fan)
        count = sum(values[at] < target for at in range(lo, hi, step))
        last = lo + (count - 1) * step
        lo, hi = (last + 1, min(last + step, hi)) if count else (lo, lo)
    return lo


def nan_for_misplaced_ids(ids: list[int], num_segments: int, fan: int) -> tuple[list[bool], list[bool]]:
    """Which segments' values and which rows' gradients the Triton kernels make NaN in device mode for ``ids`` (any
    ints): read against ``csr``, the bounds the kernels' search finds (``csr[s]``: :func:`searched_below` s; so
    ``csr[s + 1]``, found as the ids ``<= s``, equals that strict search for s + 1 because ids are integers).
    Segment s's value is NaN when the first id lies below 0 or the last at S or above, when its bounds are
    reversed, or when a row inside them holds another id. Row r's gradient is NaN when r lies outside the bounds of
    its id's segment (the id clamped into 0 .. S - 1, and it must be r's own id) or ``csr`` does not run from 0 to
    N. Nothing else is NaN."""
    S, N = num_segments, len(ids)
    csr = [searched_below(ids, s, fan) for s in range(S + 1)]
    in_range = N == 0 or (ids[0] >= 0 and ids[-1] < S)
    spoiled = [not in_range or csr[s] > csr[s + 1] or any(i != s for i in ids[csr[s]:csr[s + 1]]) for s in range(S)]
    spans = csr[0] == 0 and csr[S] == N
    seg = [min(max(i, 0), max(S - 1, 0)) for i in ids]
    outside = [not (spans and i == s and csr[s] <= r < csr[s + 1]) for r, (i, s) in enumerate(zip(ids, seg))]
    return spoiled, outside


def chunk_rows(n: int, min_chunk: int, doublings: int, target: int) -> int:
    """The rows of each chunk of a segment of ``n`` rows: the least power of two >= ``min_chunk`` holding ``n`` in at
    most ``target`` chunks, capped at ``min_chunk * 2**doublings``."""
    rows, cap = min_chunk, min_chunk << doublings
    while rows < cap and rows * target < n:
        rows *= 2
    return rows


def _columns(x: torch.Tensor) -> list[list[float]]:
    """Rows of ``x`` flattened to columns, as float64 Python lists."""
    return x.detach().double().reshape(x.shape[0], math.prod(x.shape[1:])).cpu().tolist()


def _extreme_row(rows: list[list[float]], lo: int, hi: int, col: int, reduce: str) -> int:
    best = lo
    for r in range(lo, hi):
        v, b = rows[r][col], rows[best][col]
        if math.isnan(b):
            break
        if math.isnan(v) or (v > b if reduce == "max" else v < b):
            best = r
    return best


def segment_reduce(x: torch.Tensor, reduce: str, offsets: list[int], empty: float = 0.0) -> torch.Tensor:
    """(S, *x.shape[1:]) float64."""
    rows = _columns(x)
    D = math.prod(x.shape[1:])
    out = []
    for s in range(len(offsets) - 1):
        lo, hi = offsets[s], offsets[s + 1]
        line = []
        for c in range(D):
            if lo == hi:
                line.append(empty)
            elif reduce in ("sum", "mean"):
                total = math.fsum(rows[r][c] for r in range(lo, hi))
                line.append(total / (hi - lo) if reduce == "mean" else total)
            else:
                line.append(rows[_extreme_row(rows, lo, hi, c, reduce)][c])
        out.append(line)
    return torch.tensor(out, dtype=torch.float64).reshape(len(offsets) - 1, *x.shape[1:])


def segment_grad(x: torch.Tensor, reduce: str, offsets: list[int], grad_output: torch.Tensor) -> torch.Tensor:
    """d(sum(grad_output * segment_reduce(x)))/dx, (N, *x.shape[1:]) float64."""
    rows = _columns(x)
    D = math.prod(x.shape[1:])
    g = _columns(grad_output)
    grad = [[0.0] * D for _ in rows]
    for s in range(len(offsets) - 1):
        lo, hi = offsets[s], offsets[s + 1]
        for c in range(D):
            if lo == hi:
                continue
            if reduce in ("sum", "mean"):
                for r in range(lo, hi):
                    grad[r][c] = g[s][c] / (hi - lo) if reduce == "mean" else g[s][c]
            else:
                grad[_extreme_row(rows, lo, hi, c, reduce)][c] = g[s][c]
    return torch.tensor(grad, dtype=torch.float64).reshape(x.shape)


def _membership(offsets: list[int], rows: int) -> torch.Tensor:
    """(S, N) bool: row r belongs to segment s."""
    r = torch.arange(rows)
    lo, hi = torch.tensor(offsets[:-1]), torch.tensor(offsets[1:])
    return (r[None, :] >= lo[:, None]) & (r[None, :] < hi[:, None])


def dense_first_rows(x: torch.Tensor, reduce: str, offsets: list[int]) -> torch.Tensor:
    """(S, D) int64 first row of the max / min (first NaN) of each segment and column, by a dense (S, N, D) mask
    and ``argmax`` (which returns the first maximal index); N for empty segments."""
    x2 = x.detach().double().reshape(x.shape[0], math.prod(x.shape[1:])).cpu()
    if x2.shape[0] == 0:
        return torch.zeros(len(offsets) - 1, x2.shape[1], dtype=torch.int64)
    inside = _membership(offsets, x2.shape[0])[:, :, None]
    key = torch.where(inside, x2[None] if reduce == "max" else -x2[None], -math.inf)
    nan = torch.isnan(key) & inside
    top = torch.where(nan, -math.inf, key).amax(1, keepdim=True)
    hit = torch.where(nan.any(1, keepdim=True), nan, (key == top) & inside)
    first = torch.cat([hit, torch.ones_like(hit[:, :1])], 1).int().argmax(1)  # row N when nothing matches
    return first


def dense_reduce(x: torch.Tensor, reduce: str, offsets: list[int], empty: float = 0.0) -> torch.Tensor:
    """The same as :func:`segment_reduce`, computed differently: a dense (S, N) membership matrix in float64 (the
    members' ``sum`` for sums, a gather at :func:`dense_first_rows` for max / min)."""
    x2 = x.detach().double().reshape(x.shape[0], math.prod(x.shape[1:])).cpu()
    S = len(offsets) - 1
    counts = torch.tensor(offsets).diff().double()[:, None]
    if reduce in ("sum", "mean"):
        # mask @ x would turn 0 * inf into NaN outside the segment: sum only the members
        members = _membership(offsets, x2.shape[0])
        value = torch.stack([x2[m].sum(0) for m in members]) if S else x2.new_zeros(0, x2.shape[1])
        if reduce == "mean":
            value = value / counts.clamp(min=1)
    else:
        first = dense_first_rows(x, reduce, offsets)
        padded = torch.cat([x2, x2.new_zeros(1, x2.shape[1])])
        value = padded.gather(0, first)
    value = torch.where(counts > 0, value, torch.full_like(value, empty))
    return value.reshape(S, *x.shape[1:])


def dense_grad(x: torch.Tensor, reduce: str, offsets: list[int], grad_output: torch.Tensor) -> torch.Tensor:
    """The same as :func:`segment_grad` by the dense membership matrix: ``mask.T @ g`` (scaled for mean), or a
    scatter of ``g`` at :func:`dense_first_rows`."""
    x2 = x.detach().double().reshape(x.shape[0], math.prod(x.shape[1:])).cpu()
    g = grad_output.detach().double().reshape(len(offsets) - 1, math.prod(x.shape[1:])).cpu()
    N = x2.shape[0]
    if reduce in ("sum", "mean"):
        mask = _membership(offsets, N).double()
        if reduce == "mean":
            mask = mask / mask.sum(1, keepdim=True).clamp(min=1)
        grad = mask.T @ g
    else:
        grad = x2.new_zeros(N + 1, x2.shape[1]).scatter_(0, dense_first_rows(x, reduce, offsets), g)[:N]
    return grad.reshape(x.shape)
