"""Store, spool, container ids and addresses: the small parts of the gate, without gRPC."""

from __future__ import annotations

from pathlib import Path

import pytest

from servewitness.agent.spool import Spool
from servewitness.client.address import normalize
from servewitness.errors import DatabaseCorrupt, UsageError
from servewitness.evidence.container import container_id_from_cgroup
from servewitness.model import FileEntry
from servewitness.server.store import RunExists, Store, StoredReport, UnknownRun
from tests.helpers import Backend

CID = "0123456789abcdef" * 4


def test_registering_the_same_policy_twice_is_a_no_op_and_a_new_one_is_refused(
    backend: Backend,
) -> None:
    store = Store(backend.target)
    first = store.register_run("r", "version = 1", "sha256:aa", "p.toml")
    assert store.register_run("r", "version = 1", "sha256:aa", "p.toml") == first
    with pytest.raises(RunExists, match="a changed policy needs a new run name"):
        store.register_run("r", "version = 2", "sha256:bb", "p.toml")
    with pytest.raises(UnknownRun, match="no run named 'x'"):
        store.get_run("x")
    store.close()


def test_reports_are_stored_once_per_sequence_number_and_survive_reopening(
    backend: Backend,
) -> None:
    store = Store(backend.target)
    rep = StoredReport("agent", 1, "t", 10.0, b"x")
    files = (FileEntry("/a", None, -1, "data", None, "load"),)
    assert store.save_report(rep, {"sha256:m": files}) is not None  # its rowid
    assert store.save_report(rep, {}) is None  # seen
    store.save_report(StoredReport("agent", 2, "t", 11.0, b"y"), {})
    store.close()
    again = Store(backend.target)
    assert again.last_seq("agent") == 2
    assert [r.report for r in again.latest_reports()] == [b"y"]
    assert again.get_manifest("sha256:m") == files
    again.close()


def test_verdict_history_appends_only_changes(backend: Backend) -> None:
    store = Store(backend.target)
    assert store.record_verdict("r", "PENDING", {"a": 1})
    assert not store.record_verdict("r", "PENDING", {"a": 1})
    assert store.record_verdict("r", "PASS", {"a": 1})
    assert [v for _, v, _ in store.verdict_history("r")] == ["PENDING", "PASS"]
    store.close()


def test_a_corrupt_database_is_refused_as_tampering_not_a_crash(tmp_path: Path) -> None:
    db = tmp_path / "db"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatabaseCorrupt, match=r"is corrupt: file is not a database"):
        Store(db)
    assert db.read_bytes().startswith(b"this is not sqlite")  # nothing overwritten


def test_spool_keeps_order_and_drops_oldest_beyond_its_budget(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_bytes=25)
    for seq in range(1, 5):
        spool.put(seq, b"0123456789")
    assert [s for s, _ in spool.pending()] == [3, 4]
    assert spool.dropped == 2
    spool.ack(3)
    assert [s for s, _ in spool.pending()] == [4]
    assert Spool(tmp_path / "s", 25).last_seq() == 4


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        (f"12:pids:/docker/{CID}\n11:cpu:/docker/{CID}\n", CID),  # Docker, cgroup v1
        (f"0::/system.slice/docker-{CID}.scope\n", CID),  # Docker, cgroup v2 systemd
        (f"0::/kubepods/burstable/pod1234/cri-containerd-{CID}.scope\n", CID),
        (f"0::/kubepods.slice/kubepods-pod1.slice/crio-{CID}.scope\n", CID),
        ("0::/user.slice/user-0.slice/session-1.scope\n", None),  # a host process
        ("0::/\n", None),
    ],
)
def test_container_id_is_read_from_cgroup_paths(cgroup: str, expected: str | None) -> None:
    assert container_id_from_cgroup(cgroup) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:5", "127.0.0.1:5"),
        ("unix:/x/s", "unix:/x/s"),
        ("/x/s", "unix:/x/s"),
        ("[::1]:7", "[::1]:7"),
    ],
)
def test_addresses_are_normalised(given: str, expected: str) -> None:
    assert normalize(given) == expected


@pytest.mark.parametrize("bad", ["", "localhost", "host:port", "h:99999"])
def test_bad_addresses_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError):
        normalize(bad)


def test_journal_cache_reads_only_appends_and_restarts_on_a_new_journal(tmp_path: Path) -> None:
    import json

    from servewitness.evidence.journal import JournalCache

    journal = tmp_path / "journal.jsonl"

    def rec(i: int) -> str:
        return json.dumps({"k": "file", "path": f"/f{i}", "sha256": f"{i:064x}", "size": 1}) + "\n"

    journal.write_text(rec(1) + rec(2)[:10])  # the second record is still being written
    cache = JournalCache()
    first = cache.records(journal)
    assert first is not None and [f.path for f in first.files] == ["/f1"]
    with journal.open("a") as f:
        f.write(rec(2)[10:] + rec(3))
    second = cache.records(journal)
    assert second is not None and [f.path for f in second.files] == ["/f1", "/f2", "/f3"]
    tampered = journal.read_text().replace(f"{1:064x}", f"{7:064x}")  # same length, in place
    with journal.open("r+") as f:
        f.write(tampered)
    edited = cache.records(journal)
    assert edited is not None and edited.files[0].sha256 == f"{7:064x}"
    assert (
        edited.rewritten
        == "changed in the bytes already read after the agent had read 354 bytes of it"
    )
    journal.unlink()
    journal.write_text(rec(9))  # a new journal (new inode): read from the start, and the edit
    third = cache.records(journal)  # is remembered with every record read before it
    assert third is not None and [f.path for f in third.files] == ["/f1", "/f2", "/f3", "/f9"]
    assert third.rewritten == edited.rewritten
