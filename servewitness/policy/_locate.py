"""Line numbers for keys of a TOML text that ``tomllib`` has already accepted.

``tomllib`` gives values, not positions. This scanner walks the (known valid) text once and
records, for every key, table header and array element, the line where it starts, under its
concrete path: ``("hooks", 1, "name")`` is key ``name`` of the second ``[[hooks]]`` entry,
``("targets", "names", 0)`` the first element of ``targets.names``. It handles dotted and
quoted keys, inline tables, nested and multi-line arrays, and every string form.
"""

from __future__ import annotations

import bisect
import tomllib

Path = tuple[str | int, ...]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SCALAR_END = frozenset(",]}#\n\r")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.newlines = [i for i, c in enumerate(text) if c == "\n"]
        self.lines: dict[Path, int] = {}
        self.arrays: dict[Path, int] = {}  # array-of-tables path -> entries so far

    def line(self, at: int) -> int:
        return bisect.bisect_left(self.newlines, at) + 1

    def record(self, path: Path, at: int) -> None:
        self.lines.setdefault(path, self.line(at))

    def skip(self, newlines: bool) -> None:
        """Skip blanks and comments (and newlines when NEWLINES)."""
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            elif c == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            else:
                return

    def run(self) -> dict[Path, int]:
        table: Path = ()
        while True:
            self.skip(newlines=True)
            if self.i >= len(self.s):
                return self.lines
            start = self.i
            if self.s.startswith("[[", self.i):
                self.i += 2
                names = self.key()
                self.i = self.s.index("]]", self.i) + 2
                array = (*self.resolve(names[:-1]), names[-1])
                index = self.arrays.get(array, 0)
                self.arrays[array] = index + 1
                table = (*array, index)
                self.record(array, start)
                self.record(table, start)
            elif self.s[self.i] == "[":
                self.i += 1
                names = self.key()
                self.i = self.s.index("]", self.i) + 1
                table = self.resolve(names)
                self.record(table, start)
            else:
                self.keyval(table)

    def resolve(self, names: tuple[str, ...]) -> Path:
        """Concrete path of a header's names: an array of tables means its latest entry."""
        path: Path = ()
        for n in names:
            path = (*path, n)
            if path in self.arrays:
                path = (*path, self.arrays[path] - 1)
        return path

    def key(self) -> tuple[str, ...]:
        parts: list[str] = []
        while True:
            self.skip(newlines=False)
            parts.append(self.simple_key())
            self.skip(newlines=False)
            if self.i < len(self.s) and self.s[self.i] == ".":
                self.i += 1
                continue
            return tuple(parts)

    def simple_key(self) -> str:
        s, start = self.s, self.i
        if s[start] in "\"'":
            self.string()
            decoded = tomllib.loads(f"k = {s[start : self.i]}")["k"]
            return str(decoded)
        while self.i < len(s) and s[self.i] in _BARE:
            self.i += 1
        return s[start : self.i]

    def keyval(self, table: Path) -> None:
        start = self.i
        names = self.key()
        for n in range(1, len(names) + 1):
            self.record((*table, *names[:n]), start)
        self.skip(newlines=False)
        self.i += 1  # "="
        self.skip(newlines=False)
        self.value((*table, *names))

    def value(self, path: Path) -> None:
        s = self.s
        c = s[self.i]
        if c in "\"'":
            self.string()
        elif c == "[":
            self.i += 1
            index = 0
            while True:
                self.skip(newlines=True)
                if s[self.i] == "]":
                    self.i += 1
                    return
                self.record((*path, index), self.i)
                self.value((*path, index))
                index += 1
                self.skip(newlines=True)
                if s[self.i] == ",":
                    self.i += 1
        elif c == "{":
            self.i += 1
            while True:
                self.skip(newlines=True)
                if s[self.i] == "}":
                    self.i += 1
                    return
                if s[self.i] == ",":
                    self.i += 1
                    continue
                self.keyval(path)
        else:
            while self.i < len(s) and s[self.i] not in _SCALAR_END:
                self.i += 1

    def string(self) -> None:
        s, q = self.s, self.s[self.i]
        if s.startswith(q * 3, self.i):
            self.i += 3
            while not s.startswith(q * 3, self.i):
                self.i += 2 if q == '"' and s[self.i] == "\\" else 1
            self.i += 3
            while self.i < len(s) and s[self.i] == q:  # up to two quotes end the content
                self.i += 1
            return
        self.i += 1
        while s[self.i] != q:
            self.i += 2 if q == '"' and s[self.i] == "\\" else 1
        self.i += 1


def key_lines(text: str) -> dict[Path, int]:
    """Path -> 1-based line for every key, header and array element of valid TOML TEXT."""
    return _Scanner(text).run()


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line of PATH, else of its nearest recorded ancestor, else None."""
    for n in range(len(path), 0, -1):
        found = lines.get(path[:n])
        if found is not None:
            return found
    return None
