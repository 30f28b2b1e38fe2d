"""What the interpreter loaded: the exact bytes the import system read, hashed.

* ``FileLoader.get_data`` is wrapped at class level, so every source (``.py``) and bytecode
  (``.pyc``) file an import reads is hashed from the very bytes that get compiled or
  unmarshalled (``at: "load"``).
* Extension modules are recorded when they are executed (their identity then, ``loaded``)
  and hashed by the background sweeper, off the import path.
* For a module executed from bytecode, its source file is hashed by the sweeper too
  (``at: "deferred"``), so the manifest holds source hashes comparable with published ones.
* A ``.pyc`` read and then rejected by its loader (stale against its source, or invalid) is
  followed by a read of its source; it is then recorded again with ``at: "rejected"``: read,
  but not what runs. Only the loader's own read counts (one from inside ``get_code``): a
  module that reads its own source once it runs cannot have its pyc called rejected. A
  checked-hash pyc's source is read to check the pyc: the pyc was used if the hash in its
  header is the hash of those bytes, exactly as the loader decides.
* Modules already imported when the probe started are hashed after the fact from their files
  on disk (``at: "snapshot"``); modules that appear later without passing through a wrapped
  loader are hashed by the sweeper (``at: "late"``).
* Code that does not come from a plain file is recorded by ``_zips`` (members of a zip on
  ``sys.path``), ``_loaders`` (modules a custom loader executed) and ``_startup`` (the main
  script, ``-c`` code, ``.pth`` files); the sweeper drives them. ``__main__`` is looked at
  again on every pass until it has a file (the interpreter sets ``__file__`` only when the
  script starts, which may be after the sweeper first looked).

Every file record carries the file's identity when its bytes were hashed (``stat``: device,
inode, size, mtime_ns, ctime_ns): for a ``load`` record from a ``stat`` right after the read
(one system call, about a microsecond: ``bench/import_identity.py``), for the sweeper's from
an ``fstat`` of the descriptor it hashed. A file hashed after the fact whose ctime is later
than the process's start may have changed between the import and the hash; the agent says so
(``provenance.file.changed_after_start``).
"""

from __future__ import annotations

import _imp
import hashlib
import importlib.util
import os
import sys
import threading
import time
from importlib.machinery import ExtensionFileLoader, SourceFileLoader
from types import CodeType
from typing import Any

from servewitness_probe import (
    _code,
    _core,
    _device,
    _files,
    _integrity,
    _loaders,
    _postimport,
    _startup,
    _zips,
)
from servewitness_probe import layout as L

SWEEP_INTERVAL_S = 1.0

_recorded: set[str] = set()
_names_done: set[str] = set()
_pending_ext: list[tuple[str, str, list[int] | None]] = []  # path, module, identity at exec
_pending_src: list[tuple[str, str | None]] = []  # sources of modules executed from bytecode
_guard = threading.local()
_installed = False
_sweeper_pid = 0
_last_len = -1
_last_path: tuple[str, ...] = ()
_at_start: set[str] = set()
# The code of the loader method that reads a module's pyc and, when it rejects it (or checks a
# hash-based one), its source: the only reads that say which of the two runs.
_GET_CODE: CodeType = next(
    k.__dict__["get_code"] for k in SourceFileLoader.__mro__ if "get_code" in k.__dict__
).__code__
_MAGIC = importlib.util.MAGIC_NUMBER
_HASH_KEY = int.from_bytes(_MAGIC, "little")  # what the loader keys source hashes with
_MAIN_NAMES = frozenset({"__main__", "__mp_main__"})  # a script's module, also when spawned


def _kind(path: str) -> str:
    if path.endswith(".pyc"):
        return "bytecode"
    if path.endswith(".py"):
        return "source"
    return "data"


def _on_read(name: str | None, origin: Any, path: Any, data: bytes) -> None:
    if getattr(_guard, "busy", False):
        return
    _guard.busy = True
    try:
        p = os.fspath(path)
        st = _core.state()
        rec = {
            "k": "file",
            "path": p,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "kind": _kind(p),
            "module": name,
            "at": "load",
        }
        ident = _files.identity(p)
        if ident is not None:
            rec["stat"] = ident
        st.remember(rec)
        _recorded.add(p)
        last = getattr(_guard, "last_pyc", None)  # (source path, record, header) of this
        _guard.last_pyc = None  # thread's latest bytecode read, while it is the latest read
        if isinstance(origin, str) and p == origin and last is not None and last[0] == origin:
            if _by_loader() and not _hash_accepted(last[2], data):
                # The loader read the module's bytecode and now reads its source: it rejected
                # the bytecode (stale or invalid) and compiles this source instead.
                st.remember({**last[1], "at": "rejected"})
            try:
                _pending_src.remove((origin, name))  # read at load: no deferred hash
            except ValueError:
                pass  # not queued, or the sweeper took it already
        elif isinstance(origin, str) and p.endswith(".pyc") and origin != p:
            _guard.last_pyc = (origin, rec, data[:16])
        if isinstance(origin, str) and origin not in _recorded:
            # The module (origin: its source path) is described by this read; the sweeper
            # must not hash its source again as if it had been loaded from there. When the
            # interpreter ran bytecode, the source is still hashed (off the import path) so
            # the manifest can be compared with published source hashes.
            _recorded.add(origin)
            if p.endswith(".pyc") and origin != p:
                _pending_src.append((origin, name))
    finally:
        _guard.busy = False


