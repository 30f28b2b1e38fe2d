"""Post-import callbacks: run a function right after a named module finishes executing.

A meta-path finder placed first on ``sys.meta_path`` asks the other finders for the spec of a
watched module and wraps the loader instance's ``exec_module`` for that one import, so the
module's ``__loader__`` keeps its real type. If the module is already imported, the callback
runs at once. Callbacks never raise into the import.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]
ErrorSink = Callable[[str, str], None]

_callbacks: dict[str, list[Callback]] = {}
_lock = threading.RLock()
_in_find: set[str] = set()
_error_sink: list[ErrorSink] = []


def _report(where: str, msg: str) -> None:
    for sink in _error_sink:
        try:
            sink(where, msg)
        except Exception:  # noqa: BLE001 - a probe never raises into the import system
            pass


def _run(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _callbacks.pop(name, [])
    for cb in callbacks:
        try:
            cb(module)
        except Exception as e:  # noqa: BLE001 - a probe never raises into the import system
            _report("postimport", f"callback for {name}: {type(e).__name__}: {e}")


class _Finder:
    """Finds nothing itself; wraps the loader of watched modules."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in _callbacks or fullname in _in_find:
            return None
        _in_find.add(fullname)
        try:
            spec: ModuleSpec | None = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None:
                return spec
            loader: Any = spec.loader
            original = getattr(loader, "exec_module", None)
            if original is None:
                return spec

            def exec_module(module: ModuleType) -> None:
                try:
                    del loader.exec_module
                except AttributeError:
                    pass
                original(module)
                _run(fullname, module)

            try:
                loader.exec_module = exec_module
                WRAPPERS.add(exec_module)
            except (AttributeError, TypeError):
                _report("postimport", f"cannot watch {fullname}: loader {type(loader).__name__}")
            return spec
        finally:
            _in_find.discard(fullname)


_finder = _Finder()
# The exec_module wrappers set on loader instances above: the probe's own, which a loader
# may carry without being custom (``_loaders.is_custom``); held weakly, by identity.
WRAPPERS: weakref.WeakSet[Any] = weakref.WeakSet()


def install(error_sink: ErrorSink) -> None:
    """Put the finder first on sys.meta_path (idempotent)."""
    if error_sink not in _error_sink:
        _error_sink.append(error_sink)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def when_imported(name: str, callback: Callback) -> None:
    """Call CALLBACK(module) once NAME is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if (
        module is not None
        and getattr(getattr(module, "__spec__", None), "_initializing", False) is False
    ):
        try:
            callback(module)
        except Exception as e:  # noqa: BLE001 - a probe never raises
            _report("postimport", f"callback for {name}: {type(e).__name__}: {e}")
        return
    with _lock:
        _callbacks.setdefault(name, []).append(callback)


def flush() -> None:
    """Run pending callbacks for watched modules that got imported without our finder.

    That happens when a module was mid-import when it was watched, or was imported by a
    finder placed before ours. Called by the probe's background sweeper.
    """
    with _lock:
        ready = [
            name
            for name in _callbacks
            if name in sys.modules
            and getattr(getattr(sys.modules[name], "__spec__", None), "_initializing", False)
            is False
        ]
    for name in ready:
        _run(name, sys.modules[name])


def pending() -> list[str]:
    """Names of watched modules not imported yet."""
    with _lock:
        return sorted(_callbacks)
