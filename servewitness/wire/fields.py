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
    (``MAX_INDEXED_BYTES``) its digest, ``sha256:<hex>`` of those bytes: the whole id made
    one digest. An agent before :func:`bounded_external_id` sent a long request id so (an
    ``X-Request-Id`` of 5,000 characters is accepted by vLLM: a report carrying one was
    refused by the agent's own decoder when read back from its spool, and retried forever,
    while the target went stale; and one of 2,800 bytes, within what a report may carry, was
    refused by PostgreSQL's index), so ``verifier audit request`` still looks a query up this
    way too (:func:`request_id_forms`); and an id too long even once its client part is
    bounded is sent so."""
    if not over_index(value):
        return value
    return _sha256_of(value)


def _sha256_of(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


# The OpenAI server's id prefixes (vllm/entrypoints/**/serving.py): "<prefix>-<base id>", the
# base id being the client's X-Request-Id header when it sent one. Completions add
# "-<prompt index>" for the engine.
REQUEST_ID_PREFIXES = ("chatcmpl-", "cmpl-", "generate-tokens-", "tokenize-", "embd-", "pool-")
_COMPLETION = re.compile(r"cmpl-(.+)-\d+")
_CHILD = re.compile(r"\d+_")  # an n > 1 request's child: "<index>_<external id>-<8 chars>"

MAX_CLIENT_ID_BYTES = MAX_INDEXED_BYTES - 128
"""The most UTF-8 bytes of a client's id (the client part of a request id) an agent reports
as it is; a longer one is reported as its digest (:func:`bounded_client_id`). 128 below
``MAX_INDEXED_BYTES``: room for the longest prefix (``generate-tokens-``, 16) and for what
vLLM adds after it (``-<prompt index>``, and ``-<8 chars>`` in the engine's id), so the
external and internal ids of a client's id under this bound are under the index's too."""


def split_external_id(external: str) -> tuple[str, str, str]:
    """EXTERNAL, an API server's id, as (prefix, client's id, suffix), which concatenate to
    it: ``cmpl-abc-0`` -> ``("cmpl-", "abc", "-0")``, ``chatcmpl-abc`` -> ``("chatcmpl-",
    "abc", "")``; an id with no known prefix is the client's id whole."""
    m = _COMPLETION.fullmatch(external)
    if m:
        return "cmpl-", m.group(1), external[m.end(1) :]
    for prefix in REQUEST_ID_PREFIXES:
        if external.startswith(prefix) and len(external) > len(prefix):
            return prefix, external[len(prefix) :], ""
    return "", external, ""


def client_id(external: str) -> str:
    """The client's own id inside an external id (``cmpl-abc-0`` -> ``abc``); the external
    id itself when it has no known prefix. The store keeps it beside each id row and
    indexes it; a query by a client's id looks that column up."""
    return split_external_id(external)[1]


def bounded_client_id(client: str) -> str:
    """A client's id as an agent reports it inside a request id: CLIENT, or its digest
    (``sha256:<hex>``) when it is over ``MAX_CLIENT_ID_BYTES`` UTF-8 bytes or is itself
    shaped like a digest. The second keeps the two apart: a client who sends
    ``X-Request-Id: sha256:<digest of another client's long id>`` is stored as the digest of
    that text, never as the other client's id. So a stored client id shaped like a digest
    was bounded from a longer id (or stored by an older agent), and one that is not is the
    client's id as sent."""
    if is_digest(client) or _over(client, MAX_CLIENT_ID_BYTES):
        return _sha256_of(client)
    return client


def bounded_external_id(external: str) -> str:
    """EXTERNAL as an agent reports it: its client part bounded (:func:`bounded_client_id`),
    its prefix and suffix kept (``cmpl-<3,000 chars>-0`` -> ``cmpl-sha256:<hex>-0``), so the
    stored client id (:func:`client_id` of what this gives) is ``bounded_client_id`` of the
    client's id, what a query by that id computes. When even that is over
    ``MAX_INDEXED_BYTES`` (a suffix no vLLM adds) the whole id's digest (:func:`bounded_id`):
    found then by the whole id only."""
    if _plain(external):
        return external
    prefix, client, suffix = split_external_id(external)
    return _indexable(prefix + bounded_client_id(client) + suffix, external)


def bounded_internal_id(internal: str) -> str:
    """INTERNAL, an engine's id (``[<child index>_]<external id>-<8 random chars>``), as an
    agent reports it, in the spans of the process that ran it and in the API server's id
    rows alike: the external id inside it bounded as :func:`bounded_external_id` bounds it,
    the rest kept (``cmpl-<3,000 chars>-0-ab12cd34`` -> ``cmpl-sha256:<hex>-0-ab12cd34``);
    the whole id's digest when even that is over ``MAX_INDEXED_BYTES``."""
    if _plain(internal):
        return internal
    child = _CHILD.match(internal)
    front = child.group() if child else ""
    base, dash, tail = internal[len(front) :].rpartition("-")
    if not base:  # no "-", or only a leading one: no random part to keep apart
        base, dash, tail = internal[len(front) :], "", ""
    prefix, client, suffix = split_external_id(base)
    return _indexable(front + prefix + bounded_client_id(client) + suffix + dash + tail, internal)


def request_id_forms(query: str) -> tuple[str, ...]:
    """The texts an agent may have stored for QUERY, a client's id or an API's or engine's
    request id, in order, each once: QUERY as it is (an older agent sent any id within the
    index's bound so), as a client's id, external id and internal id bounded (what an agent
    sends now), and as one whole digest (what an older agent sent for an id over the
    bound). For a query of ordinary length and shape, QUERY alone."""
    forms = (
        query,
        bounded_client_id(query),
        bounded_external_id(query),
        bounded_internal_id(query),
        bounded_id(query),
    )
    return tuple(dict.fromkeys(forms))


def client_id_forms(client: str) -> tuple[str, ...]:
    """The stored client ids that are CLIENT's, a client's own id: :func:`bounded_client_id`
    of it (what an agent stores now), and CLIENT as it is where an older agent stored it so
    (within the index's bound) and no bounded id can be it (not shaped like a digest). Never
    a digest-shaped CLIENT as it is: stored so, that is another client's long id bounded (a
    harness's id ``sha256:<hex>`` would be covered by a request whose long id hashes to it)."""
    short = bounded_client_id(client)
    if short == client or is_digest(client) or over_index(client):
        return (short,)
    return (short, client)


def _plain(value: str) -> bool:
    """Whether request id VALUE is reported as it is, read at a glance (the common case, about
    a tenth of the time of splitting it): within the client bound whole, so any client part
    is, and holding no digest, so none is shaped like one."""
    return "sha256:" not in value and not _over(value, MAX_CLIENT_ID_BYTES)


def _indexable(bounded: str, whole: str) -> str:
    return bounded if not over_index(bounded) else _sha256_of(whole)


def _over(value: str, limit: int) -> bool:
    """Whether VALUE's UTF-8 bytes are more than LIMIT."""
    if len(value) <= limit // 4:  # four bytes a character at most
        return False
    return len(value.encode("utf-8", "surrogatepass")) > limit


def over_index(value: str) -> bool:
    """Whether VALUE's UTF-8 bytes are more than a database indexes (``MAX_INDEXED_BYTES``)."""
    return _over(value, MAX_INDEXED_BYTES)


def reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")
