"""A journal read whole (``journal.parse_text``: the JSON scanner at every line's start) gives
exactly the records of reading it line by line (``journal.parse``: ``json.loads`` per line),
whatever the probed process wrote: the journal is the workload's to write, so a line that
only parses together with its neighbour, or two values on one line, must not become records
one way and not the other."""

from __future__ import annotations

import json
import random

import pytest

from servewitness.evidence.journal import identity_of, parse, parse_text

RECORD = (
    b'{"k":"file","path":"/site/vllm/x.py","sha256":"ab12","size":12,"kind":"source",'
    b'"module":"vllm.x","at":"load","stat":[1,2,12,3,4],"t":1.5,"seq":7}'
)

HOSTILE = [
    RECORD,
    b"",
    b"   ",
    b"\t",
    b"\r",
    b"\x0b",  # blank to bytes.strip, not to JSON
    b"\x0c" + RECORD,
    b" " + RECORD,
    RECORD + b" ",
    RECORD + b"\r",
    RECORD + b"\x0c",
    b"\xef\xbb\xbf" + RECORD,  # a UTF-8 byte-order mark: json.loads reads it
    json.dumps({"k": "file", "path": "u16"}).encode("utf-16-le"),  # json.loads detects UTF-16
    json.dumps({"k": "file", "path": "u16be"}).encode("utf-16-be"),
    b'{"a":1},{"b":2}',  # two values on one line
    b'{"a":1} {"b":2}',
    b'{"a":"x},{',  # a value that closes only with the next line
    b'"}',
    b"[{",
    b'"k":"file"}]',
    b'"abc',
    b'def"',
    b"1],[2",
    b"[1",
    b"2]",
    b"[]",
    b"42",
    b'"just a string"',
    b"null",
    b"NaN",
    b'{"v":NaN,"w":Infinity,"x":-Infinity}',
    b'{"big":' + b"9" * 5000 + b"}",  # over the int digit limit: ValueError
    b"[" * 100_000 + b"]" * 100_000,  # nested past the recursion limit
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b'{"s":"\\ud800"}',  # an escape to a lone surrogate: load_record escapes it
    b'{"s":"\\udcff\\u00e9"}',
    b'{"s":"caf\xc3\xa9"}',
    b'{"s":"\xff\xfe"}',  # not UTF-8
    b'{"s":"\xed\xa0\x80"}',  # a surrogate encoded as UTF-8: json.loads takes it (surrogatepass)
    b'{"s":"tab\there"}',  # a control character in a string: strict JSON refuses it
    b'{"dup":1,"dup":2}',
    b'{"k":"file"}\x00',
    b"\x00" + RECORD,
    b"}",
    b"{",
    b'{"a":[1,2,{"b":null}],"c":true,"d":false}',
]


def _same(raw: bytes) -> None:
    want = parse(raw.split(b"\n"))
    got = parse_text(raw)
    # (dumps: NaN is not equal to itself, and a record may hold one)
    assert json.dumps(got) == json.dumps(want), raw[:200]


@pytest.mark.parametrize("i", range(len(HOSTILE)))
def test_each_hostile_line_alone_and_between_good_ones(i: int) -> None:
    line = HOSTILE[i]
    _same(line + b"\n")
    _same(line)  # no final newline
    _same(RECORD + b"\n" + line + b"\n" + RECORD + b"\n")


def test_neighbours_that_parse_only_together_are_not_records() -> None:
    """Lines that make valid JSON only when joined (a string or an object closed on the next
    line), beside a line that holds two values: the counts match and the values differ, the
    case a join-then-parse shortcut gets wrong."""
    raw = b'{"k":"file","path":"a},{\n"}\n{"k":"x"},{"k":"y"}\n' + RECORD + b"\n"
    _same(raw)
    assert [r.get("seq") for r in parse_text(raw)] == [7]


def test_random_mixtures_of_good_and_hostile_lines() -> None:
    rng = random.Random(20261206)  # noqa: S311 - a fixed fuzz corpus
    small = [h for h in HOSTILE if len(h) < 10_000]
    for _ in range(400):
        lines = [
            rng.choice(small) if rng.random() < 0.4 else RECORD for _ in range(rng.randint(0, 12))
        ]
        raw = b"\n".join(lines) + (b"\n" if rng.random() < 0.7 else b"")
        _same(raw)


def test_random_byte_edits_of_records() -> None:
    rng = random.Random(7)  # noqa: S311 - a fixed fuzz corpus
    alphabet = b'{}[]",: \t\r\n\\0123456789abcdefuNI-+.e\x00\xff\xc3'
    for _ in range(1500):
        buf = bytearray(b"\n".join([RECORD] * rng.randint(1, 4)) + b"\n")
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(buf))
            choice = rng.random()
            if choice < 0.4:
                buf[at] = rng.choice(alphabet)
            elif choice < 0.7:
                del buf[at]
            else:
                buf.insert(at, rng.choice(alphabet))
        _same(bytes(buf))


def test_a_journal_of_records_is_read_whole_and_in_order() -> None:
    records = [
        {"k": "file", "path": f"/p/{i}", "seq": i, "stat": [1, i, 2, 3, 4]} for i in range(500)
    ]
    raw = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
    assert parse_text(raw) == records


def test_an_identity_is_five_exact_ints_whatever_was_read_before() -> None:
    """``identity_of`` keeps the identities it made (the processes of a tree share most), and
    1, 1.0 and True are equal keys: a journal's [true, ...] or [1.0, ...] is still no
    identity after [1, ...] was one."""
    good = identity_of([1, 2, 3, 4, 5])
    assert good is not None and (good.dev, good.ctime_ns) == (1, 5)
    assert identity_of([1, 2, 3, 4, 5]) is good
    for bad in (
        [True, 2, 3, 4, 5], [1.0, 2, 3, 4, 5], [1, 2, 3, 4, 5.0], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6],
        (1, 2, 3, 4, 5), [-1, 2, 3, 4, 5], [1, 1 << 64, 3, 4, 5], [1, 2, 3, 1 << 63, 5],
        [1, 2, "3", 4, 5], None, "12345",
    ):  # fmt: skip
        assert identity_of(bad) is None, bad
