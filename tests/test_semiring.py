"""Semirings on small vectors, against closed forms written directly with torch (softmax, topk, products)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from provable_kernels.semicrf.semiring import (Counting, CrossEntropy, Entropy, KLDivergence, KMax, Log, Max, Semiring,
                              logsumexp)

F64 = torch.float64
NEG_INF = -math.inf
LOG_SPACE = [Log(), Max(), Entropy(), CrossEntropy(), KLDivergence(), KMax(3)]
ALL = LOG_SPACE + [Counting()]


def lift(sr: Semiring, x: torch.Tensor, y: torch.Tensor = None) -> torch.Tensor:
    """Convert ``x`` (or the pair (x, y) for pair semirings; y defaults to a shifted x)."""
    return sr.convert((x, x * 0.5 - 1 if y is None else y)) if sr.pair else sr.convert(x)


def entropy(logits):
    p = torch.softmax(logits, -1)
    return -(p * torch.log(p)).nansum(-1)


def cross_entropy(p_logits, q_logits):
    p = torch.softmax(p_logits, -1)
    return -(p * torch.log_softmax(q_logits, -1)).nansum(-1)


def kl(p_logits, q_logits):
    p = torch.softmax(p_logits, -1)
    return (p * (torch.log_softmax(p_logits, -1) - torch.log_softmax(q_logits, -1))).nansum(-1)


def test_logsumexp_matches_torch_on_finite_input():
    x = torch.randn(3, 4, 5, dtype=F64)
    torch.testing.assert_close(logsumexp(x, (0, 2)), torch.logsumexp(x, (0, 2)))
    torch.testing.assert_close(logsumexp(x, 1, keepdim=True), torch.logsumexp(x, 1, keepdim=True))


def test_logsumexp_all_neg_inf_gives_neg_inf_and_zero_gradient():
    x = torch.tensor([[NEG_INF, NEG_INF], [0.0, NEG_INF]], dtype=F64, requires_grad=True)
    out = logsumexp(x, -1)
    assert out.tolist() == [NEG_INF, 0.0]
    out.sum().backward()
    assert x.grad.tolist() == [[0.0, 0.0], [1.0, 0.0]]
    # torch's own logsumexp is NaN here: the reason for the safe version
    y = x.detach().requires_grad_(True)
    torch.logsumexp(y, -1).sum().backward()
    assert torch.isnan(y.grad).any()


@pytest.mark.parametrize("sr", ALL, ids=repr)
def test_zero_and_one_are_neutral(sr):
    x = torch.tensor([[0.3, -1.2, 2.0], [0.5, 0.1, -0.7]], dtype=F64)
    if sr.log_space:
        x[0, 1] = NEG_INF
    v = lift(sr, x)
    torch.testing.assert_close(sr.mul(v, sr.one(x.shape, x)), v)
    torch.testing.assert_close(sr.mul(sr.one((), x), v), v)
    with_zero = torch.stack([v, sr.zero(x.shape, x)], dim=1)  # data dims (2, 2, 3): reduce the new one
    torch.testing.assert_close(sr.sum(with_zero, 0), v)


def test_log_max_counting_closed_forms():
    x = torch.randn(4, 6, dtype=F64)
    torch.testing.assert_close(Log().unconvert(Log().sum(Log().convert(x), -1)), torch.logsumexp(x, -1))
    torch.testing.assert_close(Max().unconvert(Max().sum(Max().convert(x), (0, 1))), x.max())
    w = x.exp()
    c = Counting()
    torch.testing.assert_close(c.unconvert(c.sum(c.mul(c.convert(w), c.convert(w[:1])), 1)), (w * w[:1]).sum(1))
    ones = c.convert(torch.ones(3, 5, dtype=F64))
    assert c.unconvert(c.sum(c.mul(ones.unsqueeze(-1), ones.unsqueeze(-2)), (0, 1, 2))).item() == 3 * 5 * 5


@pytest.mark.parametrize("sr", [Log(), Max()], ids=repr)
def test_all_neg_inf_sum_has_zero_gradients(sr):
    x = torch.full((2, 3), NEG_INF, dtype=F64, requires_grad=True)
    out = sr.unconvert(sr.sum(sr.convert(x), -1))
    assert out.tolist() == [NEG_INF, NEG_INF]
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_entropy_sum_is_entropy_and_mul_adds_entropies():
    a, b = torch.randn(4, dtype=F64), torch.randn(5, dtype=F64)
    sr = Entropy()
    torch.testing.assert_close(sr.unconvert(sr.sum(sr.convert(a), 0)), entropy(a))
    product = sr.mul(sr.convert(a)[:, :, None], sr.convert(b)[:, None, :])  # structures (i, j): a_i + b_j
    torch.testing.assert_close(sr.unconvert(sr.sum(product, (0, 1))), entropy((a[:, None] + b[None]).flatten()))
    torch.testing.assert_close(sr.unconvert(sr.sum(product, (0, 1))), entropy(a) + entropy(b))


@pytest.mark.parametrize("sr,closed_form", [(CrossEntropy(), cross_entropy), (KLDivergence(), kl)],
                         ids=["cross_entropy", "kl"])
def test_pair_semirings_closed_forms(sr, closed_form):
    p, q = torch.randn(2, 3, dtype=F64), torch.randn(2, 3, dtype=F64)
    p2, q2 = torch.randn(4, dtype=F64), torch.randn(4, dtype=F64)
    torch.testing.assert_close(sr.unconvert(sr.sum(sr.convert((p, q)), -1)), closed_form(p, q))
    product = sr.mul(sr.convert((p[0], q[0]))[:, :, None], sr.convert((p2, q2))[:, None, :])
    flat_p, flat_q = (p[0, :, None] + p2).flatten(), (q[0, :, None] + q2).flatten()
    torch.testing.assert_close(sr.unconvert(sr.sum(product, (0, 1))), closed_form(flat_p, flat_q))


def test_kmax_closed_forms():
    a, b = torch.randn(4, dtype=F64), torch.randn(5, dtype=F64)
    sr = KMax(3)
    torch.testing.assert_close(sr.unconvert(sr.sum(sr.convert(a), 0)), a.topk(3).values)
    product = sr.mul(sr.convert(a)[:, :, None], sr.convert(b)[:, None, :])
    torch.testing.assert_close(sr.unconvert(sr.sum(product, (0, 1))), (a[:, None] + b).flatten().topk(3).values)
    short = sr.unconvert(sr.sum(sr.convert(torch.tensor([1.0, NEG_INF], dtype=F64)), 0))
    assert short.tolist() == [1.0, NEG_INF, NEG_INF]
    five = KMax(5)
    assert five.unconvert(five.sum(five.convert(a), 0)).tolist() == a.sort(descending=True).values.tolist() + [NEG_INF]


@pytest.mark.parametrize("sr,closed_form", [(Entropy(), lambda p, q: entropy(p)), (CrossEntropy(), cross_entropy),
                                            (KLDivergence(), kl)], ids=["entropy", "cross_entropy", "kl"])
def test_neg_inf_entries_give_finite_values_and_gradients(sr, closed_form):
    p = torch.tensor([[0.2, NEG_INF, -0.4, 1.0], [NEG_INF] * 4], dtype=F64, requires_grad=True)
    # q forbids less than p (supp p inside supp q): finite cross-entropy and KL
    q = torch.tensor([[0.7, NEG_INF, 0.1, 0.5], [NEG_INF, 0.2, NEG_INF, NEG_INF]], dtype=F64, requires_grad=True)
    if not sr.pair:
        q = p
    out = sr.unconvert(sr.sum(lift(sr, p, q), -1))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], closed_form(p.detach()[0], q.detach()[0]))
    assert out[1].item() == 0.0
    out.sum().backward()
    assert torch.isfinite(p.grad).all() and (p.grad[1] == 0).all()
    if sr.pair:
        assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("sr", [CrossEntropy(), KLDivergence()], ids=repr)
def test_mass_where_q_forbids_is_plus_inf(sr):
    p = torch.tensor([0.2, 0.3], dtype=F64)
    q = torch.tensor([0.1, NEG_INF], dtype=F64)
    infinite = sr.sum(sr.convert((p, q)), 0)
    assert sr.unconvert(infinite).item() == math.inf
    # concatenated with a piece p forbids, that infinite part has p-mass 0: next to an allowed structure it only
    # contributes its q-mass (log-mass 0.1 against 0.2): H = KL = -log(e^0.2 / (e^0.2 + e^0.1)), finite, no NaN
    forbidden = sr.mul(infinite, sr.convert((torch.tensor(NEG_INF, dtype=F64), torch.tensor(0.0, dtype=F64))))
    allowed = sr.convert((torch.tensor(0.5, dtype=F64), torch.tensor(0.2, dtype=F64)))
    mixed = sr.unconvert(sr.sum(torch.stack([forbidden, allowed], dim=1), 0)).item()
    assert math.isclose(mixed, math.log1p(math.exp(-0.1)), rel_tol=1e-12)


@pytest.mark.parametrize("sr", [Log(), Entropy(), CrossEntropy(), KLDivergence(), KMax(2)], ids=repr)
def test_gradcheck_with_neg_inf_entries(sr):
    mask = torch.tensor([[False, True, False], [False, False, False]])
    p = torch.randn(2, 3, dtype=F64).masked_fill(mask, NEG_INF).requires_grad_(True)
    q = torch.randn(2, 3, dtype=F64).masked_fill(mask, NEG_INF).requires_grad_(True)
    def fn(*potentials):
        x = sr.convert(potentials if sr.pair else potentials[0])
        return sr.unconvert(sr.sum(sr.mul(x, x[:, :1]), -1))  # structures (j, 0) of a product, summed over j

    assert torch.autograd.gradcheck(fn, (p, q) if sr.pair else (p,))


@settings(max_examples=30, derandomize=True, deadline=None)
@given(values=st.lists(st.one_of(st.floats(-5, 5), st.just(NEG_INF)), min_size=6, max_size=6),
       which=st.integers(0, len(LOG_SPACE) - 1))
def test_log_space_sums_never_give_nan(values, which):
    sr = LOG_SPACE[which]
    x = torch.tensor(values, dtype=F64).reshape(2, 3).requires_grad_(True)
    out = sr.unconvert(sr.sum(lift(sr, x, x), -1))  # pairs with q = p: supp p = supp q
    assert not torch.isnan(out).any()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_bad_input():
    with pytest.raises(ValueError, match="k"):
        KMax(0)
    with pytest.raises(TypeError, match="k"):
        KMax(1.5)
    with pytest.raises(TypeError, match="potentials"):
        CrossEntropy().convert(torch.zeros(3))
    with pytest.raises(ValueError, match=r"potentials\[1\]"):
        KLDivergence().convert((torch.zeros(3), torch.zeros(4)))
    with pytest.raises(TypeError, match="potentials"):
        Log().convert(torch.zeros(3, dtype=torch.int64))
