"""A probe's journal as a reader sees it: the records it holds, the manifest they describe,
and whether it is the journal the probe wrote.

The journal (``journal.jsonl``, ``servewitness_probe.layout``) is written by the probed process:
the workload can edit it. Each record carries ``seq`` (its place) and the probe counts the
records it wrote in shared memory (``S_JOURNAL_RECORDS``); ``journal_problems`` says when a
journal as read cannot be the one the probe wrote, and ``JournalCache`` (the agent's) keeps
what it read, so a record deleted after it was read stays in the evidence. Any bytes parse:
a garbled line is skipped (and, numbered, leaves a gap), a string that is not valid Unicode
is escaped (``load_record``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import json.scanner
import operator
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

from servewitness.evidence.regular import open_regular
from servewitness.model import (
    FileEntry,
    FileIdentity,
    LeafFields,
    manifest_digest,
    manifest_leaf,
    merkle_root_of_leaves,
)

# A \uD800-\uDFFF escape, which may decode to a lone surrogate: a file name's undecodable bytes
# (Python's surrogateescape) or a hostile string, valid JSON either way; or \u0000, a NUL (a
# request id a client chose, say), which no text column of PostgreSQL stores.
_SURROGATE_ESCAPE = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")


def _valid_unicode(v: Any) -> Any:
    """V with every string that is not valid Unicode escaped (a lone surrogate becomes the
    six characters ``\udcff``), and every NUL (the four characters ``\\x00``): what the wire
    (protobuf strings are UTF-8) can carry and a verifier's database can store."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            v = v.encode("utf-8", "backslashreplace").decode("utf-8")
        return v.replace("\x00", "\\x00") if "\x00" in v else v
    if isinstance(v, list):
        return [_valid_unicode(x) for x in v]
    if isinstance(v, dict):
        return {_valid_unicode(k): _valid_unicode(x) for k, x in v.items()}
    return v


def load_record(line: bytes) -> Any:
    """One JSON line written by the probed process (``json.loads``; raises ValueError or
    RecursionError as it does). Strings that are not valid Unicode come back escaped (see
    ``_valid_unicode``), so whatever a journal says can be reported. A line with more than
    MAX_BRACKETS brackets outside its strings is no record (ValueError): how deep a JSON
    reader may nest depends on how deep the stack it is called from is, so a line near that
    limit would read as a record from one caller and as garbled from another; the probe's
    records nest three deep."""
    if line.count(b"[") + line.count(b"{") > MAX_BRACKETS:
        bare = _outside_strings(line)
        if bare.count(b"[") + bare.count(b"{") > MAX_BRACKETS:
            raise ValueError(f"more than {MAX_BRACKETS} brackets: nested too deep for a record")
    rec = json.loads(line)
    return _valid_unicode(rec) if _SURROGATE_ESCAPE.search(line) else rec


MAX_BRACKETS = 200


def _outside_strings(line: bytes) -> bytes:
    """What of LINE, valid JSON, is outside its strings: its escapes (a backslash and the next
    byte, left to right, as JSON reads them) dropped, then every other run between quotes. C
    passes only: linear in the line whatever it holds. (Invalid JSON gives some bytes, and
    json.loads refuses the line anyway.)"""
    return b"".join(line.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[0::2])


def parse(lines: list[bytes]) -> list[dict[str, Any]]:
    """The JSON objects of LINES, each line read alone (``load_record``): a blank line is
    skipped, and so is a garbled one, or one that holds anything but an object."""
    out: list[dict[str, Any]] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = load_record(line)
        except (ValueError, RecursionError):  # garbled, not UTF-8, or nested too deep
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


# The C scanner json.loads uses, called at an index: one value, no wrapper (typeshed types its
# argument as a scanner; it takes the decoder whose settings it reads)
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_WINDOW = 1 << 15  # bytes of whole lines decoded and scanned at a time (bounds the memory)
# Lines with more brackets than this (strings included) are read by ``parse``, which holds
# them to MAX_BRACKETS outside their strings; the scanner here reads only lines below both.
_SHALLOW = 100


