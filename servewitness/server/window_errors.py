"""A refused window call, and the gRPC status each kind of refusal is answered with."""

from __future__ import annotations

import grpc


class WindowError(Exception):
    """A refused window call: KIND is ``not_found``, ``invalid``, ``exists``, ``refused``
    (the run does not PASS), ``timeout`` (no PASS on fresh evidence in time), ``busy`` (too
    many calls waiting already) or ``cancelled`` (the caller went away while it waited)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    @property
    def code(self) -> grpc.StatusCode:
        """The gRPC status it is answered with."""
        return _CODES[self.kind]


_CODES = {
    "not_found": grpc.StatusCode.NOT_FOUND,
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "exists": grpc.StatusCode.ALREADY_EXISTS,
    "refused": grpc.StatusCode.FAILED_PRECONDITION,
    "timeout": grpc.StatusCode.FAILED_PRECONDITION,  # the message says "timed out"
    "busy": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "cancelled": grpc.StatusCode.CANCELLED,
}
