"""Registration of the semi-CRF family with sentinel (imported only by :mod:`kernel_sentinel.registry`).

The family has three decision trees, each registered by its own part: the streaming entry points
(:mod:`~provable_kernels.semicrf.family_streaming`), the head (:mod:`~provable_kernels.semicrf.family_head`) and
the exact backend (:mod:`~provable_kernels.semicrf.family_exact`). Each part provides ``make_case``, ``run``,
``reference``, oracles, properties, adversarial and bad inputs for its routes; this module assembles them with
the family-wide declarations: guards, invariants (linked tests), failure modes and known issues.
"""
from __future__ import annotations

from typing import Any

import torch

import provable_kernels.semicrf as package
from provable_kernels import semiring as semirings
from provable_kernels.semicrf import autograd, family_exact, family_head, family_streaming, torch_ops
from provable_kernels.semicrf.call import make_call
from provable_kernels.semicrf.dispatch import TREE
from provable_kernels.semicrf.exact import EXACT_TREE
from provable_kernels.semicrf.family_tolerances import TOLERANCES
from provable_kernels.semicrf.head import HEAD_TREE
from provable_kernels.triton_math import lse_shift
from kernel_sentinel.family import Family, FailureMode, Guard, Invariant, KnownIssue

REF, EXACT, HEAD, TRITON = (f"tests/test_semicrf_{name}.py" for name in ("reference", "exact", "head", "triton"))
INVARIANTS = (
    Invariant("Every route is reached by the dispatcher and passes route, reference, exact, property, guard and "
              "bad-input checks.", "tests/test_verify.py::test_every_semicrf_route_passes_quick"),
    Invariant("logZ and the max score equal brute-force enumeration of every segmentation (durations 1..K, K "
              "inclusive; the first segment pays no transition).", f"{REF}::test_partition_matches_oracle"),
    Invariant("Viterbi returns the brute-force best segmentation; ties prefer the shorter duration, then the "
              "smaller label.", f"{REF}::test_viterbi_ties_prefer_shorter_duration_then_smaller_label"),
    Invariant("The hand-written backward equals autograd of a brute force for all five inputs.",
              f"{REF}::test_log_gradients_match_brute_force"),
    Invariant("The max route's gradient is the indicator of the best path.",
              f"{REF}::test_max_gradients_are_the_best_path_indicator"),
    Invariant("A sequence with no finite segmentation gives -inf and zero gradients, never NaN.",
              f"{REF}::test_impossible_sequence_gives_neg_inf_and_zero_gradients"),
    Invariant("Repeated runs are bitwise identical.", f"{REF}::test_repeated_runs_are_bitwise_identical"),
    Invariant("Float32 inputs at T = 100,000: logZ relative error <= 1e-6 against float64.",
              f"{REF}::test_float32_stays_accurate_at_T_100000"),
    Invariant("One edge convention: edges_from_streaming + SemiMarkov score every segmentation like the streaming "
              "convention.", f"{EXACT}::test_edges_mean_the_streaming_convention"),
    Invariant("The counting semiring counts segmentations exactly.", f"{EXACT}::test_counting_gives_exact_counts"),
    Invariant("The loss is normalised: NLL >= 0 for every gold and exp(-NLL) sums to 1 over all segmentations.",
              f"{HEAD}::test_nll_is_a_normalised_negative_log_likelihood"),
    Invariant("Every wrong argument raises ValueError/TypeError naming it.",
              "tests/test_semicrf_api.py::test_bad_argument_raises_naming_it"),
    Invariant("The Triton backward equals autograd of a brute force for all five inputs.",
              f"{TRITON}::test_log_gradients_against_brute_force"),
    Invariant("Triton gradients are bitwise identical on repeated runs (no atomics on outputs).",
              f"{TRITON}::test_gradients_are_bitwise_deterministic"),
    Invariant("Triton Viterbi follows the reference's tie rule.", f"{TRITON}::test_viterbi_against_oracle_with_ties"),
)

PARTS = {"semicrf.head.": family_head, "semicrf.exact.": family_exact}  # the other routes: the streaming tree's


def _part(route_id: str) -> Any:
    """The module registering ``route_id``'s tree."""
    return next((part for prefix, part in PARTS.items() if route_id.startswith(prefix)), family_streaming)


