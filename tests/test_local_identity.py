"""Local identity that means something (issue 19 item 2): on the verifier's Unix socket the
kernel names the peer (SO_PEERCRED through the relay, security/peercred.py) and only listed
uids report, for their targets; plaintext TCP, loopback included, is never authenticated; an
identity cannot be forged by going around the relay or by saying one in metadata; hostile
clients of the relay do not hang the verifier.

Reports come from real child processes over real gRPC. A child "as nobody" imports what it
needs as root and then drops to uid 65534 before it connects (the interpreter lives under
/root here, which nobody may read, so it cannot be exec'd as nobody); the kernel records the
uid at connect(), which is what the relay reads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from servewitness.client.api import VerifierClient
from servewitness.model import RunVerdict
from servewitness.security.peercred import LocalAgent
from servewitness.server.app import ServeConfig, VerifierServer
from tests.helpers import PRISTINE_VLLM_CPU, REPO, verifier_cli
from tests.test_policy_engine import CPU

NOBODY = 65534
# strong (no unsafe key): the live CPU runner, pristine vLLM; the child reports a healthy
# worker (tests/test_policy_engine.py's)
POLICY = (
    'version = 1\n[evidence]\nrequire_probe = ["worker"]\n'
    f'[runner]\nexpect_class = "{CPU}"\n' + PRISTINE_VLLM_CPU
)
UNSAFE = POLICY.replace("[evidence]\n", "[evidence]\nunsafe_allow_unauthenticated = true\n")

# The child: connect to ARGV[1] as uid ARGV[2], Hello and Report as agent-1 for target
# ARGV[3], print what happened as JSON. METADATA (ARGV[4], JSON) is sent with each call.
CHILD = """
import json, os, sys
import grpc
from tests.test_policy_engine import worker
from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.model import TargetReport
import time
addr, uid, target, md = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
if uid != os.getuid():
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
proc = worker()
with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
    stub = pb_grpc.VerifierServiceStub(ch)
    try:
        md = list(md.items()) + list(wire.agent_metadata("agent-1", [target]))
        n = stub.Hello(pb.HelloRequest(agent_id="agent-1", targets=[target]),
                       metadata=md, timeout=10).nonce
        seq = int(time.time() * 1000)
        rep = TargetReport("agent-1", target, seq, n, time.time(), (proc,))
        stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)), metadata=md, timeout=10)
        print(json.dumps({"ok": True}))
    except grpc.RpcError as e:
        print(json.dumps({"ok": False, "code": e.code().name, "details": e.details()}))
