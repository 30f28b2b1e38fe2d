"""Regression tests of attacks on the audit answers ("which bytes served which request"),
first found by an outside tester (2026-12-07), each built for real: a real ``verifier serve``
over mutual TLS (the lab CA of ``verifier certs``), real gRPC, a real SQLite database, and the
real ``verifier audit`` CLI.

Adversary 1 holds ONE target's agent credential (root in serving container ``b``: it writes
the probe's files its agent reports) and nothing of target ``a``, whose agent is honest. Its
attacks edit nothing behind the verifier's back, so they share one verifier (``shared``, one
per xdist worker), each on request ids of its own. Adversary 2 is the lab operator who can
write the verifier's database but not the auditor's saved checkpoint note: each of its
attacks, and each sealed window, gets a verifier of its own. The SQL the fixes added (an id
row resolves to its own target's spans; binding rows counted per whole process key; only
ledgered rows count for a seal) is also run on both backends, on a store alone
(``test_the_audit_sql_keeps_targets_apart_and_counts_only_ledgered_rows``).

Each test asserts what a sound product answers; its docstring names the attack and the wrong
answer it used to get. The ``xfail(strict=True)`` ones are attacks still open."""

from __future__ import annotations

import base64
import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import ProcessKey, ProcessReport, TargetReport, manifest_digest
from servewitness.testing.vllm_server import free_port
from tests.helpers import Backend, agent_stub, mtls_channel, verifier_cli
from tests.test_gate_e2e import Daemon
from tests.test_policy_engine import api, engine, worker


def _cli(*args: str) -> Any:
    out = verifier_cli(*args)
    return out


@dataclasses.dataclass
class Lab:
    pki: Path
    addr: str
    db: Path
    tmp: Path
    seqs: dict[str, int] = dataclasses.field(default_factory=dict)

    def channel(self, who: str) -> grpc.Channel:
        return mtls_channel(self.pki, who, self.addr)

    def report(
        self,
        who: str,
        target: str,
        procs: tuple[ProcessReport, ...],
        edit: Any = None,
    ) -> pb.ReportResponse:
        """One report of TARGET sent with WHO's certificate (CN = agent id WHO); EDIT(msg)
        adds its bindings."""
        with self.channel(who) as ch:
            stub = agent_stub(ch)
            hello = stub.Hello(pb.HelloRequest(agent_id=who, targets=[target]))
            seq = self.seqs.get(who, 0) + 1
            self.seqs[who] = seq
            msg = wire.report_to_pb(TargetReport(who, target, seq, hello.nonce, time.time(), procs))
            if edit is not None:
                edit(msg)
            ack: pb.ReportResponse = stub.Report(pb.ReportRequest(report=msg))
        assert ack.accepted
        return ack

    def audit(self, *args: str) -> Any:
        return _cli("audit", *args, "--db", str(self.db))

    def audit_wire(self, *args: str) -> Any:
        return _cli(
            "audit", *args, "--verifier", self.addr, "--tls-ca", str(self.pki / "ca.pem"),
            "--tls-cert", str(self.pki / "audit.pem"), "--tls-key", str(self.pki / "audit.key"),
            "--key", str(self.db) + ".signing.key.pub",
        )  # fmt: skip


@contextmanager
def lab(tmp_path: Path, policy: str | None = None) -> Iterator[Lab]:
    """A real verifier over mTLS (run ``r`` under POLICY when given) and the lab CA: agent-a
    may report target a only, agent-b target b only, ``audit`` is an auditor."""
    d = tmp_path / "pki"
    for args in (
        ["certs", "init", "--dir", str(d)],
        ["certs", "issue", "verifier", "--dir", str(d), "--ip", "127.0.0.1", "--dns", "localhost"],
        ["certs", "issue", "agent-a", "--dir", str(d), "--target", "a"],
        ["certs", "issue", "agent-b", "--dir", str(d), "--target", "b"],
        ["certs", "issue", "audit", "--dir", str(d), "--role", "auditor"],
    ):
        out = verifier_cli(*args)
        assert out.returncode == 0, (args, out.stderr)
    addr = f"127.0.0.1:{free_port()}"
    db = tmp_path / "db.sqlite3"
    if policy:
        (tmp_path / "p.toml").write_text(policy)
    log = tmp_path / "serve.log"
    serve = Daemon(
        ["serve", "--listen", addr, "--db", str(db), "--report-interval", "0.2",
         "--tls-cert", str(d / "verifier.pem"), "--tls-key", str(d / "verifier.key"),
         "--tls-client-ca", str(d / "ca.pem"),
         *(["--run", f"r={tmp_path / 'p.toml'}"] if policy else [])],
        log,
    ).start()  # fmt: skip
    deadline = time.monotonic() + 60
    while "listening" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    try:
        yield Lab(d, addr, db, tmp_path)
    finally:
        serve.stop()


def with_digest(p: ProcessReport) -> ProcessReport:
    return dataclasses.replace(p, manifest_digest=manifest_digest(p.files or ()))


def procs_of(boot: str) -> tuple[ProcessReport, ...]:
    """An API server, an engine core and a worker on BOOT (one target's processes)."""
    out = []
    for p in (api(), engine(), worker()):
        moved = dataclasses.replace(p, key=ProcessKey(boot, p.key.pid, p.key.start_ticks))
        out.append(with_digest(moved))
    return tuple(out)


