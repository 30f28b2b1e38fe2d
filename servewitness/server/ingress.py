"""The verifier's gRPC ingress: every method of ``VerifierService`` and ``AuditService``
registered with an identity (bytes) deserializer, so that a caller is authorized before its
request is parsed, and bytes that do not parse are INVALID_ARGUMENT, counted.

For each call, in this order:

1. **Authorization from metadata, before the body is read.** ``Hello`` and ``Report``: the
   agent names itself in its invocation metadata (``x-verifier-agent-id``, and one
   ``x-verifier-target`` entry per target: ``wire.agent_metadata``), each value within the
   ``id_bytes`` limit; the :class:`~servewitness.security.auth.Authorizer` checks those claims
   against the peer's certificate, token or kernel credentials. Missing metadata is
   PERMISSION_DENIED naming the header. Every other method: its role (``GATES``), which does
   not depend on the body. A caller refused here costs the verifier no parsing at all.
2. **Parsing.** Bytes that are not the method's request message are INVALID_ARGUMENT
   ("undecodable"), not the INTERNAL gRPC answers when its own deserializer raises.
3. **The body against the metadata** (``Hello``, ``Report``): the agent id must equal the
   metadata's and the targets must be among those authorized (``Report``) or the same set
   (``Hello``); else PERMISSION_DENIED: the caller was authorized for what its metadata
   claimed, and a body claiming something else is outside that authorization (in every
   mode, insecure included). This is checked on the parsed message, before the conversion
   that validates every entry (``servewitness.wire``), which is the costly part.
4. The servicer's method, unchanged (its own checks stay: defence in depth).

Why a refusal happened is noted for the metrics (``metrics.note_refusal``) where the status
code alone does not say it: "undecodable", and "too_large" (a ``wire.limits`` limit: the
``LimitError`` a servicer turned into INVALID_ARGUMENT is found on the aborting exception's
context chain).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.security.auth import READ_ROLES, Authorizer
from servewitness.server.audit_service import AUDIT_ROLES
from servewitness.server.metrics import note_refusal
from servewitness.server.service import OPERATOR, WINDOW_ROLES
from servewitness.wire import AGENT_ID_HEADER, TARGET_HEADER, metadata_value
from servewitness.wire import limits as L

AGENT = None
"""The gate of ``Hello`` and ``Report``: an agent, from its metadata."""

GATES: dict[str, dict[str, frozenset[str] | None]] = {
    "VerifierService": {
        "Hello": AGENT,
        "Report": AGENT,
        "RegisterRun": OPERATOR,
        "GetRunStatus": READ_ROLES,
        "ListRuns": READ_ROLES,
        "ListTargets": READ_ROLES,
        "ForgetTarget": OPERATOR,
        "OpenWindow": WINDOW_ROLES,
        "SealWindow": WINDOW_ROLES,
    },
    "AuditService": {
        "AuditServed": AUDIT_ROLES,
        "AuditFile": AUDIT_ROLES,
        "AuditRun": AUDIT_ROLES,
        "AuditCheckpoint": AUDIT_ROLES,
        "AuditConsistency": AUDIT_ROLES,
    },
}
"""Who may call each method, decided before its request is parsed. A method missing here is
not served (a test checks the table against the services' descriptors)."""


@dataclass(frozen=True)
class AgentClaim:
    """What an agent's metadata claims: who it is and which targets it reports for."""

    agent_id: str
    targets: frozenset[str]


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    context.abort(code, msg)
    raise AssertionError("unreachable")  # context.abort raises


def agent_claim(context: grpc.ServicerContext) -> AgentClaim:
    """The agent id and targets of the call's metadata (``wire.agent_metadata``: percent-
    encoded UTF-8), each within ``id_bytes``; missing or repeated agent ids are refused
    (PERMISSION_DENIED), values that do not decode or are over a limit are INVALID_ARGUMENT
    (the latter naming the limit, noted "too_large")."""
    ids: list[str] = []
    targets: list[str] = []
    for key, sent in context.invocation_metadata() or ():
        if key not in (AGENT_ID_HEADER, TARGET_HEADER):
            continue
        try:
            if not isinstance(sent, str):
                raise ValueError("binary")
            value = metadata_value(sent)
        except ValueError as e:  # UnicodeDecodeError included
            why = f"{key}: not percent-encoded UTF-8: {e}"
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, why)
        try:
            L.ident(value, key)
            (ids if key == AGENT_ID_HEADER else targets).append(value)
            L.at_most(L.TARGETS_PER_HELLO, len(targets), TARGET_HEADER)
        except L.LimitError as e:
            note_refusal("too_large")
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"metadata {e}")
    if len(ids) != 1 or not ids[0] or not targets or not all(targets):
        what = AGENT_ID_HEADER if len(ids) != 1 or not ids[0] else TARGET_HEADER
        _abort(
            context,
            grpc.StatusCode.PERMISSION_DENIED,
            f"missing or invalid {what} metadata: an agent names itself "
            f"({AGENT_ID_HEADER}, once) and its targets ({TARGET_HEADER}, one entry each) in "
            "its call's metadata, which the verifier authorizes before reading the report "
            "(an agent older than the verifier: upgrade it)",
        )
    return AgentClaim(ids[0], frozenset(targets))


