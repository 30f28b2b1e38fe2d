"""Servers booted ahead of the test module that needs them, on the CPU the tests before it
leave idle.

Phase 2 of the suite (scripts/test.sh) runs one module at a time. Profiled at d85c007 (per
test, busy cores from /proc/stat), its two cores were 1.1 to 1.4 busy on average: a test
waits on a server, an agent's interval, a container. Meanwhile each module that needs a
server of its own booted it when its turn came, a chain of single-threaded imports of about
45 s of one core, on the critical path: about 330 s of the phase's 1,270.

A module registers what it boots (``register``, at import); the session's pool
(``BootPool``, conftest's ``boot_pool``) learns from the collected items which of those
will run, in order, and boots them one after another in a thread of its own at nice 19. The
scheduler gives such a boot only what the running tests leave (a nice-0 task weighs 68
times one at 19), so it never competes with them. At most ``AHEAD`` are booted and not yet
taken (a server's tree holds about 2 GB).

``take(name)`` returns the booted instance with every thread of its process group reniced
to 0 first, so the module's tests meet the server it would have started itself. One still
booting is reniced at once and finishes at full speed; one the thread has not reached is
booted there and then, at the caller's priority; a boot that failed raises its error in the
module that needed it. A server is still each module's own: nothing sends it a request
before its module takes it.

Off (each ``take`` boots then and there, as before) unless this runs as root (only root
may lower a nice value back to 0), outside a pytest-xdist worker, and without
``VERIFIER_TESTS_BOOT_AHEAD=0``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, Self, TypeVar, cast

log = logging.getLogger(__name__)

AHEAD = 3  # booted and not yet taken, at most
NICE = 19
JOIN_S = 600.0  # a boot in progress when the session ends (each has its own 300 s limit)


class Bootable(Protocol):
    """What the pool boots: ``start()`` launches a process group (``proc``) and returns once
    it is ready (raising if it never is, having stopped it); ``stop()`` ends it."""

    proc: subprocess.Popen[bytes] | None

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
        os.geteuid() == 0
        and "PYTEST_XDIST_WORKER" not in os.environ
        and os.environ.get("VERIFIER_TESTS_BOOT_AHEAD", "1") != "0"
    )


@dataclass
class _Slot:
    boot: Boot[Any]
    state: str = "pending"  # -> booting -> ready | failed; taken from any of them
    thing: Bootable | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def renice(thing: Bootable, nice: int) -> None:
    """Every thread of THING's process group at NICE (setpriority on a process group sets
    each of its threads); nothing if it has none or it is gone."""
    proc = thing.proc
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.setpriority(os.PRIO_PGRP, proc.pid, nice)


def started(thing: T) -> T:
    """THING started, or stopped (its process group and files gone) and the error raised."""
    try:
        thing.start()
    except BaseException:
        thing.stop()
        raise
    return thing


class BootPool:
    """Boots ORDER's instances ahead, one at a time at nice 19 (``start``), and hands each to
    the module that takes it. Inert (every ``take`` boots on the spot) unless started."""

    def __init__(self, model: Path | None, order: Sequence[Boot[Any]], ahead: int = AHEAD) -> None:
        self.model = model
        self.ahead = ahead
        self._slots = {b.name: _Slot(b) for b in order}
        self._order = [self._slots[b.name] for b in order]
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> BootPool:
        if self._order and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="boot-ahead", daemon=True)
            self._thread.start()
        return self

    def _held(self) -> int:
        return sum(s.state in ("booting", "ready") for s in self._order)

    def _run(self) -> None:
        # Nice is per thread on Linux, and what this thread starts inherits it.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        for slot in self._order:
            with self._cond:
                while not self._closed and slot.state == "pending" and self._held() >= self.ahead:
                    self._cond.wait()
                if self._closed:
                    return
                if slot.state != "pending":  # taken (and booted) by its module already
                    continue
                slot.state = "booting"
                slot.thing = slot.boot.make(self._model())
            log.info("boot_ahead.booting %s", slot.boot.name)
            try:
                started(slot.thing)
            except BaseException as e:  # noqa: BLE001 - raised in the module that takes it
                e.add_note(f"(booted ahead of its module by tests/boot_ahead.py: {slot.boot.name})")
                slot.error = e
            with self._cond:
                if slot.state == "booting":
                    slot.state = "failed" if slot.error is not None else "ready"
                self._cond.notify_all()
            slot.done.set()

    def _model(self) -> Path:
        if self.model is None:
            raise RuntimeError("no model: the session collected no module that registered a boot")
        return self.model

    def take(self, boot: Boot[T]) -> T:
        """BOOT's instance, started and at nice 0 (see the module's docstring); the caller
        stops it."""
        slot = self._slots.get(boot.name)
        if slot is None:  # not ahead (the pool is off, or its module was not collected)
            return started(boot.make(self._model()))
        with self._cond:
            if slot.state == "taken":
                raise RuntimeError(f"boot {boot.name!r} taken twice")
            reached = slot.state != "pending"
            slot.state = "taken"
            self._cond.notify_all()
        if not reached:
            return started(boot.make(self._model()))
        thing = slot.thing
        assert thing is not None
        while not slot.done.wait(0.5):
            renice(thing, 0)  # its group grows while it boots: again until it is up
        if slot.error is not None:
            raise slot.error
        renice(thing, 0)
        return cast(T, thing)  # the slot holds what BOOT made

    def close(self) -> None:
        """Stop what was booted and never taken, after the boot in progress ends."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(JOIN_S)
        for slot in self._order:
            if slot.state == "ready" and slot.thing is not None:
                slot.thing.stop()
