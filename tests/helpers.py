"""Shared test helpers: run the real CLI, read evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def verifier_cli(
    *args: str, check: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``verifier`` console script."""
    exe = VENV_BIN / "verifier"
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-m", "verifier", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)


def inspect_json(pid: int, tree: bool = False) -> list[dict[str, Any]]:
    args = ["inspect", "--pid", str(pid), "--json"] + (["--tree"] if tree else [])
    out = verifier_cli(*args)
    assert out.returncode == 0, out.stderr
    data: dict[str, list[dict[str, Any]]] = json.loads(out.stdout)
    return data["processes"]


def hook_by_name(proc: dict[str, Any], name: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [h for h in proc["hooks"] if h["name"] == name]
    assert len(matches) == 1, f"hook {name!r} in {[h['name'] for h in proc['hooks']]}"
    return matches[0]


def probe_env(probe_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("VERIFIER_HOOKS", "VERIFIER_PROBE_EARLY", "VERIFIER_PROBE_DISABLE"):
        env.pop(key, None)
    env["VERIFIER_PROBE_DIR"] = str(probe_dir)
    env.update(extra)
    return env
