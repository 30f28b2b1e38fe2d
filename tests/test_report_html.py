"""``verifier report RUN --html``: the page of a real run, opened in a real headless browser.

One real run for the module: `verifier serve` and `verifier agent` as subprocesses, the agent
reporting a small Python process that runs the real probe and steps like a vLLM worker (the
fake worker of tests/test_faults.py, stepping until told to stop), under a target whose name
is a script (``<script>document.title=...</script>``: agent-supplied text is hostile). One run
PASSes (its hook fires on every step) and has a sealed measurement window; another FAILs (it
expects another runner class). Each page is opened in Debian's chromium
(scripts/chromium-host.sh installs it; missing, the module fails, never skips): a screenshot
and the DOM as the browser built it.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

from servewitness.report import model as m
from servewitness.report import render
from tests.helpers import REPO, Backend, not_vllm_policy, probe_env, state_dir, verifier_cli
from tests.test_faults import RUNNER, wait_serving
from tests.test_gate_e2e import Daemon

HOSTILE = "<script>document.title='pwned'</script>"
SIZE = (1100, 1600)
CHILD = """\
import os, select, sys, time, servewitness_probe as p
p.start()
from servewitness_probe import _vllm
import fakerunner

class SchedulerOutput:
    total_num_scheduled_tokens = 1
    num_scheduled_tokens = {"r": 1}

w = fakerunner.Worker()
_vllm._worker_initialised(w)
w.execute_model(SchedulerOutput())
print("up", flush=True)
while not select.select([sys.stdin], [], [], 0.05)[0]:
    w.execute_model(SchedulerOutput())
"""


def _policy(expect: str) -> str:
    return not_vllm_policy(
        "version = 1\n[evidence]\nfreshness_s = 60\n"
        f'[runner]\nexpect_class = "{expect}"\n'
        '[[hooks]]\nname = "h"\nrole = "worker"\nmin_fires_per_productive_step = 1.0\n'
    )


@dataclass
class Run:
    dir: Path
    addr: str
    db: Path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return verifier_cli(*args, timeout=120)


@pytest.fixture(scope="module")
def chromium() -> str:
    out = subprocess.run(
        [str(REPO / "scripts" / "chromium-host.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        pytest.fail(
            f"scripts/chromium-host.sh failed ({out.returncode}):\n{out.stdout}{out.stderr}"
        )
    exe = shutil.which("chromium")
    assert exe is not None
    return exe


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    d = tmp_path_factory.mktemp("report")
    mods = d / "mods"
    mods.mkdir()
    (mods / "fakerunner.py").write_text(RUNNER)
    env = probe_env(d / "probe", PYTHONPATH=str(mods), VERIFIER_PROBE_BINDINGS="0",
                    VERIFIER_HOOKS="h=fakerunner:Runner.execute_model")  # fmt: skip
    worker = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    daemons: list[Daemon] = []
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "up"
        assert state_dir(d / "probe", worker.pid).is_dir()
        addr, db = f"unix:{d}/v.sock", d / "db.sqlite3"
        daemons.append(Daemon(["-v", "serve", "--listen", addr, "--db", str(db),
                               "--report-interval", "0.1"], d / "serve.log").start())  # fmt: skip
        wait_serving(addr, d / "serve.log")
        daemons.append(Daemon(["agent", "--verifier", addr, "--target", HOSTILE,
                               "--agent-id", "report-agent", "--pid", str(worker.pid),
                               "--interval", "0.2", "--spool", str(d / "spool"), "--no-docker"],
                              d / "agent.log").start())  # fmt: skip
        for name, expect in (("gate", "fakerunner.Runner"), ("broken", "other.Runner")):
            (d / f"{name}.toml").write_text(_policy(expect))
            out = _cli("run", "register", name, "--policy", str(d / f"{name}.toml"),
                       "--verifier", addr)  # fmt: skip
            assert out.returncode == 0, out.stderr
        out = _cli("wait", "gate", "--timeout", "60", "--verifier", addr)
        assert out.returncode == 0, out.stdout + out.stderr + (d / "agent.log").read_text()[-3000:]
        out = _cli("window", "gate", "--out", str(d / "w.json"), "--timeout", "60",
                   "--verifier", addr)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        time.sleep(1.0)  # steps run inside the window
        (d / "results.json").write_text(json.dumps({"tokens_per_s": 1.0}))
        out = _cli("seal", "gate", "--window", str(d / "w.json"), "--results",
                   str(d / "results.json"), "--verifier", addr)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        out = _cli("wait", "broken", "--timeout", "60", "--verifier", addr)
        assert out.returncode == 1, out.stdout + out.stderr
        yield Run(d, addr, db)
    finally:
        for daemon in reversed(daemons):
            if daemon.proc is not None:
                daemon.stop()
        worker.communicate(input="", timeout=10)


# the browser -------------------------------------------------------------------------------
@dataclass
class Opened:
    dom: str
    title: str
    text: str
    png: Path


def _chromium(exe: str, page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={page.parent / 'chromium-profile'}", *flags, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def open_page(exe: str, page: Path, screenshot: bool = False) -> Opened:
    """PAGE as the browser renders it: the DOM after it loaded (and a screenshot of SIZE)."""
    png = page.with_suffix(".png")
    if screenshot:
        shot = _chromium(exe, page, f"--screenshot={png}", f"--window-size={SIZE[0]},{SIZE[1]}")
        assert png.is_file(), shot.stderr[-3000:]
    dom = _chromium(exe, page, "--dump-dom")
    assert dom.returncode == 0 and "<html" in dom.stdout, dom.stderr[-3000:]
    title = re.search(r"<title>(.*?)</title>", dom.stdout, re.S)
    body = re.sub(r"<style>.*?</style>", " ", dom.stdout, flags=re.S)
    text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))
    return Opened(dom.stdout, html.unescape(title.group(1)) if title else "", text, png)


def _png_pixels(data: bytes) -> tuple[tuple[int, int], list[bytes]]:
    """A PNG's size and its pixels (8-bit RGB or RGBA, not interlaced: what chromium writes),
    decoded with the standard library: chunks, zlib, then each row's filter undone."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        head, idat = (body, idat) if kind == b"IHDR" else (head, idat + body * (kind == b"IDAT"))
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", head)
    assert (depth, colour, interlace) in {(8, 2, 0), (8, 6, 0)}, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw, stride, rows = zlib.decompress(idat), width * bpp, []
    prev = bytearray(stride)
    for y in range(height):
        kind, row = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + a) & 255
            elif kind == 2:
                row[i] = (row[i] + b) & 255
            elif kind == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(row))
        prev = row
    pixels = [r[i : i + 3] for r in rows for i in range(0, stride, bpp)]
    return (width, height), pixels


