"""Segment reductions: sum, mean, max and min of the rows of ``x`` (N, ...) over sorted segments, forward and
backward, deterministic, with first-occurrence ties.

``segment_reduce(x, reduce, *, offsets=None, ids=None, num_segments=None, empty=0.0)`` -> (S, *x.shape[1:]).
Segments are given by CSR ``offsets`` (S+1,) or by sorted ``ids`` (N,). Empty segments give ``empty`` for every
reduction (mean included, never NaN) and receive no gradient. The gradient of max / min goes, whole, to the
first row (lowest index) holding the extreme value, whatever the sign of the upstream gradient; NaN propagates
to its segment and the first NaN is the arg. float32, float64, bfloat16 and float16; sums accumulate in float32
(float64 for float64). The standalone adjoints ``segment_max_backward(grad_output, x, *, offsets=None,
ids=None)`` and ``segment_min_backward`` recompute the arg and are bitwise equal to the autograd path.

The Triton forward cuts segments into chunks of at most R rows (R from the row count alone) and reduces each chunk
in registers, several short chunks per program; chunks of a segment longer than R are combined in chunk order by
a second pass, so many short segments and one segment of millions of rows both fill the GPU; no atomics,
bitwise repeatable. Value checks (sortedness, ranges) are one
batch of device reductions: on CPU tensors a failed check raises the named error (one host read); on CUDA
nothing is read on the host, a bad index is swapped for a valid one and the outputs are NaN when a check failed. The
ids form without ``num_segments`` reads S from the device (a host sync).
"""
from provable_kernels.segment.dispatch import (
    TREE,
    segment_max_backward,
    segment_min_backward,
    segment_reduce,
)

__all__ = ["TREE", "segment_reduce", "segment_max_backward", "segment_min_backward"]