def add_request(
    msg: pb.TargetReport, procs: tuple[ProcessReport, ...], internal: str, external: str,
    *, first_unix: float | None = None, span: bool = True, mapping: bool = True,
    first_step: int = 1,
) -> None:  # fmt: skip
    """A finished request as an honest probe reports it: the worker's span (steps, manifest)
    and the API server's external -> internal id."""
    _, _, w = procs
    now = time.time()
    if span:
        s = msg.spans.add(
            internal_id=internal, first_step=first_step, last_step=first_step + 4, steps=5,
            tokens=5, first_unix=now - 1 if first_unix is None else first_unix,
            last_unix=now if first_unix is None else first_unix + 1,
            manifest_first=w.manifest_digest, manifest_last=w.manifest_digest,
            runner="vllm.v1.worker.cpu_model_runner.CPUModelRunner", finished=True,
        )  # fmt: skip
        s.process.boot_id, s.process.pid, s.process.start_ticks = (
            w.key.boot_id,
            w.key.pid,
            w.key.start_ticks,
        )
    if mapping:
        r = msg.request_ids.add(internal_id=internal, external_id=external, unix=now - 1)
        a = procs[0]
        r.process.boot_id, r.process.pid, r.process.start_ticks = (
            a.key.boot_id,
            a.key.pid,
            a.key.start_ticks,
        )


def request_json(lab_: Lab, query: str) -> tuple[int, Any]:
    out = lab_.audit("request", query, "--json")
    try:
        return out.returncode, json.loads(out.stdout)
    except ValueError:
        return out.returncode, out.stdout + out.stderr


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One verifier for the attacks of adversary 1 (none edits the database): each uses
    request ids of its own."""
    with lab(tmp_path_factory.mktemp("shared")) as L:
        yield L


def shifted(procs: tuple[ProcessReport, ...], boot: str, d: int) -> tuple[ProcessReport, ...]:
    """PROCS on BOOT with pids and start ticks moved by D (another container's processes,
    the same image: the same manifest digests)."""
    return tuple(
        dataclasses.replace(p, key=ProcessKey(boot, p.key.pid + d, p.key.start_ticks + d))
        for p in procs
    )


def internal(name: str) -> str:
    """The engine's internal id of client request NAME (vLLM 0.32: ``cmpl-NAME-0-<8 hex>``)."""
    return f"cmpl-{name}-0-a1b2c3d4"


# ------------------------------------------------------------------ adversary 1


def test_another_targets_id_mapping_never_attributes_its_request_to_the_honest_target(
    shared: Lab, tmp_path: Path
) -> None:
    """Attack (adversary 1, holds only target b's credential): target b served client request
    ``evil-1`` with its own (say, patched) bytes; its agent reports, instead of b's own span,
    only an id row mapping ``cmpl-evil-1-0`` to the *internal* id of a request that honest
    target a served (guessable: vLLM builds it from the client's X-Request-Id; the ids are in
    a's ``bindings.jsonl``).

    Used to get: ``verifier audit request evil-1`` (``--db`` and over the wire, verified), and
    a signed ``audit export --request evil-1`` that ``audit verify BUNDLE`` accepted, all said
    that target **a** served ``evil-1``. Sound: an id row of target X resolves only to X's
    own spans, so nothing attributes ``evil-1`` to a (b reported no span of its own: not
    found, exit 6; over the wire the verifier's NOT_FOUND); a's request is still a's."""
    L = shared
    a = procs_of("boot-a")
    b = procs_of("boot-b")
    honest = internal("h1")
    L.report("agent-a", "a", a, lambda m: add_request(m, a, honest, "cmpl-h1-0"))
    L.report("agent-b", "b", b,
             lambda m: add_request(m, b, honest, "cmpl-evil-1-0", span=False))  # fmt: skip
    code, got = request_json(L, "evil-1")
    wire_out = L.audit_wire("request", "evil-1", "--json")
    bundle = tmp_path / "bundle.json"
    exp = L.audit("export", "--key", f"{L.db}.signing.key", "--out", str(bundle),
                  "--request", "evil-1")  # fmt: skip
    own_code, own = request_json(L, "h1")
    assert own_code == 0 and [r["target"] for r in own] == ["a"], own  # control
    named = [r["target"] for r in got] if code == 0 and isinstance(got, list) else got
    remote = json.loads(wire_out.stdout) if wire_out.returncode == 0 else wire_out.stderr
    remote_named = [r["target"] for r in remote] if isinstance(remote, list) else remote
    signed = []
    if exp.returncode == 0:
        for env in json.loads(bundle.read_text())["statements"]:
            pred = json.loads(base64.b64decode(env["payload"]))["predicate"]
            if pred.get("details", {}).get("external_ids") == ["cmpl-evil-1-0"]:
                signed.append(pred["target"])
    refused_remotely = wire_out.returncode != 0 and "no stored binding" in wire_out.stderr
    assert (code, refused_remotely, exp.returncode) == (6, True, 6), (
        f"`audit request evil-1` names targets {named} (--db, rc {code}); over the wire: rc "
        f"{wire_out.returncode} targets {remote_named}; export rc {exp.returncode}, signed "
        f"statement targets {signed}"
    )


