"""``[[patches]]`` and ``[[claims]]``: bytes a policy vouches for where no RECORD does, and
the one question every rule asks of them (``vouched``): does this loaded file have exactly
those bytes?

``Pristine`` takes the patches of the distributions it requires; ``AllCodeClaimed`` takes
both for every code file; ``DriftFree`` takes both for the drift they can account for (a
``.pth`` that executes code, a module executed by a loader whose code is in such a file).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servewitness.model import FileOrigin


@dataclass(frozen=True)
class Patch:
    """``[[patches]]``: a file of a distribution allowed to differ from its RECORD."""

    distribution: str  # canonical
    path: str  # as the distribution's RECORD writes it
    sha256: str
    note: str = ""


@dataclass(frozen=True)
class Claim:
    """``[[claims]]``: bytes the user vouches for at a path no distribution pins."""

    path: str  # absolute, or a suffix at a '/' boundary; "-c" for a command line's code
    sha256: str
    note: str = ""

    def covers(self, path: str) -> bool:
        if self.path.startswith("/") or self.path == "-c":
            return path == self.path
        return path.endswith("/" + self.path)


def vouched(f: FileOrigin, claims: Sequence[Claim], patches: Sequence[Patch]) -> str | None:
    """How F's bytes are vouched for: ``claimed`` (a ``[[claims]]`` entry for its path with
    its sha256), ``patch`` (a ``[[patches]]`` entry for its distribution's RECORD path with its
    sha256), or None. A file the agent could not hash is vouched for by nothing."""
    sha = (f.sha256 or "").lower()
    if not sha:
        return None
    if any(c.covers(f.path) and c.sha256 == sha for c in claims):
        return "claimed"
    if f.distribution is not None and f.record_path is not None:
        for x in patches:
            if (x.distribution, x.path) == (f.distribution, f.record_path) and x.sha256 == sha:
                return "patch"
    return None
