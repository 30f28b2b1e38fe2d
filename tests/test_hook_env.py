"""The hooks a process declared are the ones its server was started with (``agent/hookenv.py``).

The attack (a black-box attacker, 2026-12-05): a sitecustomize rewrote
``os.environ["VERIFIER_HOOKS"]`` in the server before the probe read it, moving the policy's
``v2_step`` from the V2 runner's method (never run on the CPU build) to the V1 runner's (run
on every step): the shipped dead-hook policy PASSed. /proc/<pid>/environ keeps what the
process was started with; a real agent compares. Real probed interpreters, a real agent."""

from __future__ import annotations

import sys
import textwrap
from contextlib import AbstractContextManager
from pathlib import Path

from servewitness.agent.hookenv import declared
from tests.helpers import collect_once, probe_env, stand_in

MODULE = "class Runner:\n    def step(self):\n        return 1\n\ndef free():\n    return 2\n"
STARTED = "step=usermod:Runner.step,modonly=usermod"


def probed(tmp_path: Path, before_probe: str) -> AbstractContextManager[int]:
    """A probed interpreter started with VERIFIER_HOOKS=STARTED whose code runs BEFORE_PROBE
    before the probe starts (as a sitecustomize would), then imports the module."""
    (tmp_path / "mods").mkdir(exist_ok=True)
    (tmp_path / "mods" / "usermod.py").write_text(MODULE)
    script = textwrap.dedent(before_probe) + textwrap.dedent("""
        import servewitness_probe as p
        p.start()
        import usermod
        usermod.free()
        print("up", flush=True)
        import sys; sys.stdin.read()
    """)  # fmt: skip
    env = probe_env(tmp_path / "probe", PYTHONPATH=str(tmp_path / "mods"), VERIFIER_HOOKS=STARTED)
    return stand_in([sys.executable, "-c", script, "vllm-stand-in"], env=env)


def said(pid: int, tmp_path: Path) -> list[str]:
    report = collect_once(pid, tmp_path / "spool")
    return [w for w in report.unobservable if w.startswith("hook ")]


def test_hooks_as_started_say_nothing(tmp_path: Path) -> None:
    with probed(tmp_path, "") as pid:
        assert said(pid, tmp_path) == []


def test_a_hook_moved_to_another_target_in_process_is_said(tmp_path: Path) -> None:
    rewrite = 'import os; os.environ["VERIFIER_HOOKS"] = "step=usermod:free,modonly=usermod"\n'
    with probed(tmp_path, rewrite) as pid:
        (moved,) = said(pid, tmp_path)
    assert moved == (
        f"hook step is declared in pid {pid} on usermod:free, but the server (pid {pid}) was "
        "started with step=usermod:Runner.step: the process changed what the hook means"
    )


def test_a_hook_the_process_added_is_said(tmp_path: Path) -> None:
    add = f'import os; os.environ["VERIFIER_HOOKS"] = "{STARTED},extra=usermod:free"\n'
    with probed(tmp_path, add) as pid:
        (added,) = said(pid, tmp_path)
    assert added.startswith(f"hook extra is declared in pid {pid} on usermod:free, but the server")
    assert added.endswith(
        "was started without it in VERIFIER_HOOKS: the process declared its own hook"
    )


def test_the_declarations_a_value_makes() -> None:
    assert declared(" a=m:C.f , b=m ,bad, =x, c= ") == {"a": "m:C.f", "b": "m"}
    assert declared("a=m:f@device,a=m:g") == {"a": "m:f@device"}  # the first, as the probe
