"""Read a probe's ``bindings.jsonl`` incrementally: only what was appended since the last read.

The file is append-only (format in ``servewitness_probe.layout``). The reader keeps, per file
path, the inode and the byte offset of the complete lines it consumed:

* a partial last line is left for the next read;
* a different inode, or a file shorter than the offset, means a new file: read from the start;
* a line that is not a well-formed record is skipped and counted (``malformed``), a record
  of an unknown kind too (``unknown``);
* a missing or unreadable file gives nothing (and keeps the offset).

An agent restarted with the map ``offsets()`` returned before (persisted by the caller) passes
it as ``start`` and does not send the same records again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servewitness_probe import layout as L

from servewitness.evidence.journal import load_record
from servewitness.evidence.regular import open_file
from servewitness.model import RequestSpec

MAX_READ = 64 << 20  # bytes read per call and file; the rest on the next call


@dataclass(frozen=True)
class RequestSpan:
    """Steps of the process that served one engine request (a ``"req"`` record)."""

    internal_id: str
    first_step: int
    last_step: int
    steps: int
    tokens: int
    first_unix_ns: int
    last_unix_ns: int
    files_first: int  # file records in the journal at its first step
    files_last: int  # ... and at its last step
    hooks: dict[str, int]  # hook name -> fires from its first step to its close
    finished: bool  # False: still open when the process exited
    spec: RequestSpec | None = None  # speculative decoding (None: off, or an older probe)


@dataclass(frozen=True)
class ExternalId:
    """The API server's external id for one internal id (an ``"ext"`` record)."""

    internal_id: str
    external_id: str
    unix_ns: int
    x_request_id: str | None = None  # the client's raw X-Request-Id, when recorded


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(v)
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(v)
    return v


def _span(rec: dict[str, Any]) -> RequestSpan:
    hooks = rec["hooks"]
    if not isinstance(hooks, dict):
        raise ValueError(hooks)
    end = rec["end"]
    if end not in ("finished", "open"):
        raise ValueError(end)
    return RequestSpan(
        internal_id=_str(rec["id"]),
        first_step=_int(rec["s0"]),
        last_step=_int(rec["s1"]),
        steps=_int(rec["n"]),
        tokens=_int(rec["tok"]),
        first_unix_ns=_int(rec["t0"]),
        last_unix_ns=_int(rec["t1"]),
        files_first=_int(rec["f0"]),
        files_last=_int(rec["f1"]),
        hooks={_str(k): _int(v) for k, v in hooks.items()},
        finished=end == "finished",
        spec=_spec(rec.get("spec")),
    )


def _spec(raw: Any) -> RequestSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(raw)
    pos = raw["pos"]
    if not isinstance(pos, list) or len(pos) > L.SPEC_POSITIONS:
        raise ValueError(pos)
    counts = [_int(raw[k]) for k in ("drafts", "draft_tokens", "accepted", "emitted")]
    if min(counts) < 0 or any(_int(p) < 0 for p in pos):
        raise ValueError(raw)
    return RequestSpec(
        drafts=counts[0],
        draft_tokens=counts[1],
        accepted_tokens=counts[2],
        accepted_per_position=tuple(_int(p) for p in pos),
        emitted_tokens=counts[3],
    )


def _ext(rec: dict[str, Any]) -> ExternalId:
    xrid = rec.get("xrid")
    return ExternalId(
        internal_id=_str(rec["id"]),
        external_id=_str(rec["ext"]),
        unix_ns=_int(rec["t"]),
        x_request_id=None if xrid is None else _str(xrid),
    )


class BindingsReader:
    """Incremental reader of ``bindings.jsonl`` files. START: ``{path: (inode, offset)}``
    as ``offsets()`` returned it, to resume after a restart."""

    def __init__(self, start: dict[str, tuple[int, int]] | None = None) -> None:
        self._offsets: dict[str, tuple[int, int]] = dict(start or {})
        self.malformed = 0  # lines skipped as garbled so far, all files together
        self.unknown = 0  # well-formed records of a kind this reader does not know

    def offsets(self) -> dict[str, tuple[int, int]]:
        """``{path: (inode, offset)}`` of every file read: what to persist and pass back."""
        return dict(self._offsets)

    def seed(self, path: Path, inode: int, offset: int) -> None:
        """Resume PATH (a ``bindings.jsonl``) at OFFSET while its inode is INODE."""
        self._offsets[str(path)] = (inode, offset)

    def read(
        self, probe_dir: Path, allowed: frozenset[tuple[int, int]] | None = None
    ) -> tuple[list[RequestSpan], list[ExternalId]]:
        """Records appended to PROBE_DIR's ``bindings.jsonl`` since the previous call.
        ALLOWED: the (device, inode) the file must have (``ProbeState.bindings_file``: the file
        its process holds open); another file there is not read (nor its offset moved)."""
        path = Path(probe_dir) / L.BINDINGS_FILE
        key = str(path)
        try:
            with open_file(path, nofollow=True) as f:
                st = os.fstat(f.fileno())
                if allowed is not None and (st.st_dev, st.st_ino) not in allowed:
                    return [], []
                ino, offset = self._offsets.get(key, (st.st_ino, 0))
                if ino != st.st_ino or st.st_size < offset:
                    ino, offset = st.st_ino, 0  # replaced or truncated: a new file
                f.seek(offset)
                raw = f.read(MAX_READ)
        except OSError:
            return [], []
        complete = raw[: raw.rfind(b"\n") + 1]
        self._offsets[key] = (ino, offset + len(complete))
        spans: list[RequestSpan] = []
        exts: list[ExternalId] = []
        for line in complete.split(b"\n"):
            if not line.strip():
                continue
            try:
                rec = load_record(line)
                kind = rec["k"]
                if kind == "req":
                    spans.append(_span(rec))
                elif kind == "ext":
                    exts.append(_ext(rec))
                else:
                    self.unknown += 1  # a kind from a newer probe: not an error
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                self.malformed += 1
        return spans, exts
