"""Which container a process runs in, read from its ``/proc/<pid>/cgroup`` and ``mountinfo``.

The cgroup path is the primary witness: every runtime puts a container's processes in a cgroup
named after the container id (``/docker/<id>``, ``docker-<id>.scope``, ``cri-containerd-<id>
.scope``, ``crio-<id>.scope``, ``libpod-<id>.scope``, a bare ``<id>`` under ``/kubepods/...`` or a
containerd namespace). The innermost id on the path is the process's own container (docker in
docker, kind nodes: the outer ids are the enclosing containers). The path is relative to the
cgroup namespace of the process that *reads* the file: an agent in a private namespace sees
another container's process as ``/../<id>`` (captured here), and the names are still that
process's; only a runtime that a bare id's parent would have told may be cut off ("unknown").

When the process lives in a private cgroup namespace (the default with cgroup v2, and
``--cgroupns=private`` on v1) its cgroup file shows only ``0::/``: it names nothing. Then, and
only then, the mount table is asked: Docker and Podman bind-mount per-container files
(``/etc/hostname``, ``/etc/hosts``, ``/etc/resolv.conf``, ``/run/.containerenv``) from a
directory named after a container id, and that directory appears as the mount's *root* field.
This is weaker evidence and the reason it is only a fallback:

- a container that joined another's network namespace (``docker run --network container:A``)
  gets A's hostname/hosts/resolv.conf, so its mount table names A (checked on Docker 20.10);
- in every Kubernetes pod those files belong to the pod *sandbox* (the pause container), never
  to the container itself, whatever the runtime. Reporting the sandbox id as the container's id
  is a known bug in other tools (open-telemetry/opentelemetry-js#3614), so a mount table that
  shows kubelet pod mounts (``/var/lib/kubelet/pods/<uid>/...``) yields None here.

Decisions:

- a process in a *conmon* scope (``crio-conmon-<id>.scope``, ``libpod-conmon-<id>.scope``) is the
  runtime's monitor, which runs outside the container's namespaces: it is not in that container.
  Such a component is not a container boundary, so the walk goes on to the enclosing one (None on
  a host; the node container for CRI-O inside a Docker "node" container);
- cgroup v1 lines that name *different* containers are contradictory evidence: None, with no
  mountinfo fallback (:func:`resolve_container`), rather than a guess;
- ids in overlay layer paths (``/var/lib/docker/overlay2/<id>``), in mount *points* (the host
  sees every container's ``.../containers/<id>/mounts/shm``, ``.../k8s.io/<id>/rootfs``) and in
  mount options are never taken: only the root field of a mount on one of the known per-container
  files counts.

Nothing here raises on malformed input: what cannot be read says nothing (None).
:func:`container_of` reads both files of one process through ``/proc``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from servewitness.errors import UnavailableError
from servewitness.evidence.procfs import ProcFS

RUNTIMES: Final = ("docker", "containerd", "cri-o", "podman", "unknown")

_ID = r"[0-9a-f]{64}"
# One cgroup path component that names a container: an optional "<prefix>-", the id, and an
# optional ".scope" (systemd driver). The prefix says the runtime; "...conmon-" is the monitor.
_COMPONENT = re.compile(rf"^(?:(?P<prefix>[a-z0-9_.-]+)-)?(?P<id>{_ID})(?:\.scope)?$")
_PREFIX_RUNTIME: Final = {
    "docker": "docker",
    "cri-containerd": "containerd",
    "nerdctl": "containerd",
    "crio": "cri-o",
    "libpod": "podman",
}
# The parent of a bare "<id>" component, for runtimes whose cgroupfs driver adds no prefix:
# Docker's "/docker/<id>", containerd's "/<namespace>/<id>" for its usual namespaces.
_PARENT_RUNTIME: Final = {"docker": "docker", "default": "containerd", "k8s.io": "containerd"}
_MONITOR_SUFFIX = "conmon"
# A kubelet pod cgroup: "pod<uid>" (cgroupfs) or "kubepods[-<qos>]-pod<uid_with_underscores>
# .slice" (systemd). Static pods' uids are the 32-hex hash of their manifest, without dashes.
_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"^(?:[a-z0-9_.-]*-)?pod(?P<uid>{_UUID}|[0-9a-f]{{32}})(?:\.slice)?$")
_CGROUP_LINE = re.compile(r"^(?P<key>\d+:[^:]*):(?P<path>/.*)$")

# mountinfo: the mount root of a per-container file, by runtime, with the mount points it is
# bound to. Docker: <data-root>/containers/<id>/{hostname,hosts,resolv.conf} (the root field is
# relative to the filesystem, so <data-root> may be cut off: match from "containers/").
_DOCKER_FILE = re.compile(rf"(?:^|/)containers/(?P<id>{_ID})/(?:hostname|hosts|resolv\.conf)$")
_PODMAN_ENV = re.compile(rf"(?:^|/)overlay-containers/(?P<id>{_ID})/userdata/\.containerenv$")
_PODMAN_FILE = re.compile(
    rf"(?:^|/)overlay-containers/(?P<id>{_ID})/userdata/(?:hostname|hosts|resolv\.conf)$"
)
_ETC_FILES: Final = frozenset({"/etc/hostname", "/etc/hosts", "/etc/resolv.conf"})
_CONTAINERENV = "/run/.containerenv"
# A kubelet-managed mount (etc-hosts, termination log, volumes): the process is in a pod. The
# kubelet's root (/var/lib/kubelet) may be cut off like Docker's data-root, so match from pods/.
_KUBELET_POD = re.compile(
    rf"(?:^|/)pods/(?:{_UUID}|[0-9a-f]{{32}})/(?:etc-hosts$|containers/|volumes/|volume-subpaths/)"
)
_OCTAL = re.compile(r"\\([0-7]{3})")
_MOUNTINFO_MIN_FIELDS = 10  # 6 fixed, "-", fstype, source, super options


@dataclass(frozen=True)
class ContainerRef:
    """A process's container. RUNTIME: one of :data:`RUNTIMES`, from the naming scheme (a bare
    id under a pod, or under a parent the reader cannot see, says no runtime: "unknown").
    SOURCE: "cgroup" or "mountinfo" (the weaker one, see the module docstring). POD_UID: the
    Kubernetes pod, with dashes, when the container's cgroup sits in a kubelet pod cgroup."""

    id: str
    runtime: str
    source: str
    pod_uid: str | None = None


