"""The verifier's database behind one small interface: SQLite (a file; the default, nothing to
install) or PostgreSQL (a ``postgresql://`` URL; the store for a fleet).

Callers write SQL once, with ``?`` placeholders and the common subset of both dialects; each
table has the same columns in both, and PostgreSQL tables carry an explicit ``rowid`` column
(``BIGSERIAL``) so that "in storage order" (``ORDER BY rowid``) means the same in both. The
schemas themselves are per dialect (types differ: ``BYTEA`` for ``BLOB``, ``DOUBLE PRECISION``
for ``REAL``, which is 4 bytes in PostgreSQL and would round a Unix time).

Errors: a database that cannot be reached (refused, unknown host, bad password) raises
:class:`DatabaseUnreachable` (exit 9); anything wrong with its content is the caller's to
name. One connection per :class:`Database`; callers serialise their own use of it.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from servewitness.errors import ConfigError, DatabaseCorrupt, DatabaseUnreachable
from servewitness.ledger.interface import Rows
from servewitness.server.writer_queue import WriterLockTimeout, WriterQueue

URL_SCHEMES = ("postgresql://", "postgres://")
WRITE_LOCK_WAIT_S = 5.0
# PostgreSQL ends a session that sits in a transaction without a statement for this long (a
# verifier process stopped mid-transaction): its transaction rolls back and the writers' lock
# it held goes to the next. Ours run statement after statement; a live one never idles this long.
IDLE_IN_TRANSACTION_S = 60


def is_url(target: str | Path) -> bool:
    return str(target).startswith(URL_SCHEMES)


def redact(url: str) -> str:
    """URL without its password (for logs and error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


class Database:
    """One connection. ``execute`` takes ``?`` placeholders in either dialect. Each subclass is
    a ``servewitness.ledger.interface.Database`` (the part of it the ledger uses)."""

    kind = ""
    errors: tuple[type[Exception], ...] = ()
    name = ""
    # How long a writer waits for another's transaction before giving up (WriterLockTimeout:
    # nothing written). A writer that never finishes (a process stopped mid-transaction) must
    # not stop every other one with it.
    lock_wait_s = WRITE_LOCK_WAIT_S

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        raise NotImplementedError

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        raise NotImplementedError

    def executescript(self, script: str) -> None:
        """Run several statements (no parameters)."""
        raise NotImplementedError

    def begin(self) -> None:
        """Start a write transaction that excludes other writers until commit."""
        raise NotImplementedError

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see one consistent state of the database, whatever a verifier writes
        meanwhile (an online ledger walk reads the content and the chain at different times)."""
        self.execute(self._snapshot_sql)
        try:
            yield
        finally:
            self.execute("ROLLBACK")  # nothing was written

    _snapshot_sql = "BEGIN"

    def quick_check(self) -> str:
        """The engine's own integrity check: "ok" or what is wrong."""
        return "ok"

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        self.execute("ROLLBACK")

    @property
    def in_transaction(self) -> bool:
        raise NotImplementedError

    def has_table(self, table: str) -> bool:
        raise NotImplementedError

    def has_column(self, table: str, column: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def recover(self) -> None:
        """After a transaction failed on a storage error: make the next one start clean."""


class SQLiteDatabase(Database):
    kind = "sqlite"
    errors = (sqlite3.Error, WriterLockTimeout)

    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        self.name = str(path)
        self._read_only = read_only
        if read_only:
            if not Path(path).is_file():
                raise ConfigError(f"{path}: no such database file")
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        else:
            if self.name != ":memory:":
                Path(self.name).parent.mkdir(parents=True, exist_ok=True)
            self._db = self._connect()
        # The writers' queue on the database file (begin). None: in memory, or read-only
        # (never writes).
        self._writers: WriterQueue | None = None
        if not read_only and self.name != ":memory:":
            self._writers = WriterQueue(self.name)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.name, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def recover(self) -> None:
        """A new connection. After a disk-full or I/O error SQLite's pager stays in its error
        state until every read on the connection ends; a statement still open anywhere kept
        it there, and the verifier went on answering "database or disk is full" long after
        space was freed (tests/test_faults.py's disk-full test, in loaded runs). What was
        committed is on disk; nothing uncommitted was acknowledged."""
        if self._read_only or self.name == ":memory:":
            return
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        self._db = self._connect()

    @property
    def raw(self) -> sqlite3.Connection:
        return self._db

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        return self._db.execute(sql, tuple(args))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._db.executemany(sql, rows)

    def executescript(self, script: str) -> None:
        self._db.executescript(script)

    def begin(self) -> None:
        # Writers queue on the kernel's lock first (woken the moment the holder is done),
        # then take SQLite's. SQLite alone makes a second process's writer poll with sleeps of
        # up to 100 ms (its busy handler): two `serve --processes` spent most of their time
        # asleep and a report's p99 reached 1.4 s. Both waits share one bound.
        deadline = time.monotonic() + self.lock_wait_s
        if self._writers is not None:
            self._writers.acquire(self.lock_wait_s)
        try:
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            self._db.execute(f"PRAGMA busy_timeout = {left_ms}")
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._done_writing()
            raise

    def commit(self) -> None:
        try:
            self._db.execute("COMMIT")
        finally:
            self._done_writing()

    def rollback(self) -> None:
        try:
            self._db.execute("ROLLBACK")
        finally:
            self._done_writing()

    def _done_writing(self) -> None:
        if self._writers is not None:
            self._writers.release()

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    def has_table(self, table: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        return row is not None

    def has_column(self, table: str, column: str) -> bool:
        rows = self._db.execute("SELECT name FROM pragma_table_info(?)", (table,)).fetchall()
        return any(r[0] == column for r in rows)

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see one consistent state of the database, whatever a verifier writes
        meanwhile (an online ledger walk reads the content and the chain at different times)."""
        self.execute(self._snapshot_sql)
        try:
            yield
        finally:
            self.execute("ROLLBACK")  # nothing was written

    _snapshot_sql = "BEGIN"

    def quick_check(self) -> str:
        return str(self._db.execute("PRAGMA quick_check").fetchone()[0])

    def close(self) -> None:
        self._db.close()
        if self._writers is not None:
            self._writers.close()  # its lock, if held, goes with it
            self._writers = None


_PLACEHOLDER = re.compile(r"\?")
# One lock id for every verifier writing to one PostgreSQL database: ledger appends are
# serialised (each entry names its predecessor).
_WRITE_LOCK = 0x5646_5952
# Another for creating the schema (``PostgresDatabase.executescript``), so that a replica
# starting never waits behind another's report transactions.
_SCHEMA_LOCK = 0x5646_5953


class PostgresDatabase(Database):
    kind = "postgresql"
    _snapshot_sql = "BEGIN ISOLATION LEVEL REPEATABLE READ"

    def __init__(self, url: str, read_only: bool = False) -> None:
        try:
            import psycopg
        except ImportError as e:
            raise ConfigError(
                "a postgresql:// database needs the psycopg package: "
                "pip install 'provenance-verifier[postgres]'"
            ) from e
        self._psycopg = psycopg
        self.errors = (psycopg.Error, WriterLockTimeout)
        self.name = redact(url)
        self._url, self._read_only = url, read_only
        self._db = self._connect()
        self._sql: dict[str, str] = {}
        self._tx = False

    def _connect(self) -> Any:
        try:
            db = self._psycopg.connect(self._url, autocommit=True, connect_timeout=10)
        except self._psycopg.OperationalError as e:
            raise DatabaseUnreachable(
                f"cannot reach the verifier database {self.name}: {str(e).strip()}"
            ) from e
        if self._read_only:
            db.execute("SET default_transaction_read_only = on")
        else:
            db.execute(f"SET lock_timeout = {int(self.lock_wait_s * 1000)}")
            db.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_S * 1000}")
        return db

    def _live(self) -> Any:
        """The connection; a new one when the server dropped the last (a PostgreSQL restart):
        what failed with it raised to its caller, who did not acknowledge it."""
        if self._db.broken or self._db.closed:
            self._tx = False
            self._db = self._connect()
        return self._db

    def _convert(self, sql: str) -> str:
        out = self._sql.get(sql)
        if out is None:
            out = self._sql[sql] = _PLACEHOLDER.sub("%s", sql.replace("%", "%%"))
        return out

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        db = self._db if self._tx else self._live()
        return db.execute(self._convert(sql), tuple(args))  # type: ignore[no-any-return]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._db.cursor() as cur:
            cur.executemany(self._convert(sql), rows)

    def executescript(self, script: str) -> None:
        """SCRIPT (the schema's ``IF NOT EXISTS`` statements) in one transaction that holds
        the schema's own advisory lock: PostgreSQL's ``CREATE ... IF NOT EXISTS`` fails, not
        waits, when another session creates the same table at the same moment (the catalog's
        unique index: replicas of a Deployment starting together on a new database), so
        one replica creates the schema and the others then find it made."""
        db = self._live()
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            db.execute(script)

    def begin(self) -> None:
        self._live().execute("BEGIN")
        self._tx = True
        try:
            self._db.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
        except self._psycopg.errors.LockNotAvailable as e:  # lock_timeout
            self.rollback()
            more = f" PostgreSQL ends such a session after {IDLE_IN_TRANSACTION_S} s"
            raise WriterLockTimeout(self.name, self.lock_wait_s, more) from e

    def commit(self) -> None:
        self._tx = False
        self._db.execute("COMMIT")

    def rollback(self) -> None:
        self._tx = False
        if not (self._db.broken or self._db.closed):
            self._db.execute("ROLLBACK")

    @property
    def in_transaction(self) -> bool:
        return self._tx

    def has_table(self, table: str) -> bool:
        row = self._db.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        return row is not None and row[0] is not None

    def has_column(self, table: str, column: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = %s AND column_name = %s",
            (table, column),
        ).fetchone()
        return row is not None

    def close(self) -> None:
        self._db.close()


def is_corruption(e: BaseException) -> bool:
    """E says the database itself is damaged (SQLite: SQLITE_CORRUPT, SQLITE_NOTADB;
    PostgreSQL: data_corrupted, index_corrupted), not that it could not be reached or opened."""
    if isinstance(e, sqlite3.Error):  # or text stored as bytes that are not UTF-8
        undecodable = str(e).startswith("Could not decode to UTF-8")
        return undecodable or (getattr(e, "sqlite_errorcode", 0) & 0xFF) in (11, 26)
    return getattr(e, "sqlstate", None) in ("XX001", "XX002")


def read_error(name: str, e: BaseException) -> ConfigError | DatabaseCorrupt:
    """The error to raise for E, a failed read of the database NAME: corruption is exit 1."""
    if is_corruption(e):
        return DatabaseCorrupt(f"{name}: the database is corrupt: {e}")
    return ConfigError(f"{name}: cannot read the database: {e}")


def open_database(target: str | Path, read_only: bool = False) -> Database:
    """A PostgreSQL URL or an SQLite file (created unless READ_ONLY)."""
    if is_url(target):
        return PostgresDatabase(str(target), read_only=read_only)
    try:
        return SQLiteDatabase(target, read_only=read_only)
    except sqlite3.Error as e:
        if is_corruption(e):
            raise DatabaseCorrupt(f"verifier database {target} is corrupt: {e}") from e
        raise ConfigError(f"cannot open the verifier database {target}: {e}") from e
    except OSError as e:  # its folder cannot be made: permissions, a file in the way
        raise ConfigError(f"cannot open the verifier database {target}: {e}") from e
