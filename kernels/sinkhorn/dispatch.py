"""Sinkhorn dispatch: conditions, route bodies, the decision tree (data) and the public entry points.

Every entry point (:func:`sinkhorn`, :class:`SinkhornKnopp`, :class:`FusedMHC`) validates into a
:class:`~provable_kernels.sinkhorn.call.SinkhornCall` and evaluates :data:`TREE`, which records the route taken.
"""
from __future__ import annotations

import torch
from torch import nn

from provable_kernels import validate
from provable_kernels.dispatch import Branch, Condition, Route, Tree, triton_usable
from provable_kernels.sinkhorn import autograd, torch_ops, triton_ops
from provable_kernels.runtime import Entry
from provable_kernels.sinkhorn.call import DOMAINS, SinkhornCall, bind, check, make_call, require_call

# ----------------------------------------------------------------------------------------------- conditions


def ask_backend(call: SinkhornCall) -> str:
    """``triton`` when the caller allows it (use_triton=True) and Triton can run on ``x``'s device (CUDA, or CPU
    under TRITON_INTERPRET=1); otherwise ``torch``."""
    return "triton" if call.use_triton and triton_usable(call.x.device) else "torch"


def ask_size(call: SinkhornCall) -> str:
    """``fits`` when n <= triton_ops.MAX_N (64: one 64 x 64 matrix per program is the largest tile the kernels
    hold), else ``too_large`` (the PyTorch loop, which has no size limit)."""
    return "fits" if call.n <= triton_ops.MAX_N else "too_large"


def ask_domain(call: SinkhornCall) -> str:
    """The normalisation requested: ``log`` (log-domain loop, clamp at -1e5) or ``prob`` (softmax, then divisions
    with ``eps``)."""
    return call.domain


def ask_grad(call: SinkhornCall) -> str:
    """``train`` when autograd is on and ``x`` requires a gradient, else ``infer``."""
    return "train" if torch.is_grad_enabled() and call.x.requires_grad else "infer"


BACKEND = Condition("backend", ask_backend, ("triton", "torch"))
SIZE = Condition("size", ask_size, ("fits", "too_large"))
DOMAIN = Condition("domain", ask_domain, DOMAINS)
GRAD = Condition("grad", ask_grad, ("infer", "train"))

# ------------------------------------------------------------------------------------------------ route bodies


def _triton_forward(call: SinkhornCall):
    """The forward op, or with ``call.residual`` the op that also returns the residuals."""
    op = autograd.sinkhorn_forward_residual if call.residual else autograd.sinkhorn_forward
    return op(call.x, call.iters, call.domain, call.eps)


def triton_infer(call: SinkhornCall):
    """Fused Triton forward (several matrices per program; the log domain in scaling form: one exp per entry,
    then divisions). No autograd graph."""
    call = require_call(call)
    with torch.no_grad():
        return _triton_forward(call)


def prepare_triton_infer(call: SinkhornCall, args: tuple):
    """The direct runner of :func:`triton_infer` for every call with ``call``'s signature (a function of
    :func:`sinkhorn`'s arguments), its launch made once."""
    forward = autograd.prepare_forward(call.x, call.iters, call.domain, call.eps, call.residual)
    return lambda x, *settings: forward(x)


def prepare_triton_train(call: SinkhornCall, args: tuple):
    """The direct runner of :func:`triton_train` for every call with ``call``'s signature: one autograd function,
    both launches made once."""
    train = autograd.prepare_train(call.x, call.iters, call.domain, call.eps, call.residual)
    return lambda x, *settings: train(x)


def triton_train(call: SinkhornCall):
    """Fused Triton forward as a custom op whose backward is the hand-written Triton kernel: it replays the
    forward on chip from ``x`` and stores nothing per iteration."""
    return _triton_forward(require_call(call))


def torch_infer(call: SinkhornCall):
    """PyTorch loop of the convention in float32 (float64 for float64), no autograd graph."""
    call = require_call(call)
    with torch.no_grad():
        return torch_ops.sinkhorn(call)


def torch_train(call: SinkhornCall):
    """PyTorch loop of the convention, differentiated by autograd (memory O(iters * n^2) per matrix)."""
    return torch_ops.sinkhorn(require_call(call))


