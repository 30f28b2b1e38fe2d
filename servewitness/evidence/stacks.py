"""An out-of-process witness of which runner file executes: py-spy stack samples.

The probe says which runner class is live and counts its steps from inside the process. The
agent adds a witness that does not depend on the probe: while the process is running steps,
it takes a stack sample with ``py-spy dump --nonblocking`` (about 15 ms; it reads the
process's memory with ptrace rights, which a sidecar has with ``SYS_PTRACE``) and notes
whether any thread was executing in the runner's step file. Samples are taken only when the
step count moved since the previous report, so an idle server costs nothing. A sample catches
the step file only while a step executes: with a tiny model whose steps take a millisecond,
about one sample in fifteen does (measured on the CPU server); with real models most do.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from servewitness.model import StackWitness

TIMEOUT_S = 5.0


def py_spy() -> str | None:
    """The py-spy executable: on PATH, or beside this interpreter (a venv's bin)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else None


def dump_files(pid: int, exe: str) -> tuple[list[str], str | None]:
    """The file of every frame of every thread of PID now, or why there are none."""
    try:
        out = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--json", "--nonblocking", "--full-filenames"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"py-spy: {type(e).__name__}: {e}"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return [], f"py-spy exited {out.returncode}: {lines[-1] if lines else ''}"
    try:
        threads = json.loads(out.stdout)
        return [
            str(f.get("filename"))
            for t in threads
            for f in t.get("frames") or ()
            if isinstance(f, dict)
        ], None
    except (ValueError, AttributeError, TypeError) as e:
        return [], f"py-spy output not understood: {e}"


@dataclass
class _Book:
    last_steps: int = -1
    samples: int = 0
    hits: int = 0
    failures: int = 0
    files: Counter[str] = field(default_factory=Counter)
    error: str | None = None


class Witnesses:
    """Per process (pid, start ticks): samples taken while steps advanced, and how many of
    them caught a thread in the runner's step file."""

    def __init__(self, exe: str | None = None, *, search: bool = True, burst: int = 1) -> None:
        """EXE: py-spy's path; None: found with ``py_spy()`` (unless SEARCH is false).
        BURST: samples taken each time the steps moved."""
        self.exe = exe if exe is not None or not search else py_spy()
        self.burst = burst
        self._books: dict[tuple[int, int], _Book] = {}

    def observe(
        self, key: tuple[int, int], pid: int, total_steps: int, runner_file: str | None
    ) -> StackWitness:
        book = self._books.setdefault(key, _Book())
        moved = book.last_steps >= 0 and total_steps > book.last_steps
        book.last_steps = total_steps
        if self.exe is None:
            book.error = "py-spy not found (install it beside the agent)"
        elif moved:
            for _ in range(self.burst):
                files, error = dump_files(pid, self.exe)
                if error is not None:  # non-blocking samples can catch the process mid-update
                    book.failures += 1
                    book.error = f"{error} ({book.failures} samples failed)"
                    continue
                book.samples += 1
                book.files.update(set(files))
                if runner_file is not None and runner_file in files:
                    book.hits += 1
        return StackWitness(
            samples=book.samples,
            runner_file_hits=book.hits,
            runner_file=runner_file,
            top_files=tuple(f for f, _ in book.files.most_common(5)),
            error=book.error,
        )

    def forget(self, alive: set[tuple[int, int]]) -> None:
        for key in [k for k in self._books if k not in alive]:
            del self._books[key]
