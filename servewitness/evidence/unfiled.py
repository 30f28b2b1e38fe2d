"""The agent's judgement of code that does not come from a plain file, from outside.

The probe records it (``probe/servewitness_probe/_zips.py``, ``_loaders.py``, ``_startup.py``); here
each record is checked against what the agent can read itself through ``/proc/<pid>/root``:

* **zip members** (kind ``member``, path ``<archive>/<member>``): the agent finds the archive
  (the first file on the path), reads the member with ``zipfile`` and compares its sha256
  with the probe's. A member it cannot read, or whose bytes differ, is a disagreement; when
  the archive changed (ctime) after the probe read the member, it is drift
  (``provenance.drift.modified_after_load``). The archive itself is a plain file record.
* **``-c`` code** (kind ``inline``): compared with the ``-c`` argument of
  ``/proc/<pid>/cmdline``, parsed as the interpreter does (``layout.interpreter_main``). A
  process that rewrote its command line (vLLM's ``setproctitle``) leaves nothing to compare
  with: the record is then the probe's word only.
* **``.pth`` files** (kind ``pth``): each line that starts with ``import`` followed by a space
  or tab is executed by ``site`` at every interpreter start. A ``.pth`` that executes code and
  that no distribution's RECORD lists with these bytes (unclaimed, or patched) is
  ``provenance.pth.unclaimed``.
* **unfiled modules** (``unfiled`` records): a module a custom loader executed is
  ``provenance.module.custom_loader`` (WARNING) when the loader's class is defined in a file
  this process loaded that is pristine against its distribution's RECORD (for methods set on
  a loader instance: every piece of code they carry, ``_loaders._carried``), and
  ``provenance.module.unfiled`` (ERROR) otherwise; so is source executed into a module
  without a spec, and a main module read from standard input or a prompt. When all that code
  is in loaded files with known bytes, the drift names them (``Drift.defined_in``): a policy's
  ``[[claims]]`` entries may vouch for those bytes (``policy/rules_provenance.DriftFree``).

Why a pristine loader class is only a WARNING: torch (``_StringLoader``, a module generated
from a template in its own pristine file) and setuptools (``DistutilsLoader``, which returns
the already imported ``setuptools._distutils``) do it in every honest vLLM process, and the
bytes such a loader runs are in no file the agent could read. The loader's own file is: it
must be pristine. What stays open (docs/threat-model.md): a workload that calls a pristine
loader class with its own source. The code doing that call is itself a loaded file, judged
like any other (an unclaimed file is ``unknown``; under ``[provenance] pristine`` a file of a
listed distribution must be pristine), and the module's source hash is in the finding.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from servewitness_probe import layout as L

from servewitness.errors import UnavailableError
from servewitness.evidence.distindex import norm_path
from servewitness.evidence.places import in_stdlib
from servewitness.evidence.probe_reader import UnfiledModule
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.regular import open_file
from servewitness.model import (
    DRIFT_MODIFIED_AFTER_LOAD,
    DRIFT_MODULE_CUSTOM_LOADER,
    DRIFT_MODULE_UNFILED,
    DRIFT_PTH_UNCLAIMED,
    Drift,
    FileDisagreement,
    FileEntry,
    Origin,
    Provenance,
)

MEMBER = "member"
INLINE = "inline"
PTH = "pth"
NOT_ON_DISK = frozenset({MEMBER, INLINE})  # kinds whose path is no file of the process
MAIN_MODULES = frozenset({"__main__", "__mp_main__"})
MAX_MEMBER_BYTES = 256 << 20  # a member larger than this is not read (a zip bomb)
MAX_PTH_BYTES = 1 << 20
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")  # what site's text reader splits lines at
_member_cache: dict[tuple[int, int, int, int, int, str], tuple[str | None, str | None]] = {}
_MEMBER_CACHE_MAX = 4096


def on_disk(f: FileEntry) -> bool:
    """Whether manifest entry F names a file of the process (else a zip member or -c)."""
    return f.kind not in NOT_ON_DISK


def ran_before_hashed(f: FileEntry) -> bool:
    """Whether the interpreter ran F before the probe hashed it: every ``.pth`` (site runs them
    at start-up, before any probe; in a venv, twice), and a main script the probe hashed only
    after it started (``at`` other than ``load``). A change after the process started may
    then hide what ran even where the bytes now match the probe's."""
    return f.kind == PTH or (f.module in MAIN_MODULES and f.at != "load")


# -- zip members ---------------------------------------------------------------------------


def _archive(procfs: ProcFS, pid: int, member: str) -> tuple[str, Path, os.stat_result] | None:
    """The archive MEMBER lies in: the first regular file on its path, as the process sees
    it (path, host path, stat); None when there is none."""
    parts = member.split("/")
    for i in range(2, len(parts)):
        prefix = "/".join(parts[:i])
        host = procfs.in_root(pid, prefix)
        try:
            st = os.stat(host)
        except (OSError, ValueError):
            return None
        if stat.S_ISREG(st.st_mode):
            return prefix, host, st
        if not stat.S_ISDIR(st.st_mode):
            return None
    return None


