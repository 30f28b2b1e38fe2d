"""A minimal Docker Engine API client over the daemon's unix socket (stdlib only).

The agent needs two answers from the daemon: is it there, and what does it say about the
container a serving process runs in (which image, by id and registry digest; which pid; which
labels). That is two GET requests, not a reason for a dependency.

The daemon is not trusted to be well-behaved: a socket at the expected path may belong to
anything. So every answer is bounded (:data:`MAX_BODY` bytes, ``timeout_s`` per socket
operation and about that again for the whole body) and every field is type-checked before use:
a wrong answer is :class:`DockerResponseError` (a ``ValueError``), never a ``KeyError`` or an
out-of-memory agent.

Paths carry no API version prefix: the daemon then answers in its own current version. The
fields read here (``Id``, ``Name``, ``Image``, ``Config.Image``, ``Config.Labels``, ``State``,
``RestartCount``, ``RepoDigests``) are the same in every API version since 1.24, while a pinned
``/v1.41/`` would be refused by daemons whose minimum version has moved past it (Engine 29
requires 1.44).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from dataclasses import dataclass
from typing import Final, TypeVar
from urllib.parse import quote

DEFAULT_SOCKET: Final = "/var/run/docker.sock"
MAX_BODY: Final = 4 * 1024 * 1024  # inspect output is a few KiB; anything near this is hostile
_CHUNK: Final = 64 * 1024
_IMAGE_CACHE_MAX: Final = 256
_MESSAGE_MAX: Final = 300
_T = TypeVar("_T", str, int)
_FULL_ID = re.compile(r"[0-9a-f]{64}")
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
# What `docker` accepts as a container reference: an id, an id prefix or a name. Anything else
# (a "/", "..", "?") would change the request path, so it is refused before any request.
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")


class DockerUnavailable(Exception):
    """The daemon cannot be asked: no socket, connection refused, permission denied, timeout,
    not HTTP, or an HTTP error status other than 404. The message names the socket path."""


class ContainerNotFound(LookupError):
    """The daemon answered 404 for the container."""


class DockerResponseError(ValueError):
    """The daemon answered, but not what the API documents: malformed JSON, a missing field or
    one of the wrong type, a body over :data:`MAX_BODY`, another container's id."""


