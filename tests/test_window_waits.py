"""Window calls that wait cannot starve the verifier: each open or seal holds a server worker
while it waits for fresh evidence, so a harness that opens many windows with long timeouts
(or opens one and goes away) must not occupy the workers the agents' reports need. At most
half the workers wait (``busy``: RESOURCE_EXHAUSTED beyond), and a call whose caller went
away stops waiting. Real verifier, real gRPC over its Unix socket."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.client.api import VerifierClient
from servewitness.server.app import ServeConfig, VerifierServer
from tests.test_faults import policy


@pytest.fixture
def addr(tmp_path: Path) -> Iterator[str]:
    # Two workers: one may wait on a window, the other serves everything else.
    a = f"unix:{tmp_path}/v.sock"
    server = VerifierServer(ServeConfig(a, tmp_path / "db.sqlite3", workers=2))
    server.start()
    try:
        with VerifierClient(a) as c:
            c.register_run("r", policy(30.0), "p.toml")  # no target reports: PENDING
        yield a
    finally:
        server.stop()


def open_window(a: str, deadline_s: float) -> grpc.StatusCode:
    """An OpenWindow asking the verifier to wait 600 s, given up by its caller after
    DEADLINE_S; the status it ended with."""
    with grpc.insecure_channel(a) as ch:
        stub = pb_grpc.VerifierServiceStub(ch)
        try:
            stub.OpenWindow(pb.OpenWindowRequest(run="r", timeout_s=600), timeout=deadline_s)
        except grpc.RpcError as e:
            return e.code()
    raise AssertionError("a window opened on a run with no evidence")


def test_waiting_window_calls_are_bounded_and_one_whose_caller_left_stops(addr: str) -> None:
    first: list[grpc.StatusCode] = []
    waiter = threading.Thread(target=lambda: first.append(open_window(addr, 4.0)))
    waiter.start()
    time.sleep(1.0)  # the first call is waiting in the verifier's only window slot
    assert open_window(addr, 3.0) == grpc.StatusCode.RESOURCE_EXHAUSTED
    with VerifierClient(addr) as c:  # the other worker still serves reads at once
        assert c.status("r").run == "r"
    waiter.join()
    assert first == [grpc.StatusCode.DEADLINE_EXCEEDED]
    # Its caller gave up, so the verifier stopped waiting for it: the slot is free again
    # (a second call waits its own deadline out instead of being refused as busy).
    time.sleep(0.5)
    assert open_window(addr, 1.5) == grpc.StatusCode.DEADLINE_EXCEEDED