def _member_sha(host: Path, st: os.stat_result, name: str, size: int) -> tuple[str | None, str]:
    """(sha256 of member NAME of the zip at HOST, why not) read through zipfile, at most
    SIZE + 1 bytes (SIZE: what the probe read); cached by the archive's identity."""
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, name)
    hit = _member_cache.get(key)
    if hit is not None:
        return hit[0], hit[1] or ""
    limit = min(max(size, 0), MAX_MEMBER_BYTES) + 1
    sha: str | None = None
    why = ""
    try:
        with open_file(host) as fh, zipfile.ZipFile(fh) as zf, zf.open(name) as fp:
            h = hashlib.sha256()
            read = 0
            while read < limit and (chunk := fp.read(min(1 << 20, limit - read))):
                h.update(chunk)
                read += len(chunk)
            sha = h.hexdigest()
    except KeyError:
        why = "not in the archive"
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as e:
        why = f"archive unreadable: {e}"
    except (OSError, EOFError, RuntimeError, NotImplementedError, ValueError) as e:
        why = f"archive unreadable: {type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - zlib.error and the like: any bytes may be there
        why = f"archive unreadable: {type(e).__name__}: {e}"
    if len(_member_cache) >= _MEMBER_CACHE_MAX:
        _member_cache.clear()
    _member_cache[key] = (sha, why)
    return sha, why


# A file's ctime comes from the kernel's coarse clock, up to a tick (4 ms at HZ=250, 10 ms at
# HZ=100) behind the time.time() the probe stamps a hash with: a change made right after a read
# can carry a ctime a little before it. "Changed after it was loaded" allows this much.
CTIME_COARSE_S = 0.02


def check_members(
    procfs: ProcFS,
    pid: int,
    members: Iterable[FileEntry],
    *,
    start_time: float,
    hashed_at: Mapping[str, float],
    slack: float,
) -> tuple[list[FileDisagreement], list[Drift]]:
    """Each zip member the probe recorded, read again from its archive by the agent."""
    disagreements: list[FileDisagreement] = []
    drift: list[Drift] = []
    for f in members:
        found = _archive(procfs, pid, f.path)
        if found is None:
            disagreements.append(FileDisagreement(f.path, f.sha256, None, "no archive holds it"))
            continue
        archive, host, st = found
        sha, why = _member_sha(host, st, f.path[len(archive) + 1 :], f.size)
        if f.sha256 is None:
            why = "the probe recorded no hash for it"
        elif sha == f.sha256:
            continue
        since = hashed_at.get(f.path, start_time + slack)
        after = st.st_ctime_ns > int((since - CTIME_COARSE_S) * 1e9)
        if sha is not None and f.sha256 is not None and after:
            drift.append(
                Drift(
                    DRIFT_MODIFIED_AFTER_LOAD,
                    f.path,
                    f.module,
                    f"{f.path} was read {f.sha256[:12]} from {archive} when loaded, but the "
                    f"archive holds {sha[:12]} now and changed (ctime) after it was loaded",
                )
            )
            continue
        disagreements.append(FileDisagreement(f.path, f.sha256, sha, why or "bytes differ"))
    return disagreements, drift


# -- -c code ---------------------------------------------------------------------------------


def check_inline(procfs: ProcFS, pid: int, inline: Sequence[FileEntry]) -> list[FileDisagreement]:
    """The ``-c`` code the probe hashed against ``/proc/<pid>/cmdline`` as the agent reads
    it; nothing to compare when the command line no longer carries ``-c`` (rewritten)."""
    if not inline:
        return []
    try:
        how, code = L.interpreter_main(procfs.argv(pid))
    except (UnavailableError, OSError):
        return []  # gone or hidden: the other checks say so
    if how != "command" or code is None:
        return []
    sha = hashlib.sha256(code).hexdigest()
    return [
        FileDisagreement(
            f.path, f.sha256, sha, "the -c code differs from the one in /proc/<pid>/cmdline"
        )
        for f in inline
        if f.sha256 != sha
    ]


# -- .pth files and unfiled modules ------------------------------------------------------------


def _origins(provenance: Provenance | None) -> dict[str, tuple[str, str | None]]:
    """path -> (origin, record path) of every loaded file that is not pristine or stdlib."""
    if provenance is None:
        return {}
    return {norm_path(f.path): (f.origin, f.record_path) for f in provenance.files}


def executing_lines(data: bytes) -> list[tuple[int, bytes]]:
    """The (line number, line) of each line ``site`` executes in a ``.pth`` file's DATA."""
    out = []
    for n, line in enumerate(_LINE_BREAK.split(data), 1):
        if line.startswith((b"import ", b"import\t")):
            out.append((n, line))
    return out


def _read_small(path: Path, limit: int) -> bytes | None:
    try:
        with open_file(path) as f:
            return f.read(limit)
    except (OSError, ValueError):
        return None


