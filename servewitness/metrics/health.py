"""The gRPC health service on a port of its own (the verifier's ``--health-listen``, the
agent's ``--health``): plaintext, answering nothing but health, for probes that cannot present
a client certificate (kubelet, compose healthchecks).

OPTIONS say how the port is bound: alone (``wire.EXCLUSIVE_PORT``: a second process on it fails
to start instead of answering the probes meant for the first), or shared by the verifier's
``--processes`` (``wire.SHARED_PORT``: each answers for itself)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from servewitness.errors import ConfigError


def serve_health(
    address: str, servicer: health.HealthServicer, flag: str, options: Sequence[tuple[str, int]]
) -> tuple[grpc.Server, int]:
    """SERVICER on ADDRESS, started: the server and its port. A port it cannot have is a
    ConfigError naming FLAG."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        options=options,
    )
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    try:
        port, why = server.add_insecure_port(address), ""
    except RuntimeError as e:
        port, why = 0, f": {e}"
    if port == 0:
        raise ConfigError(f"{flag} {address}: cannot listen{why}")
    server.start()
    return server, port
