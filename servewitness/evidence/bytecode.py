"""Bytecode a live process ran, shown to be compiled from the source beside it, or a finding
(PEP 552).

The probe records every ``.pyc`` the import system read (``kind: "bytecode"``, ``at: "load"``,
the sha256 of exactly the bytes it unmarshalled) and marks one its loader rejected
(``at: "rejected"``: the loader compiled the source instead). Every other one ran, and each is
judged here against the file now at its source path, as the process sees it: its code must be
what that source compiles to, at the optimization level its name carries. Nothing weaker
counts, because every check the interpreter makes can be met by a pyc of other code:

* a **timestamp** pyc (flags 0) is used when its header holds the source's size and mtime:
  a forged pyc can hold them, written after the source (so no timestamp says it is older),
  and a stale one can be ``touch``\\ed after its source was rewritten with its mtime put back;
* a **checked-hash** pyc (flags 3) is used when its header holds the source's hash, which
  says nothing of the code after the header;
* an **unchecked-hash** pyc (flags 1) is used whatever the source holds.

So the source of every pyc that ran is compiled and the code objects compared: other code is
``provenance.bytecode.stale`` (ERROR), whatever the header says (a header that no longer
matches means the source changed after load, which does not make the code that ran its
source's). A pyc that cannot be compared is ``provenance.bytecode.unverified`` (WARNING):
bytecode of another Python than the agent's (its magic number; the agent can only compile
for its own), a source missing or unreadable now, code that cannot be compiled or
unmarshalled, or other code when the process runs another Python release than the agent
(one magic number covers every 3.11.x, but a patch release may change what the compiler
emits, line tables included, so other code is then no proof of a forgery). An unchecked-hash
pyc that is not shown to be its source's is also
``provenance.bytecode.unchecked`` (ERROR: nothing checked it, the interpreter neither); one
shown to be compiled from its source is no finding, since that comparison proves more than
the hash check the interpreter skipped. A ``.pyc`` outside ``__pycache__`` was loaded without
source (``SourcelessFileLoader``): there is nothing to compare it with
(``provenance.bytecode.sourceless``).

``judge_bytecode`` also returns, for each pyc shown to be compiled from its source, the sha256
of the source bytes it was compared with: ``origins.classify`` counts a pyc as pristine only
when its RECORD lists that hash for the source.

Cost: a compile costs about what importing the module cost (milliseconds), so each comparison
is cached (``pycfile.CompileCache``, bounded) under both files' identity (the path as the
process sees it, device, inode, size, mtime, ctime), the optimization level and the sha256
the pyc was loaded with, trusting what ``hashing.py`` trusts: ctime cannot be set from user
space, so a file whose bytes changed has a new key. A rescan costs one ``stat`` of the source
and one 16-byte read (and ``fstat``) of the pyc; the processes of one container share the
entries, so a file is compiled once per boot, not once per process. A pyc is read whole and
hashed (it must still hold the bytes the process loaded) only when it is not cached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import platform
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servewitness.evidence import compilers, inputs
from servewitness.evidence.pycfile import (
    FLAG_CHECK,
    FLAG_HASH,
    HEADER,
    Checked,
    CompileCache,
    cache_key,
    compare,
    hash_matches,
    identity,
    optimization,
    read,
    read_head,
    read_stable,
    stamp_matches,
    u32,
)
from servewitness.evidence.verdicts import VerdictStore, content_key
from servewitness.model import (
    DRIFT_BYTECODE_SOURCELESS,
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNCHECKED,
    DRIFT_BYTECODE_UNVERIFIED,
    Drift,
    FileEntry,
)

_MISSING = (FileNotFoundError, NotADirectoryError)
_FLAGS = (0, FLAG_HASH, FLAG_HASH | FLAG_CHECK)  # any other flags: the interpreter rejects it
_FOREIGN = "\0foreign"  # an outcome's why: bytecode of another Python (detail built per pyc)

SHARED_CACHE = CompileCache()  # the default: one agent process judges many scans


@dataclass(frozen=True)
class BytecodeJudgement:
    """The drifts of one process's loaded pycs, and COMPILED_FROM: for each pyc shown to hold
    the code its source compiles to (its path as the process sees it), the sha256 (hex) of
    the source bytes it was compared with. A pyc not in it was not shown to be its source's."""

    drift: tuple[Drift, ...]
    compiled_from: Mapping[str, str]
    # each source read to compare a pyc with (``inputs``): a judgement kept is reused only
    # while they would read the same (a source staged for one look, then put back)
    reads: tuple[inputs.Input, ...] = ()


