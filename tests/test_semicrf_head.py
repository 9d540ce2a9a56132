"""SemiMarkovCRFHead: normalised loss, both backends, gradients, decode, semirings, bad input (tiny shapes)."""
import math

import pytest
import torch

from provable_kernels.dispatch import recording, triton_usable
from provable_kernels.semicrf.head import SemiMarkovCRFHead
from provable_kernels.semicrf.structures import Segment, ViterbiResult
from provable_kernels.semicrf import oracle

F64 = torch.float64
BACKENDS = ["streaming", "exact"]


def make_head(C=2, K=2, hidden_dim=None, transition="static", seed=0, **kwargs):
    """A float64 head with random (seeded) parameters; streaming through the PyTorch reference."""
    torch.manual_seed(seed)
    head = SemiMarkovCRFHead(C, K, hidden_dim, transition=transition, use_triton=False, **kwargs).double()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    return head


def hidden_for(head, B, T, seed=1):
    g = torch.Generator().manual_seed(seed)
    features = head.num_classes if head.projection is None else head.projection.in_features
    return torch.randn(B, T, features, generator=g, dtype=F64)


def cum_for(head, hidden):
    """cum_scores computed here, independently of the head: projection by matmul, zero row, cumsum."""
    scores = hidden if head.projection is None else hidden @ head.projection.weight.T + head.projection.bias
    return torch.cat([torch.zeros_like(scores[:, :1]), scores.cumsum(1)], dim=1)


def gold_tensors(segmentations, T):
    segments = [[Segment(s, s + d, c, 0.0) for s, d, c in y] for y in segmentations]
    return ViterbiResult(torch.zeros(len(segments)), segments).padded(T)


SETUPS = [
    # C, K, hidden_dim, transition, T, L
    (2, 2, None, "static", 4, 4),
    (2, 3, 3, "duration", 4, 3),
    (3, 1, 2, "static", 3, 3),  # linear chain
]


# NLL = logZ - score(gold) with |logZ|, |score| < 50 here: rounding leaves a few ulps of 50, far below these bounds
# (float64 ulp(50) = 7e-15, float32 ulp(50) = 4e-6); the NLL itself is never clamped, so a negative one shows.
ROUNDING = {F64: 1e-12, torch.float32: 2e-5}


@pytest.mark.parametrize("dtype", list(ROUNDING))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("C,K,hidden_dim,transition,T,L", SETUPS)
def test_nll_is_a_normalised_negative_log_likelihood(C, K, hidden_dim, transition, T, L, backend, dtype):
    """The loss is normalised: NLL >= 0 for every gold and exp(-NLL) sums to 1 over all segmentations.

    Over every segmentation of a tiny problem: NLL >= 0 up to rounding, equals the oracle, and exp(-NLL) sums
    to 1."""
    head = make_head(C, K, hidden_dim, transition).to(dtype)
    segs = oracle.segmentations(L, K, C)
    hidden = hidden_for(head, 1, T).to(dtype).expand(len(segs), T, -1)
    labels, starts = gold_tensors(segs, T)
    lengths = torch.full((len(segs),), L)
    nll = head.compute_loss(hidden, lengths, labels, starts, reduction="none", backend=backend)
    tol = ROUNDING[dtype]
    assert nll.dtype == dtype and nll.shape == (len(segs),)
    assert bool((nll >= -tol).all()), f"negative NLL {nll.min().item()}"
    total = torch.exp(-nll.double()).sum()
    torch.testing.assert_close(total, torch.tensor(1.0, dtype=F64), rtol=tol, atol=0)  # each term within rtol
    scored = oracle.all_scores(cum_for(head, hidden[:1]).detach(), head.transition.detach(),
                               head.duration_bias.detach(), lengths[:1], K)[0]
    log_z = oracle.log_partition([scored])[0]
    expected = torch.tensor([log_z - s for _, s in scored], dtype=F64)
    torch.testing.assert_close(nll.detach().double(), expected, rtol=0, atol=tol)


