"""What the ledger needs of a database: :class:`Database`, a Protocol. ``servewitness.server.db``
provides SQLite and PostgreSQL ones (they satisfy it structurally; mypy checks it wherever one
is passed in); a test may bring its own.

SQL is written once, with ``?`` placeholders and the common subset of both dialects, and
"in storage order" is ``ORDER BY rowid`` in both. Callers own transactions: ledger functions
that write run inside the caller's, and read-only ones read whatever the caller opened.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol


class Rows(Protocol):
    """The result of :meth:`Database.execute` (a DB-API cursor)."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Database(Protocol):
    """One connection, as the ledger uses it."""

    kind: str  # "sqlite" or "postgresql": the few statements whose dialects differ

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        """Run one statement with ``?`` placeholders; its rows."""
        ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per row of ROWS."""
        ...

    def has_column(self, table: str, column: str) -> bool:
        """Whether TABLE has COLUMN (a database made by an older verifier may lack one)."""
        ...
