"""kernel_sentinel.interpreter: the Triton interpreter's language patching with its member lookups made once."""
from __future__ import annotations

import pytest
import torch

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