def test_labels_without_starts_split_into_runs():
    head = make_head(3, 3)
    hidden, lengths = hidden_for(head, 2, 5), torch.tensor([5, 4])
    labels = torch.tensor([[0, 0, 2, 2, 1], [1, 1, 1, 0, -1]])
    starts = torch.tensor([[True, False, True, False, True], [True, False, False, True, False]])
    torch.testing.assert_close(head.compute_loss(hidden, lengths, labels, reduction="none"),
                               head.compute_loss(hidden, lengths, labels, starts, reduction="none"))


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_streaming_and_exact_backends_agree(dtype):
    head = make_head(3, 3, hidden_dim=4, transition="duration").to(dtype)
    hidden, lengths = hidden_for(head, 3, 6).to(dtype).requires_grad_(True), torch.tensor([6, 2, 5])
    labels = torch.tensor([[0, 0, 1, 1, 1, 2], [2, 2, 0, 0, 0, 0], [1, 0, 0, 2, 2, 1]])
    tol = 1e-10 if dtype == F64 else 1e-4
    for semiring in ("log", "max"):
        torch.testing.assert_close(head(hidden, lengths, backend="streaming", semiring=semiring),
                                   head(hidden, lengths, backend="exact", semiring=semiring), rtol=tol, atol=tol)
    grads = []
    for backend in BACKENDS:
        loss = head.compute_loss(hidden, lengths, labels, reduction="sum", backend=backend)
        assert loss.dtype == dtype
        grads.append(torch.autograd.grad(loss, [hidden, *head.parameters()]))
    for streaming, exact in zip(*grads):
        torch.testing.assert_close(streaming, exact, rtol=tol, atol=tol)


