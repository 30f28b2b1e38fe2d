"""Prometheus metrics and structured logs of `verifier serve` and `verifier agent`
(docs/operations.md): the registry's text format, and a real verifier with a real agent,
both scraped over HTTP while reports flow, while the verifier is away, and in their logs."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from servewitness.errors import ConfigError
from servewitness.metrics.http import MetricsServer, parse_listen
from servewitness.metrics.registry import Bounded, ScrapeTime, new_registry
from servewitness.testing.vllm_server import free_port
from tests.helpers import agent_stub, not_vllm_policy, threads_started
from tests.test_gate_e2e import Daemon

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """A scrape, read by prometheus_client's own parser (which refuses what is not the text
    format): (sample name, labels) -> value."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), math.nan)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in samples if n == name]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"] == CONTENT_TYPE_PLAIN_0_0_4
        return parse(r.read().decode())


def until(what: str, check: Callable[[], bool], logs: list[Path], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(what + "\n" + "\n".join(p.read_text()[-3000:] for p in logs))
        time.sleep(0.1)


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


# The registry and the endpoint ----------------------------------------------------------------


def test_every_registry_carries_process_and_build_metrics() -> None:
    s = parse(generate_latest(new_registry()).decode())
    assert get(s, "verifier_build_info", version=__import__("servewitness").__version__) == 1
    assert get(s, "process_resident_memory_bytes") > 0
    assert abs(get(s, "process_start_time_seconds") - time.time()) < 24 * 3600
    assert get(s, "process_open_fds") > 0
    assert [x["implementation"] for x in series(s, "python_info")] == ["CPython"]
    assert not [k for k in s if k[0].endswith("_created")]  # no _created series


def test_a_value_read_at_scrape_time_that_fails_leaves_the_rest() -> None:
    r = new_registry()

    def broken() -> float:
        raise OSError("database gone")

    ScrapeTime(r, "x_entries", "entries", broken)
    ScrapeTime(r, "x_ok_total", "ok", lambda: 3, counter=True)
    s = parse(generate_latest(r).decode())
    assert get(s, "x_ok_total") == 3.0 and ("x_entries", frozenset()) not in s


def test_bounded_series_refuse_new_keys_and_forget_frees_a_place() -> None:
    r = new_registry()
    overflow = Counter("x_refused_total", "refused", ["label"], registry=r)
    g = Gauge("x_hook", "hook", ["target", "hook"], registry=r)
    b = Bounded("target", 2, 2, overflow)
    for t in ("a", "b", "c"):
        b.set(g, t, 1.0, "h")
    b.replace(g, "a", {("h",): 1.0, ("i",): 2.0, ("j",): 3.0})  # j: over a's 2 hooks
    s = parse(generate_latest(r).decode())
    assert sorted((x["target"], x["hook"]) for x in series(s, "x_hook")) == [
        ("a", "h"),
        ("a", "i"),
        ("b", "h"),
    ]
    assert get(s, "x_refused_total", label="target") == 2  # c, and a's third hook
    b.replace(g, "a", {("i",): 5.0})  # h no longer reported: its series goes
    b.forget("b")
    b.set(g, "c", 1.0, "h")  # b's place is c's now
    s = parse(generate_latest(r).decode())
    assert {(x["target"], x["hook"]) for x in series(s, "x_hook")} == {("a", "i"), ("c", "h")}
    assert get(s, "x_hook", target="a", hook="i") == 5.0


def test_listen_addresses() -> None:
    assert parse_listen("9100") == ("127.0.0.1", 9100)
    assert parse_listen(":9100") == ("127.0.0.1", 9100)
    assert parse_listen("0.0.0.0:9100") == ("0.0.0.0", 9100)  # noqa: S104
    assert parse_listen("[::1]:9100") == ("::1", 9100)
    for bad in ("host", "host:port", "1:99999"):
        with pytest.raises(ConfigError, match="--metrics-listen"):
            parse_listen(bad)


def _registry_with_one() -> CollectorRegistry:
    r = new_registry()
    Counter("x_total", "x", registry=r).inc()
    return r


def test_the_endpoint_serves_metrics_and_nothing_else() -> None:
    r = _registry_with_one()
    server = MetricsServer("127.0.0.1:0", r).start()
    try:
        assert get(scrape(server.port), "x_total") == 1.0
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=5)
        assert e.value.code == 404
        e.value.close()
        with pytest.raises(ConfigError, match="cannot listen"):
            MetricsServer(f"127.0.0.1:{server.port}", r)  # taken
    finally:
        server.stop()


