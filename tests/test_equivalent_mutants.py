"""Equivalent mutants are shown, not argued (kernel_sentinel.equivalence): every entry of each family's
``equivalent_mutants.json`` is planted in a scratch copy and the family's cases (tiny, small and adversarial, every
dtype, on the routes that reach the line) give bitwise the outputs of the unmutated code. The machinery itself:
a mutant that changes the outputs differs, a kept entry is equivalent, an entry whose lines are gone is stale."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from kernel_sentinel import equivalence, mutate, registry
from kernel_sentinel.family import REPO_ROOT

FAMILIES = ("segment", "semicrf", "sinkhorn")
SINKHORN_TORCH = ("sinkhorn.torch.log.infer", "sinkhorn.torch.prob.infer")


def _entries(name: str) -> list[dict[str, str]]:
    return equivalence.entries(Path(registry.family(name).package.__file__).parent)


@pytest.fixture(scope="module")
def scratch() -> Iterator[mutate.Scratch]:
    copy = mutate.Scratch(REPO_ROOT)
    yield copy
    copy.remove()


@pytest.fixture(scope="module")
def baselines(scratch) -> dict[tuple[str, tuple[str, ...]], equivalence.Baseline]:
    """Baselines by (family, routes), each run once for the module."""
    return {}


def _baseline(scratch, baselines, name: str, routes: tuple[str, ...] = ()) -> equivalence.Baseline:
    if (name, routes) not in baselines:
        baselines[name, routes] = equivalence.baseline(scratch, registry.family(name), routes)
    return baselines[name, routes]


def test_a_mutant_that_changes_outputs_differs_and_a_missing_one_is_stale(scratch, baselines):
    family = registry.family("sinkhorn")
    base = _baseline(scratch, baselines, "sinkhorn", SINKHORN_TORCH)
    file = "kernels/sinkhorn/torch_ops.py"
    flipped = next(m for m in mutate.find_mutants((REPO_ROOT / file).read_text(), file)
                   if "torch.where(d == 0" in m.before and "torch.where(d != 0" in m.after)
    status, detail = equivalence.verdict(scratch, family, base, {"file": file, "before": flipped.before,
                                                                  "after": flipped.after})
    assert status == "differs" and "sinkhorn.torch.prob.infer" in detail, detail
    status, _ = equivalence.verdict(scratch, family, base, {"file": file, "before": "x = 1", "after": "x = 2"})
    assert status == "stale"


def test_a_reviewed_entry_is_equivalent_on_the_routes_it_reaches(scratch, baselines):
    entry = next(e for e in _entries("sinkhorn") if e["before"] == "flag = flag & ~flat")
    base = _baseline(scratch, baselines, "sinkhorn", SINKHORN_TORCH)
    status, detail = equivalence.verdict(scratch, registry.family("sinkhorn"), base, entry)
    assert status == "equivalent" and detail.endswith("cases of 1 routes bitwise equal"), detail  # log domain only


@pytest.mark.slow  # 20-25 minutes for every entry of the three families on two CPU cores
@pytest.mark.parametrize("name, index", [(name, i) for name in FAMILIES for i in range(len(_entries(name)))])
def test_equivalent_mutant_gives_bitwise_the_same_outputs(scratch, baselines, name, index):
    entry = _entries(name)[index]
    status, detail = equivalence.verdict(scratch, registry.family(name), _baseline(scratch, baselines, name), entry)
    assert status == "equivalent", f"{entry['file']}: {entry['before']} --> {entry['after']}: {status}: {detail}"
