"""Local identity on the verifier's Unix socket: the kernel's word (``SO_PEERCRED``).

gRPC Python does not expose a Unix-socket peer's credentials (``auth_context()`` under local
credentials carries a security level only), so the verifier serves its public Unix socket
itself: :class:`UnixRelay` accepts each connection, reads ``SO_PEERCRED`` (pid, uid, gid, as
the kernel recorded them at ``connect``), and relays the bytes to the gRPC server listening on
a private loopback port. It remembers which of its upstream connections (their local port,
what the servicer sees as ``context.peer()`` = ``ipv4:127.0.0.1:PORT``) carries which
credentials; a connection to the private port that is not one of the relay's has no identity.

Who must be trusted: the kernel (it fills ``SO_PEERCRED``), and root on the verifier's host
(root can be any uid). Which uids may report for which targets is configuration
(:class:`LocalAgent`, ``verifier serve --local-agent UID[:TARGET,...]``).

The relay is bounded: at most ``max_connections`` at once, and one peer (one uid in one
container) at most three quarters of them (``max_per_peer``): a quarter stays for everyone
else, so that one local user holding connections open cannot lock every other client
(`verifier status`, `wait`, other agents) out; more are closed at accept. A connection
that sends nothing within ``first_byte_s`` or nothing either way for ``idle_s`` is closed,
and ``stop`` closes everything.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from servewitness.errors import ConfigError, UsageError
from servewitness.instances import covered

log = structlog.get_logger("verifier.relay")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class PeerCred:
    """What the kernel says about the process at the other end of a Unix socket."""

    pid: int
    uid: int
    gid: int
    container: str | None = None  # from /proc/PID/cgroup, when the verifier could read it

    def describe(self) -> str:
        """The identity a verdict and the ledger show, e.g. ``unix:uid=1000,pid=123``."""
        out = f"unix:uid={self.uid},pid={self.pid}"
        return out + (f",container={self.container[:12]}" if self.container else "")


@dataclass(frozen=True)
class LocalAgent:
    """A uid allowed to report over the Unix socket, for which targets (empty: any), and, when
    CONTAINER is given, only from a process in a container whose id starts with it (the
    kernel's cgroup of the peer's pid: uid 0 in one container is not uid 0 in another)."""

    uid: int
    targets: frozenset[str] = field(default_factory=frozenset)
    container: str | None = None  # a container id prefix (>= 12 hex digits)

    def may_report(self, targets: frozenset[str] | set[str]) -> bool:
        """Whether it may report for every one of TARGETS (a listed target, or an instance of
        a listed family: ``servewitness.instances.covered``); unlisted: any target."""
        return not self.targets or all(covered(self.targets, t) for t in targets)

    def matches(self, cred: PeerCred) -> bool:
        if cred.uid != self.uid:
            return False
        return self.container is None or (cred.container or "").startswith(self.container)

    def describe(self) -> str:
        where = f" in container {self.container}" if self.container else ""
        return f"uid {self.uid}{where} for " + (", ".join(sorted(self.targets)) or "any target")


_HEX = frozenset("0123456789abcdef")


def parse_local_agent(value: str) -> LocalAgent:
    """``UID[@CONTAINER][:TARGET,TARGET...]`` (``verifier serve --local-agent``)."""
    who, sep, rest = value.partition(":")
    uid_s, at, container = who.partition("@")
    if not (uid_s.isascii() and uid_s.isdigit()):
        raise UsageError(
            f"--local-agent {value!r}: expected UID[@CONTAINER][:TARGET,...] (UID a number)"
        )
    if at and not (len(container) >= 12 and set(container.lower()) <= _HEX):
        raise UsageError(f"--local-agent {value!r}: a container id prefix is >= 12 hex digits")
    targets = frozenset(t.strip() for t in rest.split(",") if t.strip())
    if sep and not targets:
        raise UsageError(f"--local-agent {value!r}: no target after ':'")
    return LocalAgent(int(uid_s), targets, container.lower() if at else None)


def peer_credentials(sock: socket.socket) -> PeerCred:
    pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return PeerCred(pid, uid, gid)


def _bind_unix(path: Path) -> socket.socket:
    """Listen on PATH; a stale socket file there (a verifier that died) is replaced, any
    other file is not."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"cannot listen on unix:{path}: it exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody answers: a stale socket
        else:
            raise ConfigError(f"cannot listen on unix:{path}: another server answers there")
        finally:
            probe.close()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(path))
        s.listen(128)
    except OSError as e:
        s.close()
        raise ConfigError(f"cannot listen on unix:{path}: {e.strerror}") from e
    return s


