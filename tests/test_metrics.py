"""Prometheus metrics and structured logs of `verifier serve` and `verifier agent`
(docs/operations.md): the registry's text format, and a real verifier with a real agent,
both scraped over HTTP while reports flow, while the verifier is away, and in their logs."""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import agent_stub, not_vllm_policy
from tests.test_gate_e2e import Daemon
from verifier.errors import ConfigError
from verifier.metrics.http import MetricsServer, parse_listen
from verifier.metrics.registry import CONTENT_TYPE, Registry
from verifier.testing.vllm_server import free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse(text: str) -> Samples:
    """The text exposition format, strictly: every sample belongs to a declared family."""
    families: dict[str, str] = {}
    out: Samples = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            families[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, line
        name, labels, value = m.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in families or families.get(family) == "histogram", line
        pairs = LABEL.findall(labels or "")
        assert ",".join(f'{k}="{v}"' for k, v in pairs) == (labels or ""), line
        unescaped = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                     for k, v in pairs}  # fmt: skip
        out[(name, frozenset(unescaped.items()))] = float(value)
    return out


def get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), math.nan)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"] == CONTENT_TYPE
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


# The registry ---------------------------------------------------------------------------------


def test_the_text_format_of_each_kind() -> None:
    r = Registry()
    c = r.counter("x_events_total", 'events "seen"\\', ["kind"])
    c.zero(kind="never")
    c.inc(kind='a"b\\c\nd')
    c.inc(2, kind='a"b\\c\nd')
    g = r.gauge("x_size_bytes", "size")
    g.set(-1.5)
    h = r.histogram("x_duration_seconds", "time", ["m"])
    for v in (0.0005, 0.02, 100.0):
        h.observe(v, m="Report")
    text = r.render()
    assert '# HELP x_events_total events "seen"\\\\\n# TYPE x_events_total counter\n' in text
    assert 'x_events_total{kind="a\\"b\\\\c\\nd"} 3.0\n' in text
    s = parse(text)
    assert get(s, "x_events_total", kind="never") == 0.0
    assert get(s, "x_events_total", kind='a"b\\c\nd') == 3.0
    assert get(s, "x_size_bytes") == -1.5
    assert get(s, "x_duration_seconds_bucket", m="Report", le="0.001") == 1
    assert get(s, "x_duration_seconds_bucket", m="Report", le="0.025") == 2
    assert get(s, "x_duration_seconds_bucket", m="Report", le="10.0") == 2
    assert get(s, "x_duration_seconds_bucket", m="Report", le="+Inf") == 3
    assert get(s, "x_duration_seconds_count", m="Report") == 3
    assert get(s, "x_duration_seconds_sum", m="Report") == pytest.approx(100.0205)
    assert get(s, "verifier_build_info", version=__import__("verifier").__version__) == 1
    with pytest.raises(ValueError, match="only goes up"):
        c.inc(-1, kind="never")
    with pytest.raises(ValueError, match="labels"):
        c.inc(kind="a", extra="b")


def test_a_value_read_at_scrape_time_that_fails_leaves_the_rest() -> None:
    r = Registry()
    g = r.gauge("x_entries", "entries")

    def broken() -> list[tuple[tuple[str, ...], float]]:
        raise OSError("database gone")

    g.set_function(broken)
    r.counter("x_ok_total", "ok").inc()
    s = parse(r.render())
    assert get(s, "x_ok_total") == 1.0 and ("x_entries", frozenset()) not in s


def test_listen_addresses() -> None:
    assert parse_listen("9100") == ("127.0.0.1", 9100)
    assert parse_listen(":9100") == ("127.0.0.1", 9100)
    assert parse_listen("0.0.0.0:9100") == ("0.0.0.0", 9100)  # noqa: S104
    assert parse_listen("[::1]:9100") == ("::1", 9100)
    for bad in ("host", "host:port", "1:99999"):
        with pytest.raises(ConfigError, match="--metrics-listen"):
            parse_listen(bad)


def test_the_endpoint_serves_metrics_and_nothing_else() -> None:
    r = Registry()
    r.counter("x_total", "x").inc()
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


def _silent(port: int, n: int) -> list[socket.socket]:
    """N clients that connect and never send a request."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def test_silent_scrapers_cost_bounded_threads_and_never_starve_a_real_scrape() -> None:
    """A hundred connections that say nothing: never more than MAX_CONNECTIONS threads serve
    them (the rest are closed at once), every silent client is dropped (closed at once, or after
    the idle timeout: its read sees EOF), and a real scrape is answered afterwards."""
    r = Registry()
    r.counter("x_total", "x").inc()
    server = MetricsServer("127.0.0.1:0", r, idle_s=1.0, max_connections=4).start()
    before = threading.active_count()
    socks = _silent(server.port, 100)
    try:
        most = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            most = max(most, threading.active_count() - before)
            time.sleep(0.01)
        assert most <= 4
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
        until("a verdict of run r", lambda: sum(
            get(scrape(vport), "verifier_run_verdict", run="r", verdict=x)
            for x in ("PASS", "FAIL", "PENDING", "STALE")) == 1, logs)  # fmt: skip

        def agent_caught_up() -> bool:
            a = scrape(aport)
            return (
                get(a, "verifier_agent_reports_acknowledged_total") >= 3
                and get(a, "verifier_agent_spool_reports") == 0
            )

        until("agent acknowledged, spool empty", agent_caught_up, logs)
        a = scrape(aport)
        assert get(a, "verifier_agent_spool_bytes") == 0
        assert get(a, "verifier_agent_collects_total") >= 3
        assert get(a, "verifier_agent_collect_duration_seconds_count") >= 3
        assert get(a, "verifier_agent_reports_sent_total") >= 3
        assert get(a, "verifier_agent_last_report_timestamp_seconds") > time.time() - 60
        assert total(a, "verifier_agent_verifier_errors_total") == 0
        assert get(a, "verifier_agent_reports_refused_total", reason="malformed") == 0
        assert get(a, "verifier_agent_spool_dropped_total") == 0
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

    r = Registry()
    taken = MetricsServer("127.0.0.1:0", r).start()
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

    from tests.test_verifier_grpc import SHA, hello, process, report
    from verifier import wire
    from verifier.model import FileEntry
    from verifier.server.app import ServeConfig, VerifierServer

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
        s = parse(server.service.metrics.registry.render())
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
