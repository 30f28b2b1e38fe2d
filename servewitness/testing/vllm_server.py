"""Start and stop a real vLLM OpenAI server on the CPU for tests, the demo and benchmarks.

Every file vLLM leaves behind (sockets, caches, temp files, probe state) goes into one scratch
directory that ``stop()`` removes; the whole process group is terminated, then killed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

DEFAULT_ARGS = (
    "--enforce-eager",
    "--dtype",
    "float32",
    "--max-model-len",
    "256",
    "--kv-cache-memory-bytes",
    "64M",
)


class ServerError(RuntimeError):
    """The server did not come up (the message carries the tail of its log)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VllmServer:
    """A vLLM server process group with its own scratch directory."""

    model: Path
    env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    python: str = sys.executable
    scratch_parent: Path | None = None
    ready_timeout_s: float = 300.0
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    scratch: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _scratch(self) -> Path:
        if self.scratch is None:
            raise ServerError("server not started")
        return self.scratch

    @property
    def probe_dir(self) -> Path:
        return self._scratch() / "probe"

    @property
    def log_path(self) -> Path:
        return self._scratch() / "server.log"

    @property
    def pid(self) -> int:
        """Pid of the API server (the root of the vLLM process tree)."""
        if self.proc is None:
            raise ServerError("server not started")
        return self.proc.pid

    def start(self) -> VllmServer:
        if self.scratch_parent is not None:
            self.scratch_parent.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="vllm-", dir=self.scratch_parent))
        self.port = self.port or free_port()
        env = dict(os.environ)
        for key in ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
            env[key] = str(self.scratch / key.lower())
            Path(env[key]).mkdir()
        env.setdefault("VERIFIER_PROBE_DIR", str(self.probe_dir))
        env.update(self.env)
        if env.get("VLLM_CPU_KVCACHE_SPACE") == "":
            del env["VLLM_CPU_KVCACHE_SPACE"]  # an empty value breaks vLLM's CPU backend
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model)]
        cmd += [*DEFAULT_ARGS, "--port", str(self.port), "--host", "127.0.0.1", *self.extra_args]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.scratch,
        )
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        if self.proc is None:
            raise ServerError("server not started")
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                # Our own http://127.0.0.1 URL, never a user-supplied scheme.
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        return
            # not up yet; a connect to a free port of the ephemeral range can meet itself and
            # read its own request back (http.client.BadStatusLine)
            except (urllib.error.URLError, OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        raise ServerError(
            f"vLLM not ready after {self.ready_timeout_s:.0f} s:\n{self.log_tail()}\n"
            f"{tree_stacks(self.proc.pid)}"
        )

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def complete(
        self,
        prompt: str,
        max_tokens: int = 8,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """One greedy /v1/completions request (HEADERS added to it, e.g. ``X-Request-Id``);
        returns the decoded JSON body."""
        body = {
            "model": str(self.model),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            **extra,
        }
        req = urllib.request.Request(  # noqa: S310 - our own http URL
            self.base_url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - our own http URL
            out: dict[str, Any] = json.loads(r.read())
        return out

    def stop(self, grace_s: float = 20.0) -> None:
        """Terminate the process group, kill what is left, remove the scratch directory."""
        if self.proc is not None:
            pgid = self.proc.pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
            # Children (engine core, workers) may outlive the API server briefly.
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            if self.proc.poll() is None:
                self.proc.wait(timeout=10)
            self.proc = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def tree_stacks(root: int) -> str:
    """Every thread's Python stack in ROOT and every process under it (py-spy), to say where
    a start that never became ready is stuck: the probe, vLLM, or the machine."""
    from servewitness.evidence.procfs import ProcFS
    from servewitness.evidence.stacks import py_spy

    exe = py_spy()
    if exe is None:
        return "(no py-spy to show the stacks)"
    parts = []
    for pid in ProcFS().descendants(root):
        try:
            out = subprocess.run(
                [exe, "dump", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            parts.append(f"--- py-spy dump --pid {pid} (exit {out.returncode})\n{out.stdout}")
            if out.returncode != 0:
                parts.append(out.stderr.strip())
        except (OSError, subprocess.TimeoutExpired) as e:
            parts.append(f"--- pid {pid}: py-spy failed: {e}")
    return "\n".join(parts)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
