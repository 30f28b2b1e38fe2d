"""Files the serving side can swap for a FIFO, a device or a socket: every reader in the
agent reads regular files only and never waits on one (``evidence/regular.py``).

The attack (found by a black-box attacker, 2026-12-05): the serving process unlinks a file it
loaded and makes a FIFO at its path. The agent's next collect opened it to hash it and
waited for a writer for good; its target went STALE, the message blaming the network, and
the agent logged nothing. Each test makes the real FIFO (or device link) and runs the reader
in a thread: a reader still running after HANG_S is the hang."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence import counters, journal, pycfile, stdlib, unfiled
from servewitness.evidence.bindings_reader import BindingsReader
from servewitness.evidence.distindex import DistIndex
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.regular import NotRegular, open_regular, read_regular
from tests.helpers import spawn_probed

HANG_S = 20.0  # a reader that has not returned by then waits on the FIFO: the defect


def returns(fn: Callable[[], Any]) -> Any:
    """FN's result, from a thread; fails the test if FN is still running after HANG_S."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive(), (
        f"{fn} still runs after {HANG_S} s: it waits on a FIFO or reads for ever"
    )
    if errors:
        raise errors[0]
    return out[0]


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def test_the_opener_names_what_it_refuses(tmp_path: Path) -> None:
    f = fifo(tmp_path / "f")
    with pytest.raises(NotRegular, match="a FIFO"):
        returns(lambda: open_regular(f))
    with pytest.raises(NotRegular, match="a FIFO"):
        returns(lambda: open_regular(f, look=False))  # opened without waiting, closed unread
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(NotRegular, match="a character device"):
        read_regular(tmp_path / "zero", 10)
    with pytest.raises(NotRegular, match="a symbolic link") as e:
        open_regular(tmp_path / "zero", nofollow=True)
    assert e.value.errno == 40  # ELOOP, as O_NOFOLLOW says it
    with pytest.raises(NotRegular, match="a directory"):
        open_regular(tmp_path)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    with pytest.raises(NotRegular, match="a socket"):
        open_regular(tmp_path / "sock")
    s.close()
    big = tmp_path / "big"
    big.write_bytes(b"x" * 11)
    with pytest.raises(NotRegular, match="larger than 10 bytes"):
        read_regular(big, 10)
    assert read_regular(big, 11) == b"x" * 11


def test_every_reader_of_the_serving_sides_files_returns(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "evil-1.0.dist-info"
    fifo(info / "RECORD")
    fifo(info / "METADATA")
    fifo(info / "direct_url.json")
    index = DistIndex(Path)
    assert returns(lambda: index.claims(str(site / "evil" / "m.py"))) == []
    assert any("RECORD: unreadable (not a regular file: a FIFO)" in p for p in index.problems)
    assert any("METADATA: unreadable (not a regular file: a FIFO)" in p for p in index.problems)
    assert any("direct_url.json: skipped (not a regular file: a FIFO)" in p for p in index.problems)

    loaded = fifo(tmp_path / "loaded.py")
    got = returns(lambda: Hasher().hash_files([str(loaded)]))
    assert got[0].sha256 is None and got[0].error == "not a regular file: a FIFO"

    probe = tmp_path / "probe"
    for name in ("journal.jsonl", "bindings.jsonl", "counters.bin"):
        fifo(probe / name)
    assert returns(lambda: journal.read_file(probe / "journal.jsonl")) is None
    assert returns(lambda: BindingsReader().read(probe)) == ([], [])
    assert returns(lambda: counters.read_counters(probe / "counters.bin")) is None
    assert returns(lambda: counters.read_settled(probe / "counters.bin")) is None

    pyc = fifo(tmp_path / "m.cpython-311.pyc")
    for read in (pycfile.read_head, pycfile.read, pycfile.read_stable):
        with pytest.raises(NotRegular):
            returns(lambda read=read: read(pyc))  # type: ignore[misc]
    assert returns(lambda: unfiled._read_small(fifo(tmp_path / "x.pth"), 100)) is None
    assert returns(lambda: stdlib._pyvenv_home(fifo(tmp_path / "pyvenv.cfg"))) is None


MODULE = "import victim\n"


def test_an_agent_collects_a_process_whose_loaded_file_became_a_fifo(tmp_path: Path) -> None:
    """The attack end to end: a real probed interpreter imports a module, then its file is
    replaced by a FIFO; a real agent's collect returns and says why it has no digest."""
    src = tmp_path / "src"
    src.mkdir()
    victim = src / "victim.py"
    victim.write_text("X = 1\n")
    with spawn_probed(tmp_path, MODULE, src) as pid:
        victim.unlink()
        os.mkfifo(victim)
        config = AgentConfig("127.0.0.1:9", "t", "a", tmp_path / "spool", root_pid=pid,
                             docker_socket=None)  # fmt: skip
        agent = Agent(config)
        try:
            report = returns(agent.collect)
        finally:
            agent.channel.close()
    (proc,) = report.processes
    entry = next(f for f in proc.files or () if f.path == str(victim))
    assert entry.sha256  # the probe's digest, taken when it was loaded
    (disagreement,) = [d for d in proc.disagreements if d.path == str(victim)]
    assert disagreement.reason == "not a regular file: a FIFO", disagreement


def test_a_sparse_terabyte_where_a_loaded_file_was_is_not_read(tmp_path: Path) -> None:
    """A second attacker's variation: the loaded file replaced by a sparse file of 2 TB (no
    disk used, zeros for ever); the agent read it for hours. Each reader now sees the size
    first."""
    huge = tmp_path / "evilmod.py"
    huge.touch()
    os.truncate(huge, 2 << 40)
    (got,) = returns(lambda: Hasher().hash_files([str(huge)]))
    assert got.sha256 is None and got.error is not None and "not read" in got.error
    assert got.size == 2 << 40
    with pytest.raises(NotRegular, match="not read"):
        returns(lambda: pycfile.read(huge))
    with pytest.raises(NotRegular, match="not read"):
        returns(lambda: pycfile.read_stable(huge))
    assert returns(lambda: journal.read_file(huge)) is None
    with pytest.raises(NotRegular, match="larger than"):
        returns(lambda: read_regular(huge, 1 << 20))
