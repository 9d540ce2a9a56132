"""Custom ops with an eager fast path, shared by every family.

Each family registers its kernels as torch custom ops (``torch.library.custom_op``) with fake implementations
and an autograd formula, so that ``torch.compile(fullgraph=True)``, export, meta / fake tensors and CUDA-graph
capture see one opaque node per kernel. In plain eager code the custom-op dispatcher costs more host time than a
small kernel takes: about 19 us per call without autograd and 41 us with inputs that require grad, against 8-10
us for a ``torch.autograd.Function`` and nothing for a direct call (CPU, torch 2.13; ``benchmarks`` measures the
public calls on the GPU). :class:`Op` therefore runs the same implementation and the same autograd formula in
three ways, chosen at call time:

- under ``torch.compile``, export, ``torch.func`` transforms or on meta / fake tensors: the custom op;
- plain eager with autograd recording (grad mode on, a tensor argument requires grad): a
  ``torch.autograd.Function`` built from the op's ``setup_context`` and ``backward``;
- plain eager otherwise: the implementation itself (an op without an autograd formula whose inputs require grad
  runs as the custom op, so that differentiating it raises torch's error instead of a silent zero).

The three give bitwise the same outputs and gradients: they run the same Python functions on the same tensors.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from provable_kernels.validate import symbolic

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def plain_eager(x: torch.Tensor) -> bool:
    """True for an eager call on a real tensor ``x``: not compiling, exporting or tracing (no torch dispatch mode
    such as fake or proxy tensors, no ``torch.func`` transform), and ``x`` a plain (not meta) tensor or
    parameter rather than a tensor subclass. Such a call may skip the custom-op dispatcher."""
    return type(x) in _PLAIN and not symbolic(x) and _current_dispatch_mode() is None


class Op:
    """A custom op ``name`` (namespace ``provable_kernels``) over ``impl``, callable as ``op(*args)`` (the first
    argument a tensor).

    ``impl`` is the implementation (annotated as ``torch.library.custom_op`` requires; it returns a tensor, a
    tuple of tensors or a list of tensors). ``fake`` is its fake implementation. ``setup_context(ctx, inputs,
    output)`` and ``backward(ctx, *grads)`` (for a list output ``backward(ctx, grads)`` with ``grads`` a list)
    form its autograd formula, as ``torch.library.register_autograd`` takes them; without them the op has none.
    ``op.custom_op`` is the registered op itself (``torch.ops.provable_kernels.<name>``), for opcheck and tests.
    """

    def __init__(self, name: str, impl: Callable[..., Any], fake: Callable[..., Any], *,
                 setup_context: Callable[..., None] | None = None, backward: Callable[..., Any] | None = None):
        self.impl = impl
        self.returns_list = _returns_list(impl)
        self.custom_op = torch.library.custom_op(f"provable_kernels::{name}", impl, mutates_args=())
        self.custom_op.register_fake(fake)
        self.function = None
        if backward is not None:
            self.custom_op.register_autograd(backward, setup_context=setup_context)
            self.function = _function(name, impl, setup_context, backward, self.returns_list)

    def __call__(self, *args: Any) -> Any:
        if not plain_eager(args[0]):  # compile, export, fake tensors, torch.func, verify's opcheck
            return self.custom_op(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            if self.function is None:  # e.g. the semi-CRF Viterbi op under max.train: its outputs get no gradient
                return self.custom_op(*args)  # torch's own error when its output is differentiated
            out = self.function.apply(*args)
            return list(out) if self.returns_list else out
        return self.impl(*args)


def _returns_list(impl: Callable[..., Any]) -> bool:
    return str(impl.__annotations__.get("return", "")).startswith("list")


def _function(name: str, impl: Callable[..., Any], setup_context: Callable[..., None],
              backward: Callable[..., Any], as_list: bool) -> type[torch.autograd.Function]:
    """The ``torch.autograd.Function`` of the eager path: ``impl`` forward, the op's own autograd formula. The
    forward takes ``ctx`` and calls ``setup_context`` itself: a Function with a separate ``setup_context`` binds
    its arguments with ``inspect.signature`` on every call (about 40 us per call on the CPU). ``as_list``: ``impl``
    returns a list (passed to ``backward`` as a list of gradients)."""

    def forward(ctx: Any, *args: Any) -> Any:
        out = impl(*args)
        setup_context(ctx, args, out)
        return tuple(out) if as_list else out

    def backward_of_function(ctx: Any, *grads: Any) -> Any:
        return backward(ctx, list(grads)) if as_list else backward(ctx, *grads)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward_of_function),
    })
