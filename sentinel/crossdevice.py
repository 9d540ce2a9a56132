"""The ``devices`` check: a route gives the same results with its inputs on another GPU than the current one, and
refuses inputs split across two GPUs. Generic: from sentinel, with no family code.

Multi-GPU training puts tensors on ``cuda:1``, ``cuda:2`` and so on while the current device (what
``torch.cuda.current_device()`` says, where a Triton launch runs unless the library enters the inputs' device)
often stays ``cuda:0``. On a host with two or more GPUs the check takes the route's case on the current GPU
(*home*, the baseline of :class:`~kernel_sentinel.generic.Probe`) and another GPU (*other*: the next one of the
run's ``--devices`` list when it lists several, else the next visible GPU), and:

- **moved**: runs the case with every tensor argument, tensor in a tuple or list argument, module argument and
  upstream weight copied to *other* (leaves requiring grad like the originals), *home* staying current. Every
  output and gradient must lie on *other* and be bitwise the home run's. Every Triton launch must find the device
  of its tensor arguments current as it reaches :meth:`provable_kernels.launch.Launcher.launch` or a
  :class:`~provable_kernels.launch.Bound` launch (where the check looks: the library enters the inputs' device
  above them, in its host path): a launch that does not fails the check, naming the kernel, and is made
  with that device entered (so a wrong launch cannot read another GPU's memory and take the verifying process's
  CUDA context down with it); one whose tensor arguments lie on several devices is not made at all.
- **split**: for each tensor argument in turn (each tensor of a tuple or list argument too), runs the case with
  that argument alone on *other*: the call must raise a ``ValueError``/``TypeError`` whose message starts with
  the name of one of the case's tensor arguments (the one moved, or the one the entry point compares it with),
  before any launch. A case with one tensor argument has nothing to split.

Below two GPUs (or on the CPU) the check passes as :data:`~kernel_sentinel.records.NOT_APPLICABLE` with the GPU
count: the gate and the site show such a record as holding no cross-device evidence
(:func:`kernel_sentinel.records.cross_device`).

Every device operation goes through a :class:`Placement` (CUDA's by default), so that tests stand CPU tensors in
for two GPUs and plant the bugs the check is written for.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any, ContextManager, Iterator, Optional, Sequence, Union

import torch

from provable_kernels.validate import value_checks
from kernel_sentinel.family import Case
from kernel_sentinel.generic import Probe, Verdict, differences, error_text, fresh_case
from kernel_sentinel.checks import kernel_name
from kernel_sentinel.records import NOT_APPLICABLE


class Placement:
    """Where a tensor lies, which device is current, how to enter one and copy a tensor to one: CUDA's."""

    def current(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def entered(self, device: torch.device) -> ContextManager:
        """A context in which ``device`` is current."""
        return torch.cuda.device(device)

    def where(self, x: torch.Tensor) -> torch.device:
        return x.device

    def to(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A copy of ``x`` on ``device`` (always a copy: the case's own tensors stay as they are)."""
        return x.to(device, copy=True)


CUDA = Placement()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def pair(device: torch.device, gpus: Sequence[int] = ()) -> Union[tuple[torch.device, torch.device], str]:
    """``(home, other)`` for a run on ``device`` spread over the GPU indices ``gpus`` (empty: the current GPU
    only): home is the current GPU, other the next of ``gpus`` when it lists several, else the next visible GPU;
    or the not-applicable verdict's summary when there is no second GPU."""
    if device.type != "cuda":
        return f"{NOT_APPLICABLE}a {device.type.upper()} run (no second device)"
    count = torch.cuda.device_count()
    if count < 2:
        return f"{NOT_APPLICABLE}{_plural(count, 'GPU')}"
    home = torch.cuda.current_device()
    ring = [g for g in (gpus if len(gpus) >= 2 else range(count)) if g != home]
    other = min(ring, key=lambda g: (g - home) % count)
    return torch.device("cuda", home), torch.device("cuda", other)


# ----------------------------------------------------------------------------------------------- moving cases


def _moved(value: Any, device: torch.device, placement: Placement) -> Any:
    """``value`` with every tensor (also inside tuples and lists) copied to ``device`` (leaves requiring grad like
    the originals) and every module deep-copied there; other values as they are."""
    if isinstance(value, torch.Tensor):
        moved = placement.to(value.detach(), device)
        return moved.requires_grad_(True) if value.requires_grad else moved
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(v, device, placement) for v in value)
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).to(device)
    return value


def moved_case(case: Case, device: torch.device, placement: Placement = CUDA) -> Case:
    """``case`` with every argument and upstream weight on ``device`` (see :func:`_moved`)."""
    return dataclasses.replace(
        case, kwargs={name: _moved(value, device, placement) for name, value in case.kwargs.items()},
        upstream={name: _moved(w, device, placement) for name, w in case.upstream.items()}, device=device,
        description=f"{case.description}; every input on {device}")


def tensor_arguments(case: Case) -> list[tuple[str, tuple[int, ...]]]:
    """``(argument name, index path)`` of every tensor argument of ``case``: ``()`` for a tensor, ``(i,)`` for
    the i-th tensor of a tuple or list argument."""
    found = []
    for name, value in case.kwargs.items():
        if isinstance(value, torch.Tensor):
            found.append((name, ()))
        elif isinstance(value, (tuple, list)):
            found += [(name, (i,)) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return found


def label(name: str, path: tuple[int, ...]) -> str:
    """``edge[1]`` for the second tensor of argument ``edge``, ``x`` for a tensor argument ``x``."""
    return name + "".join(f"[{i}]" for i in path)


def split_case(case: Case, name: str, path: tuple[int, ...], device: torch.device,
               placement: Placement = CUDA) -> Case:
    """A fresh copy of ``case`` with only the tensor argument ``name`` (or its element ``path``) on ``device``."""
    base = fresh_case(case)
    value = base.kwargs[name]
    if path:
        items = list(value)
        items[path[0]] = _moved(items[path[0]], device, placement)
        value = type(value)(items)
    else:
        value = _moved(value, device, placement)
    return base.with_kwargs(f"{case.description}; only {label(name, path)} on {device}", **{name: value})


# ------------------------------------------------------------------------------------------------- launches


@contextlib.contextmanager
def launch_devices(placement: Placement = CUDA) -> Iterator[list[str]]:
    """Check every Triton launch of the library inside the block: its tensor arguments must lie on the current
    device. Yields the problems found, one line per kernel and placement. A launch that finds another device
    current is made with its arguments' device entered; one whose arguments lie on several devices is not made."""
    from provable_kernels.launch import Bound, Launcher  # here: it imports Triton, after the interpreter switch

    problems: list[str] = []
    launch, call = Launcher.launch, Bound.__call__

    def target(kernel: Any, args: tuple) -> Optional[torch.device]:
        """The device to launch ``kernel`` on, or None not to launch it."""
        current = placement.current()
        places = list(dict.fromkeys(placement.where(a) for a in args if isinstance(a, torch.Tensor)))
        if places in ([], [current]):
            return current
        problem = (f"{kernel_name(kernel)} launched with {current} current and its tensor arguments on "
                   f"{', '.join(map(str, places))}")
        if problem not in problems:
            problems.append(problem)
        return places[0] if len(places) == 1 else None

    def checked_launch(self: Any, grid: tuple, args: tuple, opts: Any) -> None:
        device = target(self.kernel, args)
        if device is not None:
            with placement.entered(device):
                launch(self, grid, args, opts)

    def checked_call(self: Any, *tensors: Any) -> None:
        device = target(self.launcher.kernel, (*tensors, *self.tail))
        if device is not None:
            with placement.entered(device):
                call(self, *tensors)

    Launcher.launch, Bound.__call__ = checked_launch, checked_call
    try:
        yield problems
    finally:
        Launcher.launch, Bound.__call__ = launch, call


# ------------------------------------------------------------------------------------------------- verdicts


def _moved_problems(probe: Probe, home: torch.device, other: torch.device, placement: Placement) -> tuple[
        list[str], int]:
    """The problems of the moved run (module docstring) and how many outputs and gradients it compared."""
    _, _, want = probe.baseline()
    what = f"every input on {other}, {home} current"
    problems, got = [], None
    with placement.entered(home), launch_devices(placement) as launches:
        try:
            got = probe.run(moved_case(probe.case, other, placement))
        except Exception as exc:
            problems.append(f"{what}: raised {error_text(exc)}")
    problems += [f"{what}: {line}" for line in launches]
    if got is not None:
        problems += [f"{what}: {name} lies on {placement.where(x)}" for name, x in got.items()
                     if placement.where(x) != other]
        problems += [f"{what}: {line} (vs every input on {home})" for line in differences(got, want)]
    return problems, len(want)


def _split_problems(probe: Probe, home: torch.device, other: torch.device, placement: Placement) -> tuple[
        list[str], int, int]:
    """The problems of the split runs (module docstring), how many there were and how many were rejected as they
    must be."""
    arguments = tensor_arguments(probe.case)
    if len(arguments) < 2:
        return [], 0, 0
    names = tuple(dict.fromkeys(name for name, _ in arguments))
    problems: list[str] = []
    rejected = 0
    for name, path in arguments:
        before = len(problems)
        what = f"only {label(name, path)} on {other}, the rest on {home}"
        case = split_case(probe.case, name, path, other, placement)
        with placement.entered(home), launch_devices(placement) as launches, value_checks("sync"):
            try:
                probe.family.run(case)
            except (ValueError, TypeError) as exc:
                if not str(exc).startswith(names):
                    problems.append(f"{what}: the error names no argument: {error_text(exc)}")
            except Exception as exc:
                problems.append(f"{what}: raised {error_text(exc)}, expected a ValueError or TypeError naming "
                                f"the argument")
            else:
                problems.append(f"{what}: accepted")
        problems += [f"{what}: {line}" for line in launches]
        rejected += len(problems) == before
    return problems, len(arguments), rejected


def verdict(probe: Probe, home: torch.device, other: torch.device, placement: Placement = CUDA) -> Verdict:
    """The check of ``probe``'s case (built on ``home``, the current device) against ``other``."""
    moved, compared = _moved_problems(probe, home, other, placement)
    split, splits, rejected = _split_problems(probe, home, other, placement)
    summary = (f"every input on another GPU than the current one: {compared} outputs and gradients there, bitwise "
               f"the current GPU's, every launch on its inputs' GPU; "
               + (f"{rejected}/{splits} inputs alone on another GPU rejected with an error naming an argument"
                  if splits else "one tensor argument: nothing to split"))
    return Verdict(tuple(moved + split), summary)


def check(probe: Probe, device: torch.device, gpus: Sequence[int] = ()) -> Verdict:
    """The ``devices`` check of a run on ``device`` spread over ``gpus`` (:func:`pair`): not applicable, saying
    why, without a second GPU."""
    found = pair(device, gpus)
    return Verdict((), found) if isinstance(found, str) else verdict(probe, *found)
