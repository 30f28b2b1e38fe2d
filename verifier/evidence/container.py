"""Container identity from ``/proc/<pid>/cgroup`` (cgroup v1 and v2 path formats)."""

from __future__ import annotations

import re

# A 64-hex container id inside a cgroup path: docker-<id>.scope, /docker/<id>, cri-containerd-<id>,
# crio-<id>, kubepods .../<id>. Taken from the last path component that has one.
_ID = re.compile(r"(?:^|[/\-:])([0-9a-f]{64})(?:\.scope)?$")


def container_id_from_cgroup(text: str) -> str | None:
    """The container id named by a process's cgroup file, or None (host process)."""
    for line in text.splitlines():
        _, _, path = line.partition(":")  # hierarchy-id
        _, _, path = path.partition(":")  # controllers
        for part in reversed(path.split("/")):
            m = _ID.search(part)
            if m:
                return m.group(1)
    return None