def pth_drift(
    procfs: ProcFS, pid: int, files: Iterable[FileEntry], provenance: Provenance | None
) -> list[Drift]:
    """``provenance.pth.unclaimed`` for each ``.pth`` file that executes code and that no
    RECORD lists with the bytes the probe hashed (an unreadable one is taken to execute:
    what it holds is unknown, and the cross-check reports why it cannot be read)."""
    origins = _origins(provenance)
    out: list[Drift] = []
    for f in files:
        if f.kind != PTH:
            continue
        origin, record_path = origins.get(norm_path(f.path), (Origin.PRISTINE.value, None))
        claimed = origin == Origin.PRISTINE.value or (
            origin == Origin.EDITABLE.value and record_path is not None
        )
        if claimed:
            continue
        data = _read_small(procfs.in_root(pid, f.path), MAX_PTH_BYTES)
        lines = executing_lines(data) if data is not None else None
        if lines == []:
            continue
        if lines is None:
            what = "cannot be read to tell whether it executes code"
        else:
            n, first = lines[0]
            what = f"executes code at interpreter start (line {n}: {first[:80]!r}"
            what += f", and {len(lines) - 1} more)" if len(lines) > 1 else ")"
        why = "patched: its RECORD lists other bytes" if origin == Origin.PATCHED else origin
        out.append(
            Drift(
                DRIFT_PTH_UNCLAIMED,
                f.path,
                None,
                f"{f.path} {what}, and no distribution's RECORD lists it with these bytes ({why})",
            )
        )
    return out


def _pristine(
    path: str | None,
    loaded: Mapping[str, FileEntry],
    origins: Mapping[str, tuple[str, str | None]],
    stdlib_dirs: Sequence[str],
) -> tuple[str | None, bool]:
    """(None, _) when PATH is a loaded file pristine against its RECORD; else (why it is
    not, whether it is a loaded file with known bytes that a claim could vouch for)."""
    if path is None:
        return "defined in no file", False
    p = norm_path(path)
    f = loaded.get(p)
    if f is None or f.sha256 is None:
        return f"defined in {path}, which no file record of the process holds", False
    if p in origins:
        return f"defined in {path}, which is {origins[p][0]}", True
    if in_stdlib(p, stdlib_dirs):
        return f"defined in {path}, in the standard library (no RECORD to judge it against)", False
    return None, False


def unfiled_drift(
    unfiled: Iterable[UnfiledModule],
    files: Iterable[FileEntry],
    provenance: Provenance | None,
    stdlib_dirs: Sequence[str],
) -> list[Drift]:
    """One drift per module the probe saw run code that no file record holds."""
    origins = _origins(provenance)
    # each such file as the provenance names it (what a policy's claims are matched with)
    named = {norm_path(f.path): f.path for f in provenance.files} if provenance else {}
    loaded = {norm_path(f.path): f for f in files if on_disk(f)}
    out: list[Drift] = []
    for u in unfiled:
        if u.how in ("stdin", "interactive"):
            where = "standard input" if u.how == "stdin" else "an interactive prompt"
            out.append(
                Drift(
                    DRIFT_MODULE_UNFILED,
                    f"<{u.how}>",
                    u.module,
                    f"module {u.module} runs code read from {where}: no file holds it and "
                    "nothing hashed it",
                )
            )
            continue
        if u.how != "loader":
            out.append(
                Drift(
                    DRIFT_MODULE_UNFILED,
                    u.file or "<unknown>",
                    u.module,
                    f"module {u.module} has no spec and runs code compiled from "
                    f"{u.file or 'no file'}: source executed into it from memory",
                )
            )
            continue
        source = (
            f"its source has sha256 {u.source_sha256} ({u.source_size} bytes)"
            if u.source_sha256
            else "its loader gives no source"
        )
        judged = [_pristine(x, loaded, origins, stdlib_dirs) for x in (u.loader_file, *u.also)]
        why = next((w for w, _ in judged if w is not None), None)
        if why is None:
            out.append(
                Drift(
                    DRIFT_MODULE_CUSTOM_LOADER,
                    u.loader_file or "",
                    u.module,
                    f"module {u.module} was executed by loader {u.loader}, defined in "
                    f"{u.loader_file} (pristine); {source}, which no file holds",
                )
            )
            continue
        others = sum(w is not None for w, _ in judged) - 1
        claimable = all(w is None or c for w, c in judged)
        defs = (u.loader_file, *u.also)
        out.append(
            Drift(
                DRIFT_MODULE_UNFILED,
                u.loader_file or u.file or "<unknown>",
                u.module,
                f"module {u.module} was executed by loader {u.loader}, {why}"
                + (f" (and {others} more piece{'s' * (others > 1)} of code)" if others else "")
                + f"; {source}, which no file holds",
                defined_in=tuple(
                    dict.fromkeys(
                        named[norm_path(x)]
                        for x, (w, _) in zip(defs, judged, strict=True)
                        if x and w is not None
                    )
                )
                if claimable
                else (),
            )
        )
    return out