def torch_large(call: SinkhornCall):
    """n above the Triton tile limit: the PyTorch loop (autograd when ``x`` requires grad), either domain."""
    return torch_ops.sinkhorn(require_call(call))


def _by_domain_and_grad(backend: str, infer, train, prepare_infer=None, prepare_train=None) -> Branch:
    return Branch(DOMAIN, {
        domain: Branch(GRAD, {
            "infer": Route(f"sinkhorn.{backend}.{domain}.infer", infer, prepare_infer),
            "train": Route(f"sinkhorn.{backend}.{domain}.train", train, prepare_train),
        })
        for domain in DOMAINS
    })


TREE = Tree("sinkhorn", Branch(BACKEND, {
    "triton": Branch(SIZE, {
        "fits": _by_domain_and_grad("triton", triton_infer, triton_train, prepare_triton_infer,
                                    prepare_triton_train),
        "too_large": Route("sinkhorn.torch.large", torch_large),
    }),
    "torch": _by_domain_and_grad("torch", torch_infer, torch_train),
}))

# ------------------------------------------------------------------------------------------------ entry points

ENTRY = Entry(TREE, check, bind)


def sinkhorn(x: torch.Tensor, iters: int = 20, domain: str = "log", eps: float = 1e-6, *,
             use_triton: bool = True, return_residual: bool = False):
    """Doubly-stochastic matrices from logits ``x`` (..., n, n); returns the same shape and dtype.

    ``domain="log"``: ``w = max(x, -1e5)`` (its gradient flows where ``x >= -1e5`` and is zero below), then
    ``iters`` times ``w -= logsumexp(w, -1)`` (rows) and ``w -= logsumexp(w, -2)`` (columns); returns ``exp(w)``
    (``eps`` unused). ``domain="prob"``:
    ``p = softmax(x, -1) + eps``, ``p /= p.sum(-2) + eps``, then ``iters - 1`` times ``p /= p.sum(-1) + eps`` and
    ``p /= p.sum(-2) + eps``. Math in float32 (float64 for float64 inputs); the gradient is the exact gradient
    of this finite loop. An all -inf row is uniform after its first row step (log) or softmaxes to 1/n (prob);
    with ``eps = 0`` a zero row or column sum divides by 1. NaN or +inf in ``x``: ``ValueError`` in host mode
    (CPU tensors, or inside ``validate.value_checks("sync")``; one host read); in device mode (CUDA, compile,
    capture; no host read) each matrix holding one comes out NaN, with NaN gradients, and the others are exact.
    ``use_triton=False`` forces the PyTorch backend. ``return_residual=True`` returns ``(out, residual)``:
    ``residual`` (...) holds each matrix's convergence residual, the largest of ``|row sum - 1|`` and
    ``|column sum - 1|`` over its lines, computed from the same launch in float32 (float64 for float64 inputs)
    before the output is rounded to ``x``'s dtype; NaN for a matrix holding NaN or +inf; no gradient.
    """
    return ENTRY(x, iters, domain, eps, use_triton, return_residual)


class SinkhornKnopp(nn.Module):
    """``sinkhorn(x, iters, domain, eps, return_residual=return_residual)`` as a module (no parameters)."""

    def __init__(self, iters: int = 20, domain: str = "log", eps: float = 1e-6, return_residual: bool = False):
        super().__init__()
        # validate the settings now, not at the first call
        make_call(torch.zeros(1, 1), iters, domain, eps, return_residual=return_residual)
        self.iters, self.domain, self.eps, self.return_residual = iters, domain, eps, return_residual

    def forward(self, x: torch.Tensor):
        return sinkhorn(x, self.iters, self.domain, self.eps, return_residual=self.return_residual)



class FusedMHC(nn.Module):
    """Drop-in for triton-sinkhorn's ``FusedMHC(mhc_iters)``: log-domain Sinkhorn of ``x`` (..., n, n) with
    autocast disabled inside, float32 math for float32/bfloat16/float16 (float64 inputs keep float64), output in
    the input's dtype."""

    def __init__(self, mhc_iters: int = 20):
        super().__init__()
        self.mhc_iters = validate.positive_int("mhc_iters", mhc_iters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type if isinstance(x, torch.Tensor) else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            return sinkhorn(x, self.mhc_iters, "log")

