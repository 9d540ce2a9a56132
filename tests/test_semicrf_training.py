"""The semi-CRF in training loops, on the CPU (Triton routes under the interpreter): custom ops (opcheck),
torch.compile(fullgraph=True), meta/fake tensors, second-order gradients, accuracy independent of the score
magnitude, mixed precision, and clear errors where there were crashes or silent NaN.

References are independent: the oracle's float64 recursion (``SemiCRFCase.naive``), or the eager call for the
"compiled equals eager" requirement.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import INTERPRETED, semicrf_case
from torch._subclasses.fake_tensor import FakeTensorMode

from provable_kernels import validate
from provable_kernels.semicrf import SemiMarkov, SemiMarkovCRFHead, autograd, edges_from_streaming
from provable_kernels.semicrf import semi_crf_streaming_forward, semi_crf_viterbi
from provable_kernels.semicrf.structures import Segment, ViterbiResult
from provable_kernels.semicrf.semiring import KMaxSemiring, Log, LogSemiring, MaxSemiring

BACKENDS = [pytest.param(True, id="triton"), pytest.param(False, id="torch")]
# fullgraph=True fails on any graph break whatever the backend; "aot_eager" traces forward and backward through
# AOTAutograd like inductor does, without its C++ code generation (minutes on a CI CPU). The GPU check
# (`compile` in benchmarks/adapters/semicrf/checks.py) compiles with inductor.
COMPILER = "aot_eager"


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Norm-wise relative error of ``a`` against the reference ``b``."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def leaf_grads(case, semiring="log", weights=None):
    """Value and gradients of the streaming route for fresh leaves of ``case``."""
    case = case.leaves()
    value = case.forward(semiring)
    weights = torch.linspace(0.5, 1.5, value.shape[0], dtype=value.dtype) if weights is None else weights
    present = [t for t in case.tensors if t is not None]
    return value.detach(), torch.autograd.grad((value * weights).sum(), present)


def oracle_grads(case, semiring="log"):
    """The oracle's float64 value and gradients (autograd of its plain recursion)."""
    case = case.to(torch.float64).leaves()
    value = case.naive(semiring)
    weights = torch.linspace(0.5, 1.5, value.shape[0], dtype=value.dtype)
    present = [t for t in case.tensors if t is not None]
    return value.detach(), torch.autograd.grad((value * weights).sum(), present)


# ------------------------------------------------------------------------------------------------ custom ops


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=INTERPRETED), "torch"])
def test_opcheck_every_op(backend):
    """Schema, fake implementation, autograd registration and AOT dispatch (compile) of each op; the second
    sequence is short, so some rows of the saved gradients stay unwritten (outputs must still be deterministic)."""
    case = dataclasses.replace(semicrf_case(B=2, T=5, K=2, C=2, dtype=torch.float32, proj_start=True, seed=1),
                               lengths=torch.tensor([5, 2]))
    cum, trans, dur, ps, pe = [None if t is None else t.detach() for t in case.tensors]
    lengths, K = case.lengths, case.K
    leaves = [x.clone().requires_grad_() for x in (cum, trans, dur, ps)]
    checks = [
        (autograd._partition_op.custom_op, (cum, trans, dur, lengths, ps, pe, K, "log", backend)),
        (autograd._partition_op.custom_op, (cum, trans, dur, lengths, None, None, K, "max", backend)),
        (autograd._log_forward_op.custom_op, (*leaves[:3], lengths, leaves[3], None, K, backend)),
        (autograd._viterbi_op.custom_op, (cum, trans, dur, lengths, ps, pe, K, backend)),
    ]
    saved = autograd._log_forward_op(cum, trans, dur, lengths, ps, pe, K, backend)[1:]
    checks.append((autograd._log_backward_op.custom_op,
                   (cum, trans, dur, lengths, ps, pe, saved, torch.ones(2), K, backend)))
    for op, args in checks:
        torch.library.opcheck(op, args)


# ------------------------------------------------------------------------------------------ torch.compile


