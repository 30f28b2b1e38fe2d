"""The bindings reader: only what was appended, a partial last line left for later, garbage
skipped and counted, a replaced or truncated file read from the start, an offset resumed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from servewitness_probe import layout as L

from servewitness.evidence.bindings_reader import BindingsReader, ExternalId, RequestSpan
from servewitness.model import RequestSpec


def req(rid: str, end: str = "finished", **over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "k": "req",
        "id": rid,
        "s0": 3,
        "s1": 10,
        "n": 8,
        "tok": 15,
        "t0": 1_000,
        "t1": 2_000,
        "f0": 40,
        "f1": 42,
        "hooks": {"step": 8, "dead": 0},
        "end": end,
    }
    rec.update(over)
    return rec


def line(rec: dict[str, Any]) -> bytes:
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def append(d: Path, data: bytes) -> None:
    with (d / L.BINDINGS_FILE).open("ab") as f:
        f.write(data)


def test_reads_both_kinds_and_then_only_what_was_appended(tmp_path: Path) -> None:
    append(tmp_path, line(req("a")) + line({"k": "ext", "id": "a", "ext": "cmpl-x-0", "t": 5}))
    r = BindingsReader()
    spans, ext = r.read(tmp_path)
    assert spans == [
        RequestSpan("a", 3, 10, 8, 15, 1_000, 2_000, 40, 42, {"step": 8, "dead": 0}, True)
    ]
    assert ext == [ExternalId("a", "cmpl-x-0", 5)]
    assert r.read(tmp_path) == ([], [])
    append(
        tmp_path,
        line(req("b", end="open")) + line({"k": "ext", "id": "b", "ext": "e", "t": 6, "xrid": "x"}),
    )
    spans, ext = r.read(tmp_path)
    assert [(s.internal_id, s.finished) for s in spans] == [("b", False)]
    assert ext == [ExternalId("b", "e", 6, "x")]


SPEC = {"drafts": 4, "draft_tokens": 12, "accepted": 7, "emitted": 15, "pos": [4, 2, 1]}


def test_a_request_record_with_speculation_counts_carries_them(tmp_path: Path) -> None:
    append(tmp_path, line(req("a", spec=SPEC)) + line(req("b")))
    spans, _ = BindingsReader().read(tmp_path)
    assert spans[0].spec == RequestSpec(
        drafts=4, draft_tokens=12, accepted_tokens=7, accepted_per_position=(4, 2, 1),
        emitted_tokens=15,
    )  # fmt: skip
    assert spans[1].spec is None  # speculation off, or an older probe


def test_partial_last_line_waits_for_its_end(tmp_path: Path) -> None:
    whole = line(req("a"))
    append(tmp_path, whole[:20])
    r = BindingsReader()
    assert r.read(tmp_path) == ([], [])
    assert r.malformed == 0
    append(tmp_path, whole[20:])
    spans, _ = r.read(tmp_path)
    assert [s.internal_id for s in spans] == ["a"]


def test_malformed_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    bad = [
        b"not json\n",
        b"[1, 2]\n",
        line(req("x", s0="3")),  # a string where a number belongs
        line(req("x", end="maybe")),
        line(req("x", hooks=[1])),
        line({"k": "ext", "id": "a"}),  # no ext
        b"\xff\xfe\n",
        line(req("x", n=True)),  # a bool is no count
        line(req("x", spec=[1, 2])),  # speculation counts must be an object
        line(req("x", spec={**SPEC, "accepted": -1})),
        line(req("x", spec={**SPEC, "pos": [1] * 9})),  # more positions than the probe keeps
        line(req("x", spec={k: v for k, v in SPEC.items() if k != "emitted"})),
    ]
    append(tmp_path, b"".join(bad) + line(req("good")) + line({"k": "future", "x": 1}) + b"\n")
    r = BindingsReader()
    spans, ext = r.read(tmp_path)
    assert [s.internal_id for s in spans] == ["good"]
    assert ext == []
    assert r.malformed == len(bad)
    assert r.unknown == 1


def test_shrunk_or_replaced_file_is_read_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / L.BINDINGS_FILE
    append(tmp_path, line(req("a")) + line(req("b")))
    r = BindingsReader()
    assert len(r.read(tmp_path)[0]) == 2
    path.write_bytes(line(req("c")))  # truncated in place: shorter than the offset
    assert [s.internal_id for s in r.read(tmp_path)[0]] == ["c"]
    new = tmp_path / "new"
    new.write_bytes(line(req("d")) + line(req("e")) + line(req("f")))
    os.replace(new, path)  # another inode, longer than the offset
    assert [s.internal_id for s in r.read(tmp_path)[0]] == ["d", "e", "f"]


def test_missing_file_gives_nothing_and_keeps_the_offset(tmp_path: Path) -> None:
    r = BindingsReader()
    assert r.read(tmp_path / "nowhere") == ([], [])
    assert r.offsets() == {}


def test_offsets_resume_a_restarted_reader(tmp_path: Path) -> None:
    append(tmp_path, line(req("a")) + line(req("b")))
    first = BindingsReader()
    first.read(tmp_path)
    saved = first.offsets()
    path = str(tmp_path / L.BINDINGS_FILE)
    assert saved == {path: (os.stat(path).st_ino, os.path.getsize(path))}
    append(tmp_path, line(req("c")))
    again = BindingsReader(start=saved)
    assert [s.internal_id for s in again.read(tmp_path)[0]] == ["c"]
    # A saved offset for a file that has since been replaced is not trusted.
    stale = BindingsReader()
    stale.seed(Path(path), saved[path][0] + 1, saved[path][1])
    assert [s.internal_id for s in stale.read(tmp_path)[0]] == ["a", "b", "c"]
