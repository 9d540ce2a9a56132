"""provable_kernels.launch: the cache key covers everything Triton specializes a launch on."""
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


def test_constexprs_and_the_device_key_by_value(monkeypatch):
    """A first version keyed constexpr ints like runtime ints (CP = 4 and CP = 8 alike) and relaunched a kernel
    compiled for another label count: sentinel verify's marginal property caught it on the GPU. The current CUDA
    device is part of the key (Triton compiles and loads a kernel per device)."""
    device = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    class Compiled:
        def __init__(self):
            self.launched = []

        def __getitem__(self, grid):
            return lambda *args: self.launched.append(args)

    class Kernel:  # stands in for the JITFunction: kernel[grid](...) compiles and returns the compiled kernel
        def __init__(self):
            self.compiles = []

        def __getitem__(self, grid):
            return lambda *args, **meta: self.compiles.append(meta) or Compiled()

    runner = launch.Launcher.__new__(launch.Launcher)
    runner.kernel, runner.compiled, runner.names, runner.cache = Kernel(), True, ["x", "CP"], {}
    runner._launch((1,), (3,), {"CP": 4})  # compiles
    runner._launch((1,), (5,), {"CP": 4})  # same key: the compiled kernel, every parameter in order
    runner._launch((1,), (3,), {"CP": 8})  # another constexpr value: compiles again
    device[0] = 1
    runner._launch((1,), (5,), {"CP": 4})  # another device: compiles again
    assert runner.kernel.compiles == [{"CP": 4}, {"CP": 8}, {"CP": 4}]
    assert list(runner.cache) == [(0, (launch._spec(3),), (("CP", 4),)), (0, (launch._spec(3),), (("CP", 8),)),
                                  (1, (launch._spec(3),), (("CP", 4),))]
    assert runner.cache[(0, (launch._spec(3),), (("CP", 4),))].launched == [(5, 4)]


def test_launcher_is_one_per_kernel_and_delegates_under_the_interpreter():
    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **meta: calls.append((grid, args, meta))

    kernel = Kernel()
    assert launch.launcher(kernel) is launch.launcher(kernel)
    launch.launcher(kernel)[(2,)](1, 2, FLAG=True)
    launch.launcher(kernel)[(2,)](1, 2, FLAG=True)
    assert calls == [((2,), (1, 2), {"FLAG": True})] * 2  # not a JITFunction: every call goes through kernel[grid]