def test_another_targets_spans_on_an_honest_id_neither_answer_for_it_nor_push_it_out(
    shared: Lab,
) -> None:
    """Attack (adversary 1, b's credential only): honest target a served client request
    ``h2`` (a's agent maps it to its internal id). b's agent reports 60 spans on b's own
    worker under that *internal* id (no id row of its own), each with an early
    ``first_unix``; and 60 more whose internal id is ``h2x``, the client id of another
    request of a (a query by id also reads it as an engine's internal id).

    Used to get: ``verifier audit request h2`` listed b's bytes as having served ``h2``
    beside a's; over the wire (``--limit 50``, records by ``first_unix``) the signed answer
    held b's 50 records only, the honest one "left out". Sound: a's id row reaches a's spans
    only, so ``h2`` is a's alone; and the records an id row of the queried id reached come
    first, so b's spans on the internal id ``h2x`` never push a's record of ``h2x`` out of a
    limited answer."""
    L = shared
    a = procs_of("boot-a")
    b = shifted(procs_of("boot-b"), "boot-b", 1)

    def serve(m: pb.TargetReport) -> None:
        add_request(m, a, internal("h2"), "cmpl-h2-0")
        add_request(m, a, internal("h2x"), "cmpl-h2x-0", first_step=10)

    L.report("agent-a", "a", a, serve)

    def claim(m: pb.TargetReport) -> None:
        for i in range(60):
            add_request(m, b, internal("h2"), "-", mapping=False, first_unix=1.0 + i,
                        first_step=10 * i + 1)  # fmt: skip
            add_request(m, b, "h2x", "-", mapping=False, first_unix=1.0 + i,
                        first_step=10 * i + 6)  # fmt: skip

    L.report("agent-b", "b", b, claim)
    code, got = request_json(L, "h2")
    over = L.audit_wire("request", "h2", "--json")
    x_over = L.audit_wire("request", "h2x", "--json", "--limit", "50")
    assert code == 0, got
    local = sorted({r["target"] for r in got})
    remote = json.loads(over.stdout) if over.returncode == 0 else over.stderr
    remote_targets = sorted({r["target"] for r in remote}) if isinstance(remote, list) else remote
    assert local == ["a"] and remote_targets == ["a"], (
        f"`audit request h2` names targets {local} (--db) and {remote_targets} over the "
        f"wire (rc {over.returncode}; stderr: {over.stderr.strip()[-300:]})"
    )
    assert x_over.returncode == 0, x_over.stderr
    first = json.loads(x_over.stdout)[0]
    assert (first["target"], first["request"]) == ("a", internal("h2x")), first


def test_another_targets_rows_never_make_the_honest_targets_answers_refused_as_tampering(
    shared: Lab,
) -> None:
    """Attack (adversary 1, b's credential only; needs only the client's X-Request-Id of the
    request to hide, and for ``audit file`` nothing: b runs the same image, so the same
    manifest digest): b's agent reports its own processes and, for a request id mapping of
    its own (``cmpl-h3-0`` -> b's internal id), one span whose process key is its own
    worker's pid, start tick and manifest under another boot id (no process of b has it).

    Used to get: with the database untouched (``audit verify --db`` exit 0), ``verifier
    audit request h3`` (a's request; ``--db`` and over the wire) and ``verifier audit file
    <sha256 of a file of a's image>`` exit 1, "the index tables disagree with the ledgered
    content: bindings ["b", "boot-b", 301, ...]: rows is 1, the ledgered content says 0":
    the index check counted binding rows per (manifest, pid, start tick) without target and
    boot. Sound: binding rows are counted per whole process key (target, boot, pid, start,
    manifest), so what an agent reported, stored as sent, is never "tampering"."""
    L = shared
    a = procs_of("boot-a")
    b = shifted(procs_of("boot-b"), "boot-b", 1)
    L.report("agent-a", "a", a, lambda m: add_request(m, a, internal("h3"), "cmpl-h3-0"))
    before = (L.audit("request", "h3").returncode, L.audit("file", "a" * 64).returncode)
    ghost_worker = dataclasses.replace(
        b[2], key=ProcessKey("boot-ghost", b[2].key.pid, b[2].key.start_ticks)
    )
    L.report("agent-b", "b", b, lambda m: add_request(
        m, (b[0], b[1], ghost_worker), "cmpl-h3-0-bbbbbbbb", "cmpl-h3-0"))  # fmt: skip
    verify = L.audit("verify")
    req = L.audit("request", "h3")
    fil = L.audit("file", "a" * 64)
    over = L.audit_wire("request", "h3")
    assert before == (0, 0)
    assert verify.returncode == 0, verify.stdout + verify.stderr  # nothing was edited
    assert (req.returncode, fil.returncode, over.returncode) == (0, 0, 0), (
        f"a's audits refused after b's report: request rc {req.returncode} "
        f"({req.stderr.strip()[:300]}); file rc {fil.returncode}; wire rc {over.returncode}"
    )


def test_a_served_request_with_a_long_client_id_is_found_by_that_id(shared: Lab) -> None:
    """Ids over the length bound (any HTTP client of a's vLLM chooses the X-Request-Id): a
    client sends ``X-Request-Id: L`` of 3,000 characters; a's agent reports the external id
    ``cmpl-L-0`` and the internal id bounded (``fields.bounded_external_id`` and
    ``bounded_internal_id``, exactly what ``agent/bindings.py`` sends).

    Used to get: the agent sent each id as the digest of the whole id, so the stored client
    id was ``sha256(cmpl-L-0)``, no function of L; ``verifier audit request L`` (the client's
    own id, which ``--help`` says it takes) hashed the query whole, ``sha256(L)``, and exited
    6, "no stored request binding matches": the served request read as never served; only
    the full API id ``cmpl-L-0`` found it. The same lookup (``request_steps``) decides a
    seal's ``--requests``. Sound: the agent bounds the client part inside the id
    (``cmpl-sha256(L)-0``), so the stored client id is what the query computes; the client's
    id finds the request it names (more forms: ``tests/test_long_request_ids.py``)."""
    from servewitness.wire import fields as F

    long_id = "L" * 3000
    L = shared
    a = procs_of("boot-a")
    ids = (
        F.bounded_internal_id(f"cmpl-{long_id}-0-abcd1234"),
        F.bounded_external_id(f"cmpl-{long_id}-0"),
    )
    L.report("agent-a", "a", a, lambda m: add_request(m, a, *ids))
    by_api = L.audit("request", f"cmpl-{long_id}-0")
    by_client = L.audit("request", long_id)
    assert by_api.returncode == 0, by_api.stderr  # control: the API id finds it
    assert by_client.returncode == 0, (
        f"the client's id of a served request: rc {by_client.returncode} "
        f"{by_client.stderr.strip()[:160]}"
    )