def parse_text(raw: bytes) -> list[dict[str, Any]]:
    """``parse(raw.split(b"\n"))``: the same records, in about two thirds of the time. Each
    line is read alone, as ``parse`` reads it: the JSON scanner reads one value from each
    line's own string (called from ``map``, with no Python step per line), and a line is
    taken as parsed only when that value is all of it. Every other line (blank, garbled, two
    values, whitespace around one, a byte-order mark, UTF-16, more than ``_SHALLOW``
    brackets) is read by ``parse``, which says what ``json.loads`` makes of it. The bytes are
    taken ``_WINDOW`` of whole lines at a time; a window that is not strict UTF-8 or holds an
    escape that may be a lone surrogate (``load_record``'s cases) is read by ``parse``."""
    out: list[dict[str, Any]] = []
    start, end = 0, len(raw)
    while start < end:
        stop = end
        if end - start > _WINDOW:
            stop = raw.rfind(b"\n", start, start + _WINDOW) + 1
            if stop <= start:  # one line longer than the window: the window is that line
                nl = raw.find(b"\n", start + _WINDOW)
                stop = end if nl < 0 else nl + 1
        _parse_window(raw[start:stop], out)
        start = stop
    return out


def _parse_window(raw: bytes, out: list[dict[str, Any]]) -> None:
    """The records of RAW (whole lines, the last one's newline may be missing) appended to
    OUT (see ``parse_text``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        out += parse(raw.split(b"\n"))
        return
    if _SURROGATE_ESCAPE.search(raw):
        out += parse(raw.split(b"\n"))
        return
    lines = text.split("\n")
    if len(lines) > 1 and not lines[-1]:
        lines.pop()  # what follows the window's last newline: nothing
    bracketed = list(
        map(operator.add, map(str.count, lines, repeat("[")), map(str.count, lines, repeat("{")))
    )
    scanned = lines
    if bracketed and max(bracketed) > _SHALLOW:
        scanned = [line if b <= _SHALLOW else "" for line, b in zip(lines, bracketed, strict=True)]
    got: list[tuple[Any, int] | None] = []
    values = map(_scan, scanned, repeat(0))
    while len(got) < len(lines):
        # (a line that does not start with a value ends the extend, StopIteration; one that
        # makes the scanner raise too: either way that line is read by parse below, and the
        # same map goes on from the line after it)
        with contextlib.suppress(ValueError, RecursionError):
            got.extend(values)
        if len(got) < len(lines):
            got.append(None)
    if None not in got and list(map(itemgetter(1), got)) == list(map(len, lines)):  # type: ignore[arg-type]
        out += [rec for rec, _ in got if rec.__class__ is dict]  # type: ignore[misc]
        return
    for line, value in zip(lines, got, strict=True):
        if value is not None and value[1] == len(line):
            if value[0].__class__ is dict:
                out.append(value[0])
        else:  # not one value alone on its line: what json.loads makes of it, if anything
            out += parse([line.encode()])


FileId = tuple[int, int]  # (device, inode)
MAX_JOURNAL_BYTES = 1 << 30  # a worker's journal is a few MB


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Complete JSON records of a journal; a partial or garbled line is skipped."""
    got = read_file(path)
    return parse_text(got[0]) if got is not None else []


def read_file(path: Path) -> tuple[bytes, FileId] | None:
    """PATH's bytes and (device, inode), read from one descriptor; None when it cannot be
    opened (missing, a symbolic link or anything but a regular file: a probe writes regular
    files only, and a FIFO would hang the read)."""
    try:
        fd = open_regular(path, nofollow=True)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_size > MAX_JOURNAL_BYTES:
            return None  # a sparse terabyte where the journal was: not read into memory
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), (st.st_dev, st.st_ino)
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass
class _Cached:
    dev: int
    ino: int
    offset: int  # bytes of complete lines consumed
    prefix_sha256: bytes  # of those bytes: the cache is used only while they are unchanged
    records: list[dict[str, Any]]
    files: tuple[FileEntry, ...]
    hashed_at: dict[str, float]
    digest: str
    # Why this journal is known to have been edited after it was read (sticky); then
    # ``records`` also holds every record read before the edit (what was read stays read).
    rewritten: str | None = None