def test_default_streaming_takes_triton_where_usable_and_agrees_with_exact():
    """use_triton=True (default): Triton kernels on CUDA or under the interpreter (tests/conftest.py on CPU)."""
    head = make_head(2, 2, transition="duration", seed=8)
    head.use_triton = True
    hidden, lengths = hidden_for(head, 2, 4), torch.tensor([4, 3])
    labels = torch.tensor([[0, 0, 1, 1], [1, 0, 0, 0]])
    with recording() as taken:
        loss = head.compute_loss(hidden, lengths, labels, reduction="sum")
        grads = torch.autograd.grad(loss, list(head.parameters()))
        best = head.decode(hidden, lengths)
    backend = "triton" if triton_usable(hidden.device) else "torch"
    assert taken == ["semicrf.head.streaming.loss", f"semicrf.{backend}.log.train", "semicrf.head.decode",
                     f"semicrf.{backend}.viterbi"]
    exact = head.compute_loss(hidden, lengths, labels, reduction="sum", backend="exact")
    torch.testing.assert_close(loss, exact, rtol=1e-10, atol=1e-10)
    for g, e in zip(grads, torch.autograd.grad(exact, list(head.parameters()))):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(best.scores, head(hidden, lengths, backend="exact", semiring="max").detach(),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_gradients_match_a_brute_force(backend):
    """Gradients of the loss w.r.t. hidden and every parameter against logsumexp over enumerated paths."""
    head = make_head(2, 2, hidden_dim=3, transition="duration", seed=2)
    hidden, lengths = hidden_for(head, 2, 4, seed=3).requires_grad_(True), torch.tensor([4, 3])
    gold = [((0, 2, 1), (2, 1, 1), (3, 1, 0)), ((0, 1, 0), (1, 2, 1))]
    labels, starts = gold_tensors(gold, 4)
    params = [hidden, *head.parameters()]
    loss = head.compute_loss(hidden, lengths, labels, starts, reduction="mean", backend=backend)
    got = torch.autograd.grad(loss, params)
    cum = cum_for(head, hidden)
    brute = sum(
        torch.logsumexp(torch.stack([oracle.gold_score(y, cum[b], head.transition, head.duration_bias)
                                     for y in oracle.segmentations(int(lengths[b]), 2, 2)]), 0)
        - oracle.gold_score(gold[b], cum[b], head.transition, head.duration_bias)
        for b in range(2)
    ) / 2
    torch.testing.assert_close(loss, brute, rtol=1e-12, atol=1e-12)
    for g, e in zip(got, torch.autograd.grad(brute, params)):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck(backend):
    head = make_head(2, 2, transition="duration", seed=4)
    hidden, lengths = hidden_for(head, 2, 3).requires_grad_(True), torch.tensor([3, 2])
    labels = torch.tensor([[0, 1, 1], [1, 1, 0]])
    assert torch.autograd.gradcheck(
        lambda x: head.compute_loss(x, lengths, labels, reduction="none", backend=backend), (hidden,))
    names = ["transition", "duration_bias"]
    params = tuple(getattr(head, n).detach().clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(
        lambda x, *ps: torch.func.functional_call(head, dict(zip(names, ps)), (x, lengths), {"backend": backend}),
        (hidden, *params))


def test_semirings_against_oracle_and_auto_routing():
    head = make_head(2, 3, hidden_dim=2, transition="duration", seed=5)
    hidden, lengths = hidden_for(head, 2, 4), torch.tensor([4, 2])
    scored = oracle.all_scores(cum_for(head, hidden).detach(), head.transition.detach(),
                               head.duration_bias.detach(), lengths, 3)
    expect = lambda got, want: torch.testing.assert_close(got.detach(), torch.tensor(want, dtype=F64),
                                                          rtol=1e-10, atol=1e-10)
    with recording() as taken:
        expect(head(hidden, lengths), oracle.log_partition(scored))
        expect(head(hidden, lengths, semiring="max"), [s for _, s in oracle.best(scored)])
    assert taken[::2] == ["semicrf.head.streaming.log", "semicrf.head.streaming.max"]
    assert [route.split(".")[2] for route in taken[1::2]] == ["log", "max"]  # the streaming routes they call
    with recording() as taken:
        expect(head(hidden, lengths, semiring="entropy"), oracle.entropy(scored))
        expect(head(hidden, lengths, semiring="kmax:3"), list(zip(*oracle.top_k(scored, 3))))
        expect(head(hidden, lengths, semiring="counting"), [len(oracle.segmentations(int(L), 3, 2)) for L in lengths])
    assert [route for route in taken if route.startswith("semicrf.head.")] == [
        "semicrf.head.exact.entropy", "semicrf.head.exact.kmax", "semicrf.head.exact.counting"]
    assert not any(route.split(".")[1] in ("triton", "torch") for route in taken)  # no streaming route


def test_counting_counts_segmentations_the_model_allows():
    head = make_head(2, 2, seed=6)
    with torch.no_grad():
        head.transition[0, 1] = -math.inf
    hidden, lengths = hidden_for(head, 1, 4), torch.tensor([4])
    scored = oracle.all_scores(cum_for(head, hidden), head.transition.detach(), head.duration_bias.detach(), lengths, 2)
    allowed = sum(math.isfinite(s) for _, s in scored[0])
    assert head(hidden, lengths, semiring="counting").tolist() == [allowed]
    assert allowed < len(oracle.segmentations(4, 2, 2))


def test_exact_max_bytes_is_enforced():
    head = make_head(2, 2, exact_max_bytes=1000)
    hidden, lengths = hidden_for(head, 2, 8), torch.tensor([8, 8])  # 2*8*2*2*2*8 = 1024 bytes of log edges
    with pytest.raises(ValueError, match="exact_max_bytes"):
        head(hidden, lengths, semiring="entropy")
    with pytest.raises(ValueError, match="exact_max_bytes"):
        head(hidden, lengths, backend="exact")
    assert torch.isfinite(head(hidden, lengths)).all()  # auto: streaming, no edge tensor
    assert torch.isfinite(make_head(2, 2, exact_max_bytes=1024)(hidden, lengths, backend="exact")).all()


def test_decode_matches_the_oracle_best_path():
    head = make_head(3, 2, hidden_dim=2, transition="duration", seed=7)
    hidden, lengths = hidden_for(head, 2, 5), torch.tensor([5, 3])
    result = head.decode(hidden, lengths)
    scored = oracle.all_scores(cum_for(head, hidden).detach(), head.transition.detach(),
                               head.duration_bias.detach(), lengths, 2)
    for segments, (y, score) in zip(result.segments, oracle.best(scored)):
        assert [(seg.start, seg.duration, seg.label) for seg in segments] == list(y)
        assert math.isclose(sum(seg.score for seg in segments), score, rel_tol=1e-12)
    assert not result.scores.requires_grad


def test_float32_hidden_and_default_parameters():
    head = SemiMarkovCRFHead(3, 2, use_triton=False)
    hidden = torch.randn(2, 4, 3)
    loss = head.compute_loss(hidden, torch.tensor([4, 1]), torch.tensor([[0, 0, 1, 1], [2, 0, 0, 0]]))
    assert loss.dtype == torch.float32 and loss.shape == () and loss.item() >= -ROUNDING[torch.float32]
    loss.backward()
    assert torch.isfinite(head.transition.grad).all() and torch.isfinite(head.duration_bias.grad).all()


def test_bad_input():
    head = make_head(2, 2, hidden_dim=3)
    hidden, lengths = hidden_for(head, 2, 4), torch.tensor([4, 4])
    labels = torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0]])
    run_of_4 = torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0]])
    changing_inside_segment = torch.tensor([[True, False, False, True], [True, False, True, False]])
    cases = [
        (ValueError, "longer than K", lambda: head.compute_loss(hidden, lengths, run_of_4)),
        (ValueError, "labels", lambda: head.compute_loss(hidden, lengths, labels, changing_inside_segment)),
        (ValueError, "labels", lambda: head.compute_loss(hidden, lengths, labels + 1)),
        (ValueError, "labels", lambda: head.compute_loss(hidden, lengths, labels[:, :3])),
        (TypeError, "labels", lambda: head.compute_loss(hidden, lengths, labels.double())),
        (ValueError, "starts", lambda: head.compute_loss(hidden, lengths, labels, torch.zeros(2, 4, dtype=torch.bool))),
        (ValueError, "reduction", lambda: head.compute_loss(hidden, lengths, labels, reduction="avg")),
        (ValueError, "hidden", lambda: head(hidden[..., :2], lengths)),
        (ValueError, "hidden", lambda: head(hidden[0], lengths)),
        (TypeError, "hidden", lambda: head(hidden.float(), lengths)),
        (ValueError, "lengths", lambda: head(hidden, torch.tensor([4, 5]))),
        (ValueError, "lengths", lambda: head(hidden, torch.tensor([0, 4]))),
        (ValueError, "backend", lambda: head(hidden, lengths, backend="cuda")),
        (ValueError, "semiring", lambda: head(hidden, lengths, semiring="kmax:0")),
        (ValueError, "semiring", lambda: head(hidden, lengths, semiring="sum")),
        (ValueError, "streaming", lambda: head(hidden, lengths, backend="streaming", semiring="entropy")),
        (ValueError, "num_classes", lambda: SemiMarkovCRFHead(0, 2)),
        (TypeError, "max_duration", lambda: SemiMarkovCRFHead(2, "2")),
        (ValueError, "transition", lambda: SemiMarkovCRFHead(2, 2, transition="dynamic")),
        (ValueError, "hidden_dim", lambda: SemiMarkovCRFHead(2, 2, 0)),
        (ValueError, "exact_max_bytes", lambda: SemiMarkovCRFHead(2, 2, exact_max_bytes=0)),
        (TypeError, "use_triton", lambda: SemiMarkovCRFHead(2, 2, use_triton=1)),
    ]
    for error, name, call in cases:
        with pytest.raises(error, match=name):
            call()


