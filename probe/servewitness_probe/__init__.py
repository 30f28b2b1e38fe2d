"""The in-process probe: evidence from inside a live vLLM process.

Stdlib only; imports nothing heavy (tested in a fresh interpreter). Public surface:

* ``hook``: ``hook.fire("name")`` and ``@hook("name")`` (see ``_hooks``).
* ``register()``: the ``vllm.general_plugins`` entry point.
* ``start()``: start the probe explicitly (idempotent per process).

Nothing here raises into the host process.
"""

from __future__ import annotations

from servewitness_probe._hooks import HookAPI, hook
from servewitness_probe._plugin import register, start

__all__ = ["HookAPI", "hook", "register", "start"]
