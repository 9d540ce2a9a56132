"""Exact backend (edges_from_streaming + SemiMarkov) for every semiring against the brute-force oracle."""
import math

import pytest
import torch
from conftest import with_zero_row
from hypothesis import given, settings, strategies as st

from provable_kernels.semicrf.dispatch import semi_crf_streaming_forward
from provable_kernels.semicrf.exact import SemiMarkov, edges_from_streaming
from provable_kernels.semicrf.semiring import Counting, CrossEntropy, Entropy, KLDivergence, KMax, Log, Max
from provable_kernels.semicrf import oracle

F64 = torch.float64


def model(B, T, K, C, *, three_d=False, projections=(False, False), seed=0, dtype=F64):
    """Streaming parameters as keyword arguments of edges_from_streaming (random, seeded)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=F64).to(dtype)
    return dict(cum_scores=torch.cat([torch.zeros(B, 1, C, dtype=dtype), r(B, T, C).cumsum(1)], dim=1),
                transition=r(K, C, C) if three_d else r(C, C), duration_bias=r(K, C), K=K,
                proj_start=r(B, T, C) if projections[0] else None, proj_end=r(B, T, C) if projections[1] else None)


def segment_marginals(scored, T: int, K: int, C: int) -> torch.Tensor:
    """P(segment (s, d, c) is in y) from the oracle's enumeration, as a (B, T, K, C) float64 tensor indexed
    [b, s, d-1, c]."""
    out = torch.zeros(len(scored), T, K, C, dtype=torch.float64)
    for b, items in enumerate(scored):
        for (y, _), p in zip(items, oracle.probabilities(items)):
            for s, d, c in y:
                out[b, s, d - 1, c] += p
    return out


def cross_entropy(scored_p, scored_q) -> list[float]:
    """H(p, q) = -sum_y p(y) log q(y) per batch element (both lists enumerate the same segmentations)."""
    pairs = [(oracle.probabilities(p), oracle.probabilities(q)) for p, q in zip(scored_p, scored_q)]
    return [-sum(pi * math.log(qi) for pi, qi in zip(p, q) if pi > 0) for p, q in pairs]


def kl_divergence(scored_p, scored_q) -> list[float]:
    """KL(p || q) = sum_y p(y) (log p(y) - log q(y)) per batch element."""
    pairs = [(oracle.probabilities(p), oracle.probabilities(q)) for p, q in zip(scored_p, scored_q)]
    return [sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q) if pi > 0) for p, q in pairs]


def brute(params, lengths):
    """The oracle's (segmentation, score) lists, straight from the streaming parameters."""
    p = dict(params)
    return oracle.all_scores(p.pop("cum_scores"), p.pop("transition"), p.pop("duration_bias"), lengths, **p)


CASES = {
    # B, T, K, C, 3-D transition, (proj_start, proj_end), lengths
    "linear_chain": (2, 4, 1, 3, False, (False, False), [4, 2]),
    "k2_3d_start": (2, 4, 2, 2, True, (True, False), [4, 3]),
    "k_above_t": (1, 3, 5, 2, False, (False, True), [3]),
    "mixed_lengths": (3, 5, 3, 2, True, (True, True), [5, 1, 3]),
}


def case(name, seed=0, dtype=F64):
    B, T, K, C, three_d, proj, lengths = CASES[name]
    return model(B, T, K, C, three_d=three_d, projections=proj, seed=seed, dtype=dtype), torch.tensor(lengths)