def test_gold_the_model_forbids_is_an_error():
    head = make_head(2, 2)
    with torch.no_grad():
        head.transition[0, 1] = -math.inf
    with pytest.raises(ValueError, match="forbids"):
        head.compute_loss(hidden_for(head, 1, 3), torch.tensor([3]), torch.tensor([[0, 1, 1]]))


@pytest.mark.parametrize("parameter", ["transition", "projection.weight", "projection.bias"])
def test_a_module_split_over_devices_is_a_named_error(parameter):
    """A parameter on another device than ``duration_bias`` (the meta device standing in for a second GPU) is a
    ValueError naming it, before any computation (a multi-GPU model moved in part)."""
    head = make_head(2, 2, hidden_dim=3)
    hidden, lengths = hidden_for(head, 2, 4), torch.tensor([4, 4])
    owner, name = (head.projection, parameter.split(".")[1]) if "." in parameter else (head, parameter)
    setattr(owner, name, torch.nn.Parameter(getattr(owner, name).detach().to("meta")))
    for call in (lambda: head(hidden, lengths), lambda: head.decode(hidden, lengths),
                 lambda: head.compute_loss(hidden, lengths, torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0]]))):
        with pytest.raises(ValueError, match=rf"^{parameter} must be on cpu \(the device of duration_bias\), got meta"):
            call()
