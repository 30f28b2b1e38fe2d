"""Probe state directories across PID namespaces, boots and process images: real processes in
real namespaces (``unshare --pid --fork --mount-proc``, root) sharing one probe dir, as
containers sharing ``/dev/shm`` do.

* Two processes with the same pid started in the same clock tick in two namespaces (each is
  pid 1 of its own; the same tick is what two containers started together get) must not share
  a directory: before, both were ``1-<ticks>``, mapped one counters file and counted each
  other's hook fires.
* Garbage collection in one namespace must leave another namespace's live state alone: before,
  a probe starting in namespace A read ``/proc/1`` (itself) for B's ``1-<ticks>`` and removed
  B's live directory.
* It still removes what it can judge: dead processes of its own namespace, another boot's.
* A directory already under a process's name (planted before it started, or its own from
  before an ``exec``) is replaced, never written into.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from servewitness_probe import layout as L

from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from tests.helpers import probe_env, state_name

FIRE = "import servewitness_probe as p\np.start()\nfor _ in range({n}): p.hook.fire('h')\n"


def spawn(probe: Path, code: str, *, mount_proc: bool = True, **env: str) -> subprocess.Popen[str]:
    """Start CODE in a new PID namespace (as its pid 1) with its probe dir at PROBE; it prints
    READY when done and waits for stdin to close."""
    unshare = ["unshare", "--pid", "--fork", *(["--mount-proc"] if mount_proc else [])]
    script = textwrap.dedent(code) + "\nprint('READY', flush=True)\nimport sys; sys.stdin.read()\n"
    return subprocess.Popen([*unshare, sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=probe_env(probe, **env))  # fmt: skip


@contextmanager
def running(proc: subprocess.Popen[str]) -> Iterator[int]:
    """PROC (from ``spawn``) once ready, until the context ends: its Python's pid here."""
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "READY", (line, proc.communicate(timeout=30)[1])
        (python,) = ProcFS().descendants(proc.pid)[1:]
        yield python
    finally:
        if proc.poll() is None:
            proc.communicate(timeout=30)


def in_namespace(
    probe: Path, code: str, *, mount_proc: bool = True, **env: str
) -> contextlib.AbstractContextManager[int]:
    """Run CODE in a new PID namespace until the context ends (see ``spawn``, ``running``)."""
    return running(spawn(probe, code, mount_proc=mount_proc, **env))


def fires(pid: int) -> int:
    ev = read_process(ProcFS(), pid)
    assert ev.probe is not None, ev.note
    return sum(h.fired for h in ev.probe.hooks if h.name == "h")


def test_same_pid_same_tick_in_two_namespaces_get_two_state_directories(tmp_path: Path) -> None:
    """Two pid 1s started in one clock tick (tried until they are: two unshares started
    back to back usually are) each count their own fires in their own directory."""
    for attempt in range(40):
        probe = tmp_path / f"probe{attempt}"
        first, second = spawn(probe, FIRE.format(n=3)), spawn(probe, FIRE.format(n=5))
        with ExitStack() as stack:
            a, b = stack.enter_context(running(first)), stack.enter_context(running(second))
            ia, ib = ProcFS().identity(a), ProcFS().identity(b)
            if ia.start_ticks != ib.start_ticks:
                continue
            assert (ia.ns_pid, ib.ns_pid) == (1, 1)  # the old names were the same: 1-<ticks>
            assert L.legacy_dir_name(1, ia.start_ticks) == L.legacy_dir_name(1, ib.start_ticks)
            names = {state_name(a), state_name(b)}
            assert (fires(a), fires(b)) == (3, 5)
            assert sorted(os.listdir(probe)) == sorted(names) and len(names) == 2
            return
    raise AssertionError("two processes never started in one tick in 40 attempts")


def test_names_differ_by_namespace_for_real_processes(tmp_path: Path) -> None:
    """The name each probe gave itself, and the name the reader computes for it from outside
    (from /proc of this namespace), agree, and carry each process's own PID namespace."""
    probe = tmp_path / "probe"
    with (
        in_namespace(probe, FIRE.format(n=1)) as a,
        in_namespace(probe, FIRE.format(n=1)) as b,
    ):
        got = {read_process(ProcFS(), pid).probe.directory for pid in (a, b)}  # type: ignore[union-attr]
        ns = {os.readlink(f"/proc/{pid}/ns/pid") for pid in (a, b)}
        expected = {str(probe / state_name(pid)) for pid in (a, b)}
    assert len(ns) == 2 and {Path(d).name for d in got} == {Path(d).name for d in expected}
    parsed = [L.parse_dir_name(Path(d).name) for d in got]
    assert {(n.pid, n.boot) for n in parsed if n} == {(1, state_name(os.getpid())[:8])}
    assert {f"pid:[{n.pid_ns}]" for n in parsed if n} == ns


def test_collection_in_one_namespace_leaves_another_namespaces_live_state(tmp_path: Path) -> None:
    """B (pid 1 of its namespace) is probed and alive; then A, pid 1 of another namespace, and
    a process of this namespace start their probes (and collect garbage): B's state stays."""
    probe = tmp_path / "probe"
    with in_namespace(probe, FIRE.format(n=2)) as b:
        time.sleep(0.05)  # A starts in a later tick: /proc/1 there is A, with another start
        with in_namespace(probe, FIRE.format(n=1)) as a:
            here = subprocess.run([sys.executable, "-c", FIRE.format(n=1)], env=probe_env(probe),
                                  check=True, capture_output=True)  # fmt: skip
            assert here.returncode == 0
            assert (probe / state_name(b)).is_dir() and (probe / state_name(a)).is_dir()
            assert fires(b) == 2
        assert fires(b) == 2


