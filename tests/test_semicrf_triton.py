"""The Triton semi-CRF routes (``use_triton=True``) against independent references.

References: the brute-force oracle and its differentiable brute force (kernels/semicrf/oracle.py, through the shared
``SemiCRFCase`` of tests/conftest.py) and, for a length with several checkpoint intervals, the PyTorch reference
route in float64.

Without a GPU the kernels run on CPU tensors under the Triton interpreter (switched on by tests/conftest.py, imported
first); with a GPU they run on it. The interpreter is slow (~50 ms a step), so shapes stay tiny.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import pytest
import torch
import triton.language as tl

from conftest import SEMICRF_TENSORS as NAMES
from conftest import SemiCRFCase as Case
from conftest import semicrf_case
from provable_kernels import validate
from provable_kernels.dispatch import recording
from provable_kernels.semicrf import call, triton_ops
from provable_kernels.semicrf.call import make_call
from provable_kernels.semicrf import oracle

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # interpreter

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
F64 = torch.float64


def make_case(**kwargs) -> Case:
    """``semicrf_case`` whose route calls ask for the Triton backend."""
    return semicrf_case(use_triton=True, **kwargs)


CASES = {
    "linear_chain_K1": dict(B=2, T=5, K=1, C=3, variable=True),
    "K2_proj_start": dict(B=2, T=5, K=2, C=2, proj_start=True),
    "K3_3d_proj_end_variable": dict(B=3, T=5, K=3, C=2, trans3d=True, proj_end=True, variable=True),
    "K_above_T_both_proj": dict(B=2, T=3, K=4, C=2, proj_start=True, proj_end=True, variable=True),
    "K_above_T_3d": dict(B=1, T=3, K=5, C=3, trans3d=True, proj_start=True),
}


# ------------------------------------------------------------------------------------- independent references


def expected_path(items) -> tuple:
    """The decoding rule, stated on the enumeration: among the best-scoring segmentations, the smallest final label,
    then the shortest last segment, then the smallest label before it, ... (keys read from the end)."""
    best = max(score for _, score in items)
    tied = [y for y, score in items if score == best]
    return min(tied, key=lambda y: [key for _, d, c in reversed(y) for key in (c, d)])


def grads(value: torch.Tensor, case: Case) -> list[Optional[torch.Tensor]]:
    present = [t for t in case.tensors if t is not None]
    got = iter(torch.autograd.grad(value, present))
    return [None if t is None else next(got) for t in case.tensors]


def assert_close(got, want, tol, what):
    assert torch.isfinite(got).all() or not torch.isfinite(want).all(), f"{what}: non-finite {got}"
    err = (got.double().cpu() - want.double().cpu()).abs().max().item()
    assert err <= tol, f"{what}: max abs error {err:.3g} > {tol:.1g}\n got {got}\nwant {want}"


def routes(fn):
    with recording() as taken:
        out = fn()
    return out, taken


# ----------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("dtype, tol", [(F64, 1e-10), (torch.float32, 1e-5)])  # float64 / float32 chain
@pytest.mark.parametrize("name", CASES)
def test_partition_log_and_max_against_oracle(name, dtype, tol):
    case = make_case(**CASES[name]).to(dtype, DEVICE)
    scored = case.oracle_scores()
    logz, taken = routes(lambda: case.forward("log"))
    assert taken == ["semicrf.triton.log.infer"]
    assert logz.dtype == dtype and logz.device.type == DEVICE.type
    assert_close(logz, torch.tensor(oracle.log_partition(scored), dtype=F64), tol, "logZ")
    best, taken = routes(lambda: case.forward("max"))
    assert taken == ["semicrf.triton.max.infer"]
    assert_close(best, torch.tensor([s for _, s in oracle.best(scored)], dtype=F64), tol, "max")


class LaunchSpy:
    """Stands in for a kernel and records one constexpr (``flag``) of every launch in ``seen``."""

    def __init__(self, kernel, flag: str):
        self.kernel, self.flag, self.seen = kernel, flag, []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.seen.append(meta[self.flag])
            return self.kernel[grid](*args, **meta)

        return launch


def test_chain_precision_per_route(monkeypatch):
    """float32 chain only for inference on float32 inputs; training (its own kernel), Viterbi and float64 inputs keep
    float64."""
    from provable_kernels.semicrf import dispatch

    forward, train = (LaunchSpy(triton_ops.semicrf_forward_kernel, "CT"),
                      LaunchSpy(triton_ops.semicrf_train_kernel, "CT"))
    monkeypatch.setattr(triton_ops, "semicrf_forward_kernel", forward)
    monkeypatch.setattr(triton_ops, "semicrf_train_kernel", train)
    for entry in (dispatch.PARTITION, dispatch.VITERBI):  # direct runners made earlier hold the kernels unspied
        monkeypatch.setattr(entry, "cache", {})
    case64 = make_case(B=2, T=4, K=2, C=2, variable=True).to(device=DEVICE)
    case32 = case64.to(torch.float32)
    runs = {"log.infer f32": lambda: case32.forward("log"), "max.infer f32": lambda: case32.forward("max"),
            "log.infer f64": lambda: case64.forward("log"), "log.train f32": lambda: case32.leaves().forward("log"),
            "max.train f32": lambda: case32.leaves().forward("max"), "viterbi f32": case32.viterbi}
    chains = {}
    for name, run in runs.items():
        forward.seen.clear()
        train.seen.clear()
        run()
        chains[name] = (forward.seen[:], train.seen[:])
    assert chains == {"log.infer f32": ([tl.float32], []), "max.infer f32": ([tl.float32], []),
                      "log.infer f64": ([tl.float64], []), "log.train f32": ([], [tl.float64]),
                      "max.train f32": ([tl.float64], []), "viterbi f32": ([tl.float64], [])}


def same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bitwise equal under the interpreter, and paths (integer, bool) everywhere; compiled, values within the float32
    rounding of a different summation order."""
    if got.device.type == "cpu" or not got.is_floating_point():
        return torch.equal(got, want)
    return torch.allclose(got, want, rtol=1e-6 if got.dtype == torch.float32 else 1e-13, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_ring_in_registers_gives_the_values_of_the_ring_in_memory(monkeypatch, dtype):
    """The register ring (``REG_RING``) computes the same operations on the same values as the ring in memory: logZ,
    best scores and Viterbi paths are bitwise equal under the interpreter (compiled: float32 results within the
    rounding of its one warp's summation order)."""
    from provable_kernels.semicrf import dispatch

    spy = LaunchSpy(triton_ops.semicrf_forward_kernel, "REG_RING")
    monkeypatch.setattr(triton_ops, "semicrf_forward_kernel", spy)
    case = make_case(B=3, T=7, K=3, C=3, proj_start=True, proj_end=True, variable=True).to(dtype, DEVICE)
    case.transition[0, 1] = float("-inf")  # a forbidden transition: -inf entries pass through the shift

    def run() -> list[torch.Tensor]:
        for entry in (dispatch.PARTITION, dispatch.VITERBI):  # the direct runners hold the launch they were made with
            monkeypatch.setattr(entry, "cache", {})
        path = case.viterbi()
        return [case.forward("log"), case.forward("max"), path.scores, *path.padded(case.cum_scores.shape[1] - 1)]

    in_registers = run()
    assert spy.seen == [True] * 3
    spy.seen.clear()
    monkeypatch.setattr(triton_ops, "register_ring", lambda plan: False)
    in_memory = run()
    assert spy.seen == [False] * 3
    for what, got, want in zip(("logZ", "max", "Viterbi score", "labels", "starts"), in_registers, in_memory):
        assert same_values(got, want), f"{what}: {got} against {want}"
    assert_close(in_registers[0], torch.tensor(oracle.log_partition(case.oracle_scores()), dtype=F64),
                 1e-5 if dtype == torch.float32 else 1e-10, "logZ against the oracle")


@pytest.mark.parametrize("K, C, trans_3d, in_registers", [
    (5, 20, False, True),  # DB 8, CP 32: 2048 elements
    (16, 16, False, True),  # DB 16, CP 16: 4096, the largest tile
    (16, 17, False, False),  # DB 16, CP 32: 8192
    (9, 16, False, True),  # DB 16 (the next power of two of K), CP 16: 4096
    (200, 20, False, False),  # DB 128 < K: several chunks
    (2, 2, True, False),  # 3-D transitions keep their a-values in memory
])
def test_register_ring_where_its_shift_tile_fits(K, C, trans_3d, in_registers):
    """The forward kernel holds its ring in registers only with 2-D transitions, every duration in one chunk and a
    shift tile of DB * DB * CP <= ``REGISTER_RING_TILE`` (4096) elements."""
    case = make_case(B=1, T=K, K=K, C=C, trans3d=trans_3d).to(device=DEVICE)
    streaming = make_call("partition", case.cum_scores, case.transition, case.duration_bias, case.lengths, K, "log",
                          None, None, True)
    assert triton_ops.register_ring(triton_ops._plan(streaming)) is in_registers


def test_float32_chain_logz_matches_float64_reference_at_moderate_length():
    """T = 300 (100x the other cases): the float32 chain's logZ of float32 inputs within 1e-6 relative of the
    oracle's float64 recursion on the same (float32-rounded) inputs."""
    case32 = make_case(B=2, T=300, K=4, C=3, trans3d=True, proj_start=True, proj_end=True, variable=True,
                       seed=10).to(torch.float32, DEVICE)
    got, taken = routes(lambda: case32.forward("log"))
    assert taken == ["semicrf.triton.log.infer"] and got.dtype == torch.float32
    want = case32.to(F64).naive("log")
    rel = ((got.double().cpu() - want.cpu()).abs() / want.abs().cpu()).max().item()
    assert rel <= 1e-6, f"float32-chain logZ relative error {rel:.3g}"


@pytest.mark.parametrize("name", CASES)
def test_log_gradients_against_brute_force(name):
    """The Triton backward equals autograd of a brute force for all five inputs."""
    case = make_case(**CASES[name]).to(device=DEVICE).leaves()
    weight = torch.linspace(0.5, 1.5, case.lengths.numel(), dtype=F64, device=DEVICE)
    value, taken = routes(lambda: case.forward("log"))
    assert taken == ["semicrf.triton.log.train"]
    got = grads((value * weight).sum(), case)
    ref_case = case.to().leaves()
    want = grads((ref_case.brute_force() * weight).sum(), ref_case)
    for name_, g, w in zip(NAMES, got, want):
        assert (g is None) == (w is None), name_
        if g is not None:
            assert g.shape == w.shape and g.dtype == F64
            assert_close(g, w, 1e-10, f"grad {name_}")


def test_float32_inputs_give_float32_outputs_close_to_float64():
    case64 = make_case(B=2, T=6, K=3, C=2, proj_start=True, proj_end=True, variable=True, seed=3).to(device=DEVICE)
    case32 = case64.to(torch.float32).leaves()
    value = case32.forward("log")
    assert value.dtype == torch.float32
    got = grads(value.sum(), case32)
    ref = case64.leaves()
    want_value = ref.brute_force()
    want = grads(want_value.sum(), ref)
    assert_close(value, want_value.detach(), 1e-5, "logZ float32")
    for name_, g, w in zip(NAMES, got, want):
        assert g.dtype == torch.float32
        assert_close(g, w, 1e-5, f"grad {name_} float32")


def tied(case: Case) -> Case:
    """Every segmentation scores the same except that label 0 is forbidden after label 1 (ties everywhere)."""
    case = case.with_tensors([None if t is None else torch.zeros_like(t) for t in case.tensors])
    if case.transition.dim() == 3:
        case.transition[:, 1, 0] = float("-inf")
    else:
        case.transition[1, 0] = float("-inf")
    return case


def assert_decodes_by_tie_rule(case: Case) -> None:
    result = case.viterbi()
    for b, items in enumerate(case.oracle_scores()):
        assert tuple((seg.start, seg.duration, seg.label) for seg in result.segments[b]) == expected_path(items)
        assert float(result.scores[b]) == max(score for _, score in items)


@pytest.mark.parametrize("trans3d", [False, True])
def test_viterbi_tie_rule_when_everything_ties(trans3d):
    case = make_case(B=2, T=5, K=3, C=3, trans3d=trans3d, variable=True)
    assert_decodes_by_tie_rule(tied(case).to(device=DEVICE))


def test_viterbi_against_oracle_with_ties():
    """Triton Viterbi follows the reference's tie rule.

    Integer scores make many exact ties: the decoded path must follow the stated tie rule."""
    for kwargs in (dict(B=3, T=6, K=3, C=2, variable=True, proj_end=True),
                   dict(B=2, T=5, K=2, C=3, trans3d=True, proj_start=True, variable=True)):
        case = make_case(integers=True, seed=1, **kwargs).to(device=DEVICE)
        result, taken = routes(case.viterbi)
        assert taken == ["semicrf.triton.viterbi"]
        for b, items in enumerate(case.oracle_scores()):
            want = expected_path(items)
            assert tuple((seg.start, seg.duration, seg.label) for seg in result.segments[b]) == want
            assert float(result.scores[b]) == max(score for _, score in items)
            assert math.isclose(sum(seg.score for seg in result.segments[b]), float(result.scores[b]), abs_tol=1e-9)


def test_max_train_gradient_is_the_best_path_indicator():
    case = make_case(B=2, T=5, K=2, C=2, trans3d=True, proj_start=True, proj_end=True, variable=True,
                     seed=5).to(device=DEVICE).leaves()
    value, taken = routes(lambda: case.forward("max"))
    assert taken == ["semicrf.triton.max.train"]
    ref = case.to().leaves()
    want_value = ref.brute_force("max")
    assert_close(value.detach(), want_value.detach(), 1e-10, "max value")
    for name_, g, w in zip(NAMES, grads(value.sum(), case), grads(want_value.sum(), ref)):
        assert_close(g, w, 1e-12, f"max grad {name_}")


def test_multi_chunk_durations(monkeypatch):
    """Tiny tile budgets force several duration chunks per step (online logsumexp / max across chunks, the
    per-sequence gradient buffers)."""
    monkeypatch.setattr(triton_ops, "TILE_2D", 2)
    monkeypatch.setattr(triton_ops, "TILE_3D", 8)
    for kwargs in (dict(B=2, T=5, K=3, C=2, proj_start=True, variable=True),
                   dict(B=1, T=4, K=4, C=2, trans3d=True, proj_end=True)):
        K = min(kwargs["K"], kwargs["T"])
        assert triton_ops.config(K, kwargs["C"], kwargs.get("trans3d", False))[0] < K
        case = make_case(**kwargs).to(device=DEVICE).leaves()
        value = case.forward("log")
        ref = case.to().leaves()
        want_value = ref.brute_force()
        assert_close(value.detach(), want_value.detach(), 1e-10, "logZ")
        for name_, g, w in zip(NAMES, grads(value.sum(), case), grads(want_value.sum(), ref)):
            assert (g is None) == (w is None)
            if g is not None:
                assert_close(g, w, 1e-10, f"grad {name_}")
        assert_decodes_by_tie_rule(make_case(integers=True, seed=2, **kwargs).to(device=DEVICE))
        assert_decodes_by_tie_rule(tied(make_case(**kwargs)).to(device=DEVICE))


@pytest.mark.parametrize("C, route", [(64, "semicrf.triton.log.infer"), (65, "semicrf.torch.log.infer")])
def test_more_labels_than_the_triton_limit_run_the_pytorch_recursion(C, route):
    """Beyond TRITON_MAX_LABELS (64) the Triton kernels' register tiles grow past the register file (at C = 257
    the backward compiled for minutes): dispatch takes the PyTorch route there, exact as below the limit."""
    assert call.TRITON_MAX_LABELS == 64
    case = make_case(B=2, T=2, K=2, C=C, variable=True).to(device=DEVICE)
    logz, taken = routes(lambda: case.forward("log"))
    assert taken == [route]
    assert_close(logz, case.to().brute_force(), 1e-10, f"logZ at C = {C}")  # float64, as the other oracle tests


def test_minus_inf_transitions():
    """Forbidden transitions (-inf) and a forbidden duration: finite values and gradients equal to the brute force."""
    case = make_case(B=2, T=5, K=3, C=3, trans3d=True, proj_start=True, variable=True, seed=4)
    case.transition[:, 0, 1] = float("-inf")
    case.transition[1, 2, :] = float("-inf")
    case.duration_bias[2, 0] = float("-inf")
    case = case.to(device=DEVICE).leaves()
    value = case.forward("log")
    assert torch.isfinite(value).all()
    value32 = case.to(torch.float32).forward("log")  # inference: float32 chain
    assert torch.isfinite(value32).all()
    assert_close(value32, value.detach(), 1e-5, "logZ float32 chain")
    ref = case.to().leaves()
    want_value = ref.brute_force()
    assert_close(value.detach(), want_value.detach(), 1e-10, "logZ")
    for name_, g, w in zip(NAMES, grads(value.sum(), case), grads(want_value.sum(), ref)):
        if g is not None:
            assert torch.isfinite(g).all(), name_
            assert_close(g, w, 1e-10, f"grad {name_}")


def test_no_finite_segmentation_gives_minus_inf_and_zero_gradients():
    """K = 1 and every transition -inf: sequences longer than 1 have no finite segmentation."""
    case = make_case(B=2, T=3, K=1, C=2, proj_end=True, variable=True, seed=6)
    case.lengths[1] = 1
    case.transition.fill_(float("-inf"))
    case = case.to(device=DEVICE).leaves()
    value = case.forward("log")
    assert value[0] == float("-inf") and torch.isfinite(value[1])
    value32 = case.to(torch.float32).forward("log")  # inference: float32 chain
    assert value32[0] == float("-inf") and torch.isfinite(value32[1])
    g_cum, g_trans, g_dur, _, g_pe = grads(value.sum(), case)
    assert (g_cum[0] == 0).all() and (g_pe[0] == 0).all()
    alive = case.with_tensors([None if t is None else t[1:] if t.dim() == 3 else t for t in case.to().tensors])
    alive = replace(alive, lengths=case.lengths[1:].cpu()).leaves()
    w_cum, w_trans, w_dur, _, w_pe = grads(alive.brute_force().sum(), alive)
    for name_, g, w in (("cum", g_cum[1:], w_cum), ("trans", g_trans, w_trans), ("dur", g_dur, w_dur),
                        ("pe", g_pe[1:], w_pe)):
        assert_close(g, w, 1e-10, f"grad {name_}")
    assert case.viterbi().scores[0] == float("-inf")


def test_gradients_are_bitwise_deterministic():
    """Triton gradients are bitwise identical on repeated runs (no atomics on outputs)."""
    case = make_case(B=3, T=6, K=3, C=3, proj_start=True, proj_end=True, variable=True, seed=7).to(device=DEVICE)
    case = case.to(torch.float32)
    runs = []
    for _ in range(2):
        leaves = case.leaves()
        runs.append(grads(leaves.forward("log").sum(), leaves))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_longer_sequences_of_variable_lengths_against_the_oracle():
    """T = 12, K = 1, variable lengths: the outside recursion over the alpha the forward kept, down from each
    sequence's own length; against the oracle's float64 recursion, differentiated by autograd."""
    case = make_case(B=2, T=12, K=1, C=2, proj_start=True, variable=True, seed=8).to(device=DEVICE)
    assert case.lengths.tolist()[0] != case.lengths.tolist()[1]
    leaves = case.leaves()
    got = grads(leaves.forward("log").sum(), leaves)
    ref = case.leaves()
    for name_, g, w in zip(NAMES, got, grads(ref.naive("log").sum(), ref)):
        if g is not None:
            assert_close(g, w, 1e-10, f"grad {name_}")


def test_non_contiguous_inputs():
    case = make_case(B=2, T=4, K=2, C=2, proj_end=True, seed=9)
    strided = case.with_tensors([None if t is None else t.transpose(-1, -2).contiguous().transpose(-1, -2)
                                 for t in case.tensors]).to(device=DEVICE)
    assert not strided.cum_scores.is_contiguous()
    assert_close(strided.forward("log"), torch.tensor(oracle.log_partition(case.oracle_scores()), dtype=F64), 1e-10,
                 "logZ non-contiguous")


def test_backend_rejects_bad_arguments():
    case = make_case(B=2, T=3, K=2, C=2).to(device=DEVICE)
    call = make_call("partition", *case.tensors[:3], case.lengths, case.K, "max", None, None, True)
    with pytest.raises(TypeError, match="call"):
        triton_ops.partition({"cum_scores": case.cum_scores})
    with pytest.raises(ValueError, match="semiring"):
        triton_ops.train_forward(call)
    log_call = replace(call, semiring="log")
    _, saved = triton_ops.train_forward(log_call)
    with pytest.raises(ValueError, match="grad_logZ"):
        triton_ops.backward(log_call, saved, torch.ones(3, dtype=F64, device=DEVICE))
    with pytest.raises(TypeError, match="grad_logZ"):
        triton_ops.backward(log_call, saved, torch.ones(2, dtype=torch.int64, device=DEVICE))
    with pytest.raises(TypeError, match="saved"):
        triton_ops.backward(log_call, saved.float(), torch.ones(2, dtype=F64, device=DEVICE))
    with pytest.raises(ValueError, match="saved"):
        triton_ops.backward(log_call, saved[1:], torch.ones(2, dtype=F64, device=DEVICE))


# ------------------------------------------------------------------------------- value checks inside the kernels

# (argument, index, bad value, sequences it spoils); lengths = [5, 3], so cum_scores[1, 4:] is padding
SPOILERS = [("cum_scores", (1, 2, 0), math.nan, [1]), ("cum_scores", (1, 5, 1), -math.inf, [1]),
            ("cum_scores", (0, 5, 0), math.inf, [0]), ("proj_start", (0, 1, 1), math.nan, [0]),
            ("proj_end", (1, 4, 0), math.inf, [1]), ("transition", (1, 2, 0), math.nan, [0, 1]),
            ("duration_bias", (1, 0), math.inf, [0, 1]), ("lengths", 1, 0, [1]), ("lengths", 0, 6, [0])]


@pytest.mark.parametrize("trans3d", [False, True])
@pytest.mark.parametrize("name, where, bad, spoiled", SPOILERS)
def test_device_mode_kernels_poison_exactly_the_spoiled_sequences(name, where, bad, spoiled, trans3d):
    """Device mode (no host read): each kernel program checks its own sequence's values and length (padding
    included) and the shared transition and duration biases. A spoiled sequence gets NaN (log and max, inference
    and training) and NaN gradients, which the shared parameters' gradients then carry; every other sequence
    keeps bitwise the values and per-sequence gradients of a clean call. Nothing reads out of bounds."""
    clean = make_case(B=2, T=5, K=3, C=3, trans3d=trans3d, proj_start=True, proj_end=True, seed=5)
    clean = replace(clean, lengths=torch.tensor([5, 3])).to(device=DEVICE)
    spoilt = clean.to()
    if name == "transition" and not trans3d:
        where = where[1:]
    if name == "lengths":
        spoilt.lengths[where] = bad
    else:
        getattr(spoilt, name)[where] = bad
    kept = [b for b in range(2) if b not in spoiled]
    with validate.value_checks("device"):
        for semiring in ("log", "max"):
            want, got = clean.forward(semiring), spoilt.forward(semiring)
            assert torch.isnan(got[spoiled]).all() and torch.equal(got[kept], want[kept]), semiring
            want_case, got_case = clean.leaves(), spoilt.leaves()
            want, got = want_case.forward(semiring), got_case.forward(semiring)
            assert torch.isnan(got[spoiled]).all() and torch.equal(got[kept], want[kept]), f"{semiring} train"
            want_grads, got_grads = grads(want.sum(), want_case), grads(got.sum(), got_case)
            for b in spoiled:
                assert torch.isnan(got_grads[0][b]).any(), f"{semiring}: cum_scores gradient of sequence {b}"
            # the shared parameters carry the NaN of what a spoiled sequence uses: its marginals (log) or decoded
            # path (max) hold a duration bias, and transitions once it has two positions (lengths clamped to 1..T)
            assert torch.isnan(got_grads[2]).any(), f"{semiring}: duration_bias gradient"
            if semiring == "log" and min(spoilt.lengths[spoiled].clamp(1, 5)) >= 2:
                assert torch.isnan(got_grads[1]).any(), f"{semiring}: transition gradient"
            for per_sequence in (0, 3, 4):
                assert torch.equal(got_grads[per_sequence][kept], want_grads[per_sequence][kept]), \
                    f"{semiring}: {NAMES[per_sequence]} gradient of the kept sequences"


def test_repeated_launches_are_bitwise_equal_across_signatures():
    """The kernels launch through provable_kernels.launch (on a GPU: the compiled kernel, cached per argument
    signature, from the second call of a signature on): repeated and interleaved calls of different shapes, a
    non-contiguous input and both semirings give bitwise the first call's results, which match the oracle."""
    first = make_case(B=2, T=4, K=2, C=3, variable=True, seed=11).to(torch.float32, DEVICE)
    second = make_case(B=3, T=17, K=3, C=2, trans3d=True, proj_start=True, seed=12).to(torch.float32, DEVICE)
    results = {}
    for _ in range(3):
        for name, case in (("first", first), ("second", second)):
            for semiring in ("log", "max"):
                value = case.forward(semiring)
                key = (name, semiring)
                assert torch.equal(value, results.setdefault(key, value)), key
    assert_close(results["first", "log"], torch.tensor(oracle.log_partition(first.oracle_scores()), dtype=F64),
                 1e-5, "logZ after cached launches")
