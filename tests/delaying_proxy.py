"""A TCP proxy that holds each byte for a set time in one direction: what ``tc qdisc add dev
eth0 root netem delay 3s`` on the serving pod's interface does to the agent's traffic, built
in user space (no CAP_NET_ADMIN needed in a test). TLS passes through it untouched: the delay
is all it adds."""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator


class DelayingProxy:
    """Listens on 127.0.0.1 (``addr``) and forwards every connection to UPSTREAM ("host:port"),
    holding what the client sends for ``out_s`` seconds and what the server sends for
    ``back_s`` (both may be changed while it runs; a change applies to bytes read after it)."""

    def __init__(self, upstream: str, out_s: float = 0.0, back_s: float = 0.0) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.out_s, self.back_s = out_s, back_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            self._pipe(client, server, lambda: self.out_s)
            self._pipe(server, client, lambda: self.back_s)

    def _pipe(self, src: socket.socket, dst: socket.socket, delay: Callable[[], float]) -> None:
        """Bytes read from SRC written to DST DELAY() seconds after they were read, in the
        order read (a shortened delay never lets later bytes pass earlier ones)."""
        due: collections.deque[tuple[float, bytes]] = collections.deque()
        cond = threading.Condition()
        last = [0.0]

        def read() -> None:
            while True:
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                with cond:
                    last[0] = max(last[0], time.monotonic() + delay())
                    due.append((last[0], data))
                    cond.notify()
                if not data:
                    return

        def write() -> None:
            while True:
                with cond:
                    while not due or due[0][0] > time.monotonic():
                        cond.wait(None if not due else due[0][0] - time.monotonic())
                    _, data = due.popleft()
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


@contextlib.contextmanager
def delaying(upstream: str, out_s: float = 0.0, back_s: float = 0.0) -> Iterator[DelayingProxy]:
    proxy = DelayingProxy(upstream, out_s, back_s)
    try:
        yield proxy
    finally:
        proxy.close()
