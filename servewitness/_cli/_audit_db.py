"""The verifier's database opened read-only for ``verifier audit`` (shared by its modules)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from servewitness.errors import ConfigError, DatabaseCorrupt
from servewitness.server.db import Database, open_database, read_error

DB_HELP = "the verifier's database: an SQLite file or a postgresql:// URL"


def open_ro(target: str) -> Database:
    """TARGET read-only; a clear error for a missing, foreign or unreachable database."""
    db = open_database(target, read_only=True)
    try:
        if not db.has_table("reports"):
            raise ConfigError(f"{db.name}: not a verifier database")
    except db.errors as e:
        db.close()
        raise read_error(db.name, e) from e
    except ConfigError:
        db.close()
        raise
    return db


@contextlib.contextmanager
def reading(db: Database) -> Iterator[None]:
    """Read DB in one snapshot (a live verifier writes while the checks read), then close it.
    A database error is explained (``read_error``); a stored value that is not of its column's
    type (text in a time column, JSON that does not parse) is corruption (exit 1), never a
    traceback: anything in the file may have been edited."""
    try:
        with db.snapshot():
            yield
    except db.errors as e:
        raise read_error(db.name, e) from e
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise DatabaseCorrupt(
            f"verifier database {db.name} is corrupt: a stored value is not what its column "
            f"holds ({type(e).__name__}: {e})"
        ) from e
    finally:
        db.close()
