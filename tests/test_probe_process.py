"""The probe in plain Python processes, read from outside by ``verifier inspect``.

Each test starts a real interpreter with the probe, lets it do its work, and inspects it
while it is still alive (it waits on stdin), exactly as an operator would.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers import hook_by_name, inspect_json, probe_env, state_dir, state_name

USER_MODULE = """
class Base:
    def __init__(self, x):
        self.x = x

class Runner(Base):
    def step(self):
        return self.x

    @staticmethod
    def util():
        return 1

def free():
    return 2
"""


@contextmanager
def child(
    tmp_path: Path, body: str, after: str = "", **env: str
) -> Iterator[subprocess.Popen[str]]:
    """Run BODY in a fresh interpreter; it prints READY when done and waits for stdin to close."""
    (tmp_path / "mods").mkdir(exist_ok=True)
    (tmp_path / "mods" / "usermod.py").write_text(USER_MODULE)
    script = textwrap.dedent(body) + "\nprint('READY', flush=True)\n" + textwrap.dedent(after)
    script += "\nimport sys; sys.stdin.read()\n"
    full_env = probe_env(tmp_path / "probe", PYTHONPATH=str(tmp_path / "mods"), **env)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"child did not get ready: {line!r}\n{err}")
        yield proc
    finally:
        proc.communicate(timeout=30)  # closes stdin: the child exits


def _one(pid: int) -> dict[str, Any]:
    (proc,) = inspect_json(pid)
    return proc


HOOKS = ",".join(
    [
        "step=usermod:Runner.step",
        "util=usermod:Runner.util",
        "free=usermod:free",
        "modonly=usermod",
        "absent=never_imported_mod:f",
        "nosuch=usermod:Runner.nosuch",
        "broken entry",
    ]
)


def test_declared_hooks_count_fires_and_explain_silence(tmp_path: Path) -> None:
    body = """
        import servewitness_probe as p
        p.start()
        import usermod
        r = usermod.Runner(1)
        for _ in range(5):
            r.step()
        usermod.Runner.util()
        usermod.free(); usermod.free()
    """
    with child(tmp_path, body, VERIFIER_HOOKS=HOOKS) as proc:
        info = _one(proc.pid)
    hooks = {h["name"]: h for h in info["hooks"]}
    assert (hooks["step"]["fired"], hooks["step"]["instantiated"]) == (5, True)
    assert hooks["step"]["instantiated_class"] == "usermod.Runner"
    assert hooks["step"]["status"] == "firing"
    assert hooks["util"]["fired"] == 1
    assert (hooks["free"]["fired"], hooks["free"]["instantiated"]) == (2, None)
    assert (hooks["modonly"]["module_loaded"], hooks["modonly"]["fired"]) == (True, 0)
    assert (hooks["absent"]["module_loaded"], hooks["absent"]["status"]) == (False, "not_loaded")
    assert hooks["nosuch"]["status"] == "unresolved"
    assert [e["msg"] for e in info["probe"]["errors"] if "broken entry" in e["msg"]] == [
        "entry 'broken entry': expected name=module:qualname or name=module"
    ]


def test_class_hook_never_instantiated_reads_not_instantiated(tmp_path: Path) -> None:
    body = """
        import servewitness_probe as p
        p.start()
        import usermod
    """
    with child(tmp_path, body, VERIFIER_HOOKS="step=usermod:Runner.step") as proc:
        h = hook_by_name(_one(proc.pid), "step")
    assert (h["module_loaded"], h["instantiated"], h["fired"], h["status"]) == (
        True,
        False,
        0,
        "not_instantiated",
    )


def test_hook_fire_cannot_credit_a_hook_declared_on_a_method(tmp_path: Path) -> None:
    """The attack (a black-box attacker, 2026-12-05): a hook declared on a class that is never
    instantiated (the runner that is not live), fired through the public API from code that
    does run (a sampler), read "fired N on N productive steps" and PASSed the shipped
    dead-hook policy. Now only the wrapper counts a method's or function's hook: the fires
    are refused, said as a probe error, and the hook stays not instantiated. A hook declared
    on a module alone is still the API's to fire (the control)."""
    body = """
        import servewitness_probe as p
        p.start()
        import usermod
        for _ in range(3):
            p.hook.fire("step")
            p.hook.fire("free")
            p.hook.fire("modonly")
        @p.hook("deco")
        def g():
            return 1
        g()
        p.hook.fire("deco")
    """
    hooks = "step=usermod:Runner.step,free=usermod:free,modonly=usermod"
    with child(tmp_path, body, VERIFIER_HOOKS=hooks) as proc:
        info = _one(proc.pid)
    step, free = hook_by_name(info, "step"), hook_by_name(info, "free")
    assert (step["fired"], step["instantiated"], step["status"]) == (0, False, "not_instantiated")
    assert free["fired"] == 0
    assert hook_by_name(info, "modonly")["fired"] == 3  # declared on a module: the API's
    assert hook_by_name(info, "deco")["fired"] == 1  # the decorated call, not the API's fire
    refused = [e["msg"] for e in info["probe"]["errors"] if "only its wrapper counts" in e["msg"]]
    assert {m.split()[0] for m in refused} == {"'step'", "'free'", "'deco'"}, refused