def test_another_targets_fat_batch_leaves_the_honest_request_answerable_over_the_wire(
    shared: Lab,
) -> None:
    """Attack (adversary 1, b's credential only; needs only the client's X-Request-Id): before
    a serves ``h4``, b's agent sends one report (about 50 MB, under the 64 MiB report limit)
    holding an id row ``cmpl-h4-0`` -> b's own internal id with its span, and 12 padding
    spans each with 1,024 hook names of 4 KiB. An answer carries every row of each batch it
    rests on, base64'd: b's batch alone is over one gRPC message.

    Gets: ``verifier audit request h4 --verifier ... --key`` exits 4, "busy: the answer is
    67,236,862 bytes, over the 67,043,328 one message holds", and ``--limit 1`` fails the
    same: a's honest record cannot be obtained over the wire at all (``--db`` answers).
    Sound: a's answer does not depend on the size of another target's batch."""
    L = shared
    a = procs_of("boot-a")
    b = shifted(procs_of("boot-b"), "boot-b", 1)

    def fat(m: pb.TargetReport) -> None:
        add_request(m, b, "cmpl-h4-0-bbbbbbbb", "cmpl-h4-0")
        for i in range(12):
            add_request(m, b, f"pad-{i}", "-", mapping=False)
            for k in range(1024):
                m.spans[-1].hooks[f"h{k:04d}" + "x" * 4090] = k

    L.report("agent-b", "b", b, fat)
    L.report("agent-a", "a", a, lambda m: add_request(m, a, internal("h4"), "cmpl-h4-0"))
    local = L.audit("request", "h4")
    default = L.audit_wire("request", "h4")
    one = L.audit_wire("request", "h4", "--limit", "1")
    assert local.returncode == 0, local.stderr  # control: the database answers
    assert (default.returncode, one.returncode) == (0, 0), (
        f"over the wire: rc {default.returncode} {default.stderr.strip()[-220:]}; "
        f"--limit 1: rc {one.returncode}"
    )
    for answer in (default, one):  # b's record is named as left out, never dropped silently
        assert "cmpl-h4-0-bbbbbbbb of target b matches too" in answer.stderr, answer.stderr


def test_another_targets_fat_manifests_leave_the_honest_file_sightings_answerable_over_the_wire(
    shared: Lab,
) -> None:
    """Variation of the fat batch, on ``audit file``: b's agent reports, in three reports,
    three workers that each loaded the honest worker's file (same path, same sha256) beside
    14,000 padding files with 2 KiB paths (the most a path may hold; about 29 MB a manifest,
    under the 32 MiB of paths one manifest may hold), each padded apart so each manifest is
    its own. A file's answer carries the manifest of every process it shows: b's three are
    over one message, so the answer was refused (RESOURCE_EXHAUSTED) and a's sighting could
    not be obtained over the wire at all.

    Sound: over the wire, a's worker is shown and verified (exit 0), and what did not fit is
    named as left out for its size, never dropped silently; ``--db`` lists all four."""
    from tests.test_policy_engine import SITE, WORKER_FILES, entry

    L = shared
    path = SITE + "vllm/v1/worker/padded_runner.py"  # a file only this test's workers load
    mine = entry(path, sha256="c" * 64, module="vllm.v1.worker.padded_runner")

    def loading(procs: tuple[ProcessReport, ...], pad: str, n: int) -> Any:
        extra = tuple(entry(SITE + f"pad/{pad}{i:05d}/" + "p" * 1990 + ".py", sha256=None,
                            module=None) for i in range(n))  # fmt: skip
        w = procs[2]
        worker_ = dataclasses.replace(w, files=(*WORKER_FILES, mine, *extra))
        return (*procs[:2], with_digest(worker_))

    for k in range(3):
        b = loading(shifted(procs_of("boot-fat"), "boot-fat", 7 + k), str(k), 14_000)
        L.report("agent-b", "b", b)
    a = loading(shifted(procs_of("boot-fat-a"), "boot-fat-a", 20), "", 0)
    L.report("agent-a", "a", a)
    local = L.audit("file", "c" * 64, "--json")
    over = L.audit_wire("file", "c" * 64, "--json")
    assert local.returncode == 0, local.stderr
    assert sorted(s["target"] for s in json.loads(local.stdout)) == ["a", "b", "b", "b"]
    assert over.returncode == 0, over.stderr[-400:]
    shown = [s["target"] for s in json.loads(over.stdout)]
    assert "a" in shown and len(shown) < 4, shown
    assert over.stderr.count("of target b matches too") == 4 - len(shown), over.stderr


# ------------------------------------------------------------------ adversary 1 and 2: seals


SEAL_INTERNAL = "cmpl-z-1-0-9f8e7d6c"  # a request a serves in the window (someone else's)