FAILURE_MODES = (  # symptom -> the trace section to read first, a second page, what covers it
    FailureMode("NaN in the loss", "semicrf/partition-triton.md#numerical-guards",
                "guide/semicrf-training.md#value-checks-and-host-syncs",
                "guards check (-inf transitions, huge scores, length 1); written check (poisoned allocations); "
                "NaN inputs rejected by validation", checks=("guards", "written"), signs=("has NaN", "has inf", "poisoned")),
    FailureMode("NaN in the backward", "semicrf/partition-triton.md#numerical-guards",
                "guide/semicrf-training.md#accuracy-and-score-magnitude",
                "guards check on the training routes; the -inf-safe logsumexp shift (Numerical guards)",
                checks=("guards", "written"), signs=("has NaN", "has inf", "poisoned"), routes=("semicrf.*.train",)),
    FailureMode("wrong gradients", "semicrf/partition-triton.md#routes",
                "guide/semicrf-conventions.md#loss-and-decoding",
                "reference and exact checks (every gradient vs the float64 oracle); finite-difference property",
                checks=("reference", "exact", "properties", "guards"),
                signs=("grad", "derivative"), routes=("semicrf.*.train",)),
    FailureMode("out of memory", "semicrf/index.md#known-issues", "guide/semicrf-conventions.md#exact-backend-edges",
                "the streaming routes' O(T*C) per sequence (the Triton training route's saved gradients, the PyTorch "
                "route's float64 inputs); the exact backend is for small problems"),
    FailureMode("backend mismatch", "semicrf/partition-triton.md#verification", "semicrf/partition-torch.md#routes",
                "reference and exact checks: both backends against the same float64 oracle",
                checks=("reference", "exact"), routes=("semicrf.triton.*", "semicrf.torch.*")),
    FailureMode("wrong route taken", "semicrf/index.md#dispatch-conditions", "semicrf/index.md#decision-tree",
                "route check: the dispatcher records the route id it took", checks=("route",)),
)

FAMILY = Family(
    name="semicrf", package=package, tree=TREE, more_trees=(HEAD_TREE, EXACT_TREE),
    entry_points={**family_streaming.ENTRIES, **family_head.ENTRY_POINTS, **family_exact.ENTRY_POINTS},
    make_case=lambda route_id, **options: _part(route_id).make_case(route_id, **options),
    run=lambda case: _part(case.route_id).run(case), reference=lambda case: _part(case.route_id).reference(case),
    tolerances=TOLERANCES, dtypes=(torch.float32, torch.float64),
    oracles=family_streaming.ORACLES + family_head.ORACLES + family_exact.ORACLES,
    properties=family_streaming.PROPERTIES + family_head.PROPERTIES + family_exact.PROPERTIES,
    adversarial=family_streaming.ADVERSARIAL + family_head.ADVERSARIAL + family_exact.ADVERSARIAL,
    bad_inputs=family_streaming.BAD_INPUTS + family_head.BAD_INPUTS + family_exact.BAD_INPUTS, invariants=INVARIANTS,
    batch_items=family_streaming.BATCH_ITEMS + family_head.BATCH_ITEMS + family_exact.BATCH_ITEMS,
    guards=(
        Guard("Arguments are validated before dispatch: wrong type, rank, shape, dtype or device, lengths outside "
              "1..T, K < 1, NaN/+inf scores raise ValueError/TypeError naming the argument.", make_call),
        Guard("A semiring sum over only -inf terms is -inf with zero gradient, never NaN (the exact backend's "
              "safe logsumexp).", semirings.logsumexp),
        Guard("Triton kernels shift every logsumexp by where(max == -inf, 0, max): a slice of only -inf terms gives "
              "-inf, never NaN (the shared provable_kernels.triton_math helpers).", lse_shift.fn),
        Guard("A sequence with no segmentation of finite score (e.g. every transition -inf and L > K) gets logZ "
              "= -inf and zero gradients in the PyTorch backward.", torch_ops.backward),
        Guard("The max route's gradient is the indicator of the decoded path, zero where the best score is -inf.",
              autograd.max_partition),
    ),
    failure_modes=FAILURE_MODES,
    known_issues=(
        KnownIssue("A sequence with no segmentation of finite score gets -inf (partition and Viterbi score); its "
                   "decoded Viterbi segments are then some valid segmentation, not a meaningful one.", "low",
                   "only when -inf scores forbid every segmentation of a sequence",
                   "by design and documented; the guards check gives -inf there, never NaN"),
        KnownIssue("The exact backend builds the (B, T, K, C, C) edge tensor: it is for verification and small "
                   "problems only.", "medium", "every exact-backend call; memory grows as B*T*K*C^2",
                   "use the streaming routes (the head chooses them above its memory threshold)"),
        *family_exact.KNOWN_ISSUES,
    ),
)