def test_a_method_called_on_an_object_never_constructed_is_not_live(tmp_path: Path) -> None:
    """The second attacker's variation: the wrapped method of the class that never runs,
    called on ``object.__new__(cls)`` (no constructor, so no instance is recorded), counted a
    fire per call and PASSed the dead-hook policy. An instance method's fires with no
    instance ever made are now not_instantiated, saying how many; a static method's fires
    need no instance (the control)."""
    body = """
        import servewitness_probe as p
        p.start()
        import usermod
        for _ in range(3):
            fake = object.__new__(usermod.Runner)
            fake.x = 0
            usermod.Runner.step(fake)
        usermod.Runner.util()
    """
    hooks = "step=usermod:Runner.step,util=usermod:Runner.util"
    with child(tmp_path, body, VERIFIER_HOOKS=hooks) as proc:
        info = _one(proc.pid)
    step, util = hook_by_name(info, "step"), hook_by_name(info, "util")
    assert (step["fired"], step["instantiated"], step["status"]) == (3, False, "not_instantiated")
    assert "fired 3 times, but class usermod.Runner was never instantiated" in step["why"]
    assert (util["fired"], util["status"]) == (1, "firing")


def test_hook_on_module_imported_before_the_probe_is_still_wrapped(tmp_path: Path) -> None:
    body = """
        import usermod
        import servewitness_probe as p
        p.start()
        usermod.free()
    """
    with child(tmp_path, body, VERIFIER_HOOKS="free=usermod:free") as proc:
        h = hook_by_name(_one(proc.pid), "free")
    assert (h["module_loaded"], h["fired"]) == (True, 1)


def test_api_fire_and_decorator_count_without_declaration(tmp_path: Path) -> None:
    body = """
        from servewitness_probe import hook
        @hook("decorated")
        def f():
            return 1
        for _ in range(3):
            f()
        for _ in range(7):
            hook.fire("manual")
    """
    with child(tmp_path, body) as proc:
        info = _one(proc.pid)
    assert hook_by_name(info, "decorated")["fired"] == 3
    assert hook_by_name(info, "decorated")["target"] == "__main__:f"
    assert hook_by_name(info, "manual")["fired"] == 7
    assert info["probe"]["mode"] == "lazy"


def _journal(tmp_path: Path, pid: int) -> list[dict[str, Any]]:
    d = state_dir(tmp_path / "probe", pid)
    return [json.loads(line) for line in (d / "journal.jsonl").read_text().splitlines()]


def test_import_records_hash_the_exact_bytes_read(tmp_path: Path) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "before_mod.py").write_text("X = 1\n")
    (tmp_path / "mods" / "after_mod.py").write_text("Y = 2\n")
    body = """
        import before_mod
        import servewitness_probe as p
        p.start()
        import after_mod
        import time; time.sleep(1.5)  # one sweep
    """
    with child(tmp_path, body, PYTHONDONTWRITEBYTECODE="1", VERIFIER_PROBE_KEEP="1") as proc:
        records = [r for r in _journal(tmp_path, proc.pid) if r.get("k") == "file"]
    by_module = {r["module"]: r for r in records}
    after, before = by_module["after_mod"], by_module["before_mod"]
    assert (after["at"], after["kind"]) == ("load", "source")
    assert after["sha256"] == hashlib.sha256(b"Y = 2\n").hexdigest()
    assert (before["at"], before["sha256"]) == ("snapshot", hashlib.sha256(b"X = 1\n").hexdigest())


def test_early_bootstrap_sees_imports_before_any_plugin(tmp_path: Path) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "first_mod.py").write_text("Z = 3\n")
    body = """
        import first_mod
    """
    with child(tmp_path, body, VERIFIER_PROBE_EARLY="1", PYTHONDONTWRITEBYTECODE="1") as proc:
        info = _one(proc.pid)
        records = [r for r in _journal(tmp_path, proc.pid) if r.get("module") == "first_mod"]
    assert info["probe"]["mode"] == "early"
    assert [(r["at"], r["sha256"]) for r in records] == [
        ("load", hashlib.sha256(b"Z = 3\n").hexdigest())
    ]


def test_forked_child_gets_its_own_counters_and_inherits_the_manifest(tmp_path: Path) -> None:
    body = """
        import os, sys
        from servewitness_probe import hook
        import servewitness_probe as p
        p.start()
        hook.fire("h")
        import time; time.sleep(1.5)  # the sweeper has described the parent's modules
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            for _ in range(3):
                hook.fire("h")
            os.write(w, b"x")
            sys.stdin.read()
            os._exit(0)
        os.read(r, 1)
    """
    with child(tmp_path, body, after="print(pid, flush=True)") as proc:
        assert proc.stdout is not None
        child_pid = int(proc.stdout.readline())
        parent, forked = _one(proc.pid), _one(child_pid)
    assert hook_by_name(parent, "h")["fired"] == 1
    assert hook_by_name(forked, "h")["fired"] == 3
    assert forked["probe"]["mode"] == "fork"
    assert forked["manifest"]["files"] == parent["manifest"]["files"] > 0


def test_state_directory_is_removed_at_exit_and_dead_ones_collected(tmp_path: Path) -> None:
    probe_dir = tmp_path / "probe"
    boot, pid_ns = state_name(os.getpid()).split("-")[:2]  # the child's boot and namespace
    (probe_dir / f"{boot}-{pid_ns}-999999999-1").mkdir(parents=True)  # a pid that cannot exist
    code = (
        "import json, os, servewitness_probe as p; p.start()\n"
        "print(json.dumps([os.getpid(), os.listdir(os.environ['VERIFIER_PROBE_DIR'])]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=probe_env(probe_dir),
        check=True,
    )
    pid, listed = json.loads(out.stdout)
    assert len(listed) == 1 and listed[0].split("-")[:3] == [boot, pid_ns, str(pid)]
    assert os.listdir(probe_dir) == []
