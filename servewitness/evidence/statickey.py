"""The key a process's static judgement is reused under (``judge.Judgement.static_key``):
a digest of everything the static part reads from the probe, and one of the native mappings'
bytes. The disk it read is the other half of the condition (``inputs``)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from servewitness.evidence import origins
from servewitness.evidence.probe_reader import ProbeState
from servewitness.model import FileEntry, NativeMapping


def static_digest(files: Sequence[FileEntry], probe: ProbeState, ctx: origins.Context) -> str:
    """A digest of everything the static part of a judgement reads from the probe: every
    manifest entry's path, bytes, kind, module and how it was read (a pyc rejected at first
    and run later, a file read under another module's name judge otherwise), the fileless and
    unfiled modules, the interpreter's version and where its standard library, caches and
    sys.path are. The same digest and the same files on disk (``Judgement.disk``): the same
    judgement."""
    h = hashlib.sha256(_files_digest(files).encode())
    head = (probe.fileless, probe.unfiled, repr(probe.interp.get("version")), ctx)
    h.update(b"\0" + repr(head).encode(errors="backslashreplace"))
    return h.hexdigest()


# The digest of each manifest judged lately, by the manifest itself (the journal cache hands
# out the same tuple while the journal has nothing new): a full check does not make it again.
_FILES_DIGESTS: dict[int, tuple[Sequence[FileEntry], str]] = {}
_FILES_DIGESTS_MAX = 64


def _files_digest(files: Sequence[FileEntry]) -> str:
    hit = _FILES_DIGESTS.get(id(files))
    if hit is not None and hit[0] is files:
        return hit[1]
    h = hashlib.sha256()
    for f in files:
        h.update(repr((f.path, f.sha256, f.kind, f.module, f.at)).encode(errors="backslashreplace"))
    digest = h.hexdigest()
    if len(_FILES_DIGESTS) >= _FILES_DIGESTS_MAX:
        _FILES_DIGESTS.clear()
    _FILES_DIGESTS[id(files)] = (files, digest)
    return digest


def native_digest(native: Sequence[NativeMapping]) -> str:
    """A digest of which native files are mapped with which bytes."""
    h = hashlib.sha256()
    for m in native:
        h.update(f"{m.path}\0{m.sha256}\n".encode(errors="backslashreplace"))
    return h.hexdigest()