class _Deferred(Exception):
    """A comparison kept to be compiled with the others (``_Judge.deferred``)."""


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

    @property
    def hash_based(self) -> bool:
        return bool(u32(self.head, 4) & FLAG_HASH)

    @property
    def unchecked(self) -> bool:
        return u32(self.head, 4) == FLAG_HASH

    def drift(self, id_: str, detail: str) -> Drift:
        return Drift(id_, self.entry.path, self.entry.module, detail)


def judge_bytecode(
    files: Sequence[FileEntry],
    to_host: Callable[[str], Path],
    *,
    cache: CompileCache | None = SHARED_CACHE,
    python: str | None = None,
    verdicts: VerdictStore | None = None,
) -> BytecodeJudgement:
    """Each bytecode file one process ran, compared with its source: the drifts (at most one
    per id and path) and the pycs shown to be compiled from their source.

    FILES: the process's manifest (only ``kind == "bytecode"`` entries read ``at == "load"``
    are judged). TO_HOST maps a path as the process sees it to one this code can read
    (``/proc/<pid>/root/<path>`` in production). CACHE: where comparisons are kept between
    calls (None: nowhere). VERDICTS: compile outcomes kept by content across agent restarts
    (``verdicts.py``; saved before returning when one was added; None: none). PYTHON: the
    process's Python release as its probe recorded it (``3.11.2``; None: unknown, taken as
    this one): when it is not this verifier's, other code is *unverified*, not *stale*.
    Never raises on odd files: what cannot be read is either nothing to report (a pyc
    changed or gone since load: the cross-check's) or an *unverified* finding."""
    other = python if python is not None and python != platform.python_version() else None
    judge = _Judge(files, to_host, cache, other, verdicts)
    if cache is not None and cache.limit > 0:
        # Every comparison not cached yet, compiled on every core and cached: the loop below
        # then finds each in the cache, as it finds those of earlier calls.
        judge.deferred = {}
        for entry in files:
            if entry.kind == "bytecode" and entry.at == "load":
                with contextlib.suppress(OSError, ValueError, _Deferred):
                    judge.entry(entry)
        jobs = list(judge.deferred.items())
        judge.deferred = None
        outcomes = compilers.compare_all([job for _, (job, _, _) in jobs], here=compare)
        for (key, (_, checked, vkey)), outcome in zip(jobs, outcomes, strict=True):
            cache.put(key, dataclasses.replace(checked, outcome=outcome))
            if verdicts is not None:
                verdicts.put(vkey, outcome)
    found: dict[tuple[str, str], Drift] = {}
    shown: dict[str, str] = {}
    for entry in files:
        if entry.kind != "bytecode" or entry.at != "load":
            continue
        try:
            drifts, source_sha = judge.entry(entry)
        except (OSError, ValueError):  # an odd path (NUL byte, unencodable): nothing to judge
            drifts, source_sha = [], None
        for d in drifts:
            found.setdefault((d.id, d.path), d)
        if source_sha is not None:
            shown[entry.path] = source_sha
    if verdicts is not None:
        verdicts.save()
    return BytecodeJudgement(tuple(found.values()), shown, tuple(judge.reads.values()))


def check_bytecode(
    files: Sequence[FileEntry],
    to_host: Callable[[str], Path],
    *,
    cache: CompileCache | None = SHARED_CACHE,
    python: str | None = None,
) -> list[Drift]:
    """The drifts of ``judge_bytecode``."""
    return list(judge_bytecode(files, to_host, cache=cache, python=python).drift)


