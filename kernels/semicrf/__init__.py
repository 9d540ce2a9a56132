"""Semi-Markov CRF: streaming partition and Viterbi (Triton and PyTorch), an exact backend with seven semirings,
and an nn.Module head.

A segmentation of [0, L) is a list of contiguous segments (start, duration 1..K inclusive, label). Its score is
the sum of segment scores (emission from prefix sums ``cum_scores``, ``duration_bias``, optional boundary
projections) plus ``transition[prev, next]`` between consecutive segments; the first segment pays no transition.
The streaming routes compute edges on the fly with O(K*C) live state per sequence; the exact backend works on a
pre-built edge tensor (``edges_from_streaming``) and supports every semiring.
"""
from provable_kernels.semicrf.dispatch import TREE, semi_crf_streaming_forward, semi_crf_viterbi
from provable_kernels.semicrf.exact import SemiMarkov, edges_from_streaming
from provable_kernels.semicrf.head import SemiMarkovCRFHead
from provable_kernels.semicrf.scoring import path_score, starts_from_labels
from provable_kernels.semicrf.structures import Segment, ViterbiResult

__all__ = [
    "TREE",
    "semi_crf_streaming_forward",
    "semi_crf_viterbi",
    "SemiMarkov",
    "edges_from_streaming",
    "SemiMarkovCRFHead",
    "path_score",
    "starts_from_labels",
    "Segment",
    "ViterbiResult",
]
