"""Bytecode a live process loaded that does not correspond to its source (PEP 552).

The probe records every ``.pyc`` the import system read (``kind: "bytecode"``, ``at: "load"``,
the sha256 of exactly the bytes it unmarshalled). Each one is judged here against the file now
at its source path, as the process sees it:

* a ``.pyc`` outside ``__pycache__`` was loaded without source (``SourcelessFileLoader``):
  there is nothing to compare it with (``provenance.bytecode.sourceless``);
* a **timestamp** pyc (flags 0) is trusted by the interpreter when the source's size and mtime
  equal the ones in its header. Both can be restored after the source's bytes were rewritten,
  but the source's ctime cannot: a source whose ctime is later than the pyc's mtime (or a pyc
  whose mtime was set later than its own ctime) makes the pyc a *candidate*, confirmed by
  compiling the source and comparing code objects (``provenance.bytecode.stale``). A pyc of
  another Python cannot be compared that way (``provenance.bytecode.unverified``);
* a **hash-based** pyc (flags 1 or 3) embeds a hash of the source it was compiled from, which is
  compared with the source now. An *unchecked* one (flags 1) is never compared with its source
  by the interpreter, so it is reported whatever the hash says
  (``provenance.bytecode.unchecked``).

The common path costs one ``stat`` of the source and one 16-byte read (and ``fstat``) of the
pyc. A pyc is hashed, to make sure it still holds the bytes the process loaded, only before a
finding is reported about it or its source is compiled; a source is compiled only for a
candidate, and each outcome is cached under both files' identity (path, device, inode, size,
mtime, ctime), trusting what ``hashing.py`` trusts: ctime cannot be set from user space.

What the candidate rule does not see: a pyc whose mtime is later than its source's ctime while
holding other code, i.e. one written (or merely touched) after the source was rewritten, and a
hash-based pyc whose header hash matches but whose code does not. ``compare_all=True`` compiles
the source of every pyc the interpreter accepted, which catches those too (one compile each).
Files extracted from an image layer keep their archived mtime but get a new ctime, so there
every timestamp pyc is a candidate and is compiled once (the cache makes later scans cheap).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verifier.evidence.pycfile import (
    FLAG_CHECK,
    FLAG_HASH,
    HEADER,
    CompileCache,
    Outcome,
    compare_cached,
    hash_matches,
    identity,
    optimization,
    read,
    read_head,
    stamp_matches,
    u32,
)
from verifier.model import (
    DRIFT_BYTECODE_SOURCELESS,
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNCHECKED,
    DRIFT_BYTECODE_UNVERIFIED,
    Drift,
    FileEntry,
)

_MISSING = (FileNotFoundError, NotADirectoryError)

SHARED_CACHE = CompileCache()  # the default: one agent process judges many scans


@dataclass(frozen=True)
class _Pyc:
    """One loaded pyc: where it is (process view and host view) and its supposed source."""

    entry: FileEntry
    host: Path
    source: str  # as the process sees it
    source_host: Path
    optimize: int  # the level its name says it was compiled with
    head: bytes  # its first 16 bytes, as read now
    stat: os.stat_result  # of the pyc, now

    def drift(self, id_: str, detail: str) -> Drift:
        return Drift(id_, self.entry.path, self.entry.module, detail)


def check_bytecode(
    files: Sequence[FileEntry],
    to_host: Callable[[str], Path],
    *,
    compare_all: bool = False,
    cache: CompileCache | None = SHARED_CACHE,
) -> list[Drift]:
    """Drifts of the bytecode files one process loaded, at most one per (id, path).

    FILES: the process's manifest (only ``kind == "bytecode"`` entries read ``at == "load"``
    are judged). TO_HOST maps a path as the process sees it to one this code can read
    (``/proc/<pid>/root/<path>`` in production). COMPARE_ALL: also compile the source of every
    pyc whose header the interpreter accepted, not only the candidates (slow). CACHE: where
    compile outcomes are kept between calls (None: nowhere). Never raises on odd files: what
    cannot be read is either nothing to report or an *unverified* finding."""
    judge = _Judge(files, to_host, compare_all, cache)
    found: dict[tuple[str, str], Drift] = {}
    for entry in files:
        if entry.kind != "bytecode" or entry.at != "load":
            continue
        try:
            drifts = judge.entry(entry)
        except (OSError, ValueError):  # an odd path (NUL byte, unencodable): nothing to judge
            drifts = []
        for d in drifts:
            found.setdefault((d.id, d.path), d)
    return list(found.values())


class _Judge:
    """The per-call state: how to reach files, and what the manifest says about sources."""

    def __init__(
        self,
        files: Sequence[FileEntry],
        to_host: Callable[[str], Path],
        compare_all: bool,
        cache: CompileCache | None,
    ) -> None:
        self.to_host = to_host
        self.compare_all = compare_all
        self.cache = cache
        # Sources the import system read itself (to compile them, or to check a hash).
        self.read_at_load = {f.path for f in files if f.kind == "source" and f.at == "load"}
        self.sources = {f.module: f.path for f in files if f.kind == "source" and f.module}

    def entry(self, entry: FileEntry) -> list[Drift]:
        """The drifts of one loaded pyc."""
        parent, name = posixpath.split(entry.path)
        if posixpath.basename(parent) == "__pycache__":
            source = posixpath.join(posixpath.dirname(parent), name.partition(".")[0] + ".py")
        elif name.count(".") >= 2 and entry.module and entry.module in self.sources:
            # A tagged name outside __pycache__ (``mod.cpython-311.pyc``) is no sourceless
            # module: it was written under sys.pycache_prefix; the probe saw its source.
            source = self.sources[entry.module]
        else:
            detail = (
                f"{entry.path} was loaded as bytecode with no source beside it (not in "
                "__pycache__), so there is no source to compare it with"
            )
            return [Drift(DRIFT_BYTECODE_SOURCELESS, entry.path, entry.module, detail)]
        host = self.to_host(entry.path)
        try:
            head, st = read_head(host)
        except OSError:
            return []  # gone or unreadable now: the cross-check reports a changed pyc
        if len(head) < HEADER:
            return []  # the interpreter cannot have used a pyc this short: it changed since
        pyc = _Pyc(entry, host, source, self.to_host(source), optimization(name), head, st)
        flags = u32(head, 4)
        if flags == 0:
            return self.timestamp(pyc)
        if flags in (FLAG_HASH, FLAG_HASH | FLAG_CHECK):
            return self.hash_based(pyc)
        return []  # invalid flags: the interpreter rejects such a pyc

    def timestamp(self, pyc: _Pyc) -> list[Drift]:
        """A timestamp pyc whose header matches its source now, if it is a candidate."""
        try:
            src_st = os.stat(pyc.source_host)
        except _MISSING:
            return []  # deleted after load (a pyc in __pycache__ is used beside its source only)
        except OSError as e:
            return _if_loaded(pyc, [(DRIFT_BYTECODE_UNVERIFIED, _unreadable(pyc, e))])
        if not stamp_matches(pyc.head, src_st):
            return []  # the interpreter would not accept it now: the source changed after load
        why = _candidacy(pyc, src_st)
        if why is None and not self.compare_all:
            return []
        return self.confirm(pyc, src_st, why)

    def confirm(self, pyc: _Pyc, src_st: os.stat_result, why: str | None) -> list[Drift]:
        """Compile the source of a timestamp candidate and compare; WHY it is one (None: it
        is compared because compare_all asks)."""
        loaded = _loaded(pyc)
        if loaded is None:
            return []
        data, pyc_st = loaded
        if data[:4] != importlib.util.MAGIC_NUMBER:
            detail = _foreign(pyc) + (f", and {why}" if why else "")
            return [pyc.drift(DRIFT_BYTECODE_UNVERIFIED, detail)]
        try:
            source, st = read(pyc.source_host)
        except _MISSING:
            return []
        except OSError as e:
            return [pyc.drift(DRIFT_BYTECODE_UNVERIFIED, _unreadable(pyc, e))]
        if identity("", st) != identity("", src_st):
            return []  # changed while judged: the next scan judges it
        found = _found(
            pyc,
            self.compare(pyc, data, pyc_st, source, st),
            lambda note: (
                f"{pyc.entry.path} was compiled from other source than {pyc.source} "
                f"holds{note}; size and mtime match, so the interpreter used it"
            ),
        )
        return [pyc.drift(id_, detail) for id_, detail in found]

    def hash_based(self, pyc: _Pyc) -> list[Drift]:
        """A hash-based pyc: its embedded source hash against the source now."""
        unchecked = not u32(pyc.head, 4) & FLAG_CHECK
        out: list[tuple[str, str]] = []
        try:
            source, src_st = read(pyc.source_host)
        except _MISSING:
            if not unchecked:
                return []  # deleted after load (reported elsewhere)
            return _if_loaded(pyc, [_unchecked(pyc, f"{pyc.source} is missing now")])
        except OSError as e:
            out.append((DRIFT_BYTECODE_UNVERIFIED, _unreadable(pyc, e)))
            state = f"{pyc.source} cannot be read now ({_reason(e)})"
            return _if_loaded(pyc, out + ([_unchecked(pyc, state)] if unchecked else []))
        # The hash is keyed with the magic number of the Python that wrote it: another Python's
        # pyc that matches is as good a proof; one that does not may use another hash function.
        ours = pyc.head[:4] == importlib.util.MAGIC_NUMBER
        if hash_matches(pyc.head, source):
            state = f"its embedded source hash matches {pyc.source} now"
            if self.compare_all and ours:
                out += self.compare_hash_matching(pyc, source, src_st, unchecked)
        elif ours:
            state = f"its embedded source hash does not match {pyc.source} now"
            # A checked pyc whose source the import system read at load was compared by the
            # interpreter itself: it compiled the source instead, or the source changed since.
            if unchecked or pyc.source not in self.read_at_load:
                out.append((DRIFT_BYTECODE_STALE, _hash_stale(pyc, "", unchecked)))
        else:
            state = f"whether its embedded source hash matches {pyc.source} is unknown"
            detail = f"{_foreign(pyc)}, nor its source hash computed"
            out.append((DRIFT_BYTECODE_UNVERIFIED, detail))
        if unchecked:
            out.append(_unchecked(pyc, state))
        return _if_loaded(pyc, out)

    def compare_hash_matching(
        self, pyc: _Pyc, source: bytes, src_st: os.stat_result, unchecked: bool
    ) -> list[tuple[str, str]]:
        """compare_all for a hash-based pyc whose hash matches: is its code the source's?"""
        loaded = _loaded(pyc)
        if loaded is None:
            return []
        return _found(
            pyc,
            self.compare(pyc, loaded[0], loaded[1], source, src_st),
            lambda note: _hash_stale(
                pyc, f" although its embedded source hash matches{note}", unchecked
            ),
        )

    def compare(
        self,
        pyc: _Pyc,
        data: bytes,
        pyc_st: os.stat_result,
        source: bytes,
        src_st: os.stat_result,
    ) -> Outcome:
        """Whether DATA holds the code SOURCE compiles to (``compare``), through the cache."""
        key = (
            identity(str(pyc.host), pyc_st),
            identity(str(pyc.source_host), src_st),
            pyc.optimize,
        )
        return compare_cached(
            self.cache, key, data, source, filename=pyc.source, optimize=pyc.optimize
        )