def sealed_window(tmp_path: Path, forge: Any, after: Any = None) -> tuple[Any, Any, Lab, int]:
    """A window on run ``r`` (policy: target a only) whose harness sent ``x-1``; during it a
    serves only ``z-1`` (internal SEAL_INTERNAL); FORGE(lab, b) runs before the seal, AFTER
    (lab) after it. The seal's answer, ``verify-seal --requests``'s result, the lab, and how
    many id rows of target a name ``x-1``."""
    import hashlib
    import threading

    from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
    from tests.helpers import as_weak_as_needed
    from tests.test_policy_engine import dead_v2_hook, hook, steps

    policy = as_weak_as_needed(
        'version = 1\n[[hooks]]\nname = "v1_step"\n[evidence]\nfreshness_s = 600\n'
        '[targets]\nnames = ["a"]\n'
    )
    with lab(tmp_path, policy) as L:
        assert verifier_cli("certs", "issue", "ci", "--dir", str(L.pki), "--role",
                            "harness").returncode == 0  # fmt: skip
        a = procs_of("boot-a")
        b = shifted(procs_of("boot-b"), "boot-b", 1)

        def at(n: int) -> tuple[ProcessReport, ...]:  # a's worker after N more steps
            w = dataclasses.replace(
                a[2], steps=steps(total=10 + n, productive=8 + n),
                hooks=(hook(fired=10 + n, fired_productive=8 + n), dead_v2_hook()),
            )  # fmt: skip
            return (a[0], a[1], w)

        L.report("agent-a", "a", a)
        res: dict[str, Any] = {}

        def call(name: str, request: Any) -> None:
            with L.channel("ci") as ch:
                res[name] = getattr(pb_grpc.VerifierServiceStub(ch), name)(request)

        t = threading.Thread(target=call, args=("OpenWindow",
                             pb.OpenWindowRequest(run="r", timeout_s=30)))  # fmt: skip
        t.start()
        time.sleep(1.0)
        L.report("agent-a", "a", a)  # evidence after the open call arrived
        t.join()
        L.report(
            "agent-a",
            "a",
            at(1000),
            lambda m: add_request(m, at(1000), SEAL_INTERNAL, "cmpl-z-1-0", first_step=1000),
        )
        forge(L, b)
        results = tmp_path / "results.json"
        results.write_text("{}")
        seal = pb.SealWindowRequest(
            window_id=res["OpenWindow"].window_id, run="r",
            results_sha256=hashlib.sha256(b"{}").hexdigest(), results_size=2,
            results_name="results.json", timeout_s=30, request_ids=["x-1"],
        )  # fmt: skip
        t = threading.Thread(target=call, args=("SealWindow", seal))
        t.start()
        for i in range(6):
            time.sleep(1.0)
            L.report("agent-a", "a", at(2000 + 10 * i))
        t.join()
        if after is not None:
            after(L)
        con = sqlite3.connect(L.db)
        a_mapped = con.execute(
            "SELECT COUNT(*) FROM request_ids WHERE target = 'a' AND client_id = 'x-1'"
        ).fetchone()[0]
        con.close()
    (tmp_path / "seal.json").write_text(res["SealWindow"].seal_json)
    (tmp_path / "ids.txt").write_text("x-1\n")
    out = _cli("audit", "verify-seal", str(tmp_path / "seal.json"), "--key",
               f"{L.db}.signing.key.pub", "--results", str(results), "--requests",
               str(tmp_path / "ids.txt"))  # fmt: skip
    return res["SealWindow"], out, L, a_mapped


def test_a_target_outside_the_run_never_makes_a_sealed_window_count_a_request_nobody_measured(
    tmp_path: Path,
) -> None:
    """Attack (adversary 1: b's credential only; b is not in run ``r``, whose policy names
    target a alone). A harness opens a window on ``r``, sends request ``x-1``, and seals with
    ``--requests`` (x-1). ``x-1`` went to b (a cheaper model, a twin: any server but a),
    while a served someone else's request ``z-1`` in the window (internal
    ``cmpl-z-1-0-9f8e7d6c``). b's agent reports one id row: ``cmpl-x-1-0`` -> a's internal
    id. ``request_steps`` joins the harness's id to bindings by internal id across targets.

    Used to get: the seal held (``held``), ``verifier audit verify-seal SEAL --results R
    --requests ids.txt`` exits 0: "request ids: the seal checked these 1 (1 served by the
    window's processes)", "window ... held". Truth: no process of the run ever saw ``x-1``;
    no agent of a mapped it. Sound: ``window.requests_unserved``, the window does not hold.
    Precondition: b knows the internal id of a request a serves in the window (vLLM 0.32
    appends 8 random hex characters unless ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION``; the
    ids are in a's ``bindings.jsonl``)."""

    def forge(L: Lab, b: tuple[ProcessReport, ...]) -> None:
        L.report("agent-b", "b", b,
                 lambda m: add_request(m, b, SEAL_INTERNAL, "cmpl-x-1-0", span=False))  # fmt: skip

    sealed, out, _, a_mapped = sealed_window(tmp_path, forge)
    assert a_mapped == 0  # a's agent never mapped x-1 to anything
    assert not sealed.held and out.returncode != 0, (
        f"the window held on a request the run never served: held={sealed.held}, "
        f"verify-seal rc {out.returncode}: {out.stdout.strip()[-400:]}"
    )


def test_an_unledgered_row_never_makes_a_seal_hold(
    tmp_path: Path,
) -> None:
    """Attack (adversary 2, writes the SQLite file of the running verifier; does not hold the
    auditor's note): during the window, ``INSERT INTO request_ids`` one row (batch
    ``forged``, target a, ``cmpl-x-1-0`` -> the internal id of a's in-window request),
    with no ledger entry; after the seal, ``DELETE`` it again. The seal's requests check
    (``queries.request_steps``) reads ``request_ids``/``bindings`` without checking them
    against the ledger.

    Used to get: the signed seal held; ``verifier audit verify-seal --requests`` exits 0 ("1
    served by the window's processes", "held"); afterwards ``verifier audit verify --db
    --checkpoint OLD.note --key`` exits 0 (the row is gone, the ledger intact and an
    extension of the auditor's note). Truth: nobody ever served ``x-1``. Sound: a seal's
    requests check rests on ledgered rows only (the window does not hold, and its finding
    names the batch whose rows no ledger entry covers)."""
    rows: list[int] = []

    def forge(L: Lab, b: tuple[ProcessReport, ...]) -> None:
        out = L.audit("checkpoint", "--out", str(tmp_path / "old.note"))
        assert out.returncode == 0, out.stderr
        con = sqlite3.connect(L.db, timeout=30)
        with con:
            cur = con.execute(
                "INSERT INTO request_ids (batch, target, internal_id, external_id, client_id, "
                "at_unix) VALUES ('forged', 'a', ?, 'cmpl-x-1-0', 'x-1', ?)",
                (SEAL_INTERNAL, time.time()),
            )
            rows.append(int(cur.lastrowid or 0))
        con.close()

    def after(L: Lab) -> None:
        con = sqlite3.connect(L.db, timeout=30)
        with con:
            con.execute("DELETE FROM request_ids WHERE batch = 'forged'")
        con.close()
        rows.append(L.audit("verify", "--checkpoint", str(tmp_path / "old.note"), "--key",
                            f"{L.db}.signing.key.pub").returncode)  # fmt: skip

    sealed, out, _, a_mapped = sealed_window(tmp_path, forge, after)
    assert a_mapped == 0 and rows[-1] == 0  # no trace left: verify --checkpoint passes
    assert not sealed.held and out.returncode != 0, (
        f"the window held on a row the ledger never had: held={sealed.held}, verify-seal rc "
        f"{out.returncode}: {out.stdout.strip()[-300:]}; audit verify --checkpoint afterwards "
        f"rc {rows[-1]}"
    )