class Scorer(torch.nn.Module):
    """A module calling the streaming API: label scores from a Linear layer, then logZ."""

    def __init__(self, C: int, K: int, use_triton: bool):
        super().__init__()
        self.K, self.use_triton = K, use_triton
        self.linear = torch.nn.Linear(3, C)
        self.transition = torch.nn.Parameter(torch.randn(C, C, generator=torch.Generator().manual_seed(2)))
        self.duration_bias = torch.nn.Parameter(torch.randn(K, C, generator=torch.Generator().manual_seed(3)))

    def forward(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        scores = self.linear(hidden)
        cum = torch.cat([scores.new_zeros(scores.shape[0], 1, scores.shape[2]), scores.cumsum(1)], 1)
        return semi_crf_streaming_forward(cum, self.transition, self.duration_bias, lengths, self.K,
                                          use_triton=self.use_triton)


def value_and_grads(fn, module, *args):
    module.zero_grad()
    value = fn(*args)
    (value * torch.linspace(0.5, 1.5, value.numel()).view(value.shape)).sum().backward()
    return value.detach(), [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("use_triton", BACKENDS)
def test_compile_fullgraph_streaming_module_equals_eager(use_triton):
    torch.manual_seed(0)
    module = Scorer(3, 2, use_triton)
    hidden, lengths = torch.randn(2, 4, 3), torch.tensor([4, 3])
    eager = value_and_grads(module, module, hidden, lengths)
    compiled = value_and_grads(torch.compile(module, fullgraph=True, backend=COMPILER), module, hidden, lengths)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-6, atol=1e-6)
    for got, want in zip(compiled[1], eager[1]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def head_and_batch(use_triton=True, transition="static"):
    torch.manual_seed(0)
    head = SemiMarkovCRFHead(3, 2, hidden_dim=4, transition=transition, use_triton=use_triton)
    hidden = torch.randn(2, 5, 4)
    lengths = torch.tensor([5, 3])
    labels = torch.tensor([[0, 0, 1, 2, 2], [1, 1, 0, 0, 0]])
    return head, hidden, lengths, labels


@pytest.mark.parametrize("use_triton", BACKENDS)
def test_compile_fullgraph_compute_loss_equals_eager(use_triton):
    head, hidden, lengths, labels = head_and_batch(use_triton)
    loss = lambda h: head.compute_loss(h, lengths, labels, reduction="none")  # noqa: E731
    eager = value_and_grads(loss, head, hidden)
    compiled = value_and_grads(torch.compile(loss, fullgraph=True, backend=COMPILER), head, hidden)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-6, atol=1e-6)
    for got, want in zip(compiled[1], eager[1]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_compiled_bad_values_give_nan_not_numbers():
    """Under compile the value checks run on the device: bad values poison the loss and its gradients."""
    head, hidden, lengths, labels = head_and_batch()
    compiled = torch.compile(lambda h, n: head.compute_loss(h, n, labels), fullgraph=True, backend=COMPILER)
    bad = hidden.clone()
    bad[1, 0, 2] = math.nan
    head.zero_grad()
    loss = compiled(bad, lengths)
    loss.backward()
    assert torch.isnan(loss) and all(torch.isnan(p.grad).all() for p in head.parameters())
    assert torch.isnan(compiled(hidden, torch.tensor([5, 6])))  # a length > T


# ------------------------------------------------------------------------------------------- meta and fake


@pytest.mark.parametrize("use_triton", BACKENDS)
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_meta_inputs_give_shapes_and_dtypes(use_triton, semiring):
    case = semicrf_case(B=3, T=4, K=2, C=2, dtype=torch.float32, proj_end=True).to(device=torch.device("meta"))
    case.use_triton = use_triton
    case = case.leaves()
    out = case.forward(semiring)
    assert out.shape == (3,) and out.dtype == torch.float32 and out.is_meta
    grads = torch.autograd.grad(out.sum(), [t for t in case.tensors if t is not None])
    assert [g.shape for g in grads] == [t.shape for t in case.tensors if t is not None]


def test_fake_tensors_give_shapes_and_dtypes():
    with FakeTensorMode():
        case = semicrf_case(B=2, T=3, K=2, C=2, dtype=torch.float64, trans3d=True).leaves()
        out = case.forward()
        grads = torch.autograd.grad(out.sum(), case.tensors[:3])
        assert out.shape == (2,) and out.dtype == torch.float64
        assert [g.shape for g in grads] == [t.shape for t in case.tensors[:3]]


# ------------------------------------------------------------------------------------------- second order


@pytest.mark.parametrize("use_triton", BACKENDS)
def test_second_order_of_the_streaming_function_is_a_clear_error(use_triton):
    case = semicrf_case(B=2, T=3, K=2, C=2, use_triton=use_triton).leaves()
    (g_trans,) = torch.autograd.grad(case.forward().sum(), case.transition, create_graph=True)
    assert g_trans.requires_grad  # not silently detached: differentiating it raises
    with pytest.raises(autograd.SecondOrderError, match="second-order gradients .* not implemented.*exact"):
        g_trans.pow(2).sum().backward()


def test_second_order_of_the_max_semiring_is_exact_zero():
    case = semicrf_case(B=2, T=3, K=2, C=2).leaves()
    (g_dur,) = torch.autograd.grad(case.forward("max").sum(), case.duration_bias, create_graph=True)
    assert g_dur.sum() > 0  # the best path's duration counts
    # the gradient is the best path's indicator, piecewise constant in the inputs: its derivative is exactly 0,
    # which autograd represents by a gradient that does not depend on the inputs
    assert not g_dur.requires_grad


def test_second_order_of_the_head_is_a_clear_error_and_exact_backend_is_correct():
    head, hidden, lengths, labels = head_and_batch(use_triton=False)
    head = head.double()
    hidden = hidden.double()
    (g,) = torch.autograd.grad(head.compute_loss(hidden, lengths, labels), head.transition, create_graph=True)
    with pytest.raises(autograd.SecondOrderError, match="backend='exact'"):
        g.pow(2).sum().backward()
    # the alternative the message names: second order through the exact backend, checked by finite differences
    penalty = lambda t: torch.autograd.grad(  # noqa: E731
        SemiMarkovCRFHead.compute_loss(_with_transition(head, t), hidden, lengths, labels, backend="exact"), t,
        create_graph=True)[0].pow(2).sum()
    t0 = head.transition.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(penalty, (t0,), eps=1e-6, atol=1e-5)


def _with_transition(head: SemiMarkovCRFHead, transition: torch.Tensor) -> SemiMarkovCRFHead:
    clone = SemiMarkovCRFHead(head.num_classes, head.max_duration, head.projection.in_features,
                              use_triton=False).double()
    clone.load_state_dict(head.state_dict())
    del clone.transition
    clone.transition = transition
    return clone


# --------------------------------------------------------------------------------- accuracy and magnitude


@pytest.mark.parametrize("trans3d", [False, True], ids=["trans2d", "trans3d"])
@pytest.mark.parametrize("scale", [1.0, 1e2, 1e4])
def test_float32_training_route_accuracy_does_not_depend_on_magnitude(trans3d, scale):
    """Random scores scaled up to 1e4 (Triton, float32 inputs): gradients within 1e-4 norm-wise relative of the
    float64 oracle on the same (rounded) inputs, logZ within 1e-6 relative."""
    base = semicrf_case(B=2, T=6, K=3, C=3, dtype=torch.float64, trans3d=trans3d, proj_start=True, proj_end=True,
                        variable=True, use_triton=True, seed=4)
    case = base.with_tensors([t * scale for t in base.tensors]).to(torch.float32)
    value, grads = leaf_grads(case)
    want_value, want_grads = oracle_grads(case)
    assert ((value.double() - want_value).abs() / want_value.abs()).max() <= 1e-6
    for got, want in zip(grads, want_grads):
        assert relative(got, want) <= 1e-4


@pytest.mark.parametrize("trans3d", [False, True], ids=["trans2d", "trans3d"])
def test_large_offsets_that_leave_the_distribution_unchanged(trans3d):
    """Adding 1e4 per position to every label, and 1e4 to every transition with -1e4 to every duration bias, adds
    the same amount to every segmentation's score: the marginals (gradients) stay far from 0/1, unlike those of
    randomly scaled scores, so this checks the precision of the backward where it matters. Reference: the float64
    oracle on the same float32 inputs."""
    base = semicrf_case(B=2, T=6, K=3, C=3, dtype=torch.float64, trans3d=trans3d, variable=True, use_triton=True,
                        seed=5)
    shift = 1e4
    T = base.cum_scores.shape[1] - 1
    cum = base.cum_scores + shift * torch.arange(T + 1, dtype=torch.float64)[None, :, None]
    shifted = base.with_tensors([cum, base.transition + shift, base.duration_bias - shift, None, None])
    shifted = shifted.to(torch.float32)
    value, grads = leaf_grads(shifted)
    want_value, want_grads = oracle_grads(shifted)
    assert ((value.double() - want_value).abs() / want_value.abs()).max() <= 1e-6
    spread = grads[0].abs()[grads[0] != 0]
    assert spread.min() < 0.9 and spread.max() > 0.1  # not an indicator: far from 0/1
    for got, want in zip(grads, want_grads):
        assert relative(got, want) <= 1e-4


# ---------------------------------------------------------------------------------------- mixed precision


@pytest.mark.parametrize("use_triton", BACKENDS)
def test_half_inputs_compute_in_float32_with_gradients_in_each_dtype(use_triton):
    case = semicrf_case(B=2, T=4, K=2, C=3, dtype=torch.float32, proj_start=True, use_triton=use_triton)
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.bfloat16]
    mixed = case.with_tensors([t.to(d) for t, d in zip(case.tensors, dtypes)] + [None]).leaves()
    value = mixed.forward()
    value.sum().backward()
    assert value.dtype == torch.float32
    assert [t.grad.dtype for t in mixed.tensors if t is not None] == dtypes
    upcast = mixed.to(torch.float32).leaves()  # the same (rounded) values in float32: identical computation
    want = upcast.forward()
    want.sum().backward()
    assert torch.equal(value.detach(), want.detach())
    for got, ref in zip([t for t in mixed.tensors if t is not None], [t for t in upcast.tensors if t is not None]):
        assert torch.equal(got.grad, ref.grad.to(got.dtype))


def test_float64_anywhere_computes_in_float64():
    case = semicrf_case(B=2, T=3, K=2, C=2, dtype=torch.float32)
    mixed = case.with_tensors([case.cum_scores, case.transition.double(), case.duration_bias.half(), None, None])
    assert mixed.forward().dtype == torch.float64


def test_head_under_autocast():
    head, hidden, lengths, labels = head_and_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = head.compute_loss(hidden, lengths, labels)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in head.parameters())


