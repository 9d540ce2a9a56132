"""Sinkhorn adapter: ``provable_kernels.sinkhorn.sinkhorn`` against the naive PyTorch loop (both domains),
``torch.compile`` of that loop, and Liger-Kernel's mHC Sinkhorn (probability domain, float32).

Grid axes B (matrices), n, iters, domain (log, prob) and dtype; logits ~ N(0, 1), fixed seed. The naive loop is
the family's definition written out (float32 math for reduced-precision inputs, output cast back); its float64
run is the accuracy reference. Liger-Kernel 0.8.5 computes Sinkhorn only inside its mHC coefficients: we call
``liger_kernel.ops.mhc.mhc_split_sinkhorn_fwd`` with alpha = 1 and bias = 0, so its residual matrix ``h_res`` is
exactly ``sinkhorn(x, iters, domain="prob", eps)`` (x laid out as the last n*n columns of its ``mix`` input,
untimed), and ``mhc_sinkhorn_bwd`` (its recompute path, no history) for the gradient. Its pre/post coefficients
(2n values per matrix) are computed and written too: that is part of its only entry point.
"""
from __future__ import annotations

from typing import Optional

import torch

from benchmarks.adapters import Adapter, Axis, Impl, Prepared, Target, dtype_of, importable, needs_cuda
from benchmarks.adapters.sinkhorn.checks import CHECKS

ANCHOR_SIZES = ((32, 4), (4096, 4), (262144, 4), (262144, 8), (1048576, 4), (65536, 16))
ANCHORS = tuple({"B": B, "n": n, "iters": 20, "domain": d, "dtype": "float32"}
                for B, n in ANCHOR_SIZES for d in ("log", "prob"))
EPS = 1e-6
HEADLINE = {"B": 262144, "n": 4, "iters": 20, "dtype": "float32"}
TARGETS = tuple(target for domain in ("log", "prob") for target in (
    Target(f"{domain}: forward >= 50% of the copy floor at B=262144, n=4", {**HEADLINE, "domain": domain},
           ("forward",), "floor_fraction", 0.5),
    Target(f"{domain}: forward+backward >= 35% of its floor at B=262144, n=4", {**HEADLINE, "domain": domain},
           ("both",), "floor_fraction", 0.35),
    Target(f"{domain}: forward+backward >= 20x the naive loop at B=262144, n=4", {**HEADLINE, "domain": domain},
           ("both",), "speedup:naive", 20.0))) + (
    Target("faster than Liger wherever it runs (prob, float32)", {"domain": "prob", "dtype": "float32"},
           ("forward", "both"), "speedup:liger", 1.0),)
REFERENCE_MAX_ELEMENTS = 2**24  # the float64 autograd loop keeps 2*iters copies of x


def domain_name(value: str) -> str:
    if value not in ("log", "prob"):
        raise ValueError(f"domain must be log or prob, got {value!r}")
    return value


