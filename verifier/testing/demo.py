"""The demo: a live vLLM server, one dead hook and one live hook, told apart by evidence.

    python -m verifier.testing.demo [--model DIR] [--requests N]

Starts a real vLLM server on the CPU with the tiny model and three declared hooks:

* ``v2_step`` on the V2 runner's step method: its module is imported by the worker on this
  CPU build, but the V2 runner is never instantiated, so it can never fire;
* ``v1_step`` on the V1 runner's step method, the runner that is live here;
* ``user_step`` in a user's own module that vLLM never imports.

Sends requests, prints ``verifier inspect --tree`` for the server's process tree, then stops
everything and removes every file it made (scratch directory, probe state, vLLM sockets).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from verifier.testing.server import VllmServer, _group_alive

REPO = Path(__file__).resolve().parents[2]
USER_MODULE = '''"""A user's hook module; vLLM never imports it."""
from verifier.probe import hook


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
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "verifier"]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verifier.testing.demo", description=__doc__)
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "tiny-llama")
    parser.add_argument("--requests", type=int, default=6)
    args = parser.parse_args(argv)
    if not (args.model / "config.json").exists():
        print(f"demo: no model in {args.model}; run `make model` first", file=sys.stderr)
        return 3
    t0 = time.monotonic()
    scratch_parent = REPO / ".scratch"
    server = VllmServer(args.model, scratch_parent=scratch_parent)
    user_dir = scratch_parent / "demo-user-hooks"
    user_dir.mkdir(parents=True, exist_ok=True)
    (user_dir / "demo_user_hooks.py").write_text(USER_MODULE)
    server.env = {
        "VERIFIER_HOOKS": ",".join(f"{k}={v}" for k, v in HOOKS.items()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(user_dir), os.environ.get("PYTHONPATH")])),
    }
    _say("== Declared hooks (VERIFIER_HOOKS) ==")
    for name, target in HOOKS.items():
        _say(f"  {name:<10} {target}")
    _say("\n== Starting vLLM (CPU, tiny random-weight Llama; about 45 s) ==")
    pgid = 0
    try:
        server.start()
        pgid = server.pid
        _say(f"ready after {time.monotonic() - t0:.0f} s: API server pid {server.pid}")
        _say(f"\n== Sending {args.requests} requests ==")
        for i in range(args.requests):
            out = server.complete(f"hello world {i} the engine", max_tokens=8)
            _say(f"  request {i}: {out['usage']['completion_tokens']} tokens")
        time.sleep(0.5)
        _say(f"\n== verifier inspect --pid {server.pid} --tree ==")
        _say(_inspect(server.pid).stdout)
        procs = json.loads(_inspect(server.pid, "--json").stdout)["processes"]
        _say("== What this shows ==")
        for line in _summary(procs):
            _say("  " + line)
        _say("  An empty trace from v2_step would have looked like a quiet run; the evidence")
        _say("  says the hook's class was never instantiated while the engine stepped.")
    finally:
        _say("\n== Stopping and cleaning up ==")
        server.stop()
        for path in sorted(user_dir.glob("**/*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        user_dir.rmdir()
        if scratch_parent.exists() and not any(scratch_parent.iterdir()):
            scratch_parent.rmdir()
    stray = pgid and _group_alive(pgid)
    _say(f"  processes left: {'SOME (bug)' if stray else 'none'}; scratch removed")
    _say(f"done in {time.monotonic() - t0:.0f} s")
    return 1 if stray else 0


if __name__ == "__main__":
    raise SystemExit(main())