@dataclass(frozen=True)
class DockerContainer:
    """What the daemon says about one container. IMAGE: the reference it was started from
    (``Config.Image``, as typed: a tag, a digest reference or an id). IMAGE_ID: the image it
    runs (``sha256:...``). IMAGE_DIGESTS: that image's ``RepoDigests`` (``repo@sha256:...``),
    empty for an image that was built locally and never pushed or pulled. STATE: ``State.Status``
    ("running", "exited", ...). PID: the container's init process on the host (0 when it is not
    running)."""

    id: str
    name: str
    image: str
    image_id: str
    image_digests: tuple[str, ...]
    labels: dict[str, str]
    state: str
    started_at: str
    pid: int
    restart_count: int


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP connection whose transport is a unix stream socket instead of TCP."""

    def __init__(self, socket_path: str, timeout_s: float) -> None:
        super().__init__("localhost", timeout=timeout_s)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _scalar(obj: dict[str, object], key: str, kind: type[_T], what: str) -> _T:
    """OBJ[KEY], which must be a KIND (a JSON bool is not an int: a pid of `true` is no pid)."""
    value = obj.get(key)
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    raise DockerResponseError(f"{what}: {key} is {type(value).__name__}, expected {kind.__name__}")


def _obj(obj: dict[str, object], key: str, what: str) -> dict[str, object]:
    value = obj.get(key)
    if not isinstance(value, dict):
        raise DockerResponseError(f"{what}: {key} is {type(value).__name__}, expected object")
    return value


def _labels(config: dict[str, object], what: str) -> dict[str, str]:
    raw = config.get("Labels")
    if raw is None:
        return {}  # the API sends null for a container without labels
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise DockerResponseError(f"{what}: Config.Labels is not a string-to-string object")
    return dict(raw)


def _digests(image: dict[str, object], what: str) -> tuple[str, ...]:
    raw = image.get("RepoDigests")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(d, str) for d in raw):
        raise DockerResponseError(f"{what}: RepoDigests is not a list of strings")
    return tuple(raw)


class DockerAPI:
    """The daemon at SOCKET_PATH. TIMEOUT_S bounds each socket operation (connect, each read)
    and, added to itself, the reading of one whole answer. One connection per request: nothing
    is kept open between calls. Image lookups are cached per image id (an id names immutable
    content; only its RepoDigests can grow, when the image is pushed, so a long-lived instance
    may miss a later push)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._image_digests: dict[str, tuple[str, ...]] = {}

    def available(self) -> bool:
        """Whether the daemon answers ``GET /_ping`` with 200."""
        try:
            status, _ = self._get("/_ping")
        except (DockerUnavailable, DockerResponseError):
            return False
        return status == http.client.OK

    def inspect(self, container_id: str) -> DockerContainer:
        """The container CONTAINER_ID (an id, an unambiguous id prefix or a name), with its
        image's RepoDigests. Raises ContainerNotFound (404), DockerUnavailable, or
        DockerResponseError; ValueError for a reference that is not an id or a name."""
        if not _REF.fullmatch(container_id):
            raise ValueError(f"not a container id or name: {container_id!r}")
        what = f"container {container_id}"
        body = self._get_json(f"/containers/{quote(container_id)}/json", what, ContainerNotFound)
        cid = _scalar(body, "Id", str, what)
        if not _FULL_ID.fullmatch(cid):
            raise DockerResponseError(f"{what}: Id {cid[:80]!r} is not a 64-hex container id")
        if _FULL_ID.fullmatch(container_id) and cid != container_id:
            raise DockerResponseError(f"{what}: the daemon answered for container {cid}")
        image_id = _scalar(body, "Image", str, what)
        if not _IMAGE_ID.fullmatch(image_id):
            raise DockerResponseError(f"{what}: Image {image_id[:80]!r} is not a sha256 id")
        config = _obj(body, "Config", what)
        state = _obj(body, "State", what)
        pid = _scalar(state, "Pid", int, what)
        if pid < 0:
            raise DockerResponseError(f"{what}: State.Pid {pid} is negative")
        return DockerContainer(
            id=cid,
            name=_scalar(body, "Name", str, what).removeprefix("/"),
            image=_scalar(config, "Image", str, what),
            image_id=image_id,
            image_digests=self._digests_of(image_id, what),
            labels=_labels(config, what),
            state=_scalar(state, "Status", str, what),
            started_at=_scalar(state, "StartedAt", str, what),
            pid=pid,
            restart_count=_scalar(body, "RestartCount", int, what),
        )

    def _digests_of(self, image_id: str, what: str) -> tuple[str, ...]:
        cached = self._image_digests.get(image_id)
        if cached is not None:
            return cached
        # A container's image cannot be removed while the container exists (`rmi -f` only
        # untags it), so a 404 here is the daemon contradicting itself, not "no digests".
        body = self._get_json(f"/images/{image_id}/json", f"image {image_id} of {what}")
        digests = _digests(body, f"image {image_id}")
        if len(self._image_digests) >= _IMAGE_CACHE_MAX:
            self._image_digests.clear()
        self._image_digests[image_id] = digests
        return digests

    def _get_json(
        self,
        path: str,
        what: str,
        not_found: type[Exception] = DockerResponseError,
    ) -> dict[str, object]:
        status, raw = self._get(path)
        if status == http.client.NOT_FOUND:
            raise not_found(f"{what}: not found (404 from {self.socket_path})")
        if status != http.client.OK:
            raise DockerUnavailable(
                f"{what}: HTTP {status} from {self.socket_path}: {_message(raw)}"
            )
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:  # bad UTF-8, bad JSON, absurd nesting
            raise DockerResponseError(f"{what}: answer is not JSON ({e!r:.200})") from None
        if not isinstance(body, dict):
            raise DockerResponseError(f"{what}: answer is {type(body).__name__}, not an object")
        return body

    def _get(self, path: str) -> tuple[int, bytes]:
        """(status, body) of GET PATH. Transport failures are DockerUnavailable naming the
        socket; a body over MAX_BODY is DockerResponseError."""
        conn = _UnixConnection(self.socket_path, self.timeout_s)
        sock = self.socket_path
        try:
            conn.request("GET", path, headers={"Host": "docker", "Connection": "close"})
            resp = conn.getresponse()
            return resp.status, _read_capped(resp, self.timeout_s, f"GET {path}")
        except FileNotFoundError:
            raise DockerUnavailable(f"no Docker socket at {sock}") from None
        except ConnectionRefusedError:
            raise DockerUnavailable(f"connection refused at {sock} (no daemon listening)") from None
        except PermissionError:
            raise DockerUnavailable(f"permission denied on {sock}") from None
        except TimeoutError:
            raise DockerUnavailable(f"timed out after {self.timeout_s}s on {sock}") from None
        except (OSError, http.client.HTTPException) as e:
            raise DockerUnavailable(f"not a Docker API at {sock}: {e!r}") from None
        finally:
            conn.close()


def _read_capped(resp: http.client.HTTPResponse, timeout_s: float, what: str) -> bytes:
    """The whole body, refusing more than MAX_BODY bytes (declared or sent) and a sender that
    drips it out for longer than twice the timeout."""
    length = resp.getheader("Content-Length")
    if (
        length is not None
        and length.strip().isascii()
        and length.strip().isdigit()
        and int(length) > MAX_BODY
    ):
        raise DockerResponseError(f"{what}: body of {int(length)} bytes is over {MAX_BODY}")
    deadline = time.monotonic() + 2 * timeout_s
    parts: list[bytes] = []
    size = 0
    while chunk := resp.read(_CHUNK):
        size += len(chunk)
        if size > MAX_BODY:
            raise DockerResponseError(f"{what}: body is over {MAX_BODY} bytes")
        if time.monotonic() > deadline:
            raise TimeoutError
        parts.append(chunk)
    return b"".join(parts)


def _message(raw: bytes) -> str:
    """The daemon's error message (``{"message": ...}``), or the start of the body."""
    text = raw[:_MESSAGE_MAX].decode("utf-8", "replace")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return text.strip() or "(empty body)"
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])[:_MESSAGE_MAX]
    return text.strip()
