"""A verifier's threads named for the operating system (``server/thread_names.py``): what each
costs shows in ``/proc/PID/task/*/comm`` (``top -H``, ``ps -L``), in a real ``verifier serve
--processes 2`` (two serving processes and the store writer) after agents and a status client
called it; and a thread started before naming was turned on keeps the interpreter's name
(the hook covers threads started after it, nothing else)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.server import thread_names
from tests.helpers import agent_stub
from tests.test_listen_exclusive import free_port, serving
from tests.test_processes import DEADLINE_S, children, verifier, wait_until

pytestmark = pytest.mark.skipif(
    thread_names._PRCTL is None, reason="prctl(PR_SET_NAME) is Linux's (nothing is named here)"
)


def comms(pid: int) -> set[str]:
    """The OS names of PID's threads."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.add((task / "comm").read_text().strip())
        except OSError:
            continue  # a thread that ended meanwhile
    return out


def test_threads_started_after_are_named_and_before_are_not() -> None:
    me = threading.get_native_id()
    comm = Path(f"/proc/self/task/{me}/comm")
    was = comm.read_text().strip()
    got: dict[str, str] = {}

    def record() -> None:
        got[threading.current_thread().name] = (
            Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
        )

    gate = threading.Event()

    def wait_then_record() -> None:
        gate.wait()
        record()

    early = threading.Thread(target=wait_then_record, name="early-thread")
    early.start()  # started before: never named
    try:
        thread_names.name_threads_as_started()
        late = threading.Thread(target=record, name="a-long-verifier-thread-name")
        late.start()
        late.join()
        gate.set()
        early.join()
    finally:
        threading.setprofile(None)  # the hook is process-wide: this test's only
        thread_names.name_os_thread(was)
    assert got["a-long-verifier-thread-name"] == "a-long-verifier"  # 15 bytes kept
    assert got["early-thread"] != "early-thread"


def test_a_served_verifiers_threads_show_by_name(tmp_path: Path) -> None:
    db, log = tmp_path / "v.sqlite3", tmp_path / "serve.log"
    addr = f"127.0.0.1:{free_port()}"
    with verifier(["--processes", "2", "--listen", addr, "--db", str(db)], log) as proc:
        serving(addr, proc, log)
        wait_until("the writer and a second process", lambda: len(children(proc.pid)) == 2, log)
        with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
            stub = agent_stub(ch)
            for i in range(8):  # connections reach either process: hello from several
                with grpc.insecure_channel(
                    addr, options=[("grpc.use_local_subchannel_pool", 1)]
                ) as c:
                    agent_stub(c).Hello(pb.HelloRequest(agent_id=f"a{i}", targets=[f"t{i}"]))
            with pytest.raises(grpc.RpcError) as e:
                stub.GetRunStatus(pb.GetRunStatusRequest(name="none"))
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
        pids = [proc.pid, *children(proc.pid)]

        def named() -> bool:  # the other processes may still be starting
            names = {pid: comms(pid) for pid in pids}
            every = set().union(*names.values())
            return (
                "verdict-history" in names[proc.pid]  # the first process keeps the history
                and sum("follow-store" in n for n in names.values()) == 2
                and {"writer-conn-0", "writer-conn-1"} <= every
                and any(n.startswith("agents_") for n in every)
                and any(n.startswith("status_") for n in every)
            )

        wait_until(f"named threads in {pids}", named, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0, log.read_text()[-3000:]
