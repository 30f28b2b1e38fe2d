"""The verifier's database opened read-only for ``verifier audit`` (shared by its modules)."""

from __future__ import annotations

from verifier.errors import ConfigError
from verifier.server.db import Database, open_database, read_error

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
