"""What the agent judged of a process's files, to and from their messages: manifest entries
(with the file's identity when hashed), native mappings, disagreements between the probe and
the agent, provenance and drift. (``process.py`` assembles them into a ``ProcessReport``.)"""

from __future__ import annotations

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import (
    DRIFT_IDS,
    DRIFT_MODULE_UNFILED,
    Drift,
    FileDisagreement,
    FileEntry,
    FileIdentity,
    FileOrigin,
    NativeMapping,
    Origin,
    Provenance,
)
from servewitness.wire import fields as F
from servewitness.wire import limits as L


def _identity_to_pb(i: FileIdentity | None) -> pb.FileIdentity | None:
    if i is None:
        return None
    return pb.FileIdentity(
        dev=i.dev, ino=i.ino, size=i.size, mtime_ns=i.mtime_ns, ctime_ns=i.ctime_ns
    )


def _identity_from_pb(msg: pb.FileIdentity, at: str) -> FileIdentity:
    return FileIdentity(
        dev=msg.dev,
        ino=msg.ino,
        size=F.count(msg.size, f"{at}.size"),
        mtime_ns=msg.mtime_ns,
        ctime_ns=msg.ctime_ns,
    )


def file_to_pb(f: FileEntry) -> pb.FileEntry:
    return pb.FileEntry(
        path=f.path,
        sha256=f.sha256,
        size=f.size,
        kind=f.kind,
        module=f.module,
        at=f.at,
        identity=_identity_to_pb(f.identity),
        loaded=_identity_to_pb(f.loaded),
    )


def path(value: str, at: str) -> str:
    """VALUE, a file path: present and within ``path_bytes``."""
    L.at_most(L.PATH_BYTES, len(F.required(value, at).encode()), at)
    return value


def file_from_pb(msg: pb.FileEntry, at: str) -> FileEntry:
    return FileEntry(
        path=path(msg.path, f"{at}.path"),
        sha256=F.sha256_hex(msg.sha256, f"{at}.sha256") if msg.HasField("sha256") else None,
        size=F.count(msg.size, f"{at}.size", minimum=-1),  # -1: size unknown (unreadable)
        kind=msg.kind,
        module=msg.module if msg.HasField("module") else None,
        at=msg.at,
        identity=(
            _identity_from_pb(msg.identity, f"{at}.identity") if msg.HasField("identity") else None
        ),
        loaded=_identity_from_pb(msg.loaded, f"{at}.loaded") if msg.HasField("loaded") else None,
    )


def provenance_to_pb(v: Provenance) -> pb.Provenance:
    return pb.Provenance(
        counts=dict(v.counts),
        files=[
            pb.FileOrigin(
                path=f.path,
                origin=f.origin,
                reason=f.reason,
                distribution=f.distribution,
                version=f.version,
                record_path=f.record_path,
                sha256=f.sha256,
                expected_sha256=f.expected_sha256,
            )
            for f in v.files
        ],
        distributions=[
            pb.DistributionFiles(name=n, version=ver, files=k) for n, ver, k in v.distributions
        ],
        contents=[
            pb.DistributionContent(name=n, version=ver, content_sha256=c)
            for n, ver, c in v.contents
        ],
    )


_ORIGINS = tuple(o.value for o in Origin)


