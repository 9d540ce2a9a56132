"""path_score / starts_from_labels against the brute-force oracle's scoring of every segmentation."""
import math

import pytest
import torch
from conftest import with_zero_row

from provable_kernels.semicrf.scoring import path_score, starts_from_labels
from provable_kernels.semicrf.structures import Segment, ViterbiResult
from provable_kernels.semicrf import oracle

F64 = torch.float64


def gold_tensors(segmentations, T):
    """(labels, starts) (B, T) for oracle segmentations ((start, duration, label), ...), one per batch row."""
    segments = [[Segment(s, s + d, c, 0.0) for s, d, c in y] for y in segmentations]
    return ViterbiResult(torch.zeros(len(segments)), segments).padded(T)


def model(B, T, K, C, *, dtype=F64, three_d=False, projections=(False, False), seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=F64).to(dtype)
    cum = torch.cat([torch.zeros(B, 1, C, dtype=dtype), r(B, T, C).cumsum(1)], dim=1)
    transition = r(K, C, C) if three_d else r(C, C)
    return dict(cum_scores=cum, transition=transition, duration_bias=r(K, C),
                proj_start=r(B, T, C) if projections[0] else None, proj_end=r(B, T, C) if projections[1] else None)


def repeat(params, n):
    """Batch of n copies of a single-sequence model."""
    out = dict(params)
    for key in ("cum_scores", "proj_start", "proj_end"):
        if out[key] is not None:
            out[key] = out[key].expand(n, *out[key].shape[1:]).contiguous()
    return out


CONFIGS = [
    # T, L, K, C, 3-D transition, (proj_start, proj_end)
    (4, 4, 1, 3, False, (False, False)),  # linear chain
    (4, 4, 2, 2, False, (True, False)),
    (5, 3, 3, 2, True, (False, True)),  # shorter length: positions >= L ignored
    (3, 3, 5, 2, True, (True, True)),  # K > T
    (2, 1, 2, 2, False, (True, True)),  # length 1
]


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("T,L,K,C,three_d,proj", CONFIGS)
def test_every_segmentation_matches_oracle(T, L, K, C, three_d, proj, dtype):
    params = model(1, T, K, C, dtype=dtype, three_d=three_d, projections=proj)
    segs = oracle.segmentations(L, K, C)
    expected = [oracle.score(y, params["cum_scores"][0], params["transition"], params["duration_bias"],
                             None if params["proj_start"] is None else params["proj_start"][0],
                             None if params["proj_end"] is None else params["proj_end"][0]) for y in segs]
    labels, starts = gold_tensors(segs, T)
    lengths = torch.full((len(segs),), L)
    got = path_score(lengths=lengths, starts=starts, labels=labels, **repeat(params, len(segs)))
    assert got.dtype == dtype and got.shape == (len(segs),)
    tol = 1e-12 if dtype == F64 else 1e-5
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=F64), rtol=tol, atol=tol)


def test_positions_past_length_are_ignored():
    params = model(2, 5, 3, 3, projections=(True, True), seed=1)
    labels = torch.tensor([[2, 2, 0, 1, 1], [1, 0, 0, 0, 0]])
    starts = starts_from_labels(labels, torch.tensor([5, 5]))
    base = path_score(lengths=torch.tensor([5, 2]), starts=starts, labels=labels, **params)
    garbage_labels = labels.clone()
    garbage_labels[1, 2:] = -1
    garbage_starts = starts.clone()
    garbage_starts[1, 2:] = True
    again = path_score(lengths=torch.tensor([5, 2]), starts=garbage_starts, labels=garbage_labels, **params)
    assert torch.equal(base, again)


def test_starts_from_labels_splits_runs():
    labels = torch.tensor([[0, 0, 1, 1, 1, 0], [2, 2, 2, 2, -1, -1]])
    starts = starts_from_labels(labels, torch.tensor([6, 4]))
    assert starts.tolist() == [[True, False, True, False, False, True], [True, False, False, False, False, False]]


def test_adjacent_segments_may_share_a_label():
    params = model(1, 4, 2, 2, three_d=True, seed=2)
    starts = torch.tensor([[True, False, True, False]])
    labels = torch.tensor([[1, 1, 1, 1]])
    expected = oracle.score(((0, 2, 1), (2, 2, 1)), params["cum_scores"][0], params["transition"],
                            params["duration_bias"])
    got = path_score(lengths=torch.tensor([4]), starts=starts, labels=labels, **params)
    assert math.isclose(float(got), expected, rel_tol=1e-12)