class JournalCache:
    """Parses each journal once and then only what was appended. The journal is append-only:
    a different inode, a shorter file, or any change to the bytes already parsed (checked by
    their sha256 on every read, about a millisecond for a worker's journal) means it was
    edited after it was read. It is then parsed again from the start, and the edit is
    remembered (``rewritten``, for as long as the cache lives) with every record read before
    it: a record deleted from the journal after the agent read it stays in the evidence, and
    the edit is a finding. Files and the manifest digest are recomputed only when new file
    records arrived. For a reader that looks at the same processes again and again (the agent)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Cached] = {}

    def records(self, path: Path) -> _Cached | None:
        got = read_file(path)
        if got is None:
            self._entries.pop(str(path), None)
            return None
        raw, (dev, ino) = got
        entry = self._entries.get(str(path))
        seen: list[dict[str, Any]] = []
        why = None
        if entry is not None:
            if (entry.dev, entry.ino) != (dev, ino):
                # (a process that exec'd itself also starts a new journal under its name:
                # what it ran before the exec is then gone from its evidence, and said so)
                why = "replaced by another file"
            elif len(raw) < entry.offset:
                why = f"cut to {len(raw)} bytes"
            # An edit in place of what was already parsed (a tampered record) is seen too.
            elif hashlib.sha256(raw[: entry.offset]).digest() != entry.prefix_sha256:
                why = "changed in the bytes already read"
            if why is not None:
                why = f"{why} after the agent had read {entry.offset} bytes of it"
                seen, why = entry.records, entry.rewritten or why
        if entry is None or why is not None:
            entry = _Cached(
                dev, ino, 0, hashlib.sha256(b"").digest(), [], (), {}, manifest_digest(())
            )
            entry.rewritten = why
        new = raw[entry.offset :]
        complete = new[: new.rfind(b"\n") + 1]
        entry.offset += len(complete)
        entry.prefix_sha256 = hashlib.sha256(raw[: entry.offset]).digest()
        fresh = parse_text(complete)
        if seen:
            entry.records = _union(seen, fresh)
        else:
            entry.records.extend(fresh)
        if seen or any(r.get("k") == "file" for r in fresh):
            entry.files, entry.hashed_at = manifest_of(entry.records)
            entry.digest = digest_of(entry.files)
        self._entries[str(path)] = entry
        return entry

    def forget_missing(self, alive: set[str]) -> None:
        for key in [k for k in self._entries if k not in alive]:
            del self._entries[key]


def _union(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records read BEFORE an edit, then those of the journal NOW that are not among them (in
    the order read): nothing read is dropped, and a record changed in place is there twice."""
    known = {_text(r) for r in before}
    return before + [r for r in now if (key := _text(r)) is None or key not in known]


def _text(record: dict[str, Any]) -> str | None:
    """RECORD as canonical JSON, to compare; None when it cannot be written back (nested past
    what the encoder takes from here: the journal is the workload's to write), and then it
    is never taken for one read before."""
    try:
        return json.dumps(record, sort_keys=True)
    except (ValueError, RecursionError, TypeError):
        return None


