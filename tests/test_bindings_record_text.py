"""A request's bindings record is written without ``json.dumps`` (``_bindings._line``): the
text must be exactly what ``json.dumps`` of the record writes, whatever the request id holds.
The id is the client's (``X-Request-Id``): quotes, backslashes, control characters, non-ASCII,
lone surrogates and a 100 kB id are tried, with hook snapshots of every shape (none at either
end, fewer counters at the start than names at the end), against the reference encoder."""

from __future__ import annotations

import json
import random
from typing import Any

from servewitness_probe import _bindings

HOSTILE_IDS = [
    "cmpl-abc-0",
    "",
    'a"b',
    "back\\slash",
    "new\nline\ttab\r\x00\x1f\x7f",
    "h\u00e9llo \u4e16\u754c \U0001f600",
    "lone \ud800 surrogate \udfff",
    "</script>&<>'",
    "x" * 100_000,
    "\u2028\u2029",
]


def reference(item: Any) -> str:
    return json.dumps(_bindings._record(item), separators=(",", ":"))


def entry(rng: random.Random, snap0: Any) -> list[Any]:
    s0 = rng.randrange(0, 1 << 40)
    t0 = rng.randrange(0, 1 << 62)
    return [
        s0, s0 + rng.randrange(0, 5000), rng.randrange(1, 5000), rng.randrange(1, 1 << 20),
        t0, t0 + rng.randrange(0, 1 << 40), rng.randrange(0, 10_000), rng.randrange(0, 10_000),
        snap0, 0, 0,
    ]  # fmt: skip


def test_a_request_record_is_the_text_json_dumps_writes() -> None:
    rng = random.Random(17)  # noqa: S311 - test data, not secrets
    names = ("vllm.hook", 'we"ird\\name', "\u00e9t\u00e9", "a" * 300)
    drawn = ["".join(chr(rng.randrange(0, 0x3000)) for _ in range(20)) for _ in range(200)]
    checked = 0
    for rid in [*HOSTILE_IDS, *drawn]:
        for k in range(len(names) + 1):
            end_names = names[:k]
            snap = (end_names, tuple(rng.randrange(0, 1 << 30) for _ in end_names))
            for snap0 in (None, (end_names, snap[1]), (end_names[: k // 2], snap[1][: k // 2])):
                for end in ("finished", "aborted", "gone"):
                    item = ("req", rid, entry(rng, snap0), snap if k else None, end, None)
                    got = _bindings._line(item)
                    assert got == reference(item), (rid[:40], k, snap0, end)
                    assert json.loads(got) == _bindings._record(item)
                    checked += 1
    assert checked == (len(HOSTILE_IDS) + len(drawn)) * (len(names) + 1) * 3 * 3


def test_records_it_does_not_write_itself_are_json_dumps_s() -> None:
    """A speculative request's record, an id map (a dict) and an id that is not a string
    keep the reference encoder: same text either way."""
    rng = random.Random(5)  # noqa: S311 - test data, not secrets
    spec = [3, 9, 7, 10, 4, 2, 1, 0, 0]
    items: list[Any] = [
        ("req", "r1", entry(rng, None), None, "finished", spec),
        {"k": "ext", "id": "r1", "ext": 'cmpl-"x"-0', "t": 1},
        ("req", 12345, entry(rng, None), None, "finished", None),
    ]
    for item in items:
        assert _bindings._line(item) == reference(item)