def _by_loader() -> bool:
    """Whether the read being recorded is the loader's own (from ``get_code``), not a read by
    the module's code or anyone else. Frames: this, ``_on_read``, the ``get_data`` wrapper,
    its caller."""
    try:
        return sys._getframe(3).f_code is _GET_CODE
    except ValueError:
        return False


def _hash_accepted(head: bytes, source: bytes) -> bool:
    """Whether the loader uses a pyc whose header is HEAD after reading SOURCE: a hash-based
    pyc of this Python (the loader reads the source to check its hash) whose hash is SOURCE's.
    A timestamp pyc's source is read only when the pyc was rejected."""
    flags = int.from_bytes(head[4:8], "little")
    if len(head) < 16 or head[:4] != _MAGIC or flags not in (0b01, 0b11):
        return False
    return bool(_imp.source_hash(_HASH_KEY, source) == head[8:16])


def install() -> None:
    """Wrap the loaders (idempotent; class-level, so it survives fork)."""
    global _installed
    if _installed:
        return
    owner = next(k for k in SourceFileLoader.__mro__ if "get_data" in k.__dict__)
    orig_get_data = owner.__dict__["get_data"]

    def get_data(self: Any, path: Any) -> bytes:
        data: bytes = orig_get_data(self, path)
        try:
            _on_read(getattr(self, "name", None), getattr(self, "path", None), path, data)
            # what compiles these bytes, as they leave: a change made while they were read
            # (an audit hook on the open, undone by the patch itself) is in place now
            _integrity.intact()
        except Exception as e:  # noqa: BLE001 - a probe never raises into an import
            _core.report_error("imports", f"get_data({path!r}): {type(e).__name__}: {e}")
        return data

    get_data.__verifier_probe__ = True  # type: ignore[attr-defined]
    get_data.__wrapped__ = orig_get_data  # type: ignore[attr-defined]
    if not getattr(orig_get_data, "__verifier_probe__", False):
        owner.get_data = get_data  # type: ignore[attr-defined]

    orig_exec = ExtensionFileLoader.exec_module

    def exec_module(self: Any, module: Any) -> None:
        orig_exec(self, module)
        try:
            path = os.fspath(self.path)
            _pending_ext.append((path, self.name, _files.identity(path)))
            _recorded.add(path)
        except Exception as e:  # noqa: BLE001
            _core.report_error("imports", f"extension {self!r}: {type(e).__name__}: {e}")

    exec_module.__verifier_probe__ = True  # type: ignore[attr-defined]
    if not getattr(orig_exec, "__verifier_probe__", False):
        ExtensionFileLoader.exec_module = exec_module  # type: ignore[method-assign]
    _installed = True


def _module_file(mod: Any) -> str | None:
    spec = getattr(mod, "__spec__", None)
    if spec is not None:
        if not getattr(spec, "has_location", False):
            return None
        origin = spec.origin
    else:
        origin = getattr(mod, "__file__", None)
    # A relative name is no location (torch.ops says "_ops.py"): nothing to hash there.
    return origin if isinstance(origin, str) and os.path.isabs(origin) else None


def _claimed_file(mod: Any, origin: str | None) -> str | None:
    """The file MOD claims to come from when nothing is there (None: it has one, or claims
    none). Frozen and built-in modules claim no location; a relative name claims no location
    either (torch's ``torch.ops`` and ``torch.classes`` say ``_ops.py`` and ``_classes.py``).
    A member of a zip archive is not there either: the caller reads it from the archive."""
    claimed = origin
    if claimed is None:
        try:
            claimed = vars(mod).get("__file__")  # not getattr: no module __getattr__ runs
        except TypeError:
            return None
    if not isinstance(claimed, str) or not os.path.isabs(claimed):
        return None
    if os.path.exists(claimed):
        return None
    return claimed


def _interp_record() -> dict[str, Any] | None:
    """The interpreter's layout (stdlib, prefixes, sys.path, cwd) when sys.path changed:
    the agent needs it to tell the standard library and shadowing apart."""
    global _last_path
    path = tuple(p for p in sys.path if isinstance(p, str))
    if path == _last_path:
        return None
    _last_path = path
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    return {
        "k": "interp",
        "stdlib": getattr(sys, "_stdlib_dir", None),
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "path": list(path),
        "cwd": cwd,
        "version": sys.version.split()[0],
    }


