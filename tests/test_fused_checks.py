"""provable_kernels.semicrf.fused_checks: every value check of a call in one Triton launch (under the interpreter here),
and the semi-CRF calls that use it: the same decisions and named errors as one reduction per check."""
import math

import pytest
import torch

from provable_kernels import validate
from provable_kernels.semicrf import fused_checks
from provable_kernels.semicrf import semi_crf_streaming_forward, semi_crf_viterbi
from conftest import semicrf_case

BAD = {"NaN": math.nan, "+inf": math.inf, "-inf": -math.inf}


def expected_ok(floats, ints, low, high) -> bool:
    """The decision written out with plain torch on float64 copies: the independent reference."""
    for x, allow_neg_inf in floats:
        if x is None:
            continue
        x = x.double()
        if torch.isnan(x).any() or (x == math.inf).any() or (not allow_neg_inf and (x == -math.inf).any()):
            return False
    return bool(((ints >= low) & (ints <= high)).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("slot", range(fused_checks.MAX_FLOATS))
@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("allow_neg_inf", [False, True])
def test_each_slot_and_value(dtype, slot, bad, allow_neg_inf):
    floats = [(torch.randn(3, 5, dtype=dtype), True) for _ in range(fused_checks.MAX_FLOATS)]
    x = floats[slot][0]
    x[2, 4] = BAD[bad]
    floats[slot] = (x, allow_neg_inf)
    ints = torch.tensor([1, 2, 3])
    ok = fused_checks.check_values(floats, ints, 1, 3)
    assert bool(ok) == expected_ok(floats, ints, 1, 3) == (bad == "-inf" and allow_neg_inf)


@pytest.mark.parametrize("int_dtype", [torch.int32, torch.int64])
def test_integer_range(int_dtype):
    x = torch.zeros(4, 4)
    for values in ([1, 4, 2], [0, 3, 3], [1, 5, 4], [-7, 9, 2]):
        ints = torch.tensor(values, dtype=int_dtype)
        assert bool(fused_checks.check_values([(x, False)], ints, 1, 4)) == expected_ok([(x, False)], ints, 1, 4)


def test_many_blocks_absent_slots_and_views():
    """A bad value in the last block of a tensor longer than one block, None slots skipped, strided inputs."""
    n = 2 * fused_checks.BLOCK + 7
    x = torch.randn(n)
    ints = torch.ones(n, dtype=torch.int64)
    assert bool(fused_checks.check_values([(x, False), (None, True)], ints, 1, 1))
    x[-1] = math.nan
    assert not bool(fused_checks.check_values([(x, False), (None, True)], ints, 1, 1))
    ints[n - 1] = 2
    assert not bool(fused_checks.check_values([(x[:-1], False)], ints, 1, 1))
    assert bool(fused_checks.check_values([], ints[:-1], 1, 1))  # no float tensor at all
    view = torch.randn(6, 8).t()  # not contiguous
    view[7, 5] = math.inf
    assert not bool(fused_checks.check_values([(view, True)], torch.ones(1, dtype=torch.int64), 1, 1))


def test_usable_only_where_triton_runs():
    assert fused_checks.usable(torch.zeros(1))  # CPU under the interpreter (tests/conftest.py)
    assert not fused_checks.usable(torch.zeros(1, device="meta"))


# ---------------------------------------------------------------------------------------------- semi-CRF calls


@pytest.fixture
def launches(monkeypatch):
    """How many times the fused check ran (the semi-CRF calls below must take it)."""
    calls = []
    real = fused_checks.check_values
    monkeypatch.setattr(fused_checks, "check_values", lambda *args: calls.append(args) or real(*args))
    return calls


def _arguments(case, **changes):
    args = dict(cum_scores=case.cum_scores, transition=case.transition, duration_bias=case.duration_bias,
                lengths=case.lengths, K=case.K, proj_start=case.proj_start, proj_end=case.proj_end, use_triton=True)
    return args | changes


@pytest.mark.parametrize("name, where, bad", [("cum_scores", (1, 2, 0), -math.inf), ("transition", (0, 1), math.nan),
                                              ("duration_bias", (1, 0), math.inf), ("proj_start", (0, 1, 1), math.nan),
                                              ("proj_end", (1, 0, 0), math.inf)])
def test_semicrf_host_mode_names_the_argument(name, where, bad, launches):
    case = semicrf_case(B=2, T=3, K=2, C=2, proj_start=True, proj_end=True)
    x = getattr(case, name).clone()
    x[where] = bad
    with pytest.raises(ValueError, match=f"^{name} contains NaN or"):
        semi_crf_streaming_forward(**_arguments(case, **{name: x}))
    with pytest.raises(ValueError, match=f"^{name} contains NaN or"):
        semi_crf_viterbi(**_arguments(case, **{name: x}))
    assert len(launches) == 2


def test_semicrf_device_mode_takes_no_fused_check(launches):
    """Device mode on the Triton backend: the kernels check the values themselves (tests/test_semicrf_triton.py),
    so no separate check runs; good values give exactly the host-mode result."""
    case = semicrf_case(B=2, T=3, K=2, C=2)
    with validate.value_checks("device"):
        good = semi_crf_streaming_forward(**_arguments(case))
    assert not launches
    assert torch.equal(good, semi_crf_streaming_forward(**_arguments(case)))  # host mode: one fused check
    assert len(launches) == 1
