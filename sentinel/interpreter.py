"""The Triton interpreter's language patching, with its member lookups made once per module, and its dtype table
built once.

Under ``TRITON_INTERPRET=1`` every kernel launch, and every call of a ``@triton.jit`` helper inside a kernel,
patches ``triton.language`` (its module, ``tensor`` class, ``math`` and ``tensor_descriptor_base``): each member
that is a Triton builtin is replaced by one that runs on the interpreter's NumPy semantic. Triton finds those
members with ``inspect.getmembers`` on every call (``_patch_builtin``), sorting hundreds of names each time: on
the CPU about a third of an interpreted kernel's time. :func:`install` replaces ``_patch_builtin`` with
:func:`_patch_builtin`, which patches exactly the same members (the names whose member is a builtin when it is
called; those names are found once per module, before any launch has patched it). Triton's ``_get_np_dtype``
(the NumPy dtype of a Triton type, asked for every value a kernel makes) builds its table of 18 NumPy dtypes on
every call; :func:`install` replaces it with a lookup in that table built once from Triton's own answers (any
type not in it is asked of Triton's function). Triton 3.6 to 3.8 turn a scalar into an index (a loop bound that is
a runtime argument, ``range(0, ITERS)``) with ``int()`` of its one-element array, which NumPy 2.4 refuses for an
array of rank 1 ("only 0-dimensional arrays can be converted to Python scalars"): :func:`install` squeezes it
first, as Triton 3.9 does. The interpreter's integer-overflow sanitizer (``sanitize_overflow``) widens both
operands of every integer addition, subtraction and multiplication to int64, redoes the operation and compares it with
the type's range, then hands the result to ``device_assert``, which the interpreter skips (its ``debug`` option is
off): about a third of an integer-heavy kernel's time for a check that never fires. :func:`install` turns it off
while ``debug`` is off, and leaves both on otherwise. A ``tl.reduce`` with a combine function of the kernel's own
runs in Triton's ``generic_reduce`` one element at a time (the combine called once per element, on one-element
tensors); :func:`install` replaces it with :func:`_generic_reduce`, the same left fold along the axis (element 0,
then each next element combined into the accumulator, in index order) applied to every output position at once:
the combine called once per step of the axis. Each output element sees the same operations in the same order (the
combine is elementwise), so the values are those of Triton's loop wherever NumPy rounds an operation on an array
as on one element, which holds for comparisons, selects and the arithmetic operations. The rest of the interpreter
stays as it is: the kernels run the same code on the same
values, and results are bitwise those without it.

It installs only on a Triton whose interpreter has the function it replaces with the signature it expects (Triton
3.6 to 3.9); elsewhere the interpreter runs unchanged.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from typing import Any

_names: dict[int, tuple[str, ...]] = {}  # id(module or class) -> the names of its builtin members, unpatched


def builtin_names(pkg: Any) -> tuple[str, ...]:
    """The names of the Triton builtins among ``pkg``'s members (found at the first call for ``pkg``, which must
    come before the interpreter patches it: :func:`install` finds them all)."""
    from triton.language.core import is_builtin

    key = id(pkg)
    if key not in _names:
        _names[key] = tuple(name for name, member in inspect.getmembers(pkg) if is_builtin(member))
    return _names[key]


def _patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
    """Triton's ``interpreter._patch_builtin`` over :func:`builtin_names` (a member already patched is no builtin:
    it is skipped, as Triton's own loop skips it; ``is_builtin`` is Triton's test, read inline)."""
    from triton.language.core import TRITON_BUILTIN
    from triton.runtime import interpreter

    members = [(name, member) for name in builtin_names(pkg)
               if getattr(member := getattr(pkg, name), TRITON_BUILTIN, False)]
    for name, member in members:
        interpreter._patch_attr(pkg, name, member, builder, scope)


def _dtype_lookup(original: Any) -> Any:
    """Triton's ``_get_np_dtype`` as a lookup: ``original``'s answer for each scalar type of ``triton.language``,
    found once (a block type answers for its element type, as in Triton's function); ``original`` answers the
    rest (pointers, types it does not know)."""
    import triton.language as tl

    table = {}
    for member in vars(tl).values():
        if isinstance(member, tl.dtype) and not isinstance(member, (tl.pointer_type, tl.block_type)):
            try:
                table[member] = original(member)
            except KeyError:  # a type the interpreter cannot hold: Triton's function raises for it, every time
                pass

    def np_dtype(tt_dtype: Any) -> Any:
        element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        found = None if isinstance(element, tl.pointer_type) else table.get(element)  # pointers: not hashable
        return original(tt_dtype) if found is None else found

    np_dtype.original = original
    return np_dtype


def _index(self: Any) -> int:
    """A scalar tensor's ``__index__`` under the interpreter: its one element, whatever the array's rank (Triton
    3.9's own)."""
    return int(self.handle.data.squeeze())


def _index_squeezed(original: Any) -> Any:
    """Triton's ``_patch_lang_tensor``, then ``__index__`` as :func:`_index` (in the same scope: restored with the
    rest)."""
    def patch_lang_tensor(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    patch_lang_tensor.original = original
    return patch_lang_tensor


def install() -> bool:
    """Use :func:`_patch_builtin` in Triton's interpreter (once per process); False, changing nothing, where the
    interpreter lacks the functions it relies on."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_builtin", None)
    if original is _patch_builtin:
        return True
    if original is None or not hasattr(interpreter, "_patch_attr") \
            or list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"]:
        return False
    import triton.language as tl

    for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base):
        builtin_names(pkg)  # before any launch patches them
    interpreter._patch_builtin = _patch_builtin
    get_np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if get_np_dtype is not None and list(inspect.signature(get_np_dtype).parameters) == ["tt_dtype"]:
        interpreter._get_np_dtype = _dtype_lookup(get_np_dtype)
    patch_lang_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_lang_tensor is not None and list(inspect.signature(patch_lang_tensor).parameters) == ["tensor", "scope"]:
        interpreter._patch_lang_tensor = _index_squeezed(patch_lang_tensor)
    _skip_unasserted_overflow_checks(getattr(interpreter, "interpreter_builder", None))
    patch_lang, executor = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "GridExecutor", None)
    if patch_lang is not None and executor is not None and hasattr(interpreter, "_LangPatchScope") \
            and list(inspect.signature(patch_lang).parameters) == ["fn"]:
        _patch_lang.original = patch_lang
        interpreter._patch_lang = _patch_lang
        executor.__call__ = _launching(executor.__call__)
    reduce_ops = getattr(interpreter, "ReduceOps", None)
    generic = getattr(reduce_ops, "generic_reduce", None)
    if generic is not None and hasattr(reduce_ops, "unravel") \
            and list(inspect.signature(generic).parameters) == ["self", "input"]:
        _generic_reduce.original = generic
        reduce_ops.generic_reduce = _generic_reduce
    return True


def _generic_reduce(self: Any, input: tuple) -> list:
    """Triton's ``ReduceOps.generic_reduce`` with the fold along the axis made once per step for every output
    position (module docstring): ``input`` a tuple of tensors of one shape; returns the reduced tensors."""
    import numpy
    import triton.language as tl

    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    data = [arg.handle.data for arg in input]
    shape = data[0].shape
    output = [numpy.zeros(shape[:axis] + shape[axis + 1:], dtype=d.dtype) for d in data]
    if data[0].size:
        for out, d in zip(output, data):
            out[...] = numpy.take(d, 0, axis=axis)
        for k in range(1, shape[axis]):
            acc = tuple(self.to_tensor(out.copy(), arg.dtype) for out, arg in zip(output, input))
            step = tuple(self.to_tensor(numpy.take(d, k, axis=axis), arg.dtype) for d, arg in zip(data, input))
            combined = self.combine_fn.fn(*acc, *step)
            combined = combined if isinstance(combined, tuple) else (combined,)
            for out, value in zip(output, combined):
                out[...] = numpy.reshape(value.handle.data, out.shape) if isinstance(value, tl.core.tensor) else value
    reduced = []
    for out, arg in zip(output, input):
        if self.keep_dims:
            out = numpy.expand_dims(out, axis) if original_axis is not None else out.reshape((1,) * len(shape))
        elif original_axis is None:
            out = out.item()
        reduced.append(self.to_tensor(out, arg.dtype))
    return reduced


_launch = threading.local()  # this thread's running launch: ``langs``, the ids of the modules it patched


def _patch_lang(fn: Any) -> Any:
    """Triton's ``interpreter._patch_lang`` made once per launch and thread: inside a running launch
    (:func:`_launching`), a device function's call whose ``triton.language`` modules the launch has patched already
    patches nothing (Triton patches them again at every such call, finding no builtin left and setting the same
    members to equivalent wrappers, and drops the scope; the launch's own scope restores them all at its end).
    Outside a launch, or for a module not patched yet, Triton's function runs."""
    import triton.language as tl
    from triton.runtime import interpreter

    patched = getattr(_launch, "langs", None)
    if patched is None:
        return _patch_lang.original(fn)
    langs = {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}
    if langs and langs <= patched:  # none: Triton's own assertion
        return interpreter._LangPatchScope()
    scope = _patch_lang.original(fn)
    patched |= langs
    return scope


def _launching(call: Any) -> Any:
    """``GridExecutor.__call__`` with this thread's launch state (:func:`_patch_lang`) set while it runs."""

    @functools.wraps(call)
    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(_launch, "langs", None)
        _launch.langs = set()
        try:
            return call(self, *args, **kwargs)
        finally:
            _launch.langs = outer

    return launch


def _skip_unasserted_overflow_checks(builder: Any) -> None:
    """``sanitize_overflow`` off in the interpreter's options while ``debug`` is off: its result goes to a
    ``device_assert`` that returns without looking at it (``debug`` on keeps both)."""
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False) \
            and getattr(options, "debug", True) is False:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
