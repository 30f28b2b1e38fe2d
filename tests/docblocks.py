"""The marked shell blocks of a Markdown document, as the README's reader pastes them.

A block is marked by an HTML comment on the line before its fence::

    <!-- gate-step: NAME -->
    ```sh
    ...
    ```

``steps`` returns them in document order; ``section`` cuts a document to one heading's
section; ``fenced_shell_blocks`` returns every ``sh``/``bash`` block of a text, marked or not,
so a test can tell that none was left unmarked.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

MARKED = re.compile(
    r"^<!-- (?P<kind>[a-z-]+): (?P<name>[a-z0-9-]+) -->\n```(?:sh|bash)\n(?P<body>.*?)^```$",
    re.M | re.S,
)
FENCED = re.compile(r"^```(?:sh|bash)\n(?P<body>.*?)^```$", re.M | re.S)


class DocBlockError(ValueError):
    """The document does not have the blocks or sections asked for."""


@dataclass(frozen=True)
class Step:
    name: str
    body: str


def steps(text: str, kind: str) -> list[Step]:
    """Every block of TEXT marked ``<!-- KIND: NAME -->``, in order; a name used twice is an
    error (a reader could not tell which one the tests ran)."""
    found = [Step(m["name"], m["body"]) for m in MARKED.finditer(text) if m["kind"] == kind]
    names = [s.name for s in found]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DocBlockError(f"{kind} blocks named more than once: {dup}")
    return found


def by_name(found: list[Step]) -> dict[str, str]:
    return {s.name: s.body for s in found}


def fenced_shell_blocks(text: str) -> list[str]:
    return [m["body"] for m in FENCED.finditer(text)]


def section(text: str, heading: str) -> str:
    """TEXT from the line ``HEADING`` to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.find(f"\n{heading}\n")
    if start < 0:
        raise DocBlockError(f"no heading {heading!r}")
    rest = text[start + 1 :]
    nxt = re.search(rf"^#{{1,{level}}} ", rest[len(heading) :], flags=re.M)
    return rest if nxt is None else rest[: len(heading) + nxt.start()]


def words(body: str) -> list[str]:
    """The shell words of BODY (comments dropped, backslash-newlines joined), for checking
    which flags a command line passes without running it."""
    joined = re.sub(r"\\\n", " ", body)
    return shlex.split(joined, comments=True)
