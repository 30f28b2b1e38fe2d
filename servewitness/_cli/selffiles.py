"""Which files of a ``provenance.origins`` list are this tool's own ("self"), for display.

A served process loads the probe (and, in an editable install, the .pth files and the
package's other modules it imports): listed one per file they drown what a reader came for.
Text output folds them into one line (count and a digest over their paths and hashes);
``--verbose`` and ``--json`` keep every file. Only files whose class is expected for this
tool's own install are folded: one that is patched, added, unknown or anything else is never
folded, so a tampered probe file still shows on its own line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

PACKAGES = frozenset((__name__.split(".")[0], __name__.split(".")[0] + "_probe"))
"""This tool's import packages, the tool's and its probe's (a distribution of its own): a file
under a directory of either name is one of its own."""

DISTRIBUTIONS = frozenset(p.replace("_", "-") for p in PACKAGES)
"""The distributions of those packages (canonical names): their .pth files are this tool's too,
when the process loaded none of the package's modules (a worker loads only the probe)."""

FOLDABLE = frozenset(("editable", "pristine"))
"""The classes this tool's own files have when nothing is wrong with them."""


@dataclass(frozen=True)
class Split:
    own: tuple[Mapping[str, Any], ...]  # folded: this tool's files, as expected
    rest: tuple[Mapping[str, Any], ...]  # listed: everything else (tampered own files too)

    def digest(self) -> str:
        """sha256 over the folded files' paths and hashes (sorted): two processes that loaded
        the same own files show the same digest; "?" where a hash was not recorded."""
        h = hashlib.sha256()
        for f in sorted(self.own, key=lambda f: str(f.get("path"))):
            h.update(f"{f.get('path')}\0{f.get('sha256') or '?'}\n".encode(errors="replace"))
        return h.hexdigest()[:16]

    def unhashed(self) -> int:
        return sum(not f.get("sha256") for f in self.own)


def _under_package(path: str) -> bool:
    return not PACKAGES.isdisjoint(PurePosixPath(path).parts[:-1])


def split(files: Sequence[Mapping[str, Any]]) -> Split:
    """FILES (a provenance.origins finding's ``files``) as this tool's own and the rest."""
    ours = {
        f.get("distribution")
        for f in files
        if f.get("distribution")
        and (
            _under_package(str(f.get("path", "")))
            or str(f.get("distribution")).lower().replace("_", "-") in DISTRIBUTIONS
        )
    }
    own: list[Mapping[str, Any]] = []
    rest: list[Mapping[str, Any]] = []
    for f in files:
        mine = _under_package(str(f.get("path", ""))) or f.get("distribution") in ours
        foldable = mine and f.get("origin") in FOLDABLE and f.get("distribution") in ours
        (own if foldable else rest).append(f)
    return Split(tuple(own), tuple(rest))
