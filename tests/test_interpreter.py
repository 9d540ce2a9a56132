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
