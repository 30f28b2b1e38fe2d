"""gRPC server reflection (``grpc.reflection.v1alpha.ServerReflection``) for ``verifier serve``:
grpcurl, Postman and ``grpc_cli`` list the services and read their methods and messages from
the verifier itself, without the .proto files.

On by default (``--no-reflection`` is not offered: it says only what ``proto/`` publishes),
behind the same authorization as a status read: with TLS, a caller needs the operator,
harness or auditor role (a client certificate or a bearer token; an agent's identity is not
enough); in insecure mode it is as open as reads are. The check is made before the first
request of the stream is read. Reflection streams run on threads of their own
(``WORKERS``), so held-open streams never take the threads of the other calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as rpb

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.security.auth import READ_ROLES, Authorizer

WORKERS = 2  # reflection streams served at once; more wait for one of these threads
SERVICES = (
    pb.DESCRIPTOR.services_by_name["VerifierService"].full_name,
    pb.DESCRIPTOR.services_by_name["AuditService"].full_name,
    health.SERVICE_NAME,
    reflection.SERVICE_NAME,
)


def add_reflection(server: grpc.Server, auth: Authorizer) -> futures.ThreadPoolExecutor:
    """Serve reflection of SERVICES on SERVER, authorized by AUTH as reads are; the threads
    it runs on (the caller shuts them down after the server stopped)."""
    servicer = reflection.ReflectionServicer(SERVICES)
    pool = futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="reflection")

    def info(
        requests: Iterator[rpb.ServerReflectionRequest], context: grpc.ServicerContext
    ) -> Iterable[rpb.ServerReflectionResponse]:
        auth.require_role(context, READ_ROLES)  # aborts before a request is read
        answers: Iterable[rpb.ServerReflectionResponse] = servicer.ServerReflectionInfo(
            requests, context
        )
        return answers

    info.experimental_thread_pool = pool  # type: ignore[attr-defined]
    handler: grpc.RpcMethodHandler[Any, Any] = grpc.stream_stream_rpc_method_handler(
        info,
        request_deserializer=rpb.ServerReflectionRequest.FromString,
        response_serializer=rpb.ServerReflectionResponse.SerializeToString,
    )
    generic = grpc.method_handlers_generic_handler(
        reflection.SERVICE_NAME, {"ServerReflectionInfo": handler}
    )
    server.add_generic_rpc_handlers((generic,))
    return pool
