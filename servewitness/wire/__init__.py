"""The only package that maps domain types to and from ``servewitness.api.v1`` messages (and
their JSON forms). Generated protobuf stays here and in the gRPC edges that call it.

``*_to_pb`` builds a message from a domain value; ``*_from_pb`` turns a received message back
into one and raises :class:`WireError` (a usage error, exit code 2) naming the offending field
when the message cannot describe a valid value: a required field left empty, a negative count,
a malformed hash, an unspecified or unknown enum value. Proto3 cannot tell "absent" from
"zero" for plain scalars, so every domain ``None`` travels as an ``optional`` field and the one
``None``-versus-empty tuple (``ProcessReport.files``) as ``files_included``. Semantic checks (is
the nonce current, does the digest match the files) belong to the server, not here.

By message family:

- :mod:`~servewitness.wire.fields`: the field checks, :class:`WireError`, the message size limit
- :mod:`~servewitness.wire.process`: ``ProcessReport`` and its parts
- :mod:`~servewitness.wire.process_fast`: a common process converted without field paths (the
  checked path's answers, or None to take it)
- :mod:`~servewitness.wire.files`: what the agent judged of a process's files (manifest entries
  with their identity, native mappings, disagreements, provenance, drift)
- :mod:`~servewitness.wire.reports`: ``TargetReport`` (processes, containers, request bindings)
  and the bytes a store or spool keeps
- :mod:`~servewitness.wire.verdicts`: findings, hook counts, target and run verdicts
- :mod:`~servewitness.wire.runs`: the RPC envelopes (Hello, Report, RegisterRun, GetRunStatus,
  ListRuns) the servicer, the agent and the client use
- :mod:`~servewitness.wire.windows`: OpenWindow and SealWindow
- :mod:`~servewitness.wire.jsonform`: the one JSON form of a verdict and of a process report

Callers import from here (``from servewitness import wire``); the names below are the public
surface.
"""

from servewitness.wire.fields import (
    EXCLUSIVE_PORT,
    GRPC_OPTIONS,
    MAX_MESSAGE_BYTES,
    SHARED_PORT,
    WireError,
)
from servewitness.wire.jsonform import (
    process_from_json,
    process_to_json,
    run_verdict_from_json,
    run_verdict_to_json,
)
from servewitness.wire.reports import (
    report_from_bytes,
    report_from_pb,
    report_to_bytes,
    report_to_pb,
    stored_bytes,
)
from servewitness.wire.runs import (
    AGENT_ID_HEADER,
    TARGET_HEADER,
    AgentHello,
    HelloReply,
    RegisteredRun,
    ReportAck,
    RunRegistration,
    RunSummary,
    agent_metadata,
    get_run_status_request_from_pb,
    get_run_status_request_to_pb,
    get_run_status_response_from_pb,
    get_run_status_response_to_pb,
    hello_request_from_pb,
    hello_request_to_pb,
    hello_response_from_pb,
    hello_response_to_pb,
    list_runs_response_from_pb,
    list_runs_response_to_pb,
    metadata_value,
    register_run_request_from_pb,
    register_run_request_to_pb,
    register_run_response_from_pb,
    register_run_response_to_pb,
    report_request_from_pb,
    report_request_to_pb,
    report_response_from_pb,
    report_response_to_pb,
)
from servewitness.wire.targets import (
    TargetStatus,
    forget_target_request_from_pb,
    forget_target_request_to_pb,
    forget_target_response_from_pb,
    forget_target_response_to_pb,
    list_targets_response_from_pb,
    list_targets_response_to_pb,
)
from servewitness.wire.verdicts import (
    finding_from_pb,
    finding_to_pb,
    run_status_bytes,
    run_verdict_from_pb,
    run_verdict_to_pb,
    severity_from_pb,
    severity_to_pb,
    target_verdict_from_pb,
    target_verdict_to_pb,
    verdict_from_pb,
    verdict_to_pb,
)
from servewitness.wire.windows import (
    OpenedWindow,
    SealedWindow,
    WindowOpening,
    WindowSealing,
    open_window_request_from_pb,
    open_window_request_to_pb,
    open_window_response_from_pb,
    open_window_response_to_pb,
    request_ids,
    seal_window_request_from_pb,
    seal_window_request_to_pb,
    seal_window_response_from_pb,
    seal_window_response_to_pb,
)

__all__ = [
    "AGENT_ID_HEADER",
    "EXCLUSIVE_PORT",
    "GRPC_OPTIONS",
    "MAX_MESSAGE_BYTES",
    "SHARED_PORT",
    "TARGET_HEADER",
    "AgentHello",
    "HelloReply",
    "OpenedWindow",
    "RegisteredRun",
    "ReportAck",
    "RunRegistration",
    "RunSummary",
    "SealedWindow",
    "TargetStatus",
    "WindowOpening",
    "WindowSealing",
    "WireError",
    "agent_metadata",
    "finding_from_pb",
    "finding_to_pb",
    "forget_target_request_from_pb",
    "forget_target_request_to_pb",
    "forget_target_response_from_pb",
    "forget_target_response_to_pb",
    "get_run_status_request_from_pb",
    "get_run_status_request_to_pb",
    "get_run_status_response_from_pb",
    "get_run_status_response_to_pb",
    "hello_request_from_pb",
    "hello_request_to_pb",
    "hello_response_from_pb",
    "hello_response_to_pb",
    "list_runs_response_from_pb",
    "list_runs_response_to_pb",
    "list_targets_response_from_pb",
    "list_targets_response_to_pb",
    "metadata_value",
    "open_window_request_from_pb",
    "open_window_request_to_pb",
    "open_window_response_from_pb",
    "open_window_response_to_pb",
    "process_from_json",
    "process_to_json",
    "register_run_request_from_pb",
    "register_run_request_to_pb",
    "register_run_response_from_pb",
    "register_run_response_to_pb",
    "report_from_bytes",
    "report_from_pb",
    "report_request_from_pb",
    "report_request_to_pb",
    "report_response_from_pb",
    "report_response_to_pb",
    "report_to_bytes",
    "report_to_pb",
    "request_ids",
    "run_status_bytes",
    "run_verdict_from_json",
    "run_verdict_from_pb",
    "run_verdict_to_json",
    "run_verdict_to_pb",
    "seal_window_request_from_pb",
    "seal_window_request_to_pb",
    "seal_window_response_from_pb",
    "seal_window_response_to_pb",
    "severity_from_pb",
    "severity_to_pb",
    "stored_bytes",
    "target_verdict_from_pb",
    "target_verdict_to_pb",
    "verdict_from_pb",
    "verdict_to_pb",
]
