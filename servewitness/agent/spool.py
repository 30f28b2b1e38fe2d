"""A bounded on-disk spool of reports the verifier has not acknowledged yet.

One file per sequence number (``<seq>.pb``, written atomically). When the spool would exceed
its byte budget the oldest reports are dropped and counted, so the agent can say what it lost.

Beside each, ``<seq>.collected``: when reading its evidence began on the agent's age clock
(``servewitness.ageclock``: the boot id and ``CLOCK_BOOTTIME``), written before the report, so
that the agent that sends it (this one, or the next after a restart) measures how long it
waited on a clock no one can step. A report without one (spooled by an older agent, or its
reading lost) is sent as of no known age: never fresh.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import structlog

from servewitness import wire
from servewitness.ageclock import BootInstant
from servewitness.model import TargetReport

log = structlog.get_logger("servewitness.agent")


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.dropped = 0
        self.dir.mkdir(parents=True, exist_ok=True)

    def _files(self) -> list[Path]:
        return sorted(
            (p for p in self.dir.glob("*.pb") if p.stem.isascii() and p.stem.isdigit()),
            key=lambda p: int(p.stem),
        )

    def put(self, seq: int, data: bytes, collected_at: BootInstant | None = None) -> None:
        """Spool report SEQ (its bytes DATA), read from COLLECTED_AT on the age clock."""
        if collected_at is not None:  # first: a report on disk never outlives its reading
            tmp = self.dir / f".{seq}.collected.tmp"
            tmp.write_text(collected_at.to_json())
            os.replace(tmp, self._collected(seq))
        tmp = self.dir / f".{seq}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.dir / f"{seq}.pb")
        files = self._files()
        total = sum(p.stat().st_size for p in files)
        while files and total > self.max_bytes:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink()
            self._collected(int(oldest.stem)).unlink(missing_ok=True)
            self.dropped += 1

    def _collected(self, seq: int) -> Path:
        return self.dir / f"{seq}.collected"

    def collected_at(self, seq: int) -> BootInstant | None:
        """When reading report SEQ's evidence began on the age clock; None: not known."""
        try:
            return BootInstant.from_json(self._collected(seq).read_text())
        except (OSError, UnicodeDecodeError):
            return None

    def pending(self) -> list[tuple[int, bytes]]:
        return [(int(p.stem), p.read_bytes()) for p in self._files()]

    def set_aside(self, seq: int) -> Path:
        """Move report SEQ out of the queue, kept beside it as ``<seq>.pb.unreadable`` (a
        report that cannot be decoded is never delivered; its bytes stay for whoever looks)."""
        kept = self.dir / f"{seq}.pb.unreadable"
        os.replace(self.dir / f"{seq}.pb", kept)
        self._collected(seq).unlink(missing_ok=True)
        return kept

    def ack(self, seq: int) -> None:
        (self.dir / f"{seq}.pb").unlink(missing_ok=True)
        self._collected(seq).unlink(missing_ok=True)

    def last_seq(self) -> int:
        files = self._files()
        return int(files[-1].stem) if files else 0

    def load_counter(self) -> int | None:
        """The last sequence number this spool's agent used, or None for a fresh spool."""
        try:
            return int((self.dir / "seq").read_text())
        except (OSError, ValueError):
            return None

    def save_counter(self, seq: int) -> None:
        tmp = self.dir / ".seq.tmp"
        tmp.write_text(str(seq))
        os.replace(tmp, self.dir / "seq")

    def size_bytes(self) -> int:
        """Bytes of the spooled reports (read by the metrics endpoint, from another thread)."""
        total = 0
        for p in self._files():
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                continue  # acknowledged meanwhile
        return total

    def __len__(self) -> int:
        return len(self._files())


def spoolable(report: TargetReport) -> bytes:
    """REPORT's bytes, read back with the verifier's own checks first: a report the agent's
    decoder refuses would stay at the head of the spool for good (retried as if the
    verifier's reply were at fault) and its target go stale. Its request bindings, the part
    other parties write, are left out and said (``unobservable``) when they are what fails;
    a report that fails without them is still spooled, and the agent's drain sets it aside
    (``Spool.set_aside``)."""
    data = wire.report_to_bytes(report)
    try:
        wire.report_from_bytes(data)
        return data
    except wire.WireError as e:
        if not (report.spans or report.request_ids):
            return data
        why = (
            f"{len(report.spans)} request bindings and {len(report.request_ids)} request "
            f"ids left out of report {report.seq}: {e}"
        )
        log.error("bindings_left_out", reason=str(e), seq=report.seq)
        return wire.report_to_bytes(
            dataclasses.replace(
                report, spans=(), request_ids=(), unobservable=(*report.unobservable, why)
            )
        )
