"""The agent's view of containers: which one each reported process runs in (its cgroup, else
its mountinfo) and, when a Docker API socket is reachable, what the daemon says about it.

The Docker API is optional: without it a report still carries every container id, with
``docker_error`` saying why it has no name (so a policy that binds a target by name or label
answers PENDING with that reason instead of guessing).

In Kubernetes there is no Docker API to ask. There the agent is told its own pod through the
downward API (:class:`OwnPod`: ``VERIFIER_POD_UID`` and friends, and the pod's labels as a file)
and gives a container those labels only when ``/proc`` places the container in that very pod:
its cgroup names the same pod uid, or (a private cgroup namespace hides the pod's name) its
cgroup sits directly beside the agent's own, where the kubelet puts the containers of one pod
and nothing else. A ``label:KEY=VALUE`` binding in the policy then works as it does with Docker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from servewitness.errors import UnavailableError
from servewitness.evidence.container import ContainerRef, next_to_reader
from servewitness.evidence.docker_api import (
    ContainerNotFound,
    DockerAPI,
    DockerResponseError,
    DockerUnavailable,
)
from servewitness.evidence.procfs import ProcFS
from servewitness.model import ContainerInfo

log = structlog.get_logger("servewitness.agent")

# The agent's own pod, from the downward API (deploy/k8s/base/vllm.yaml): fieldRef metadata.uid,
# metadata.name, metadata.namespace, and the path of a downwardAPI volume file of
# metadata.labels.
POD_UID_ENV: Final = "VERIFIER_POD_UID"
POD_NAME_ENV: Final = "VERIFIER_POD_NAME"
POD_NAMESPACE_ENV: Final = "VERIFIER_POD_NAMESPACE"
POD_LABELS_ENV: Final = "VERIFIER_POD_LABELS"
# The keys the CRI runtimes (containerd, CRI-O, cri-dockerd) label every container with. They
# are set from the downward API fields and win over a pod label of the same key.
POD_UID_LABEL: Final = "io.kubernetes.pod.uid"
POD_NAME_LABEL: Final = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL: Final = "io.kubernetes.pod.namespace"
_LABELS_MAX_BYTES: Final = 256 * 1024
_LABELS_MAX: Final = 256  # the wire takes 512 per container
# A downward API labels file: one `key="value"` line per label (Go's %q; label values are
# [A-Za-z0-9._-], at most 63 characters, so nothing in them is ever escaped).
_LABEL_LINE = re.compile(
    r'(?P<key>[A-Za-z0-9][A-Za-z0-9._/-]{0,316})="(?P<value>[A-Za-z0-9._-]{0,63})"'
)


def parse_downward_labels(text: str) -> dict[str, str]:
    """The labels in a downward API ``metadata.labels`` file. Raises ValueError on any line
    that is not a label (a wrong file is not half-read)."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        m = _LABEL_LINE.fullmatch(line)
        if m is None:
            raise ValueError(f'line {n} is not key="value": {line[:80]!r}')
        out[m.group("key")] = m.group("value")
    if len(out) > _LABELS_MAX:
        raise ValueError(f"{len(out)} labels, more than {_LABELS_MAX}")
    return out


def _uid(value: str) -> str:
    """A pod uid compared as the cgroup and the API spell it alike (dashes, case)."""
    return value.strip().lower().replace("-", "").replace("_", "")


@dataclass(frozen=True)
class OwnPod:
    """The Kubernetes pod the agent runs in, as the downward API tells it. LABELS_FILE: a
    ``downwardAPI`` volume file of ``metadata.labels`` (None: only uid, name and namespace)."""

    uid: str
    name: str | None = None
    namespace: str | None = None
    labels_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OwnPod | None:
        """The pod ENV names (None without ``VERIFIER_POD_UID``: not told, not guessed)."""
        uid = env.get(POD_UID_ENV, "").strip()
        if not uid:
            return None
        labels = env.get(POD_LABELS_ENV, "").strip()
        return cls(
            uid,
            env.get(POD_NAME_ENV, "").strip() or None,
            env.get(POD_NAMESPACE_ENV, "").strip() or None,
            Path(labels) if labels else None,
        )

    def is_pod(self, pod_uid: str) -> bool:
        return _uid(pod_uid) == _uid(self.uid)

    def labels(self) -> tuple[tuple[str, str], ...]:
        """The pod's labels, and its uid, name and namespace under the runtimes' keys.
        Raises OSError (the file) or ValueError (its contents)."""
        out: dict[str, str] = {}
        if self.labels_file is not None:
            with self.labels_file.open("rb") as f:
                data = f.read(_LABELS_MAX_BYTES + 1)
            if len(data) > _LABELS_MAX_BYTES:
                raise ValueError(f"larger than {_LABELS_MAX_BYTES} bytes")
            out = parse_downward_labels(data.decode("utf-8"))
        out[POD_UID_LABEL] = self.uid
        if self.name:
            out[POD_NAME_LABEL] = self.name
        if self.namespace:
            out[POD_NAMESPACE_LABEL] = self.namespace
        return tuple(sorted(out.items()))


