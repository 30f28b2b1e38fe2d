"""First-hit hooks: evidence that a function ran at least once, at no cost afterwards.

``name=module:qualname@first`` in ``VERIFIER_HOOKS`` declares one. Its hook fires exactly
once, on the function's first call, recording the step it happened in (and the step's
phase, like any fire); then the probe gets out of the way:

* Python >= 3.12: a ``sys.monitoring`` ``PY_START`` event on the function's code object,
  whose callback returns ``DISABLE`` (the interpreter stops reporting that code at all);
* Python 3.11 (this project's interpreter): a one-shot wrapper that puts the original
  function back on its owner before calling it (if another wrapper was put around it since,
  e.g. an ordinary hook on the same function, it stays and this one just passes through).

Either way the function carries no counter after its first call; a count of every call
needs an ordinary hook.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from servewitness_probe import _code, _core

_TOOL_NAME = "verifier-probe"
Fire = Callable[[int], None]  # counts one fire of the hook whose slots start at its argument
# 3.12+: code object -> (how to fire, slot base, hook name)
_by_code: dict[Any, tuple[Fire, int, str]] = {}
_tool: int | None = None


def _hit(fire: Fire, base: int, name: str) -> None:
    try:
        fire(base)
        _core.state().remember({"k": "first_hit", "name": name})
    except Exception as e:  # noqa: BLE001 - a probe never raises into the hooked code
        _core.report_error("first_hit", f"{name!r}: {type(e).__name__}: {e}")


def _monitoring_tool() -> int | None:
    """A sys.monitoring tool id for the probe (3.12+), or None where there is none free."""
    global _tool
    mon = getattr(sys, "monitoring", None)
    if mon is None:
        return None
    if _tool is None:
        for tool in range(6):  # ids 0-5 are for tools; 0 is the debugger's by convention
            if tool != 0 and mon.get_tool(tool) is None:
                mon.use_tool_id(tool, _TOOL_NAME)

                def on_start(code: Any, offset: int) -> Any:
                    entry = _by_code.pop(code, None)
                    if entry is not None:
                        _hit(*entry)
                    return mon.DISABLE

                mon.register_callback(tool, mon.events.PY_START, on_start)
                _tool = tool
                break
    return _tool


def install(owner: Any, attr: str, fire: Fire, base: int, name: str) -> str:
    """Watch OWNER.ATTR's first call, then count it with FIRE(BASE) (``_hooks`` passes its
    own counter in: this module does not import it); returns how ("monitoring" or
    "one-shot")."""
    raw = next(
        (k.__dict__[attr] for k in getattr(owner, "__mro__", ()) if attr in k.__dict__),
        None,
    )
    if raw is None:
        raw = getattr(owner, attr)
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError(f"{attr!r} has no Python code to watch")
    tool = _monitoring_tool()
    if tool is not None:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        _by_code[code] = (fire, base, name)
        mon.set_local_events(tool, code, mon.events.PY_START)
        return "monitoring"

    done = False

    def once(*args: Any, **kwargs: Any) -> Any:
        nonlocal done
        if not done:
            done = True
            if owner.__dict__.get(attr) is installed:
                # Put the original back: later calls do not pass here at all. (When another
                # wrapper was put around this one since, it stays, and this one passes through.)
                setattr(owner, attr, raw)
            _hit(fire, base, name)
        return fn(*args, **kwargs)

    functools.update_wrapper(once, fn)
    once.__verifier_probe__ = True  # type: ignore[attr-defined]
    _code.own(once, fn)
    installed: Any = once
    if isinstance(raw, staticmethod):
        installed = staticmethod(once)
    elif isinstance(raw, classmethod):
        installed = classmethod(once)
    setattr(owner, attr, installed)
    return "one-shot"
