"""Packaging: the folders ``kernels/`` and ``sentinel/`` install under import names that no well-known
distribution uses (PyPI's ``kernels`` and ``sentinel`` are other projects); the mapping lives in
``sentinel/layout.py``. Everything else is in ``pyproject.toml``."""
import runpy

from setuptools import find_packages, setup

IMPORT_NAMES = runpy.run_path("sentinel/layout.py")["IMPORT_NAMES"]  # folder -> import name

setup(
    package_dir={name: folder for folder, name in IMPORT_NAMES.items()},
    packages=[f"{name}.{sub}" if sub else name
              for folder, name in IMPORT_NAMES.items() for sub in ["", *find_packages(folder)]],
)
