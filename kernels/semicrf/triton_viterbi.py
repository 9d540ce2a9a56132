"""Triton Viterbi backtracking for the semi-CRF.

The max recursion itself is :func:`provable_kernels.semicrf.triton_forward.semicrf_forward_kernel` with ``WRITE_BP``: per
(t, c) it writes the best duration of a segment labelled c ending at t (``bp_dur[t, c]``, the shortest among
ties) and the best previous label (smallest among ties): for 2-D transitions it does not depend on the duration
and is written once per segment *start* s (``bp_prev[s, c]``), for 3-D ones per segment *end* t
(``bp_prev[t, c]``). Backpointer memory: 2 * (T+1) * C int32 per sequence. It also writes the best final label
(smallest among ties).

This kernel follows the pointers from (L_b, best final label) back to 0, one program per sequence, and fills a
:class:`~provable_kernels.semicrf.structures.ViterbiPath`: ``durations[b, e] = d`` and ``labels[b, e] = c`` where a
segment of the best path covers [e-d+1, e] (both zero-filled beforehand).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T", "C"])
def semicrf_backtrack_kernel(bp_dur, bp_prev, last_label, lengths, durations, labels, T, C,
                             PREV_BY_START: tl.constexpr):
    """One program per sequence: walk the backpointers from the end of the sequence to position 0."""
    b = tl.program_id(0).to(tl.int64)
    bp_dur += b * (T + 1) * C
    bp_prev += b * (T + 1) * C
    durations += b * T
    labels += b * T
    end = tl.minimum(tl.maximum(tl.load(lengths + b), 1), T).to(tl.int32)  # clamped as in the forward
    label = tl.load(last_label + b)
    while end > 0:
        d = tl.maximum(tl.load(bp_dur + end * C + label), 1)  # a duration is >= 1; never loop forever
        tl.store(durations + end - 1, d.to(tl.int64))
        tl.store(labels + end - 1, label.to(tl.int64))
        start = end - d
        if PREV_BY_START:
            row = start
        else:
            row = end
        label = tl.load(bp_prev + row * C + label, mask=start > 0, other=0)
        end = start
