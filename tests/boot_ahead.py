"""Servers booted ahead of the test module that needs them, beside the boot of the one before.

Phase 2 of the suite (scripts/test.sh) runs one module at a time, and each module with a
server of its own booted it when its turn came: a chain of mostly single-threaded imports,
about 45 s, eight of them on the critical path (the shared server, conftest's, included).
Two boots side by side take about 1.25 times one on this machine's two cores
(tests/test_compare_live.py measured 66.6 s against 53.6), so a module that boots its server
boots the next registered one with it, and the later module finds its server up. Phase 2
took 1,269 s so (at 81a32b9, the shared server still alone) against 1,356 s the same day
without it (runs of one commit differ by about 50 s).

Tried first and measured (phase 2 profiled per test, busy cores from /proc/stat, at
d85c007 and 79f46c5): booting the servers to come in the background at nice 19, on the CPU
the running tests left (the cores were 1.1 to 1.4 busy on average). The phase took 1,322 s
against 1,356: the tests beside a boot slowed although they had the priority (the gate's
+51 s, the stack sampler's +40 s), as if the second core gave little more than half a core.
Boots side by side only ever overlap other boots, so no test runs beside one.

A module registers what it boots (``register``, at import); the session's pool (conftest's
``boot_pool``) learns from the collected items which of those will run, in order.
``take(boot)`` boots BOOT's instance and, beside it, the next registered one not yet booted
(at most ``TOGETHER`` at once), waits for both, and returns BOOT's; a later ``take`` of the
other finds it up. A boot that failed raises its error in the module that takes it. An
instance is still each module's own: nothing sends it a request before its module takes it.
What was booted and never taken is stopped when the session ends.

Off (each ``take`` boots its own, alone) under a pytest-xdist worker or with
``VERIFIER_TESTS_BOOT_AHEAD=0``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, Self, TypeVar, cast

log = logging.getLogger(__name__)

TOGETHER = 2  # boots side by side, at most (a server's tree holds about 2 GB)


class Bootable(Protocol):
    """What the pool boots: ``start()`` returns once it is ready (raising if it never is);
    ``stop()`` ends it."""

    def start(self) -> Self: ...

    def stop(self) -> None: ...


T = TypeVar("T", bound=Bootable)


@dataclass(frozen=True)
class Boot(Generic[T]):
    """A registered boot: its name, its module (``__name__``) and how to make it from the
    model's path."""

    name: str
    module: str
    make: Callable[[Path], T]


_REGISTERED: dict[str, Boot[Any]] = {}


def register(name: str, module: str, make: Callable[[Path], T]) -> Boot[T]:
    """Register MAKE as boot NAME of test module MODULE (its ``__name__``); the handle that
    ``BootPool.take`` takes."""
    known = _REGISTERED.get(name)
    if known is not None and known.module != module:
        raise ValueError(f"boot {name!r} is registered by {known.module} already")
    boot = Boot(name, module, make)
    _REGISTERED[name] = boot
    return boot


def needed(modules: Iterable[str]) -> list[Boot[Any]]:
    """The registered boots of MODULES (module names in the order their tests run), in that
    order and, within one module, in the order it registered them."""
    order: list[Boot[Any]] = []
    for module in dict.fromkeys(modules):
        order += [b for b in _REGISTERED.values() if b.module == module]
    return order


def enabled() -> bool:
    return (
        "PYTEST_XDIST_WORKER" not in os.environ
        and os.environ.get("VERIFIER_TESTS_BOOT_AHEAD", "1") != "0"
    )


def started(thing: T) -> T:
    """THING started, or stopped (its process group and files gone) and the error raised."""
    try:
        thing.start()
    except BaseException:
        thing.stop()
        raise
    return thing


@dataclass
class _Slot:
    boot: Boot[Any]
    state: str = "pending"  # -> up (booted beside an earlier take) -> taken; or -> taken
    thing: Bootable | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class BootPool:
    """Boots ORDER's instances two at a time, each group when its first is taken."""

    def __init__(
        self, model: Path | None, order: Sequence[Boot[Any]], together: int = TOGETHER
    ) -> None:
        self.model = model
        self.together = together
        self._slots = {b.name: _Slot(b) for b in order}
        self._order = [self._slots[b.name] for b in order]
        self._lock = threading.Lock()

    def _model(self) -> Path:
        if self.model is None:
            raise RuntimeError("no model: the session collected no module that registered a boot")
        return self.model

    def _boot(self, slot: _Slot) -> None:
        t0 = time.monotonic()
        try:
            slot.thing = started(slot.boot.make(self._model()))
        except BaseException as e:  # noqa: BLE001 - raised in the module that takes it
            e.add_note(f"(booted by tests/boot_ahead.py: {slot.boot.name})")
            slot.error = e
        log.info("boot_ahead.booted %s in %.1f s", slot.boot.name, time.monotonic() - t0)
        slot.done.set()

    def take(self, boot: Boot[T]) -> T:
        """BOOT's instance, started, booted beside the next registered one not yet booted
        where BOOT was not booted already; the caller stops it."""
        slot = self._slots.get(boot.name)
        if slot is None:  # not in the pool (it is off, or its module was not collected)
            return started(boot.make(self._model()))
        with self._lock:
            if slot.state == "taken":
                raise RuntimeError(f"boot {boot.name!r} taken twice")
            group: list[_Slot] = []
            if slot.state == "pending":
                at = self._order.index(slot)
                later = [s for s in self._order[at + 1 :] if s.state == "pending"]
                group = [slot, *later[: self.together - 1]]
                for s in group[1:]:
                    s.state = "up"  # booted here, taken later
            slot.state = "taken"
        beside = [threading.Thread(target=self._boot, args=(s,), daemon=True) for s in group[1:]]
        for t in beside:
            t.start()
        if group:
            self._boot(slot)
        for t in beside:
            t.join()
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return cast(T, slot.thing)  # the slot holds what BOOT made

    def close(self) -> None:
        """Stop what was booted and never taken."""
        for slot in self._order:
            if slot.state == "up" and slot.thing is not None:
                slot.thing.stop()