def assert_not_blank(png: Path) -> None:
    """PNG is a screenshot of SIZE with many colours, most of it not the white background."""
    size, pixels = _png_pixels(png.read_bytes())
    assert size == SIZE
    colours = set(pixels)
    assert len(colours) > 50, f"{len(colours)} colours: a blank page"
    assert pixels.count(b"\xff\xff\xff") < 0.97 * len(pixels)


def report(r: Run, name: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out_path = r.dir / f"{name}.html"
    return _cli("report", *args, "--html", str(out_path)), out_path


# tests -------------------------------------------------------------------------------------
def test_report_of_a_passing_run_shows_verdict_targets_timeline_provenance_and_window(
    run: Run, chromium: str
) -> None:
    out, page = report(run, "gate-db", "gate", "--db", str(run.db))
    assert out.returncode == 0, out.stderr
    assert "run gate PASS, 1 target(s)" in out.stdout
    said, again = report(run, "gate-json", "gate", "--db", str(run.db), "--json")
    doc = json.loads(said.stdout)
    assert (doc["html"], doc["verdict"], doc["targets"]) == (str(again), "PASS", 1), doc
    got = open_page(chromium, page, screenshot=True)
    assert_not_blank(got.png)
    blank = run.dir / "blank.html"
    blank.write_text("<!DOCTYPE html><title>blank</title>")
    with pytest.raises(AssertionError, match="a blank page"):  # the check sees a blank one
        assert_not_blank(open_page(chromium, blank, screenshot=True).png)
    assert got.title == "verifier report: run gate PASS"
    assert "Run gate PASS" in got.text
    assert f"Target {HOSTILE} PASS" in got.text  # its name, shown as text
    assert "rank 0 worker pid" in got.text
    assert "hook h fires" in got.text  # the timeline's legend
    assert got.dom.count("<polyline") >= 3  # steps, productive steps, hook h: lines in time
    assert "Provenance by origin" in got.text and "stdlib" in got.text
    assert "Measurement windows (1, 1 sealed)" in got.text
    assert ": held" in got.text and "results.json" in got.text
    assert "LEDGER MISMATCH" not in got.text
    assert self_contained(page.read_text()) == []


def test_a_target_named_script_renders_as_text_and_runs_nothing(
    run: Run, chromium: str, tmp_path: Path
) -> None:
    """The agent-supplied target name would set the page's title if it ran. It does not: the
    title is the report's own, the DOM holds no script element, and the name is in it as
    text. Negative controls: the same page with the name unescaped runs it (the check sees a
    script that runs), and with the name unescaped but the page's CSP kept, the CSP stops it."""
    _, page = report(run, "gate-db-2", "gate", "--db", str(run.db))
    source = page.read_text()
    escaped = html.escape(HOSTILE, quote=True)
    assert escaped in source and HOSTILE not in source
    got = open_page(chromium, page)
    assert got.title == "verifier report: run gate PASS"
    assert "<script" not in got.dom.lower()
    assert HOSTILE in got.text

    csp = re.search(r'<meta http-equiv="Content-Security-Policy"[^>]*>', source)
    assert csp is not None
    raw = tmp_path / "raw.html"
    raw.write_text(source.replace(escaped, HOSTILE).replace(csp.group(0), ""))
    assert open_page(chromium, raw).title == "pwned"
    kept = tmp_path / "kept.html"
    kept.write_text(source.replace(escaped, HOSTILE))
    assert open_page(chromium, kept).title == "verifier report: run gate PASS"


def test_report_of_a_failing_run_shows_fail_and_its_findings(run: Run, chromium: str) -> None:
    out, page = report(run, "broken-db", "broken", "--db", str(run.db))
    assert out.returncode == 0, out.stderr  # the page is written; the verdict is on it
    assert "run broken FAIL" in out.stdout
    got = open_page(chromium, page)
    assert got.title == "verifier report: run broken FAIL"
    assert "Run broken FAIL" in got.text
    head = got.text.split("Verdict over time")[0]
    assert "PASS" not in head
    assert f"Why FAIL: liveness.runner.unexpected in {HOSTILE}" in head  # first, not at the end
    finding = r"error liveness\.runner\.unexpected " + re.escape(HOSTILE)
    assert re.search(finding, got.text), got.text[-3000:]
    assert "Measurement windows" not in got.text  # windows of another run are not its own


def test_report_from_the_live_verifier_has_messages_and_says_what_it_lacks(
    run: Run, chromium: str
) -> None:
    out, page = report(run, "broken-live", "broken", "--verifier", run.addr)
    assert out.returncode == 0, out.stderr
    got = open_page(chromium, page)
    assert "Run broken FAIL" in got.text
    assert "expect" in got.text and "other.Runner" in got.text  # the finding's own message
    assert "need its database (--db)" in got.text
    assert "Verdict over time" not in got.text
    out, page = report(run, "broken-both", "broken", "--db", str(run.db), "--verifier", run.addr)
    assert out.returncode == 0, out.stderr
    got = open_page(chromium, page)
    assert "other.Runner" in got.text and "Verdict over time" in got.text
    assert f"database {run.db}" in got.text and "need its database" not in got.text


def test_caps_cut_a_long_run_and_the_page_says_so(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With at most 3 timeline points per target, the page draws 3 of the stored reports
    (the first and the latest among them) and names the cut."""
    from servewitness._cli._audit_db import open_ro, reading
    from servewitness.report import from_db

    monkeypatch.setattr(m, "MAX_SAMPLES", 3)
    db = open_ro(str(run.db))
    with reading(db):
        got = from_db.gather(db, "gate", time.time(), "db")
    (target,) = got.targets
    assert target.reports > 3
    samples = target.processes[0].samples
    assert len(samples) in {2, 3}  # 3 reports, or 2 when the spread's last is the latest
    assert samples[-1].at_unix == target.last_report_unix
    assert f"timeline of {len(samples)} of its {target.reports} stored reports" in " ".join(
        got.notes
    )


def test_hostile_and_huge_values_are_escaped_and_bounded() -> None:
    long = "x" * 100_000
    red = m.FindingRow("a.b", "error", "red \x1b[31m", HOSTILE)
    many = [m.FindingRow("a.b", "error", long, HOSTILE)] * m.MAX_FINDINGS
    samples = (m.Sample(1.0, 1, 1, (("<marquee>", 1),)), m.Sample(float("nan"), 2, 2))
    r = m.Report(
        run='"><img src=x onerror=alert(1)>',
        verdict="FAIL",
        findings=(red, *many),
        targets=(m.TargetView(long, processes=(m.ProcessView(1, "<blink>", 0, samples=samples),)),),
        history=((float("inf"), "PASS"), (1.0, "<FAIL>")),
    )
    page = render(r)
    assert "<img" not in page and "<blink" not in page and "<marquee" not in page
    assert "&lt;blink&gt;" in page and "&lt;marquee&gt;" in page
    assert "\x1b" not in page and "\\x1b[31m" in page
    assert "more characters]" in page
    assert len(page) < 3_000_000  # 300 findings of 100 kB each, cut to a few kB each
    assert self_contained(page) == []


class _Refs(HTMLParser):
    """Every element or attribute of a page that could run code or load anything."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in {"script", "link", "iframe", "object", "embed", "img", "image", "use", "base"}:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"{tag} {name}")
            loads = name in {"src", "href", "xlink:href", "action", "data", "srcset", "poster"}
            if loads and not (value or "").startswith("#"):
                self.found.append(f"{tag} {name}={value}")


def self_contained(page: str) -> list[str]:
    """What in PAGE (parsed by the standard library's HTML parser) runs or loads anything."""
    refs = _Refs()
    refs.feed(page)
    refs.close()
    return refs.found + (["url( in CSS"] if "url(" in page else [])


def test_a_stored_report_edited_after_it_was_ledgered_is_left_out_and_exits_1(
    run: Run, tmp_path: Path
) -> None:
    db = tmp_path / "edited.sqlite3"
    with closing(sqlite3.connect(run.db)) as src, closing(sqlite3.connect(db)) as dst:
        src.backup(dst)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE reports SET received_unix = received_unix + 1 WHERE seq = 2")
        conn.commit()
    out = _cli("report", "gate", "--db", str(db), "--html", str(tmp_path / "e.html"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "differ from their ledger entries" in out.stderr
    assert "LEDGER MISMATCH" in (tmp_path / "e.html").read_text()


def test_bad_input_is_a_clear_error(run: Run, tmp_path: Path) -> None:
    page = str(tmp_path / "x.html")
    out = _cli("report", "gate", "--html", page)
    assert (out.returncode, "give --db DATABASE, --verifier ADDRESS, or both") == (
        2, out.stderr.strip().removeprefix("verifier: error: "))  # fmt: skip
    out = _cli("report", "nope", "--db", str(run.db), "--html", page)
    assert out.returncode == 6 and "no run named 'nope'" in out.stderr, out.stderr
    out = _cli("report", "nope", "--verifier", run.addr, "--html", page)
    assert out.returncode == 2 and "nope" in out.stderr, out.stderr
    out = _cli("report", "gate", "--db", str(tmp_path / "none.sqlite3"), "--html", page)
    assert out.returncode == 3, out.stderr
    out = _cli("report", "gate", "--db", str(run.db), "--html", str(tmp_path / "no" / "x.html"))
    assert out.returncode == 3 and "cannot write the report" in out.stderr, out.stderr
    assert not Path(page).exists()


def test_timeline_sampling_and_history_read_the_same_on_sqlite_and_postgresql(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's SQL (a window function, ``%`` among placeholders) on both dialects: of 10
    stored reports, at most 4 evenly spread with the first and the latest; the latest 2 of 3
    verdict changes with the count."""
    from servewitness._cli._audit_db import open_ro, reading
    from servewitness.report import from_db
    from servewitness.server.store import Store

    Store(backend.target).close()  # the schema
    backend.sql(*[
        ("INSERT INTO reports (agent_id, seq, target, received_unix, report) VALUES "
         "(?, ?, ?, ?, ?)", ("a", i, "t", 100.0 + i, b"x")) for i in range(1, 11)
    ], *[
        ("INSERT INTO verdicts (run, at_unix, verdict, detail_json) VALUES (?, ?, ?, ?)",
         ("r", 10.0 * i, v, "{}")) for i, v in enumerate(("PENDING", "PASS", "FAIL"))
    ])  # fmt: skip
    monkeypatch.setattr(m, "MAX_SAMPLES", 4)
    monkeypatch.setattr(m, "MAX_HISTORY", 2)
    db = open_ro(backend.target)
    with reading(db):
        keys, total = from_db._sample_keys(db, "t")
        history, changes, _ = from_db._history(db, "r")
    assert total == 10
    assert [s for _, s, _ in keys] == [1, 4, 7, 10]
    assert (history, changes) == ([(10.0, "PASS"), (20.0, "FAIL")], 3)