"""


def as_uid(
    addr: str,
    uid: int,
    target: str = "t",
    metadata: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, addr, str(uid), target, json.dumps(metadata or {})],
        check=False, capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


@contextmanager
def served(listen: str | None = None, **kw: object) -> Iterator[tuple[VerifierServer, str]]:
    """A real verifier on a Unix socket that uid nobody may connect to (LISTEN: elsewhere)."""
    d = Path(tempfile.mkdtemp(prefix="vid-"))
    d.chmod(0o711)
    addr = listen or f"unix:{d}/v.sock"
    server = VerifierServer(ServeConfig(addr, d / "db.sqlite3", report_interval_s=0.2, **kw))  # type: ignore[arg-type]
    server.start()
    if addr.startswith("unix:"):
        (d / "v.sock").chmod(0o666)  # who may connect is the file's mode; who reports, ours
    try:
        yield server, addr
    finally:
        server.stop()


def verdict(addr: str, policy: str = POLICY) -> RunVerdict:
    with VerifierClient(addr) as c:
        c.register_run("r", policy, "test")
        return c.status("r")


def ids(v: RunVerdict) -> list[str]:
    return [f.id for t in v.targets for f in t.findings] + [f.id for f in v.findings]


def test_a_listed_uid_on_the_unix_socket_is_authenticated_and_passes() -> None:
    with served(local_agents=(LocalAgent(0, frozenset({"t"})),)) as (_, addr):
        assert as_uid(addr, 0) == {"ok": True}
        v = verdict(addr)
    assert v.verdict.value == "PASS", ids(v)
    assert "evidence.unauthenticated" not in ids(v)
    auth = [f for t in v.targets for f in t.findings if f.id == "evidence.authenticated"]
    assert auth and auth[0].context["authenticated_as"].startswith("unix:uid=0,pid="), auth


def test_an_unlisted_uid_is_refused_and_root_is_not_trusted_unless_listed() -> None:
    with served(local_agents=(LocalAgent(0),)) as (_, addr):
        got = as_uid(addr, NOBODY)
        assert got["ok"] is False and got["code"] == "PERMISSION_DENIED", got
        assert "uid 65534 is not a local agent" in str(got["details"]), got
        assert verdict(addr).verdict.value == "PENDING"  # nothing stored from it
    # Root is not trusted by being root: list only nobody, and root is refused.
    with served(local_agents=(LocalAgent(NOBODY),)) as (_, addr):
        got = as_uid(addr, 0)
        assert got["ok"] is False and "uid 0 is not a local agent" in str(got["details"]), got
        assert as_uid(addr, NOBODY) == {"ok": True}  # negative control: the listed uid reports
        v = verdict(addr)
    assert v.verdict.value == "PASS", ids(v)


def test_a_listed_uid_reports_only_for_its_targets() -> None:
    with served(local_agents=(LocalAgent(0, frozenset({"a"})),)) as (_, addr):
        got = as_uid(addr, 0, target="t")
        assert got["ok"] is False and "may not report for target(s) t" in str(got["details"])
        assert as_uid(addr, 0, target="a") == {"ok": True}


def test_plaintext_tcp_on_loopback_is_never_authenticated() -> None:
    with served(listen="127.0.0.1:0") as (server, _):
        addr = f"127.0.0.1:{server.port}"
        assert as_uid(addr, 0) == {"ok": True}  # accepted: it is nobody's evidence
        v = verdict(addr)
        assert v.verdict.value == "PENDING" and "evidence.unauthenticated" in ids(v), ids(v)
        assert "policy.unsafe" not in ids(v)  # negative control: a safe policy names nothing
        # The policy may say it accepts that, out loud: the verdict names the flag.
        with VerifierClient(addr) as c:
            c.register_run("u", UNSAFE, "test")
            u = c.status("u")
        out = verifier_cli("status", "u", "--verifier", addr)
        js = verifier_cli("status", "u", "--json", "--verifier", addr)
        listed = verifier_cli("run", "list", "--verifier", addr).stdout.splitlines()
    (line_u,) = [x for x in listed if x.startswith("u ")]
    (line_r,) = [x for x in listed if x.startswith("r ")]
    assert "UNSAFE: evidence.unsafe_allow_unauthenticated" in line_u, listed
    assert "UNSAFE" not in line_r, listed
    assert u.verdict.value == "PASS", ids(u)
    unsafe = [f for f in u.findings if f.id == "policy.unsafe"]
    assert len(unsafe) == 1 and unsafe[0].severity.value == "warning", unsafe
    assert "passed only because evidence.unsafe_allow_unauthenticated = true" in unsafe[0].message
    assert unsafe[0].context["without_flag"] == "PENDING"
    first = out.stdout.splitlines()[0]
    assert "PASS" in first and "UNSAFE: evidence.unsafe_allow_unauthenticated" in first, out.stdout
    assert "passed only because evidence.unsafe_allow_unauthenticated" in js.stdout, js.stdout


def test_an_unsafe_flag_that_did_not_decide_the_verdict_is_still_named() -> None:
    with served(local_agents=(LocalAgent(0),)) as (_, addr):
        assert as_uid(addr, 0) == {"ok": True}  # authenticated: the flag changes nothing
        v = verdict(addr, UNSAFE)
    assert v.verdict.value == "PASS", ids(v)
    unsafe = [f for f in v.findings if f.id == "policy.unsafe"]
    assert len(unsafe) == 1 and "does not depend on it" in unsafe[0].message, unsafe


def test_going_around_the_relay_or_claiming_an_identity_in_metadata_is_nobody() -> None:
    with served(local_agents=(LocalAgent(0),)) as (server, addr):
        private = f"127.0.0.1:{server.port}"  # where gRPC listens behind the relay
        got = as_uid(private, 0)  # root, the listed uid, but not through the socket
        assert got["ok"] is False and got["code"] == "PERMISSION_DENIED", got
        assert "no identity" in str(got["details"]), got
        v = verdict(addr)
        assert v.verdict.value == "PENDING" and not v.targets, ids(v)  # nothing stored
        # Variation: an unlisted uid on the socket that says it is someone in metadata.
        md = {"x-peer-uid": "0", "authorization": "Bearer root", "x-forwarded-for": "unix:uid=0"}
        got = as_uid(addr, NOBODY, metadata=md)
        assert got["ok"] is False and "uid 65534 is not a local agent" in str(got["details"])
        # Negative control: the same listed uid through the socket is authenticated.
        assert as_uid(addr, 0) == {"ok": True}
        with VerifierClient(addr) as c:
            assert c.status("r").verdict.value == "PASS"


CONTAINER = "ab" * 32


def fake_cgroup(pid: int) -> str | None:
    """The container of PID as /proc/PID/cgroup would name it (this machine runs no container
    runtime): CONTAINER for a child started with IN_CONTAINER=1 in its environment."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return CONTAINER if b"IN_CONTAINER=1" in environ else None


