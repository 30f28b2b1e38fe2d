"""An error nothing expects while one process's evidence is read (the workload writes its own
journal, and a reader's bug is a workload's lever) is said as what could not be seen, and the
other processes are still read: it never ends the agent's collect."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from servewitness.agent.discover import discover
from servewitness.evidence.procfs import ProcFS


@pytest.fixture
def two_vllm_looking_children() -> Iterator[list[int]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()", f"vllm-{i}"],
            stdin=subprocess.PIPE,
        )
        for i in range(2)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            if p.stdin is not None:
                p.stdin.close()


def test_one_process_whose_reading_raises_is_said_and_the_other_is_read(
    two_vllm_looking_children: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    bad, good = two_vllm_looking_children
    from servewitness.evidence.process import read_process as real

    def read(procfs: ProcFS, pid: int, cache: Any = None) -> Any:
        if pid == bad:
            raise RecursionError("maximum recursion depth exceeded (a hostile journal)")
        return real(procfs, pid, cache)

    monkeypatch.setattr("servewitness.agent.discover.read_process", read)
    refused: list[str] = []
    found = discover(ProcFS(), os.getpid(), None, refused)
    assert [ev.identity.pid for ev in found] == [good]
    assert len(refused) == 1 and f"pid {bad}" in refused[0]
    assert "RecursionError" in refused[0] and "could not be read" in refused[0]


def test_what_the_caller_stops_is_not_swallowed(
    two_vllm_looking_children: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """KeyboardInterrupt and SystemExit (an operator's Ctrl-C, a shutdown) still stop it."""

    def read(procfs: ProcFS, pid: int, cache: Any = None) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("servewitness.agent.discover.read_process", read)
    with pytest.raises(KeyboardInterrupt):
        discover(ProcFS(), os.getpid(), None, [])
