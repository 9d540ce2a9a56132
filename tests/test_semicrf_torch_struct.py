"""Conversion between torch-struct 0.5's ``SemiMarkov`` and our exact backend, checked against brute force.

The two helpers below are the code of the guide section "For torch-struct users"
(traces/guide/semicrf-conventions.md); ``test_guide_shows_these_helpers`` keeps them identical. Every value is
compared with an enumeration of segmentations: ``provable_kernels.semicrf.oracle`` for our convention and
``brute_force_torch_struct`` (written here from torch-struct's documented layout, checked against its own
``to_parts``/``score``) for torch-struct's.
"""
import importlib.metadata
import importlib.util
import inspect
import math
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("torch_struct") is None:
    pytest.fail("torch-struct is not installed: these tests need the bench extra (pip install -e '.[bench]')",
                pytrace=False)
import torch_struct  # noqa: E402

from provable_kernels.semicrf import SemiMarkov, edges_from_streaming, oracle  # noqa: E402
from provable_kernels.semicrf.semiring import Log, Max  # noqa: E402

TS_VERSION = importlib.metadata.version("torch-struct")
TS_SEMIRINGS = {"log": torch_struct.LogSemiring, "max": torch_struct.MaxSemiring}
OURS_SEMIRINGS = {"log": Log, "max": Max}
ATOL = 1e-10  # float64 throughout
GUIDE = Path(__file__).resolve().parent.parent / "traces" / "guide" / "semicrf-conventions.md"


def ours_to_torch_struct(edge, lengths):
    """Our (edge (B, T, K, C, C), lengths (B,) in 1..T) -> torch-struct's (log_potentials (B, T, K+1, C, C),
    lengths (B,), all T+1). Exact for every semiring; lengths < T are encoded in the potentials."""
    B, T, K, C, _ = edge.shape
    ts = edge.new_full((B, T, K + 1, C, C), -math.inf)  # index d = 0 (duration 0) is never read
    ts[:, :, 1:] = edge.transpose(-1, -2)  # ts[b, s, d, c, c_prev] = edge[b, s, d-1, c_prev, c]
    ts[:, 0, :, :, 1:] = -math.inf  # one initial label (c_prev = 0) instead of C of them
    s = torch.arange(T, device=edge.device).view(1, T, 1)
    L = lengths.to(edge.device).view(B, 1, 1)
    crosses_end = s + torch.arange(K + 1, device=edge.device) > L  # (B, T, K+1): segment [s, s+d) ends after L
    ts = ts.masked_fill(crosses_end[..., None, None], -math.inf)
    # from L on: duration-1 steps of score 0 that keep the label, so that every sequence runs to T
    keep = torch.full((C, C), -math.inf, dtype=edge.dtype, device=edge.device).fill_diagonal_(0.0)
    ts[:, :, 1] = torch.where((s >= L)[..., None], keep, ts[:, :, 1])
    return ts, torch.full_like(lengths, T + 1)


def torch_struct_to_ours(log_potentials, lengths, semiring="log"):
    """torch-struct's (log_potentials (B, N-1, K+1, C, C), lengths (B,) in 2..N) -> our (edge (B, N-1, K, C, C),
    lengths (B,)). Exact for the named semiring ("log" or "max"): the free initial label is summed ("log") or
    maxed ("max") out into our single start row."""
    edge = log_potentials[:, :, 1:].transpose(-1, -2).clone()  # edge[b, s, d-1, c_prev, c]; d = 0 dropped
    first = log_potentials[:, 0, 1:]  # (B, K, c, c_prev): the first segment, one entry per initial label
    edge[:, 0, :, 0] = torch.logsumexp(first, dim=-1) if semiring == "log" else first.amax(dim=-1)
    return edge, lengths - 1


# ---------------------------------------------------------------------------------------------------------------
# independent references and random problems


def brute_force_ours(edge, lengths, semiring):
    """Our convention by enumeration (the oracle): logZ or the best score, (B,) float64."""
    return oracle.brute_force_value(oracle.all_scores_from_edges(edge, lengths), semiring)


def brute_force_torch_struct(log_potentials, lengths, semiring, keep=lambda y: True):
    """torch-struct's model by enumeration, written from its docstring ``edge: b x (N-1) x K x C x C`` indexed
    ``(t x z_t x z_{t-1})``: a free initial label c0 in 0..C-1, then segments (s, d, c) covering [0, N_b - 1) with
    durations 1..K-1, each scoring ``log_potentials[b, s, d, c, c_prev]``. ``keep`` filters segmentations."""
    B, _, K1, C, _ = log_potentials.shape
    out = []
    for b in range(B):
        values = []
        for y in oracle.segmentations(int(lengths[b]) - 1, K1 - 1, C):
            if not keep(y):
                continue
            for c0 in range(C):
                total, prev = 0.0, c0
                for s, d, c in y:
                    total += float(log_potentials[b, s, d, c, prev])
                    prev = c
                values.append(total)
        out.append(oracle.logsumexp(values) if semiring == "log" else max(values))
    return torch.tensor(out, dtype=torch.float64)