def _candidacy(pyc: _Pyc, src_st: os.stat_result) -> str | None:
    """Why a timestamp pyc the interpreter accepts may hold other code than its source (None:
    nothing suggests it). Writing a file or setting its times moves its ctime to now."""
    written = pyc.stat.st_mtime_ns
    if src_st.st_ctime_ns > written:
        return f"{pyc.source} changed (ctime) after {pyc.entry.path} was written (mtime)"
    if written > pyc.stat.st_ctime_ns:
        return f"the mtime of {pyc.entry.path} was set later than its ctime"
    return None


def _found(pyc: _Pyc, outcome: Outcome, stale: Callable[[str], str]) -> list[tuple[str, str]]:
    """The finding an OUTCOME makes; STALE gives the detail of a stale pyc from its note."""
    if outcome is None:
        return []
    if not outcome[0]:
        return [(DRIFT_BYTECODE_UNVERIFIED, _uncompilable(pyc, outcome[1]))]
    return [(DRIFT_BYTECODE_STALE, stale(outcome[1]))]


def _loaded(pyc: _Pyc) -> tuple[bytes, os.stat_result] | None:
    """The whole pyc now and its stat, if it still holds the bytes the process loaded and is
    the file whose header was read; None otherwise (a changed pyc is reported elsewhere)."""
    try:
        data, st = read(pyc.host)
    except OSError:
        return None
    if pyc.entry.sha256 is None or hashlib.sha256(data).hexdigest() != pyc.entry.sha256:
        return None
    if data[:HEADER] != pyc.head or identity("", st) != identity("", pyc.stat):
        return None
    return data, st


