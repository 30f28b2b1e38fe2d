"""tests/boot_ahead.py, the pool that boots phase 2's servers ahead on idle CPU, on real
process groups (an interpreter with a thread and a child, standing in for a server): booted
at nice 19, handed over with every thread at nice 0, at most AHEAD held, a failed boot
raised in the module that takes it, what the pool never reached booted on the spot, and
nothing left running after ``close``."""

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

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root may lower a nice value: the pool is off without it"
)

SERVER = """
import subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "fail":
    child.kill()
    sys.exit(3)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""


class Server:
    """A process group that is ready (its file written) after DELAY s, or exits 3 (FAIL)."""

    def __init__(self, tmp: Path, name: str, delay: float = 0.0, fail: bool = False) -> None:
        self.ready = tmp / f"{name}.ready"
        self.delay, self.fail = delay, fail
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid = 0
        self.child = 0

    def start(self) -> Self:
        argv = [sys.executable, "-c", SERVER, str(self.ready), str(self.delay)]
        self.proc = subprocess.Popen([*argv, "fail" if self.fail else "ok"], start_new_session=True)
        self.pgid = self.proc.pid
        deadline = time.monotonic() + 60
        while not self.ready.exists() or not self.ready.read_text():
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode} before it was ready")
            assert time.monotonic() < deadline
            time.sleep(0.02)
        self.child = int(self.ready.read_text())
        return self

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None


def nice_of(pid: int, tid: int | None = None) -> int:
    """The nice value of PID's thread TID (its main thread by default): field 19 of stat."""
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def nices(server: Server) -> set[int]:
    """The nice value of every thread of SERVER's process and of its child."""
    got = set()
    for pid in (server.pgid, server.child):
        for task in Path(f"/proc/{pid}/task").iterdir():
            got.add(nice_of(pid, int(task.name)))
    return got


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def boots(tmp: Path, *specs: tuple[str, float, bool]) -> list[Boot[Server]]:
    def maker(name: str, delay: float, fail: bool) -> Callable[[Path], Server]:
        return lambda _model: Server(tmp, name, delay, fail)

    return [Boot(name, __name__, maker(name, delay, fail)) for name, delay, fail in specs]


def wait_for(what: str, pred: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_booted_ahead_at_nice_19_in_order_at_most_ahead_and_handed_over_at_nice_0(
    tmp_path: Path,
) -> None:
    a, b, c = boots(tmp_path, ("a", 0.0, False), ("b", 0.0, False), ("c", 0.0, False))
    pool = BootPool(tmp_path, [a, b, c], ahead=2).start()
    try:
        wait_for("a and b booted", (tmp_path / "b.ready").exists)
        time.sleep(0.5)  # c would have started by now if the bound did not hold
        assert not (tmp_path / "c.ready").exists(), "more than AHEAD booted and held"
        got_a = pool.take(a)
        assert nices(got_a) == {0}, "handed over with a thread or a child still niced"
        wait_for("c booted once a was taken", (tmp_path / "c.ready").exists)
        got_b, got_c = pool.take(b), pool.take(c)
        assert nices(got_b) == nices(got_c) == {0}
        for s in (got_a, got_b, got_c):
            s.stop()
    finally:
        pool.close()


def test_a_server_still_booting_is_niced_until_taken_then_finishes_at_nice_0(
    tmp_path: Path,
) -> None:
    (slow,) = boots(tmp_path, ("slow", 3.0, False))
    pool = BootPool(tmp_path, [slow]).start()
    try:
        wait_for("its process", lambda: pool._slots["slow"].thing is not None)
        server = pool._slots["slow"].thing
        assert isinstance(server, Server)
        wait_for("its process group", lambda: server.proc is not None)
        assert server.proc is not None
        pid = server.proc.pid
        wait_for("its child", lambda: len(list(Path(f"/proc/{pid}/task").iterdir())) > 1)
        assert nice_of(pid) == boot_ahead.NICE  # booting on idle CPU only
        got = pool.take(slow)
        assert got is server and nices(got) == {0}
        got.stop()
    finally:
        pool.close()


def test_a_failed_boot_is_raised_where_it_is_taken_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    bad, good = boots(tmp_path, ("bad", 0.0, True), ("good", 0.0, False))
    pool = BootPool(tmp_path, [bad, good]).start()
    try:
        with pytest.raises(RuntimeError, match="exited with 3") as e:
            pool.take(bad)
        assert any("booted ahead of its module" in n for n in e.value.__notes__)
        failed = pool._slots["bad"].thing
        assert isinstance(failed, Server) and group_gone(failed.pgid)
        pool.take(good).stop()  # the next one is not held up by it
        with pytest.raises(RuntimeError, match="taken twice"):
            pool.take(good)
    finally:
        pool.close()


def test_one_the_pool_has_not_reached_is_booted_on_the_spot_at_the_callers_priority(
    tmp_path: Path,
) -> None:
    first, second = boots(tmp_path, ("first", 2.0, False), ("second", 0.0, False))
    pool = BootPool(tmp_path, [first, second], ahead=1).start()
    try:
        wait_for("first booting", lambda: pool._slots["first"].thing is not None)
        here = pool.take(second)  # the pool is busy with `first` (and may hold only one)
        assert nices(here) == {os.getpriority(os.PRIO_PROCESS, 0)}
        pool.take(first).stop()
        here.stop()
    finally:
        pool.close()
    assert pool._slots["second"].thing is None, "the pool booted a second one of it"


def test_close_stops_what_was_booted_and_never_taken(tmp_path: Path) -> None:
    a, b = boots(tmp_path, ("a", 0.0, False), ("b", 0.0, False))
    pool = BootPool(tmp_path, [a, b]).start()
    wait_for("both booted", lambda: pool._slots["b"].state == "ready")
    groups = []
    for name in ("a", "b"):
        server = pool._slots[name].thing
        assert isinstance(server, Server)
        groups.append(server.pgid)
    pool.close()
    # SIGKILLed: its child, reparented, is reaped a moment later
    wait_for("no server booted ahead outliving the session", lambda: all(map(group_gone, groups)))


def test_an_inert_pool_boots_each_on_the_spot(tmp_path: Path) -> None:
    (a,) = boots(tmp_path, ("a", 0.0, False))
    pool = BootPool(tmp_path, []).start()  # off: not root, under xdist, or turned off
    try:
        got = pool.take(a)
        assert nices(got) == {os.getpriority(os.PRIO_PROCESS, 0)}
        got.stop()
    finally:
        pool.close()


def test_needed_follows_the_modules_order_and_a_name_belongs_to_one_module() -> None:
    saved = dict(boot_ahead._REGISTERED)
    try:
        make = boot_ahead.register("x1", "m.x", lambda m: Server(m, "x1"))
        boot_ahead.register("y1", "m.y", lambda m: Server(m, "y1"))
        boot_ahead.register("x2", "m.x", lambda m: Server(m, "x2"))
        order = boot_ahead.needed(["m.y", "m.z", "m.y", "m.x"])
        assert [b.name for b in order] == ["y1", "x1", "x2"]
        assert make.module == "m.x"
        with pytest.raises(ValueError, match=r"registered by m\.x"):
            boot_ahead.register("x1", "m.other", lambda m: Server(m, "x1"))
    finally:
        boot_ahead._REGISTERED.clear()
        boot_ahead._REGISTERED.update(saved)
