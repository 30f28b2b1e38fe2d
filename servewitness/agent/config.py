"""What ``verifier agent`` is told: its verifier, its target and identity, its spool, its
endpoints; and the agent id it takes when not given one."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from servewitness.evidence.docker_api import DEFAULT_SOCKET
from servewitness.security.tls import ClientTLS


@dataclass(frozen=True)
class AgentConfig:
    verifier: str  # gRPC target
    target: str  # the name this target is reported under
    agent_id: str
    spool_dir: Path
    spool_max_bytes: int = 64 * 1024 * 1024
    interval_s: float | None = None  # None: what the verifier asks for
    root_pid: int | None = None
    proc_root: str = "/proc"
    health_listen: str | None = None
    max_backoff_s: float = 30.0
    recheck_s: float = 5.0  # re-hash every manifest file at least this often (drift detection)
    docker_socket: str | None = DEFAULT_SOCKET  # the Docker API, to name containers (None: no)
    tls: ClientTLS | None = None  # None: insecure (warned)
    metrics_listen: str | None = None  # HOST:PORT: Prometheus metrics over HTTP (metrics.py)
    # Keep compile verdicts by content in spool_dir across restarts
    # (servewitness/evidence/verdicts.py)
    compile_cache: bool = True
    # Keep each process's static judgement in spool_dir across restarts
    # (servewitness/evidence/judgements.py)
    judgement_cache: bool = True
    # One report per container, each as the instance TARGET/<container id> (--instance-per-
    # container): N serving containers in one PID namespace are N targets, not one mixed one
    per_container: bool = False


def default_agent_id(target: str) -> str:
    return f"{socket.gethostname()}/{target}"
