"""The out-of-process witness: the agent's py-spy stack samples of the real server's worker
catch it executing in the live runner's step file while requests are served, and the policy's
`[runner] witness = true` rests on that; without samples it stays PENDING."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence.stacks import Witnesses, dump_files, py_spy
from servewitness.model import ProcessReport
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy import findings as F
from servewitness.testing.vllm_server import VllmServer
from tests.helpers import PRISTINE_VLLM_CPU

pytestmark = pytest.mark.vllm

POLICY = (
    'version = 1\n[runner]\nexpect_class = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"\n'
    "witness = true\n" + PRISTINE_VLLM_CPU
)


def collect_under_load(server: VllmServer, tmp_path: Path, reports: int) -> list[ProcessReport]:
    """The agent's last report once a stack sample caught the worker's runner step file, or
    after REPORTS warm collects (the first, cold, one hashes every file), while a client keeps
    the server decoding four sequences at a time. A sample catches the step file only while
    a step executes (about one sample in fifteen with this tiny model, less on a busy
    machine), so the test samples until it does, within a bound."""
    # No periodic re-hash of every loaded file (recheck_s, drift detection: not what this
    # test is about): each collect is then a few stack samples, and the two cores serve the
    # load instead of hashing torch every five seconds.
    config = AgentConfig(
        "127.0.0.1:9", "t", "a", tmp_path / "spool", root_pid=server.pid, recheck_s=3600.0
    )
    agent = Agent(config)
    agent.judged.witnesses = Witnesses(burst=8)  # eight samples each time the steps moved
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            server.complete("witness me", max_tokens=64, n=4, temperature=1.0, seed=1)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        report = agent.collect()
        for _ in range(reports):
            time.sleep(0.2)
            report = agent.collect()
            if any(p.stack_witness and p.stack_witness.runner_file_hits for p in report.processes):
                break
    finally:
        stop.set()
        t.join(timeout=60)
        agent.channel.close()
    return list(report.processes)


def judge(procs: list[ProcessReport]) -> list[tuple[str, str]]:
    snap = TargetSnapshot("w", tuple(procs), time.time())
    v = load_policy(POLICY).evaluate_target(snap, now=snap.received_unix)
    return [(f.id, f.severity.value) for f in v.findings if f.id.startswith("liveness.runner")]


def test_stack_samples_catch_the_runner_step_file(vllm_server: VllmServer, tmp_path: Path) -> None:
    assert py_spy() is not None, "py-spy is a dependency of the dev environment"
    procs = collect_under_load(vllm_server, tmp_path, reports=100)
    (worker,) = [p for p in procs if p.role == "worker"]
    w = worker.stack_witness
    assert w is not None and w.samples > 0, w
    assert worker.runner is not None and w.runner_file == worker.runner.file
    assert (w.runner_file or "").endswith("vllm/v1/worker/gpu_model_runner.py")
    assert 0 < w.runner_file_hits <= w.samples
    assert judge(procs) == [(F.RUNNER_WITNESSED, "info")]
    # the control: the same evidence without the samples is not a pass
    bare = [dataclasses.replace(p, stack_witness=None) for p in procs]
    assert judge(bare) == [(F.RUNNER_UNWITNESSED, "pending")]


def test_no_py_spy_and_no_process_are_reasons_not_crashes() -> None:
    w = Witnesses(search=False)
    first = w.observe((1, 1), 1, 0, "/x.py")
    second = w.observe((1, 1), 1, 5, "/x.py")
    assert (second.samples, second.error) == (0, "py-spy not found (install it beside the agent)")
    assert first.samples == 0
    exe = py_spy()
    assert exe is not None
    files, error = dump_files(2**22 + 12345, exe)  # no such pid
    assert files == [] and error is not None and "py-spy exited" in error
