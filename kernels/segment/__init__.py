"""Segment reductions: sum, mean, max and min of the rows of ``x`` (N, ...) over sorted segments, forward and
backward, deterministic, with first-occurrence ties.

``segment_reduce(x, reduce, *, offsets=None, ids=None, num_segments=None, empty=0.0)`` -> (S, *x.shape[1:]).
Segments are given by CSR ``offsets`` (S+1,) or by sorted ``ids`` (N,). Empty segments give ``empty`` for every
reduction (mean included, never NaN) and receive no gradient. The gradient of max / min goes, whole, to the
first row (lowest index) holding the extreme value, whatever the sign of the upstream gradient; NaN propagates
to its segment and the first NaN is the arg. float32, float64, bfloat16 and float16; sums accumulate in float32
(float64 for float64). The standalone adjoints ``segment_max_backward(grad_output, x, *, offsets=None,
ids=None)`` and ``segment_min_backward`` recompute the arg and are bitwise equal to the autograd path.

The Triton forward reduces each short segment (at most 256 rows on a GPU) in registers, several per program, and
cuts a longer one, from its first row, into chunks whose size comes from its own length; the program of a segment's
last chunk combines the chunks' partials in chunk order, so many short segments and one segment of millions of rows
both fill the GPU. No atomic arithmetic on data, bitwise repeatable, and a segment's bits do not depend on the other
segments of the batch. A public call is one kernel launch in either index form (with ids the chunk kernel finds the
offsets itself), the backward one; nothing else runs on the device. Value checks
(sortedness, ranges): on CPU tensors a failed check raises the named error (one host read); on CUDA nothing is read
on the host, the kernels check the index themselves and the segments a bad index spoils are NaN. The ids form
without ``num_segments`` reads S from the device (a host sync).
"""
from provable_kernels.segment.dispatch import (
    TREE,
    segment_max_backward,
    segment_min_backward,
    segment_reduce,
)

__all__ = ["TREE", "segment_reduce", "segment_max_backward", "segment_min_backward"]
