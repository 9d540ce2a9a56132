"""The guide page "Adding a kernel family" (``traces/guide/adding-a-family.md``) shows what ``sentinel new`` makes:
its code blocks titled with a path are, file for file, the family ``sentinel new l2norm`` writes into a git
repository, which imports nothing of sentinel or hypothesis; its commands include every next step the command
prints. (``tests/test_new_family.py`` runs those steps on a made family.)"""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from kernel_sentinel import new

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "traces" / "guide" / "adding-a-family.md"
BLOCK = re.compile(r'^```python title="([^"]+)"\n(.*?)^```$', re.S | re.M)
SECTION = re.compile(r"^## 3\. The commands\n(.*?)^## ", re.S | re.M)
FENCE = re.compile(r"^```\n(.*?)^```$", re.S | re.M)
NAME = "l2norm"


def guide_files() -> dict[str, str]:
    """The guide's code blocks by the path in their title."""
    return dict(BLOCK.findall(GUIDE.read_text()))


@pytest.fixture
def made(tmp_path: Path) -> Path:
    """A git repository in which ``sentinel new l2norm`` made its family."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert new.scaffold(NAME, tmp_path)
    return tmp_path


def test_the_guide_shows_the_family_sentinel_new_writes(made):
    written = {p.relative_to(made).as_posix(): p.read_text() for p in sorted((made / NAME).glob("*.py"))}
    assert len(written) == 10
    assert guide_files() == written


def test_the_made_family_imports_no_sentinel_or_hypothesis(made):
    imported = set()
    for path in (made / NAME).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported.add(node.module.split(".")[0])
    assert imported & {"kernel_sentinel", "hypothesis"} == set()
    assert "provable_kernels" in imported  # the shared hot path: runtime, launch, alloc, custom_ops


def test_the_guide_lists_every_next_step_sentinel_new_prints(made):
    section = SECTION.search(GUIDE.read_text()).group(1)
    guide = {line.split("#")[0].strip() for block in FENCE.findall(section) for line in block.splitlines()}
    printed = [line.split("#")[0].strip() for line in new.next_steps(NAME, made).splitlines()[2:]]
    assert printed and [step for step in printed if step not in guide] == []
