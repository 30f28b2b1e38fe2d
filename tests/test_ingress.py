"""The ingress (servewitness/server/ingress.py) over real gRPC: a caller is authorized from its
metadata before its bytes are parsed, the body must claim what the metadata did, and bytes
that are not a request are INVALID_ARGUMENT, counted by reason. Real verifiers: mutual TLS
with certificates from `verifier certs`, the Unix socket with local agents (kernel
credentials), plaintext loopback.

How "never parsed" is shown: the same garbage bytes are refused as not authorized when the
caller may not report for the target its metadata names, and as undecodable when it may.
Parsing first would answer undecodable to both."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import FileEntry, TargetReport
from servewitness.security.peercred import LocalAgent
from servewitness.security.tls import ClientTLS, ServerTLS
from servewitness.server import ingress
from servewitness.server.app import ServeConfig, VerifierServer
from tests.helpers import running_verifier
from tests.test_policy_engine import worker
from tests.test_security import certs

GARBAGE = b"\xff\xff\xff\xff\x0f" + b"\x00" * 64  # a field tag with a truncated varint
Raw = Callable[..., bytes]


def raw(ch: grpc.Channel, method: str, service: str = "VerifierService") -> Raw:
    """METHOD of SERVICE, called with bytes as they are (no serializer)."""
    call: Raw = ch.unary_unary(f"/verifier.api.v1.{service}/{method}")
    return call


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details() or ""


def report_bytes(agent: str, target: str, nonce: str = "n" * 32, files: int = 0) -> bytes:
    proc = worker()
    if files:
        many = tuple(
            FileEntry(f"/site/f{i}.py", None, 1, "source", None, "load") for i in range(files)
        )
        proc = worker(files=many)
    rep = TargetReport(agent, target, 1, nonce, time.time(), (proc,))
    data: bytes = wire.report_request_to_pb(rep).SerializeToString()
    return data


def refusals(server: VerifierServer, method: str, reason: str) -> float:
    return server.service.metrics.refused_calls(method, reason)


@pytest.fixture(scope="module")
def tls_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VerifierServer, Path]]:
    tmp = tmp_path_factory.mktemp("ingress-tls")
    d = certs(tmp)  # agent-a reports for target a; nobody for z
    tls = ServerTLS(d / "verifier.pem", d / "verifier.key", d / "ca.pem")
    with running_verifier("127.0.0.1:0", tmp / "db.sqlite3", tls=tls) as server:
        yield server, d


@pytest.fixture
def agent_a(tls_served: tuple[VerifierServer, Path]) -> Iterator[grpc.Channel]:
    server, d = tls_served
    creds = ClientTLS(d / "ca.pem", d / "agent-a.pem", d / "agent-a.key")
    with creds.channel(f"127.0.0.1:{server.port}", wire.GRPC_OPTIONS) as ch:
        yield ch


def test_tls_garbage_for_a_foreign_target_is_not_authorized_and_never_parsed(
    tls_served: tuple[VerifierServer, Path], agent_a: grpc.Channel
) -> None:
    server, _ = tls_served
    report = raw(agent_a, "Report")
    before = refusals(server, "Report", "undecodable")
    code, why = refused(lambda: report(GARBAGE, metadata=wire.agent_metadata("agent-a", ["z"])))
    assert (code, "may not report for target(s) z" in why) == (
        grpc.StatusCode.PERMISSION_DENIED,
        True,
    ), why
    assert refusals(server, "Report", "undecodable") == before  # not parsed, so not counted so
    # Negative control: the same bytes, for the certificate's own target, are parsed.
    code, why = refused(lambda: report(GARBAGE, metadata=wire.agent_metadata("agent-a", ["a"])))
    assert (code, why.startswith("undecodable request")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        True,
    ), why
    assert refusals(server, "Report", "undecodable") == before + 1
    # Another agent's name in the metadata, for an allowed target: refused before parsing too.
    code, why = refused(lambda: report(GARBAGE, metadata=wire.agent_metadata("agent-b", ["a"])))
    assert (code, "may not report as agent 'agent-b'" in why) == (
        grpc.StatusCode.PERMISSION_DENIED,
        True,
    ), why


def test_tls_a_large_report_for_a_foreign_target_costs_no_decoding(
    tls_served: tuple[VerifierServer, Path], agent_a: grpc.Channel
) -> None:
    """200,000 files (the files_per_manifest limit): the authorized report is converted
    entry by entry before its nonce is found wrong; the foreign one is refused on its
    metadata. Ratio measured in this test, generous margin (measured: 0.05 s against 0.86 s)."""
    report = raw(agent_a, "Report")
    foreign, own = (
        report_bytes("agent-a", "z", files=200_000),
        report_bytes("agent-a", "a", files=200_000),
    )
    t0 = time.monotonic()
    code, _ = refused(lambda: report(foreign, metadata=wire.agent_metadata("agent-a", ["z"])))
    t_foreign = time.monotonic() - t0
    assert code == grpc.StatusCode.PERMISSION_DENIED
    t0 = time.monotonic()
    code, why = refused(lambda: report(own, metadata=wire.agent_metadata("agent-a", ["a"])))
    t_own = time.monotonic() - t0
    assert code == grpc.StatusCode.FAILED_PRECONDITION, why  # parsed, converted, then the nonce
    assert t_foreign < t_own / 3, (t_foreign, t_own)


def test_tls_a_body_that_claims_other_than_its_metadata_is_refused(
    tls_served: tuple[VerifierServer, Path], agent_a: grpc.Channel
) -> None:
    server, _ = tls_served
    report, hello = raw(agent_a, "Report"), raw(agent_a, "Hello")
    md = wire.agent_metadata("agent-a", ["a"])
    for body in (report_bytes("agent-a", "z"), report_bytes("agent-b", "a")):
        code, why = refused(lambda b=body: report(b, metadata=md))  # type: ignore[misc]
        assert (code, "its metadata agent 'agent-a'" in why) == (
            grpc.StatusCode.PERMISSION_DENIED,
            True,
        ), why
    other = pb.HelloRequest(agent_id="agent-a", targets=["a", "z"]).SerializeToString()
    code, why = refused(lambda: hello(other, metadata=md))
    assert code == grpc.StatusCode.PERMISSION_DENIED, why
    # Negative control: body and metadata agree, the certificate names them: a nonce.
    ok = pb.HelloRequest(agent_id="agent-a", targets=["a"]).SerializeToString()
    assert pb.HelloResponse.FromString(hello(ok, metadata=md)).nonce
    assert refusals(server, "Hello", "not_authorized") >= 1


def test_tls_missing_or_oversized_agent_metadata_is_refused_naming_it(
    tls_served: tuple[VerifierServer, Path], agent_a: grpc.Channel
) -> None:
    server, _ = tls_served
    report = raw(agent_a, "Report")
    body = report_bytes("agent-a", "a")
    code, why = refused(lambda: report(body))
    assert (code, "missing or invalid x-verifier-agent-id" in why) == (
        grpc.StatusCode.PERMISSION_DENIED,
        True,
    ), why
    code, why = refused(lambda: report(body, metadata=(("x-verifier-agent-id", "agent-a"),)))
    assert (code, "x-verifier-target" in why) == (grpc.StatusCode.PERMISSION_DENIED, True), why
    before = refusals(server, "Report", "too_large")
    long_id = "a" * 257
    code, why = refused(lambda: report(body, metadata=wire.agent_metadata(long_id, ["a"])))
    assert (code, "257 > limit id_bytes (256)" in why) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        True,
    ), why
    assert refusals(server, "Report", "too_large") == before + 1
    # Variations: the limit is in bytes (129 two-byte characters are 258 bytes), and a second
    # agent id beside the certificate's own is not a choice the verifier makes for the caller.
    code, why = refused(lambda: report(body, metadata=wire.agent_metadata("é" * 129, ["a"])))
    assert (code, "258 > limit id_bytes (256)" in why) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        True,
    ), why
    two = (("x-verifier-agent-id", "agent-a"), *wire.agent_metadata("agent-b", ["a"]))
    code, why = refused(lambda: report(body, metadata=two))
    assert (code, "missing or invalid x-verifier-agent-id" in why) == (
        grpc.StatusCode.PERMISSION_DENIED,
        True,
    ), why


def test_tls_roles_are_checked_before_the_request_is_parsed(
    tls_served: tuple[VerifierServer, Path],
) -> None:
    """An agent certificate sends garbage to an operator's method and an auditor's: not
    authorized, not undecodable."""
    server, d = tls_served
    creds = ClientTLS(d / "ca.pem", d / "agent-a.pem", d / "agent-a.key")
    with creds.channel(f"127.0.0.1:{server.port}", wire.GRPC_OPTIONS) as ch:
        for service, method in (("VerifierService", "RegisterRun"), ("AuditService", "AuditRun")):
            code, why = refused(lambda s=service, m=method: raw(ch, m, s)(GARBAGE))  # type: ignore[misc]
            assert (code, "may not do this" in why) == (
                grpc.StatusCode.PERMISSION_DENIED,
                True,
            ), why


def test_tls_only_an_authorized_status_read_holds_agents_back(
    tls_served: tuple[VerifierServer, Path],
) -> None:
    """Status reads hold agents' calls back while they run (``admission.ReadsFirst``), which a
    flood of them could turn against ingest: a read is counted only once its caller was
    authorized and its request parsed. An agent's certificate asking for a run's status, and
    an auditor's sending garbage, hold nobody; an auditor's status read does (the control)."""
    server, d = tls_served
    rf = server.reads_first
    rf.cooldown_s = 0.0  # every read may hold: only authorization decides here
    before = rf.holds
    for who, body in (("agent-a", pb.GetRunStatusRequest(name="r").SerializeToString()),
                      ("audit", GARBAGE)):  # fmt: skip
        creds = ClientTLS(d / "ca.pem", d / f"{who}.pem", d / f"{who}.key")
        with creds.channel(f"127.0.0.1:{server.port}", wire.GRPC_OPTIONS) as ch:
            code, why = refused(lambda c=ch, b=body: raw(c, "GetRunStatus")(b))  # type: ignore[misc]
        assert code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT), why
    assert rf.holds == before
    creds = ClientTLS(d / "ca.pem", d / "audit.pem", d / "audit.key")
    with creds.channel(f"127.0.0.1:{server.port}", wire.GRPC_OPTIONS) as ch:
        code, _ = refused(lambda: raw(ch, "GetRunStatus")(b"\n\x07no-such"))  # run "no-such"
    assert code == grpc.StatusCode.NOT_FOUND and rf.holds == before + 1


def test_local_agent_garbage_for_an_unlisted_target_is_not_authorized_and_never_parsed() -> None:
    d = Path(tempfile.mkdtemp(prefix="ving-"))
    addr = f"unix:{d}/v.sock"
    me = LocalAgent(os.getuid(), frozenset({"t"}))
    server = VerifierServer(ServeConfig(addr, d / "db.sqlite3", local_agents=(me,)))
    server.start()
    try:
        with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
            report = raw(ch, "Report")
            code, why = refused(lambda: report(GARBAGE, metadata=wire.agent_metadata("x", ["u"])))
            assert (code, "may not report for target(s) u" in why) == (
                grpc.StatusCode.PERMISSION_DENIED,
                True,
            ), why
            code, why = refused(lambda: report(GARBAGE, metadata=wire.agent_metadata("x", ["t"])))
            assert (code, why.startswith("undecodable")) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                True,
            ), why
            # The body names another target than the metadata: refused in insecure mode too.
            code, why = refused(
                lambda: report(report_bytes("x", "u"), metadata=wire.agent_metadata("x", ["t"]))
            )
            assert (code, "its metadata agent" in why) == (
                grpc.StatusCode.PERMISSION_DENIED,
                True,
            ), why
    finally:
        server.stop()


METHODS = [(service, method) for service, methods in ingress.GATES.items() for method in methods]


def test_the_gate_table_covers_every_method_of_both_services() -> None:
    served = {
        (s, m) for s in ("VerifierService", "AuditService")
        for m in pb.DESCRIPTOR.services_by_name[s].methods_by_name
    }  # fmt: skip
    assert set(METHODS) == served


def test_garbage_bytes_to_every_method_are_invalid_argument_counted_once(tmp_path: Path) -> None:
    server = VerifierServer(ServeConfig("127.0.0.1:0", tmp_path / "db.sqlite3"))
    server.start()
    m = server.service.metrics
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            for service, method in METHODS:
                md = wire.agent_metadata("x", ["t"]) if method in ("Hello", "Report") else ()
                total = sum(m.refused_calls(method, r) for r in _reasons())
                before = m.refused_calls(method, "undecodable")
                call = raw(ch, method, service)
                code, why = refused(lambda c=call, md=md: c(GARBAGE, metadata=md))  # type: ignore[misc]
                assert (method, code, why.startswith("undecodable request")) == (
                    method,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    True,
                ), why
                assert m.refused_calls(method, "undecodable") == before + 1
                after = sum(m.refused_calls(method, r) for r in _reasons())
                assert after == total + 1, method  # exactly one reason per refusal
        scraped = m.render()
        assert 'verifier_refusals_total{method="Report",reason="undecodable"} 1' in scraped
        assert 'verifier_reports_refused_total{reason="undecodable"} 1' in scraped
    finally:
        server.stop()


def _reasons() -> tuple[str, ...]:
    from servewitness.server.metrics import REFUSAL_REASONS

    return REFUSAL_REASONS


def test_each_refusal_of_hello_report_and_register_run_counts_exactly_one_reason(
    tmp_path: Path,
) -> None:
    server = VerifierServer(ServeConfig("127.0.0.1:0", tmp_path / "db.sqlite3"))
    server.start()
    m = server.service.metrics
    md = wire.agent_metadata("x", ["t"])
    no_role = pb.ReportRequest.FromString(report_bytes("x", "t"))
    no_role.report.processes[0].role = ""

    def hello(agent: str, targets: list[str]) -> bytes:
        return bytes(pb.HelloRequest(agent_id=agent, targets=targets).SerializeToString())

    def register(policy: str) -> bytes:
        return bytes(pb.RegisterRunRequest(name="r", policy_toml=policy).SerializeToString())

    calls: list[tuple[str, str, bytes, tuple[tuple[str, str], ...]]] = [
        ("Report", "nonce", report_bytes("x", "t"), md),
        ("Report", "malformed", no_role.SerializeToString(), md),
        ("Report", "not_authorized", report_bytes("x", "t"), ()),
        ("Report", "too_large", report_bytes("x", "t", nonce="n" * 257), md),
        ("Report", "undecodable", GARBAGE, md),
        ("Hello", "not_authorized", hello("y", ["t"]), md),
        ("Hello", "malformed", hello("x", ["t", ""]), md),
        ("RegisterRun", "malformed", register("x ="), ()),
        ("RegisterRun", "too_large", register("#" * (1024 * 1024 + 1)), ()),
    ]
    try:
        addr = f"127.0.0.1:{server.port}"
        with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
            for method, reason, body, metadata in calls:
                counts = {r: m.refused_calls(method, r) for r in _reasons()}
                call = raw(ch, method)
                refused(lambda b=body, c=call, md=metadata: c(b, metadata=md))  # type: ignore[misc]
                after = {r: m.refused_calls(method, r) for r in _reasons()}
                moved = {r: after[r] - counts[r] for r in _reasons() if after[r] != counts[r]}
                assert (method, reason, moved) == (method, reason, {reason: 1.0})
    finally:
        server.stop()


def test_a_refusal_text_is_bounded_to_what_a_client_accepts() -> None:
    """A refusal quoting a hostile value whole is cut (never inside a character) so that its
    percent-encoded trailer stays under a client's 8 KiB soft limit; a short one is as is."""
    from servewitness.server.ingress import DETAILS_BYTES, bounded_details

    assert bounded_details("no run named 'x'") == "no run named 'x'"
    long = "no run named '" + "é" * 4095 + "'"
    cut = bounded_details(long)
    head, _, rest = cut.partition("... [")
    assert long.startswith(head) and len(head.encode()) <= DETAILS_BYTES
    assert rest == f"{len(long.encode()) - len(head.encode())} more bytes]"
    assert 3 * len(cut.encode()) < 8192  # every byte percent-encoded, still under the limit
