"""tests/boot_ahead.py, the pool that boots phase 2's servers two at a time, on real process
groups (an interpreter with a child, standing in for a server): a take boots its instance
and the next one beside it, a later take finds that one up, a failed boot is raised in the
module that takes it and leaves nothing running, and nothing booted outlives ``close``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import pytest

from tests import boot_ahead
from tests.boot_ahead import Boot, BootPool

SERVER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "fail":
    child.kill()
    sys.exit(3)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""


class Server:
    """A process group that is ready (its file written) after DELAY s, or exits 3 (FAIL)."""

    starts: list[str] = []  # noqa: RUF012 - every Server started, in order (per test: cleared)

    def __init__(self, tmp: Path, name: str, delay: float = 0.3, fail: bool = False) -> None:
        self.name = name
        self.ready = tmp / f"{name}.ready"
        self.delay, self.fail = delay, fail
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid = 0
        self.began = self.up = 0.0

    def start(self) -> Self:
        Server.starts.append(self.name)
        self.began = time.monotonic()
        argv = [sys.executable, "-c", SERVER, str(self.ready), str(self.delay)]
        self.proc = subprocess.Popen([*argv, "fail" if self.fail else "ok"], start_new_session=True)
        self.pgid = self.proc.pid
        deadline = time.monotonic() + 60
        while not self.ready.exists() or not self.ready.read_text():
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode} before it was ready")
            assert time.monotonic() < deadline
            time.sleep(0.02)
        self.up = time.monotonic()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture(autouse=True)
def _starts() -> None:
    Server.starts.clear()


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def gone(*pgids: int) -> None:
    """Until every group in PGIDS is gone (a SIGKILLed leader's child, reparented, is reaped a
    moment later)."""
    deadline = time.monotonic() + 30
    while not all(map(group_gone, pgids)):
        assert time.monotonic() < deadline, f"still running: {pgids}"
        time.sleep(0.02)


def boots(tmp: Path, *specs: tuple[str, bool]) -> list[Boot[Server]]:
    def maker(name: str, fail: bool) -> Callable[[Path], Server]:
        return lambda _model: Server(tmp, name, fail=fail)

    return [Boot(name, __name__, maker(name, fail)) for name, fail in specs]


def test_a_take_boots_the_next_one_beside_it_and_a_later_take_finds_it_up(tmp_path: Path) -> None:
    a, b, c = boots(tmp_path, ("a", False), ("b", False), ("c", False))
    pool = BootPool(tmp_path, [a, b, c])
    try:
        got_a = pool.take(a)
        assert Server.starts in (["a", "b"], ["b", "a"]), "not the next one, or not only it"
        got_b = pool._slots["b"].thing
        assert isinstance(got_b, Server) and got_b.proc is not None
        assert got_b.began < got_a.up and got_a.began < got_b.up, "one after the other"
        assert pool.take(b) is got_b and Server.starts in (["a", "b"], ["b", "a"])
        got_c = pool.take(c)  # the last one: alone
        assert Server.starts[2:] == ["c"]
        for s in (got_a, got_b, got_c):
            s.stop()
        with pytest.raises(RuntimeError, match="taken twice"):
            pool.take(b)
    finally:
        pool.close()


def test_a_failed_boot_beside_is_raised_where_it_is_taken_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    good, bad = boots(tmp_path, ("good", False), ("bad", True))
    pool = BootPool(tmp_path, [good, bad])
    try:
        pool.take(good).stop()  # not held up by the other's failure
        with pytest.raises(RuntimeError, match="exited with 3") as e:
            pool.take(bad)
        assert any("booted by tests/boot_ahead.py: bad" in n for n in e.value.__notes__)
        failed = [s for s in Server.starts if s == "bad"]
        assert failed == ["bad"], "booted again when taken"
    finally:
        pool.close()
    assert not list(tmp_path.glob("bad.ready"))


def test_close_stops_what_was_booted_and_never_taken(tmp_path: Path) -> None:
    a, b = boots(tmp_path, ("a", False), ("b", False))
    pool = BootPool(tmp_path, [a, b])
    pool.take(a).stop()
    untaken = pool._slots["b"].thing
    assert isinstance(untaken, Server) and untaken.proc is not None
    pool.close()
    gone(untaken.pgid)


def test_an_inert_pool_boots_each_alone_when_taken(tmp_path: Path) -> None:
    a, b = boots(tmp_path, ("a", False), ("b", False))
    pool = BootPool(tmp_path, [])  # off: under xdist, or VERIFIER_TESTS_BOOT_AHEAD=0
    try:
        got = pool.take(a)
        assert Server.starts == ["a"]
        got.stop()
        pool.take(b).stop()
        assert Server.starts == ["a", "b"]
    finally:
        pool.close()


def test_needed_follows_the_modules_order_and_a_name_belongs_to_one_module() -> None:
    saved = dict(boot_ahead._REGISTERED)
    try:
        x1 = boot_ahead.register("x1", "m.x", lambda m: Server(m, "x1"))
        boot_ahead.register("y1", "m.y", lambda m: Server(m, "y1"))
        boot_ahead.register("x2", "m.x", lambda m: Server(m, "x2"))
        order = boot_ahead.needed(["m.y", "m.z", "m.y", "m.x"])
        assert [b.name for b in order] == ["y1", "x1", "x2"]
        assert x1.module == "m.x"
        with pytest.raises(ValueError, match=r"registered by m\.x"):
            boot_ahead.register("x1", "m.other", lambda m: Server(m, "x1"))
    finally:
        boot_ahead._REGISTERED.clear()
        boot_ahead._REGISTERED.update(saved)