def test_a_scraper_that_asks_for_openmetrics_gets_it() -> None:
    server = MetricsServer("127.0.0.1:0", _registry_with_one()).start()
    try:
        ask = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        )
        with urllib.request.urlopen(ask, timeout=5) as r:  # noqa: S310 - http://127.0.0.1 above
            kind, text = r.headers["Content-Type"], r.read().decode()
    finally:
        server.stop()
    assert kind.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(text)}  # type: ignore[no-untyped-call]
    assert families["x"].type == "counter" and families["x"].samples[0].value == 1.0


def _silent(port: int, n: int) -> list[socket.socket]:
    """N clients that connect and never send a request."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def test_silent_scrapers_cost_bounded_threads_and_never_starve_a_real_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hundred connections that say nothing: never more than MAX_CONNECTIONS threads serve
    them (the rest are closed at once), every silent client is dropped (closed at once, or after
    the idle timeout: its read sees EOF), and a real scrape is answered afterwards."""
    r = _registry_with_one()
    server = MetricsServer("127.0.0.1:0", r, idle_s=1.0, max_connections=4).start()
    started = threads_started(monkeypatch)
    socks = _silent(server.port, 100)
    try:
        most = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            most = max(most, sum(t.is_alive() for t in started))
            time.sleep(0.01)
        assert 0 < most <= 4  # counted: the threads that served the silent ones
        assert server.turned_away >= 50  # the cap acted: most were closed at once
        for s in socks:
            assert s.recv(1) == b""
        assert get(scrape(server.port), "x_total") == 1.0  # the slots came back
    finally:
        for s in socks:
            s.close()
        server.stop()


