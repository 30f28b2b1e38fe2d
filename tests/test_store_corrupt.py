"""A damaged database reads as tampering (exit 1), not as a configuration mistake (exit 3).

Real files, damaged the ways a disk, a bad copy or an attacker damages them: cut in half, a
page zeroed, bytes of a stored row flipped, the header overwritten, the whole file replaced
by random bytes. ``verifier serve`` refuses to start on each (exit 1, saying the database is
corrupt) and ``verifier audit verify --db`` fails on each (exit 1). A path that cannot be a
database at all (its folder is a file; no such file for a read-only audit) stays exit 3.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import verifier_cli
from tests.test_bindings_store import stocked

PAGE = 4096


def _truncate(p: Path) -> None:
    os.truncate(p, p.stat().st_size // 2)


def _zero_page(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[2 * PAGE : 3 * PAGE] = bytes(PAGE)  # page 3: a table's b-tree page
    p.write_bytes(bytes(b))


def _flip_stored_row(p: Path) -> None:
    """Flip bits inside the page that holds a request binding (its internal id), in the
    middle of the file: the b-tree cell is no longer what SQLite wrote."""
    b = bytearray(p.read_bytes())
    at = b.index(b"cmpl-alpha-0-1a2b")
    page = at // PAGE * PAGE
    for i in range(page + 8, page + 40):  # the page header and cell pointers
        b[i] ^= 0xFF
    p.write_bytes(bytes(b))


def _header(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[:16] = b"not sqlite here!"
    p.write_bytes(bytes(b))


def _random(p: Path) -> None:
    p.write_bytes(os.urandom(p.stat().st_size))


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "page zeroed": _zero_page,
    "row flipped": _flip_stored_row,
    "header overwritten": _header,
    "random bytes": _random,
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pristine") / "db.sqlite3"
    stocked(str(path))
    for suffix in ("-wal", "-shm"):  # checkpointed on close: the file alone holds it all
        assert not Path(f"{path}{suffix}").exists() or Path(f"{path}{suffix}").stat().st_size == 0
    return path


def serve(db: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "servewitness", "serve", "--db", str(db), "--listen",
           f"unix:{tmp_path}/v.sock", "--insecure"]  # fmt: skip
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)


def test_the_pristine_copy_verifies(pristine: Path) -> None:
    """The negative control: the same file undamaged is intact (exit 0)."""
    out = verifier_cli("audit", "verify", "--db", str(pristine))
    assert out.returncode == 0 and "ledger intact" in out.stdout, out.stderr


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_database_is_tampering_for_serve_and_audit(
    pristine: Path, tmp_path: Path, damage: str
) -> None:
    db = tmp_path / "db.sqlite3"
    shutil.copy(pristine, db)
    DAMAGE[damage](db)

    out = verifier_cli("audit", "verify", "--db", str(db))
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert "is corrupt" in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = serve(db, tmp_path)
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "is corrupt" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "v.sock").exists()  # it never listened


def test_a_path_that_cannot_be_a_database_is_configuration(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where a folder should be")
    out = serve(tmp_path / "file" / "db.sqlite3", tmp_path)
    assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr
    out = verifier_cli("audit", "verify", "--db", str(tmp_path / "none.sqlite3"))
    assert out.returncode == 3 and "no such database file" in out.stderr, out.stderr
