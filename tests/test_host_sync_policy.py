"""The host-sync policy of value checks (provable_kernels.validate.DataChecks), on the CPU.

Host mode raises the named error before any work; device mode (forced with value_checks("device"), and always
under torch.compile, meta/fake tensors and torch.func) never reads a value on the host and turns a failed check
into NaN values and NaN gradients (poison) or an execution-time error (verify), never into a number.
"""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from provable_kernels import validate


def checked_sum(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A toy public function: sum of the first lengths[b] entries of row b, value-checked."""
    checks = validate.DataChecks()
    checks.finite("x", x)
    lengths = checks.in_range("lengths", lengths, 1, x.shape[1])
    ok = checks.flag()
    mask = torch.arange(x.shape[1], device=x.device) < lengths[:, None]
    return validate.poison(ok, (x * mask).sum(1))


def test_host_mode_names_the_argument():
    x = torch.ones(2, 3)
    x[1, 2] = math.nan
    with pytest.raises(ValueError, match=r"^x contains NaN or inf"):
        checked_sum(x, torch.tensor([1, 3]))
    with pytest.raises(ValueError, match=r"^lengths must lie in 1\.\.3, got min 0, max 3"):
        checked_sum(torch.ones(2, 3), torch.tensor([0, 3]))


def test_host_mode_passes_good_values_unchanged():
    x = torch.arange(6.0).view(2, 3)
    assert checked_sum(x, torch.tensor([1, 3])).tolist() == [0.0, 12.0]


def test_device_mode_poisons_values_and_gradients():
    x = torch.ones(2, 3, requires_grad=True)
    with validate.value_checks("device"):
        out = checked_sum(x, torch.tensor([1, 4]))  # 4 > T: would index out of range
    assert torch.isnan(out).all()
    out.sum().backward()
    assert torch.isnan(x.grad).all()


def test_device_mode_good_values_are_exact():
    x = torch.arange(6.0).view(2, 3).requires_grad_(True)
    with validate.value_checks("device"):
        out = checked_sum(x, torch.tensor([1, 3]))
    assert out.tolist() == [0.0, 12.0]
    out.sum().backward()
    assert x.grad.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_device_mode_clamps_ranges():
    checks = validate.DataChecks()
    with validate.value_checks("device"):
        clamped = checks.in_range("lengths", torch.tensor([0, 2, 9]), 1, 4)
    assert clamped.tolist() == [1, 2, 4]
    assert checks.deferred
    assert checks.flag().item() is False


def test_device_mode_verify_fails_at_execution_naming_the_checks():
    checks = validate.DataChecks()
    with validate.value_checks("device"):
        checks.finite("scores", torch.tensor([1.0, math.inf]))
    with pytest.raises(RuntimeError, match="scores contains NaN or inf"):
        checks.verify()


def test_sync_mode_and_bad_mode_name():
    with validate.value_checks("sync"):
        assert validate.host_reads_allowed(torch.ones(1))
    with pytest.raises(ValueError, match="^mode must be one of"):
        with validate.value_checks("lazy"):
            pass


def test_compile_fullgraph_no_host_read():
    """fullgraph=True fails on any host read (a graph break): the checks must run in device mode."""
    compiled = torch.compile(checked_sum, fullgraph=True, backend="eager")
    x = torch.arange(6.0).view(2, 3)
    assert compiled(x, torch.tensor([1, 3])).tolist() == [0.0, 12.0]
    bad = x.clone()
    bad[0, 0] = math.inf
    assert torch.isnan(compiled(bad, torch.tensor([1, 3]))).all()
    assert torch.isnan(compiled(x, torch.tensor([0, 3]))).all()


def test_meta_and_fake_tensors_take_device_mode():
    out = checked_sum(torch.empty(2, 3, device="meta"), torch.empty(2, dtype=torch.int64, device="meta"))
    assert out.shape == (2,) and out.is_meta
    with FakeTensorMode():
        out = checked_sum(torch.empty(4, 3), torch.ones(4, dtype=torch.int64))
        assert out.shape == (4,)


def test_functorch_transforms_take_device_mode():
    x = torch.arange(6.0).view(2, 3)
    lengths = torch.tensor([[1, 3], [3, 3]])
    out = torch.vmap(lambda n: checked_sum(x, n))(lengths)
    assert out.tolist() == [[0.0, 12.0], [3.0, 12.0]]


def test_poison_rejects_integer_outputs():
    with pytest.raises(TypeError, match="poison needs a float tensor"):
        validate.poison(torch.tensor(True), torch.ones(2, dtype=torch.int64))


def test_at_sync_point_reads_on_the_host_even_in_device_mode():
    checks = validate.DataChecks(at_sync_point=True)
    with validate.value_checks("device"):
        checks.finite("scores", torch.tensor([math.nan]))
    assert not checks.deferred
    with pytest.raises(ValueError, match="^scores contains NaN or inf"):
        checks.flag()


def test_environment_variable_sets_the_mode_for_a_whole_run():
    """PROVABLE_KERNELS_VALUE_CHECKS=device makes a CPU call poison instead of raising; =sync is the strict mode;
    an unknown value is refused at import with the variable named."""
    import subprocess
    import sys

    program = ("import math, torch\nfrom provable_kernels.sinkhorn import sinkhorn\n"
               "x = torch.zeros(2, 3, 3); x[1, 0, 0] = math.nan\n"
               "out = sinkhorn(x, use_triton=False)\n"
               "print(bool(out[0].isfinite().all()), bool(out[1].isnan().all()))")

    def run(mode):
        env = {**__import__("os").environ, validate.VALUE_CHECKS_ENV: mode}
        return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env)

    assert run("device").stdout.split() == ["True", "True"]
    strict = run("sync")
    assert strict.returncode != 0 and "ValueError: x contains NaN" in strict.stderr
    wrong = run("loose")
    assert wrong.returncode != 0 and "PROVABLE_KERNELS_VALUE_CHECKS must be one of" in wrong.stderr