# --------------------------------------------------------------------------------------------- clear errors


def test_compute_loss_empty_batch_mean_is_an_error_sum_is_zero():
    head, hidden, lengths, labels = head_and_batch()
    with pytest.raises(ValueError, match=r"^hidden: reduction='mean' over an empty batch"):
        head.compute_loss(hidden[:0], lengths[:0], labels[:0])
    assert head.compute_loss(hidden[:0], lengths[:0], labels[:0], reduction="sum").item() == 0.0


@pytest.mark.parametrize("transform", ["vmap", "grad", "jacrev"])
def test_torch_func_transforms_are_a_clear_error(transform):
    case = semicrf_case(B=2, T=3, K=2, C=2)
    fn = lambda cum: semi_crf_streaming_forward(cum, case.transition, case.duration_bias, case.lengths,  # noqa: E731
                                                case.K, use_triton=False).sum()
    wrapped = {"vmap": torch.func.vmap(fn), "grad": torch.func.grad(fn), "jacrev": torch.func.jacrev(fn)}[transform]
    argument = case.cum_scores[None] if transform == "vmap" else case.cum_scores
    with pytest.raises(RuntimeError, match=r"does not support torch\.func transforms .* torch\.autograd\.grad"):
        wrapped(argument)


def test_all_meta_call_without_grad():
    case = semicrf_case(B=2, T=3, K=2, C=2, dtype=torch.float32).to(device=torch.device("meta"))
    assert case.forward().shape == (2,)


