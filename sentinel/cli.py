"""The ``sentinel`` command line: one subcommand per module in :data:`COMMANDS`.

Each command module exposes ``register(subparsers)`` (adds its argparse subparser) and ``run(args) -> int`` (the
exit code). Before a command runs, the device is resolved (``--device``, default ``auto``) and on the CPU the
Triton interpreter is switched on (``TRITON_INTERPRET=1``) before any kernel module is imported.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Optional, Sequence

from kernel_sentinel.console import plain

COMMANDS = ("kernel_sentinel.verify", "kernel_sentinel.routes", "kernel_sentinel.trace", "kernel_sentinel.gate",
            "kernel_sentinel.mutate", "kernel_sentinel.new", "kernel_sentinel.site_command")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The parser, and the command module behind each subcommand name."""
    parser = argparse.ArgumentParser(prog="sentinel", description="Verify, trace and gate the kernel library.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="command")
    owners: dict[str, ModuleType] = {}
    for name in COMMANDS:
        module = importlib.import_module(name)
        before = set(subparsers.choices)
        module.register(subparsers)
        owners.update({command: module for command in set(subparsers.choices) - before})
    for sub in subparsers.choices.values():  # help is terminal text: the docstrings' markup goes
        sub.add_argument("--family-path", action="append", default=[], metavar="DIR",
                         help="also find families in DIR (each <DIR>/<name>/family.py; repeatable; added to "
                              "SENTINEL_FAMILY_PATH)")
        sub.description = sub.description and plain(sub.description)
        for action in sub._actions:
            action.help = action.help and plain(action.help)
    return parser, owners


def main(argv: Optional[Sequence[str]] = None) -> int:
    from kernel_sentinel import console, device

    parser, owners = build_parser()
    args = parser.parse_args(argv)
    try:
        device.prepare(getattr(args, "device", "auto"))
    except ValueError as exc:
        return console.usage_error(str(exc))
    from kernel_sentinel import registry

    registry.add_to_search_path(args.family_path)
    try:
        registry.search_path()
    except registry.SearchPathError as exc:
        return console.usage_error(str(exc))
    return owners[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
