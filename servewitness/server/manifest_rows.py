"""A manifest as the store keeps it: one JSON object per file (``manifests.files_json``, hashed
into the ledger) and its index rows, built before the store is locked so that a report's
transaction only writes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servewitness.ledger import chain
from servewitness.model import FileEntry
from servewitness.server.index import ManifestIndex, manifest_index


def to_rows(files: Sequence[FileEntry]) -> list[dict[str, Any]]:
    """A manifest as it is stored: one JSON object per file, keys in this order."""
    return [
        {
            "path": f.path,
            "sha256": f.sha256,
            "size": f.size,
            "kind": f.kind,
            "module": f.module,
            "at": f.at,
        }
        for f in files
    ]


def files_from_rows(rows: list[dict[str, Any]]) -> tuple[FileEntry, ...]:
    """``to_rows`` read back."""
    return tuple(FileEntry(**r) for r in rows)


@dataclass(frozen=True)
class PreparedManifest:
    """A manifest as it will be stored: its JSON text, ledger subject and index rows."""

    digest: str
    files_json: str
    subject: str
    index: ManifestIndex


def prepare(manifests: Mapping[str, Sequence[FileEntry]]) -> list[PreparedManifest]:
    """MANIFESTS (digest -> files) as they will be stored; no database needed (for a
    200,000-file manifest about a second on one core, outside the store's lock)."""
    out = []
    for digest, files in manifests.items():
        rows = to_rows(files)
        files_json = json.dumps(rows)
        ix = manifest_index(digest, rows)
        out.append(PreparedManifest(digest, files_json, chain.manifest_subject(files_json), ix))
    return out