# ------------------------------------------------------------------ adversary 2


def failing(procs: tuple[ProcessReport, ...]) -> tuple[ProcessReport, ...]:
    """PROCS with the worker's runner file changed after load (the agent's hash disagrees
    with the probe's): run ``r`` FAILs on them."""
    return (*procs[:2], dataclasses.replace(procs[2], runner_file_sha256_now="f" * 64))


RUN_EDITS = [
    ("verdict FAIL->PASS", "verdicts", "verdict",
     "UPDATE verdicts SET verdict = 'PASS' WHERE verdict = 'FAIL'"),
    ("policy made to cover no target", "runs", "policy_toml",
     "UPDATE runs SET policy_toml = policy_toml || '[targets]' || char(10) || "
     "'names = [\"nobody\"]' || char(10)"),
]  # (name, table, column, the edit): the column is put back after each  # fmt: skip


def test_an_edited_verdict_or_run_row_is_refused_never_answered_signed_or_exported(
    tmp_path: Path,
) -> None:
    """Attack (adversary 2, writes the SQLite file): target a served ``honest-1`` while run
    ``r`` was FAIL on it. The operator edits one column outside the ledger's reach of the
    quick checks: ``UPDATE verdicts SET verdict = 'PASS'``, or appends ``[targets] names =
    ["nobody"]`` to ``runs.policy_toml`` (each in turn on one verifier, undone after).

    Used to get: ``verifier audit request honest-1 --db`` answered exit 0 with ``runs: [{run
    r, verdict PASS}]`` (policy variant: ``runs: []``); over the wire the running verifier
    signed that answer; ``verifier audit export --request honest-1`` wrote a bundle whose
    signed statement said the same and ``verifier audit verify BUNDLE --key`` exited 0,
    breaking the promise that an export never signs a row that disagrees with the ledger.
    Sound: the run and verdict rows an answer uses are checked against their ledger
    entries: exit 1 (refused) everywhere, as for any other edited row; ``audit run r`` too."""
    from tests.test_status_bytes import POLICY

    with lab(tmp_path, POLICY) as L:
        a = failing(procs_of("boot-a"))
        L.report("agent-a", "a", a)
        time.sleep(1.5)  # the verdict FAIL is recorded before the request's steps
        L.report("agent-a", "a", a,
                 lambda m: add_request(m, a, internal("honest-1"), "cmpl-honest-1-0"))  # fmt: skip
        time.sleep(1.0)
        for name, table, column, edit in RUN_EDITS:
            code, before = request_json(L, "honest-1")
            assert code == 0 and before[0]["runs"][0]["verdict"] == "FAIL", before  # control
            con = sqlite3.connect(L.db)
            with con:
                kept = con.execute(f"SELECT rowid, {column} FROM {table}").fetchall()  # noqa: S608
                con.execute(edit)
            con.close()
            code, after = request_json(L, "honest-1")
            over = L.audit_wire("request", "honest-1", "--json")
            bundle = tmp_path / "bundle.json"
            exp = L.audit("export", "--key", f"{L.db}.signing.key", "--out", str(bundle),
                          "--request", "honest-1")  # fmt: skip
            run = L.audit("run", "r")
            full = L.audit("verify")
            assert full.returncode == 1  # the full walk sees it (control)
            signed = ""
            if exp.returncode == 0:
                for env in json.loads(bundle.read_text())["statements"]:
                    payload = json.loads(base64.b64decode(env["payload"]))
                    signed += json.dumps(payload["predicate"].get("details", {}).get("runs", ""))
            assert (code, over.returncode, exp.returncode, run.returncode) == (1, 1, 1, 1), (
                f"{name}: answered: --db rc {code} runs "
                f"{after[0]['runs'] if code == 0 else after}; wire rc {over.returncode}; export "
                f"rc {exp.returncode}, signed runs {signed}; audit run rc {run.returncode}"
            )
            con = sqlite3.connect(L.db)
            with con:
                con.executemany(
                    f"UPDATE {table} SET {column} = ? WHERE rowid = ?",  # noqa: S608
                    [(v, r) for r, v in kept],
                )
            con.close()
            assert L.audit("verify").returncode == 0, name  # undone: the next edit alone


