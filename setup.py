"""Packaging: the folders ``kernels/`` and ``sentinel/`` install under import names that no well-known
distribution uses (PyPI's ``kernels`` and ``sentinel`` are other projects): ``provable_kernels`` and
``kernel_sentinel``. Everything else lives in ``pyproject.toml``."""
from setuptools import find_packages, setup

IMPORT_NAMES = {"kernels": "provable_kernels", "sentinel": "kernel_sentinel"}  # folder -> import name

setup(
    package_dir={name: folder for folder, name in IMPORT_NAMES.items()},
    packages=[f"{name}.{sub}" if sub else name
              for folder, name in IMPORT_NAMES.items() for sub in ["", *find_packages(folder)]],
)
