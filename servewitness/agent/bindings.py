"""Request bindings for the agent's reports: what each probed process appended to its
``bindings.jsonl`` since the last report, turned into ``RequestSpan`` / ``RequestId`` with the
manifest digest in force at each request's first and last step.

The probe counts ``file`` records as it journals them (``S_FILES_RECORDED``); a span's
``files_first`` / ``files_last`` say how many there were at its steps, so the manifest in force
is the digest of the journal's first F file records, computed the way the probe reader
computes the whole manifest's (the last record of a path wins). A request whose steps saw a
file load maps to both digests.

The reader's offsets are saved next to the spool after each report is spooled, so a
restarted agent neither resends nor skips (what it read and had not spooled yet, when it
died, is lost: at most one report's worth).
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path

import structlog
from servewitness_probe import layout as L

from servewitness.evidence.bindings_reader import BindingsReader, ExternalId
from servewitness.evidence.bindings_reader import RequestSpan as ProbeSpan
from servewitness.evidence.journal import (
    JournalCache,
    manifest_digest_at,
    manifest_digests_at,
)
from servewitness.evidence.process import ProcessEvidence
from servewitness.model import ProcessKey, RequestId, RequestSpan
from servewitness.wire import fields as F

log = structlog.get_logger("servewitness.agent.bindings")

PER_REPORT = 20_000  # bindings in one report; the rest wait for the next


class Bindings:
    """Reads every probed process's bindings; hands out at most PER_REPORT per report."""

    def __init__(self, state: Path | None = None, per_report: int = PER_REPORT) -> None:
        self.state = state
        self.per_report = per_report
        self.reader = BindingsReader(self._load())
        self._spans: deque[RequestSpan] = deque()
        self._ids: deque[RequestId] = deque()
        self._digests: dict[tuple[str, int], str] = {}

    def _load(self) -> dict[str, tuple[int, int]]:
        if self.state is None:
            return {}
        try:
            raw = json.loads(self.state.read_text())
            return {str(k): (int(v[0]), int(v[1])) for k, v in raw.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, IndexError) as e:
            log.warning("bindings_offsets_unreadable", path=str(self.state), error=str(e))
            return {}

    def save(self) -> None:
        """Persist the reader's offsets (after the report that carries them is spooled)."""
        if self.state is None:
            return
        tmp = self.state.with_name(self.state.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.reader.offsets()))
            os.replace(tmp, self.state)
        except OSError as e:
            log.warning("bindings_offsets_not_saved", path=str(self.state), error=str(e))

    def collect(
        self, found: list[ProcessEvidence], journals: JournalCache
    ) -> tuple[tuple[RequestSpan, ...], tuple[RequestId, ...]]:
        for ev in found:
            if ev.probe is None:
                continue
            directory = Path(ev.probe.directory)
            spans, ids = self.reader.read(directory, ev.probe.bindings_file)
            if not spans and not ids:
                continue
            ident = ev.identity
            key = ProcessKey(ident.boot_id, ident.pid, ident.start_ticks)
            runner = ev.probe.runner.cls if ev.probe.runner is not None else ""
            journal = directory / L.JOURNAL_FILE
            bound = ev.probe.journal_file
            counts = {n for s in spans for n in (s.files_first, s.files_last)}
            self._prefetch(journal, counts, journals, bound)
            for s in spans:
                self._spans.append(self._span(key, s, runner, (journal, bound), journals))
            for r in ids:
                self._ids.append(_request_id(key, r))
        n = min(self.per_report, len(self._spans))
        spans_out = tuple(self._spans.popleft() for _ in range(n))
        m = min(self.per_report - n, len(self._ids))
        ids_out = tuple(self._ids.popleft() for _ in range(m))
        return spans_out, ids_out

    def _span(
        self,
        key: ProcessKey,
        s: ProbeSpan,
        runner: str,
        journal: tuple[Path, tuple[int, int] | None],
        journals: JournalCache,
    ) -> RequestSpan:
        return RequestSpan(
            process=key,
            internal_id=F.bounded_internal_id(s.internal_id),
            first_step=s.first_step,
            last_step=max(s.last_step, s.first_step),
            steps=s.steps,
            tokens=s.tokens,
            first_unix=s.first_unix_ns / 1e9,
            last_unix=s.last_unix_ns / 1e9,
            manifest_first=self._digest(journal[0], s.files_first, journals, journal[1]),
            manifest_last=self._digest(journal[0], s.files_last, journals, journal[1]),
            runner=runner,
            hooks=tuple(sorted(s.hooks.items())),
            finished=s.finished,
            spec=s.spec,
        )

    def _prefetch(
        self, journal: Path, counts: set[int], journals: JournalCache, bound: tuple[int, int] | None
    ) -> None:
        """The digests of ``_digest`` for every file count of COUNTS not known yet, from one
        pass over the journal's records."""
        missing = {n for n in counts if (str(journal), n) not in self._digests}
        if len(missing) < 2:
            return  # one (or none): ``_digest`` takes it as it comes
        cached = journals.records(journal)
        if cached is None or (bound is not None and (cached.dev, cached.ino) != bound):
            return  # ``_digest`` says "" for each
        if len(self._digests) + len(missing) > 10_000:
            self._digests.clear()
        for n, got in manifest_digests_at(cached.records, missing).items():
            self._digests[(str(journal), n)] = got

    def _digest(
        self, journal: Path, files: int, journals: JournalCache, bound: tuple[int, int] | None
    ) -> str:
        """The manifest digest of the first FILES file records of JOURNAL ("": unknown). BOUND:
        the journal's (device, inode) as checked against its process; another file under its
        name (swapped in since) is not read."""
        key = (str(journal), files)
        got = self._digests.get(key)
        if got is None:
            cached = journals.records(journal)
            if cached is not None and bound is not None and (cached.dev, cached.ino) != bound:
                return ""
            got = manifest_digest_at(cached.records, files) if cached is not None else ""
            if len(self._digests) > 10_000:
                self._digests.clear()
            self._digests[key] = got
        return got


def _request_id(key: ProcessKey, r: ExternalId) -> RequestId:
    """R as reported: an id over what a database indexes (a client's ``X-Request-Id`` of
    5,000 characters is served) with its client part made a digest, prefix and suffix kept
    (``fields.bounded_external_id``), so the stored client id is what a query by the
    client's id computes; the internal id bounded as ``_span`` bounds the same id, so the two
    still meet."""
    internal = F.bounded_internal_id(r.internal_id)
    return RequestId(key, internal, F.bounded_external_id(r.external_id), r.unix_ns / 1e9)
