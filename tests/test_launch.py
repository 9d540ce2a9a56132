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
