"""The test harness's vLLM server: a start that never becomes ready fails on its own limit,
saying where every process of the tree is stuck (its log tail and py-spy stacks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servewitness.testing.vllm_server import ServerError, VllmServer


def test_a_start_that_never_becomes_ready_fails_with_the_stacks_of_its_tree(
    tmp_path: Path,
) -> None:
    # Stands in for `python -m vllm...`: a parent that logs a line, starts a child and both
    # sleep, never answering /health (a hung engine start).
    fake = tmp_path / "python"
    fake.write_text(
        f"#!/bin/sh\necho started by the fake\nexec {sys.executable} -c "
        '\'import subprocess, sys, time; subprocess.Popen([sys.executable, "-c", '
        '"import time; time.sleep(60)"]); time.sleep(60)\'\n'
    )
    fake.chmod(0o755)
    server = VllmServer(tmp_path / "model", python=str(fake), ready_timeout_s=3.0)
    with pytest.raises(ServerError) as e:
        server.start()
    text = str(e.value)
    assert text.startswith("vLLM not ready after 3 s:\nstarted by the fake\n"), text
    assert text.count("--- py-spy dump --pid") == 2, text  # the fake and its child
    assert text.count("    <module> (<string>:1)") == 2, text  # each one's Python stack
    assert server.proc is None and server.scratch is None  # stopped and cleaned up
