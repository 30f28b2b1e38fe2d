"""Unsafe policy flags, named wherever they count.

A policy weakens itself only out loud: every setting whose name starts with ``unsafe_`` (in any
settings section of a :class:`~verifier.policy.engine.Policy`: ``[evidence]`` today, more
sections as they gain such flags) is an unsafe flag. :func:`unsafe_flags` lists the ones a
policy turns on (for status lines, seals and anything else that must say so), and
:func:`without` gives the same policy with one of them back at its safe default, so the engine
can tell whether a verdict PASSed *only because* of it (``policy.unsafe``). Generic over flag
names: a new ``unsafe_*`` field is covered without a change here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

PREFIX = "unsafe_"
# A policy (engine.Policy, a frozen dataclass): not imported, so the engine can import this.
P = TypeVar("P")


def _sections(policy: Any) -> list[tuple[str, Any]]:
    """(field name, settings dataclass) of every settings section the policy holds."""
    return [
        (f.name, getattr(policy, f.name))
        for f in dataclasses.fields(policy)
        if dataclasses.is_dataclass(getattr(policy, f.name))
        and not isinstance(getattr(policy, f.name), type)
    ]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def unsafe_flags(policy: Any) -> tuple[str, ...]:
    """Every ``unsafe_*`` setting POLICY sets away from its safe default, as
    ``unsafe_NAME = VALUE`` (TOML-ish, as the policy says it), sorted."""
    out = []
    for _, section in _sections(policy):
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if f.name.startswith(PREFIX) and value != _default(f):
                shown = str(value).lower() if isinstance(value, bool) else repr(value)
                out.append(f"{f.name} = {shown}")
    return tuple(sorted(out))


def without(policy: P, flag: str) -> P:
    """POLICY with the unsafe setting FLAG (``unsafe_NAME`` or ``unsafe_NAME = VALUE``) back
    at its default."""
    name = flag.split("=", 1)[0].strip()
    for attr, section in _sections(policy):
        for f in dataclasses.fields(section):
            if f.name == name:
                safe = dataclasses.replace(section, **{name: _default(f)})
                out: P = dataclasses.replace(policy, **{attr: safe})  # type: ignore[type-var]
                return out
    raise KeyError(name)
