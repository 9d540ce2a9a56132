"""Every public entry point is a verified route: the head's and the exact backend's trees, a family with several
trees in sentinel (routes, trace groups, recording), and bugs planted in the head's loss and in a Triton kernel's
per-sequence offset that ``sentinel verify`` must catch, naming the route and the check."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from provable_kernels.dispatch import recording
from provable_kernels.semicrf import head as head_module
from provable_kernels.semicrf.exact import EXACT_TREE
from provable_kernels.semicrf.head import HEAD_TREE
from kernel_sentinel import registry, trace
from kernel_sentinel.family import REPO_ROOT
from kernel_sentinel.layout import import_root
from kernel_sentinel.routes import family_routes
from kernel_sentinel.rows import Options, verify_route
from kernel_sentinel.verify import select_routes

SEMICRF = registry.family("semicrf")  # the registry is the only importer of family.py


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
QUICK = Options(device=DEVICE, seed=0, examples=1, quick=True)
HEAD_AND_EXACT = [r.id for tree in (HEAD_TREE, EXACT_TREE) for r in tree.routes()]


def test_head_and_exact_trees_are_routes_of_the_family():
    assert SEMICRF.trees == (SEMICRF.tree, HEAD_TREE, EXACT_TREE)
    ids = [r["id"] for r in family_routes(SEMICRF)["routes"]]
    assert ids[-len(HEAD_AND_EXACT):] == HEAD_AND_EXACT
    assert {"semicrf.head.streaming.loss", "semicrf.head.exact.entropy", "semicrf.head.decode",
            "semicrf.exact.kl_divergence", "semicrf.exact.marginals.max"} <= set(ids)
    assert [f for f, _ in select_routes([SEMICRF], ["semicrf.head.*"])] == [SEMICRF] * len(HEAD_TREE.routes())
    slugs = [g.slug for g in trace.family_groups(SEMICRF)]
    assert len(slugs) == len(set(slugs)) and "semimarkovcrfhead-forward-exact" in slugs
    overview = trace.mermaid(trace.Group((), trace.family_tree(SEMICRF).root))
    assert '{"entry point"}' in overview and "|\"SemiMarkovCRFHead\"|" in overview
    assert all(f'(["{route_id}"])' in overview for route_id in ids)


def test_a_route_calling_another_entry_point_records_both_unless_nested_is_off():
    head = head_module.SemiMarkovCRFHead(2, 2, use_triton=False).double()
    hidden, lengths = torch.randn(2, 3, 2, dtype=torch.float64), torch.tensor([3, 2])
    with recording() as every, recording(nested=False) as outer:
        head(hidden, lengths, semiring="entropy")
    assert every == ["semicrf.head.exact.entropy", "semicrf.exact.entropy"]
    assert outer == ["semicrf.head.exact.entropy"]


def test_auto_backend_takes_exact_for_other_semirings_and_refuses_above_the_budget():
    head = head_module.SemiMarkovCRFHead(2, 2, use_triton=False, exact_max_bytes=64).double()
    hidden, lengths = torch.randn(1, 3, 2, dtype=torch.float64), torch.tensor([3])
    with recording(nested=False) as taken:
        head(hidden, lengths)
    assert taken == ["semicrf.head.streaming.log"]
    with pytest.raises(ValueError, match="^exact_max_bytes = 64 is below the 384-byte edge tensor"):  # 2*1*3*2*2*2*8
        head(hidden, lengths, semiring="kmax:2")


@pytest.mark.slow  # CI runs the README's verify command, every route of every family at every dtype, beside it
@pytest.mark.parametrize("route_id", HEAD_AND_EXACT)
def test_head_and_exact_routes_pass_quick(route_id):
    result = verify_route(SEMICRF, route_id, QUICK, dtype=torch.float64)
    assert result.passed, [c.detail for c in result.checks if not c.passed]


def plant_in_module(monkeypatch: pytest.MonkeyPatch, module, old: str, new: str) -> None:
    """Execute ``module``'s source with ``old`` (found once) replaced by ``new`` and put every resulting name into
    the module for this test (monkeypatch restores them): code that looks the names up there runs the mutant."""
    source = Path(module.__file__).read_text()
    assert source.count(old) == 1, f"mutation target {old!r} not found once in {module.__file__}"
    namespace: dict = {"__name__": module.__name__}
    exec(compile(source.replace(old, new), module.__file__, "exec"), namespace)
    for name, value in namespace.items():
        if not name.startswith("__"):
            monkeypatch.setattr(module, name, value, raising=False)


def test_sign_flip_in_the_head_loss_fails_the_loss_route(monkeypatch):
    """The head's methods dispatch on the module's HEAD_TREE: the planted module's tree holds the mutant loss."""
    plant_in_module(monkeypatch, head_module, "return streaming_partition(call) - call.gold",
                    "return call.gold - streaming_partition(call)")
    options = dataclasses.replace(QUICK, quick=False, examples=2)
    broken = verify_route(SEMICRF, "semicrf.head.streaming.loss", options, dtype=torch.float64)
    failed = {c.name for c in broken.checks if not c.passed}
    assert {"reference", "exact", "properties"} <= failed, [c.detail for c in broken.checks]
    assert "value" in broken.check("reference").detail
    assert verify_route(SEMICRF, "semicrf.head.exact.loss", options, dtype=torch.float64).passed


def scratch_repository(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of ``kernels/`` and ``sentinel/`` importable under the installed names, and the environment that
    imports it (Triton interpreter on)."""
    repo = tmp_path / "repo"
    for folder in ("kernels", "sentinel", "tests"):  # tests: the invariants' tests must exist
        shutil.copytree(REPO_ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(import_root(repo, tmp_path / "import")), "TRITON_INTERPRET": "1"}
    return repo, env


@pytest.mark.skipif(torch.cuda.is_available(), reason="plants the bug in the interpreted Triton code (CPU)")
@pytest.mark.slow  # a planted kernel bug verified in a scratch copy: ~1 min
def test_alpha_offset_of_the_later_sequences_fails_the_triton_training_route(tmp_path):
    """Off by one row in where the training forward keeps alpha for the backward kernel, for sequences b >= 1 (row
    t of sequence b lands where the backward reads row t - b): sequence 0 is untouched, so only a check with a
    second sequence (the small case: lengths 20, 13, 1) shows it."""
    repo, env = scratch_repository(tmp_path)
    kernel = repo / "kernels" / "semicrf" / "triton_forward.py"
    source = kernel.read_text()
    old = "alpha_a += b * (T + 1) * C"
    assert source.count(old) == 1
    kernel.write_text(source.replace(old, "alpha_a += b * T * C"))
    done = subprocess.run([sys.executable, "-m", "kernel_sentinel.cli", "verify", "--family", "semicrf", "--route",
                           "semicrf.triton.log.train", "--dtype", "float64", "--examples", "1", "--device", "cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    failures = [line for line in done.stdout.splitlines() if line.startswith("FAIL semicrf.triton.log.train")]
    assert any("reference" in line and "float64" in line for line in failures), done.stdout
