"""The metrics endpoint: ``GET /metrics`` in the text format (or OpenMetrics, when the
scraper's ``Accept`` asks for it: ``prometheus_client``'s encoders), served by the standard
library's ``http.server`` from a daemon thread (``--metrics-listen``). Not
``prometheus_client.start_http_server``: that one serves any number of silent clients.

A scraper that connects and says nothing, or a thousand of them, costs bounded threads and
time: each connection gets ``IDLE_S`` to send its request and read the answer, and at most
``MAX_CONNECTIONS`` are served at once (more are closed at once, not queued)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from servewitness.errors import ConfigError

log = structlog.get_logger("servewitness.metrics")

IDLE_S = 5.0  # a connection's socket timeout: a silent client's thread ends after this
MAX_CONNECTIONS = 16  # served at once; a scrape takes milliseconds


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT, :PORT or PORT (loopback when no host is given)."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "", value
    host = host.strip("[]") or "127.0.0.1"
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--metrics-listen {value!r}: expected HOST:PORT or PORT")
    return host, int(port)


class MetricsServer:
    """GET /metrics (the text format) from a daemon thread; anything else is 404."""

    def __init__(
        self,
        listen: str,
        registry: CollectorRegistry,
        *,
        idle_s: float = IDLE_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        host, port = parse_listen(listen)
        slots = threading.BoundedSemaphore(max_connections)
        self.turned_away = 0  # connections closed because MAX_CONNECTIONS were being served

        class Handler(BaseHTTPRequestHandler):
            timeout = idle_s

            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served here")
                    return
                encode, content_type = choose_encoder(self.headers.get("Accept", ""))
                body = encode(registry)
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds are not worth a log line

        outer = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = _family(host)
            request_queue_size = 64  # turned away at once rather than left in the backlog

            def process_request(self, request: Any, client_address: Any) -> None:
                if not slots.acquire(blocking=False):
                    outer.turned_away += 1
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    slots.release()
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    slots.release()

        try:
            self.httpd = Server((host, port), Handler)
        except OSError as e:
            raise ConfigError(f"--metrics-listen {listen}: cannot listen: {e.strerror}") from e
        self.port = int(self.httpd.server_address[1])
        self.address = f"{host}:{self.port}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="metrics-http", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics_serving", listen=self.address)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _family(host: str) -> Any:
    import socket

    return socket.AF_INET6 if ":" in host else socket.AF_INET


def serve_metrics(listen: str | None, registry: CollectorRegistry) -> MetricsServer | None:
    return MetricsServer(listen, registry).start() if listen else None