def test_gradient_is_the_path_indicator():
    """d score / d cum is +1 at (end, c) and -1 at (start, c); bias, transition and projections count uses."""
    K, C = 3, 2
    params = model(1, 6, K, C, three_d=True, projections=(True, True), seed=3)
    for value in params.values():
        value.requires_grad_(True)
    path = ((0, 2, 1), (2, 1, 0), (3, 3, 0))
    labels, starts = gold_tensors([path], 6)
    path_score(lengths=torch.tensor([6]), starts=starts, labels=labels, **params).sum().backward()
    cum, trans, dur = torch.zeros(7, C, dtype=F64), torch.zeros(K, C, C, dtype=F64), torch.zeros(K, C, dtype=F64)
    ps, pe = torch.zeros(6, C, dtype=F64), torch.zeros(6, C, dtype=F64)
    prev = None
    for s, d, c in path:
        cum[s + d, c] += 1
        cum[s, c] -= 1
        dur[d - 1, c] += 1
        ps[s, c] += 1
        pe[s + d - 1, c] += 1
        if prev is not None:
            trans[d - 1, prev, c] += 1
        prev = c
    assert torch.equal(params["cum_scores"].grad[0], cum)
    assert torch.equal(params["transition"].grad, trans)
    assert torch.equal(params["duration_bias"].grad, dur)
    assert torch.equal(params["proj_start"].grad[0], ps)
    assert torch.equal(params["proj_end"].grad[0], pe)


def test_gradcheck():
    params = model(2, 5, 2, 3, projections=(True, True), seed=4)
    labels = torch.tensor([[0, 0, 2, 1, 1], [1, 2, 2, 0, 0]])
    lengths = torch.tensor([5, 4])
    starts = starts_from_labels(labels, lengths)
    names = [n for n in params if n != "cum_scores"]
    rest = params["cum_scores"][:, 1:].detach().requires_grad_(True)  # cum_scores[:, 0] = 0 is pinned
    inputs = (rest, *(params[n].requires_grad_(True) for n in names))
    fn = lambda rest, *xs: path_score(lengths=lengths, starts=starts, labels=labels,  # noqa: E731
                                      cum_scores=with_zero_row(rest), **dict(zip(names, xs)))
    assert torch.autograd.gradcheck(fn, inputs)


def test_neg_inf_transition_on_path_gives_neg_inf_with_finite_gradients():
    params = model(1, 3, 2, 2, seed=5)
    params["transition"][0, 1] = -math.inf
    params["cum_scores"].requires_grad_(True)
    params["transition"].requires_grad_(True)
    labels = torch.tensor([[0, 1, 1]])
    score = path_score(lengths=torch.tensor([3]), starts=starts_from_labels(labels, torch.tensor([3])),
                       labels=labels, **params)
    assert float(score.detach()) == -math.inf
    score.sum().backward()
    assert torch.isfinite(params["cum_scores"].grad).all() and torch.isfinite(params["transition"].grad).all()
    off_path = torch.tensor([[1, 1, 0]])
    off_score = path_score(lengths=torch.tensor([3]), labels=off_path,
                           starts=starts_from_labels(off_path, torch.tensor([3])), **params)
    assert torch.isfinite(off_score).all()


def _call(**changes):
    params = model(2, 4, 2, 2, seed=6)
    labels = torch.tensor([[0, 0, 1, 1], [1, 0, 0, 1]])
    kwargs = dict(params, lengths=torch.tensor([4, 4]), labels=labels,
                  starts=starts_from_labels(labels, torch.tensor([4, 4])))
    kwargs.update(changes)
    return path_score(**kwargs)


@pytest.mark.parametrize(
    "changes,error,name",
    [
        (dict(starts=torch.tensor([[True, False, True, False], [False, True, False, True]])), ValueError, "starts"),
        (dict(starts=torch.tensor([[True, False, False, False], [True, True, False, True]])), ValueError, "labels"),
        (dict(labels=torch.tensor([[0, 0, 2, 2], [1, 0, 0, 1]])), ValueError, "labels"),
        (dict(labels=torch.tensor([[0, 0, -1, -1], [1, 0, 0, 1]])), ValueError, "labels"),
        (dict(labels=torch.tensor([[0, 0, 0, 1], [1, 0, 0, 1]]),
              starts=torch.tensor([[True, False, False, True], [True, True, False, True]])),
         ValueError, "longer than K"),
        (dict(starts=torch.ones(2, 3, dtype=torch.bool)), ValueError, "starts"),
        (dict(starts=torch.ones(2, 4, dtype=torch.int64)), TypeError, "starts"),
        (dict(labels=torch.zeros(2, 4)), TypeError, "labels"),
        (dict(labels=torch.zeros(4, dtype=torch.int64)), ValueError, "labels"),
        (dict(lengths=torch.tensor([4, 5])), ValueError, "lengths"),
        (dict(cum_scores=torch.full((2, 5, 2), math.nan, dtype=F64)), ValueError, "cum_scores"),
        (dict(duration_bias=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "duration_bias"),
        (dict(duration_bias=torch.zeros(0, 2, dtype=F64)), ValueError, "duration_bias"),
        (dict(transition=torch.zeros(3, 3, dtype=F64)), ValueError, "transition"),
        (dict(proj_end=torch.zeros(2, 3, 2, dtype=F64)), ValueError, "proj_end"),
    ],
)
def test_bad_input(changes, error, name):
    with pytest.raises(error, match=name):
        _call(**changes)


def test_starts_from_labels_bad_input():
    with pytest.raises(TypeError, match="labels"):
        starts_from_labels(torch.zeros(2, 3), torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="lengths"):
        starts_from_labels(torch.zeros(2, 3, dtype=torch.int64), torch.tensor([3, 4]))