def journal_problems(
    records: list[dict[str, Any]], counted: tuple[int, int] | None, rewritten: str | None = None
) -> list[str]:
    """Why RECORDS (a journal as read) are not the journal the probe wrote; empty when
    nothing says so. Every record carries ``seq``, its index (``layout``). COUNTED: the
    probe's count of records written (``S_JOURNAL_RECORDS``) read just before and just after
    the journal (None where no counters were read); the probe counts a record before writing
    it, one at a time, so an honest journal holds from the first count less one (a record
    mid-write, which ``read_probe_dir`` reads again for) to the second. REWRITTEN: what the
    agent saw change after it had read it (``JournalCache``). A workload that rewrites its
    journal and its count consistently before anyone read them is not caught here: see
    docs/threat-model.md."""
    if rewritten:
        return [f"the journal was {rewritten}"]
    problems = []
    if counted is not None or any("seq" in r for r in records):
        for i, r in enumerate(records):
            seq = r.get("seq")
            if seq != i or isinstance(seq, bool):
                problems.append(
                    f"record {i} of the journal carries seq {seq!r}: records before it were "
                    "deleted, or records were inserted or reordered"
                )
                break
    if counted is not None:
        before, after = counted
        if len(records) > after:
            problems.append(
                f"the journal holds {len(records)} records and the probe wrote {after}: "
                "records were added by something else"
            )
        elif len(records) < before:
            problems.append(
                f"the probe wrote {before} records and the journal holds {len(records)}: "
                "records at its end were deleted or cut off"
            )
    return problems


def identity_of(value: Any) -> FileIdentity | None:
    """A file identity as a journal record carries it (``[dev, ino, size, mtime_ns,
    ctime_ns]``, ``servewitness_probe._imports``); None for anything else, as the journal is the
    probed process's to write."""
    if value.__class__ is not list or len(value) != 5:
        return None
    dev, ino, size, mtime_ns, ctime_ns = value
    # Exactly int (a JSON number or a bool, and a bool is no identity's), and looked at before
    # the cache: 1, 1.0 and True are equal keys.
    if not (
        dev.__class__ is int
        and ino.__class__ is int
        and size.__class__ is int
        and mtime_ns.__class__ is int
        and ctime_ns.__class__ is int
    ):
        return None
    key = (dev, ino, size, mtime_ns, ctime_ns)
    known = _IDENTITIES.get(key)
    if known is not None:
        return known
    if min(dev, ino, size) < 0 or max(dev, ino) >= 1 << 64:
        return None
    if max(abs(size), abs(mtime_ns), abs(ctime_ns)) >= 1 << 63:
        return None
    if len(_IDENTITIES) >= _IDENTITIES_MAX:
        _IDENTITIES.clear()
    got = _IDENTITIES[key] = FileIdentity(dev, ino, size, mtime_ns, ctime_ns)
    return got


# Identities read already, by their five numbers: the processes of one tree load the same
# files, so most of a journal's identities are another's (one object each; a cache only).
_IDENTITIES: dict[tuple[int, int, int, int, int], FileIdentity] = {}
_IDENTITIES_MAX = 1 << 17


def manifest_of(records: list[dict[str, Any]]) -> tuple[tuple[FileEntry, ...], dict[str, float]]:
    """The manifest a journal's file records describe (the latest record of each path), and
    when the probe hashed each file (the process's wall clock; where the record says). Each
    entry carries the file's identity when hashed (``stat``) and, for an extension module,
    when it was loaded (``loaded``), where the record has a well-formed one.

    One exception to "the latest": a pyc is ``rejected`` only if every time its loader read it
    that read was rejected. Each ``rejected`` record follows the read it rejects (same path
    and sha256); a read left over was used, so its record stands for the path. Otherwise a
    module running from a pyc could call its loader's ``get_code`` again after making the pyc
    stale and have the latest record say that the pyc never ran."""
    latest: dict[str, dict[str, Any]] = {}
    used: dict[str, list[dict[str, Any]]] = {}  # per pyc, its reads not (yet) rejected
    for rec in records:
        path = rec.get("path")
        if rec.get("k") != "file" or not isinstance(path, str):
            continue
        at = rec.get("at")
        if at == "load" and rec.get("kind") == "bytecode":
            used.setdefault(path, []).append(rec)
        elif at == "rejected":
            reads = used.get(path, [])
            for i in range(len(reads) - 1, -1, -1):
                if reads[i].get("sha256") == rec.get("sha256"):
                    del reads[i]
                    break
        latest[path] = rec
    for path, rec in latest.items():
        if rec.get("at") == "rejected" and used.get(path):
            latest[path] = used[path][-1]
    hashed_at: dict[str, float] = {}
    entries: list[FileEntry] = []
    for path, rec in latest.items():
        t = rec.get("t")
        if isinstance(t, (int, float)):
            hashed_at[path] = t
        sha = rec.get("sha256")
        size = rec.get("size")
        entries.append(
            FileEntry(
                path=path,
                sha256=sha if isinstance(sha, str) else None,
                size=size if size.__class__ is int else -1,  # a bool is no size
                kind=str(rec.get("kind", "")),
                module=rec.get("module") if isinstance(rec.get("module"), str) else None,
                at=str(rec.get("at", "")),
                identity=identity_of(rec.get("stat")),
                loaded=identity_of(rec.get("loaded")),
            )
        )
    return tuple(sorted(entries, key=_PATH)), hashed_at


