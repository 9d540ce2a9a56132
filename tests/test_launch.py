"""provable_kernels.launch: the cache key covers everything Triton specializes a launch on."""
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
import triton.language as tl

from provable_kernels import launch


def test_spec_separates_what_triton_specializes_on():
    base = torch.zeros(8)
    assert launch._spec(base) == launch._spec(torch.ones(8))  # same dtype, device, alignment
    assert launch._spec(base) != launch._spec(base.double())
    assert launch._spec(base) != launch._spec(base[1:])  # 4 bytes in: not 16-byte aligned
    assert launch._spec(base) == launch._spec(base[4:])  # 16 bytes in: aligned
    assert launch._spec(24) == launch._spec(40)  # neither 1 nor a multiple of 16, both 32-bit
    assert len({launch._spec(v) for v in (1, 16, 17, 2**31, 2**63)}) == 5
    assert launch._spec(tl.float32) != launch._spec(tl.float64)
    assert launch._spec(None) != launch._spec(False)


def test_launch_key_inlines_the_tensor_spec(monkeypatch):
    """``_key`` computes the tensors' part inline (host time): it must separate exactly what ``_spec`` does."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    opts = launch.options(CP=4)
    base = torch.zeros(8)
    for other, same in ((torch.ones(8), True), (base.double(), False), (base[1:], False), (base[4:], True)):
        assert (launch._key((base, 3), opts) == launch._key((other, 3), opts)) is same
        assert (launch._spec(base) == launch._spec(other)) is same
    assert launch._key((base, 3), opts) != launch._key((base, 16), opts)
    assert launch._key((base, 3), opts) != launch._key((base, 3), launch.options(CP=8))


class Compiled:
    """Stands in for a CompiledKernel: records the launches through its runner and through ``run``."""

    def __init__(self):
        self.launched, self.ran, self.function, self.packed_metadata = [], [], "function", "metadata"

    def _init_handles(self):
        pass

    def __getitem__(self, grid):
        return lambda *args: self.launched.append((grid, args))

    def run(self, *args):
        self.ran.append(args)


class Kernel:  # stands in for the JITFunction: kernel[grid](...) compiles (and launches), returns the compiled kernel
    def __init__(self):
        self.compiles = []

    def __getitem__(self, grid):
        return lambda *args, **meta: self.compiles.append(meta) or Compiled()


def compiled_launcher():
    runner = launch.Launcher.__new__(launch.Launcher)
    runner.kernel, runner.compiled, runner.names, runner.cache = Kernel(), True, ["x", "CP"], {}
    return runner


def test_constexprs_and_the_device_key_by_value(monkeypatch):
    """A first version keyed constexpr ints like runtime ints (CP = 4 and CP = 8 alike) and relaunched a kernel
    compiled for another label count: sentinel verify's marginal property caught it on the GPU. The current CUDA
    device is part of the key (Triton compiles and loads a kernel per device); options are interned."""
    device = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    hooked = types.SimpleNamespace(launch_enter_hook=print, launch_exit_hook=None)  # relaunch through the runner
    monkeypatch.setattr(launch, "knobs", types.SimpleNamespace(runtime=hooked))
    runner = compiled_launcher()
    assert launch.options(CP=4) is launch.options(CP=4) and launch.options(CP=4) is not launch.options(CP=8)
    runner[(1,)](3, CP=4)  # compiles
    runner[(1,)](5, CP=4)  # same key: the compiled kernel, every parameter in order
    runner[(1,)](3, CP=8)  # another constexpr value: compiles again
    device[0] = 1
    runner[(1,)](5, CP=4)  # another device: compiles again
    assert runner.kernel.compiles == [{"CP": 4}, {"CP": 8}, {"CP": 4}]
    four, eight = launch.options(CP=4), launch.options(CP=8)
    assert list(runner.cache) == [(0, (launch._spec(3),), four), (0, (launch._spec(3),), eight),
                                  (1, (launch._spec(3),), four)]
    compiled, constexprs = runner.cache[(0, (launch._spec(3),), four)]
    assert constexprs == (4,) and compiled.launched == [((1, 1, 1), (5, 4))]


def test_relaunch_calls_the_compiled_launcher_directly_unless_hooked(monkeypatch):
    """Without launch hooks the compiled kernel's ``run`` gets the grid, the current stream, the function and every
    parameter (what its runner passes); with a profiler's hooks set the runner itself launches."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    hooks = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(launch, "knobs", types.SimpleNamespace(runtime=hooks))
    runner = compiled_launcher()
    runner[(2,)](3, CP=4)  # compiles
    runner[(2,)](5, CP=4)
    compiled, _ = runner.cache[(0, (launch._spec(3),), launch.options(CP=4))]
    assert compiled.ran == [(2, 1, 1, 1234, "function", "metadata", None, None, None, 5, 4)]
    hooks.launch_enter_hook = types.SimpleNamespace(calls=[])  # newer Triton: an empty HookChain is no hook
    runner[(2,)](7, CP=4)
    assert compiled.ran[-1][-2:] == (7, 4) and not compiled.launched
    hooks.launch_enter_hook = print
    runner[(2,)](6, CP=4)
    assert compiled.launched == [((2, 1, 1), (6, 4))]
    hooks.launch_enter_hook = types.SimpleNamespace(calls=[print])  # a HookChain holding a profiler's hook
    runner[(2,)](8, CP=4)
    assert compiled.launched[-1] == ((2, 1, 1), (8, 4))


