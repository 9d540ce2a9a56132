"""The PyTorch semi-CRF routes (``use_triton=False``) against independent references.

References (kernels/semicrf/oracle.py, none of them sharing code with ``kernels``): the brute-force oracle in
plain Python, a differentiable brute force (every segmentation scored with torch ops, then logsumexp / max,
differentiated by autograd), and the naive recursion (every alpha kept, no ring or checkpoints, autograd).
"""
from __future__ import annotations

import math
from typing import Optional

import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import SEMICRF_TENSORS as NAMES
from conftest import SemiCRFCase as Case
from conftest import semicrf_case as make_case
from conftest import with_zero_row
from provable_kernels.semicrf import semi_crf_streaming_forward
from provable_kernels.dispatch import recording
from provable_kernels.semicrf.dispatch import semi_crf_viterbi
from provable_kernels.semicrf import oracle

CASES = {
    "linear_chain_K1": dict(B=2, T=4, K=1, C=3),
    "K2": dict(B=2, T=5, K=2, C=2, variable=True),
    "K_greater_than_T": dict(B=2, T=3, K=5, C=2, variable=True),
    "trans3d": dict(B=2, T=5, K=3, C=2, trans3d=True, variable=True),
    "trans3d_K_greater_than_T": dict(B=1, T=3, K=4, C=2, trans3d=True),
    "proj_start": dict(B=2, T=4, K=3, C=2, proj_start=True),
    "proj_end": dict(B=2, T=4, K=3, C=2, proj_end=True, variable=True),
    "both_projections_3d": dict(B=3, T=5, K=2, C=2, trans3d=True, proj_start=True, proj_end=True, variable=True),
    "T1": dict(B=2, T=1, K=2, C=3, proj_start=True, proj_end=True),
    "C1": dict(B=2, T=5, K=3, C=1, trans3d=True, variable=True),
}
DTYPES = {torch.float64: 1e-12, torch.float32: 1e-6}  # relative tolerance of values; float32 only rounds the output


def grads(out: torch.Tensor, case: Case, weight: torch.Tensor) -> list[Optional[torch.Tensor]]:
    present = [t for t in case.tensors if t is not None]
    found = iter(torch.autograd.grad((out * weight).sum(), present, retain_graph=True,
                                       materialize_grads=True))
    return [None if t is None else next(found) for t in case.tensors]


def assert_close(actual, expected, rtol, atol=0.0):
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------------------ values


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("name", list(CASES))
def test_partition_matches_oracle(name, semiring, dtype):
    """logZ and the max score equal brute-force enumeration of every segmentation (durations 1..K, K inclusive; the
    first segment pays no transition)."""
    case = make_case(**CASES[name], dtype=dtype)
    with recording() as taken:
        value = case.forward(semiring)
    assert taken == [f"semicrf.torch.{semiring}.infer"]
    scored = case.oracle_scores()
    expected = oracle.log_partition(scored) if semiring == "log" else [s for _, s in oracle.best(scored)]
    assert value.dtype == dtype and value.shape == (case.cum_scores.shape[0],)
    assert_close(value, torch.tensor(expected, dtype=torch.float64), rtol=DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(CASES))
def test_viterbi_matches_oracle(name, dtype):
    case = make_case(**CASES[name], dtype=dtype, seed=1)
    with recording() as taken:
        result = case.viterbi()
    assert taken == ["semicrf.torch.viterbi"]
    for b, (best, best_score) in enumerate(oracle.best(case.oracle_scores())):
        assert [(seg.start, seg.duration, seg.label) for seg in result.segments[b]] == list(best)
        assert math.isclose(float(result.scores[b]), best_score, rel_tol=DTYPES[dtype])
        assert math.isclose(sum(seg.score for seg in result.segments[b]), best_score, rel_tol=1e-12)


def test_viterbi_ties_prefer_shorter_duration_then_smaller_label():
    """Viterbi returns the brute-force best segmentation; ties prefer the shorter duration, then the smaller label.

    All-zero scores: every segmentation scores 0; the decode must be all duration-1 segments of label 0."""
    T, K, C = 4, 3, 2
    zero = torch.zeros
    result = semi_crf_viterbi(zero(1, T + 1, C), zero(C, C), zero(K, C), torch.tensor([T]), K, use_triton=False)
    assert [(s.start, s.duration, s.label) for s in result.segments[0]] == [(t, 1, 0) for t in range(T)]


