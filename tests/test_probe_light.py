"""The probe imports nothing heavy and never configures logging (vLLM owns those processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = [
    "torch",
    "grpc",
    "docker",
    "structlog",
    "psutil",
    "vllm",
    "servewitness._cli",
    "servewitness.evidence",
]


def test_importing_and_starting_the_probe_pulls_in_nothing_heavy(tmp_path: Path) -> None:
    code = (
        "import json, sys, logging\n"
        "import servewitness_probe as p\n"
        "assert p.start('test')\n"
        "p.hook.fire('x')\n"
        f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))\n"
        "print(json.dumps(logging.getLogger().handlers == []))\n"
    )
    env = {"VERIFIER_PROBE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    loaded, no_handlers = (json.loads(line) for line in out.stdout.splitlines())
    assert loaded == {m: False for m in HEAVY}
    assert no_handlers is True


def test_the_plugin_entry_point_is_registered_for_vllm() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("verifier_probe") == "servewitness_probe:register"


def test_disabled_probe_writes_nothing(tmp_path: Path) -> None:
    code = "import servewitness_probe as p; print(p.start('test'))"
    env = {"VERIFIER_PROBE_DIR": str(tmp_path), "VERIFIER_PROBE_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "False"
    assert list(tmp_path.iterdir()) == []
