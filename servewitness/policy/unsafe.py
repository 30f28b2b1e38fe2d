"""Unsafe policy flags, named wherever they count.

A policy weakens itself only out loud: every setting whose name starts with ``unsafe_`` (in any
settings section of a :class:`~servewitness.policy.engine.Policy`: ``[evidence]`` today, more
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
# Flags that accept a weak policy when it is loaded (policy/strength.py): they change no
# rule's judgement, so a verdict is the same without them; what rests on them is the policy.
AT_LOAD = {
    "evidence.unsafe_allow_no_liveness": "no liveness rule (no [runner], no [[hooks]])",
    "evidence.unsafe_allow_zero_fires": "no hook that must fire on a productive step",
    "provenance.unsafe_allow_unpinned_serving_package": "no pristine requirement on vLLM",
}
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
    """Every ``unsafe_*`` setting POLICY sets away from its safe default, as its dotted key
    (``evidence.unsafe_allow_no_liveness``; a setting that is not a boolean as
    ``KEY = VALUE``), sorted: what status lines, verdicts and seals name."""
    out = []
    for attr, section in _sections(policy):
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if f.name.startswith(PREFIX) and value != _default(f):
                key = f"{attr}.{f.name}"
                out.append(key if value is True else f"{key} = {value!r}")
    return tuple(sorted(out))


def shown(flag: str) -> str:
    """FLAG as a policy says it: ``evidence.unsafe_allow_unauthenticated = true``."""
    return flag if "=" in flag else f"{flag} = true"


def without(policy: P, flag: str) -> P:
    """POLICY with the unsafe setting FLAG (``unsafe_NAME`` or ``unsafe_NAME = VALUE``) back
    at its default."""
    key = flag.split("=", 1)[0].strip()
    where, _, name = key.rpartition(".")
    for attr, section in _sections(policy):
        if where and attr != where:
            continue
        for f in dataclasses.fields(section):
            if f.name == name:
                safe = dataclasses.replace(section, **{name: _default(f)})
                out: P = dataclasses.replace(policy, **{attr: safe})  # type: ignore[type-var]
                return out
    raise KeyError(name)