# --------------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(CASES))
def test_log_gradients_match_brute_force(name, dtype):
    """The hand-written backward equals autograd of a brute force for all five inputs."""
    case = make_case(**CASES[name], dtype=dtype, seed=2).leaves()
    weight = torch.randn(case.cum_scores.shape[0], dtype=dtype, generator=torch.Generator().manual_seed(3))
    with recording() as taken:
        got = grads(case.forward("log"), case, weight)
    assert taken == ["semicrf.torch.log.train"]
    want = grads(case.brute_force(), case, weight.double())
    for name_, g, w in zip(NAMES, got, want):
        assert (g is None) == (w is None), name_
        if g is not None:
            assert g.dtype == dtype and g.shape == w.shape, name_
            assert_close(g, w, rtol=1e-5 if dtype == torch.float32 else 1e-9, atol=1e-6 if dtype == torch.float32
                         else 1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_max_gradients_are_the_best_path_indicator(name):
    """The max route's gradient is the indicator of the best path."""
    case = make_case(**CASES[name], seed=4).leaves()
    weight = torch.rand(case.cum_scores.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with recording() as taken:
        value = case.forward("max")
        got = grads(value, case, weight)
    assert taken == ["semicrf.torch.max.train"]
    expected = case.brute_force("max")
    assert_close(value, expected, rtol=1e-12)
    for g, w in zip(got, grads(expected, case, weight)):
        assert (g is None) == (w is None)
        if g is not None:
            assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("name", list(CASES))
def test_naive_recursion_matches_brute_force(name, semiring):
    """The reference of ``sentinel verify`` (oracle.naive_partition) against the enumeration: values and every
    gradient by autograd (for max, the best path's indicator)."""
    case = make_case(**CASES[name], seed=13).leaves()
    weight = torch.rand(case.cum_scores.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(14))
    value, expected = case.naive(semiring), case.brute_force(semiring)
    assert_close(value, expected, rtol=1e-12)
    for g, w in zip(grads(value, case, weight), grads(expected, case, weight)):
        assert (g is None) == (w is None)
        if g is not None:
            assert_close(g, w, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("trans3d", [False, True])
def test_gradcheck_float64(trans3d):
    case = make_case(B=2, T=4, K=3, C=2, trans3d=trans3d, proj_start=True, proj_end=True, variable=True, seed=6)
    rest = case.tensors[0][:, 1:].detach().requires_grad_()  # cum_scores[:, 0] = 0 is pinned
    leaves = [rest] + [t.requires_grad_() for t in case.tensors[1:]]

    def logZ(rest, *tensors):
        return case.with_tensors((with_zero_row(rest), *tensors)).forward("log")

    assert torch.autograd.gradcheck(logZ, leaves)


def test_gradient_of_one_input_alone():
    case = make_case(B=2, T=4, K=2, C=2, proj_start=True, proj_end=True, variable=True, seed=12)
    cum = case.cum_scores.clone().requires_grad_()
    only_cum = case.with_tensors([cum, *case.tensors[1:]])
    only_cum.forward().sum().backward()
    expected, = torch.autograd.grad(only_cum.brute_force().sum(), cum)
    assert_close(cum.grad, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("trans3d", [False, True])
def test_checkpointed_backward_across_many_intervals(trans3d):
    """T = 150, K = 4: the backward recomputes over ceil(150 / ceil(sqrt(600))) = 6 checkpoint intervals; compare
    with autograd through the naive recursion that keeps every alpha."""
    case = make_case(B=2, T=150, K=4, C=3, trans3d=trans3d, proj_start=True, proj_end=True, variable=True,
                     seed=7).leaves()
    case.lengths[1] = 97
    weight = torch.tensor([0.7, -1.3], dtype=torch.float64)
    value = case.forward()
    expected = case.naive()
    assert_close(value, expected, rtol=1e-12)
    for g, w in zip(grads(value, case, weight), grads(expected, case, weight)):
        assert_close(g, w, rtol=1e-9, atol=1e-12)


# -------------------------------------------------------------------------------------------------- -inf guards


def test_neg_inf_transitions_give_finite_values_and_gradients():
    case = make_case(B=2, T=4, K=2, C=3, trans3d=True, proj_end=True, variable=True, seed=8)
    case.transition[0, 0, 1] = case.transition[1, :, 2] = float("-inf")
    case.duration_bias[1, 0] = float("-inf")
    case = case.leaves()
    weight = torch.tensor([1.0, 0.5], dtype=torch.float64)
    for semiring in ("log", "max"):
        value = case.forward(semiring)
        expected = case.brute_force(semiring)
        assert torch.isfinite(value).all()
        assert_close(value, expected, rtol=1e-12)
        for g, w in zip(grads(value, case, weight), grads(expected, case, weight)):
            if g is not None:
                assert torch.isfinite(g).all()
                assert_close(g, w, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("semiring", ["log", "max"])
def test_impossible_sequence_gives_neg_inf_and_zero_gradients(semiring):
    """A sequence with no finite segmentation gives -inf and zero gradients, never NaN.

    K = 1 with every transition -inf: a sequence of length 1 (one segment, no transition) is possible, one of
    length 3 is not. The second gets -inf and zero gradients; the first is untouched."""
    case = make_case(B=2, T=3, K=1, C=2, proj_start=True, seed=9)
    case.transition.fill_(float("-inf"))
    case.lengths = torch.tensor([1, 3])
    case = case.leaves()
    value = case.forward(semiring)
    assert value[1] == float("-inf") and torch.isfinite(value[0])
    expected = case.brute_force(semiring)
    assert_close(value, expected, rtol=1e-12)
    got = grads(value, case, torch.ones(2, dtype=torch.float64))
    single = grads(value[0], case, torch.ones((), dtype=torch.float64))
    for g, g0 in zip(got[:4], single[:4]):  # no proj_end
        assert not torch.isnan(g).any()
        torch.testing.assert_close(g, g0, rtol=0, atol=0)
    assert got[0][1].abs().sum() == 0 and got[3][1].abs().sum() == 0
    result = case.viterbi()
    assert result.scores[1] == float("-inf")
    assert sum(seg.duration for seg in result.segments[1]) == 3


# ------------------------------------------------------------------------------------------- determinism, scale


def test_repeated_runs_are_bitwise_identical():
    """Repeated runs are bitwise identical.

    Values and every gradient of both training routes (log: hand-written backward; max: path indicator)."""
    def run(semiring: str) -> list[torch.Tensor]:
        case = make_case(B=3, T=30, K=4, C=3, trans3d=True, proj_start=True, proj_end=True, variable=True,
                         dtype=torch.float32, seed=10).leaves()
        with recording() as taken:
            value = case.forward(semiring)
        assert taken == [f"semicrf.torch.{semiring}.train"]
        return [value] + grads(value, case, torch.linspace(0.5, 1.5, 3))

    for semiring in ("log", "max"):
        for a, b in zip(run(semiring), run(semiring)):
            assert torch.equal(a, b), semiring


def test_float32_stays_accurate_at_T_100000():
    """Float32 inputs at T = 100,000: logZ relative error <= 1e-6 against float64.

    Inputs drawn in float64; the float32 run gets them rounded to float32, the oracle's float64 recursion the
    float64 originals: logZ from float32 inputs is within 1e-6 relative of logZ from the exact inputs."""
    exact = make_case(B=1, T=100_000, K=2, C=2, dtype=torch.float64, seed=11)
    rounded = exact.to(torch.float32)
    value = rounded.forward()
    reference = exact.naive()
    assert value.dtype == torch.float32 and reference.dtype == torch.float64
    assert abs(float(value) - float(reference)) <= 1e-6 * abs(float(reference))


# ---------------------------------------------------------------------------------------------------- property


@settings(derandomize=True, max_examples=25, deadline=None)
@given(T=st.integers(1, 4), K=st.integers(1, 4), C=st.integers(1, 2), trans3d=st.booleans(),
       proj_start=st.booleans(), proj_end=st.booleans(), seed=st.integers(0, 2**16))
def test_property_log_and_max_match_oracle(T, K, C, trans3d, proj_start, proj_end, seed):
    case = make_case(B=2, T=T, K=K, C=C, trans3d=trans3d, proj_start=proj_start, proj_end=proj_end, variable=True,
                     seed=seed)
    logZ, best = case.forward("log"), case.forward("max")
    scored = case.oracle_scores()
    assert_close(logZ, torch.tensor(oracle.log_partition(scored), dtype=torch.float64), rtol=1e-12)
    assert_close(best, torch.tensor([s for _, s in oracle.best(scored)], dtype=torch.float64), rtol=1e-12)
    assert (logZ >= best).all()


def test_rows_past_a_length_get_positive_zero_gradients_whatever_the_neighbours():
    """The PyTorch backward computes rows past a sequence's length when a longer neighbour shares the batch (zero
    times a negative weight is -0.0 there): every such row is +0.0, so a sequence's gradients are bitwise the same
    alone and in the batch."""
    torch.manual_seed(0)
    C, K, T = 3, 2, 6
    cum = torch.randn(2, T + 1, C).cumsum(1)
    cum[:, 0] = 0
    trans, dur, ps = torch.randn(C, C), torch.randn(K, C), torch.randn(2, T, C)

    def gradients(rows, lengths, weights):
        leaves = [cum[rows].clone().requires_grad_(), ps[rows].clone().requires_grad_()]
        out = semi_crf_streaming_forward(leaves[0], trans, dur, lengths, K, proj_start=leaves[1], use_triton=False)
        return torch.autograd.grad((out * weights).sum(), leaves)

    alone = gradients([0], torch.tensor([3]), torch.tensor([-1.0]))
    batch = gradients([0, 1], torch.tensor([3, 6]), torch.tensor([-1.0, 0.5]))
    for a, b in zip(alone, batch):
        assert torch.equal(a[0], b[0]) and torch.equal(torch.signbit(a[0]), torch.signbit(b[0]))
    assert not torch.signbit(batch[0][0, 4:]).any() and not torch.signbit(batch[1][0, 3:]).any()