_PATH = attrgetter("path")
digest_of = manifest_digest  # a journal's manifest's digest (ProcessReport.manifest_digest)


def _fields(rec: dict[str, Any]) -> tuple[str | None, int, str, str | None, str]:
    """A file record's (sha256, size, kind, module, at) as ``manifest_of`` makes its entry."""
    sha, size, module = rec.get("sha256"), rec.get("size"), rec.get("module")
    return (
        sha if isinstance(sha, str) else None,
        size if size.__class__ is int else -1,  # as manifest_of: a bool is no size
        str(rec.get("kind", "")),
        module if isinstance(module, str) else None,
        str(rec.get("at", "")),
    )


def manifest_digest_at(records: list[dict[str, Any]], files: int) -> str:
    """The manifest digest of a journal's first FILES file records (what was loaded when a
    step that saw FILES of them ran)."""
    return manifest_digests_at(records, (files,))[files]


def manifest_digests_at(records: list[dict[str, Any]], counts: Iterable[int]) -> dict[int, str]:
    """``manifest_digest_at(records, n)`` for every N of COUNTS, in one pass over RECORDS: a
    worker's request spans name a few file counts each, and a manifest per count (every
    record decoded into a FileEntry, every leaf hashed again) cost a restarted agent ~0.3 s.

    The same rules as ``manifest_of``: the latest record of each path stands for it, except a
    pyc's ``rejected`` record while one of its reads was not rejected (each path's standing
    record changes only with a record of that path, so it is kept as the records go by); each
    entry's leaf is made from the fields ``manifest_of`` gives its ``FileEntry`` (``_fields``)."""
    wanted = sorted(set(counts))
    out: dict[int, str] = {}
    standing: dict[str, dict[str, Any]] = {}  # path -> the record standing for it
    unrejected: dict[str, list[dict[str, Any]]] = {}  # per pyc, its reads still used
    leaves: dict[LeafFields, bytes] = {}

    def digest() -> str:
        entries = sorted((p, *_fields(r)) for p, r in standing.items())
        level = [leaves.get(e) or leaves.setdefault(e, manifest_leaf(e)) for e in entries]
        return merkle_root_of_leaves(level)

    picked = 0
    for rec in records:
        if rec.get("k") != "file":
            continue
        while wanted and wanted[0] <= picked:
            out[wanted.pop(0)] = digest()
        if not wanted:
            return out
        picked += 1
        path = rec.get("path")
        if not isinstance(path, str):
            continue
        at, sha = rec.get("at"), rec.get("sha256")
        if at == "load" and rec.get("kind") == "bytecode":
            unrejected.setdefault(path, []).append(rec)
        elif at == "rejected":
            reads = unrejected.get(path, [])
            for i in range(len(reads) - 1, -1, -1):
                if reads[i].get("sha256") == sha:
                    del reads[i]
                    break
        used = unrejected.get(path)
        standing[path] = used[-1] if at == "rejected" and used else rec
    if wanted:
        last = digest()
        out.update(dict.fromkeys(wanted, last))
    return out
