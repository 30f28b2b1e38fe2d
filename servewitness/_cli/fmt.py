"""Stored values made printable: every value a database column can hold prints, or is named.

What the verifier stored came from agents (a target name, a path, a role, a runner) or from a
database that may have been edited by hand, written by an older version or restored from
elsewhere; so a time may be ``inf``, ``nan``, ``1e308`` or past year 9999, and a text may hold
control characters, ANSI escape sequences (which a terminal obeys: colours, cursor moves,
window titles, hidden text), lone surrogates or 100 kB. The CLI prints them through here:

- :func:`when`: an RFC 3339 UTC time when the number is one (years 1 to 9999), else the raw
  number with a note, never an exception;
- :func:`text`: control, format, separator and unassigned characters escaped as ``\\xNN``,
  ``\\uNNNN`` (so nothing a terminal obeys reaches it, and one value stays on one line), and
  at most ``limit`` characters with an elision marker saying how many were left out;
- :func:`dumps`: JSON that is exact (every character kept, escaped by JSON itself) and valid
  (``NaN`` and the infinities, which JSON has no numbers for, written as the strings
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"``);
- :class:`TerminalSafe`: the stream ``verifier`` writes through (installed by
  ``servewitness._cli.main``), which escapes what a call site missed.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
import unicodedata
from collections.abc import Iterable, Mapping
from typing import IO, Any

LIMIT = 200
"""Characters of one stored text that text output shows before it elides the rest."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_FIRST = -62135596800.0  # 0001-01-01T00:00:00Z
_END = 253402300800.0  # 10000-01-01T00:00:00Z: the first second datetime cannot hold
_UNSAFE = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))
_KEEP = frozenset("\n\t")


def when(t: object) -> str:
    """T (seconds since the epoch) as ``YYYY-MM-DDTHH:MM:SSZ``; a value that is no such time
    (not a number, not finite, before year 1 or after 9999) as itself with a note."""
    if isinstance(t, bool) or not isinstance(t, int | float):
        return f"{text(repr(t), 60)} (not a time)"
    if not (isinstance(t, int) or math.isfinite(t)) or not _FIRST <= t < _END:
        shown = repr(t) if isinstance(t, float) else _int(t)
        return f"{shown} (not a representable time)"
    m = _EPOCH + dt.timedelta(seconds=math.floor(t))
    return f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}Z"


def _int(n: int) -> str:
    """An int of any size, without Python's limit on converting huge ints to text."""
    if abs(n) < 10**30:
        return str(n)
    return f"{'-' if n < 0 else ''}~2**{abs(n).bit_length() - 1}"


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _unsafe(c: str) -> bool:
    return unicodedata.category(c) in _UNSAFE


def text(value: object, limit: int = LIMIT) -> str:
    """VALUE (a stored text, or anything: ``str()`` of it) for a terminal: every control,
    format, separator, private-use, surrogate or unassigned character escaped, and at most
    LIMIT characters of it shown (0: all), the rest named by an elision marker."""
    s = value if isinstance(value, str) else _int(value) if isinstance(value, int) else str(value)
    cut = len(s) - limit if 0 < limit < len(s) else 0
    shown = s[:limit] if cut else s
    out = "".join(_escape(c) if _unsafe(c) else c for c in shown)
    return f"{out}…[{cut} more characters]" if cut else out


def message(value: str) -> str:
    """An error message for stderr: like :func:`text`, with no limit. One line, as errors are
    documented to be: a stored value quoted in it cannot forge a line of its own."""
    return text(value, 0)


def _finite(obj: Any) -> Any:
    """OBJ with every non-finite float replaced by the string JSON writes it as elsewhere."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else "Infinity" if obj > 0 else "-Infinity"
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def add_json(parser: Any, help: str = "print the result as one JSON object") -> None:
    """``--json`` on a command PARSER whose result ``result`` prints."""
    parser.add_argument("--json", action="store_true", help=help)


def result(args: Any, doc: Mapping[str, Any], lines: Iterable[str]) -> None:
    """A command's result on stdout: DOC as one JSON object with ``--json``, else LINES."""
    if getattr(args, "json", False):
        sys.stdout.write(dumps(dict(doc)) + "\n")
        return
    for line in lines:
        sys.stdout.write(line + "\n")


def dumps(obj: Any, indent: int | None = 2) -> str:
    """OBJ as valid JSON, exact: strings kept whole (JSON escapes control characters and lone
    surrogates as ``\\uNNNN``), non-finite numbers as strings (see the module)."""
    return json.dumps(_finite(obj), indent=indent, ensure_ascii=True, allow_nan=False)


class TerminalSafe:
    """A text stream that escapes, in whatever is written to it, every character
    :func:`text` escapes except line breaks and tabs (and carriage returns where
    ``keep_cr``: ``verifier wait`` redraws its progress line on a terminal's stderr)."""

    def __init__(self, stream: IO[str], keep_cr: bool = False) -> None:
        self._stream = stream
        self._keep = _KEEP | {"\r"} if keep_cr else _KEEP

    def write(self, s: str) -> int:
        # The check runs in C over the text without its kept characters (a printable character
        # is never one to escape); only a text with something to escape is walked in Python
        # (`inspect --json` of a vLLM tree writes some ten million characters at once).
        bare = s
        for keep in self._keep:
            bare = bare.replace(keep, "")
        if not bare.isprintable():
            s = "".join(_escape(c) if c not in self._keep and _unsafe(c) else c for c in s)
        return self._stream.write(s)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, buffer ...
        return getattr(self._stream, name)


WIDTH = 100
"""Columns of text output: ``inspect`` always, every command's text on a terminal."""


def wrap_lines(lines: Iterable[str], width: int = WIDTH) -> list[str]:
    """LINES with each one longer than WIDTH wrapped at spaces, the continuation indented
    four more than the line's own indent; a single word longer than WIDTH (a path) stays
    whole."""
    import textwrap

    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        wrapped = textwrap.wrap(
            line,
            width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
            drop_whitespace=True,
        )
        out.extend(wrapped or [line])
    return out


class Wrapped:
    """A text stream that wraps each line it is written longer than WIDTH
    (:func:`wrap_lines`): stdout on a terminal, for text output (a pipe gets each line whole,
    for grep; a script asks for ``--json``). A partial line is held until its newline or a
    flush."""

    def __init__(self, stream: IO[str], width: int = WIDTH) -> None:
        self._stream, self._width, self._pending = stream, width, ""

    def write(self, s: str) -> int:
        *lines, self._pending = (self._pending + s).split("\n")
        if lines:
            self._stream.write("".join(f"{x}\n" for x in wrap_lines(lines, self._width)))
        return len(s)

    def flush(self) -> None:
        if self._pending:
            self._stream.write("\n".join(wrap_lines([self._pending], self._width)))
            self._pending = ""
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Discard:
    """A text stream that keeps nothing: stdout under ``-q/--quiet``."""

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False
