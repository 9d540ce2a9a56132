"""Independent float64 oracle of the segment reductions: plain Python loops over segments and columns.

Imports only torch and the standard library. Conventions as in :mod:`provable_kernels.segment` (sum, mean,
max, min over rows ``offsets[s] .. offsets[s+1]``; empty segments give ``empty`` and no gradient; max / min
give the whole upstream gradient to the first row holding the extreme value, the first NaN when there is one).
"""
from __future__ import annotations

import math

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


def _columns(x: torch.Tensor) -> list[list[float]]:
    """Rows of ``x`` flattened to columns, as float64 Python lists."""
    return x.detach().double().reshape(x.shape[0], -1).cpu().tolist()


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
