"""Every figure in BENCHMARKS.md names the commit it was measured at.

Each ``##`` section that holds figures (a table row with a number, or a number with a unit:
``1327 ns``, ``57,349/s``, ``12 %``, ``0.98x``) must name a commit that exists in this
repository's history: ``commit 1ef8398`` (or ``commits A..B``) for figures measured at it, or,
for figures nobody re-measured, exactly ``not re-measured since <commit>, figures historical``
with the commit their text was written at. A hash that is not a commit fails; in a shallow clone
(where old commits are absent) a hash not found is checked for its form only, and the test says
so. Cheap: no server, one ``git cat-file`` per hash.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers import REPO

HEX = r"[0-9a-f]{7,40}"
# "commit abc1234", "commits abc1234..def5678", "commit `abc1234`"
NAMED = re.compile(rf"\bcommits?\s+`?({HEX})(?:`?\s*\.\.\s*`?({HEX}))?`?")
HISTORICAL = re.compile(rf"not re-measured since `?({HEX})`?, figures historical")
UNIT = r"(?:%|\N{MULTIPLICATION SIGN}|(?:ns|µs|us|ms|s|x|MB|GB|GiB|MiB|KiB|/s)(?![A-Za-z]))"
FIGURE = re.compile(rf"\d[\d,.]*\s?{UNIT}")
TABLE_FIGURE = re.compile(r"^\|(?!\s*-).*\d.*\|\s*$")


def sections(text: str) -> dict[str, str]:
    """BENCHMARKS.md's ``##`` sections (their ``###`` subsections included), by title."""
    found: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            found[title] = line + "\n"
        elif title is not None:
            found[title] += line + "\n"
    return found


def has_figures(body: str) -> bool:
    return any(TABLE_FIGURE.match(line) or FIGURE.search(line) for line in body.splitlines())


def commits_named(body: str) -> list[str]:
    named = [h for m in NAMED.finditer(body) for h in m.groups() if h]
    return named + [m[1] for m in HISTORICAL.finditer(body)]


def is_commit(sha: str) -> bool:
    out = subprocess.run(
        ["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=REPO, capture_output=True, check=False
    )
    return out.returncode == 0


def is_shallow() -> bool:
    out = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip() == "true"


def test_every_section_with_figures_names_an_existing_commit() -> None:
    """A section of figures without a commit, or naming one that is not in the history, fails;
    every section is named in the message at once."""
    doc = sections((REPO / "BENCHMARKS.md").read_text())
    assert len(doc) >= 10, "BENCHMARKS.md's ## sections were not found"
    unnamed = [t for t, body in doc.items() if has_figures(body) and not commits_named(body)]
    assert unnamed == [], f"sections with figures and no commit: {unnamed}"
    missing = sorted({h for body in doc.values() for h in commits_named(body) if not is_commit(h)})
    if missing and is_shallow():
        print(f"shallow clone: {missing} checked for their form only (not in this history)")
        return
    assert missing == [], f"BENCHMARKS.md names commits that are not in this history: {missing}"


@pytest.mark.parametrize(
    ("body", "accepted"),
    [
        ("| arm | 1.0 |\n", False),  # figures, no commit
        ("took 217 s\n", False),
        ("measured at commit 1ef8398: 1327 ns\n", True),
        ("commits 2873380..b4770aa: 12 ms\n", True),
        ("1327 ns (not re-measured since 15e231f, figures historical)\n", True),
        ("1327 ns, commit unknown (before 15e231f)\n", False),  # not the marker
        ("1327 ns, measured before 15e231f\n", False),
        ("- what is not measured, and why\n", True),  # no figures: nothing to name
    ],
)
def test_what_counts_as_naming_a_commit(body: str, accepted: bool) -> None:
    """The check's own negative controls: figures need 'commit <hash>' or the exact marker."""
    assert (not has_figures(body) or bool(commits_named(body))) == accepted


def test_a_hash_outside_the_history_is_no_commit() -> None:
    """The existence check answers for real hashes: HEAD's is a commit, a made-up one is not."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert (is_commit(head), is_commit("0123456789abcdef0123")) == (True, False)