def _if_loaded(pyc: _Pyc, found: list[tuple[str, str]]) -> list[Drift]:
    """FOUND as drifts if the pyc still holds the bytes the process loaded, else none."""
    if not found or _loaded(pyc) is None:
        return []
    return [pyc.drift(id_, detail) for id_, detail in found]


def _unchecked(pyc: _Pyc, state: str) -> tuple[str, str]:
    detail = (
        f"{pyc.entry.path} is an unchecked-hash pyc, which the interpreter never compares with "
        f"its source; {state}"
    )
    return DRIFT_BYTECODE_UNCHECKED, detail


def _hash_stale(pyc: _Pyc, why: str, unchecked: bool) -> str:
    used = (
        "the interpreter never checks it, so it used it"
        if unchecked
        else "the import system did not read the source at load to check it "
        "(--check-hash-based-pycs never?)"
    )
    return f"{pyc.entry.path} was compiled from other source than {pyc.source} holds{why}; {used}"


def _foreign(pyc: _Pyc) -> str:
    return (
        f"{pyc.entry.path} is bytecode of another Python (magic {pyc.head[:4].hex()}, this "
        f"verifier's {importlib.util.MAGIC_NUMBER.hex()}), so it cannot be compared with "
        f"{pyc.source} here"
    )


def _unreadable(pyc: _Pyc, e: OSError) -> str:
    return f"cannot read {pyc.source} to compare {pyc.entry.path} with: {_reason(e)}"


def _uncompilable(pyc: _Pyc, why: str) -> str:
    return f"cannot compile {pyc.source} to compare {pyc.entry.path} with: {why}"


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__
