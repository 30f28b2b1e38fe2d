"""The verifier's tables, once per dialect (same columns; types differ).

Content tables (covered by the ledger): ``runs``, ``manifests``, ``reports``, ``verdicts``,
``target_events`` (a target expired or forgotten), ``windows`` and ``seals`` (measurement
windows the verifier opened and sealed: canonical JSON content, ``chain.canonical``),
``binding_batches`` with their rows in
``bindings`` and ``request_ids``, and ``checkpoints`` (signed, covering the ledger itself).
Index tables (derived from the content, rebuilt from it,
not in the ledger): ``blobs`` and ``paths`` (each file hash and each path stored once, however
many manifests list them), ``manifest_files`` (which manifest lists which path with which
hash) and ``processes`` (which process ran which manifest, first and last seen).

PostgreSQL tables carry an explicit ``rowid`` (SQLite has one implicitly), so ``ORDER BY rowid``
is storage order in both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servewitness.server.db import Database

_TABLES = """
CREATE TABLE IF NOT EXISTS runs (
    {rowid}
    name TEXT PRIMARY KEY,
    policy_toml TEXT NOT NULL,
    policy_digest TEXT NOT NULL,
    source TEXT NOT NULL,
    created_unix {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS manifests (
    {rowid}
    digest TEXT PRIMARY KEY,
    files_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    {rowid}
    agent_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    target TEXT NOT NULL,
    received_unix {real} NOT NULL,
    report {blob} NOT NULL,
    PRIMARY KEY (agent_id, seq)
);
CREATE INDEX IF NOT EXISTS reports_by_target ON reports (target, received_unix);
CREATE TABLE IF NOT EXISTS verdicts (
    {rowid}
    run TEXT NOT NULL,
    at_unix {real} NOT NULL,
    verdict TEXT NOT NULL,
    detail_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS verdicts_by_run ON verdicts (run, at_unix);
CREATE TABLE IF NOT EXISTS ledger (
    seq BIGINT PRIMARY KEY,
    at_unix {real} NOT NULL,
    kind TEXT NOT NULL,
    ref TEXT NOT NULL,
    subject TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    {rowid}
    size BIGINT NOT NULL,
    root TEXT NOT NULL,
    head TEXT NOT NULL,
    at_unix {real} NOT NULL,
    envelope TEXT NOT NULL,
    note TEXT
);
CREATE TABLE IF NOT EXISTS binding_batches (
    {rowid}
    ref TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    received_unix {real} NOT NULL,
    spans BIGINT NOT NULL,
    ids BIGINT NOT NULL,
    spans_sha256 TEXT,
    ids_sha256 TEXT,
    counts_json TEXT
);
CREATE TABLE IF NOT EXISTS bindings (
    {rowid}
    batch TEXT NOT NULL,
    target TEXT NOT NULL,
    boot_id TEXT NOT NULL,
    pid BIGINT NOT NULL,
    start_ticks BIGINT NOT NULL,
    internal_id TEXT NOT NULL,
    first_step BIGINT NOT NULL,
    last_step BIGINT NOT NULL,
    steps BIGINT NOT NULL,
    tokens BIGINT NOT NULL,
    first_unix {real} NOT NULL,
    last_unix {real} NOT NULL,
    manifest_first TEXT NOT NULL,
    manifest_last TEXT NOT NULL,
    runner TEXT NOT NULL,
    hooks_json TEXT NOT NULL,
    finished BIGINT NOT NULL,
    spec_json TEXT
);
CREATE INDEX IF NOT EXISTS bindings_by_internal ON bindings (internal_id);
CREATE INDEX IF NOT EXISTS bindings_by_batch ON bindings (batch);
CREATE INDEX IF NOT EXISTS bindings_by_manifest ON bindings (manifest_first, pid, start_ticks);
CREATE TABLE IF NOT EXISTS request_ids (
    {rowid}
    batch TEXT NOT NULL,
    target TEXT NOT NULL,
    internal_id TEXT NOT NULL,
    external_id TEXT NOT NULL,
    client_id TEXT NOT NULL,
    at_unix {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS request_ids_by_client ON request_ids (client_id);
CREATE INDEX IF NOT EXISTS request_ids_by_internal ON request_ids (internal_id);
CREATE INDEX IF NOT EXISTS request_ids_by_batch ON request_ids (batch);
CREATE TABLE IF NOT EXISTS target_events (
    {rowid}
    target TEXT NOT NULL,
    at_unix {real} NOT NULL,
    event TEXT NOT NULL,
    by_whom TEXT NOT NULL,
    last_agent TEXT NOT NULL,
    last_seq BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS target_events_by_target ON target_events (target);
CREATE TABLE IF NOT EXISTS windows (
    {rowid}
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    opened_unix {real} NOT NULL,
    content_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS seals (
    {rowid}
    window_id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    sealed_unix {real} NOT NULL,
    content_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_by_ref ON ledger (kind, ref);
CREATE TABLE IF NOT EXISTS blobs (
    id {serial},
    sha256 TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS paths (
    id {serial},
    path TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS manifest_files (
    manifest TEXT NOT NULL,
    path_id BIGINT NOT NULL,
    blob_id BIGINT,
    PRIMARY KEY (manifest, path_id)
);
CREATE INDEX IF NOT EXISTS manifest_files_by_blob ON manifest_files (blob_id);
CREATE INDEX IF NOT EXISTS manifest_files_by_path ON manifest_files (path_id);
CREATE TABLE IF NOT EXISTS processes (
    target TEXT NOT NULL,
    boot_id TEXT NOT NULL,
    pid BIGINT NOT NULL,
    start_ticks BIGINT NOT NULL,
    manifest TEXT NOT NULL,
    role TEXT NOT NULL,
    rank BIGINT,
    container_id TEXT,
    runner TEXT,
    first_unix {real} NOT NULL,
    last_unix {real} NOT NULL,
    reports BIGINT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (target, boot_id, pid, start_ticks, manifest)
);
CREATE INDEX IF NOT EXISTS processes_by_manifest ON processes (manifest);
"""

SQLITE = _TABLES.format(rowid="", real="REAL", blob="BLOB", serial="INTEGER PRIMARY KEY")
POSTGRES = _TABLES.format(
    rowid="rowid BIGSERIAL,", real="DOUBLE PRECISION", blob="BYTEA", serial="BIGSERIAL PRIMARY KEY"
) + (
    # Following other verifiers reads the rows after a rowid every poll (server/follow.py);
    # SQLite's rowid is its tables' key already.
    "CREATE INDEX IF NOT EXISTS reports_by_rowid ON reports (rowid);\n"
    "CREATE INDEX IF NOT EXISTS reports_by_target_rowid ON reports (target, rowid);\n"
    "CREATE INDEX IF NOT EXISTS target_events_by_rowid ON target_events (rowid);\n"
)


def for_kind(kind: str) -> str:
    return POSTGRES if kind == "postgresql" else SQLITE


# Columns added after their table was first released: (table, column, type). A database made
# before one exists gets it, NULL in its old rows (which the ledger's row digests leave out).
ADDED_COLUMNS = (
    ("bindings", "spec_json", "TEXT"),
    ("checkpoints", "note", "TEXT"),  # the C2SP signed note of the checkpoint (ledger/note.py)
    # A batch's row digests and per-process counts, as its ledger subject covers them
    # (ledger/bindings.py); NULL in a batch stored before, whose subject does not.
    ("binding_batches", "spans_sha256", "TEXT"),
    ("binding_batches", "ids_sha256", "TEXT"),
    ("binding_batches", "counts_json", "TEXT"),
    # How the verifier that stored a report received it (server/follow.py): what another
    # verifier on the same database needs to judge it; NULL in a report stored before.
    ("reports", "receipt_json", "TEXT"),
    # Whether a seal held (1, 0), as its content says (the ledger walk checks they agree): what
    # a later seal counts without reading every seal's content; NULL in a seal stored before.
    ("seals", "held", "INTEGER"),
    # The vouch of the verifier that retired a target (server/vouch.py): what another verifier
    # on the database checks before it applies the retirement; NULL in an event stored before.
    ("target_events", "vouch", "TEXT"),
)


# Indexes over columns of ADDED_COLUMNS (made once the columns are there).
ADDED_INDEXES = (
    # What a seal counts of the other windows (server/window_rows.other_windows), read from
    # these indexes alone: a seal's row is its content's size (kilobytes, overflow pages),
    # and its added held column comes after the content.
    "CREATE INDEX IF NOT EXISTS seals_held ON seals (window_id, held)",
    "CREATE INDEX IF NOT EXISTS windows_runs ON windows (id, run)",
)


def add_columns(db: Database) -> list[str]:
    """Add every ``ADDED_COLUMNS`` column DB lacks and the ``ADDED_INDEXES`` (inside the
    caller's transaction); the ``table.column`` names added."""
    added = []
    for table, column, kind in ADDED_COLUMNS:
        if not db.has_column(table, column):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")  # fixed names
            added.append(f"{table}.{column}")
    for statement in ADDED_INDEXES:
        db.execute(statement)
    return added
