"""Which device sentinel runs on, and the Triton interpreter switch for the CPU.

Triton decides at decoration time (``@triton.jit``) whether kernels run through its interpreter, so
``TRITON_INTERPRET=1`` must be set before any ``provable_kernels.*.triton_*`` module is imported: :func:`prepare` does that
when the device is the CPU, and refuses when such a module was already imported without it.
"""
from __future__ import annotations

import os
import sys

import torch

from provable_kernels.dispatch import interpreter_enabled

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def prepare(name: str) -> torch.device:
    """Resolve ``auto`` (cuda when available, else cpu); on the CPU switch the Triton interpreter on.

    Raises ``ValueError`` when cuda is asked for but absent, or when Triton kernel modules were imported before
    the interpreter could be switched on (they would not run on CPU tensors).
    """
    if name not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {list(DEVICE_CHOICES)}, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if name == "cpu" and not interpreter_enabled():
        early = sorted(m for m in sys.modules if m.startswith("provable_kernels.") and ".triton_" in m)
        if early:
            raise ValueError(f"Triton kernel modules {early} were imported before TRITON_INTERPRET=1 was set; "
                             "run sentinel in a fresh process or set TRITON_INTERPRET=1 first")
        os.environ["TRITON_INTERPRET"] = "1"
    return torch.device(name)


def info(device: torch.device) -> dict[str, str]:
    """``{"type": "cuda"|"cpu", "name": <GPU name or "CPU (Triton interpreter)">}``."""
    if device.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(device)}
    return {"type": "cpu", "name": "CPU (Triton interpreter)"}
