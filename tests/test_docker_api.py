"""The Docker Engine API client: error paths against a fake daemon on a unix socket in tmp_path
(a real daemon cannot be made to misbehave), then one test against the real daemon."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import socketserver
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servewitness.evidence.container import container_from_cgroup
from servewitness.evidence.docker_api import (
    DEFAULT_SOCKET,
    MAX_BODY,
    ContainerNotFound,
    DockerAPI,
    DockerContainer,
    DockerResponseError,
    DockerUnavailable,
)

CID = "c" * 64
IMAGE_ID = "sha256:" + "e" * 64


def _container(**over: object) -> dict[str, object]:
    body: dict[str, object] = {
        "Id": CID,
        "Name": "/serving",
        "Image": IMAGE_ID,
        "RestartCount": 2,
        "Config": {"Image": "vllm/vllm-openai:v0.9", "Labels": {"role": "serve"}},
        "State": {"Status": "running", "Pid": 4242, "StartedAt": "2026-01-01T00:00:00Z"},
    }
    body.update(over)
    return body


def _image(**over: object) -> dict[str, object]:
    body: dict[str, object] = {
        "Id": IMAGE_ID,
        "RepoDigests": ["vllm/vllm-openai@sha256:" + "d" * 64],
    }
    body.update(over)
    return body


# A route answers (status, headers, body); a body that is a list of bytes is sent chunked.
Answer = tuple[int, dict[str, str], bytes | list[bytes]]


def _json(status: int, body: object) -> Answer:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _FakeServer

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        route = self.server.routes.get(self.path)
        status, headers, body = route if route is not None else _json(404, {"message": "no"})
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Connection", "close")
        if isinstance(body, list):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in body:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        else:
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _FakeServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, routes: dict[str, Answer]) -> None:
        super().__init__(path, _Handler)
        self.routes = routes
        self.requests: list[str] = []

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the client hanging up on an oversized body is the point of some tests


Start = Callable[[dict[str, Answer]], tuple[DockerAPI, _FakeServer]]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Start]:
    """Start a fake daemon with the given routes; answers a client for it and the server."""
    servers: list[tuple[_FakeServer, threading.Thread]] = []

    def start(routes: dict[str, Answer]) -> tuple[DockerAPI, _FakeServer]:
        path = str(tmp_path / f"d{len(servers)}.sock")
        server = _FakeServer(path, routes)
        thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
        thread.start()
        servers.append((server, thread))
        return DockerAPI(path, timeout_s=2.0), server

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _routes(container: object | None = None, image: object | None = None) -> dict[str, Answer]:
    return {
        "/_ping": (200, {"Content-Type": "text/plain"}, b"OK"),
        f"/containers/{CID}/json": _json(200, _container() if container is None else container),
        f"/images/{IMAGE_ID}/json": _json(200, _image() if image is None else image),
    }


def test_inspect_reads_the_documented_fields_and_caches_the_image(fake: Start) -> None:
    api, server = fake(_routes())
    assert api.available()
    got = api.inspect(CID)
    assert got == DockerContainer(
        id=CID,
        name="serving",
        image="vllm/vllm-openai:v0.9",
        image_id=IMAGE_ID,
        image_digests=("vllm/vllm-openai@sha256:" + "d" * 64,),
        labels={"role": "serve"},
        state="running",
        started_at="2026-01-01T00:00:00Z",
        pid=4242,
        restart_count=2,
    )
    api.inspect(CID)
    assert server.requests.count(f"/images/{IMAGE_ID}/json") == 1


def test_null_labels_and_digests_are_empty(fake: Start) -> None:
    config = {"Image": "local/built:1", "Labels": None}
    api, _ = fake(_routes(_container(Config=config), _image(RepoDigests=None)))
    got = api.inspect(CID)
    assert (got.labels, got.image_digests) == ({}, ())


def test_404_is_container_not_found(fake: Start) -> None:
    api, _ = fake(_routes())
    with pytest.raises(ContainerNotFound, match="404"):
        api.inspect("f" * 64)


def test_500_is_unavailable_with_the_daemons_message(fake: Start) -> None:
    routes = _routes()
    routes[f"/containers/{CID}/json"] = _json(500, {"message": "driver exploded"})
    api, _ = fake(routes)
    with pytest.raises(DockerUnavailable, match=r"HTTP 500 .*driver exploded"):
        api.inspect(CID)


def test_image_404_is_a_contradiction_not_empty_digests(fake: Start) -> None:
    routes = _routes()
    del routes[f"/images/{IMAGE_ID}/json"]
    api, _ = fake(routes)
    with pytest.raises(DockerResponseError, match="image"):
        api.inspect(CID)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"\xff\xfe\x00",
        b"[" * 100_000,  # nesting deep enough to exhaust the parser's recursion
        b"[1, 2]",
        b"null",
    ],
    ids=["syntax", "not-utf8", "deep", "array", "null"],
)
def test_malformed_json_is_a_response_error(fake: Start, body: bytes) -> None:
    routes = _routes()
    routes[f"/containers/{CID}/json"] = (200, {}, body)
    api, _ = fake(routes)
    with pytest.raises(DockerResponseError):
        api.inspect(CID)


def _without(key: str) -> dict[str, object]:
    body = _container()
    del body[key]
    return body


@pytest.mark.parametrize(
    ("container", "image"),
    [
        (_without("State"), None),
        (_without("Id"), None),
        (_without("Config"), None),
        (_container(State={"Status": "running", "StartedAt": "x"}), None),  # no Pid
        (_container(State={"Status": "running", "Pid": "12", "StartedAt": "x"}), None),
        (_container(State={"Status": "running", "Pid": True, "StartedAt": "x"}), None),
        (_container(State={"Status": "running", "Pid": -1, "StartedAt": "x"}), None),
        (_container(Config={"Image": "x", "Labels": ["a"]}), None),
        (_container(Config={"Image": "x", "Labels": {"a": 1}}), None),
        (_container(Config=[]), None),
        (_container(Id="abc"), None),
        (_container(Id="d" * 64), None),  # an answer for another container than asked
        (_container(Image="latest"), None),
        (_container(RestartCount=1.5), None),
        (None, _image(RepoDigests="sha256:x")),
        (None, _image(RepoDigests=[1])),
    ],
)
def test_wrong_fields_are_a_response_error_never_a_key_error(
    fake: Start, container: object, image: object
) -> None:
    api, _ = fake(_routes(container, image))
    with pytest.raises(DockerResponseError):
        api.inspect(CID)


def test_oversized_body_is_refused_declared_or_chunked(fake: Start) -> None:
    big = b"x" * (MAX_BODY + 1)
    routes = _routes()
    routes[f"/containers/{CID}/json"] = (200, {}, big)  # honest Content-Length
    routes["/chunked"] = (200, {}, [b"x" * 65536] * (MAX_BODY // 65536 + 1))
    api, _ = fake(routes)
    with pytest.raises(DockerResponseError, match="over"):
        api.inspect(CID)
    with pytest.raises(DockerResponseError, match="over"):
        api._get("/chunked")


def test_a_reference_that_would_change_the_path_is_refused_before_asking(tmp_path: Path) -> None:
    api = DockerAPI(str(tmp_path / "none.sock"))
    for bad in ("../images/x", "a/b", "", "x?y", "-rm", "abc\n"):
        with pytest.raises(ValueError, match="not a container id"):
            api.inspect(bad)


def test_missing_socket_is_unavailable_and_says_where(tmp_path: Path) -> None:
    path = str(tmp_path / "docker.sock")
    api = DockerAPI(path)
    assert not api.available()
    with pytest.raises(DockerUnavailable, match="no Docker socket") as e:
        api.inspect(CID)
    assert path in str(e.value)


def test_socket_nobody_listens_on_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "dead.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)  # bound, never listening: connect() is refused
        api = DockerAPI(path)
        assert not api.available()
        with pytest.raises(DockerUnavailable, match="refused") as e:
            api.inspect(CID)
    assert path in str(e.value)


def test_socket_that_never_answers_times_out(tmp_path: Path) -> None:
    path = str(tmp_path / "mute.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
        s.listen(8)  # connections queue in the backlog; nothing ever accepts or answers
        api = DockerAPI(path, timeout_s=0.2)
        with pytest.raises(DockerUnavailable, match="timed out") as e:
            api.inspect(CID)
        assert not api.available()
    assert path in str(e.value)


def test_socket_that_is_not_http_is_unavailable(tmp_path: Path) -> None:
    path = str(tmp_path / "ssh.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
        s.listen(1)

        def babble() -> None:
            conn, _ = s.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        t = threading.Thread(target=babble, daemon=True)
        t.start()
        with pytest.raises(DockerUnavailable, match="not a Docker API") as e:
            DockerAPI(path).inspect(CID)
        t.join(5)
    assert path in str(e.value)


# -- the real daemon --


def _docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout


BASE_IMAGE = "verifier-os-base:local"  # built by scripts/images.sh (the docker_images fixture)


@pytest.mark.docker
def test_real_daemon_inspect_matches_docker_inspect_and_proc(docker_images: None) -> None:
    """Start a container on the real daemon and check every field the client returns against
    `docker inspect` and /proc. Fails, never skips, without a daemon: CI runs one."""
    if not os.path.exists(DEFAULT_SOCKET):
        pytest.fail(f"no Docker daemon socket at {DEFAULT_SOCKET}: this test needs a real daemon")
    if shutil.which("docker") is None:
        pytest.fail("the docker CLI is not on PATH: this test starts a container with it")
    name = f"verifier-test-{uuid.uuid4().hex[:12]}"
    try:
        cid = _docker(
            "run", "-d", "--name", name, "--label", "verifier.test=1", BASE_IMAGE, "sleep", "60"
        ).strip()
        want = json.loads(_docker("inspect", cid))[0]
        image = json.loads(_docker("image", "inspect", want["Image"]))[0]

        api = DockerAPI()
        assert api.available()
        got = api.inspect(cid)
        assert got == api.inspect(name)  # by name, too
        assert got.id == cid == want["Id"]
        assert got.name == name
        assert got.labels.get("verifier.test") == "1"
        assert got.labels == (want["Config"]["Labels"] or {})
        assert got.image == BASE_IMAGE
        assert got.image_id == want["Image"] == image["Id"]
        assert got.image_digests == tuple(image["RepoDigests"] or ())
        assert got.state == "running"
        assert got.started_at == want["State"]["StartedAt"]
        assert got.restart_count == 0
        assert got.pid == want["State"]["Pid"] > 0

        ref = container_from_cgroup(Path(f"/proc/{got.pid}/cgroup").read_text())
        assert ref is not None, f"/proc/{got.pid}/cgroup names no container"
        assert ref.id == cid
        # "unknown" when this test itself runs in a private cgroup namespace: it then sees the
        # container's cgroup as /../<id>, without the /docker parent that names the runtime.
        assert ref.runtime in ("docker", "unknown")
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120, check=False)