def test_a_bound_launch_relaunches_by_alignment_and_device_alone(monkeypatch):
    """``Launcher.bind`` fixes the grid, the trailing arguments and the options: the first launch of a (device,
    alignment) compiles through ``Launcher.launch``, later ones run the same compiled kernel with every parameter
(tensors as their data pointers);
    another alignment or device is another key; profiler hooks send it through the launcher again."""
    device = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: device[0], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 1000 + d, raising=False)
    hooks = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(launch, "knobs", types.SimpleNamespace(runtime=hooks))
    runner = compiled_launcher()
    runner.names = ["x", "n", "CP"]
    bound = runner.bind((3,), (7,), launch.options(CP=4))
    aligned, other = torch.zeros(8), torch.ones(8)
    bound(aligned)  # compiles
    first, _ = runner.cache[(0, ((torch.float32, True), launch._spec(7)), launch.options(CP=4))]
    bound(other)  # same key: run directly
    # the tensor reaches Triton's launcher as its data pointer
    assert len(first.ran) == 1 and first.ran[0][:4] == (3, 1, 1, 1000)
    assert first.ran[0][-3:] == (other.data_ptr(), 7, 4)
    bound(aligned[1:])  # misaligned: another specialization
    device[0] = 1
    bound(aligned)  # another device
    assert runner.kernel.compiles == [{"CP": 4}] * 3
    hooks.launch_enter_hook = print  # a profiler's hook: the launcher's runner launches
    device[0] = 0
    bound(aligned)
    assert len(first.ran) == 1 and first.launched == [((3, 1, 1), (aligned, 7, 4))]


def test_launcher_is_one_per_kernel_and_delegates_under_the_interpreter():
    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **meta: calls.append((grid, args, meta))

    kernel = Kernel()
    assert launch.launcher(kernel) is launch.launcher(kernel)
    launch.launcher(kernel)[(2,)](1, 2, FLAG=True)
    launch.launcher(kernel)[(2,)](1, 2, FLAG=True)
    launch.launcher(kernel).bind((2,), (2,), launch.options(FLAG=True))(1)
    assert calls == [((2,), (1, 2), {"FLAG": True})] * 3  # not a JITFunction: every call goes through kernel[grid]


LATE_CALLS = {
    "semicrf": "from provable_kernels.semicrf import semi_crf_streaming_forward as f\n"
               "call = lambda: f(torch.zeros(1, 3, 2), torch.zeros(2, 2), torch.zeros(2, 2), torch.tensor([2]), 2)",
    "sinkhorn": "from provable_kernels.sinkhorn import sinkhorn\ncall = lambda: sinkhorn(torch.zeros(2, 3, 3))",
    "segment": "from provable_kernels.segment import segment_reduce\n"
               "call = lambda: segment_reduce(torch.ones(4, 2), 'sum', offsets=torch.tensor([0, 1, 4]))",
}


@pytest.mark.parametrize("family", sorted(LATE_CALLS))
def test_interpreter_switched_on_after_import_says_what_to_do(family):
    """Every family gives the same clear error, not Triton's raw driver error, when TRITON_INTERPRET=1 is set after
    its kernels were built for a GPU driver."""
    script = "import os, torch\n" + LATE_CALLS[family] + textwrap.dedent("""
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            call()
        except RuntimeError as exc:
            print(exc)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert launch.LATE_INTERPRETER in done.stdout, done.stderr


def test_interpreter_numpy_warnings_stay_inside_the_launch():
    """Under the interpreter, masked-off lanes divide by zero and take log(0) harmlessly; NumPy's RuntimeWarnings
    about it never reach the caller (they are errors here). (triton 3.6's interpreter also raises NumPy's
    DeprecationWarning about its own scalar conversions: a warning about triton, not about these calls.)"""
    import warnings

    from provable_kernels.semicrf import semi_crf_streaming_forward
    from provable_kernels.sinkhorn import sinkhorn

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(3, 5, 5, device=device, requires_grad=True)
    cum = torch.cat([torch.zeros(2, 1, 3), torch.randn(2, 6, 3).cumsum(1)], 1).to(device).requires_grad_()
    transition = torch.randn(3, 3, device=device)
    transition[0, 1] = float("-inf")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for domain in ("log", "prob"):
            sinkhorn(x, 5, domain).sum().backward()
        lengths = torch.tensor([6, 3], device=device)
        semi_crf_streaming_forward(cum, transition, torch.randn(3, 3, device=device), lengths, 3).sum().backward()