def expect_close(got, expected, tol=1e-10):
    torch.testing.assert_close(got, torch.tensor(expected, dtype=got.dtype), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", CASES)
def test_edges_mean_the_streaming_convention(name):
    """One edge convention: edges_from_streaming + SemiMarkov score every segmentation like the streaming convention."""
    params, lengths = case(name)
    edge = edges_from_streaming(**params)
    (B, T1, C), K = params["cum_scores"].shape, params["K"]
    assert edge.shape == (B, T1 - 1, K, C, C)
    for from_edges, direct in zip(oracle.all_scores_from_edges(edge, lengths), brute(params, lengths)):
        assert [y for y, _ in from_edges] == [y for y, _ in direct]
        expect_close(torch.tensor([s for _, s in from_edges], dtype=F64), [s for _, s in direct], 1e-12)
    s, d = torch.meshgrid(torch.arange(edge.shape[1]), torch.arange(1, K + 1), indexing="ij")
    assert (edge[:, s + d > edge.shape[1]] == -math.inf).all()
    assert torch.isfinite(edge[:, s + d <= edge.shape[1]]).all()


@pytest.mark.parametrize("name", CASES)
def test_semirings_against_oracle(name):
    params, lengths = case(name)
    edge, scored = edges_from_streaming(**params), brute(params, lengths)
    expect_close(SemiMarkov(Log()).logpartition(edge, lengths), oracle.log_partition(scored))
    real_z = [sum(math.exp(s) for _, s in items) for items in scored]  # Counting on real weights: Z itself
    expect_close(SemiMarkov(Counting()).logpartition(edge.exp(), lengths), real_z)
    expect_close(SemiMarkov(Max()).logpartition(edge, lengths), [s for _, s in oracle.best(scored)])
    expect_close(SemiMarkov(KMax(4)).logpartition(edge, lengths), list(zip(*oracle.top_k(scored, 4))))
    expect_close(SemiMarkov(Entropy()).logpartition(edge, lengths), oracle.entropy(scored))


@settings(max_examples=15, derandomize=True, deadline=None)
@given(T=st.integers(1, 4), K=st.integers(1, 4), C=st.integers(1, 3), three_d=st.booleans(),
       proj=st.tuples(st.booleans(), st.booleans()), short=st.integers(0, 3), seed=st.integers(0, 99))
def test_random_shapes_against_oracle(T, K, C, three_d, proj, short, seed):
    params = model(2, T, K, C, three_d=three_d, projections=proj, seed=seed)
    lengths = torch.tensor([T, max(1, T - short)])
    edge, scored = edges_from_streaming(**params), brute(params, lengths)
    expect_close(SemiMarkov(Log()).logpartition(edge, lengths), oracle.log_partition(scored))
    expect_close(SemiMarkov(Max()).logpartition(edge, lengths), [s for _, s in oracle.best(scored)])
    expect_close(SemiMarkov(Entropy()).logpartition(edge, lengths), oracle.entropy(scored))


@pytest.mark.parametrize("name", CASES)
def test_cross_entropy_and_kl_against_oracle(name):
    (p, lengths), (q, _) = case(name, seed=1), case(name, seed=2)
    edges = (edges_from_streaming(**p), edges_from_streaming(**q))
    scored_p, scored_q = brute(p, lengths), brute(q, lengths)
    expect_close(SemiMarkov(CrossEntropy()).logpartition(edges, lengths), cross_entropy(scored_p, scored_q))
    expect_close(SemiMarkov(KLDivergence()).logpartition(edges, lengths), kl_divergence(scored_p, scored_q))
    same = SemiMarkov(KLDivergence()).logpartition((edges[0], edges[0]), lengths)
    expect_close(same, [0.0] * len(lengths))


@pytest.mark.parametrize("name", CASES)
def test_float32_log_partition(name):
    params, lengths = case(name, dtype=torch.float32)
    got = SemiMarkov(Log()).logpartition(edges_from_streaming(**params), lengths)
    assert got.dtype == torch.float32
    expect_close(got.double(), oracle.log_partition(brute(params, lengths)), 1e-5)


def count_recurrence(L, K, C):
    """Number of labeled segmentations of [0, L): n(0) = 1, n(t) = C * sum_{d=1..min(K,t)} n(t-d)."""
    n = [1]
    for t in range(1, L + 1):
        n.append(C * sum(n[t - d] for d in range(1, min(K, t) + 1)))
    return n[L]


@pytest.mark.parametrize("T,K,C", [(12, 1, 3), (12, 4, 2), (6, 9, 2), (1, 1, 1)])
def test_counting_gives_exact_counts(T, K, C):
    """The counting semiring counts segmentations exactly.

    Counting on real weights of an all-zero model; K = 1 is the linear scan (C^L)."""
    zeros = dict(cum_scores=torch.zeros(2, T + 1, C, dtype=F64), transition=torch.zeros(C, C, dtype=F64),
                 duration_bias=torch.zeros(K, C, dtype=F64), K=K)
    lengths = torch.tensor([T, max(1, T // 2)])
    counts = SemiMarkov(Counting()).logpartition(edges_from_streaming(**zeros).exp(), lengths)
    assert counts.tolist() == [count_recurrence(int(L), K, C) for L in lengths]
    if K == 1:
        assert counts.tolist() == [C ** int(L) for L in lengths]


def test_counting_with_forbidden_transitions_counts_allowed_segmentations():
    params = model(1, 5, 2, 3, three_d=True)
    params["transition"][1, 0, 2] = -math.inf
    params["transition"][0, 1, :] = -math.inf
    lengths = torch.tensor([5])
    allowed = sum(math.isfinite(s) for _, s in brute(params, lengths)[0])
    weights = (edges_from_streaming(**params) > -math.inf).to(F64)
    assert SemiMarkov(Counting()).logpartition(weights, lengths).tolist() == [allowed]
    assert allowed < len(oracle.segmentations(5, 2, 3))


def test_kmax_on_linear_chain_and_fewer_structures_than_k():
    params, lengths = case("linear_chain")
    scored = brute(params, lengths)
    got = SemiMarkov(KMax(3)).logpartition(edges_from_streaming(**params), lengths)
    assert got.shape == (3, 2)
    expect_close(got, list(zip(*oracle.top_k(scored, 3))))
    one = dict(model(1, 1, 1, 2), K=1)
    got = SemiMarkov(KMax(4)).logpartition(edges_from_streaming(**one), torch.tensor([1]))
    expect_close(got, [[v] for v in oracle.top_k(brute(one, torch.tensor([1])), 4)[0]])
    assert got[2:].eq(-math.inf).all()


def predecessor_marginals(edge, lengths):
    """P(segment (s, d, c) entered from c_prev) by enumeration; the first segment is entered from row 0."""
    out = torch.zeros_like(edge)
    for b, items in enumerate(oracle.all_scores_from_edges(edge, lengths)):
        for (y, _), p in zip(items, oracle.probabilities(items)):
            prev = 0
            for s, d, c in y:
                out[b, s, d - 1, prev, c] += p
                prev = c
    return out


@pytest.mark.parametrize("name", CASES)
def test_marginals_against_oracle_and_sum_rules(name):
    params, lengths = case(name)
    edge = edges_from_streaming(**params)
    B, T, K, C = edge.shape[:4]
    marginals = SemiMarkov(Log()).marginals(edge, lengths)
    torch.testing.assert_close(marginals, predecessor_marginals(edge, lengths), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(marginals.sum(3), segment_marginals(brute(params, lengths), T, K, C),
                               rtol=1e-10, atol=1e-12)
    s, d, t = torch.arange(T)[:, None, None], torch.arange(1, K + 1)[None, :, None], torch.arange(T)[None, None]
    covers = ((s <= t) & (t < s + d)).to(F64)  # (s, d, t): segment [s, s+d) covers t
    per_position = torch.einsum("bsdpc,sdt->bt", marginals, covers)
    inside = (torch.arange(T) < lengths[:, None]).to(F64)
    torch.testing.assert_close(per_position, inside, rtol=0, atol=1e-12)
    assert (marginals[:, 0, :, 1:] == 0).all()  # only the virtual start row is read at s = 0


def test_gradient_of_log_partition_is_the_marginal():
    params, lengths = case("mixed_lengths")
    edge = edges_from_streaming(**params).requires_grad_(True)
    SemiMarkov(Log()).logpartition(edge, lengths).sum().backward()
    torch.testing.assert_close(edge.grad, predecessor_marginals(edge.detach(), lengths), rtol=1e-10, atol=1e-12)


def test_max_marginals_are_the_best_path_indicator():
    params, lengths = case("mixed_lengths")
    edge = edges_from_streaming(**params)
    expected = torch.zeros_like(edge)
    for b, (y, _) in enumerate(oracle.best(brute(params, lengths))):
        prev = 0
        for s, d, c in y:
            expected[b, s, d - 1, prev, c] = 1
            prev = c
    assert torch.equal(SemiMarkov(Max()).marginals(edge, lengths), expected)


@pytest.mark.parametrize("semiring", [Log(), Entropy(), KLDivergence()], ids=repr)
def test_gradcheck_through_edges(semiring):
    params, lengths = case("k2_3d_start", seed=3)
    other = edges_from_streaming(**case("k2_3d_start", seed=4)[0]).detach()
    names = ["cum_scores", "transition", "duration_bias", "proj_start"]

    def fn(rest, *tensors):  # cum_scores[:, 0] = 0 is pinned: only the other rows move
        edge = edges_from_streaming(**dict(params, cum_scores=with_zero_row(rest), **dict(zip(names[1:], tensors))))
        return SemiMarkov(semiring).logpartition((edge, other) if semiring.pair else edge, lengths)

    rest = params["cum_scores"][:, 1:].detach().requires_grad_(True)
    assert torch.autograd.gradcheck(fn, (rest, *(params[n].requires_grad_(True) for n in names[1:])))


def test_no_allowed_segmentation_is_finite_and_documented():
    """K = 1 with every transition -inf: sequences longer than 1 have no segmentation."""
    params = model(2, 3, 1, 2)
    params["transition"] = torch.full((2, 2), -math.inf, dtype=F64, requires_grad=True)
    params["cum_scores"].requires_grad_(True)
    lengths = torch.tensor([3, 1])
    edge = edges_from_streaming(**params)
    log_z = SemiMarkov(Log()).logpartition(edge, lengths)
    assert log_z[0].item() == -math.inf and math.isfinite(log_z[1].item())
    entropy = SemiMarkov(Entropy()).logpartition(edge, lengths)
    assert entropy[0].item() == 0.0 and entropy[1].item() > 0
    (log_z[1] + entropy.sum()).backward()
    assert torch.isfinite(params["cum_scores"].grad).all() and torch.isfinite(params["transition"].grad).all()
    assert (SemiMarkov(Log()).marginals(edge, lengths)[0] == 0).all()
    assert SemiMarkov(Counting()).logpartition((edge.detach() > -math.inf).to(F64), lengths).tolist() == [0.0, 2.0]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_same_edges_same_answer_as_streaming_reference(name, semiring):
    """The exact backend and the streaming recursion read the duration convention the same way."""
    params, lengths = case(name, seed=5)
    streaming_args = dict(params)
    K = streaming_args.pop("K")
    streaming = semi_crf_streaming_forward(lengths=lengths, K=K, semiring=semiring, use_triton=False,
                                           **streaming_args)
    exact = SemiMarkov(Log() if semiring == "log" else Max()).logpartition(edges_from_streaming(**params), lengths)
    torch.testing.assert_close(streaming, exact, rtol=1e-12, atol=1e-12)


def test_bad_input():
    params, lengths = case("k2_3d_start")
    edge = edges_from_streaming(**params)
    log = SemiMarkov(Log())
    with pytest.raises(TypeError, match="semiring"):
        SemiMarkov(KMax)  # the class without k
    with pytest.raises(TypeError, match="semiring"):
        SemiMarkov("log")
    with pytest.raises(ValueError, match="edge"):
        log.logpartition(edge[0], lengths)
    with pytest.raises(ValueError, match="edge"):
        log.logpartition(edge[..., :1], lengths)
    with pytest.raises(TypeError, match="edge"):
        log.logpartition(edge.float().to(torch.float16), lengths)
    with pytest.raises(ValueError, match="edge"):
        log.logpartition(edge.clone().fill_(math.nan), lengths)
    with pytest.raises(ValueError, match="lengths"):
        log.logpartition(edge, torch.tensor([4, 5]))
    with pytest.raises(ValueError, match="lengths"):
        log.logpartition(edge, torch.tensor([4]))
    with pytest.raises(TypeError, match="edge"):
        SemiMarkov(CrossEntropy()).logpartition(edge, lengths)
    with pytest.raises(ValueError, match=r"edge\[1\]"):
        SemiMarkov(KLDivergence()).logpartition((edge, edge[:, :2]), lengths)
    with pytest.raises(ValueError, match="edge"):
        SemiMarkov(Counting()).logpartition(edge, lengths)  # -inf is not a real weight
    with pytest.raises(ValueError, match="marginals"):
        SemiMarkov(Entropy()).marginals(edge, lengths)
    with pytest.raises(ValueError, match="K"):
        edges_from_streaming(**dict(params, K=3))
    with pytest.raises(TypeError, match="K"):
        edges_from_streaming(**dict(params, K=2.0))
    with pytest.raises(ValueError, match="proj_start"):
        edges_from_streaming(**dict(params, proj_start=params["proj_start"][:, :2]))
    with pytest.raises(TypeError, match="cum_scores"):
        edges_from_streaming(**dict(params, cum_scores=params["cum_scores"].long()))
