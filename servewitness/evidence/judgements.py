"""A process's manifest judgement kept across agent restarts (``judge.judge``'s REUSE).

An agent that keeps running judges a process's loaded files against the installed
distributions once (origins, shadowing, bytecode, fileless and unfiled modules, ``.pth``
files: the *static* part) and keeps that part for as long as the process's manifest, its
fileless and unfiled counts and its native mappings' bytes stay the same
(``Judgement.static_key``); every later report still re-hashes every file (the cross-check).
A restarted agent had lost that memory: it parsed every ``RECORD`` and classified every file
again, about a second of CPU for a vLLM tree, for the same answer. This store keeps the static
part per *process* (boot id, pid, start ticks: a process started later, or after a reboot,
has another key and is judged afresh), so a restarted agent reuses it exactly when the
running one would have: the key is checked against what the new agent reads and hashes now,
never taken from the store.

What is not kept: the cross-check (every file is hashed again on every start), the files the
agent vouched for (``judge.cross_check``: a restarted agent vouches only for what it sees
itself), and anything of a process that is gone (each save keeps the processes of the last
collect). The store names the agent that judged: its interpreter (magic number and full
version, as the compile verdicts) and a digest of its own judging code (this package and the
model); an agent of other code judges afresh.

The trust argument is the compile verdicts' (``verdicts.py``, docs/threat-model.md): the
file lives in the agent's state directory, which the agent trusts already (whoever can write
there can forge the reports spooled beside it). It is written atomically and carries a sha256
of its content: a file that is truncated, edited, too large, or of another format, interpreter
or agent is ignored whole, with a log line, and rebuilt; never trusted in part.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from servewitness import model
from servewitness.evidence import statefile
from servewitness.evidence.inputs import Input
from servewitness.evidence.judge import Judgement
from servewitness.evidence.verdicts import MAGIC
from servewitness.model import Drift, FileOrigin, Provenance

log = structlog.get_logger(__name__)

_FAMILY = "verifier-judgements/"
FORMAT = _FAMILY + "4"  # 3: a drift row carries defined_in; 4: provenance contents
FILENAME = "judgements.json"
LIMIT = 1024  # processes: a store holds the last collect's, a vLLM tree is a few

# (boot id, pid, start ticks): one process, never another
Key = tuple[str, int, int]


@functools.cache
def judge_code() -> str:
    """A digest of the code that judges: this package's modules and the model, as installed
    (sources, else their compiled files). Another agent version has another digest."""
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) or sorted(here.glob("*.pyc"))
    files.append(Path(model.__file__).resolve())
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


class JudgementStore:
    """The static part of each process's last judgement by ``Key``, loaded from PATH (None:
    kept in memory only, nothing is read or written) and written back by ``save``."""

    def __init__(self, path: Path | None, limit: int = LIMIT) -> None:
        self.path = path
        self.limit = limit
        self.dirty = False
        self._kept: dict[Key, Judgement] = {}
        if path is not None:
            self._kept = _load(path)

    def get(self, key: Key) -> Judgement | None:
        """The judgement kept for the process KEY (only its static part and key are set:
        ``judge`` reuses it when its ``static_key`` is the one computed now), or None."""
        return self._kept.get(key)

    def keep(self, key: Key, judged: Judgement) -> None:
        """Keep JUDGED's static part for the process KEY (a judgement without a static key,
        made without a probe's manifest, is not kept)."""
        if judged.static_key is None or self.limit <= 0:
            return
        old = self._kept.get(key)
        if old is not None and _same(old, judged):
            return
        statefile.put_bounded(self._kept, key, _static_part(judged), self.limit)
        self.dirty = True

    def retain(self, keys: Iterable[Key]) -> None:
        """Forget every process but KEYS (the processes of the last collect: one gone never
        comes back under its key)."""
        wanted = set(keys)
        for key in [k for k in self._kept if k not in wanted]:
            del self._kept[key]
            self.dirty = True

    def save(self) -> None:
        """Write the store to PATH atomically, if it changed since the last save. A failure
        to write is logged, never raised: the store only saves time."""
        if self.path is None or not self.dirty:
            return
        doc = {
            "format": FORMAT,
            "magic": MAGIC,
            "python": sys.version,
            "judge": judge_code(),
            "judgements": [[*k, _encode(j)] for k, j in self._kept.items()],
        }
        if statefile.save(self.path, doc, "judgement_cache"):
            self.dirty = False

    def __len__(self) -> int:
        return len(self._kept)


def _static_part(j: Judgement) -> Judgement:
    return Judgement(
        (), j.provenance, (), j.static_key, j.static_drift, owners=j.owners, disk=j.disk
    )


def _same(a: Judgement, b: Judgement) -> bool:
    return (
        a.static_key == b.static_key
        and a.owners == b.owners
        and a.disk == b.disk
        and a.static_drift == b.static_drift
        and a.provenance == b.provenance
    )


