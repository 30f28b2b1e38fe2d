"""Targets that are what the policy says (issue 19, item 5): an agent without ``--pid`` that
sees two independent vLLM process trees under one target says so (``evidence.target.mixed``,
ERROR), and keeps saying so after one of them exits.

Every test runs in a PID namespace of its own (``unshare --pid --fork --mount-proc``, root), so
that the agent, which reports every vLLM process it can see, sees the test's processes only:
real probed Python processes that look like vLLM workers (tests/test_faults.py's fake worker),
and the real agent reporting to the real verifier over real gRPC (a Unix socket).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.agent.trees import TreeMemory, tree_roots
from servewitness.client.api import VerifierClient
from servewitness.model import Verdict
from servewitness.server.app import ServeConfig, VerifierServer
from tests.helpers import probe_env
from tests.test_faults import CHILD, RUNNER, policy

pytestmark = pytest.mark.skipif(
    shutil.which("unshare") is None, reason="needs unshare (util-linux)"
)

# Runs as pid 1 of a new PID namespace: starts the layout named by argv[2], waits until the
# agent sees its workers, reports once, then (argv[4] == "kill-one") kills the first top-level
# process and reports again with it gone.
NAMESPACE = """\
import subprocess, sys, time
from pathlib import Path
from servewitness.agent.discover import discover
from servewitness.agent.runner import Agent, AgentConfig
from servewitness.evidence.procfs import ProcFS

addr, layout, child, then, spool = sys.argv[1:6]
worker = [sys.executable, child]
# A launcher whose command line names vLLM, starting two workers: one tree (a common ancestor).
launcher = [sys.executable, "-c", "import subprocess, sys; "
            "ps = [subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, "
            "stdout=subprocess.DEVNULL) for _ in range(2)]; sys.stdin.read()", *worker]
tops = {
    "two": [worker, worker],
    "one": [worker],
    "common": [launcher + ["--vllm-launcher"]],
}[layout]
procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL) for c in tops]
want = 1 if layout == "one" else 2
deadline = time.monotonic() + 60
while sum(e.role == "worker" for e in discover(ProcFS())) < want:
    assert time.monotonic() < deadline, "workers did not come up"
    time.sleep(0.1)
root = 1 if then == "pid" else None
a = Agent(AgentConfig(addr, "t", "tree-agent", Path(spool), root_pid=root, docker_socket=None))
a.step()
if then == "kill-one":
    procs[0].kill()
    procs[0].wait()
    while sum(e.role == "worker" for e in discover(ProcFS())) != want - 1:
        time.sleep(0.1)
    a.step()
    print("reported", len(a.collect().processes), flush=True)
a.channel.close()
for p in procs:
    p.kill()
print("done", flush=True)
"""


@pytest.fixture
def verifier(tmp_path: Path) -> Iterator[str]:
    addr = f"unix:{tmp_path}/v.sock"
    server = VerifierServer(ServeConfig(addr, tmp_path / "db.sqlite3", report_interval_s=0.2))
    server.start()
    try:
        with VerifierClient(addr) as client:
            client.register_run("r", policy(60.0), "p.toml")
        yield addr
    finally:
        server.stop()


def in_namespace(addr: str, tmp: Path, layout: str, then: str = "") -> str:
    mods = tmp / "mods"
    mods.mkdir(exist_ok=True)
    (mods / "fakerunner.py").write_text(RUNNER)
    child = tmp / "child.py"
    child.write_text(CHILD)
    env = probe_env(tmp / "probe", PYTHONPATH=str(mods), VERIFIER_PROBE_BINDINGS="0",
                    VERIFIER_HOOKS="h=fakerunner:Runner.execute_model")  # fmt: skip
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", NAMESPACE,
         addr, layout, str(child), then, str(tmp / "spool")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"no PID namespaces here: {out.stderr.strip()}")
    assert out.returncode == 0 and "done" in out.stdout, out.stderr[-4000:]
    return out.stdout


def target(addr: str) -> tuple[Verdict, dict[str, list[int]]]:
    with VerifierClient(addr) as client:
        (t,) = client.status("r").targets
    return t.verdict, {f.id: list(f.context.get("root_pids", [])) for f in t.findings}


def test_two_independent_servers_under_one_agent_are_mixed_and_fail(
    verifier: str, tmp_path: Path
) -> None:
    """The attack of the issue: two vLLM servers on one host, an agent without --pid. Both
    trees' processes are reported under one target; without the check it PASSes on them."""
    in_namespace(verifier, tmp_path, "two")
    verdict, found = target(verifier)
    assert verdict == Verdict.FAIL, found
    assert len(found["evidence.target.mixed"]) == 2, found


def test_the_mixed_target_stays_failed_after_one_server_exits(
    verifier: str, tmp_path: Path
) -> None:
    """Variation: one of the two servers crashes (the user's own, perhaps). The target now
    holds one tree, all of it another server's; the agent remembers it saw two, so the
    target is not PASSed on the survivor's evidence."""
    out = in_namespace(verifier, tmp_path, "two", "kill-one")
    assert "reported 1" in out, out
    verdict, found = target(verifier)
    assert verdict == Verdict.FAIL and len(found["evidence.target.mixed"]) == 2, found


def test_one_server_is_not_mixed(verifier: str, tmp_path: Path) -> None:
    """Negative control: one server alone under an agent without --pid PASSes."""
    in_namespace(verifier, tmp_path, "one")
    verdict, found = target(verifier)
    assert verdict == Verdict.PASS and "evidence.target.mixed" not in found, found


def test_workers_of_one_vllm_launcher_are_one_tree(verifier: str, tmp_path: Path) -> None:
    """Negative control: two workers under a common vLLM ancestor (one server's processes)
    are one tree, however many there are."""
    in_namespace(verifier, tmp_path, "common")
    verdict, found = target(verifier)
    assert verdict == Verdict.PASS and "evidence.target.mixed" not in found, found


def test_pid_selects_a_tree_and_nothing_is_mixed(verifier: str, tmp_path: Path) -> None:
    """--pid is the user's choice of tree: the agent reports what is under it, unjudged for
    mixing (here both servers, because the pid named is their common parent)."""
    in_namespace(verifier, tmp_path, "two", "pid")
    _, found = target(verifier)
    assert "evidence.target.mixed" not in found, found


def test_tree_memory_is_sticky_only_once_two_trees_were_seen_together() -> None:
    """A server restarted in place (one tree, then another) is never mixed; two at once are,
    from then on."""
    from servewitness.evidence.process import ProcessEvidence
    from servewitness.evidence.procfs import ProcessIdentity

    def ev(pid: int, ppid: int, role: str = "worker") -> ProcessEvidence:
        ident = ProcessIdentity(pid, pid, ppid, pid * 10, 0.0, "b", "python", (), "")
        return ProcessEvidence(ident, role, None, None, "")

    mem = TreeMemory(selected=False)
    assert mem.observe([ev(10, 1, "api_server"), ev(11, 10), ev(12, 11)]) == ()
    assert mem.observe([ev(20, 1, "api_server"), ev(21, 20)]) == ()  # restarted: one tree
    assert [k.pid for k in tree_roots([ev(30, 1, "helper"), ev(31, 30), ev(32, 30)])] == [30]
    both = mem.observe([ev(20, 1, "api_server"), ev(40, 1)])
    assert [k.pid for k in both] == [20, 40]
    assert [k.pid for k in mem.observe([ev(40, 1)])] == [20, 40]  # one exited: still mixed
    assert TreeMemory(selected=True).observe([ev(20, 1), ev(40, 1)]) == ()