class _Ambiguous:
    """Marker: the evidence names more than one container."""


_AMBIGUOUS: Final = _Ambiguous()


def _component(part: str, parent: str) -> tuple[str, str] | None:
    """(id, runtime) if the cgroup path component PART names a container, runtime "" for a
    monitor (conmon) scope; None if it names none. PARENT: the component above it."""
    m = _COMPONENT.match(part)
    if m is None:
        return None
    prefix = m.group("prefix")
    if prefix is None:
        runtime = _PARENT_RUNTIME.get(parent, "unknown")
    elif prefix.endswith(_MONITOR_SUFFIX):
        runtime = ""
    else:
        runtime = _PREFIX_RUNTIME.get(prefix, "unknown")
    return m.group("id"), runtime


def _pod_uid(parent: str) -> str | None:
    """The Kubernetes pod uid if PARENT, the cgroup directly above a container's, is a kubelet
    pod cgroup (the kubelet always puts containers directly in their pod's cgroup). The path
    may not show "kubepods" at all when read from a private cgroup namespace (``/../pod<uid>``),
    so the pod's own name is what counts."""
    m = _POD.match(parent)
    return m.group("uid").replace("_", "-") if m else None


def _components(path: str) -> list[str]:
    """The names along a cgroup path. ".." is dropped: the path is relative to the *reader's*
    cgroup namespace, so another container's process read from a private namespace shows as
    ``/../<id>``, and the names after it are still that process's. A systemd-style
    ``slice:prefix:id`` name (runc given a systemd cgroupsPath under cgroupfs) is the slice and
    ``prefix-id``, as the systemd driver would have named them."""
    parts: list[str] = []
    for p in path.split("/"):
        if p in ("", ".", ".."):
            continue
        fields = p.split(":")
        if len(fields) == 3 and all(fields):
            parts += [fields[0], f"{fields[1]}-{fields[2]}"]
        else:
            parts.append(p)
    return parts


def _from_cgroup_path(path: str) -> ContainerRef | None:
    parts = _components(path)
    for i in range(len(parts) - 1, -1, -1):
        parent = parts[i - 1] if i else ""
        found = _component(parts[i], parent)
        if found is None or not found[1]:  # no id here, or a conmon scope: not a container
            continue
        return ContainerRef(found[0], found[1], "cgroup", _pod_uid(parent))
    return None


def _merge(refs: list[ContainerRef]) -> ContainerRef | _Ambiguous | None:
    """One ref from the per-line (or per-mount) refs: None if none, ambiguous if they name
    different containers or pods; otherwise the most specific runtime and the pod uid."""
    if not refs:
        return None
    if len({r.id for r in refs}) > 1:
        return _AMBIGUOUS
    pods = {r.pod_uid for r in refs if r.pod_uid is not None}
    if len(pods) > 1:
        return _AMBIGUOUS
    known = [r for r in refs if r.runtime != "unknown"]
    best = (known or refs)[0]
    return ContainerRef(best.id, best.runtime, best.source, next(iter(pods), None))


def _cgroup_verdict(text: str) -> ContainerRef | _Ambiguous | None:
    refs: list[ContainerRef] = []
    for line in text.splitlines():
        m = _CGROUP_LINE.match(line.strip())
        if m is None:
            continue
        ref = _from_cgroup_path(m.group("path"))
        if ref is not None:
            refs.append(ref)
    return _merge(refs)


