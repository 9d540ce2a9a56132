"""What a family tells the benchmark runner (``benchmarks/runner.py``), which knows nothing family-specific.

Families are discovered by listing this package: every public module or subpackage ``benchmarks/adapters/<family>``
is the adapter of the family ``<family>`` (no list to edit). It defines ``ADAPTER``, an ``Adapter`` with:

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
- ``overhead_shapes`` and ``peer``: what the public-call overhead report and the kernel breakdown measure
  (``benchmarks/overhead.py``);
- ``checks``: the family's GPU checks beyond timing (``Check``, run by ``python -m benchmarks check``);
- ``targets``: the claims its results must meet (``Target``: a floor fraction or a speedup over an implementation,
  at least some value), judged by the analysis (``targets.csv``) and shown on the site.

Adapters import their family lazily (inside ``build`` and the implementations), so that this package and the
analysis work where a family is not installed.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

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


@dataclass(frozen=True)
class Target:
    """A claim about a run: at every configuration matching ``where`` (axis -> value; the other axes any) and each
    phase of ``phases``, ``metric`` of this project's first implementation is at least ``minimum``. Metrics:
    ``floor_fraction`` (floor / time) or ``speedup:<impl>`` (time of <impl> / ours)."""

    name: str
    where: dict
    phases: tuple[str, ...]
    metric: str
    minimum: float

    def __post_init__(self):
        if self.metric != "floor_fraction" and not self.metric.startswith("speedup:"):
            raise ValueError(f"metric must be floor_fraction or speedup:<impl>, got {self.metric!r}")
        if not set(self.phases) <= set(PHASES) or not self.phases:
            raise ValueError(f"phases must be a non-empty subset of {PHASES}, got {self.phases!r}")


class Evidence:
    """The rows of one check, each with its verdict ``ok``: the check passes when it has rows and all are ok."""

    def __init__(self):
        self.rows: list[dict] = []

    def record(self, ok: bool, row: dict) -> None:
        if not isinstance(row, dict):
            raise TypeError(f"row must be a dict, got {type(row).__name__}")
        self.rows.append({**row, "ok": bool(ok)})

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r["ok"] for r in self.rows)


@dataclass(frozen=True)
class Check:
    """A check of a family beyond timing (``python -m benchmarks check``): ``body(evidence, device, budget_s)``
    records rows with their verdicts; ``cpu``: whether it means anything without CUDA (else it is skipped there).
    Its requirement is stated in ``help`` and enforced by the rows' verdicts."""

    name: str
    body: Callable[[Evidence, torch.device, float], None]
    help: str = ""
    cpu: bool = False

    def run(self, device: torch.device, budget_s: float) -> dict:
        """``{"passed", "seconds", "help", "rows"}`` (exceptions propagate: the caller records them)."""
        import time

        evidence, start = Evidence(), time.perf_counter()
        self.body(evidence, torch.device(device), budget_s)
        return {"passed": evidence.passed, "seconds": time.perf_counter() - start, "help": self.help,
                "rows": evidence.rows}


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
    checks: tuple[Check, ...] = ()
    targets: tuple[Target, ...] = ()

    def impl(self, name: str) -> Impl:
        for impl in self.impls:
            if impl.name == name:
                return impl
        raise KeyError(f"{self.name}: no implementation {name!r}; expected one of {[i.name for i in self.impls]}")

    def label(self, config: dict) -> str:
        return ",".join(f"{a.name}={config[a.name]}" for a in self.axes)


def families() -> tuple[str, ...]:
    """Every family with an adapter: the public modules and subpackages of this package, sorted by name."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


def load(family: str) -> Adapter:
    """The adapter of ``family`` (one of ``families()``)."""
    known = families()
    if family not in known:
        raise ValueError(f"family must be one of {known}, got {family!r}")
    adapter = importlib.import_module(f"{__name__}.{family}").ADAPTER
    if adapter.name != family:
        raise ValueError(f"benchmarks/adapters/{family}: ADAPTER.name is {adapter.name!r}, not the module's name")
    return adapter


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