def _body_matches(method: str, request: Any, claim: AgentClaim) -> str | None:
    """Why the parsed REQUEST of METHOD claims other than CLAIM, or None. An empty agent id
    or target claims nobody: the converter refuses it as malformed, naming the field."""
    if method == "Report":
        agent_id, targets = request.report.agent_id, frozenset((request.report.target,))
        ok = targets - {""} <= claim.targets
    else:  # Hello
        agent_id, targets = request.agent_id, frozenset(request.targets)
        ok = targets - {""} == claim.targets
    ok = ok and agent_id in ("", claim.agent_id)
    if ok:
        return None
    return (
        f"the {method.lower()} says agent {agent_id[:64]!r} for target(s) "
        f"{', '.join(sorted(t[:64] for t in targets))}, its metadata agent "
        f"{claim.agent_id!r} for {', '.join(sorted(claim.targets))}: a report is read only "
        "for what its caller was authorized as"
    )


DETAILS_BYTES = 2000
"""The most UTF-8 bytes of a refusal's text. gRPC sends it percent-encoded in a trailer (up to
three bytes each: 6,000 here) and a client drops trailers over 8 KiB at random (its soft
limit) and always over 16 KiB: a longer text (a refusal quoting a hostile value whole: 4,095
'é' are 24 kB encoded) reached the client as RESOURCE_EXHAUSTED "received metadata size
exceeds hard limit", read as "busy", or as "Stream removed", instead of the refusal."""


def bounded_details(details: str) -> str:
    """DETAILS, cut to ``DETAILS_BYTES`` of UTF-8 with the rest counted."""
    data = details.encode("utf-8", "backslashreplace")
    if len(data) <= DETAILS_BYTES:
        return details
    head = data[:DETAILS_BYTES].decode("utf-8", "ignore")  # never half a character
    return f"{head}... [{len(data) - len(head.encode())} more bytes]"


class _BoundedContext:
    """The servicer's view of its call's context: every refusal's text bounded
    (``bounded_details``), whatever value the servicer quotes in it; the rest delegated."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        self._context.abort(code, bounded_details(details))
        raise AssertionError("unreachable")  # context.abort raises

    def set_details(self, details: str) -> None:
        self._context.set_details(bounded_details(details))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def _limit_behind(exc: BaseException) -> bool:
    """Whether EXC was raised while handling a ``LimitError`` (``context.abort`` inside the
    servicer's ``except wire.WireError``), or is one."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain is short; never loop on a cycle
        if seen is None:
            return False
        if isinstance(seen, L.LimitError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _method_handler(
    service: str,
    method: str,
    servicer: Any,
    auth: Authorizer,
    around: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> grpc.RpcMethodHandler[bytes, Any]:
    desc = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    request_type = getattr(pb, desc.input_type.name)
    response_type = getattr(pb, desc.output_type.name)
    gate = GATES[service][method]
    call: Callable[[Any, grpc.ServicerContext], Any] = getattr(servicer, method)

    def behavior(data: bytes, context: grpc.ServicerContext) -> Any:
        claim = None
        if gate is None:  # AGENT
            claim = agent_claim(context)
            auth.require_agent(context, claim.agent_id, sorted(claim.targets))
        else:
            auth.require_role(context, gate)
        try:
            request = request_type.FromString(data)
        except Exception as e:  # noqa: BLE001 - whatever the parser raises on a peer's bytes
            note_refusal("undecodable")
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"undecodable request: {len(data)} bytes are not a {desc.input_type.name} "
                f"({type(e).__name__}: {e})",
            )
        if claim is not None:
            why = _body_matches(method, request, claim)
            if why is not None:
                _abort(context, grpc.StatusCode.PERMISSION_DENIED, why)
        try:
            if around is None:
                return call(request, _BoundedContext(context))  # type: ignore[arg-type]
            with around():  # authorized and parsed: only then may it hold others back
                return call(request, _BoundedContext(context))  # type: ignore[arg-type]
        except BaseException as e:
            if _limit_behind(e):
                note_refusal("too_large")
            raise

    def serialize(response: Any) -> bytes:
        if response.__class__ is bytes:  # encoded by the servicer (``GetRunStatus``)
            return response
        if not isinstance(response, response_type):
            raise TypeError(f"{method} answered a {type(response).__name__}")
        return response.SerializeToString()  # type: ignore[no-any-return]

    return grpc.unary_unary_rpc_method_handler(
        behavior,
        request_deserializer=None,  # the bytes as received: parsed after authorization
        response_serializer=serialize,
    )


def add_services(
    server: grpc.Server,
    services: dict[str, Any],
    auth: Authorizer,
    around: Mapping[str, Callable[[], contextlib.AbstractContextManager[None]]] | None = None,
) -> None:
    """Serve SERVICES (a service name of ``GATES``: its servicer) on SERVER through the
    ingress, in place of the generated ``add_*Servicer_to_server``. AROUND: for a method
    name, what its servicer runs inside once its caller was authorized and its request parsed
    (``admission.ReadsFirst.reading`` for the status reads: a caller refused holds nobody)."""
    around = around or {}
    for service, servicer in services.items():
        handlers = {
            m: _method_handler(service, m, servicer, auth, around.get(m))
            for m in pb.DESCRIPTOR.services_by_name[service].methods_by_name
        }
        full = pb.DESCRIPTOR.services_by_name[service].full_name
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(full, handlers),))
