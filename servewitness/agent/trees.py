"""Independent vLLM process trees under one target.

A target is one serving deployment: an API server and the engine cores and workers it
started, all descendants of one vLLM process. An agent started without ``--pid`` reports
every vLLM process it can see, so on a host (or in a PID namespace) that runs two servers it
merges both under one name, and a PASS can rest on the other server's evidence while the
user's own has crashed. The agent therefore groups what it found by ``ppid`` chains: a
process's tree root is its topmost ancestor that is itself a reported vLLM process; two
serving processes (``api_server``, ``offline``, ``engine_core``, ``worker``) with different
roots are two servers. Helpers and unknown processes (a ``vllm bench`` client, a resource
tracker) are not servers and are left out.

Once two trees were seen at the same time, the agent remembers it for its life and names
every serving tree it sees from then on (``TargetReport.mixed_roots``): the policy's
``evidence.target.mixed`` keeps the gate from PASS even after one of them exits (the crashed
server of the issue). A server restarted in place (its old tree gone before the new one
starts) is one tree at a time and never mixed. ``--pid`` selects a tree: nothing is mixed.
"""

from __future__ import annotations

from collections.abc import Iterable

from servewitness.evidence.process import ProcessEvidence
from servewitness.model import ProcessKey

SERVING_ROLES = frozenset({"api_server", "offline", "engine_core", "worker"})


def tree_roots(found: Iterable[ProcessEvidence]) -> list[ProcessKey]:
    """The roots of the distinct trees the serving processes of FOUND belong to, by pid."""
    procs = list(found)
    by_pid = {p.identity.pid: p for p in procs}
    roots: dict[int, ProcessKey] = {}
    for p in procs:
        if p.role not in SERVING_ROLES:
            continue
        top, seen = p, {p.identity.pid}
        while top.identity.ppid in by_pid and top.identity.ppid not in seen:
            top = by_pid[top.identity.ppid]
            seen.add(top.identity.pid)
        i = top.identity
        roots[i.pid] = ProcessKey(i.boot_id, i.pid, i.start_ticks)
    return [roots[pid] for pid in sorted(roots)]


class TreeMemory:
    """What the agent remembers of the trees it saw: every serving tree root since two were
    first seen at once (empty until then, and always when the agent was given ``--pid``)."""

    def __init__(self, selected: bool) -> None:
        self.selected = selected
        self.mixed: dict[ProcessKey, None] = {}

    def observe(self, found: Iterable[ProcessEvidence]) -> tuple[ProcessKey, ...]:
        """Note the trees of one collect; the roots to report as mixed (empty: not mixed)."""
        if self.selected:
            return ()
        roots = tree_roots(found)
        if len(roots) > 1 or self.mixed:
            self.mixed.update(dict.fromkeys(roots))
        return tuple(self.mixed)