def test_padded_shorter_than_a_path_is_an_error():
    result = ViterbiResult(torch.zeros(1), [[Segment(0, 2, 1, 0.0), Segment(2, 5, 0, 0.0)]])
    with pytest.raises(ValueError, match=r"^T must be >= the longest path \(5\), got 4"):
        result.padded(4)
    labels, starts = result.padded(6)
    assert labels.tolist() == [[1, 1, 0, 0, 0, -1]] and starts.tolist() == [[True, False, True, False, False, False]]


def test_head_errors_name_hidden():
    head, hidden, lengths, labels = head_and_batch()
    bad = hidden.clone()
    bad[0, 1, 0] = math.inf
    with pytest.raises(ValueError, match=r"^hidden .*contains NaN or inf"):
        head.compute_loss(bad, lengths, labels)
    with pytest.raises(ValueError, match=r"^hidden .*contains NaN or inf"):
        head(bad, lengths)
    with pytest.raises(ValueError, match=r"^hidden .*contains NaN or inf"):
        head.decode(bad, lengths)


@pytest.mark.parametrize("use_triton", [pytest.param(True, marks=INTERPRETED), False])
def test_device_mode_streaming_call_poisons_instead_of_a_wrong_number(use_triton):
    """A length out of range in device mode: NaN for that sequence (Triton: the kernels check each sequence) or
    for the whole batch (PyTorch backend: one fused flag), and NaN gradients; never a number."""
    case = semicrf_case(B=2, T=3, K=2, C=2, use_triton=use_triton).leaves()
    with validate.value_checks("device"):
        value = semi_crf_streaming_forward(case.cum_scores, case.transition, case.duration_bias,
                                           torch.tensor([3, 7]), case.K, use_triton=use_triton)
    value.sum().backward()
    spoiled = [1] if use_triton else [0, 1]
    assert torch.isnan(value[spoiled]).all() and torch.isfinite(value[[0]]).all() == use_triton
    assert torch.isnan(case.cum_scores.grad[1]).any() and torch.isnan(case.duration_bias.grad).any()