def container_from_cgroup(text: str) -> ContainerRef | None:
    """The container named by a ``/proc/<pid>/cgroup`` file (v1 ``hier:controllers:path`` or v2
    ``0::path`` lines), or None: a host process, a private cgroup namespace (``0::/``), lines
    that name different containers, or text that is not a cgroup file."""
    verdict = _cgroup_verdict(text)
    return verdict if isinstance(verdict, ContainerRef) else None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as 3-digit octal (``\\040``)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mounts(text: str) -> list[tuple[str, str]]:
    """(root, mount point) of every well-formed mountinfo line."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < _MOUNTINFO_MIN_FIELDS or "-" not in fields[6:]:
            continue
        out.append((_unescape(fields[3]), _unescape(fields[4])))
    return out


def _mountinfo_verdict(text: str) -> ContainerRef | _Ambiguous | None:
    mounts = _mounts(text)
    if any(_KUBELET_POD.search(root) for root, _ in mounts):
        return None  # a pod: the runtime's files name its sandbox, not this container
    # .containerenv is written per container by Podman (it holds the container's own id), so it
    # outranks the network files, which a container may share with another's network namespace.
    env = [
        ContainerRef(m.group("id"), "podman", "mountinfo")
        for root, point in mounts
        if point == _CONTAINERENV and (m := _PODMAN_ENV.search(root))
    ]
    if env:
        return _merge(env)
    files: list[ContainerRef] = []
    for root, point in mounts:
        if point not in _ETC_FILES:
            continue
        if m := _DOCKER_FILE.search(root):
            files.append(ContainerRef(m.group("id"), "docker", "mountinfo"))
        elif m := _PODMAN_FILE.search(root):
            files.append(ContainerRef(m.group("id"), "podman", "mountinfo"))
    return _merge(files)


def container_from_mountinfo(text: str) -> ContainerRef | None:
    """The container whose per-container files a ``/proc/<pid>/mountinfo`` shows bind-mounted,
    or None (a host's mount table, a Kubernetes pod, files of different containers, garbage).
    Weaker than the cgroup: see the module docstring."""
    verdict = _mountinfo_verdict(text)
    return verdict if isinstance(verdict, ContainerRef) else None


def resolve_container(cgroup_text: str | None, mountinfo_text: str | None) -> ContainerRef | None:
    """The process's container: from the cgroup file; from the mount table only when the cgroup
    file (None: unreadable) names no container at all. A cgroup file that names two containers
    is contradictory and stays None: the mount table does not get to break the tie."""
    if cgroup_text is not None:
        verdict = _cgroup_verdict(cgroup_text)
        if isinstance(verdict, ContainerRef):
            return verdict
        if verdict is _AMBIGUOUS:
            return None
    if mountinfo_text is None:
        return None
    return container_from_mountinfo(mountinfo_text)


def _parent(path: str) -> tuple[str, ...]:
    """The cgroup above PATH, as relative to the reader's cgroup namespace as PATH is: ".."
    components that climb above the reader's root are kept ("/" -> (".."), "/../a" -> (".."))."""
    out: list[str] = []
    for part in [*path.split("/"), ".."]:
        if part in ("", "."):
            continue
        if part == ".." and out and out[-1] != "..":
            out.pop()
        else:
            out.append(part)
    return tuple(out)


def _paths(text: str) -> dict[str, str]:
    """Hierarchy ("<id>:<controllers>") -> path, for every well-formed cgroup line."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _CGROUP_LINE.match(line.strip())
        if m is not None:
            out[m.group("key")] = m.group("path")
    return out


def next_to_reader(cgroup_text: str, own_cgroup_text: str) -> bool:
    """Whether the process whose ``/proc/<pid>/cgroup`` is CGROUP_TEXT sits in a cgroup directly
    beside the reader's own (OWN_CGROUP_TEXT: the reader's ``/proc/self/cgroup``), both read by
    the same process: the same parent in every hierarchy both files show. In a Kubernetes pod
    the kubelet puts every container's cgroup directly in the pod's, so beside a container of
    the pod means in the pod, also where a private cgroup namespace hides the pod's name (the
    other container then reads as ``/../<id>``, the reader itself as ``/``); a container of
    any other pod, or of no pod, is further away (``/../../pod<uid>/<id>``). A runtime that
    nests the payload one level deeper (crun's ``.../<id>.scope/container``) is not beside
    it: False, never a guess."""
    mine, theirs = _paths(own_cgroup_text), _paths(cgroup_text)
    common = sorted(set(mine) & set(theirs))
    return bool(common) and all(_parent(mine[k]) == _parent(theirs[k]) for k in common)


def container_id_from_cgroup(text: str) -> str | None:
    """The container id named by a process's cgroup file, or None (host process). Kept for
    callers that want only the id; see :func:`container_from_cgroup`."""
    ref = container_from_cgroup(text)
    return ref.id if ref is not None else None


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
