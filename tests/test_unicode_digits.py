"""Numbers parsed from text another party writes (a RECORD's size, a port, a uid, a spool
file's name) are ASCII digits only. ``str.isdigit`` also says True for "²" (which ``int``
refuses: a crash where a clear error or a skip was promised) and for "٣" or a fullwidth
eight (which ``int`` reads as 3 and 8: a value nobody wrote in ASCII, accepted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from servewitness_probe.layout import ns_inode

from servewitness.agent.spool import Spool
from servewitness.client.address import normalize
from servewitness.errors import ConfigError, UsageError
from servewitness.evidence.distindex import DistIndex
from servewitness.metrics.http import parse_listen
from servewitness.security.peercred import parse_local_agent
from servewitness.server.processes import check_listen

# superscript two, Arabic-Indic three, fullwidth 8080 (escaped: ruff's RUF001), a mix
NOT_ASCII = ["²", "٣", "\uff18\uff10\uff18\uff10", "1²"]


def test_a_record_row_whose_size_is_not_ascii_digits_is_a_fault_not_a_crash(
    tmp_path: Path,
) -> None:
    """The attack: the serving container's site-packages gets a RECORD row whose size is
    "²". ``int`` refused it on the first lookup of that path, so every collect of the agent
    raised and the agent died. Now the row is malformed: skipped, and said."""
    site = tmp_path / "site"
    info = site / "evil-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n\n")
    (site / "evil").mkdir()
    (site / "evil" / "mod.py").write_text("x = 1\n")
    rows = ["evil/mod.py,,²", "evil/other.py,,٣", "evil-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    index = DistIndex(Path)
    assert index.claims(str(site / "evil" / "mod.py")) == []
    assert index.claims(str(site / "evil" / "other.py")) == []
    (claim,) = index.claims(str(info / "RECORD"))
    assert claim.distribution == "evil"
    assert any("2 malformed rows skipped" in p for p in index.problems), index.problems


@pytest.mark.parametrize("port", NOT_ASCII)
def test_ports_in_addresses_are_ascii_digits(port: str) -> None:
    with pytest.raises(UsageError, match="expected HOST:PORT"):
        normalize(f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_listen(f"127.0.0.1:{port}")
    with pytest.raises(UsageError, match="needs a fixed port"):
        check_listen(f"127.0.0.1:{port}", 2)


@pytest.mark.parametrize("uid", NOT_ASCII)
def test_a_local_agent_uid_is_ascii_digits(uid: str) -> None:
    with pytest.raises(UsageError, match="UID a number"):
        parse_local_agent(f"{uid}:demo")


@pytest.mark.parametrize("inode", NOT_ASCII)
def test_a_namespace_link_with_other_digits_is_not_one(inode: str) -> None:
    with pytest.raises(ValueError, match="not a namespace link"):
        ns_inode(f"pid:[{inode}]")


def test_a_spool_file_named_with_other_digits_is_not_a_report(tmp_path: Path) -> None:
    """A spool directory holding "².pb" (or "٣.pb") next to the agent's own files: ignored,
    not a crash, and not read as report 3."""
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.put(1, b"one")
    (tmp_path / "².pb").write_bytes(b"x")
    (tmp_path / "٣.pb").write_bytes(b"not report 3")
    again = Spool(tmp_path, max_bytes=1 << 20)
    assert len(again) == 1


def test_the_cli_reads_a_non_ascii_number_as_a_file_name_not_a_pid(tmp_path: Path) -> None:
    """``verifier diff ٣ X``: "٣" is no pid (int would read it as pid 3); it is a file
    name, and a missing one is said so."""
    done = subprocess.run(
        [sys.executable, "-m", "servewitness", "diff", "٣", "٣"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "٣" in done.stderr and "pid 3" not in done.stderr, done.stderr