class ContainerDirectory:
    """Describes containers for reports. SOCKET: the Docker API's unix socket (None: do not
    ask). POD: the agent's own Kubernetes pod (None: not in one, or not told), whose labels
    describe a container that PROCFS places in it when the Docker API cannot. A daemon that
    stops answering is reported per container, and logged once per change of reason rather
    than on every report."""

    def __init__(
        self, socket_path: str | None, pod: OwnPod | None = None, procfs: ProcFS | None = None
    ) -> None:
        self.socket_path = socket_path
        self.api = DockerAPI(socket_path) if socket_path else None
        self.pod = pod
        self.procfs = procfs
        self._last_problem: str | None = None

    def describe(
        self, refs: list[ContainerRef], pids: Mapping[str, int] | None = None
    ) -> tuple[ContainerInfo, ...]:
        """REFS described; PIDS: container id -> a pid that runs in it (to place it in a pod)."""
        out: dict[str, ContainerInfo] = {}
        for ref in refs:
            if ref.id not in out:
                out[ref.id] = self._describe(ref, (pids or {}).get(ref.id))
        return tuple(out.values())

    def _describe(self, ref: ContainerRef, pid: int | None) -> ContainerInfo:
        base = ContainerInfo(ref.id, ref.runtime, ref.source, ref.pod_uid)
        if self.api is None:
            why = "the agent was started without a Docker API socket"
        else:
            try:
                c = self.api.inspect(ref.id)
            except DockerUnavailable as e:
                why = f"Docker API unavailable: {e}"
            except ContainerNotFound:
                why = f"the Docker daemon at {self.socket_path} does not know it"
            except (DockerResponseError, ValueError) as e:
                why = f"the Docker API answered badly: {e}"
            else:
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
        labels, not_pod = self._pod_labels(ref, pid)
        if labels is not None:
            self._last_problem = None
            return ContainerInfo(
                ref.id, ref.runtime, ref.source, ref.pod_uid, labels=labels, docker_error=why
            )
        return self._problem(base, f"{why}; {not_pod}" if not_pod else why)

    def _pod_labels(
        self, ref: ContainerRef, pid: int | None
    ) -> tuple[tuple[tuple[str, str], ...] | None, str | None]:
        """(the agent's pod's labels, None) when REF runs in the agent's own pod; else (None,
        why not, or None when there is nothing about pods to say)."""
        pod = self.pod
        if pod is None:
            if ref.pod_uid is None:
                return None, None
            return None, (
                f"it runs in Kubernetes pod {ref.pod_uid}, and the agent was not told its own "
                f"pod ({POD_UID_ENV} from the downward API) to name it by"
            )
        if ref.pod_uid is not None:
            if not pod.is_pod(ref.pod_uid):
                return None, f"it runs in pod {ref.pod_uid}, not in the agent's pod {pod.uid}"
        else:
            away = self._away_from_pod(ref, pid, pod)
            if away:
                return None, away
        try:
            return pod.labels(), None
        except (OSError, ValueError, UnicodeDecodeError) as e:
            where = pod.labels_file
            return None, f"the labels of the agent's pod {pod.uid} are unreadable ({where}: {e})"

    def _away_from_pod(self, ref: ContainerRef, pid: int | None, pod: OwnPod) -> str | None:
        """None when REF (whose cgroup names no pod) sits beside the agent's own container, so
        in the agent's pod; else why it is not known to."""
        if ref.source != "cgroup" or pid is None or self.procfs is None:
            return f"nothing places it in the agent's pod {pod.uid} (its cgroup names no pod)"
        try:
            theirs = self.procfs.cgroup(pid)
            mine = (self.procfs.root / "self" / "cgroup").read_text(errors="replace")
        except (UnavailableError, OSError) as e:
            return f"its cgroup could not be compared with the agent's own: {e}"
        if next_to_reader(theirs, mine):
            return None
        return (
            f"its cgroup names no pod and is not beside the agent's own container's, so it is "
            f"not known to run in the agent's pod {pod.uid}"
        )

    def _problem(self, base: ContainerInfo, why: str) -> ContainerInfo:
        if why != self._last_problem:
            log.warning("container_undescribed", container=base.id[:12], why=why)
            self._last_problem = why
        return ContainerInfo(base.id, base.runtime, base.source, base.pod_uid, docker_error=why)
