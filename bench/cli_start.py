"""What starting the ``verifier`` CLI costs, and what writing a large ``--json`` result costs.

Scripts and CI loops run ``verifier status``/``wait``/``run``/``audit`` by the hundred (the
suite alone some thousand times), so a command's start is paid again and again. Arms, in
fresh interpreters, interleaved over ROUNDS rounds, wall ms per start:
  python                 ``python -c pass``: the floor of any Python command (the baseline)
  verifier wait --help   a named command: its module alone is imported (what ships)
  verifier --help        every command's module imported (what each start cost before)
The ratios against ``python`` price the CLI's own imports; ``--help`` keeps the command from
doing anything else (no verifier is asked).

Output: ``fmt.TerminalSafe`` (what every command writes through) in this process, ms per write
of an ``inspect --tree --json``-like text (SIZE characters of indented JSON), against a plain
write of the same text to a file (the baseline: encoding and writing, what stdout costs
anyway): the text with nothing to escape (its check runs in C) and with one escape sequence on
its last line (then every character is walked in Python).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

ROUNDS = 15
WRITE_ROUNDS = 7
SIZE = 10_000_000
VERIFIER = [sys.executable, "-m", "servewitness"]
ARMS = {
    "python": [sys.executable, "-c", "pass"],
    "verifier wait --help": [*VERIFIER, "wait", "--help"],
    "verifier --help": [*VERIFIER, "--help"],
}


def _start_ms(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=_smoke.REPO)
    return (time.perf_counter() - t0) * 1e3


def starts() -> None:
    for argv in ARMS.values():
        _start_ms(argv)  # warm: the page cache
    results: dict[str, list[float]] = {k: [] for k in ARMS}
    for _ in range(ROUNDS):
        for name, argv in ARMS.items():
            results[name].append(_start_ms(argv))
    s = {k: summary(v) for k, v in results.items()}
    print(f"start: {ROUNDS} interleaved rounds, wall ms per start")
    print_rows(s)
    base = s["python"]["median"]
    for name in ("verifier wait --help", "verifier --help"):
        print(f"  {name} / python = {s[name]['median'] / base:.2f}")
    named, full = s["verifier wait --help"]["median"], s["verifier --help"]["median"]
    print(f"  named / every command = {named / full:.2f}")


def writes() -> None:
    from servewitness._cli import fmt

    line = '    "path": "/usr/lib/python3/dist-packages/vllm/model_executor/layers/x.py",\n'
    clean = line * (SIZE // len(line))
    dirty = clean + '    "cmdline": "\x1b[2J"\n'

    sink = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed below

    def timed(write: Callable[[str], int], text: str) -> float:
        t0 = time.perf_counter()
        write(text)
        return (time.perf_counter() - t0) * 1e3

    # the baseline is what stdout costs anyway: encoding the text and writing it to a file
    arms: dict[str, Callable[[], float]] = {
        "plain write": lambda: timed(sink.write, clean),
        "terminal-safe, clean": lambda: timed(fmt.TerminalSafe(sink).write, clean),
        "terminal-safe, one escape": lambda: timed(fmt.TerminalSafe(sink).write, dirty),
    }
    results: dict[str, list[float]] = {k: [] for k in arms}
    try:
        for _ in range(WRITE_ROUNDS):
            for name, arm in arms.items():
                results[name].append(arm())
    finally:
        sink.close()
    s = {k: summary(v) for k, v in results.items()}
    print(f"output: {len(clean):,} characters, {WRITE_ROUNDS} interleaved rounds, ms per write")
    print_rows(s, fmt="8.2f")
    base = s["plain write"]["median"]
    for name in ("terminal-safe, clean", "terminal-safe, one escape"):
        print(f"  {name} / plain write = {s[name]['median'] / base:.2f}")


def main() -> None:
    global ROUNDS, WRITE_ROUNDS, SIZE  # the arms read them
    if _smoke.parse(__doc__).smoke:
        _smoke.begin("every arm, one round, 100 kB written")
        ROUNDS, WRITE_ROUNDS, SIZE = _smoke.ROUNDS, _smoke.ROUNDS, 100_000
    starts()
    writes()


if __name__ == "__main__":
    main()