def _dead_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())  # no process has it


def test_collection_removes_what_it_can_judge_and_nothing_else(tmp_path: Path) -> None:
    """A probe starting in this namespace, over a shared dir holding every kind of name."""
    probe = tmp_path / "probe"
    me = os.getpid()
    boot, ns, _, ticks = state_name(me).split("-")
    other_boot = "deadbeef" if boot != "deadbeef" else "feedface"
    dead = _dead_pid()
    gone = [
        f"{boot}-{ns}-{dead}-1",  # this boot and namespace, a pid that is not alive
        f"{boot}-{ns}-{me}-{int(ticks) + 1}",  # this pid alive, started at another tick: reused
        f"{other_boot}-{ns}-{me}-{ticks}",  # another boot: nothing of it is alive
    ]
    kept = [
        f"{boot}-{ns}-{me}-{ticks}",  # alive: this test's own process
        f"{boot}-{int(ns) + 1}-{dead}-1",  # another namespace: its pids are not ours to judge
        f"{dead}-1",  # an older probe's name: no namespace, may be another container's
        f"{L.UNKNOWN_BOOT}-{ns}-{dead}-1",  # a probe that could not read the boot id
        f"{boot}-0-{dead}-1",  # a probe that could not read its namespace
        "not-a-state-dir",
    ]
    for name in gone + kept:
        (probe / name).mkdir(parents=True)
    subprocess.run([sys.executable, "-c", FIRE.format(n=0)], env=probe_env(probe), check=True)
    assert sorted(os.listdir(probe)) == sorted(kept)


def test_no_collection_by_liveness_where_proc_is_another_namespaces(tmp_path: Path) -> None:
    """``unshare --pid`` without ``--mount-proc``: the process is pid 1 of its namespace, but
    ``/proc`` is this namespace's, where its pids mean other processes. A dead-looking
    directory of its own namespace is left alone then; with its own /proc, removed."""
    plant = f"""
        import os
        from tests.helpers import state_name
        boot, ns = state_name(int(os.readlink("/proc/self"))).split("-")[:2]
        planted = f"{{boot}}-{{ns}}-{_dead_pid()}-1"
        os.makedirs(os.path.join(os.environ["VERIFIER_PROBE_DIR"], planted))
        import servewitness_probe as p; p.start()
    """
    for mount_proc, survives in ((False, True), (True, False)):
        probe = tmp_path / f"probe-{mount_proc}"
        with in_namespace(probe, plant, mount_proc=mount_proc) as pid:
            listed = os.listdir(probe)
            own = state_name(pid)
        planted = [n for n in listed if n.endswith(f"-{_dead_pid()}-1")]
        assert own in listed
        assert bool(planted) is survives, (mount_proc, listed)


def test_a_directory_planted_under_a_future_name_is_never_written_into(tmp_path: Path) -> None:
    """Someone who guesses a process's name (pid, start tick) plants a journal there before its
    probe starts, with a record of a file it never loaded. Before, the probe appended to it and
    the reader took the planted records for the process's. Now the directory is made afresh."""
    probe = tmp_path / "probe"
    victim = tmp_path / "victim"
    victim.write_text("")
    code = """
        import json, os
        from tests.helpers import state_name
        d = os.path.join(os.environ["VERIFIER_PROBE_DIR"], state_name(os.getpid()))
        os.makedirs(d)
        with open(os.path.join(d, "journal.jsonl"), "w") as f:
            f.write(json.dumps({"k": "start", "pid": os.getpid(), "mode": "planted"}) + "\\n")
            f.write(json.dumps({"k": "file", "path": "/planted.py", "sha256": "0" * 64,
                                "size": 1, "kind": "source", "at": "load"}) + "\\n")
        os.symlink(os.environ["VICTIM"], os.path.join(d, "bindings.jsonl"))
        import servewitness_probe as p; p.start()
        from servewitness_probe import _bindings, _extids
        _extids.ext("i-1", "e-1"); _bindings.flush()
    """
    with in_namespace(probe, code, VICTIM=str(victim)) as pid:
        ev = read_process(ProcFS(), pid)
        journal = (Path(ev.probe.directory) / L.JOURNAL_FILE).read_text() if ev.probe else ""
    assert ev.probe is not None and ev.probe.mode != "planted"
    assert "/planted.py" not in {f.path for f in ev.probe.files}
    assert journal.count('"k":"start"') == 1 and "planted" not in journal
    assert victim.read_text() == ""


def test_a_process_that_execs_itself_gets_fresh_state(tmp_path: Path) -> None:
    """Same pid, same start time, a new image: its state from before the exec (no longer
    mapped, its journal closed by the exec) is replaced, not continued."""
    probe = tmp_path / "probe"
    code = """
        import os, sys
        if not os.environ.get("EXECED"):
            import servewitness_probe as p; p.start()
            p.hook.fire("before")
            os.environ["EXECED"] = "1"
            os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]] + sys.argv[1:])
        import servewitness_probe as p; p.start()
        p.hook.fire("h")
    """
    script = textwrap.dedent(code) + "\nprint('READY', flush=True)\nimport sys; sys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-c", script, script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=probe_env(probe))  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        ev = read_process(ProcFS(), proc.pid)
    finally:
        proc.communicate(timeout=30)
    assert ev.probe is not None
    assert {h.name for h in ev.probe.hooks} == {"h"}  # nothing of the image before the exec
