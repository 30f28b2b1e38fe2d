"""Whether the hooks a process declared are the ones its server was started with.

The attack (found by a black-box attacker, 2026-12-05): a policy names a hook (``v2_step``),
and what that hook means is the ``VERIFIER_HOOKS`` the server was started with
(``v2_step=vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model``). A
``sitecustomize`` in the server rewrote ``os.environ["VERIFIER_HOOKS"]`` before the probe read
it, so ``v2_step`` sat on the V1 runner's method, which runs: the dead-hook policy PASSed.

``/proc/<pid>/environ`` keeps the block the server was exec'd with (a change to
``os.environ`` does not write there), and the processes it spawns inherit what it changed.
The agent compares every env-declared hook of every process it reports with the
``VERIFIER_HOOKS`` of the tree's root as it was started: a hook declared on another target,
or not declared there, is said (``evidence.unobservable``: no PASS while it holds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from servewitness.evidence.process import ProcessEvidence


def declared(value: str) -> dict[str, str]:
    """``name -> target`` of a VERIFIER_HOOKS value (entries ``name=target`` split on
    commas; what does not parse is left out: the probe reports it)."""
    out: dict[str, str] = {}
    for entry in value.split(","):
        name, sep, target = entry.strip().partition("=")
        if sep and name.strip() and target.strip():
            out.setdefault(name.strip(), target.strip())
    return out


def hook_problems(
    found: list[ProcessEvidence], started_env: Callable[[int], Mapping[str, str]]
) -> list[str]:
    """Each env-declared hook of FOUND whose target is not what its tree root was started
    with. STARTED_ENV(pid): the environment PID was started with."""
    by_pid = {p.identity.pid: p for p in found}
    roots: dict[int, dict[str, str] | None] = {}
    out: list[str] = []
    for p in found:
        if p.probe is None:
            continue
        top = p
        seen = {p.identity.pid}
        while top.identity.ppid in by_pid and top.identity.ppid not in seen:
            top = by_pid[top.identity.ppid]
            seen.add(top.identity.pid)
        root = top.identity.pid
        if root not in roots:
            env = started_env(root)
            roots[root] = declared(env.get("VERIFIER_HOOKS", "")) if env else None
        want = roots[root]
        if want is None:
            continue  # the root's environment could not be read: nothing to compare with
        for h in p.probe.hooks:
            if h.source != "env":
                continue
            if h.name not in want:
                out.append(
                    f"hook {h.name} is declared in pid {p.identity.pid} on {h.target}, but the "
                    f"server (pid {root}) was started without it in VERIFIER_HOOKS: the "
                    "process declared its own hook"
                )
            elif want[h.name] != h.target:
                out.append(
                    f"hook {h.name} is declared in pid {p.identity.pid} on {h.target}, but the "
                    f"server (pid {root}) was started with {h.name}={want[h.name]}: the process "
                    "changed what the hook means"
                )
    return out
