"""The exit-code contract has one home: every error class of the package maps into
``ExitCode`` through exactly one base error, and none sets its code by itself."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import servewitness
from servewitness import errors
from servewitness.errors import BASES, Error, ExitCode


def _all_error_classes() -> set[type[Error]]:
    """Every subclass of ``Error`` defined anywhere in the package (every module imported)."""
    for mod in pkgutil.walk_packages(servewitness.__path__, "servewitness."):
        if mod.name.startswith(("servewitness_probe", "servewitness.api")) or mod.name.endswith(
            "__main__"
        ):
            continue  # the stdlib-only probe, generated protobuf, and `python -m` entry points
        importlib.import_module(mod.name)
    found: set[type[Error]] = set()
    todo: list[type[Error]] = [Error]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("servewitness.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_every_nonzero_code_has_exactly_one_base_error() -> None:
    assert set(BASES) == set(ExitCode) - {ExitCode.OK}
    assert all(base.exit_code is code for code, base in BASES.items())
    assert all(base.__module__ == "servewitness.errors" for base in BASES.values())


def test_every_error_class_maps_into_the_contract_through_one_base() -> None:
    classes = _all_error_classes()
    assert len(classes) > 25, sorted(c.__qualname__ for c in classes)  # the walk found them
    bases = set(BASES.values())
    wrong = []
    for cls in sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}"):
        own = [b for b in cls.__mro__ if b in bases]
        name = f"{cls.__module__}.{cls.__qualname__}"
        if len(own) != 1:
            wrong.append(f"{name}: derives from {len(own)} base errors {own}")
        elif cls not in bases and "exit_code" in vars(cls):
            wrong.append(f"{name}: sets exit_code itself instead of deriving it")
        elif cls.exit_code is not own[0].exit_code or not isinstance(cls.exit_code, ExitCode):
            wrong.append(f"{name}: exit code {cls.exit_code!r} is not its base's")
    assert wrong == []


@pytest.mark.parametrize("code", list(ExitCode))
def test_each_code_renders_in_help_and_in_the_readme_table(code: ExitCode) -> None:
    assert f"  {code.value:<2} {code.meaning}\n" in errors.exit_codes_help()
    assert f"| {code.value} | {code.describe()} |\n" in errors.exit_codes_table()


def test_a_bare_error_still_fails_with_exit_1() -> None:
    """The CLI's fallback for an error no one classified (a verifier error it cannot name)."""
    assert (Error("x").exit_code, int(ExitCode.FAILED)) == (ExitCode.FAILED, 1)
