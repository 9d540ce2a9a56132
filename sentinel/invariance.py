"""The ``batch`` check: an item's outputs and gradients do not depend on the rest of its batch.

A family declares what an item is (:class:`~kernel_sentinel.family.BatchItems`: a sequence of a semi-CRF batch, a
matrix of a Sinkhorn batch, a segment of a segment reduction) by how to split a case into items, join items into
a case and split a joined case's outputs per item. From the route's ``tiny`` case (``small`` when no item of it
takes the route alone, e.g. on a route for long rows) the check takes the last item that takes the route alone,
and :data:`NEIGHBOURS` other items from the route's cases of other seeds (other random values, other lengths). It
runs the item alone and at :data:`POSITIONS` (first, middle, last) of a batch of the item and its neighbours, each
neighbour with its own random upstream weights; the item's outputs and gradients must be bitwise those of the
item alone. Outputs that are sums over the items (gradients of shared parameters, ``BatchItems.summed``) are
compared in one more run at the middle position with the neighbours' upstream weights zero, so that the sum is
the item's own term.

Every run must take the route (a batch that the dispatcher sends elsewhere fails the check). What it cannot see:
neighbours unlike the family's random cases (e.g. inputs that switch a packed block to another algorithm), and
batch sizes far from the few items used here (a plan that changes with the total size only at thousands of rows
or matrices).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from kernel_sentinel.checks import RouteMismatch, run_route
from kernel_sentinel.family import BatchItems, Case, Family, Outputs, matches
from kernel_sentinel.generic import Verdict, differences, fresh_case

NEIGHBOURS = 3  # other items in each batch
POSITIONS = {"first": 0, "middle": (NEIGHBOURS + 1) // 2, "last": NEIGHBOURS}
SIZES = ("tiny", "small")  # the case sizes tried, in order, for an item that takes the route alone


def items_of(family: Family, route_id: str) -> Optional[BatchItems]:
    """The first of ``family.batch_items`` that applies to ``route_id`` (None when none does)."""
    return next((b for b in family.batch_items if matches(route_id, b.routes)), None)


def _silenced(case: Case) -> Case:
    """``case`` with every upstream weight zero (its outputs still computed, its gradient terms zero)."""
    return dataclasses.replace(case, upstream={n: torch.zeros_like(w) for n, w in case.upstream.items()})


def member_outputs(items: BatchItems, case: Case, got: Outputs, position: int) -> Outputs:
    """The outputs of the item at ``position`` of the joined ``case`` (``got``: its outputs): its slice of each
    per-item output, and the summed outputs whole. ``ValueError`` names an output that is neither."""
    per_item = items.outputs(case, {n: x for n, x in got.items() if n not in items.summed})[position]
    undeclared = [n for n in got if n not in items.summed and n not in per_item]
    if undeclared:
        raise ValueError(f"outputs neither split per item nor declared summed (BatchItems): {', '.join(undeclared)}")
    return {**per_item, **{n: x for n, x in got.items() if n in items.summed}}


def _run(family: Family, items: BatchItems, base: Case, members: Sequence[Case], position: int) -> Outputs:
    """The outputs of ``members[position]`` in a run of ``members`` joined (it must take the route)."""
    case = items.join(base, members)
    return member_outputs(items, case, run_route(family.run, fresh_case(case)), position)


def _item_alone(family: Family, items: BatchItems, base: Case) -> tuple[Case, Outputs]:
    """The last item of ``base`` that takes the route alone, and its outputs."""
    mismatches = []
    for item in reversed(items.split(base)):
        try:
            return item, _run(family, items, base, [item], 0)
        except RouteMismatch as exc:
            mismatches.append(str(exc))
    raise RouteMismatch(f"no item of the case takes the route alone: {'; '.join(mismatches)}")


def _neighbours(family: Family, items: BatchItems, route_id: str, size: str, dtype: torch.dtype,
                device: torch.device, seed: int) -> list[Case]:
    """:data:`NEIGHBOURS` items from the route's cases of ``size`` and seeds ``seed + 1``, ``seed + 2``, ..."""
    found: list[Case] = []
    for k in range(1, NEIGHBOURS + 1):
        found += items.split(family.make_case(route_id, size=size, dtype=dtype, device=device, seed=seed + k))
        if len(found) >= NEIGHBOURS:
            return found[:NEIGHBOURS]
    raise ValueError(f"the route's cases hold fewer than {NEIGHBOURS} items over {NEIGHBOURS} seeds")


def batch_invariance(family: Family, route_id: str, *, dtype: torch.dtype, device: torch.device,
                     seed: int) -> Verdict:
    """The ``batch`` verdict of ``route_id`` at ``dtype`` on ``device`` (module docstring)."""
    if not isinstance(family, Family):
        raise TypeError(f"family must be a Family, got {type(family).__name__}")
    items = items_of(family, route_id)
    if items is None:
        return Verdict(("no BatchItems declared for this route (Family.batch_items)",), "nothing was compared")
    mismatches = []
    for size in SIZES:
        base = family.make_case(route_id, size=size, dtype=dtype, device=device, seed=seed)
        try:
            item, alone = _item_alone(family, items, base)
            break
        except RouteMismatch as exc:
            mismatches.append(f"{size}: {exc}")
    else:
        return Verdict(tuple(mismatches), "nothing was compared")
    neighbours = _neighbours(family, items, route_id, size, dtype, device, seed)
    per_item = [n for n in alone if n not in items.summed]
    summed = [n for n in alone if n in items.summed]
    runs = [(f"{where} of {NEIGHBOURS + 1}", position, neighbours, per_item) for where, position in POSITIONS.items()]
    if summed:
        runs.append((f"middle of {NEIGHBOURS + 1}, the neighbours' upstream weights zero", POSITIONS["middle"],
                     [_silenced(n) for n in neighbours], list(alone)))
    problems = []
    for where, position, others, names in runs:
        got = _run(family, items, base, [*others[:position], item, *others[position:]], position)
        problems += [f"{where}: {line}" for line in differences({n: got[n] for n in names if n in got},
                                                                {n: alone[n] for n in names})]
    checked = ", ".join(per_item) + (f"; summed over the items: {', '.join(summed)}" if summed else "")
    return Verdict(tuple(problems), f"{items.what} alone ({size} case) vs first, middle and last of "
                                    f"{NEIGHBOURS + 1} with other random items: bitwise equal ({checked})")