class UnixRelay:
    """The verifier's public Unix socket: credentials from the kernel, bytes to gRPC."""

    def __init__(
        self,
        path: Path,
        upstream_port: int,
        *,
        max_connections: int = 64,
        first_byte_s: float = 10.0,
        idle_s: float = 600.0,
        container_of: Callable[[int], str | None] | None = None,
    ) -> None:
        self.path = path
        self.upstream_port = upstream_port
        self.max_connections = max_connections
        self.max_per_peer = max(1, max_connections - max_connections // 4)
        self.first_byte_s = first_byte_s
        self.idle_s = idle_s
        self.container_of = container_of
        self._ids: dict[int, PeerCred] = {}  # upstream local port -> the peer it relays
        self._conns: set[socket.socket] = set()  # accepted connections (the limit counts these)
        self._per_peer: dict[tuple[int, str | None], int] = {}  # (uid, container): connections
        self._upstreams: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.refused = 0  # connections closed at accept: over max_connections

    def start(self) -> None:
        self._listener = _bind_unix(self.path)
        self._listener.settimeout(0.2)  # so stop() is seen
        self._thread = threading.Thread(target=self._accept_loop, name="unix-relay", daemon=True)
        self._thread.start()

    def identity(self, peer: str) -> PeerCred | None:
        """The credentials behind gRPC peer PEER (``ipv4:127.0.0.1:PORT``); None when PEER is
        not one of the relay's own upstream connections."""
        host, _, port = peer.rpartition(":")
        if host not in ("ipv4:127.0.0.1", "ipv6:[::1]") or not (port.isascii() and port.isdigit()):
            return None
        with self._lock:
            return self._ids.get(int(port))

    def _accept_loop(self) -> None:
        listener = self._listener
        while listener is not None and not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            try:
                cred = self._credentials(conn)
            except OSError:
                conn.close()
                continue
            who = (cred.uid, cred.container)
            with self._lock:
                full = len(self._conns) >= self.max_connections
                mine = self._per_peer.get(who, 0) >= self.max_per_peer
                if not (full or mine):
                    self._conns.add(conn)
                    self._per_peer[who] = self._per_peer.get(who, 0) + 1
            if full or mine:
                self.refused += 1
                log.warning(
                    "relay_full",
                    max_connections=self.max_connections,
                    max_per_peer=self.max_per_peer,
                    peer=cred.describe(),
                    by_peer=mine,
                )
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, cred), daemon=True).start()

    def _credentials(self, conn: socket.socket) -> PeerCred:
        cred = peer_credentials(conn)
        if self.container_of is not None and cred.pid > 0:
            try:
                container = self.container_of(cred.pid)
            except Exception:  # noqa: BLE001 - a process that exited, /proc refused: no container
                container = None
            if container:
                cred = PeerCred(cred.pid, cred.uid, cred.gid, container)
        return cred

    def _serve(self, conn: socket.socket, cred: PeerCred) -> None:
        up: socket.socket | None = None
        port = 0
        try:
            up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            port = up.getsockname()[1]
            with self._lock:
                self._ids[port] = cred
                self._upstreams.add(up)
            self._pump(conn, up)
        except OSError as e:
            log.debug("relay_connection_ended", error=str(e))
        finally:
            with self._lock:  # forget the identity before the port can be reused
                if port:
                    self._ids.pop(port, None)
                self._conns.discard(conn)
                who = (cred.uid, cred.container)
                left = self._per_peer.get(who, 1) - 1
                if left > 0:
                    self._per_peer[who] = left
                else:
                    self._per_peer.pop(who, None)
                if up is not None:
                    self._upstreams.discard(up)
            for s in (conn, up):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.close()

    def _pump(self, client: socket.socket, up: socket.socket) -> None:
        """Copy bytes both ways until either side closes, the relay stops, or the connection
        idles past its limit (the client's first byte within first_byte_s, then any byte
        either way within idle_s)."""
        client.settimeout(self.idle_s)  # bounds a sendall to a peer that stops reading
        up.settimeout(self.idle_s)
        heard = False
        last = time.monotonic()
        while not self._stop.is_set():
            limit = self.idle_s if heard else self.first_byte_s
            left = last + limit - time.monotonic()
            if left <= 0:
                log.debug("relay_idle_closed", heard=heard)
                return
            ready, _, _ = select.select([client, up], [], [], min(left, 0.5))
            for s in ready:
                data = s.recv(_CHUNK)
                if not data:
                    return
                if s is client:
                    heard = True
                (up if s is client else client).sendall(data)
                last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            conns = [*self._conns, *self._upstreams]
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
