"""The decorator counts a code chain's innermost layer is held to (``codecheck._decorated``)
are found by looking into statements only: the same definitions, names and counts as a walk
of every node of the tree, wherever a definition sits (under if/else, try/except/else/finally,
with, for/while and their else, match cases, other definitions, classes)."""

from __future__ import annotations

import ast
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.evidence.codecheck import _DESCRIPTORS, _decorated

NESTED = """
import functools

def plain(): pass

@functools.cache
@staticmethod
def cached(): pass

if True:
    @functools.wraps(plain)
    def under_if(): pass
else:
    @a
    @b
    def under_else(): pass

try:
    def in_try(): pass
except ValueError:
    @x
    def in_except(): pass
else:
    def in_try_else(): pass
finally:
    @classmethod
    @y
    def in_finally(): pass

try:
    pass
except* OSError:
    def in_except_star(): pass

with open("f") as f, open("g") as g:
    @z
    def in_with(): pass

async def coro():
    async with m:
        @w
        def in_async_with(): pass
    async for i in it:
        def in_async_for(): pass
    else:
        def in_async_for_else(): pass

for i in range(3):
    def in_for(): pass
else:
    def in_for_else(): pass

while False:
    def in_while(): pass
else:
    def in_while_else(): pass

match command:
    case [x, y]:
        @deco(1)
        def in_case(): pass
    case _:
        class InCase:
            def m(self): pass

class Outer:
    @property
    def p(self): return 1

    class Inner:
        @staticmethod
        @d1
        @d2
        def deep(): pass

    def method(self):
        @e
        def local(): pass
        class Local:
            def lm(self): pass
        if self:
            lam = lambda: (lambda: 1)
            def in_method_if(): pass
        return local

x = [lambda y: y for _ in range(2)]
"""


def _every_node(node: ast.AST, prefix: str) -> Iterator[tuple[tuple[str, int], int]]:
    """The reference: every node of the tree looked into (the walk before statements only)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            yield from _every_node(child, f"{prefix}{child.name}.")
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decs = child.decorator_list
            first = decs[0].lineno if decs else child.lineno
            n = sum(1 for d in decs if not (isinstance(d, ast.Name) and d.id in _DESCRIPTORS))
            yield (f"{prefix}{child.name}", first), n
            yield from _every_node(child, f"{prefix}{child.name}.<locals>.")
        else:
            yield from _every_node(child, prefix)


def test_every_definition_wherever_it_sits_is_found_with_its_count() -> None:
    tree = ast.parse(NESTED)
    got = dict(_decorated(tree.body, ""))
    assert got == dict(_every_node(tree, ""))
    names = {name for name, _ in got}
    for name in (
        "under_else", "in_except", "in_try_else", "in_finally", "in_except_star", "in_with",
        "coro.<locals>.in_async_with", "coro.<locals>.in_async_for_else", "in_for_else",
        "in_while_else", "in_case", "InCase.m", "Outer.Inner.deep",
        "Outer.method.<locals>.Local.lm", "Outer.method.<locals>.in_method_if",
    ):  # fmt: skip
        assert name in names, name
    counts = {name: n for (name, _), n in got.items()}
    assert (counts["cached"], counts["in_finally"], counts["Outer.Inner.deep"]) == (1, 1, 2)
    assert counts["under_else"] == 2 and counts["plain"] == 0


STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.mark.parametrize(
    "name", ["typing.py", "ast.py", "asyncio/base_events.py", "unittest/mock.py", "dataclasses.py"]
)
def test_real_files_give_what_a_walk_of_every_node_gives(name: str) -> None:
    tree = ast.parse((STDLIB / name).read_bytes())
    got = dict(_decorated(tree.body, ""))
    assert got == dict(_every_node(tree, ""))
    assert len(got) > 20, sys.version  # the file defines things: the comparison saw them