def test_a_request_whose_id_row_is_deleted_is_answered_as_never_served(tmp_path: Path) -> None:
    """Attack (adversary 2): ``DELETE FROM request_ids WHERE client_id = 'honest-1'`` (the
    ledgered batch now differs from its entry).

    Gets: ``verifier audit request honest-1`` (``--db``, and over the wire from the
    running verifier) exits 6, "no stored request binding matches 'honest-1'": the auditor
    is told the request was never served, not that the store was edited; only a separate
    full ``audit verify --db`` notices. (``audit file`` scans the ledgered manifests so that
    a deleted index row "is a difference, not not found"; ``audit request`` has no such
    guard.) Sound: exit 1 naming the edited batch, never "not found"."""
    with lab(tmp_path) as L:
        a = procs_of("boot-a")
        L.report("agent-a", "a", a,
                 lambda m: add_request(m, a, internal("honest-1"), "cmpl-honest-1-0"))  # fmt: skip
        assert L.audit("request", "honest-1").returncode == 0
        con = sqlite3.connect(L.db)
        with con:
            con.execute("DELETE FROM request_ids WHERE client_id = 'honest-1'")
        con.close()
        local = L.audit("request", "honest-1")
        over = L.audit_wire("request", "honest-1")
        full = L.audit("verify")
    assert full.returncode == 1  # control: the full walk sees the edit
    assert (local.returncode, over.returncode) == (1, 1), (
        f"deleted request answered as: --db rc {local.returncode} {local.stderr.strip()[:200]}"
        f"; wire rc {over.returncode} {over.stderr.strip()[:200]}"
    )


def test_a_deleted_manifest_hides_the_files_that_served_a_request(tmp_path: Path) -> None:
    """Attack (adversary 2): delete the worker's manifest and its index rows (``DELETE FROM
    manifests WHERE digest = M``; ``DELETE FROM manifest_files WHERE manifest = M``); its
    ledger entry, the ``processes`` rows and the bindings stay.

    Gets: ``verifier audit file vllm/v1/worker/cpu_model_runner.py`` (a file only the
    worker loaded) exits 6, "no stored manifest has a file matching": the file was never
    loaded anywhere; ``audit file <sha256 the worker and the API server both loaded>``
    lists the API server only (the worker that served the requests is gone from the
    answer); ``audit request honest-1`` answers exit 0 with the manifest "(not stored:
    between reports)", and over the wire the verifier signs that answer without the
    manifest and the CLI prints it verified. The manifest has a ledger entry (one probe:
    it *was* stored), so "between reports" is false; only a full ``audit verify --db``
    says "the manifest it records is gone". Sound: refused (exit 1), never "not found"."""
    with lab(tmp_path) as L:
        a = procs_of("boot-a")
        L.report("agent-a", "a", a,
                 lambda m: add_request(m, a, internal("honest-1"), "cmpl-honest-1-0"))  # fmt: skip
        worker_manifest = a[2].manifest_digest
        assert L.audit("file", "vllm/v1/worker/cpu_model_runner.py").returncode == 0
        con = sqlite3.connect(L.db)
        with con:
            con.execute("DELETE FROM manifests WHERE digest = ?", (worker_manifest,))
            con.execute("DELETE FROM manifest_files WHERE manifest = ?", (worker_manifest,))
        con.close()
        by_path = L.audit("file", "vllm/v1/worker/cpu_model_runner.py")
        shared = L.audit("file", "a" * 64, "--json")
        req = L.audit("request", "honest-1")
        over = L.audit_wire("request", "honest-1")
        full = L.audit("verify")
    assert full.returncode == 1  # control: the full walk sees it
    pids = sorted(s["pid"] for s in json.loads(shared.stdout)) if shared.returncode == 0 else []
    assert (by_path.returncode, shared.returncode, req.returncode, over.returncode) == (
        1,
        1,
        1,
        1,
    ), (
        f"file by path rc {by_path.returncode} ({by_path.stderr.strip()[:90]}); shared file rc "
        f"{shared.returncode} pids {pids}; request rc {req.returncode} "
        f"({[ln for ln in req.stdout.splitlines() if 'manifest' in ln]}); wire rc "
        f"{over.returncode}"
    )


def _deleted(con: sqlite3.Connection, table: str, where: str) -> list[tuple[Any, ...]]:
    """Delete TABLE's rows WHERE; return them with their rowid first (for ``_restore``)."""
    rows = con.execute(f"SELECT rowid, * FROM {table} WHERE {where}").fetchall()  # noqa: S608
    con.execute(f"DELETE FROM {table} WHERE {where}")  # noqa: S608
    return rows