def test_a_local_agent_bound_to_a_container_reports_only_from_it() -> None:
    bound = LocalAgent(0, frozenset({"t"}), CONTAINER[:12])
    with served(local_agents=(bound,), container_of=fake_cgroup) as (_, addr):
        got = as_uid(addr, 0)  # root, but on the host, not in the container
        assert got["ok"] is False and "it runs in no container" in str(got["details"]), got
        assert as_uid(addr, 0, env={"IN_CONTAINER": "1"}) == {"ok": True}
        v = verdict(addr)
    assert v.verdict.value == "PASS", ids(v)
    (who,) = [f.context for t in v.targets for f in t.findings if f.id == "evidence.authenticated"]
    assert str(who["authenticated_as"]).endswith(f",container={CONTAINER[:12]}"), who


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the other end hangs up within SECONDS (whatever it says first)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            if s.recv(4096) == b"":
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False


def test_hostile_relay_clients_do_not_hang_the_verifier() -> None:
    with served(relay_max_connections=24, relay_first_byte_s=1.0) as (server, addr):
        path = addr[len("unix:") :]
        silent = []
        for _ in range(16):  # connect and say nothing
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            silent.append(s)
        garbage = socket.socket(socket.AF_UNIX)
        garbage.connect(path)
        garbage.sendall(os.urandom(4096))
        t0 = time.monotonic()
        with VerifierClient(addr, timeout_s=5) as c:  # still served meanwhile
            assert c.list_runs() == ()
        assert time.monotonic() - t0 < 5
        assert _closed_within(garbage, 5)  # gRPC hangs up on garbage; the relay follows
        more = []
        for _ in range(24):  # past the limit: closed at accept
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            more.append(s)
        time.sleep(0.5)
        assert server.relay is not None and server.relay.refused > 0
        assert all(_closed_within(s, 5) for s in silent)  # the first-byte limit closed them
        for s in more:
            s.close()
        time.sleep(0.5)
        with VerifierClient(addr, timeout_s=5) as c:  # and it serves again
            assert c.list_runs() == ()
        held = socket.socket(socket.AF_UNIX)
        held.connect(path)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10  # stop() with a connection held open does not hang
    assert _closed_within(held, 5)
    for s in [*silent, garbage, held]:
        s.close()


@pytest.mark.parametrize("value", ["x", "1:", "-1", "0@abc:t", "0@zzzzzzzzzzzz"])
def test_bad_local_agent_flags_are_usage_errors(value: str) -> None:
    out = verifier_cli("serve", "--listen", "unix:/nonexistent/v.sock", "--local-agent", value)
    assert out.returncode == 2 and "--local-agent" in out.stderr, out.stderr


def test_one_peer_holding_connections_leaves_a_quarter_for_everyone_else() -> None:
    """Found by an attacker helper: one process holding 64 idle connections locked every
    other client out of the Unix socket (`status`, `wait` exit 4). One peer (a uid in a
    container) may hold three quarters of the relay's connections; a client of another uid
    is still served, and the peer's next connection is closed at accept."""
    with served(relay_max_connections=8, relay_first_byte_s=30.0) as (server, addr):
        path = addr[len("unix:") :]
        assert server.relay is not None and server.relay.max_per_peer == 6
        held = []
        for _ in range(8):  # this test's uid (root) asks for all of them
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            held.append(s)
        time.sleep(0.5)
        assert server.relay.refused == 2
        assert sum(_closed_within(s, 0.2) for s in held) == 2  # the two over its share
        got = as_uid(addr, NOBODY)  # another uid: reaches the verifier (and is refused there)
        assert got["code"] == "PERMISSION_DENIED", got
        assert "uid 65534 is not a local agent" in str(got["details"]), got
        for s in held:
            s.close()