def torch_struct_value(log_potentials, lengths, semiring):
    value = torch_struct.SemiMarkov(TS_SEMIRINGS[semiring]).sum(log_potentials.detach().clone(), lengths=lengths)
    return value.detach()


def ours_value(edge, lengths, semiring):
    return SemiMarkov(OURS_SEMIRINGS[semiring]()).logpartition(edge, lengths)


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=ATOL)


# (seed, T, K, C, lengths); B = 3, lengths < T in most
PROBLEMS = [
    (0, 6, 3, 3, [6, 4, 2]),
    (1, 5, 2, 3, [3, 5, 1]),
    (2, 6, 3, 2, [6, 6, 6]),
    (3, 4, 1, 3, [4, 2, 3]),
    (4, 6, 2, 2, [5, 1, 6]),
    (5, 3, 3, 3, [2, 3, 3]),
]


def random_edge(seed, T, K, C, start_rows="random"):
    """Our edge (3, T, K, C, C) float64 with -inf transitions: 0 -> 1 (C > 1) is forbidden after the start, and a
    random fifth of the other entries is -inf, never a label kept with duration 1 nor the start row at d = 1, so
    every sequence keeps a finite segmentation. ``start_rows="equal"``: every row at s = 0 holds row 0, as
    ``edges_from_streaming`` writes it."""
    g = torch.Generator().manual_seed(seed)
    edge = torch.randn(3, T, K, C, C, generator=g, dtype=torch.float64) * 1.5
    drop = torch.rand(3, T, K, C, C, generator=g) < 0.2
    if C > 1:
        drop[:, 1:, :, 0, 1] = True
    drop[:, 1:, 0] &= ~torch.eye(C, dtype=torch.bool)
    drop[:, 0, 0, 0] = False
    edge = edge.masked_fill(drop, -math.inf)
    if start_rows == "equal":
        edge[:, 0] = edge[:, 0, :, :1].expand(-1, -1, C, -1)
    return edge


