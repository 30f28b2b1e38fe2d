"""``pycfile.compare`` over many pycs on every core: the bytecode check's compiles in parallel.

``compile`` holds the GIL, so threads do not help: the jobs are shared between this process
and helper interpreters (``sys.executable -I -S``, one per other core), each handed its part
as one marshalled list on stdin and answering one marshalled list of outcomes on stdout. A
helper runs this very ``compare`` with this very interpreter, so its outcomes are the ones
this process would compute; a helper that fails or answers anything else has its part
compiled here. Only what the standard library's ``marshal`` writes crosses the pipes (bytes,
strings, ints, booleans, tuples, None): the sources compiled are the target's, and compiling
source runs none of it.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from servewitness.evidence.pycfile import Outcome, compare

Job = tuple[bytes, bytes, str, int]  # the pyc (header included), its source, filename, level

# Below this many jobs, starting a helper costs more than it saves.
MIN_JOBS = 32
MAX_HELPERS = 3
TIMEOUT_S = 600.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_HELPER = (
    f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
    "from servewitness.evidence.compilers import serve; serve()"
)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def compare_all(
    jobs: Sequence[Job], helpers: int | None = None, here: Callable[..., Outcome] = compare
) -> list[Outcome]:
    """``compare`` of every job, in order: a part in this process (by HERE), the others in
    HELPERS helper interpreters (default: one per other core, at most MAX_HELPERS; none for
    fewer than MIN_JOBS jobs)."""
    if helpers is None:
        helpers = min(cores() - 1, MAX_HELPERS) if len(jobs) >= MIN_JOBS else 0
    if helpers <= 0:
        return [here(*job) for job in jobs]
    # the biggest sources first, dealt round-robin: parts of about the same work
    order = sorted(range(len(jobs)), key=lambda i: len(jobs[i][1]), reverse=True)
    parts = [order[k :: helpers + 1] for k in range(helpers + 1)]
    out: list[Outcome] = [None] * len(jobs)
    answers: list[list[Outcome] | None] = [None] * helpers

    def run(k: int) -> None:
        answers[k] = _in_helper([jobs[i] for i in parts[k + 1]])

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(helpers)]
    for t in threads:
        t.start()
    for i in parts[0]:
        out[i] = here(*jobs[i])
    for t in threads:
        t.join()
    for k, answer in enumerate(answers):
        indexes = parts[k + 1]
        # a helper that failed: its part is compiled here
        got = answer if answer is not None else [here(*jobs[i]) for i in indexes]
        for i, outcome in zip(indexes, got, strict=True):
            out[i] = outcome
    return out


def _in_helper(jobs: list[Job]) -> list[Outcome] | None:
    """The outcomes of JOBS computed by a helper interpreter (None: it failed)."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _HELPER],
            input=marshal.dumps(jobs),
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        # our own helper's answer, written by marshal.dumps below
        answer = marshal.loads(done.stdout) if done.returncode == 0 else None  # noqa: S302
    except (OSError, subprocess.SubprocessError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(answer, list) or len(answer) != len(jobs):
        return None
    if not all(a is None or _is_outcome(a) for a in answer):
        return None
    return answer


def _is_outcome(a: object) -> bool:
    return isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], bool) and isinstance(a[1], str)


def serve() -> None:
    """A helper's work: the jobs on stdin, their outcomes on stdout."""
    jobs = marshal.loads(sys.stdin.buffer.read())  # noqa: S302 - from the process that started us
    sys.stdout.buffer.write(marshal.dumps([compare(*job) for job in jobs]))
    sys.stdout.buffer.flush()