# A real verifier and agent -------------------------------------------------------------------


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_metrics_and_logs_of_a_live_verifier_and_agent(tmp_path: Path, sleeper: int) -> None:
    sock = tmp_path / "v.sock"
    (tmp_path / "p.toml").write_text(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'))
    vport, aport = free_port(), free_port()
    serve_log, agent_log = tmp_path / "serve.log", tmp_path / "agent.log"
    logs = [serve_log, agent_log]
    serve = Daemon(["-vv", "serve", "--listen", f"unix:{sock}", "--db", str(tmp_path / "db"),
                    "--report-interval", "0.2", "--run", f"r={tmp_path / 'p.toml'}",
                    "--metrics-listen", f"127.0.0.1:{vport}"], serve_log).start()  # fmt: skip
    agent = None
    try:
        until("verifier socket", sock.exists, logs)
        agent = Daemon(["-vv", "agent", "--verifier", f"unix:{sock}", "--target", "t",
                        "--agent-id", "a-1", "--pid", str(sleeper), "--interval", "0.2",
                        "--spool", str(tmp_path / "spool"), "--no-docker",
                        "--metrics-listen", f"127.0.0.1:{aport}"], agent_log).start()  # fmt: skip

        # Happy path: reports flow; nothing is refused; the spool empties.
        until("3 accepted", lambda: get(scrape(vport), "verifier_reports_total",
                                        result="accepted") >= 3, logs)  # fmt: skip
        v = scrape(vport)
        assert get(v, "verifier_reports_received_total") >= 3
        for reason in ("malformed", "nonce", "not_authorized", "storage", "other"):
            assert get(v, "verifier_reports_refused_total", reason=reason) == 0, reason
        assert get(v, "verifier_reports_total", result="refused") == 0
        assert get(v, "verifier_ingest_duration_seconds_count") >= 3
        assert 0 <= get(v, "verifier_ingest_lag_seconds", target="t") < 30
        assert get(v, "verifier_last_report_timestamp_seconds", target="t") > time.time() - 60
        assert get(v, "verifier_ledger_entries") >= 4  # the run and >= 3 reports
        assert get(v, "verifier_rpcs_total", method="Hello", code="OK") >= 1
        assert get(v, "verifier_rpcs_total", method="Report", code="OK") >= 3
        assert get(v, "verifier_bindings_ingested_total", kind="span") == 0  # no probe here
        assert get(v, "verifier_target_processes", target="t") >= 0  # the series is there
        assert get(v, "verifier_target_steps", target="t", kind="total") == 0  # no probe: no steps
        assert get(v, "process_resident_memory_bytes") > 0 and get(v, "process_open_fds") > 0
        until("a verdict of run r", lambda: sum(
            get(scrape(vport), "verifier_run_verdict", run="r", verdict=x)
            for x in ("PASS", "FAIL", "PENDING", "STALE")) == 1, logs)  # fmt: skip

        caught_up: list[Samples] = []

        def agent_caught_up() -> bool:
            a = scrape(aport)
            if (
                get(a, "verifier_agent_reports_acknowledged_total") >= 3
                and get(a, "verifier_agent_spool_reports") == 0
            ):
                caught_up.append(a)
            return bool(caught_up)

        until("agent acknowledged, spool empty", agent_caught_up, logs)
        # the scrape that showed the spool empty: a later one may hold the next report (every
        # 0.2 s), which a loaded machine leaves unsent for a while
        a = caught_up[0]
        assert get(a, "verifier_agent_spool_bytes") == 0
        assert get(a, "verifier_agent_collects_total") >= 3
        assert get(a, "verifier_agent_collect_duration_seconds_count") >= 3
        assert get(a, "verifier_agent_reports_sent_total") >= 3
        assert get(a, "verifier_agent_last_report_timestamp_seconds") > time.time() - 60
        assert total(a, "verifier_agent_verifier_errors_total") == 0
        assert get(a, "verifier_agent_reports_refused_total", reason="malformed") == 0
        assert get(a, "verifier_agent_spool_dropped_total") == 0
        assert get(a, "process_resident_memory_bytes") > 0
        acked = get(a, "verifier_agent_reports_acknowledged_total")

        # The verifier goes away: the agent counts failures and spools.
        assert serve.stop() == 0

        def agent_spools() -> bool:
            a = scrape(aport)
            return (
                total(a, "verifier_agent_verifier_errors_total") >= 2
                and get(a, "verifier_agent_spool_reports") >= 2
            )

        until("agent errors and spool growing", agent_spools, logs)
        a = scrape(aport)
        assert get(a, "verifier_agent_spool_bytes") > 0
        assert get(a, "verifier_agent_verifier_errors_total", code="UNAVAILABLE") >= 2
        assert get(a, "verifier_agent_reports_acknowledged_total") == acked
    finally:
        if agent is not None and agent.proc is not None:
            agent.stop()
        if serve.proc is not None:
            serve.stop()

    # Logs: JSON lines; each about a report names agent, target and seq, and the RPC.
    stored = [e for e in json_lines(serve_log) if e.get("event") == "report_stored"]
    assert len(stored) >= 3
    for e in stored:
        assert e["agent"] == "a-1" and e["target"] == "t" and isinstance(e["seq"], int), e
        # on the Unix socket the kernel names the peer (security/peercred.py)
        assert e["method"] == "Report" and e["peer"] and e["identity"].startswith("unix:uid="), e
        assert e["level"] == "debug" and "timestamp" in e, e
    assert len({e["seq"] for e in stored}) == len(stored)
    hello = [e for e in json_lines(serve_log) if e.get("event") == "hello"]
    assert hello and all(e["method"] == "Hello" and "peer" in e for e in hello)
    # Lines the verifier writes outside an RPC carry none of a call's fields.
    verdicts = [e for e in json_lines(serve_log) if e.get("event") == "verdict"]
    assert verdicts and not any({"method", "seq", "target"} & set(e) for e in verdicts)
    agent_lines = json_lines(agent_log)
    acks = [e for e in agent_lines if e.get("event") == "report_acknowledged"]
    assert len(acks) >= 3
    for e in agent_lines:
        if e.get("event") in ("connected", "report_acknowledged", "verifier_unreachable"):
            assert e["target"] == "t" and e["agent_id"] == "a-1", e
    assert any(e.get("event") == "verifier_unreachable" for e in agent_lines)


def test_metrics_listen_in_use_is_a_start_up_error(tmp_path: Path) -> None:
    from tests.helpers import verifier_cli

    taken = MetricsServer("127.0.0.1:0", new_registry()).start()
    try:
        out = verifier_cli("serve", "--listen", f"unix:{tmp_path / 's'}", "--db",
                           str(tmp_path / "db"), "--metrics-listen",
                           f"127.0.0.1:{taken.port}", timeout=60)  # fmt: skip
    finally:
        taken.stop()
    assert out.returncode == 3 and "--metrics-listen" in out.stderr, out.stderr


def test_refusals_duplicates_and_manifest_requests_are_counted_by_reason(tmp_path: Path) -> None:
    """The positive control of the zeros above: each way a report is not (newly) stored moves
    its own series, and only that one."""
    import grpc

    from servewitness import wire
    from servewitness.model import FileEntry
    from servewitness.server.app import ServeConfig, VerifierServer
    from tests.test_verifier_grpc import SHA, hello, process, report

    addr = f"unix:{tmp_path}/v.sock"
    server = VerifierServer(ServeConfig(addr, tmp_path / "db.sqlite3", report_interval_s=0.2))
    server.start()
    try:
        with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
            stub = agent_stub(ch)
            with pytest.raises(grpc.RpcError):
                stub.Report(report("no-hello-yet"))  # nonce
            nonce = hello(stub)
            files = (FileEntry("/a.py", SHA, 3, "source", "a", "load"),)
            with pytest.raises(grpc.RpcError):  # a manifest that is not its files' digest
                stub.Report(report(nonce, 1, process(files, "sha256:" + "0" * 64)))
            unknown = process(None, "sha256:" + "1" * 64)
            assert not stub.Report(report(nonce, 1, unknown)).accepted  # need_manifests
            nonce = stub.Report(report(nonce, 1)).nonce
            assert stub.Report(report(nonce, 1)).accepted  # a duplicate, acknowledged again
        s = parse(server.service.metrics.render())
    finally:
        server.stop()
    assert get(s, "verifier_reports_received_total") == 5
    assert get(s, "verifier_reports_refused_total", reason="nonce") == 1
    assert get(s, "verifier_reports_refused_total", reason="malformed") == 1
    for reason in ("not_authorized", "storage", "other"):
        assert get(s, "verifier_reports_refused_total", reason=reason) == 0
    expected = {"accepted": 1, "duplicate": 1, "need_manifests": 1, "refused": 2}
    for result, n in expected.items():
        assert get(s, "verifier_reports_total", result=result) == n, result
    assert get(s, "verifier_rpcs_total", method="Report", code="FAILED_PRECONDITION") == 1
    assert get(s, "verifier_rpcs_total", method="Report", code="INVALID_ARGUMENT") == 1
    assert get(s, "verifier_rpcs_total", method="Report", code="OK") == 3
    assert get(s, "verifier_ledger_entries") == 2  # the manifest and the report


def test_the_write_lock_s_wait_and_hold_are_counted(tmp_path: Path) -> None:
    """Another writer on the verifier's database (as a second verifier process would) holds
    the write lock while an agent's report arrives: the report is acknowledged only once the
    lock is let go, and the verifier counts the wait (at least the time the lock was held
    after its transaction began waiting) apart from the time it held the lock. Negative
    control: before the report, no wait was counted beyond the start's own transactions."""
    import grpc

    from servewitness import wire
    from servewitness.server.app import ServeConfig, VerifierServer
    from servewitness.server.db import open_database
    from tests.test_verifier_grpc import hello, report

    held_s = 0.3
    addr, db_path = f"unix:{tmp_path}/v.sock", tmp_path / "db.sqlite3"
    server = VerifierServer(ServeConfig(addr, db_path, report_interval_s=0.2))
    server.start()
    other = open_database(db_path)
    try:
        with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
            stub = agent_stub(ch)
            nonce = hello(stub)
            before = parse(server.service.metrics.render())
            began = get(before, "verifier_store_transactions_total")
            other.begin()  # the write lock is the other writer's
            call = stub.Report.future(report(nonce, 1))
            store = server.service.store
            until("the report's transaction waiting", lambda: store.transactions > began, [])
            time.sleep(held_s)  # the lock stays the other's this long after the wait began
            assert not call.done()
            other.commit()
            assert call.result(timeout=30).accepted
        after = parse(server.service.metrics.render())
    finally:
        if other.in_transaction:
            other.rollback()
        other.close()
        server.stop()
    waited = get(after, "verifier_store_write_wait_seconds_total")
    assert waited - get(before, "verifier_store_write_wait_seconds_total") >= held_s
    assert get(after, "verifier_store_write_held_seconds_total") > get(
        before, "verifier_store_write_held_seconds_total"
    )
    assert get(after, "verifier_store_transactions_total") >= began + 1
    assert get(before, "verifier_store_write_wait_seconds_total") < held_s


# Evidence per target, over the real endpoint of a real verifier -------------------------------


TARGET_FAMILIES = (
    "verifier_target_steps",
    "verifier_target_hook_fires",
    "verifier_target_processes",
    "verifier_last_report_timestamp_seconds",
    "verifier_ingest_lag_seconds",
)


def _evidence_report(
    agent: str, target: str, seq: int, nonce: str, steps: tuple[int, int], *, fires: dict[str, int]
) -> Any:
    """A Report of one worker that ran STEPS (total, productive) with hooks fired FIRES."""
    import dataclasses

    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb
    from servewitness.model import FileEntry, HookEvidence, StepEvidence, TargetReport
    from tests.test_verifier_grpc import SHA, process

    base = process((FileEntry("/a.py", SHA, 3, "source", "a", "load"),))
    hooks = tuple(
        HookEvidence(name, "m:C.f", True, True, "m.C", "method", None, "m.C", n, n, 1, steps[0])
        for name, n in fires.items()
    )
    total, productive = steps
    step = StepEvidence(total, productive, total - productive, productive, 1, 1, time.time_ns())
    proc = dataclasses.replace(base, steps=step, hooks=hooks)
    now = time.time()
    rep = TargetReport(agent, target, seq, nonce, now, (proc,), collected_unix=now)
    return pb.ReportRequest(report=wire.report_to_pb(rep))


def test_evidence_per_target_moves_with_real_reports_and_goes_with_the_target(
    tmp_path: Path,
) -> None:
    """Steps and hook fires per target, and the run's verdict, as scraped from the verifier's
    /metrics after each real report; a hook no longer reported loses its series, and a
    forgotten target loses all of its."""
    import grpc

    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb
    from tests.helpers import running_verifier

    policy = tmp_path / "p.toml"
    policy.write_text(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'))
    addr = f"unix:{tmp_path}/v.sock"
    with (
        running_verifier(
            addr, tmp_path / "db", metrics_listen="127.0.0.1:0", runs=(("r", policy),)
        ) as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        port = server.metrics_http.port
        stub = agent_stub(ch)
        nonce = stub.Hello(pb.HelloRequest(agent_id="a", targets=["t"])).nonce
        before = scrape(port)
        assert series(before, "verifier_target_steps") == []  # negative control: no report yet
        assert series(before, "verifier_target_verdict") == []
        nonce = stub.Report(
            _evidence_report("a", "t", 1, nonce, (5, 3), fires={"h": 2, "g": 1})
        ).nonce
        s = scrape(port)
        assert (get(s, "verifier_target_steps", target="t", kind="total"),
                get(s, "verifier_target_steps", target="t", kind="productive"),
                get(s, "verifier_target_hook_fires", target="t", hook="h"),
                get(s, "verifier_target_hook_fires", target="t", hook="g"),
                get(s, "verifier_target_processes", target="t")) == (5, 3, 2, 1, 1)  # fmt: skip
        stub.Report(_evidence_report("a", "t", 2, nonce, (9, 7), fires={"h": 6}))
        s = scrape(port)
        moved = (get(s, "verifier_target_steps", target="t", kind="total"),
                 get(s, "verifier_target_steps", target="t", kind="productive"),
                 get(s, "verifier_target_hook_fires", target="t", hook="h"))  # fmt: skip
        assert moved == (9, 7, 6)
        assert {x["hook"] for x in series(s, "verifier_target_hook_fires")} == {"h"}  # g gone
        stub.GetRunStatus(pb.GetRunStatusRequest(name="r"))
        s = scrape(port)
        verdicts = {x["verdict"]: get(s, "verifier_run_verdict", **x)
                    for x in series(s, "verifier_run_verdict") if x["run"] == "r"}  # fmt: skip
        assert sorted(verdicts.values()) == [0, 0, 0, 1], verdicts
        # the target's verdict under run r: one of the four is 1, and it is the run's (one
        # target); without a report the family was empty (the negative control above)
        mine = {x["verdict"]: get(s, "verifier_target_verdict", **x)
                for x in series(s, "verifier_target_verdict") if x["run"] == "r"}  # fmt: skip
        assert {x["target"] for x in series(s, "verifier_target_verdict")} == {"t"}
        assert mine == verdicts, (mine, verdicts)
        assert (
            get(s, "verifier_verdicts_total", verdict=max(verdicts, key=verdicts.__getitem__)) >= 1
        )
        stub.ForgetTarget(wire.forget_target_request_to_pb("t"))
        s = scrape(port)
        for name in (*TARGET_FAMILIES, "verifier_target_verdict"):
            assert series(s, name) == [], name


def test_a_flood_of_agent_ids_and_targets_makes_bounded_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents that name themselves and their targets freely (insecure mode lets any local
    agent claim any target): beyond the bound, a new target makes no series and is counted;
    the first targets' series stay and keep moving."""
    import grpc

    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb
    from servewitness.server import metrics as server_metrics
    from tests.helpers import running_verifier

    monkeypatch.setattr(server_metrics, "MAX_TARGET_SERIES", 3)
    monkeypatch.setattr(server_metrics, "HOOK_SERIES", 2)
    addr = f"unix:{tmp_path}/v.sock"
    with (
        running_verifier(addr, tmp_path / "db", metrics_listen="127.0.0.1:0") as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        port = server.metrics_http.port
        stub = agent_stub(ch)
        nonces = {}
        for i in range(12):
            agent, target = f"hostile-{i}\u2603", f"t{i}-" + "x" * 100
            nonce = stub.Hello(pb.HelloRequest(agent_id=agent, targets=[target])).nonce
            hooks = {f"h{j}": j for j in range(5)}  # 5 hook names, 2 exported
            req = _evidence_report(agent, target, 1, nonce, (4, 4), fires=hooks)
            nonces[i] = stub.Report(req).nonce
        s = scrape(port)
        stub.Report(
            _evidence_report("hostile-0\u2603", "t0-" + "x" * 100, 2, nonces[0], (8, 8), fires={})
        )
        after = scrape(port)
    for name in TARGET_FAMILIES:
        targets = {x["target"] for x in series(s, name)}
        assert targets == {f"t{i}-" + "x" * 100 for i in range(3)}, name
    assert len(series(s, "verifier_target_hook_fires")) == 3 * 2
    # each series refused is counted: 9 targets' lag, last report, processes, 2 step kinds and
    # 5 hooks; and the 3 hooks over the bound of each of the 3 targets admitted
    assert get(s, "verifier_metrics_series_refused_total", label="target") == 9 * 10 + 3 * 3
    assert get(s, "verifier_reports_total", result="accepted") == 12  # every report stored
    assert get(after, "verifier_target_steps", target="t0-" + "x" * 100, kind="total") == 8
