"""Each process's static judgement kept across agent restarts (servewitness/evidence/
judgements.py): a restarted agent reuses it exactly where a running one would (the same
process, the same manifest and native bytes, checked against what it reads now), still hashes
every file, and ignores a store that is not whole, unedited and its own.

The live tests run a real probed interpreter importing a fake distribution (a file patched
after install, a file added, a malformed RECORD) and a real installed one, and real agents
(``Agent.collect``) that share one state directory, as a restarted agent does."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from servewitness._cli.agent_cmd import config_from
from servewitness._cli.main import build_parser
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence import judgements, origins, statefile
from servewitness.evidence.judge import Judgement
from servewitness.evidence.judgements import FILENAME, JudgementStore
from servewitness.model import (
    DRIFT_MODIFIED_AFTER_LOAD,
    DRIFT_RECORD_CHANGED_AFTER_START,
    DRIFT_RECORD_UNREADABLE,
    Drift,
    FileOrigin,
    Origin,
    ProcessReport,
    Provenance,
)
from tests.test_cold_manifest import make_site, probed

KEY = ("boot", 1234, 5678)


def _judged(r: ProcessReport) -> tuple[object, ...]:
    return (r.provenance, r.drift, r.disagreements, r.code)


def collect(root_pid: int, state: Path, *, cache: bool = True) -> ProcessReport:
    """One report of ROOT_PID by a freshly started agent whose state directory is STATE."""
    config = AgentConfig(
        "127.0.0.1:9", "t", "a", state, root_pid=root_pid, docker_socket=None,
        judgement_cache=cache,
    )  # fmt: skip
    agent = Agent(config)
    try:
        (proc,) = agent.collect().processes
    finally:
        agent.channel.close()
    return proc


class Classified:
    """Counts ``origins.classify`` calls: a judgement made, not reused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        inner = origins.classify

        def counted(*args: object, **kwargs: object) -> object:
            self.calls += 1
            return inner(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(origins, "classify", counted)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    site = tmp_path / "site"
    make_site(site)
    with probed(tmp_path, site, 0, settle=True) as pid:
        yield pid, site


def test_restarted_agent_reuses_its_judgement_and_reports_the_same(
    live: tuple[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, site = live
    state = tmp_path / "state"
    classified = Classified(monkeypatch)
    fresh = collect(pid, tmp_path / "fresh", cache=False)
    first = collect(pid, state)
    assert classified.calls == 2 and (state / FILENAME).exists()
    again = collect(pid, state)  # a restarted agent: the same state directory
    assert classified.calls == 2  # nothing classified: the kept judgement was reused
    assert _judged(again) == _judged(first) == _judged(fresh)
    # what the reuse must not lose: the tree has a patched file, an added one, a broken RECORD
    assert again.provenance is not None
    classes = {f.path: f.origin for f in again.provenance.files}
    assert classes[str(site / "fakedist" / "core.py")] == Origin.PATCHED
    assert classes[str(site / "fakedist" / "extra.py")] == Origin.ADDED
    assert [d.id for d in again.drift].count(DRIFT_RECORD_UNREADABLE) == 1
    # negative control: with the store off a restarted agent classifies again
    collect(pid, state, cache=False)
    assert classified.calls == 3


def test_a_file_changed_while_the_agent_was_down_is_still_caught(
    live: tuple[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: rewrite a loaded file between two agent runs. The kept judgement spares the
    classification, never the hash: the restarted agent sees other bytes than were loaded."""
    pid, site = live
    state = tmp_path / "state"
    core = site / "fakedist" / "core.py"
    assert not [d for d in collect(pid, state).drift if d.path == str(core)]
    core.write_bytes(b"X = 3  # rewritten while the agent was down\n")
    classified = Classified(monkeypatch)
    again = collect(pid, state)
    assert classified.calls == 0  # the judgement was reused...
    assert [d.id for d in again.drift if d.path == str(core)] == [DRIFT_MODIFIED_AFTER_LOAD]


def test_a_record_rewritten_after_the_process_started_is_a_finding(
    live: tuple[int, Path], tmp_path: Path
) -> None:
    """Attack: after the process loaded a patched file, rewrite its RECORD row to match.
    What the files are judged against changed while they ran: every agent says so, a
    restarted one, a running one and a fresh one with the store off, whatever the rewritten
    RECORD now makes of the file (its ctime moved after the start, and cannot be set back)."""
    pid, site = live
    state = tmp_path / "state"
    core = site / "fakedist" / "core.py"
    record = site / "fakedist-1.0.dist-info" / "RECORD"
    config = AgentConfig("127.0.0.1:9", "t", "a", tmp_path / "running", root_pid=pid,
                         docker_socket=None, recheck_s=0)  # fmt: skip
    running = Agent(config)
    try:
        (before,) = running.collect().processes
        assert collect(pid, state).provenance is not None
        assert not [d for d in before.drift if d.id == DRIFT_RECORD_CHANGED_AFTER_START]
        digest = base64.urlsafe_b64encode(hashlib.sha256(core.read_bytes()).digest()).rstrip(b"=")
        rows = [
            f"fakedist/core.py,sha256={digest.decode()},{core.stat().st_size}"
            if row.startswith("fakedist/core.py,")
            else row
            for row in record.read_text().splitlines()
        ]
        record.write_text("\n".join(rows) + "\n")
        (now,) = running.collect().processes
    finally:
        running.channel.close()
    for report in (now, collect(pid, state), collect(pid, tmp_path / "fresh", cache=False)):
        changed = [d.path for d in report.drift if d.id == DRIFT_RECORD_CHANGED_AFTER_START]
        assert changed == [str(record)]


def test_a_kept_judgement_of_another_manifest_or_process_is_not_used(
    live: tuple[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's key is checked against what the agent reads now, never taken from it. An
    edited store (its digest recomputed, so it loads) whose entry names another manifest, or
    whose entry is filed under another process, is judged afresh."""
    pid, _ = live
    state = tmp_path / "state"
    first = collect(pid, state)
    path = state / FILENAME
    whole = path.read_bytes()
    classified = Classified(monkeypatch)
    for edit in ("manifest", "process"):
        doc = json.loads(whole.partition(b"\n")[2])
        (row,) = doc["judgements"]
        if edit == "manifest":
            row[3]["key"][0] = "0" * 64
        else:
            row[2] += 1  # start ticks: a later process under the same pid
        body = json.dumps(doc).encode()
        path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
        calls = classified.calls
        assert _judged(collect(pid, state)) == _judged(first)
        assert classified.calls == calls + 1, edit
    # positive control: the store as saved is reused
    path.write_bytes(whole)
    collect(pid, state)
    assert classified.calls == 2


def test_a_process_started_later_is_judged_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM restarts under a running agent's state directory: the same files, a new process.
    Its judgement is made, not reused; the gone process's is dropped from the store."""
    site = tmp_path / "site"
    make_site(site)
    state = tmp_path / "state"
    with probed(tmp_path, site, 0, settle=True) as pid:
        collect(pid, state)
    kept = JudgementStore(state / FILENAME)
    assert [k[1] for k in kept._kept] == [pid]
    classified = Classified(monkeypatch)
    with probed(tmp_path, site, 1, settle=True) as pid2:
        collect(pid2, state)
    assert classified.calls == 1
    assert [k[1] for k in JudgementStore(state / FILENAME)._kept] == [pid2]


# -- the store itself -----------------------------------------------------------------------


def judgement(n: int = 0) -> Judgement:
    origin = FileOrigin("/s/a.py", "patched", "sha256 differs from RECORD", "a", "1.0",
                        "a.py", "ab" * 32, "cd" * 32)  # fmt: skip
    provenance = Provenance((("pristine", 3), ("patched", 1)), (origin,), (("a", "1.0", 4),))
    drift = (Drift("provenance.record.unreadable", "/s/b/RECORD", None, "bad row"),)
    disk = (
        ("/s", "listing", (), "ab" * 32),
        ("/s/a-1.0.dist-info/RECORD", "file", (1, 2, 3, 4, 5), "cd" * 32),
        ("/t/x.py", "exists", (-1,), "0"),
    )
    return Judgement(
        (), provenance, drift, (f"{n:064x}", "ef" * 32), drift, owners=(("/s/a.py", "a"),),
        disk=disk,
    )  # fmt: skip


def saved(path: Path, *pairs: tuple[tuple[str, int, int], Judgement]) -> None:
    store = JudgementStore(path)
    for key, j in pairs:
        store.keep(key, j)
    store.save()


def test_store_round_trips_the_static_part(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    j = judgement()
    full = Judgement((), j.provenance, j.drift, j.static_key, j.static_drift,
                     frozenset({("/s/x.py", "00" * 32)}), j.owners, j.disk)  # fmt: skip
    saved(path, (KEY, full))
    got = JudgementStore(path).get(KEY)
    assert got is not None
    assert (got.static_key, got.provenance, got.static_drift, got.owners, got.disk) == (
        full.static_key,
        full.provenance,
        full.static_drift,
        full.owners,
        full.disk,
    )
    # the cross-check's part is never kept: a restarted agent hashes and vouches afresh
    assert (got.disagreements, got.drift, got.vouched) == ((), (), frozenset())


def test_an_unchanged_judgement_is_not_written_again(tmp_path: Path) -> None:
    store = JudgementStore(tmp_path / FILENAME)
    store.keep(KEY, judgement())
    store.save()
    store.keep(KEY, judgement())  # equal content, another object: nothing to write
    assert not store.dirty
    store.keep(KEY, judgement(1))
    assert store.dirty


def test_edited_store_is_ignored_whole(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    saved(path, (KEY, judgement()))
    digest, _, body = path.read_bytes().partition(b"\n")
    edited = body.replace(b'"patched"', b'"pristine"', 1)
    assert edited != body
    path.write_bytes(digest + b"\n" + edited)
    with capture_logs() as logs:
        assert len(JudgementStore(path)) == 0
    assert [(x["event"], x["reason"]) for x in logs] == [
        ("judgement_cache_ignored", "digest mismatch")
    ]


def test_truncated_garbage_or_oversized_store_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / FILENAME
    saved(path, (KEY, judgement()))
    whole = path.read_bytes()
    for bad in (whole[:-5], b"", b"\n", b"not a store"):
        path.write_bytes(bad)
        with capture_logs() as logs:
            assert len(JudgementStore(path)) == 0
        assert [x["event"] for x in logs] == ["judgement_cache_ignored"]
    path.write_bytes(whole)
    monkeypatch.setattr(statefile, "MAX_BYTES", len(whole) - 1)
    with capture_logs() as logs:
        assert len(JudgementStore(path)) == 0
    assert [(x["event"], x["reason"]) for x in logs] == [("judgement_cache_ignored", "too large")]


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(format="verifier-compile-verdicts/1"),
        lambda d: d.update(judgements={}),
        lambda d: d["judgements"][0].pop(),
        lambda d: d["judgements"][0].__setitem__(1, True),  # a bool is no pid
        lambda d: d["judgements"][0].__setitem__(1, "1234"),
        lambda d: d["judgements"][0][3]["key"].pop(),
        lambda d: d["judgements"][0][3]["provenance"]["files"][0].__setitem__(1, 7),
        lambda d: d["judgements"][0][3]["provenance"]["counts"].append(["x", 1.5]),
        lambda d: d["judgements"][0][3]["drift"][0].append("more"),
        lambda d: d["judgements"][0][3].__setitem__("owners", {"/s/a.py": "a"}),
        lambda d: d["judgements"][0][3]["disk"][1][2].append(6),  # an identity of 6 ints
        lambda d: d["judgements"][0][3]["disk"][1].__setitem__(2, "stat"),
        lambda d: d["judgements"][0][3]["disk"][1].pop(),
        lambda d: d["judgements"][0][3].pop("disk"),
        lambda d: d["judgements"][0].__setitem__(3, []),
    ],
)
def test_malformed_store_with_a_valid_digest_is_ignored_whole(tmp_path: Path, edit: object) -> None:
    """A store whose digest matches but whose content is not as ``save`` writes (another
    writer, a bug): nothing in it is used, and loading it raises nothing."""
    path = tmp_path / FILENAME
    saved(path, (KEY, judgement()), (("boot", 1, 2), judgement(1)))
    doc = json.loads(path.read_bytes().partition(b"\n")[2])
    edit(doc)  # type: ignore[operator]
    body = json.dumps(doc).encode()
    path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    with capture_logs() as logs:
        assert len(JudgementStore(path)) == 0
    assert [x["event"] for x in logs] == ["judgement_cache_ignored"]


@pytest.mark.parametrize("field", ["magic", "python", "judge"])
def test_store_of_another_interpreter_or_agent_is_not_used(tmp_path: Path, field: str) -> None:
    path = tmp_path / FILENAME
    saved(path, (KEY, judgement()))
    doc = json.loads(path.read_bytes().partition(b"\n")[2])
    doc[field] = "other"
    body = json.dumps(doc).encode()
    path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    with capture_logs() as logs:
        assert len(JudgementStore(path)) == 0
    assert [x["event"] for x in logs] == ["judgement_cache_other_agent"]


def test_judge_code_names_the_judging_code(tmp_path: Path) -> None:
    """Another agent version (its judging modules' bytes) has another digest."""
    now = judgements.judge_code()
    copy = tmp_path / "evidence"
    copy.mkdir()
    here = Path(judgements.__file__).parent
    for f in here.glob("*.py"):
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "origins.py").write_bytes((here / "origins.py").read_bytes() + b"\n# changed\n")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(judgements, "__file__", str(copy / "judgements.py"))
        judgements.judge_code.cache_clear()
        try:
            assert judgements.judge_code() != now
            (copy / "origins.py").write_bytes((here / "origins.py").read_bytes())
            judgements.judge_code.cache_clear()
            assert judgements.judge_code() == now  # control: the same bytes, the same digest
        finally:
            judgements.judge_code.cache_clear()


def test_store_forgets_gone_processes_and_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    store = JudgementStore(path, limit=2)
    for i in range(3):
        store.keep(("boot", i, i), judgement(i))
    assert sorted(store._kept) == [("boot", 1, 1), ("boot", 2, 2)]  # the oldest went first
    store.retain([("boot", 2, 2)])
    store.save()
    assert list(JudgementStore(path)._kept) == [("boot", 2, 2)]


def test_an_unwritable_store_is_logged_and_changes_nothing(tmp_path: Path) -> None:
    store = JudgementStore(tmp_path / "missing" / FILENAME)
    store.keep(KEY, judgement())
    with capture_logs() as logs:
        store.save()  # raises nothing: the store only saves time
    assert [x["event"] for x in logs] == ["judgement_cache_unwritable"]
    assert store.get(KEY) is not None and store.dirty


def test_off_switch_reads_and_writes_nothing(
    live: tuple[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, _ = live
    state = tmp_path / "state"
    collect(pid, state)
    before = (state / FILENAME).read_bytes()
    classified = Classified(monkeypatch)
    collect(pid, state, cache=False)
    assert classified.calls == 1  # not read
    assert (state / FILENAME).read_bytes() == before  # not written
    off = tmp_path / "off"
    collect(pid, off, cache=False)
    assert not (off / FILENAME).exists()


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], None, True),
        (["--no-judgement-cache"], None, False),
        ([], "0", False),
        ([], "1", True),
    ],
)
def test_agent_flag_and_environment_turn_the_store_off(
    argv: list[str], env: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv("VERIFIER_AGENT_JUDGEMENT_CACHE", raising=False)
    else:
        monkeypatch.setenv("VERIFIER_AGENT_JUDGEMENT_CACHE", env)
    args = build_parser("agent").parse_args(["agent", "--verifier", "127.0.0.1:9", *argv])
    config = config_from(args)
    assert config.judgement_cache is expected
    assert config.compile_cache  # the compile verdicts have their own switch


def test_a_running_agent_judges_against_a_record_put_back_not_the_one_it_parsed(
    live: tuple[int, Path], tmp_path: Path
) -> None:
    """Attack on a running agent: forge the RECORD row of the patched file the process loaded
    for the agent's first look, then put the genuine RECORD back. The agent's index parsed
    the forged one; what it read changed, so its next full check parses again (a new index)
    and says patched, as a fresh agent does; and the RECORD changed after the start."""
    pid, site = live
    core = site / "fakedist" / "core.py"
    record = site / "fakedist-1.0.dist-info" / "RECORD"
    genuine = record.read_text()
    digest = base64.urlsafe_b64encode(hashlib.sha256(core.read_bytes()).digest()).rstrip(b"=")
    record.write_text(
        "".join(
            f"fakedist/core.py,sha256={digest.decode()},{core.stat().st_size}\n"
            if row.startswith("fakedist/core.py,")
            else row + "\n"
            for row in genuine.splitlines()
        )
    )

    def origin(report: ProcessReport) -> str:
        assert report.provenance is not None
        return {f.path: f.origin for f in report.provenance.files}.get(str(core), "pristine")

    config = AgentConfig("127.0.0.1:9", "t", "a", tmp_path / "running", root_pid=pid,
                         docker_socket=None, recheck_s=0)  # fmt: skip
    running = Agent(config)
    try:
        (first,) = running.collect().processes
        assert origin(first) == Origin.PRISTINE  # the forgery fools the first look
        record.write_text(genuine)
        (now,) = running.collect().processes
    finally:
        running.channel.close()
    assert origin(now) == Origin.PATCHED
    assert origin(collect(pid, tmp_path / "fresh", cache=False)) == Origin.PATCHED  # control
    assert str(record) in [d.path for d in now.drift if d.id == DRIFT_RECORD_CHANGED_AFTER_START]
