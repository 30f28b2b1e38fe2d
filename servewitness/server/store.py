"""Storage of runs, reports, manifests, verdict history and request bindings: SQLite (one file;
nothing to install) or PostgreSQL (a URL; for a fleet), behind ``db.Database``.

Durability: SQLite runs a WAL journal with ``synchronous=FULL``; in both, a report is
acknowledged only after its transaction commits, so a verifier killed after acknowledging
loses nothing. Manifests are content-addressed by their Merkle digest: a thousand processes
loading the same files store the list once; each file hash and path is stored once however
many manifests list it (``blobs``, ``paths``, ``manifest_files``: the index file queries
use). Every stored row also gets an entry in the hash-chained audit ledger
(``servewitness.ledger.chain``) in the same transaction, so no row exists outside the chain.

Size: one module because ``Store`` is the one owner of the connection and of the lock every
read and write takes; what each kind of row is lives in its own module (``report_rows``,
``manifest_rows``, ``window_rows``, ``index``, ``ledger.*``), and what is left here is the
transaction around each.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from servewitness.errors import ConfigError, DatabaseCorrupt, UsageError
from servewitness.ledger import bindings, chain
from servewitness.model import FileEntry, RequestId, RequestSpan
from servewitness.server import manifest_rows, report_rows, schema, vouch
from servewitness.server.bounded import LruCache
from servewitness.server.db import Database, is_corruption, open_database
from servewitness.server.group_commit import GroupCommit, Take
from servewitness.server.index import (
    ProcessSeen,
    needs_rebuild,
    rebuild,
)
from servewitness.server.manifest_rows import PreparedManifest
from servewitness.server.report_rows import PreparedReport, StoredReport
from servewitness.server.writer_queue import WriterLockTimeout

__all__ = ["RunExists", "RunRecord", "Store", "StoredReport", "UnknownRun"]

if TYPE_CHECKING:  # signing needs `cryptography`, imported only when a key is used
    from servewitness.ledger import merkle, tiles
    from servewitness.ledger.bundle import LedgerEntry
    from servewitness.ledger.checkpoints import Checkpoint
    from servewitness.ledger.keys import Ed25519PrivateKey
    from servewitness.server import window_rows

RUN_COLUMNS = "name, policy_toml, policy_digest, source, created_unix"


class ReportWriter(Protocol):
    """Another process that stores this store's reports (``server/writer_process.py``'s
    ``RemoteWriter``): ``save`` returns once its transaction committed."""

    times: tuple[int, float, float]  # its store's write_times, as last known

    def save(self, prepared: PreparedReport, receipt: object) -> int | None: ...


# The reports this store wrote, remembered (newest) so that following the database does not
# read them back: about a minute of reports at 1,000/s; an older one is read back, no harm.
HERE_ROWIDS = 65_536
TARGET_EVENTS = ("expired", "forgotten")


REQUEST_STEPS_CHUNK = 500  # request ids read per hold of the store's lock (Store.request_steps)


class RunExists(UsageError):
    pass


class UnknownRun(UsageError):
    pass


@dataclass(frozen=True)
class RunRecord:
    name: str
    policy_toml: str
    policy_digest: str
    source: str
    created_unix: float


T = TypeVar("T")


class Store:
    """Thread-safe store over one connection guarded by a lock. TARGET: an SQLite file or a
    ``postgresql://`` URL (``db.open_database``)."""

    def __init__(self, target: str | Path) -> None:
        self._db: Database = open_database(target)
        self.path = self._db.name
        self.kind = self._db.kind
        errors: tuple[type[Exception], ...] = (*self._db.errors, OSError)
        # What a failed read or write raises (disk full, database gone): callers that must
        # not acknowledge what was not stored catch these.
        self.errors = errors
        try:
            self._db.executescript(schema.for_kind(self._db.kind))
            integrity = self._db.quick_check()
        except errors as e:
            self._db.close()
            if is_corruption(e):  # opens, but damaged: tampering or a failed disk, exit 1
                raise DatabaseCorrupt(f"verifier database {self.path} is corrupt: {e}") from e
            raise ConfigError(f"cannot open the verifier database {self.path}: {e}") from e
        if integrity != "ok":
            self._db.close()
            raise DatabaseCorrupt(
                f"verifier database {self.path} is corrupt: its integrity check says "
                + " ".join(integrity.split())
            )
        self._lock = threading.Lock()
        self._writing: str | None = None  # what the write transaction in progress stores
        self.transactions = 0  # write transactions begun (``writing``)
        # Seconds write transactions waited for the write lock (another verifier's
        # transaction, this one's reads) and held it (statements and commit): the metrics'
        # verifier_store_write_*_seconds_total, and what a benchmark divides by its reports
        self.write_wait_s = 0.0
        self.write_held_s = 0.0
        self._frontier: merkle.Frontier | None = None  # the tree as last signed (checkpoints)
        self._kept: tiles.KeptTree | None = None  # the tree proofs come from (ledger/tiles.py)
        # Reports arriving while one commits are committed together (server/group_commit.py)
        self.reports: GroupCommit[int | None] = GroupCommit(
            self._batch, shared=(WriterLockTimeout,)
        )
        self._here: LruCache[int, bool] = LruCache(HERE_ROWIDS)
        # per run, the last verdict detail recorded or found unchanged, and its JSON: a detail
        # equal to it (most history passes and status calls) is not encoded again
        self._detail_json: LruCache[str, tuple[dict[str, Any], str]] = LruCache(1024)
        self._writer: ReportWriter | None = None  # use_writer: reports stored by another process
        self._writer_times = False
        self.columns_added: list[str] = []
        self._tx([], self._add_columns)
        self.backfilled = 0
        self._tx([], self._backfill)
        self.reindexed = 0
        if needs_rebuild(self._db):
            self._tx([], self._reindex)
        # Runs are immutable once registered: kept in memory (registration writes through),
        # so a status call never waits for a report's transaction to read one.
        self._runs_lock = threading.Lock()
        self._runs: dict[str, RunRecord] = {r.name: r for r in self._read_runs()}

    def _add_columns(self, db: Database) -> None:
        self.columns_added = schema.add_columns(db)

    def _backfill(self, db: Database) -> None:
        self.backfilled = chain.backfill(db, time.time())

    def _reindex(self, db: Database) -> None:
        self.reindexed = rebuild(db)

    def sign_checkpoint(self, key: Ed25519PrivateKey) -> Checkpoint | None:
        """Sign and store the ledger's current tree head (None: nothing new to sign).

        The first time, the stored checkpoints must still hold over the ledger as it is
        (with KEY's signature), so a verifier restarted on a rewritten database does not sign
        the rewrite; after that only the entries since the last checkpoint are hashed (the
        tree this verifier saw, ``merkle.Frontier``). Raises ``checkpoints.NotAppendOnly``
        when the ledger is no longer an extension of what it signed."""
        from servewitness.ledger import checkpoints, merkle

        out: list[Checkpoint | None] = [None]

        def sign(db: Database) -> None:
            if self._frontier is None:
                _, problem = checkpoints.check(db, key.public_key())
                if problem is not None:
                    raise checkpoints.NotAppendOnly(problem)
                frontier = merkle.Frontier()
                out[0] = checkpoints.sign(db, key, frontier=frontier)
                if out[0] is not None:
                    self._frontier = frontier
                return
            out[0] = checkpoints.sign(db, key, frontier=self._frontier)

        try:
            self._tx([], sign)
        except BaseException:
            self._frontier = None  # re-derived, and the stored checkpoints checked, next time
            raise
        return out[0]

    # measurement windows (server/windows.py; rows and proofs: server/window_rows.py) -------
    def record_window(
        self, wid: str, run: str, at: float, content: dict[str, Any]
    ) -> tuple[LedgerEntry, str]:
        """Store and ledger window WID; CONTENT gets the ledger's size at open. (Its entry,
        the content as stored.)"""
        from servewitness.server import window_rows  # signing's `cryptography`, only when used

        out: list[tuple[LedgerEntry, str]] = []

        def add(db: Database) -> None:
            content["ledger_size_at_open"] = window_rows.ledger_size(db)
            text = chain.canonical(content)
            out.append((window_rows.insert_window(db, wid, run, at, text), text))

        self._tx([], add)
        return out[0]

    def record_seal(
        self, wid: str, run: str, at: float, content: dict[str, Any]
    ) -> tuple[LedgerEntry, str]:
        """Store and ledger the seal of window WID (``window_rows.AlreadySealed``: it has one);
        CONTENT gets every other window the ledger holds before it, by outcome. (Its entry,
        the content as stored.)"""
        from servewitness.server import window_rows

        out: list[tuple[LedgerEntry, str]] = []

        def add(db: Database) -> None:
            content["other_windows"] = window_rows.other_windows(db, wid, run)
            text = chain.canonical(content)
            out.append((window_rows.insert_seal(db, wid, run, at, text), text))

        self._tx([], add)
        return out[0]

    def get_window(self, wid: str) -> window_rows.StoredWindow | None:
        from servewitness.server import window_rows

        with self._lock:
            return window_rows.get_window(self._db, wid)

    def report_entry(self, agent_id: str, seq: int) -> tuple[int, str] | None:
        from servewitness.server import window_rows

        with self._lock:
            return window_rows.report_entry(self._db, agent_id, seq)

    def request_steps(
        self, ids: Iterable[str], refused: set[str] | None = None
    ) -> dict[str, list[tuple[str, str, int, int, int]]]:
        """For each request id of IDS, where the stored bindings say it was served
        (``queries.request_steps``): an id row of a target leads to that target's spans only,
        and only rows their batches' ledger entries cover count (each batch hashed once per
        call; the refs of the batches that do not recompute their entry, or have none, are
        added to REFUSED). Read ``REQUEST_STEPS_CHUNK`` ids per snapshot, the store's lock
        let go between them: a seal naming 100,000 ids must not hold every report's write for
        seconds (each chunk is consistent; a row counts only if it is one its batch's entry
        covered when that batch was hashed, whatever changed between chunks)."""
        from servewitness.ledger import content_check, queries

        out: dict[str, list[tuple[str, str, int, int, int]]] = {}
        todo = list(ids)
        ledgered = content_check.LedgeredRows(self._db)
        for at in range(0, len(todo), REQUEST_STEPS_CHUNK):
            with self._lock, self._db.snapshot():
                for rid in todo[at : at + REQUEST_STEPS_CHUNK]:
                    out[rid] = queries.request_steps(self._db, rid, ledgered)
        if refused is not None:
            refused |= ledgered.refused
        return out

    def seal_proofs(
        self, key: Ed25519PrivateKey, open_seq: int, seal_seq: int
    ) -> window_rows.SealProofs | None:
        from servewitness.server import window_rows

        return self.audit_read(
            key, lambda db, tree: window_rows.proofs(db, open_seq, seal_seq, tree)
        )

    def verify_ledger(self) -> chain.Verification:
        """Walk the audit ledger against the stored rows (see ``chain.verify``)."""
        with self._lock:
            return chain.verify(self._db)

    def read(self, fn: Callable[[Database], T]) -> T:
        """FN over one consistent snapshot of the database (the audit service's queries)."""
        with self._lock, self._db.snapshot():
            return fn(self._db)

    def audit_read(self, key: Ed25519PrivateKey, fn: Callable[[Database, merkle.Proofs], T]) -> T:
        """FN over one consistent snapshot and the ledger's tree as this verifier keeps it
        (``ledger/tiles.py``): brought up to date, every checkpoint stored since last time
        checked against it with KEY's signature (the first time: built from the whole ledger,
        every stored checkpoint checked). Raises ``checkpoints.NotAppendOnly`` when the ledger
        is no longer what was signed, ``tiles.TileRewritten`` when FN's proofs reach entries
        rewritten behind this verifier. FN must be done with the tree when it returns."""
        from servewitness.ledger import tiles

        with self._lock, self._db.snapshot():
            if self._kept is None:
                self._kept = tiles.KeptTree()
            tree = self._kept.current(self._db, key.public_key())
            return fn(self._db, tree)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def write_times(self) -> tuple[int, float, float]:
        """(write transactions begun, seconds they waited for the write lock, seconds they
        held it): read without the lock (a scrape never waits for a transaction)."""
        if self._writer is not None and self._writer_times:
            n, wait, held = self._writer.times
            return self.transactions + n, self.write_wait_s + wait, self.write_held_s + held
        return self.transactions, self.write_wait_s, self.write_held_s

    @property
    def writing(self) -> str | None:
        """What the write transaction that holds the store now stores ("report AGENT/SEQ",
        "write" for anything else), None when none does: what the contention tests and a
        debugger look at; nothing decides on it."""
        return self._writing

    def _tx(
        self,
        statements: list[tuple[str, tuple[Any, ...]]],
        then: Callable[[Database], object] | None = None,
        what: str = "write",
    ) -> None:
        """Run STATEMENTS, then THEN (ledger entries), in one transaction (storing WHAT)."""
        with self._lock:
            self._writing = what
            self.transactions += 1
            t0, t1 = time.perf_counter(), None  # t1: the lock had
            try:
                self._db.begin()
                t1 = time.perf_counter()
                for sql, args in statements:
                    self._db.execute(sql, args)
                if then is not None:
                    then(self._db)
                self._db.commit()
            except BaseException as e:
                if self._db.in_transaction:
                    with contextlib.suppress(*self._db.errors):
                        self._db.rollback()
                if isinstance(e, self._db.errors) and not isinstance(e, WriterLockTimeout):
                    self._db.recover()  # the database refused: start clean next
                raise
            finally:
                self._writing = None
                t2 = time.perf_counter()
                self.write_wait_s += (t2 if t1 is None else t1) - t0
                self.write_held_s += 0.0 if t1 is None else t2 - t1

    def _batch(self, take: Take[int | None]) -> list[int | None]:
        """The writes TAKE gives once this transaction holds the write lock, in that one
        transaction (group commit): their results once it committed."""
        out: list[int | None] = []

        def run(db: Database) -> None:
            writes, self._writing = take()
            out.extend(w(db) for w in writes)

        self._tx([], run, "a batch, not yet taken")
        return out

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # runs ------------------------------------------------------------------------------
    def register_run(self, name: str, policy_toml: str, digest: str, source: str) -> RunRecord:
        """Pre-register NAME; the same policy again is a no-op, a different one an error."""
        existing = self.get_run(name, missing_ok=True)
        if existing is not None:
            if existing.policy_digest != digest:
                raise RunExists(
                    f"run {name!r} is already registered with policy {existing.policy_digest}; "
                    "a changed policy needs a new run name"
                )
            return existing
        rec = RunRecord(name, policy_toml, digest, source, time.time())
        row = (rec.name, rec.policy_toml, rec.policy_digest, rec.source, rec.created_unix)
        self._tx(
            [
                (
                    "INSERT INTO runs (name, policy_toml, policy_digest, source, created_unix) "
                    "VALUES (?, ?, ?, ?, ?)",
                    row,
                )
            ],
            lambda db: chain.append(
                db, rec.created_unix, "run", chain.run_ref(name), chain.run_subject(*row)
            ),
        )
        with self._runs_lock:
            self._runs[rec.name] = rec
        return rec

    def get_run(self, name: str, missing_ok: bool = False) -> RunRecord | None:
        """Run NAME: from memory when known; else read (another verifier on the same
        PostgreSQL database may have registered it)."""
        with self._runs_lock:
            known = self._runs.get(name)
        if known is not None:
            return known
        rows = self._query(f"SELECT {RUN_COLUMNS} FROM runs WHERE name = ?", (name,))  # noqa: S608
        if not rows:
            if missing_ok:
                return None
            raise UnknownRun(f"no run named {name!r}")
        rec = RunRecord(*rows[0])
        with self._runs_lock:
            self._runs[rec.name] = rec
        return rec

    def _read_runs(self) -> list[RunRecord]:
        rows = self._query(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY created_unix")  # noqa: S608
        return [RunRecord(*r) for r in rows]

    def list_runs(self) -> list[RunRecord]:
        """Every run, oldest first: read again when the store is free (runs other verifiers
        registered), else the runs in memory, without waiting for the transaction."""
        if self._lock.acquire(blocking=False):
            try:
                rows = self._db.execute(f"SELECT {RUN_COLUMNS} FROM runs").fetchall()  # noqa: S608
            finally:
                self._lock.release()
            with self._runs_lock:
                self._runs.update((r[0], RunRecord(*r)) for r in rows)
        with self._runs_lock:
            return sorted(self._runs.values(), key=lambda r: (r.created_unix, r.name))

    # manifests -------------------------------------------------------------------------
    def has_manifest(self, digest: str) -> bool:
        return bool(self._query("SELECT 1 FROM manifests WHERE digest = ?", (digest,)))

    def get_manifest(self, digest: str) -> tuple[FileEntry, ...] | None:
        rows = self._query("SELECT files_json FROM manifests WHERE digest = ?", (digest,))
        if not rows:
            return None
        files: list[dict[str, Any]] = json.loads(rows[0][0])
        return manifest_rows.files_from_rows(files)

    # reports ---------------------------------------------------------------------------
    def last_seq(self, agent_id: str) -> int:
        rows = self._query("SELECT MAX(seq) FROM reports WHERE agent_id = ?", (agent_id,))
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    prepare_manifests = staticmethod(manifest_rows.prepare)

    def save_report(
        self,
        rep: StoredReport,
        manifests: Mapping[str, Sequence[FileEntry]] | Sequence[PreparedManifest],
        processes: Sequence[ProcessSeen] = (),
        spans: Sequence[RequestSpan] = (),
        request_ids: Sequence[RequestId] = (),
        *,
        receipt: Callable[[], str] | None = None,
        tails: bindings.Tails | None = None,
    ) -> int | None:
        """Store one report, its new manifests (as files, or ``prepare_manifests``'s), the
        processes it saw (index) and the request bindings that came with it, atomically: its
        row's place in storage order (``rowid``), or None if the seq was seen (by this
        verifier, or by another on the same database). RECEIPT, when given, makes the
        report's receipt as its row is written (``follow.receipt_json``: it times the wait
        for the transaction). Returns once its transaction committed: reports saved
        concurrently share one (group commit); one the database refuses fails alone.
        TAILS: the bindings already made rows (``binding_rows.tails_from_pb``), instead of SPANS
        and REQUEST_IDS."""
        prepared = report_rows.prepare(
            rep,
            self.prepare_manifests(manifests) if isinstance(manifests, Mapping) else manifests,
            processes,
            bindings.tails_of(spans, request_ids) if tails is None else tails,
        )  # rows and digests built here: the write lock is held for the statements alone
        if self._writer is not None:  # the writer process stores it (server/writer_process.py)
            rowid = self._writer.save(prepared, receipt)
            if rowid is not None:
                self._here.put(rowid, True)
            return rowid
        return self.save_prepared(prepared, receipt)

    def save_prepared(
        self, prepared: PreparedReport, receipt: Callable[[], str] | None = None
    ) -> int | None:
        """``save_report`` of a report ``report_rows.prepare`` made (here, or in the serving
        process that sent it to this one, the writer process)."""
        # committed with the other reports waiting, returning only once this one is
        return self.reports.submit(*self._report_write(prepared, receipt))

    def enqueue_prepared(
        self,
        prepared: PreparedReport,
        receipt: Callable[[], str] | None,
        done: Callable[[int | None, BaseException | None], None],
    ) -> None:
        """``save_prepared`` with no thread waiting (the writer process): queued for the thread
        running ``reports.lead_pending``, which calls DONE(rowid, None) once its transaction
        committed, or DONE(None, what it raised when tried alone)."""
        self.reports.enqueue(*self._report_write(prepared, receipt), done)

    def _report_write(
        self, prepared: PreparedReport, receipt: Callable[[], str] | None
    ) -> tuple[Callable[[Database], int | None], str]:
        def store(db: Database) -> int | None:
            rowid = report_rows.write(db, prepared, receipt=receipt)
            if rowid is not None:
                self._here.put(rowid, True)  # before it commits: following skips it
            return rowid

        return store, f"report {prepared.rep.agent_id}/{prepared.rep.seq}"

    def use_writer(self, writer: ReportWriter, count_its_times: bool) -> None:
        """Have WRITER (the writer process) store this store's reports from now on; with
        COUNT_ITS_TIMES, ``write_times`` adds its transactions to this store's (one process
        of a verifier counts them, so that the processes' sum counts each once)."""
        self._writer = writer
        self._writer_times = count_its_times

    def latest_reports(self) -> list[StoredReport]:
        """The most recent report of every target."""
        with self._lock:
            return report_rows.latest(self._db)

    # following other verifiers on the same database (server/follow.py; its reads:
    # ``read`` with report_rows' functions) ------------------------------------------------
    def stored_here(self, rowid: int) -> bool:
        """Whether this store wrote report ROWID (among the last ``HERE_ROWIDS``): its
        verifier noted it as it stored it, so following need not read it back."""
        return rowid in self._here

    def count_reports(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM reports")[0][0])

    def ledger_size(self) -> int:
        """Entries in the audit ledger (its last sequence number; the metrics read it)."""
        rows = self._query("SELECT MAX(seq) FROM ledger")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    # targets ---------------------------------------------------------------------------
    def retire_target(
        self, target: str, event: str, by: str, last: tuple[str, int], *, key: bytes | None = None
    ) -> tuple[float, tuple[str, int], int]:
        """Record that TARGET expired or was forgotten (EVENT) by BY, retiring its latest
        report LAST (agent id, seq): no verdict counts it after this, and a restarted verifier
        does not load it back. A later report of the target brings it back as new. (When, the
        report retired, its rowid: 0 when it is not stored.)

        A forget retires the target's last *stored* report, which may be newer than LAST (one
        another verifier on the same database stored and this one had not followed yet): the
        operator forgets the target as it stands, and what was stored before cannot bring it
        back. An expiry retires LAST, what this verifier heard silent for so long.

        Once per retirement: when the target's latest event already retires that report the
        same way (another verifier expired it first), nothing is written and that event's
        time is returned. KEY: the verifiers' key (``server/vouch.py``): the row is vouched for,
        so that the others apply it."""
        if event not in TARGET_EVENTS:
            raise ValueError(f"target event {event!r} is not one of {TARGET_EVENTS}")
        out: list[tuple[float, tuple[str, int], int]] = [(time.time(), last, 0)]

        def retire(db: Database) -> None:
            at, retired, rowid = out[0]
            stored = report_rows.last_of(db, target)
            if stored is not None and event == "forgotten":
                retired, rowid = (stored[0], stored[1]), stored[2]
            elif stored is not None and (stored[0], stored[1]) == last:
                rowid = stored[2]
            prior = db.execute(
                "SELECT at_unix, event, last_agent, last_seq FROM target_events "
                "WHERE target = ? ORDER BY rowid DESC LIMIT 1",
                (target,),
            ).fetchone()
            if prior is not None and (prior[1], prior[2], int(prior[3])) == (event, *retired):
                out[0] = (float(prior[0]), retired, rowid)
                return
            row = (target, at, event, by, retired[0], retired[1])
            vouched = None if key is None else vouch.event_vouch(key, row)
            db.execute(
                "INSERT INTO target_events (target, at_unix, event, by_whom, last_agent, "
                "last_seq, vouch) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*row, vouched),
            )
            chain.append(db, at, "target", chain.target_ref(target, at), chain.target_subject(*row))
            out[0] = (at, retired, rowid)

        self._tx([], retire)
        return out[0]

    def retired_targets(self) -> dict[str, tuple[str, str, int]]:
        """Every target's latest retirement: target -> (event, last agent id, last seq)."""
        rows = self._query(
            "SELECT target, event, last_agent, last_seq FROM target_events ORDER BY rowid"
        )
        return {t: (e, a, int(s)) for t, e, a, s in rows}

    # verdict history -------------------------------------------------------------------
    def last_verdict(self, run: str) -> tuple[str, str] | None:
        rows = self._query(
            "SELECT verdict, detail_json FROM verdicts WHERE run = ? ORDER BY rowid DESC LIMIT 1",
            (run,),
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def record_verdict(self, run: str, verdict: str, detail: dict[str, Any]) -> bool:
        """Append to the run's history when the verdict or its findings changed (checked in
        the transaction that appends: verifiers sharing the database record a change once)."""
        memo = self._detail_json.get(run)
        if memo is not None and memo[0] == detail:  # shared entries: mostly identity checks
            detail_json = memo[1]
        else:
            detail_json = json.dumps(detail, sort_keys=True)
            self._detail_json.put(run, (detail, detail_json))
        if self.last_verdict(run) == (verdict, detail_json):
            return False  # the common case, without a write transaction
        at = time.time()
        added = [False]

        def record(db: Database) -> None:
            last = db.execute(
                "SELECT verdict, detail_json FROM verdicts WHERE run = ? "
                "ORDER BY rowid DESC LIMIT 1",
                (run,),
            ).fetchone()
            if last is not None and (last[0], last[1]) == (verdict, detail_json):
                return
            db.execute(
                "INSERT INTO verdicts (run, at_unix, verdict, detail_json) VALUES (?, ?, ?, ?)",
                (run, at, verdict, detail_json),
            )
            subject = chain.verdict_subject(run, at, verdict, detail_json)
            chain.append(db, at, "verdict", chain.verdict_ref(run, at), subject)
            added[0] = True

        self._tx([], record)
        return added[0]

    def verdict_history(self, run: str) -> list[tuple[float, str, dict[str, Any]]]:
        rows = self._query(
            "SELECT at_unix, verdict, detail_json FROM verdicts WHERE run = ? ORDER BY rowid",
            (run,),
        )
        return [(float(t), v, json.loads(d)) for t, v, d in rows]
