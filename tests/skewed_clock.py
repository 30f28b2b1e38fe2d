"""Run the ``verifier`` CLI with its wall clock SKEW seconds off (environment ``SKEW``), as a
verifier on a host whose clock jumped would see it: ``time.time`` and ``time.time_ns`` move
in every ``servewitness`` module (gRPC's own timers, and CLOCK_BOOTTIME, which the verifier
ages evidence on, do not). Used as ``python tests/skewed_clock.py serve ...``."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import time
import types

SKEW = float(os.environ.get("SKEW", "0"))


def main() -> int:
    import servewitness

    for m in pkgutil.walk_packages(servewitness.__path__, "servewitness."):
        if not any(x in m.name for x in ("testing", "_pb2", "__main__")):
            importlib.import_module(m.name)
    real_time, real_ns = time.time, time.time_ns
    shifted = types.ModuleType("time")
    shifted.__dict__.update(time.__dict__)
    shifted.time = lambda: real_time() + SKEW  # type: ignore[attr-defined]
    shifted.time_ns = lambda: real_ns() + int(SKEW * 1e9)  # type: ignore[attr-defined]
    for name, mod in list(sys.modules.items()):
        if not name.startswith("servewitness") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if value is time:
                setattr(mod, attr, shifted)
            elif value is real_time:
                setattr(mod, attr, shifted.time)
    from servewitness._cli.main import main as cli

    sys.argv[0] = "verifier"
    return cli()


if __name__ == "__main__":
    sys.exit(main())