def _restore(con: sqlite3.Connection, table: str, rows: list[tuple[Any, ...]]) -> int:
    """Put back rows ``_deleted`` took, with their rowids; how many."""
    cols = ["rowid"] + [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
    marks = ", ".join("?" * len(cols))
    con.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", rows)  # noqa: S608
    return len(rows)


def test_no_deletion_or_swap_behind_the_ledger_makes_a_served_request_or_file_not_found(
    tmp_path: Path,
) -> None:
    """Variations of the two attacks above (adversary 2, the database's writer), each undone
    before the next, the answers compared with the same query's before any edit:

    - the id row *swapped*: deleted and a forged row (another client id) inserted into the
      same batch, so the batch keeps its row count;
    - the whole batch deleted: its ``binding_batches`` row, its spans and its id rows (its
      ledger entry stays);
    - the spans of a request queried by its internal id (an engine with no API server has no
      id row) deleted;
    - the worker's manifest *edited* to drop one file (valid JSON, its ``manifest_files``
      row deleted too), not deleted.

    Sound: each such answer exits 1 naming the edit (never 6, "not found"); every control
    answer (before the edit, and after it is undone) is found (0)."""
    with lab(tmp_path) as L:
        a = procs_of("boot-a")
        L.report("agent-a", "a", a,
                 lambda m: add_request(m, a, internal("honest-1"), "cmpl-honest-1-0"))  # fmt: skip
        runner_file = "vllm/v1/worker/cpu_model_runner.py"
        queries = [("request", "honest-1"), ("request", internal("honest-1")),
                   ("file", runner_file)]  # fmt: skip
        assert [L.audit(*q).returncode for q in queries] == [0, 0, 0]
        con = sqlite3.connect(L.db)
        manifest = a[2].manifest_digest or ""
        (files_json,) = con.execute(
            "SELECT files_json FROM manifests WHERE digest = ?", (manifest,)
        ).fetchone()
        dropped = json.dumps([f for f in json.loads(files_json) if runner_file not in f["path"]])
        assert dropped != files_json

        def swap() -> Any:
            # the row's place taken by a forged row of the same batch: the count stays
            edit = "UPDATE request_ids SET client_id = ?, external_id = ? WHERE client_id = ?"
            con.execute(edit, ("other", "cmpl-other-0", "honest-1"))
            return lambda: con.execute(edit, ("honest-1", "cmpl-honest-1-0", "other"))

        def whole_batch() -> Any:
            (ref,) = con.execute(
                "SELECT batch FROM request_ids WHERE client_id = 'honest-1'"
            ).fetchone()
            tables = (("binding_batches", "ref"), ("bindings", "batch"), ("request_ids", "batch"))
            gone = [(t, _deleted(con, t, f"{c} = '{ref}'")) for t, c in tables]
            return lambda: [_restore(con, t, r) for t, r in gone]

        def spans_and_ids() -> Any:
            ids = _deleted(con, "request_ids", "client_id = 'honest-1'")
            spans = _deleted(con, "bindings", f"internal_id = '{internal('honest-1')}'")
            return lambda: (_restore(con, "request_ids", ids), _restore(con, "bindings", spans))

        def edited_manifest() -> Any:
            con.execute("UPDATE manifests SET files_json = ? WHERE digest = ?", (dropped, manifest))
            rows = _deleted(
                con, "manifest_files", f"manifest = '{manifest}' AND path_id IN (SELECT id "  # noqa: S608
                f"FROM paths WHERE path LIKE '%/{runner_file}')"
            )  # fmt: skip
            return lambda: (
                con.execute(
                    "UPDATE manifests SET files_json = ? WHERE digest = ?", (files_json, manifest)
                ),
                _restore(con, "manifest_files", rows),
            )

        cases = [(swap, queries[0]), (whole_batch, queries[0]), (spans_and_ids, queries[1]),
                 (edited_manifest, queries[2])]  # fmt: skip
        got = {}
        for edit, query in cases:
            with con:
                undo = edit()
            after = L.audit(*query)
            got[edit.__name__] = (after.returncode, after.stderr.strip()[:160])
            with con:
                undo()
            assert L.audit("verify").returncode == 0, edit.__name__  # undone
        con.close()
    assert {k: v[0] for k, v in got.items()} == dict.fromkeys(got, 1), got
    assert all("disagree with the ledgered content" in v[1] for v in got.values()), got


# ------------------------------------------------------------------ the SQL, on both backends


def test_the_audit_sql_keeps_targets_apart_and_counts_only_ledgered_rows(backend: Backend) -> None:
    """On a store alone (each backend): target a maps ``h`` to its internal id and served it;
    target b maps ``e`` to a's internal id (no span of its own on it) and reports a span
    under a boot of no process of its own; a row is inserted behind the ledger's
    back mapping ``x`` to a's internal id. Then ``h`` is a's alone (``find_request``, the
    seal's ``request_steps``), ``e`` and ``x`` are served by nobody (the unledgered batch
    named), and b's ghost span does not make a's process check disagree."""
    from servewitness.errors import NotFound
    from servewitness.ledger import index_check
    from servewitness.ledger.queries import find_request
    from servewitness.model import RequestId, RequestSpan
    from servewitness.server.db import open_database
    from servewitness.server.index import processes_seen
    from servewitness.server.store import Store, StoredReport

    a, b = procs_of("boot-a"), shifted(procs_of("boot-b"), "boot-b", 1)
    honest, m = internal("h"), a[2].manifest_digest or ""
    runner = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"

    def span(key: ProcessKey, rid: str = honest) -> RequestSpan:
        return RequestSpan(key, rid, 1, 5, 5, 5, 1.0, 2.0, m, m, runner, finished=True)

    ghost = ProcessKey("boot-ghost", b[2].key.pid, b[2].key.start_ticks)
    s = Store(backend.target)
    try:
        b_span, b_id = (
            span(ghost, "cmpl-g-0-bbbbbbbb"),
            RequestId(b[0].key, honest, "cmpl-e-0", 1.0),
        )
        for agent, target, procs, spans, ids in (
            ("agent-a", "a", a, [span(a[2].key)], [RequestId(a[0].key, honest, "cmpl-h-0", 1.0)]),
            ("agent-b", "b", b, [b_span], [b_id]),
        ):
            body = wire.report_to_bytes(TargetReport(agent, target, 1, "", 3.0, procs))
            files = {p.manifest_digest: p.files for p in procs if p.manifest_digest and p.files}
            assert s.save_report(StoredReport(agent, 1, target, 3.0, body), files,
                                 processes_seen(procs), spans, ids)  # fmt: skip
        assert s.verify_ledger().ok
        backend.sql((
            "INSERT INTO request_ids (batch, target, internal_id, external_id, client_id, "
            "at_unix) VALUES ('forged', 'a', ?, 'cmpl-x-0', 'x', 1.0)", (honest,),
        ))  # fmt: skip
        refused: set[str] = set()
        steps = s.request_steps(["h", "e", "x"], refused)
    finally:
        s.close()
    a_worker = ("a", "boot-a", a[2].key.pid, a[2].key.start_ticks, 1)
    assert (steps, refused) == ({"h": [a_worker], "e": [], "x": []}, {"forged"})
    db = open_database(backend.target, read_only=True)
    try:
        assert [(r.target, r.pid) for r in find_request(db, "h")] == [("a", a[2].key.pid)]
        with pytest.raises(NotFound):
            find_request(db, "e")
        assert index_check.check_processes(db, ["a", "b"]) == []
    finally:
        db.close()
