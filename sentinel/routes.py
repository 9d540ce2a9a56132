"""``sentinel routes``: print every family's dispatch tree (rich Tree), or its routes as JSON with ``--json``."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.markup import escape
from rich.tree import Tree as RichTree

from kernel_sentinel import console
from kernel_sentinel.family import Family
from kernel_sentinel.trace import locate


def family_routes(family: Family) -> dict[str, Any]:
    """``{"family", "entries": [tree name], "routes": [{"id", "entry", "path": {condition: outcome}, "function",
    "where"}]}``, the routes of every tree of the family in tree order (``entry``: the tree's name)."""
    routes = [{"id": route.id, "entry": tree.name, "path": {cond.name: outcome for cond, outcome in path},
               "function": f"{route.fn.__module__}.{route.fn.__qualname__}", "where": str(locate(route.fn))}
              for tree in family.trees for route, path in tree.paths()]
    return {"family": family.name, "entries": [tree.name for tree in family.trees], "routes": routes}


def rich_tree(family: Family) -> RichTree:
    """The family's decision trees: one branch per tree (its entry point), condition nodes, edges labelled by
    outcome, route leaves with id and source."""
    from provable_kernels.dispatch import Branch

    def add(parent: RichTree, node: Any, label: str) -> None:
        if isinstance(node, Branch):
            branch = parent.add(f"{label}[bold]{escape(node.condition.name)}?[/]")
            for outcome, child in node.children.items():
                add(branch, child, f"[cyan]{escape(outcome)}[/] -> ")
        else:
            parent.add(f"{label}[green]{escape(node.id)}[/]  [dim]{escape(node.fn.__name__)} {locate(node.fn)}[/]")

    top = RichTree(f"[bold magenta]{escape(family.name)}[/] ({len(family.routes())} routes)")
    for tree in family.trees:
        add(top.add(f"[bold]{escape(tree.name)}[/] ({len(tree.routes())} routes)"), tree.root, "")
    return top


def register(subparsers: argparse._SubParsersAction) -> None:
    from kernel_sentinel.cli import COMMANDS

    p = subparsers.add_parser("routes", help=COMMANDS["routes"][1], description=__doc__)
    p.add_argument("--family", nargs="+", action="extend", metavar="F", help="families to show (default: all)")
    p.add_argument("--json", action="store_true", help="print the routes as JSON")


def run(args: argparse.Namespace) -> int:
    from kernel_sentinel import registry
    from kernel_sentinel.records import dumps

    try:
        families = registry.select(args.family)
    except registry.UnknownFamily as exc:
        return console.usage_error(exc.args[0])
    if args.json:
        sys.stdout.write(dumps({"families": [family_routes(f) for f in families]}))
    else:
        for family in families:
            console.out.print(rich_tree(family))
    return 0 if families else 1
