"""Verifier replicas that start together on one new PostgreSQL database (a Deployment's pods
start at once): each creates the schema if it is not there. PostgreSQL's ``CREATE TABLE IF
NOT EXISTS`` is not safe against a concurrent one (the loser fails on the catalog's unique
index, "duplicate key value violates unique constraint pg_type_typname_nsp_index"): CI saw a
replica exit on it. Schema creation now holds an advisory lock of its own, so one replica
creates and the others find it made."""

from __future__ import annotations

import threading

from servewitness.server.store import Store
from servewitness.testing.postgres import PostgresServer

REPLICAS = 6
DATABASES = 4  # the race is a window: several fresh databases, each opened by every replica


def open_together(url: str) -> list[BaseException]:
    """REPLICAS stores opened on URL at once (a barrier releases them); what each raised."""
    barrier = threading.Barrier(REPLICAS)
    errors: list[BaseException] = []

    def one() -> None:
        barrier.wait()
        try:
            Store(url).close()
        except BaseException as e:  # noqa: BLE001 - collected and asserted on
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(REPLICAS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def test_replicas_opening_a_new_database_at_once_all_start(postgres: PostgresServer) -> None:
    for n in range(DATABASES):
        url = postgres.createdb(f"schema_race{n}")
        errors = open_together(url)
        assert not errors, [str(e) for e in errors]
        store = Store(url)  # and the schema is whole: a report can be written and read
        try:
            assert store.list_runs() == []
        finally:
            store.close()
