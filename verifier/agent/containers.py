"""The agent's view of containers: which one each reported process runs in (its cgroup, else
its mountinfo) and, when a Docker API socket is reachable, what the daemon says about it.

The Docker API is optional: without it a report still carries every container id, with
``docker_error`` saying why it has no name (so a policy that binds a target by name or label
answers PENDING with that reason instead of guessing).
"""

from __future__ import annotations

import structlog

from verifier.errors import UnavailableError
from verifier.evidence.container import ContainerRef, resolve_container
from verifier.evidence.docker_api import (
    ContainerNotFound,
    DockerAPI,
    DockerResponseError,
    DockerUnavailable,
)
from verifier.evidence.procfs import ProcFS
from verifier.model import ContainerInfo

log = structlog.get_logger("verifier.agent")


def container_of(procfs: ProcFS, pid: int) -> ContainerRef | None:
    """PID's container, or None (a host process, or /proc would not say)."""
    try:
        cgroup = procfs.cgroup(pid)
    except (UnavailableError, OSError):
        cgroup = None
    try:
        mountinfo = procfs.mountinfo(pid)
    except (UnavailableError, OSError):
        mountinfo = None
    return resolve_container(cgroup, mountinfo)


class ContainerDirectory:
    """Describes containers for reports. SOCKET: the Docker API's unix socket (None: do not
    ask). A daemon that stops answering is reported per container, and logged once per
    change of reason rather than on every report."""

    def __init__(self, socket_path: str | None) -> None:
        self.socket_path = socket_path
        self.api = DockerAPI(socket_path) if socket_path else None
        self._last_problem: str | None = None

    def describe(self, refs: list[ContainerRef]) -> tuple[ContainerInfo, ...]:
        out: dict[str, ContainerInfo] = {}
        for ref in refs:
            if ref.id not in out:
                out[ref.id] = self._describe(ref)
        return tuple(out.values())

    def _describe(self, ref: ContainerRef) -> ContainerInfo:
        base = ContainerInfo(ref.id, ref.runtime, ref.source, ref.pod_uid)
        if self.api is None:
            return self._problem(base, "the agent was started without a Docker API socket")
        try:
            c = self.api.inspect(ref.id)
        except DockerUnavailable as e:
            return self._problem(base, f"Docker API unavailable: {e}")
        except ContainerNotFound:
            return self._problem(base, f"the Docker daemon at {self.socket_path} does not know it")
        except (DockerResponseError, ValueError) as e:
            return self._problem(base, f"the Docker API answered badly: {e}")
        self._last_problem = None
        return ContainerInfo(
            ref.id,
            ref.runtime,
            ref.source,
            ref.pod_uid,
            name=c.name,
            image=c.image,
            image_id=c.image_id,
            image_digests=c.image_digests,
            labels=tuple(sorted(c.labels.items())),
            restart_count=c.restart_count,
            started_at=c.started_at,
        )

    def _problem(self, base: ContainerInfo, why: str) -> ContainerInfo:
        if why != self._last_problem:
            log.warning("container_undescribed", container=base.id[:12], why=why)
            self._last_problem = why
        return ContainerInfo(base.id, base.runtime, base.source, base.pod_uid, docker_error=why)
