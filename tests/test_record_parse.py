"""RECORD rows read by one regular expression where the text allows it, and by ``csv`` where
it does not: the same rows and the same faults either way (``distindex._record_rows``)."""

from __future__ import annotations

import csv

from hypothesis import example, given, settings
from hypothesis import strategies as st

from servewitness.evidence.distindex import _clean, _csv_rows, _record_rows

SHA = "sha256=" + "A" * 43
# Pieces that make a RECORD line interesting to CSV, to the path checks and to the digits.
PIECES = ["a", "b/c.py", "/", ".", "..", "//", ",", "\n", "\r", '"', "\0", " ", "²", "٣", "7",
          SHA, "sha256=x", "md5=abc", "\u2028", "\x0b", "é"]  # fmt: skip
LINE = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
ROWS = st.tuples(
    st.lists(st.sampled_from(["a.py", "p/q.py", "/abs.py", "./x", "../y", "p//q", "p/./q",
                              "p/../q", "p/", "p/.", "p/..", ".", "..", ".a/b", "a..b/c"]),
             min_size=1, max_size=6),
    st.sampled_from(["", SHA, SHA + "=", "md5=abc", "sha256=short"]),
    st.sampled_from(["", "12", "²"]),
)  # fmt: skip


def check(text: str) -> None:
    rows, bad, clean = _record_rows(text)
    assert (rows, bad) == _csv_rows(text)  # the csv reader's, line by line
    plain = [r[0][0] != "/" and _clean(r[0]) for r in rows]
    if clean:
        assert all(plain)
    elif not bad and '"' not in text and "\r" not in text and "\0" not in text:
        assert not all(plain)  # the fast path says "not clean" only when a row is not


@given(st.lists(LINE, max_size=6).map("\n".join))
@settings(max_examples=500, deadline=None)
@example('a,,\n"b,c",,\n')
@example("a,,1\n\n\nb,,\n")
@example("a,,²\n")
@example("a,,\r\n" + "x" * (csv.field_size_limit() + 1) + ",,\r\nb,,\r\n")  # CSV stops there
def test_any_text_reads_as_csv_reads_it(text: str) -> None:
    check(text)


@given(st.lists(ROWS, max_size=6), st.booleans())
@settings(max_examples=500, deadline=None)
def test_well_formed_rows_and_odd_paths_read_as_csv_reads_them(
    rows: list[tuple[list[str], str, str]], trailing_newline: bool
) -> None:
    text = "\n".join(f"{'/'.join(p)},{h},{n}" for p, h, n in rows)
    check(text + ("\n" if trailing_newline and text else ""))
