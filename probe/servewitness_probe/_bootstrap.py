"""Early start, run from ``servewitness_probe_early.pth`` at interpreter start-up.

The ``.pth`` line imports this module only when ``VERIFIER_PROBE_EARLY`` is set to a value
other than ``0``, so an unset variable costs one environment lookup per interpreter start.
Imports that happen before vLLM loads its plugins are then recorded at load time too.
"""

from __future__ import annotations

from servewitness_probe._plugin import start

start("early")