def provenance_from_pb(msg: pb.Provenance, at: str) -> Provenance:
    for origin, n in msg.counts.items():
        if origin not in _ORIGINS:
            F.fail(f"{at}.counts", f"unknown provenance class {origin!r}")
        F.count(n, f"{at}.counts[{origin}]")
    files = []
    for i, f in enumerate(msg.files):
        where = f"{at}.files[{i}]"
        if f.origin not in _ORIGINS:
            F.fail(f"{where}.origin", f"must be one of {list(_ORIGINS)}, got {f.origin!r}")

        def opt(field: str, msg: pb.FileOrigin = f) -> str | None:
            return str(getattr(msg, field)) if msg.HasField(field) else None

        sha, expected = opt("sha256"), opt("expected_sha256")
        files.append(
            FileOrigin(
                path=path(f.path, f"{where}.path"),
                origin=f.origin,
                reason=f.reason,
                distribution=opt("distribution"),
                version=opt("version"),
                record_path=opt("record_path"),
                sha256=None if sha is None else F.sha256_hex(sha, f"{where}.sha256"),
                expected_sha256=(
                    None if expected is None else F.sha256_hex(expected, f"{where}.expected_sha256")
                ),
            )
        )
    counts = tuple((o, int(msg.counts.get(o, 0))) for o in _ORIGINS)
    dists = tuple(
        (
            F.required(d.name, f"{at}.distributions[{i}].name"),
            d.version,
            F.count(d.files, f"{at}.distributions[{i}].files"),
        )
        for i, d in enumerate(msg.distributions)
    )
    contents = tuple(
        (
            F.required(c.name, f"{at}.contents[{i}].name"),
            c.version,
            F.sha256_hex(c.content_sha256, f"{at}.contents[{i}].content_sha256"),
        )
        for i, c in enumerate(msg.contents)
    )
    return Provenance(counts=counts, files=tuple(files), distributions=dists, contents=contents)


def drift_to_pb(d: Drift) -> pb.Drift:
    return pb.Drift(
        id=d.id, path=d.path, module=d.module, detail=d.detail, defined_in=list(d.defined_in)
    )


MAX_DEFINED_IN = 32  # the probe follows at most 16 pieces of code per loader


def drift_from_pb(msg: pb.Drift, at: str) -> Drift:
    if msg.id not in DRIFT_IDS:
        F.fail(f"{at}.id", f"unknown drift id {msg.id!r}")
    return Drift(
        id=msg.id,
        path=path(msg.path, f"{at}.path"),
        module=msg.module if msg.HasField("module") else None,
        detail=msg.detail,
        defined_in=_defined_in(msg, at),
    )


def _defined_in(msg: pb.Drift, at: str) -> tuple[str, ...]:
    if len(msg.defined_in) > MAX_DEFINED_IN:
        F.fail(f"{at}.defined_in", f"more than {MAX_DEFINED_IN} files")
    if msg.defined_in and msg.id != DRIFT_MODULE_UNFILED:
        F.fail(f"{at}.defined_in", f"only provenance.module.unfiled names them, not {msg.id}")
    return tuple(path(p, f"{at}.defined_in[{i}]") for i, p in enumerate(msg.defined_in))


def native_to_pb(n: NativeMapping) -> pb.NativeMapping:
    return pb.NativeMapping(
        path=n.path,
        sha256=n.sha256,
        size=n.size,
        state=n.state,
        error=n.error,
        device=n.device,
        inode=n.inode,
        detail=n.detail,
    )


_NATIVE_STATES = frozenset({"same", "replaced", "deleted", "unreadable", "changed", "memory"})


def native_from_pb(msg: pb.NativeMapping, at: str) -> NativeMapping:
    if msg.state not in _NATIVE_STATES:
        F.fail(f"{at}.state", f"must be one of {sorted(_NATIVE_STATES)}, got {msg.state!r}")
    return NativeMapping(
        path=path(msg.path, f"{at}.path"),
        sha256=F.sha256_hex(msg.sha256, f"{at}.sha256") if msg.HasField("sha256") else None,
        size=F.count(msg.size, f"{at}.size", minimum=-1),
        state=msg.state,
        error=msg.error if msg.HasField("error") else None,
        device=msg.device,
        inode=F.count(msg.inode, f"{at}.inode"),
        detail=msg.detail if msg.HasField("detail") else None,
    )


def disagreement_to_pb(d: FileDisagreement) -> pb.FileDisagreement:
    return pb.FileDisagreement(
        path=d.path,
        sha256_in_process=d.sha256_in_process,
        sha256_agent=d.sha256_agent,
        reason=d.reason,
    )


def disagreement_from_pb(msg: pb.FileDisagreement, at: str) -> FileDisagreement:
    def sha(field: str) -> str | None:
        return F.sha256_hex(getattr(msg, field), f"{at}.{field}") if msg.HasField(field) else None

    return FileDisagreement(
        path=F.required(msg.path, f"{at}.path"),
        sha256_in_process=sha("sha256_in_process"),
        sha256_agent=sha("sha256_agent"),
        reason=F.required(msg.reason, f"{at}.reason"),
    )
