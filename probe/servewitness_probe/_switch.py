"""Switch the probe's per-step wrappers off and on in a live process (benchmarks only).

Why: the probe's cost per engine step is a few microseconds against steps of milliseconds;
two boots (with and without the plugin) differ by more than that from boot to boot, so a
tokens/s comparison across boots cannot see it. Inside ONE boot the same engine can run
phases with the probe's hot path in place and phases with the original methods back,
interleaved (``bench/tokens_ab.py``).

What is switched: every class-level attribute that the probe installed as a wrapper (marked
``__verifier_probe__``, built with ``functools.update_wrapper``) on the classes of the given
objects, for the given method names: the worker's ``execute_model``/``sample_tokens``
(``_vllm``: step counting, the open-step mark, request bindings, speculation checks) and any
declared hook on the runner's methods (``_hooks``). ``off()`` puts back the innermost method
that is not the probe's (following ``__wrapped__``); ``on()`` puts the wrappers back. Only
between steps (the engine idle): the step wrappers keep the two-phase state across a step.

What stays on in both states: the probe's import hooks, its background threads (the import
sweeper, the bindings writer, idle without steps) and its start-up work; this prices the
per-step path only. Nothing here runs unless a caller imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

STEP_METHODS = ("execute_model", "sample_tokens")


def _is_probe(fn: Any) -> bool:
    return getattr(fn, "__verifier_probe__", False) is True


def original(fn: Any) -> Any:
    """The innermost callable under FN's chain of probe wrappers (FN itself if not one)."""
    seen = 0
    while _is_probe(fn) and hasattr(fn, "__wrapped__") and seen < 64:
        fn = fn.__wrapped__
        seen += 1
    return fn


@dataclass(frozen=True)
class Target:
    """One class attribute the probe wrapped: the wrapper it installed and the original."""

    owner: type
    name: str
    wrapper: Any
    original: Any

    @property
    def label(self) -> str:
        return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.name}"


class Switch:
    """The probe's wrappers on TARGETS, switched off and on together."""

    def __init__(self, targets: Iterable[Target]) -> None:
        self.targets = tuple(targets)
        self.is_on = True

    @classmethod
    def of(cls, objects: Iterable[Any], names: Iterable[str] = STEP_METHODS) -> Switch:
        """Every probe wrapper on NAMES along the classes (MRO) of OBJECTS, each found in
        the class dict that holds it (where the probe set it)."""
        wanted = tuple(names)
        found: list[Target] = []
        seen: set[tuple[type, str]] = set()
        for obj in objects:
            for owner in type(obj).__mro__:
                for name in wanted:
                    fn = owner.__dict__.get(name)
                    if fn is None or not _is_probe(fn) or (owner, name) in seen:
                        continue
                    seen.add((owner, name))
                    found.append(Target(owner, name, fn, original(fn)))
        return cls(found)

    def off(self) -> None:
        """The original methods in place: no probe code runs in a step."""
        for t in self.targets:
            setattr(t.owner, t.name, t.original)
        self.is_on = False

    def on(self) -> None:
        """The probe's wrappers back in place."""
        for t in self.targets:
            setattr(t.owner, t.name, t.wrapper)
        self.is_on = True

    def labels(self) -> list[str]:
        return [t.label for t in self.targets]