def random_torch_struct(seed, N, K, C):
    """torch-struct log_potentials (3, N-1, K+1, C, C) float64 with -inf entries; index d = 0 and the entries
    past the end hold large garbage (never read by either side). Every sequence keeps a finite segmentation
    (duration 1, label kept, initial label 0)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(3, N - 1, K + 1, C, C, generator=g, dtype=torch.float64) * 1.5
    drop = torch.rand(p.shape, generator=g) < 0.25
    drop[:, :, 1] &= ~torch.eye(C, dtype=torch.bool)
    p = p.masked_fill(drop, -math.inf)
    p[:, :, 0] = 50.0
    past_end = torch.arange(N - 1)[:, None] + torch.arange(K + 1) > N - 1  # (N-1, K+1): s + d > N - 1
    p[:, past_end] = 40.0
    return p


# ---------------------------------------------------------------------------------------------------------------
# (a) the layout reading: torch-struct's own to_parts / score agree with brute_force_torch_struct's indexing


def test_torch_struct_index_order_matches_its_own_parts():
    g = torch.Generator().manual_seed(7)
    B, N, K1, C = 1, 6, 3, 3
    p = torch.randn(B, N - 1, K1, C, C, generator=g, dtype=torch.float64)
    for y in oracle.segmentations(N - 1, K1 - 1, C)[::7]:
        for c0 in range(C):
            sequence = torch.full((B, N), -1, dtype=torch.long)
            sequence[0, 0] = c0
            for s, d, c in y:
                sequence[0, s + d] = c  # torch-struct writes a segment's label at its end boundary
            parts = torch_struct.SemiMarkov.to_parts(sequence, (C, K1))
            theirs = float(torch_struct.SemiMarkov(torch_struct.LogSemiring).score(p, parts.double()))
            ours = sum(float(p[0, s, d, c, prev]) for (s, d, c), prev in zip(y, (c0,) + tuple(c for _, _, c in y)))
            assert abs(theirs - ours) < ATOL


# ---------------------------------------------------------------------------------------------------------------
# (b) ours -> torch-struct


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("seed,T,K,C,lengths", PROBLEMS)
def test_ours_to_torch_struct_matches_brute_force(seed, T, K, C, lengths, semiring):
    edge = random_edge(seed, T, K, C)
    lengths = torch.tensor(lengths)
    expected = brute_force_ours(edge, lengths, semiring)
    close(ours_value(edge, lengths, semiring), expected)
    ts, ts_lengths = ours_to_torch_struct(edge, lengths)
    assert ts.shape == (3, T, K + 1, C, C) and ts_lengths.tolist() == [T + 1] * 3
    close(torch_struct_value(ts, ts_lengths, semiring), expected)
    # the same potentials are torch-struct's model of the same distribution: its own enumeration agrees
    close(brute_force_torch_struct(ts, ts_lengths, semiring), expected)


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("seed,T,K,C,lengths", PROBLEMS)
def test_ours_to_torch_struct_round_trip(seed, T, K, C, lengths, semiring):
    edge = random_edge(seed, T, K, C)
    lengths = torch.tensor(lengths)
    back, back_lengths = torch_struct_to_ours(*ours_to_torch_struct(edge, lengths), semiring=semiring)
    assert back_lengths.tolist() == [T] * 3  # the padded steps after L_b keep the label at score 0
    close(ours_value(back, back_lengths, semiring), brute_force_ours(edge, lengths, semiring))


def test_plain_lengths_are_boundary_counts_one_sequence_at_a_time():
    """Without the padding, L_b + 1 is torch-struct's length of a sequence of L_b positions; exact when every
    sequence of the call has that length (here: one sequence per call, potentials cut to L_b)."""
    edge = random_edge(0, 6, 3, 3)
    lengths = torch.tensor([6, 4, 2])
    expected = brute_force_ours(edge, lengths, "log")
    for b, L in enumerate(lengths.tolist()):
        ts, _ = ours_to_torch_struct(edge[b:b + 1, :L], torch.tensor([L]))
        close(torch_struct_value(ts, torch.tensor([L + 1]), "log"), expected[b:b + 1])


# ---------------------------------------------------------------------------------------------------------------
# the measured differences of a naive mapping (torch-struct 0.5 behaviour)


def naive_torch_struct(edge):
    """The mapping a user writes first: transpose the labels, shift the duration index, keep every start row."""
    B, T, K, C, _ = edge.shape
    ts = edge.new_full((B, T, K + 1, C, C), -math.inf)
    ts[:, :, 1:] = edge.transpose(-1, -2)
    return ts


@pytest.mark.parametrize("seed,C", [(0, 3), (1, 2), (2, 3)])
def test_naive_mapping_counts_c_initial_labels(seed, C):
    """Start rows all equal (as edges_from_streaming writes them), all lengths T: torch-struct's logZ is brute
    force + log C (each segmentation counted once per initial label), its best score is brute force's."""
    T, K = 5, 2
    edge = random_edge(seed, T, K, C, start_rows="equal")
    lengths = torch.full((3,), T)
    ts = naive_torch_struct(edge)
    close(torch_struct_value(ts, lengths + 1, "log"), brute_force_ours(edge, lengths, "log") + math.log(C))
    close(torch_struct_value(ts, lengths + 1, "max"), brute_force_ours(edge, lengths, "max"))


def test_naive_mapping_of_streaming_edges_adds_log_c():
    """The same on edges built by edges_from_streaming (rows at s = 0 transition-free and equal)."""
    g = torch.Generator().manual_seed(11)
    B, T, K, C = 3, 5, 3, 3
    cum = torch.randn(B, T + 1, C, generator=g, dtype=torch.float64).cumsum(1)
    cum[:, 0] = 0.0
    edge = edges_from_streaming(cum, torch.randn(C, C, generator=g, dtype=torch.float64),
                                torch.randn(K, C, generator=g, dtype=torch.float64), K)
    lengths = torch.full((B,), T)
    ts = naive_torch_struct(edge)
    close(torch_struct_value(ts, lengths + 1, "log"), brute_force_ours(edge, lengths, "log") + math.log(C))
    close(torch_struct_value(ts, lengths + 1, "max"), brute_force_ours(edge, lengths, "max"))


@pytest.mark.skipif(TS_VERSION != "0.5", reason="documents torch-struct 0.5's handling of unequal lengths")
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_unequal_lengths_drop_long_segments_after_the_shortest(semiring):
    """torch-struct 0.5 with unequal lengths in one call (lengths L_b + 1): it writes the count-down entries of
    segments longer than 1 only up to min(lengths), so every segmentation with a segment of duration >= 2 ending
    after min_b L_b is lost. Its value is brute force over the other segmentations (exactly ours for the
    shortest sequences)."""
    edge = random_edge(0, 6, 3, 3)
    lengths = torch.tensor([6, 4, 2])
    ts, _ = ours_to_torch_struct(edge, torch.full((3,), 6))  # one start row, nothing else changed
    shortest = int(lengths.min())
    lost = brute_force_ours(edge, lengths, semiring)
    kept = oracle.brute_force_value(
        [[(y, v) for y, v in items if all(d == 1 or s + d <= shortest for s, d, _ in y)]
         for items in oracle.all_scores_from_edges(edge, lengths)], semiring)
    theirs = torch_struct_value(ts, lengths + 1, semiring)
    close(theirs, kept)
    close(theirs[2:], lost[2:])
    if semiring == "log":
        assert (theirs[:2] < lost[:2] - 1e-3).all()