class _Judge:
    """The per-call state: how to reach files, and what the manifest says about sources."""

    def __init__(
        self,
        files: Sequence[FileEntry],
        to_host: Callable[[str], Path],
        cache: CompileCache | None,
        other_python: str | None,
        verdicts: VerdictStore | None = None,
    ) -> None:
        self.to_host = to_host
        self.verdicts = verdicts  # compile outcomes by content, across agent restarts
        self.cache = cache
        self.other_python = other_python  # the process's release, when not this verifier's
        self.sources = {f.module: f.path for f in files if f.kind == "source" and f.module}
        # When set: comparisons not cached are not compiled but kept here (cache key -> the
        # compare job and what is known without it), to be compiled together (judge_bytecode)
        self.deferred: dict[bytes, tuple[compilers.Job, Checked, str]] | None = None
        self.reads: dict[str, inputs.Input] = {}  # source -> how it was read (``inputs``)

    def entry(self, entry: FileEntry) -> tuple[list[Drift], str | None]:
        """The drifts of one loaded pyc, and the sha256 of the source it was shown to be
        compiled from (None: not shown)."""
        source = self.source_of(entry)
        if source is None:
            detail = (
                f"{entry.path} was loaded as bytecode with no source beside it (not in "
                "__pycache__), so there is no source to compare it with"
            )
            return [Drift(DRIFT_BYTECODE_SOURCELESS, entry.path, entry.module, detail)], None
        host = self.to_host(entry.path)
        try:
            head, st = read_head(host)
        except OSError:
            return [], None  # gone or unreadable now: the cross-check reports a changed pyc
        if len(head) < HEADER or u32(head, 4) not in _FLAGS:
            return [], None  # the interpreter rejects such a pyc: it is not what ran
        name = posixpath.basename(entry.path)
        pyc = _Pyc(entry, host, source, self.to_host(source), optimization(name), head, st)
        return self.against_source(pyc)

    def source_of(self, entry: FileEntry) -> str | None:
        """The source of a loaded pyc, as the process sees it (None: it has none)."""
        parent, name = posixpath.split(entry.path)
        if posixpath.basename(parent) == "__pycache__":
            return posixpath.join(posixpath.dirname(parent), name.partition(".")[0] + ".py")
        if name.count(".") >= 2 and entry.module and entry.module in self.sources:
            # A tagged name outside __pycache__ (``mod.cpython-311.pyc``) is no sourceless
            # module: it was written under sys.pycache_prefix; the probe saw its source.
            return self.sources[entry.module]
        return None

    def against_source(self, pyc: _Pyc) -> tuple[list[Drift], str | None]:
        """``entry`` for a pyc the interpreter can have used: compared with its source."""
        unread: inputs.Input = (pyc.source, inputs.FILE, inputs.CHANGING, inputs.UNREADABLE)
        try:
            src_st = os.stat(pyc.source_host)
            checked = self.check(pyc, src_st)
        except _MISSING:
            self.reads[pyc.source] = (pyc.source, inputs.FILE, inputs.ABSENT, inputs.of_bytes(None))
            return _unverified(pyc, f"{pyc.source} is missing now"), None
        except OSError as e:
            self.reads[pyc.source] = unread
            return _unverified(pyc, _unreadable(pyc, e)), None
        if checked is None:
            self.reads[pyc.source] = unread
            return _unverified(pyc, f"{pyc.source} changed while it was read"), None
        if checked.source_sha256 is not None:  # read (read_stable: with this identity)
            ident = inputs.ident_of(src_st)
            self.reads[pyc.source] = (pyc.source, inputs.FILE, ident, checked.source_sha256)
        return _verdict(pyc, src_st, checked, self.other_python)

    def check(self, pyc: _Pyc, src_st: os.stat_result) -> Checked | None:
        """PYC compared with its source, through the cache (None: the source changed while
        it was read; the next scan judges it). Raises OSError when the source is unreadable."""
        sha = pyc.entry.sha256 or ""
        key = cache_key(
            identity(pyc.entry.path, pyc.stat), identity(pyc.source, src_st), pyc.optimize, sha
        )
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is not None:
            return hit
        data = _loaded(pyc)
        if data is None:
            return Checked(loaded=False)  # not cached: an error reading it may be transient
        if data[:4] != importlib.util.MAGIC_NUMBER:
            checked = Checked(loaded=True, outcome=(False, _FOREIGN))
        else:
            got = read_stable(pyc.source_host)
            if got is None or identity("", got[1]) != identity("", src_st):
                return None
            source = got[0]
            source_sha = hashlib.sha256(source).hexdigest()
            known = Checked(
                loaded=True,
                source_sha256=source_sha,
                hash_matches=hash_matches(pyc.head, source) if pyc.hash_based else None,
            )
            # _loaded checked that the pyc's bytes are those the process loaded (its sha256)
            vkey = content_key(sha, source_sha, pyc.source, pyc.optimize, u32(pyc.head, 4))
            kept, outcome = self.verdicts.get(vkey) if self.verdicts is not None else (False, None)
            if kept:
                checked = dataclasses.replace(known, outcome=outcome)
            elif self.deferred is not None:
                self.deferred[key] = ((data, source, pyc.source, pyc.optimize), known, vkey)
                raise _Deferred
            else:
                outcome = compare(data, source, pyc.source, pyc.optimize)
                checked = dataclasses.replace(known, outcome=outcome)
                if self.verdicts is not None:
                    self.verdicts.put(vkey, outcome)
        if self.cache is not None:
            self.cache.put(key, checked)
        return checked