def test_viterbi_names_the_argument_even_in_device_mode():
    case = semicrf_case(B=2, T=3, K=2, C=2)
    with validate.value_checks("device"), pytest.raises(ValueError, match="^lengths must lie in 1..3"):
        semi_crf_viterbi(case.cum_scores, case.transition, case.duration_bias, torch.tensor([0, 3]), case.K)


# -------------------------------------------------------------------------------- seed-compatible semirings


def test_semimarkov_takes_the_semiring_class():
    case = semicrf_case(B=2, T=4, K=2, C=2, variable=True)
    edge = edges_from_streaming(case.cum_scores, case.transition, case.duration_bias, case.K)
    by_class = SemiMarkov(LogSemiring).logpartition(edge, lengths=case.lengths)
    torch.testing.assert_close(by_class, SemiMarkov(Log()).logpartition(edge, case.lengths), rtol=0, atol=0)
    torch.testing.assert_close(by_class, case.naive(), rtol=1e-12, atol=1e-12)
    best = SemiMarkov(MaxSemiring).logpartition(edge, lengths=case.lengths)
    torch.testing.assert_close(best, case.naive("max"), rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match=r"^semiring: KMax needs k: pass an instance such as KMaxSemiring\(3\)"):
        SemiMarkov(KMaxSemiring)
