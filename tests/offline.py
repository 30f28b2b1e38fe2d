"""vLLM as a library in a child script (tests/data/offline_llm.py), for the offline and
protocol tests: started once per module, commanded through files, its whole process group
stopped at the end with its scratch directory."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from servewitness import wire
from servewitness.model import Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.conftest import V1_SAMPLE, V1_STEP, V2_STEP
from tests.helpers import REPO, inspect_json, wait_ready

SCRIPT = REPO / "tests" / "data" / "offline_llm.py"
HOOKS = {
    "step": V1_STEP,  # the live runner's execute_model
    "sample": V1_SAMPLE,  # ... and its sample_tokens (the second phase of each step)
    "v2_step": V2_STEP,  # a runner class the CPU build never instantiates
    "user_step": "verifier_user_hook:on_step",  # a module nobody imports here
}
HOOK_ENV = {"VERIFIER_HOOKS": ",".join(f"{k}={v}" for k, v in HOOKS.items())}
CPU_RUNNER = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"


class OfflineScript:
    """One offline_llm.py process (and whatever vLLM starts under it)."""

    def __init__(
        self, model: Path, mode: str = "generate", env: dict[str, str] | None = None, *args: str
    ) -> None:
        self.model, self.mode, self.args = model, mode, args
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.scratch = Path(tempfile.mkdtemp(prefix="offline-", dir=_scratch_parent()))
        self.state = self.scratch / "state"
        self.state.mkdir()
        self.ready: dict[str, Any] = {}
        self._n = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 300) -> OfflineScript:
        env = dict(os.environ)
        for key in ("VERIFIER_HOOKS", "VERIFIER_PROBE_EARLY", "VERIFIER_PROBE_DISABLE"):
            env.pop(key, None)
        for key in ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
            env[key] = str(self.scratch / key.lower())
            Path(env[key]).mkdir()
        env["VERIFIER_PROBE_DIR"] = str(self.scratch / "probe")
        env.update(self.extra_env)
        cmd = [sys.executable, str(SCRIPT), str(self.model), str(self.state), self.mode]
        log = (self.scratch / "script.log").open("wb")
        self.proc = subprocess.Popen(
            [*cmd, *self.args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.scratch,
        )
        log.close()
        try:
            wait_ready(self.proc, self.state / "ready.json", timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.log_tail()}") from None
        self.ready = json.loads((self.state / "ready.json").read_text())
        return self

    def command(self, what: str, timeout: float = 120) -> dict[str, Any]:
        """Run WHAT (``generate`` or ``direct``) in the script; its result."""
        n, self._n = self._n, self._n + 1
        (self.state / f"go-{n}").write_text(what)
        assert self.proc is not None
        wait_ready(self.proc, self.state / f"done-{n}.json", timeout)
        out: dict[str, Any] = json.loads((self.state / f"done-{n}.json").read_text())
        assert "error" not in out, out
        return out

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = (self.scratch / "script.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def inspect(self) -> dict[str, Any]:
        """``verifier inspect --pid <script> --tree --json``: the whole document."""
        from tests.helpers import verifier_cli

        out = verifier_cli("inspect", "--pid", str(self.pid), "--tree", "--json")
        assert out.returncode == 0, out.stderr
        doc: dict[str, Any] = json.loads(out.stdout)
        return doc

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and _group_alive(self.proc.pid):
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            if self.proc.poll() is None:
                self.proc.wait(timeout=10)
            self.proc = None
        shutil.rmtree(self.scratch, ignore_errors=True)


def _scratch_parent() -> Path:
    p = REPO / ".scratch"
    p.mkdir(exist_ok=True)
    return p


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def verdict(procs: list[dict[str, Any]], policy: str, target: str = "offline") -> Any:
    """The real policy engine on the reports inside inspect's JSON."""
    reports = [wire.process_from_json(p["report"]) for p in procs]
    snap = TargetSnapshot(target, tuple(reports), time.time())
    return load_policy(policy).evaluate_target(snap, now=snap.received_unix)


def ids(v: Any) -> list[str]:
    return [f.id for f in v.findings]


def passes(v: Any) -> bool:
    return bool(v.verdict == Verdict.PASS)


def by_role(procs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    (p,) = [p for p in procs if p["role"] == role]
    return p


def delta(before: dict[str, Any], after: dict[str, Any], key: str) -> int:
    return int(after["steps"][key]) - int(before["steps"][key])


def inspect_procs(pid: int) -> list[dict[str, Any]]:
    return inspect_json(pid, tree=True)
