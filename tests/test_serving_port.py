"""Who serves the port a measured API server was started to serve (``agent/ports.py``).

The attack (a black-box attacker, 2026-12-05): code in the measured API server double-forks
a patched twin outside the ``--pid`` tree (``setsid``, adopted by init, no probe) that takes
the server's port, while the measured process serves another port and keeps itself busy:
the verdict and the signed seal said PASS and held, and every completion came from the twin.
Each test starts real processes holding real listening sockets and runs a real agent's
collect with ``--pid`` on the stand-in API server."""

from __future__ import annotations

import socket
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

from servewitness.agent.ports import served_port, served_uds
from tests.helpers import collect_once, stand_in

# A stand-in API server: its command line names vLLM's entry point and --port PORT; it
# listens on LISTEN (0: nowhere), with SO_REUSEPORT when SHARE, then waits on stdin.
SERVER = """
import socket, sys
listen, share = int(sys.argv[1]), sys.argv[2] == "1"
if listen:
    s = socket.socket()
    if share:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", listen)); s.listen()
print("up", flush=True)
sys.stdin.read()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server(
    port: int, listen: int, share: bool = False, *, new_session: bool = False
) -> AbstractContextManager[int]:
    argv = [sys.executable, "-c", SERVER, str(listen), "1" if share else "0",
            "vllm.entrypoints.openai.api_server", "--port", str(port)]  # fmt: skip
    return stand_in(argv, new_session=new_session)


def unobservable(pid: int, tmp_path: Path) -> tuple[str, ...]:
    report = collect_once(pid, tmp_path / "spool")
    return tuple(w for w in report.unobservable if "port" in w or "socket" in w)


def test_a_server_that_listens_where_it_was_started_to_is_not_a_finding(tmp_path: Path) -> None:
    port = free_port()
    with server(port, port) as pid:
        assert unobservable(pid, tmp_path) == ()


def test_a_twin_outside_the_tree_serving_the_port_is_named(tmp_path: Path) -> None:
    """The attack: the measured server moved to another port, a process outside its tree
    (its own session, as the attacker's setsid'ed twin) serves the one it was started for."""
    port, elsewhere = free_port(), free_port()
    with server(port, elsewhere) as decoy, server(port, port, new_session=True) as twin:
        (said,) = unobservable(decoy, tmp_path)
    assert f"the API server (pid {decoy}) was started to serve port {port}" in said
    assert f"no vLLM process the agent reports listens there; pid {twin} (" in said
    assert "; outside the tree) does" in said


def test_a_twin_sharing_the_port_is_named(tmp_path: Path) -> None:
    """A variation: both listen on the port (SO_REUSEPORT), so the kernel splits the
    connections between the measured server and the twin."""
    port = free_port()
    with (
        server(port, port, share=True) as pid,
        server(port, port, share=True, new_session=True) as twin,
    ):
        (said,) = unobservable(pid, tmp_path)
    assert f"listens on port {port}, and so does pid {twin} (" in said
    assert "; outside the tree):" in said


def test_a_server_not_listening_yet_says_nothing(tmp_path: Path) -> None:
    """While a server starts nobody answers on its port: no twin to name."""
    port = free_port()
    with server(port, 0) as pid:
        assert unobservable(pid, tmp_path) == ()


def test_the_port_a_command_line_asks_for() -> None:
    assert served_port(["python", "-m", "vllm.entrypoints.openai.api_server"]) == 8000
    assert served_port(["vllm", "serve", "m", "--port", "8123"]) == 8123
    assert served_port(["vllm", "serve", "m", "--port=8124"]) == 8124
    assert served_port(["vllm", "serve", "m", "--uds", "/tmp/s"]) is None
    assert served_uds(["vllm", "serve", "m", "--uds", "/tmp/s"]) == "/tmp/s"
    assert served_uds(["vllm", "serve", "m", "--uds=/tmp/t"]) == "/tmp/t"
    assert served_uds(["vllm", "serve", "m", "--port", "1"]) is None
    assert served_port(["vllm", "serve", "m", "--port", "²"]) is None
    assert served_port(["vllm", "serve", "m", "--port", "70000"]) is None


# A proxy the measured server starts (an exec'd helper, no vLLM process): it holds the port
# and forwards elsewhere (to a twin). It is in the tree, but not a process the agent reports.
PROXY = """
import os, socket, subprocess, sys
port = int(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import socket, sys; s = socket.socket(); "
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('up', flush=True); "
    "sys.stdin.read()", str(port)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "up"
print(child.pid, flush=True)
sys.stdin.read()
child.kill()
"""


def test_a_helper_of_the_tree_holding_the_port_is_named(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-c", PROXY, str(port), "vllm.entrypoints.openai.api_server",
            "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        helper = int(proc.stdout.readline())
        (said,) = unobservable(proc.pid, tmp_path)
    finally:
        proc.kill()
        proc.communicate()  # waits, and closes its pipes
    assert f"pid {helper} (" in said and "in the tree, not vLLM" in said, said


# A stand-in API server on a Unix socket (--uds PATH): it binds PATH and, when HIDE, renames
# its socket file away, then waits (the second attacker's: a twin then binds PATH).
UDS_SERVER = """
import os, socket, sys
path, hide = sys.argv[1], sys.argv[2] == "1"
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen()
if hide:
    os.rename(path, path + ".hidden")
print("up", flush=True)
sys.stdin.read()
"""


def uds_server(path: Path, hide: bool, *, new_session: bool = False) -> AbstractContextManager[int]:
    argv = [sys.executable, "-c", UDS_SERVER, str(path), "1" if hide else "0",
            "vllm.entrypoints.openai.api_server", "--uds", str(path)]  # fmt: skip
    return stand_in(argv, new_session=new_session)


def test_a_unix_socket_server_as_started_says_nothing(tmp_path: Path) -> None:
    with uds_server(tmp_path / "v.sock", hide=False) as pid:
        assert unobservable(pid, tmp_path) == ()


def test_a_twin_bound_to_the_servers_unix_socket_name_is_named(tmp_path: Path) -> None:
    path = tmp_path / "v.sock"
    with uds_server(path, hide=True) as pid, uds_server(path, hide=False, new_session=True) as twin:
        (said,) = unobservable(pid, tmp_path)
    assert f"listens on socket {path}, and so does pid {twin} (" in said, said
    assert "; outside the tree):" in said
