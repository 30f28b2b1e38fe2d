"""The children a probed process's own code starts, journaled by its probe
(``servewitness_probe/_children.py``) and reported by the agent (``ProcessReport.children``):
what ``all_code_claimed``'s "started by its parent" rests on. Built for real, with the probe
started as vLLM's plugin starts it (after ``subprocess`` was imported, which binds
``fork_exec`` at its import) and as the early probe does: each way a Python process starts
another is journaled with the child's pid and start ticks, and a process the parent did not
start (its sibling's) is not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import probe_env, probed_report

STARTS = {
    "subprocess": "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "pid = p.pid",
    "multiprocessing_spawn": "import multiprocessing as mp\n"
    "c = mp.get_context('spawn').Process(target=time.sleep, args=(60,)); c.start()\n"
    "pid = c.pid",
    "os_fork": "pid = os.fork()\nif pid == 0:\n    time.sleep(60); os._exit(0)",
    "posix_spawn": "pid = os.posix_spawn(sys.executable, [sys.executable, '-c', "
    "'import time; time.sleep(60)'], dict(os.environ))",
}


@pytest.mark.parametrize("early", [False, True], ids=["plugin", "early"])
@pytest.mark.parametrize("how", sorted(STARTS))
def test_each_way_of_starting_a_child_is_journaled(tmp_path: Path, how: str, early: bool) -> None:
    out, pidfile = tmp_path / "out", tmp_path / "child.pid"
    start = "" if early else "from servewitness_probe import _plugin; _plugin.start('plugin')\n"
    script = (
        "import os, subprocess, sys, time\n"  # subprocess first, as in vLLM
        + start
        + STARTS[how]
        + "\nticks = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[19]\n"
        + f"open({str(pidfile)!r}, 'w').write(f'{{pid}} {{ticks}}')\n"
        + "open(sys.argv[1], 'w').write('ready')\n"
        + "time.sleep(600)\n"
    )
    extra = {"VERIFIER_PROBE_EARLY": "1"} if early else {}
    env = probe_env(tmp_path / "probe", PYTHONDONTWRITEBYTECODE="1", **extra)
    _, report = probed_report([sys.executable, "-c", script, str(out)], env, out)
    child, ticks = map(int, pidfile.read_text().split())  # the child was killed with its group
    assert report.children is not None
    assert (child, ticks) in report.children, (child, ticks, report.children)


def test_a_process_without_children_reports_an_empty_record(tmp_path: Path) -> None:
    """Known and empty (``()``), not unknown (``None``), for a probed process."""
    out = tmp_path / "out"
    script = "import sys, time\nopen(sys.argv[1], 'w').write('ready')\ntime.sleep(600)\n"
    env = probe_env(tmp_path / "probe", PYTHONDONTWRITEBYTECODE="1", VERIFIER_PROBE_EARLY="1")
    _, report = probed_report([sys.executable, "-c", script, str(out)], env, out)
    assert report.children == ()