def build(config: dict, device: torch.device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(config["B"], config["n"], config["n"], generator=g)
    return x.to(device=device, dtype=dtype_of(config["dtype"]))


def naive(x: torch.Tensor, iters: int, domain: str, eps: float = EPS) -> torch.Tensor:
    """The family's definition as a plain PyTorch loop (float32 math below float32, float64 for float64)."""
    w = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    if domain == "log":
        w = w.clamp_min(-1e5)
        for _ in range(iters):
            w = w - torch.logsumexp(w, dim=-1, keepdim=True)
            w = w - torch.logsumexp(w, dim=-2, keepdim=True)
        out = w.exp()
    else:
        p = torch.softmax(w, dim=-1) + eps
        p = p / (p.sum(dim=-2, keepdim=True) + eps)
        for _ in range(iters - 1):
            p = p / (p.sum(dim=-1, keepdim=True) + eps)
            p = p / (p.sum(dim=-2, keepdim=True) + eps)
        out = p
    return out.to(x.dtype)


_COMPILED: dict = {}


def prepare_naive(x: torch.Tensor, config: dict) -> Prepared:
    return Prepared(lambda t: naive(t, config["iters"], config["domain"]), (x,), (0,))


def prepare_compiled(x: torch.Tensor, config: dict) -> Prepared:
    """``torch.compile(naive, dynamic=True)``, one compiled function per run (shapes symbolic: compiled once per
    domain and dtype, not per B and n; the first call's time, compilation included, is ``first_call_s``)."""
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(naive, dynamic=True)
    fn = _COMPILED["fn"]
    return Prepared(lambda t: fn(t, config["iters"], config["domain"]), (x,), (0,))


def prepare_ours(x: torch.Tensor, config: dict) -> Prepared:
    from provable_kernels.sinkhorn import sinkhorn

    return Prepared(lambda t: sinkhorn(t, iters=config["iters"], domain=config["domain"], eps=EPS), (x,), (0,))


class _LigerSinkhorn(torch.autograd.Function):
    """Liger's mHC Sinkhorn on ``mix`` (built from x, untimed); the gradient of x is its recompute backward."""

    @staticmethod
    def forward(ctx, x, mix, bias, ones, iters):
        from liger_kernel.ops.mhc import mhc_split_sinkhorn_fwd

        _, _, h_res = mhc_split_sinkhorn_fwd(mix, bias, ones, ones, ones, tmax=iters, pre_eps=0.0,
                                              sinkhorn_eps=EPS, post_mult=1.0)
        ctx.save_for_backward(mix, bias, ones)
        ctx.iters = iters
        return h_res

    @staticmethod
    def backward(ctx, grad):
        from liger_kernel.ops.mhc import mhc_sinkhorn_bwd

        mix, bias, ones = ctx.saved_tensors
        return mhc_sinkhorn_bwd(mix, bias, ones, grad.contiguous(), tmax=ctx.iters, sinkhorn_eps=EPS), \
            None, None, None, None


def prepare_liger(x: torch.Tensor, config: dict) -> Prepared:
    B, n = x.shape[0], x.shape[-1]
    mix = torch.cat([x.new_zeros(B, 2 * n), x.reshape(B, n * n)], dim=1).contiguous()
    bias = x.new_zeros(n * n + 2 * n)
    ones = x.new_ones(1)
    return Prepared(lambda t: _LigerSinkhorn.apply(t, mix, bias, ones, config["iters"]), (x,), (0,))


def liger_unsupported(config: dict) -> Optional[str]:
    if config["domain"] != "prob":
        return "Liger-Kernel's Sinkhorn is probability-domain only"
    if config["dtype"] != "float32":
        return "Liger-Kernel's mHC kernels take float32 only"
    if config["n"] & (config["n"] - 1):
        return "Liger-Kernel's mHC kernels need n a power of 2"
    return None


def liger_unavailable(device: torch.device) -> Optional[str]:
    return needs_cuda(device) or importable("liger_kernel.ops.mhc")(device)


def reference(x: torch.Tensor, config: dict) -> Optional[Prepared]:
    if x.numel() > REFERENCE_MAX_ELEMENTS:
        return None
    return prepare_naive(x.double(), config)


def floor(config: dict, phase: str) -> tuple[float, int]:
    """x read and output written (forward); x and the upstream gradient read, the input gradient written
    (backward); both: x twice, upstream, output, input gradient. No sequential floor."""
    tensor = config["B"] * config["n"] ** 2 * dtype_of(config["dtype"]).itemsize
    return {"forward": 2, "backward": 3, "both": 5}[phase] * float(tensor), 0


ADAPTER = Adapter(
    name="sinkhorn",
    title="Sinkhorn-Knopp",
    axes=(
        Axis("B", (32, 4096, 262144, 1048576), int, "number of matrices"),
        Axis("n", (4, 8, 16, 32), int, "matrix size (n x n)"),
        Axis("iters", (20,), int, "Sinkhorn iterations"),
        Axis("domain", ("log", "prob"), domain_name, "log or prob"),
        Axis("dtype", ("float32",), str, "float32, bfloat16 or float16"),
    ),
    anchors=ANCHORS,
    variant_axis="domain",
    impls=(
        Impl("ours", prepare_ours, ours=True, unavailable=importable("provable_kernels.sinkhorn")),
        Impl("naive", prepare_naive),
        Impl("compile", prepare_compiled),
        Impl("liger", prepare_liger, unavailable=liger_unavailable, unsupported=liger_unsupported,
             peer_of="liger-kernel"),
    ),
    default_impls=("ours", "naive", "compile", "liger"),
    build=build,
    reference=reference,
    floor=floor,
    derived=lambda c: {"elements": c["B"] * c["n"] ** 2},
    derived_columns=("elements",),
    size_column="B",
    size_unit="matrices",
    plot_axes=("B", "n"),
    order=lambda c: (c["dtype"], c["B"] * c["n"] ** 2, c["n"], c["domain"]),  # cheapest first; caches persist
    packages=("liger-kernel",),
    overhead_shapes=({"B": 4096, "n": 4, "iters": 20, "domain": "prob", "dtype": "float32"},
                     {"B": 100003, "n": 4, "iters": 20, "domain": "prob", "dtype": "float32"}),
    peer="liger",
    notes=("naive: the family's definition as a PyTorch loop; compile: torch.compile(naive, dynamic=True)",
           "liger: mhc_split_sinkhorn_fwd (alpha 1, bias 0) and mhc_sinkhorn_bwd (recompute), prob domain"),
    checks=CHECKS,
    targets=TARGETS,
)
