"""First-hit hooks in a real probed interpreter: the hook fires exactly once however often the
function runs, and costs nothing afterwards. On Python 3.11 (this project's interpreter) by the
one-shot wrapper, whose original function is back in place after the first call; on Python >=
3.12 by ``sys.monitoring`` (the probe is stdlib-only, so it runs there from the source tree)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, hook_by_name, inspect_json, probe_env, wait_ready

MODULE = """\
class Runner:
    def step(self, x):
        return x + 1

    @staticmethod
    def helper(x):
        return x * 2


def free(x):
    return x - 1
"""

SCRIPT = """\
import sys, time
import fhmod
r = fhmod.Runner()
for i in range(5):
    r.step(i)
    fhmod.Runner.helper(i)
    fhmod.free(i)
restored = (
    not getattr(fhmod.free, "__verifier_probe__", False)
    and not getattr(fhmod.Runner.__dict__["helper"].__func__, "__verifier_probe__", False)
)
time.sleep(1.5)
open(sys.argv[1], "w").write(str(restored))
time.sleep(600)
"""


def test_first_hit_hooks_fire_once_and_step_aside(tmp_path: Path) -> None:
    (tmp_path / "fhmod.py").write_text(MODULE)
    ready = tmp_path / "ready"
    hooks = (
        "m=fhmod:Runner.step@first,s=fhmod:Runner.helper@first,f=fhmod:free@first,"
        "every=fhmod:Runner.step"
    )
    env = probe_env(
        tmp_path / "probe", VERIFIER_PROBE_EARLY="1", VERIFIER_HOOKS=hooks, PYTHONPATH=str(tmp_path)
    )
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ready)], env=env)
    try:
        wait_ready(proc, ready, 60)
        [p] = inspect_json(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert ready.read_text() == "True"  # the originals are back after their first call
    for name in ("m", "s", "f"):
        h = hook_by_name(p, name)
        assert (h["fired"], h["status"]) == (1, "firing"), (name, h)
    # an ordinary hook on the same method, wrapped around the first-hit one, still counts
    # every call (the first-hit wrapper then passes through instead of unwrapping itself)
    assert hook_by_name(p, "every")["fired"] == 5


SCRIPT_312 = """\
import servewitness_probe._bootstrap  # the .pth of this project's venv is not on this interpreter
import json, sys, time
import fhmod
before = not getattr(fhmod.free, "__verifier_probe__", False)  # monitoring wraps nothing
r = fhmod.Runner()
for i in range(5):
    r.step(i)
    fhmod.free(i)
tools = [sys.monitoring.get_tool(t) for t in range(6)]
time.sleep(1.5)
open(sys.argv[1], "w").write(json.dumps({"unwrapped": before, "tools": tools,
                                         "version": list(sys.version_info[:2])}))
time.sleep(600)
"""


def python_312_or_later() -> str | None:
    """An interpreter of Python >= 3.12 on this machine (PATH, then pyenv), or None."""
    names = [f"python3.{m}" for m in range(12, 20)]
    found = [shutil.which(n) for n in names]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found += [str(p) for p in sorted(root.glob("3.1[2-9]*/bin/python3"))]
    for exe in filter(None, found):
        check = [exe, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"]
        if subprocess.run(check, capture_output=True, check=False).returncode == 0:
            return exe
    return None


def test_first_hit_via_sys_monitoring_on_312(tmp_path: Path) -> None:
    exe = python_312_or_later()
    if exe is None:
        pytest.skip(
            "no Python >= 3.12 interpreter on this machine (looked for python3.12+ on PATH and "
            "under pyenv): the sys.monitoring first-hit path cannot run on 3.11"
        )
    (tmp_path / "fhmod.py").write_text(MODULE)
    ready = tmp_path / "ready"
    hooks = "m=fhmod:Runner.step@first,f=fhmod:free@first,every=fhmod:Runner.step"
    env = probe_env(
        tmp_path / "probe",
        VERIFIER_HOOKS=hooks,
        PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]),
        VERIFIER_PROBE_KEEP="1",
    )
    proc = subprocess.Popen([exe, "-c", SCRIPT_312, str(ready)], env=env, cwd=tmp_path)
    try:
        wait_ready(proc, ready, 60)
        [p] = inspect_json(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    seen = json.loads(ready.read_text())
    assert seen["version"] >= [3, 12]
    assert seen["unwrapped"] is True  # armed without a wrapper
    assert "verifier-probe" in seen["tools"]  # a sys.monitoring tool id held by the probe
    assert p["probe"]["present"] and p["probe"]["errors"] == []
    for name in ("m", "f"):
        h = hook_by_name(p, name)
        assert (h["fired"], h["status"]) == (1, "firing"), (name, h)
    assert hook_by_name(p, "every")["fired"] == 5  # an ordinary hook still counts every call
    (journal,) = (tmp_path / "probe").glob("*/journal.jsonl")
    records = [json.loads(line) for line in journal.read_text().splitlines() if line]
    armed = {r["name"]: r["via"] for r in records if r.get("k") == "first_hit_armed"}
    assert armed == {"m": "monitoring", "f": "monitoring"}
    assert sorted(r["name"] for r in records if r.get("k") == "first_hit") == ["f", "m"]
