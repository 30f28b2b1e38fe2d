"""Field checks shared by every converter, the one error they raise, and the wire's limits.

Each check takes the value and AT, the field's path in the message (``report.processes[0]
.key.pid``), and raises :class:`WireError` (a usage error, exit code 2) naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import NoReturn

from servewitness.errors import UsageError

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The gRPC message size limit of the server and every client, both directions (a worker's
full manifest, tens of thousands of files, is a few MiB)."""

MAX_METADATA_BYTES = 32 * 1024
"""The metadata (headers, trailers) the server and every client accept: an agent's
``x-verifier-*`` headers (``targets_per_hello`` names of ``id_bytes``, percent-encoded) and a
refusal's text (``server.ingress.DETAILS_BYTES``) fit under it. gRPC's defaults (8 KiB, above
which it drops metadata at random, and 16 KiB) refused a Hello naming 48 long targets."""

GRPC_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
)
"""Channel and server options that apply :data:`MAX_MESSAGE_BYTES` and
:data:`MAX_METADATA_BYTES`."""

EXCLUSIVE_PORT: tuple[tuple[str, int], ...] = (("grpc.so_reuseport", 0),)
"""Server option: the port is this server's alone. gRPC sets ``SO_REUSEPORT`` by default, so a
second process of the same user binding the same port succeeded silently and the kernel split
new connections between the two: a second ``verifier serve`` (another database, an old build)
took half of the agents' reports, and a second agent's health port answered the probes meant
for the first. Without it on the first socket, every later bind of the port fails."""

SHARED_PORT: tuple[tuple[str, int], ...] = (("grpc.so_reuseport", 1),)
"""Server option of ``verifier serve --processes``: its processes bind one port together."""

MAX_UNIX_TIME = 253_402_300_799
"""9999-12-31T23:59:59Z, the ``unix_time`` limit (``limits.py``): the last second every date
library can print (Python's datetime stops at year 9999)."""

MAX_TEXT = 4096  # any one name, label or reason
# The most UTF-8 bytes of a text a verifier's database indexes (a request id, a file path):
# PostgreSQL's b-tree refuses an index row over 2,704 bytes, whatever the text's limit.
MAX_INDEXED_BYTES = 2048
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # servewitness.model.manifest_digest


class WireError(UsageError):
    """A received message that does not describe a valid domain value."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid {field}: {reason}")
        self.field = field  # path of the offending field, e.g. "report.processes[0].key.pid"
        self.reason = reason


@dataclass(frozen=True)
class Limit:
    name: str
    value: int
    bounds: str
    why: str


class LimitError(WireError):
    """A received value over one of the limits (``limits.LIMITS``)."""

    def __init__(self, at: str, limit: Limit, got: float) -> None:
        shown = str(got) if isinstance(got, int) else f"{got:.6g}"
        super().__init__(at, f"{shown} > limit {limit.name} ({limit.value})")
        self.limit = limit
        self.got = got


UNIX_TIME = Limit(
    "unix_time",
    MAX_UNIX_TIME,
    "every time in seconds since the epoch (sent, collected, start, request times)",
    "9999-12-31T23:59:59Z: every stored time can be printed as a date",
)
"""The ``unix_time`` limit (the table is ``limits.py``; it is here, beside ``finite_time``,
which checks it)."""


_ENFORCED: ContextVar[bool] = ContextVar("verifier_wire_limits_enforced", default=True)


@contextlib.contextmanager
def relaxed() -> Iterator[None]:
    """Read without the limits: bytes this verifier (or an older one, with other limits) stored
    and ledgered are read back whatever they hold, so that a database stays auditable after a
    limit is lowered. The limits are for what arrives on the wire."""
    token = _ENFORCED.set(False)
    try:
        yield
    finally:
        _ENFORCED.reset(token)


def enforced() -> bool:
    return _ENFORCED.get()


def fail(at: str, reason: str) -> NoReturn:
    raise WireError(at, reason)


def required(value: str, at: str) -> str:
    if not value:
        fail(at, "required, but empty")
    return value


def count(value: int, at: str, minimum: int = 0) -> int:
    if value < minimum:
        fail(at, f"must be >= {minimum}, got {value}")
    return value


def finite_time(value: float, at: str) -> float:
    """VALUE, a finite time >= 0; -0.0 (>= 0 to every comparison) is given as 0.0, the value
    a database's column of floats would give back."""
    if not math.isfinite(value) or value < 0:
        fail(at, f"must be a finite time >= 0, got {value}")
    if value > MAX_UNIX_TIME and enforced():
        raise LimitError(at, UNIX_TIME, value)
    return value + 0.0


def ratio(value: float, at: str) -> float:
    if not math.isfinite(value) or value < 0:
        fail(at, f"must be a finite number >= 0, got {value}")
    return value


def sha256_hex(value: str, at: str) -> str:
    if not _SHA256_HEX.fullmatch(value):
        fail(at, f"not a lowercase hex sha256: {value!r}")
    return value


def is_sha256_hex(value: str) -> bool:
    """Whether :func:`sha256_hex` accepts VALUE (fast paths: no field path built)."""
    return _SHA256_HEX.fullmatch(value) is not None


def is_digest(value: str) -> bool:
    """Whether :func:`digest` accepts VALUE (fast paths: no field path built)."""
    return _DIGEST.fullmatch(value) is not None


def digest(value: str, at: str) -> str:
    if not _DIGEST.fullmatch(value):
        fail(at, f"not a manifest digest 'sha256:<hex>': {value!r}")
    return value


def texts(values: Iterable[str], at: str) -> tuple[str, ...]:
    return tuple(required(v, f"{at}[{i}]") for i, v in enumerate(values))


def text(value: str, at: str) -> str:
    if len(value) > MAX_TEXT:
        fail(at, f"longer than {MAX_TEXT} characters")
    return value


def bounded_id(value: str) -> str:
    """VALUE, or when its UTF-8 bytes are more than a verifier's database indexes
    (``MAX_INDEXED_BYTES``) its digest, ``sha256:<hex>`` of those bytes. Request ids come from
    whoever sends vLLM a request (an ``X-Request-Id`` of 5,000 characters is accepted there):
    a report carrying one was refused by the agent's own decoder when read back from its
    spool, and retried forever, while the target went stale; and one of 2,800 bytes, within
    what a report may carry, was refused by PostgreSQL's index (UNAVAILABLE, retried for
    ever). ``verifier audit request`` looks a query up as it is and as this makes it, so the
    full external or internal id still finds the request."""
    if not over_index(value):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def over_index(value: str) -> bool:
    """Whether VALUE's UTF-8 bytes are more than a database indexes (``MAX_INDEXED_BYTES``)."""
    if len(value) <= MAX_INDEXED_BYTES // 4:  # four bytes a character at most
        return False
    return len(value.encode("utf-8", "surrogatepass")) > MAX_INDEXED_BYTES


def reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")
