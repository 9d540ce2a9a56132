"""kernel_sentinel.interpreter: the Triton interpreter's language patching with its member lookups made once."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from provable_kernels import launch
from kernel_sentinel import interpreter

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter: CPU only")


def changes(patch, pkg) -> list[tuple[str, str]]:
    """The (owner, name) pairs ``patch`` sets on ``pkg``, in order, each patch undone afterwards."""
    from triton.runtime import interpreter as triton_interpreter

    scope = triton_interpreter._LangPatchScope()
    patch(pkg, triton_interpreter.interpreter_builder, scope)
    done = [(getattr(owner, "__name__", repr(owner)), name) for owner, name, _ in scope._changes]
    scope.restore()
    return done


def test_install_replaces_the_patching_and_patches_the_same_members_as_triton():
    import inspect

    from triton.runtime import interpreter as triton_interpreter
    import triton.language as tl

    def triton_loop(pkg, builder, scope):  # Triton's own _patch_builtin (Triton 3.6 to 3.9)
        for name, member in inspect.getmembers(pkg):
            if tl.core.is_builtin(member):
                triton_interpreter._patch_attr(pkg, name, member, builder, scope)

    assert interpreter.install() and triton_interpreter._patch_builtin is interpreter._patch_builtin
    for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        want = changes(triton_loop, pkg)
        assert want and changes(interpreter._patch_builtin, pkg) == want


def test_a_patched_member_is_not_patched_again():
    """Inside a launch (its members patched) a helper's call patches nothing more, as Triton's loop does."""
    from triton.runtime import interpreter as triton_interpreter
    import triton.language as tl

    scope = triton_interpreter._LangPatchScope()
    interpreter._patch_builtin(tl, triton_interpreter.interpreter_builder, scope)
    try:
        assert changes(interpreter._patch_builtin, tl) == []
    finally:
        scope.restore()
    assert tl.core.is_builtin(tl.load)  # restored


def test_install_answers_every_dtype_as_triton_does():
    """The interpreter's dtype table, built once, gives Triton's own answer for every scalar type, block type and
    pointer (and raises where Triton raises)."""
    from triton.runtime import interpreter as triton_interpreter
    import triton.language as tl

    assert interpreter.install()
    lookup = triton_interpreter._get_np_dtype
    original = lookup.original
    scalars = [m for m in vars(tl).values() if isinstance(m, tl.dtype)
               and not isinstance(m, (tl.pointer_type, tl.block_type))]
    asked = scalars + [tl.pointer_type(tl.float32), tl.block_type(tl.float16, [4, 8]),
                       tl.block_type(tl.pointer_type(tl.int32), [16])]
    answered = 0
    for tt_dtype in asked:
        try:
            want = original(tt_dtype)
        except KeyError:
            with pytest.raises(KeyError):
                lookup(tt_dtype)
            continue
        assert lookup(tt_dtype) == want and type(lookup(tt_dtype)) is type(want), tt_dtype
        answered += 1
    assert answered >= 15


@triton.jit
def _count_kernel(out_ptr, n):
    """out[0] = n, counted by a loop whose bound is a runtime argument (the interpreter makes n an index)."""
    total = 0
    for _ in range(0, n):
        total += 1
    tl.store(out_ptr, total)


def test_a_runtime_loop_bound_is_an_index_on_every_numpy():
    """Triton 3.6 to 3.8 call int() on a scalar's one-element array of rank 1, which NumPy 2.4 refuses; after
    install the index is its element whatever the rank (Triton 3.9's rule), and a kernel looping to a runtime
    argument counts right."""
    import numpy
    from types import SimpleNamespace

    assert interpreter.install()
    for data in (numpy.array(7), numpy.array([7]), numpy.array([[7]], dtype=numpy.int64)):
        assert interpreter._index(SimpleNamespace(handle=SimpleNamespace(data=data))) == 7
    with pytest.raises(TypeError):  # several elements are no index, as in Triton
        interpreter._index(SimpleNamespace(handle=SimpleNamespace(data=numpy.array([7, 8]))))
    out = torch.zeros(1, dtype=torch.int32)
    launch.launcher(_count_kernel)[(1,)](out, 5)
    assert out.item() == 5


@triton.jit
def _wrapping_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i) * 65536 + 7)  # int32: 65536 * 65536 wraps


def test_the_overflow_sanitizer_is_off_only_where_its_assert_is_skipped():
    """The interpreter's overflow check ends in a ``device_assert`` that its ``debug = False`` skips: after install
    it is not computed, and a wrapping kernel gives the same (wrapped) values as without the patch; with ``debug``
    on, both stay on."""
    from triton.runtime import interpreter as triton_interpreter

    builder = triton_interpreter.interpreter_builder
    assert builder.options.debug is False and builder.options.sanitize_overflow is False
    x = torch.tensor([1, 65536, -3, 0], dtype=torch.int32)
    out = torch.empty_like(x)
    launch.launcher(_wrapping_kernel)[(1,)](x, out, BLOCK=4)
    assert out.tolist() == [65543, 7, -196601, 7]

    class Builder:
        options = dataclasses.replace(builder.options, debug=True, sanitize_overflow=True)

    interpreter._skip_unasserted_overflow_checks(Builder)
    assert Builder.options.sanitize_overflow is True


@triton.jit
def _add_combine(a, b):
    return a + b


@triton.jit
def _max_first_combine(va, ia, vb, ib):
    b_wins = (vb > va) | ((vb == va) & (ib < ia))
    return tl.where(b_wins, vb, va), tl.where(b_wins, ib, ia)


@triton.jit
def _reduce_kernel(x_ptr, out_ptr, arg_ptr, AXIS: tl.constexpr, KEEP: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + r * C + c)
    if AXIS == 2:  # every element (axis None)
        total = tl.reduce(x, None, _add_combine, keep_dims=KEEP)
        if KEEP:
            tl.store(out_ptr + tl.zeros((1, 1), dtype=tl.int32), total)
        else:
            tl.store(out_ptr, total)
    else:
        total = tl.reduce(x, AXIS, _add_combine, keep_dims=KEEP)
        top, arg = tl.reduce((x, r * C + c), AXIS, _max_first_combine, keep_dims=KEEP)
        if AXIS == 0:
            where = c if KEEP else tl.arange(0, C)
        else:
            where = r if KEEP else tl.arange(0, R)
        tl.store(out_ptr + where, total + top)
        tl.store(arg_ptr + where, arg)


@pytest.mark.parametrize("axis, keep", [(0, False), (1, False), (0, True), (1, True), (2, False), (2, True)])
def test_a_custom_reduce_gives_the_values_of_tritons_element_loop(axis, keep):
    """tl.reduce with a combine of the kernel's own (a float sum, a (value, arg) pair with ties): the one-step-per-
    axis fold gives bitwise the values of Triton's element-by-element loop."""
    from triton.runtime import interpreter as triton_interpreter

    assert triton_interpreter.ReduceOps.generic_reduce is interpreter._generic_reduce
    x = (torch.randn(4, 8, generator=torch.Generator().manual_seed(axis)) * 1e3).round() / 7  # ties and roundings
    runs = []
    for reduce in (interpreter._generic_reduce, interpreter._generic_reduce.original):
        triton_interpreter.ReduceOps.generic_reduce = reduce
        try:
            out, arg = torch.zeros(8), torch.zeros(8, dtype=torch.int32)
            launch.launcher(_reduce_kernel)[(1,)](x, out, arg, AXIS=axis, KEEP=keep, R=4, C=8)
            runs.append((out, arg))
        finally:
            triton_interpreter.ReduceOps.generic_reduce = interpreter._generic_reduce
    (out, arg), (expected_out, expected_arg) = runs
    assert torch.equal(out, expected_out) and torch.equal(arg, expected_arg)
    if axis == 0:
        assert torch.equal(arg[:8], x.argmax(0).to(torch.int32) * 8 + torch.arange(8, dtype=torch.int32))


@triton.jit
def _twice(x):
    return x + x


@triton.jit
def _nested_kernel(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, _twice(_twice(tl.load(x_ptr + offs))))


def test_a_launch_patches_the_language_once_and_restores_it(monkeypatch):
    """Triton patches ``triton.language`` at the launch and again at every device-function call inside it; with
    :func:`interpreter.install` the calls inside a launch patch nothing more (the launch's modules are patched
    already), the results are the same, and the launch's end restores Triton's builtins, after an error too."""
    from triton.runtime import interpreter as triton_interpreter

    assert interpreter.install() and triton_interpreter._patch_lang is interpreter._patch_lang
    original = interpreter._patch_lang.original
    patched = []
    monkeypatch.setattr(interpreter._patch_lang, "original", lambda fn: patched.append(fn.__name__) or original(fn))
    load = tl.load
    x, out = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    launch.launcher(_nested_kernel)[(3,)](x, out, N=8)
    assert torch.equal(out, 4 * x)
    assert patched == ["_nested_kernel"]  # Triton's own loop: 1 + 3 programs x 2 calls
    assert tl.load is load and tl.core.is_builtin(tl.load) and interpreter._launch.langs is None
    patched.clear()
    with pytest.raises(Exception, match="power of 2"):
        launch.launcher(_nested_kernel)[(1,)](x, out, N=6)  # raises inside the launch
    assert patched == ["_nested_kernel"] and tl.load is load and interpreter._launch.langs is None
