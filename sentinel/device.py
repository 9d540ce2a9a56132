"""Which device sentinel runs on, which GPUs ``--devices`` spreads a run over, and the Triton interpreter switch
for the CPU.

Triton decides at decoration time (``@triton.jit``) whether kernels run through its interpreter, so
``TRITON_INTERPRET=1`` must be set before any ``provable_kernels.*.triton_*`` module is imported: :func:`prepare` does that
when the device is the CPU, and refuses when such a module was already imported without it.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Sequence

import torch

from provable_kernels.dispatch import interpreter_enabled
from kernel_sentinel import interpreter

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def prepare(name: str) -> torch.device:
    """Resolve ``auto`` (cuda when available, else cpu); on the CPU switch the Triton interpreter on (and
    :func:`kernel_sentinel.interpreter.install` its faster language patching).

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
    if name == "cpu":
        interpreter.install()  # the interpreter's language patching without its per-call member lookups
    return torch.device(name)


def select_gpus(text: str, device: torch.device) -> tuple[int, ...]:
    """The CUDA device indices ``--devices text`` names for a run on ``device``: ``all`` (every visible GPU) or a
    comma-separated list of ``cuda:N``. ``ValueError`` (a usage error) without a GPU, on a CPU run, for ``cpu`` or
    anything else than ``cuda:N`` in the list, a GPU the host does not have, or one named twice."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError("--devices spreads the run over CUDA GPUs: no CUDA device is available")
    if device.type != "cuda":
        raise ValueError(f"--devices spreads the run over CUDA GPUs: drop --device {device.type} (or use cuda)")
    if text.strip() == "all":
        return tuple(range(count))
    gpus = []
    for item in (part.strip() for part in text.split(",")):
        match = re.fullmatch(r"cuda:(\d+)", item)
        if match is None:
            what = "the CPU" if item.startswith("cpu") else repr(item)
            raise ValueError(f"--devices lists {what}: give all, or CUDA GPUs as cuda:N separated by commas "
                             f"(e.g. cuda:0,cuda:1)")
        gpu = int(match.group(1))
        if gpu >= count:
            raise ValueError(f"--devices lists {item}: this host has {count} GPU{'s' * (count != 1)} "
                             f"(cuda:0 to cuda:{count - 1})")
        if gpu in gpus:
            raise ValueError(f"--devices lists {item} twice")
        gpus.append(gpu)
    return tuple(gpus)


def visible_id(gpu: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that shows a child process only GPU ``gpu`` of this process (whose own
    ``CUDA_VISIBLE_DEVICES``, when set, renumbers the GPUs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[gpu].strip() if visible else str(gpu)


def info(device: torch.device, gpus: Sequence[int] = ()) -> dict[str, object]:
    """What a run on ``device`` ran on, for reports and records: ``{"type": "cpu", "name": "CPU (Triton
    interpreter)"}``, or on CUDA ``{"type": "cuda", "name", "gpus"}``: the model of each GPU of ``gpus`` (empty:
    the current GPU), in order, and ``name`` the distinct models joined by `` + `` (one model: its name, so that
    a run on four H100s is an H100 record)."""
    if device.type != "cuda":
        return {"type": "cpu", "name": "CPU (Triton interpreter)"}
    names = [torch.cuda.get_device_name(gpu) for gpu in (gpus or [torch.cuda.current_device()])]
    return {"type": "cuda", "name": " + ".join(dict.fromkeys(names)), "gpus": names}
