"""Values made safe for the page: every text a stored record or an answer holds is hostile (a
target named ``<script>…``, a path with control characters, 100 kB of one message), so each
one goes through :func:`text` (HTML-escaped, quotes included, control and format characters
shown as ``\\xNN``, at most a limit of characters with the rest counted), every time through
:func:`when`, and every number through :func:`num`, never as it came."""

from __future__ import annotations

import datetime as dt
import html
import math
import unicodedata

from servewitness.report.model import MAX_TEXT

_UNSAFE = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))
_FIRST = -62135596800.0  # 0001-01-01T00:00:00Z
_END = 253402300800.0  # 10000-01-01T00:00:00Z


def _shown(c: str) -> str:
    if unicodedata.category(c) not in _UNSAFE:
        return c
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def text(value: object, limit: int = MAX_TEXT) -> str:
    """VALUE as HTML text (element content or a quoted attribute value): escaped, one line,
    at most LIMIT characters (0: all) and a marker saying how many more there were."""
    s = value if isinstance(value, str) else str(value)
    cut = len(s) - limit if 0 < limit < len(s) else 0
    out = html.escape("".join(_shown(c) for c in (s[:limit] if cut else s)), quote=True)
    return f"{out}…[{cut} more characters]" if cut else out


def num(value: object) -> str:
    """A count or a ratio as text: an int as is, a finite float to 3 significant digits,
    anything else named (a corrupt stored value prints, it does not raise)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return text(repr(value), 40)
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else "(huge)"
    return f"{value:.3g}" if math.isfinite(value) else text(repr(value))


def when(t: float | None) -> str:
    """T (seconds since the epoch) as ``YYYY-MM-DD HH:MM:SSZ``; "-" for None; a value that
    is no representable time as itself, named so."""
    if t is None:
        return "-"
    if not (math.isfinite(t) and _FIRST <= t < _END):
        return f"{num(t)} (not a time)"
    d = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=math.floor(t))
    return d.strftime("%Y-%m-%d %H:%M:%SZ")


def seconds(s: float | None) -> str:
    """A duration as "1.2 s", "3 min", "2.0 h"; "-" for None."""
    if s is None:
        return "-"
    if not math.isfinite(s):
        return num(s)
    if abs(s) < 120:
        return f"{s:.1f} s"
    if abs(s) < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
