"""Modules imported from a zip archive on ``sys.path`` (zipimport): the member bytes, hashed.

zipimport reads every member it uses (source, bytecode, data) with
``zipimport._get_data(archive, toc_entry)`` and compiles or unmarshals those bytes itself; no
file loader is involved, so the ``FileLoader.get_data`` wrapper (``_imports``) never sees
them. That function is wrapped (a module global, looked up by zipimport at each call), and
each member read becomes a ``file`` record of kind ``member``: its path is
``<archive>/<member>`` (the module's ``__file__``), ``archive`` names the archive, and its
sha256 is of the bytes zipimport read. The archive itself is queued for the sweeper, which
hashes it as a file record of kind ``archive`` off the import path (an archive can be large),
with its identity at the first read. The agent re-reads each member from the archive through
``/proc/<pid>/root`` (``servewitness.evidence.unfiled``).

A module imported from a zip before the probe started is read again through zipimport by
the sweeper (``record_member``). A module claiming a path inside a file that zipimport cannot
read it from is no member: the sweeper reports it ``fileless``.
"""

from __future__ import annotations

import hashlib
import os
import threading
import zipimport
from typing import Any

from servewitness_probe import _core, _files

_local = threading.local()  # module: what zipimport loads on this thread; at: the record's
_pending: list[tuple[str, list[int] | None]] = []  # archives to hash
_archives: set[str] = set()
_members: dict[str, str] = {}  # member path -> sha256 recorded
_installed = False


def _on_read(archive: Any, datapath: Any, data: bytes) -> None:
    path = os.path.abspath(os.fspath(datapath))
    arch = os.path.abspath(os.fspath(archive))
    sha = hashlib.sha256(data).hexdigest()
    if _members.get(path) == sha:
        return  # zipimport reads a member twice (get_filename, then get_code)
    _members[path] = sha
    rec = {"k": "file", "path": path, "kind": "member", "archive": arch, "sha256": sha}
    rec.update({"size": len(data), "module": getattr(_local, "module", None)})
    rec["at"] = getattr(_local, "at", "load")
    _core.state().remember(rec)
    if arch not in _archives:
        _archives.add(arch)
        _pending.append((arch, _files.identity(arch)))


def install() -> None:
    """Wrap zipimport's member reads (idempotent; module level, so it survives fork)."""
    global _installed
    if _installed:
        return
    _installed = True
    orig_get_data = zipimport._get_data  # type: ignore[attr-defined]
    if getattr(orig_get_data, "__verifier_probe__", False):
        return

    def _get_data(archive: Any, toc_entry: Any) -> bytes:
        data: bytes = orig_get_data(archive, toc_entry)
        try:
            _on_read(archive, toc_entry[0], data)
        except Exception as e:  # noqa: BLE001 - a probe never raises into an import
            _core.report_error("zipimport", f"{archive!r}: {type(e).__name__}: {e}")
        return data

    orig_module_code = zipimport._get_module_code  # type: ignore[attr-defined]

    def _get_module_code(self: Any, fullname: str) -> Any:
        before = getattr(_local, "module", None)
        _local.module = fullname
        try:
            return orig_module_code(self, fullname)
        finally:
            _local.module = before

    _get_data.__verifier_probe__ = True  # type: ignore[attr-defined]
    zipimport._get_data = _get_data  # type: ignore[attr-defined]
    zipimport._get_module_code = _get_module_code  # type: ignore[attr-defined]


def recorded(path: str) -> bool:
    """Whether member PATH was recorded (read through zipimport since the probe started)."""
    return path in _members


def archive_of(path: str) -> str | None:
    """The file PATH lies inside (``/x/app.zip`` for ``/x/app.zip/pkg/mod.py``), if any."""
    parent = os.path.dirname(path)
    while parent and parent != os.path.dirname(parent):
        if os.path.isfile(parent):
            return parent
        if os.path.exists(parent):
            return None
        parent = os.path.dirname(parent)
    return None


def record_member(path: str, module: str, at: str) -> bool:
    """Read member PATH through zipimport (recording it, as ``at``) for MODULE, which was
    imported from a zip before the probe could see the read. False: PATH is in no archive
    zipimport can read it from."""
    archive = archive_of(path)
    if archive is None:
        return False
    _local.module, _local.at = module, at
    try:
        zipimport.zipimporter(archive).get_data(path)
    except Exception:  # noqa: BLE001 - not a zip, no such member, a corrupt archive
        return False
    finally:
        _local.module = None
        del _local.at
    return path in _members


def sweep(st: Any) -> None:
    """Hash the archives members were read from (the sweeper's thread)."""
    while _pending:
        archive, ident = _pending.pop(0)
        rec = _files.file_record(archive, "archive", None, "load")
        if ident is not None:
            rec["loaded"] = ident  # its identity when a member was first read from it
        st.remember(rec)