def _encode(j: Judgement) -> dict[str, Any]:
    p = j.provenance
    return {
        "key": list(j.static_key) if j.static_key is not None else None,
        "provenance": None
        if p is None
        else {
            "counts": [list(c) for c in p.counts],
            "files": [_origin_row(f) for f in p.files],
            "distributions": [list(d) for d in p.distributions],
            "contents": [list(c) for c in p.contents],
        },
        "drift": [[d.id, d.path, d.module, d.detail, list(d.defined_in)] for d in j.static_drift],
        "owners": [list(o) for o in j.owners],
        "disk": [[path, kind, list(ident), digest] for path, kind, ident, digest in j.disk],
    }


def _origin_row(f: FileOrigin) -> list[str | None]:
    return [
        f.path,
        f.origin,
        f.reason,
        f.distribution,
        f.version,
        f.record_path,
        f.sha256,
        f.expected_sha256,
    ]


def _load(path: Path) -> dict[Key, Judgement]:
    """The judgements PATH holds, or none (with a log line) if it is not a whole, unedited
    store of this format written by this interpreter and this agent's code
    (``statefile.load``)."""
    doc = statefile.load(path, "judgement_cache")
    if doc is None:
        return {}
    if isinstance(doc, dict) and str(doc.get("format")).startswith(_FAMILY):
        head = tuple(doc.get(k) for k in ("format", "magic", "python", "judge"))
        if head != (FORMAT, MAGIC, sys.version, judge_code()):  # an upgrade, as a rule
            log.info("judgement_cache_other_agent", path=str(path), format=str(head[0]))
            return {}
    try:
        return _parse(doc)
    except ValueError as e:
        log.warning("judgement_cache_ignored", path=str(path), reason=str(e))
        return {}


def _parse(doc: object) -> dict[Key, Judgement]:
    """The judgements of a decoded store. Raises ValueError on anything not as ``save``
    writes."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not a judgement store of this format")
    if not all(isinstance(doc.get(k), str) for k in ("magic", "python", "judge")):
        raise ValueError("no interpreter or agent named")
    rows = doc.get("judgements")
    if not isinstance(rows, list):
        raise ValueError("no judgement list")
    out: dict[Key, Judgement] = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4):
            raise ValueError("a malformed judgement")
        boot, pid, ticks, entry = row
        if not (isinstance(boot, str) and _is_int(pid) and _is_int(ticks)):
            raise ValueError("a malformed process key")
        out[(boot, pid, ticks)] = _decode(entry)
    return out


def _decode(entry: object) -> Judgement:
    if not isinstance(entry, dict):
        raise ValueError("a malformed judgement")
    key = _row(entry.get("key"), (str, str))
    p = entry.get("provenance")
    provenance = None
    if p is not None:
        if not isinstance(p, dict):
            raise ValueError("a malformed provenance")
        provenance = Provenance(
            counts=tuple(_row(c, (str, int)) for c in _list(p.get("counts"))),
            files=tuple(
                FileOrigin(*_row(f, (str, str, str, _OPT, _OPT, _OPT, _OPT, _OPT)))
                for f in _list(p.get("files"))
            ),
            distributions=tuple(_row(d, (str, str, int)) for d in _list(p.get("distributions"))),
            contents=tuple(_row(c, (str, str, str)) for c in _list(p.get("contents"))),
        )
    drift = tuple(_drift(d) for d in _list(entry.get("drift")))
    owners = tuple(_row(o, (str, _OPT)) for o in _list(entry.get("owners")))
    disk = tuple(_input(d) for d in _list(entry.get("disk")))
    return Judgement((), provenance, (), key, drift, owners=owners, disk=disk)


def _drift(value: object) -> Drift:
    fid, path, module, detail, defined_in = _row(value, (str, str, _OPT, str, list))
    if not all(isinstance(p, str) for p in defined_in):
        raise ValueError("a malformed judgement")
    return Drift(fid, path, module, detail, tuple(defined_in))


def _input(value: object) -> Input:
    """One read of a judgement's disk (``inputs.Input``): an identity is 0, 1 or 5 ints."""
    path, kind, ident, digest = _row(value, (str, str, list, str))
    if len(ident) not in (0, 1, 5) or not all(map(_is_int, ident)):
        raise ValueError("a malformed judgement")
    return path, kind, tuple(ident), digest


_OPT = (str, type(None))


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("a malformed judgement")
    return value


def _row(value: object, types: tuple[Any, ...]) -> tuple[Any, ...]:
    """VALUE, a list of len(TYPES) items each of its type (an int is never a bool), as a
    tuple; ValueError otherwise."""
    if not isinstance(value, list) or len(value) != len(types):
        raise ValueError("a malformed judgement")
    for v, t in zip(value, types, strict=True):
        if not isinstance(v, t) or (t is int and isinstance(v, bool)):
            raise ValueError("a malformed judgement")
    return tuple(value)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
