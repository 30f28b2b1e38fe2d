"""First-hit hooks in a real probed interpreter (Python 3.11: the one-shot wrapper): the hook
fires exactly once however often the function runs, and the original function is back in
place after the first call (it costs nothing afterwards)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import hook_by_name, inspect_json, probe_env

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
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
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