def record_interp() -> None:
    """Journal the interpreter's layout now if sys.path changed since last recorded: at the
    probe's start, before ``sitecustomize`` or any main code runs (an entry the workload
    removes later is then on record), and at each sweep."""
    interp = _interp_record()
    if interp is not None:
        _core.state().remember(interp)


def sweep() -> None:
    """One pass: pending post-import callbacks, extension hashes, unseen modules, and the
    code that runs each watched method (``_code``)."""
    _postimport.flush()
    st = _core.state()
    record_interp()
    if _device._counters:
        _device.read_all(cpu_only=True)  # processes that run no steps; CUDA: the step reads
    while _pending_ext:
        path, name, loaded = _pending_ext.pop(0)
        got = _files.hash_file(path)
        rec: dict[str, Any] = {"k": "file", "path": path, "kind": "extension", "module": name}
        rec["at"] = "load"
        if loaded is not None:
            rec["loaded"] = loaded
        if got is None:
            size = loaded[2] if loaded is not None else -1
            rec.update({"sha256": None, "size": size, "error": "unreadable"})
        else:
            rec.update({"sha256": got[0], "size": got[1], "stat": got[2]})
        st.remember(rec)
    while _pending_src:
        src, src_module = _pending_src.pop(0)
        got = _files.hash_file(src)
        if got is not None:
            st.remember(
                {
                    "k": "file",
                    "path": src,
                    "kind": "source",
                    "module": src_module,
                    "at": "deferred",
                    "sha256": got[0],
                    "size": got[1],
                    "stat": got[2],
                }
            )
    _zips.sweep(st)
    _loaders.sweep(st)
    _startup.scan_pth(st)
    _sweep_modules(st)
    _code.recheck()  # what runs the watched methods: journaled again if it changed
    _integrity.changed()  # the import system itself (``_integrity``)


def _sweep_modules(st: Any) -> None:
    """Record modules that appeared in sys.modules without passing a wrapped loader."""
    global _last_len
    main = sys.modules.get("__main__")
    if main is not None and "__main__" not in _names_done:
        _sweep_one(st, "__main__", main)  # until its file is set, whatever else changed
    n = len(sys.modules)
    if n == _last_len:
        return
    _last_len = n
    # a copy made in one C call (list(items()) allocates a tuple per module, and a collection
    # it sets off may run finalizers: Python code, another thread's imports in between)
    for name, mod in sys.modules.copy().items():
        if name not in _names_done:
            try:
                _sweep_one(st, name, mod)
            except Exception as e:  # noqa: BLE001 - one odd module must not hide the rest
                _names_done.add(name)
                _core.report_error("sweeper", f"{name}: {type(e).__name__}: {e}")


def _sweep_one(st: Any, name: str, mod: Any) -> None:
    """Record module NAME (MOD) if nothing recorded it yet: its file, its zip member, the
    custom loader that executed it, or the file it claims and does not have."""
    origin = _module_file(mod)
    if origin is None and name in _MAIN_NAMES and getattr(mod, "__spec__", None) is None:
        return  # a script whose __file__ is not set yet (-c, stdin: never; _startup has it)
    _names_done.add(name)
    at = "snapshot" if name in _at_start else "late"
    spec = getattr(mod, "__spec__", None)
    if spec is None and name not in _MAIN_NAMES:  # the main module: _startup records it
        _loaders.record_exec(st, name, mod, origin, at)
    _loaders.record(st, name, mod, spec, at)
    claimed = _claimed_file(mod, origin)
    if claimed is not None:
        if not (_zips.recorded(claimed) or _zips.record_member(claimed, name, at)):
            st.remember({"k": "fileless", "module": name, "claimed": claimed})
        return
    if origin is None or origin in _recorded or origin == _startup.main_path:
        return
    _recorded.add(origin)
    kind = "extension" if not origin.endswith((".py", ".pyc")) else _kind(origin)
    st.remember(_files.file_record(origin, kind, name, at))


def sweep_once() -> None:
    """One ``sweep``, its failure reported with where it was raised (the innermost frame:
    a race seen once under load must be findable from the journal alone)."""
    try:
        sweep()
    except Exception as e:  # noqa: BLE001 - the sweeper must keep going
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        at = (
            f" (at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})" if tb else ""
        )
        _core.report_error("sweeper", f"{type(e).__name__}: {e}{at}")


def _loop() -> None:
    while True:
        counters = _core.state().counters
        counters[L.S_SWEEPS_BEGUN] += 1
        sweep_once()
        counters[L.S_SWEEPS_ENDED] += 1
        time.sleep(SWEEP_INTERVAL_S)


def start_sweeper() -> None:
    """Start the background sweeper for this pid (idempotent; restarted after fork)."""
    global _sweeper_pid
    if _sweeper_pid == os.getpid():
        return
    _sweeper_pid = os.getpid()
    if not _at_start:
        _at_start.update(sys.modules)
    t = threading.Thread(target=_loop, name="verifier-probe-sweeper", daemon=True)
    t.start()