@pytest.mark.skipif(TS_VERSION != "0.5", reason="documents torch-struct 0.5's masking constants")
def test_no_segmentation_is_minus_inf_for_us_finite_for_torch_struct():
    edge = random_edge(3, 4, 2, 2)
    edge[1] = -math.inf
    lengths = torch.tensor([4, 4, 3])
    expected = brute_force_ours(edge, lengths, "log")
    assert expected[1] == -math.inf
    close(ours_value(edge, lengths, "log"), expected)
    theirs = torch_struct_value(*ours_to_torch_struct(edge, lengths), "log")
    close(theirs[[0, 2]], expected[[0, 2]])
    assert math.isfinite(float(theirs[1])) and float(theirs[1]) < -1e8  # its "zero" is -1e9 / -1e5, not -inf


# ---------------------------------------------------------------------------------------------------------------
# (c) torch-struct -> ours


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("seed,N,K,C", [(0, 7, 2, 3), (1, 5, 3, 2), (2, 4, 1, 3), (3, 6, 3, 3), (4, 2, 2, 2)])
def test_torch_struct_to_ours_equal_lengths(seed, N, K, C, semiring):
    """All lengths N: torch-struct's own value = ours on the converted edges = enumeration of its model."""
    p = random_torch_struct(seed, N, K, C)
    lengths = torch.full((3,), N)
    expected = brute_force_torch_struct(p, lengths, semiring)
    close(torch_struct_value(p, lengths, semiring), expected)
    edge, our_lengths = torch_struct_to_ours(p, lengths, semiring)
    close(ours_value(edge, our_lengths, semiring), expected)
    close(brute_force_ours(edge, our_lengths, semiring), expected)


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("seed,N,K,C,lengths", [(5, 7, 2, 3, [7, 4, 2]), (6, 6, 3, 2, [3, 6, 5])])
def test_torch_struct_to_ours_unequal_lengths(seed, N, K, C, lengths, semiring):
    """Unequal lengths: ours on the converted edges = enumeration of torch-struct's model, and torch-struct's own
    value computed one sequence per call (its batched value drops segments, see above)."""
    p = random_torch_struct(seed, N, K, C)
    lengths = torch.tensor(lengths)
    expected = brute_force_torch_struct(p, lengths, semiring)
    edge, our_lengths = torch_struct_to_ours(p, lengths, semiring)
    close(ours_value(edge, our_lengths, semiring), expected)
    for b, L in enumerate(lengths.tolist()):
        close(torch_struct_value(p[b:b + 1, :L - 1], torch.tensor([L]), semiring), expected[b:b + 1])


def test_torch_struct_to_ours_is_per_semiring():
    """The free initial label is summed out for Log and maxed out for Max: one converted tensor serves one
    semiring (unless each first segment has one finite initial-label entry)."""
    p = random_torch_struct(8, 5, 2, 3)
    lengths = torch.full((3,), 5)
    edge_log, our_lengths = torch_struct_to_ours(p, lengths, "log")
    edge_max, _ = torch_struct_to_ours(p, lengths, "max")
    close(ours_value(edge_log, our_lengths, "log"), brute_force_torch_struct(p, lengths, "log"))
    close(ours_value(edge_max, our_lengths, "max"), brute_force_torch_struct(p, lengths, "max"))
    assert (ours_value(edge_log, our_lengths, "max") > brute_force_torch_struct(p, lengths, "max") + 1e-6).all()


def test_torch_struct_empty_sequence_has_no_counterpart():
    """torch-struct length 1 (no position) is log C (the initial label alone); ours needs L >= 1."""
    p = random_torch_struct(9, 4, 2, 3)
    value = torch_struct_value(p, torch.tensor([4, 1, 4]), "log")
    close(value[1:2], torch.tensor([math.log(3)], dtype=torch.float64))
    edge, our_lengths = torch_struct_to_ours(p, torch.tensor([4, 1, 4]))
    with pytest.raises(ValueError):
        ours_value(edge, our_lengths, "log")


# ---------------------------------------------------------------------------------------------------------------


def test_guide_shows_these_helpers():
    text = GUIDE.read_text()
    for helper in (ours_to_torch_struct, torch_struct_to_ours):
        assert inspect.getsource(helper) in text, helper.__name__
