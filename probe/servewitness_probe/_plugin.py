"""Probe start-up: the vLLM general-plugin entry point and the early bootstrap.

``register()`` is what vLLM calls (entry point ``verifier_probe`` in group
``vllm.general_plugins``) in every process it creates; it may be called more than once per
process. It is idempotent per pid, cheap (no hashing on the caller's thread) and never raises.
Set ``VERIFIER_PROBE_DISABLE=1`` to make it a no-op.
"""

from __future__ import annotations

import os

from servewitness_probe import (
    _children,
    _core,
    _hooks,
    _imports,
    _integrity,
    _loaders,
    _startup,
    _vllm,
    _zips,
)
from servewitness_probe import layout as L

_started_pid = 0


def start(mode: str = "api") -> bool:
    """Start the probe in this process (idempotent per pid). Returns whether it is running."""
    global _started_pid
    try:
        if _core.disabled():
            return False
        if _started_pid == os.getpid():
            return True
        _started_pid = os.getpid()
        _core.state(mode)
        _children.install()
        _imports.install()
        _zips.install()
        _loaders.install()
        _startup.install()
        _integrity.take(watch_hooks=mode == "early")  # the import system, wrappers and all
        _startup.record_main(early=mode == "early")
        _imports.record_interp()
        _imports.start_sweeper()
        _core.on_fork(_imports.start_sweeper)
        _vllm.install()
        _hooks.apply_env(os.environ.get(L.ENV_HOOKS, ""))
        return True
    except Exception as e:  # noqa: BLE001 - must never break the host process
        try:
            _core.report_error("start", f"{type(e).__name__}: {e}")
        except Exception:  # noqa: BLE001
            pass
        return False


def register() -> None:
    """vLLM general-plugin entry point."""
    start("plugin")
