"""What a family tells the benchmark runner (``benchmarks/runner.py``), which knows nothing family-specific.

A family's adapter module (``benchmarks/adapters/<family>.py``) defines ``ADAPTER``, an ``Adapter`` with:

- the grid: ``axes`` (name, default values, parser) and ``anchors``, the configurations run when no axis is given
  on the command line (the shapes the family's targets name); a configuration is a dict axis -> value;
- ``variant_axis``: the axis holding semirings, domains or reductions (its first default is the reference
  variant of the overhead table);
- implementations (``Impl``): this project's routes and the peers, each preparing its own inputs from the
  family's problem (untimed) and returning the output in the family's convention;
- ``build`` (inputs for one configuration), ``shrink`` (a smaller problem for warm-up and cost estimates),
  ``reference`` (a float64 implementation for accuracy, where affordable);
- ``floor(config, phase)``: bytes moved and sequential steps of the hardware floor;
- ``derived(config)``: extra columns (sizes the analysis plots against), ``size_column`` the work count that
  throughput divides by, ``plot_axes`` the x axes of the analysis plots;
- ``order(config)``: configurations sharing compiled kernels sort next to each other, cheapest first;
- ``overhead_shapes`` and ``peer``: what the public-call overhead report measures (``benchmarks/overhead.py``).

Adapters import their family lazily (inside ``build`` and the implementations), so that this package and the
analysis work where a family is not installed.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

FAMILIES = ("semicrf", "sinkhorn", "segment")
PHASES = ("forward", "backward", "both")


@dataclass(frozen=True)
class Axis:
    """One grid axis: ``parse`` turns a command-line value into the axis type."""

    name: str
    default: tuple
    parse: Callable[[str], Any] = int
    help: str = ""


@dataclass
class Prepared:
    """An implementation ready to call: ``call(*args)`` returns the family's output; the gradients of the args at
    ``differentiable`` are what backward computes, and ``pullback`` maps them to gradients of the family's own
    inputs (None: they already are)."""

    call: Callable[..., torch.Tensor]
    args: tuple
    differentiable: tuple[int, ...] = ()
    pullback: Optional[Callable[[tuple], tuple]] = None


@dataclass(frozen=True)
class Impl:
    """A benchmarked implementation. ``prepare(problem, config)`` -> Prepared (untimed: input mapping, layouts);
    ``unavailable(device)``, ``unsupported(config)`` and ``no_gradient(config)`` (backward phases only) say why it
    cannot run (None: it can);
    ``memory_bytes(config)`` estimates its peak where that can be hopeless (None: no estimate)."""

    name: str
    prepare: Callable[[Any, dict], Prepared]
    ours: bool = False
    unavailable: Callable[[torch.device], Optional[str]] = lambda device: None
    unsupported: Callable[[dict], Optional[str]] = lambda config: None
    no_gradient: Callable[[dict], Optional[str]] = lambda config: None  # why backward cannot run, else None
    memory_bytes: Optional[Callable[[dict], float]] = None
    peer_of: str = ""  # the distribution (versions are recorded in the header)


@dataclass
class Adapter:
    name: str
    title: str
    axes: tuple[Axis, ...]
    anchors: tuple[dict, ...]
    variant_axis: str
    impls: tuple[Impl, ...]
    default_impls: tuple[str, ...]
    build: Callable[[dict, torch.device, int], Any]
    floor: Callable[[dict, str], tuple[float, int]]
    derived: Callable[[dict], dict]
    derived_columns: tuple[str, ...]
    size_column: str
    size_unit: str
    plot_axes: tuple[str, ...]
    order: Callable[[dict], tuple]
    reference: Callable[[Any, dict], Optional[Prepared]]
    shrink: Optional[Callable[[Any, dict], tuple[Any, float]]] = None
    memory_column: str = ""  # the count memory is divided by in the analysis (default: size_column)
    packages: tuple[str, ...] = ()
    phases: tuple[str, ...] = PHASES
    # the overhead report (benchmarks/overhead.py): a launch-bound configuration, then the headline one, and the
    # implementation whose public call ours is compared with
    overhead_shapes: tuple[dict, ...] = ()
    peer: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def impl(self, name: str) -> Impl:
        for impl in self.impls:
            if impl.name == name:
                return impl
        raise KeyError(f"{self.name}: no implementation {name!r}; expected one of {[i.name for i in self.impls]}")

    def label(self, config: dict) -> str:
        return ",".join(f"{a.name}={config[a.name]}" for a in self.axes)


def load(family: str) -> Adapter:
    """The adapter of ``family`` (one of FAMILIES)."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return importlib.import_module(f"benchmarks.adapters.{family}").ADAPTER


def needs_cuda(device: torch.device) -> Optional[str]:
    """For peers whose kernels run only on CUDA."""
    return None if device.type == "cuda" else "runs on CUDA only"


def importable(module: str) -> Callable[[torch.device], Optional[str]]:
    """An ``unavailable`` check: why ``module`` cannot be imported, or None."""
    def check(device: torch.device) -> Optional[str]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"{module} not importable ({exc}); pip install -e '.[bench]'"
        return None
    return check


def dtype_of(name: str) -> torch.dtype:
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
              "float64": torch.float64}
    if name not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]
