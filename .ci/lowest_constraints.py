#!/usr/bin/env python3
"""Print pip constraints that pin every ``name>=X`` requirement of ``pyproject.toml`` (the dependencies and the
``test`` and ``docs`` extras) to ``name==X``: the lowest versions the project declares, which CI installs in a
second fresh environment. Requirements without a lower bound are left to pip (the newest that fits)."""
import re
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
requirements = project["dependencies"] + project["optional-dependencies"]["test"] + \
    project["optional-dependencies"]["docs"]
for requirement in requirements:
    found = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)", requirement.strip())
    if found:
        print(f"{found[1]}=={found[2]}")