def _verdict(
    pyc: _Pyc, src_st: os.stat_result, checked: Checked, other_python: str | None
) -> tuple[list[Drift], str | None]:
    """The drifts a comparison makes, and the source's sha256 if the code is the source's
    (OTHER_PYTHON: the process's release, when not this verifier's)."""
    if not checked.loaded:
        return [], None  # it changed since load: the cross-check reports it
    outcome = checked.outcome
    if outcome is None:
        return [], checked.source_sha256
    found: list[tuple[str, str]]
    if outcome[0] and other_python is not None:
        detail = (
            f"{pyc.entry.path} holds other code than {pyc.source} compiles to here{outcome[1]}, "
            f"but the process runs Python {other_python} and this verifier "
            f"{platform.python_version()}: their compilers may differ, so it cannot be told"
        )
        found = [(DRIFT_BYTECODE_UNVERIFIED, detail)]
    elif outcome[0]:
        found = [(DRIFT_BYTECODE_STALE, _stale(pyc, src_st, checked, outcome[1]))]
    elif outcome[1] == _FOREIGN:
        found = [(DRIFT_BYTECODE_UNVERIFIED, _foreign(pyc))]
    else:
        found = [(DRIFT_BYTECODE_UNVERIFIED, _uncompilable(pyc, outcome[1]))]
    if pyc.unchecked:
        found.append(_unchecked(pyc, checked.hash_matches))
    return [pyc.drift(id_, detail) for id_, detail in found], None


def _unverified(pyc: _Pyc, detail: str) -> list[Drift]:
    """An unverified pyc (and unchecked, if it is), if it still holds the bytes the process
    loaded (else nothing: the cross-check reports a changed pyc)."""
    if _loaded(pyc) is None:
        return []
    found = [(DRIFT_BYTECODE_UNVERIFIED, detail)]
    if pyc.unchecked:
        found.append(_unchecked(pyc, None))
    return [pyc.drift(id_, d) for id_, d in found]


def _loaded(pyc: _Pyc) -> bytes | None:
    """The whole pyc now, if it still holds the bytes the process loaded and is the file whose
    header was read; None otherwise (a changed pyc is reported elsewhere)."""
    try:
        data, st = read(pyc.host)
    except OSError:
        return None
    if pyc.entry.sha256 is None or hashlib.sha256(data).hexdigest() != pyc.entry.sha256:
        return None
    if data[:HEADER] != pyc.head or identity("", st) != identity("", pyc.stat):
        return None
    return data


def _stale(pyc: _Pyc, src_st: os.stat_result, checked: Checked, note: str) -> str:
    """Why PYC, whose code is not its source's, was used all the same."""
    head = f"{pyc.entry.path} was compiled from other source than {pyc.source} holds{note}"
    if not pyc.hash_based:
        if stamp_matches(pyc.head, src_st):
            return f"{head}; size and mtime match, so the interpreter used it"
        return f"{head}; the process used it, and the source's size or mtime changed since"
    if pyc.unchecked:
        return f"{head}; the interpreter never checks it, so it used it"
    if checked.hash_matches:
        return f"{head}, although its embedded source hash matches, so the interpreter used it"
    return (
        f"{head}; the process used it (--check-hash-based-pycs never, or the source changed since)"
    )


def _unchecked(pyc: _Pyc, matches: bool | None) -> tuple[str, str]:
    state = {
        True: f"its embedded source hash matches {pyc.source} now, but its code is not shown "
        "to be compiled from it",
        False: f"its embedded source hash does not match {pyc.source} now",
        None: f"its code is not shown to be compiled from {pyc.source}",
    }[matches]
    detail = (
        f"{pyc.entry.path} is an unchecked-hash pyc, which the interpreter never compares with "
        f"its source; {state}"
    )
    return DRIFT_BYTECODE_UNCHECKED, detail


def _foreign(pyc: _Pyc) -> str:
    return (
        f"{pyc.entry.path} is bytecode of another Python (magic {pyc.head[:4].hex()}, this "
        f"verifier's {importlib.util.MAGIC_NUMBER.hex()}), so it cannot be compared with "
        f"{pyc.source} here"
    )


def _unreadable(pyc: _Pyc, e: OSError) -> str:
    return f"cannot read {pyc.source} to compare {pyc.entry.path} with: {_reason(e)}"


def _uncompilable(pyc: _Pyc, why: str) -> str:
    return f"cannot compare {pyc.entry.path} with {pyc.source}: {why}"


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__
