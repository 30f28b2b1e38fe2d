"""Request bindings against the real vLLM server on the CPU: the API server maps each client's
X-Request-Id (through vLLM's external id) to the engine's internal ids, and the worker records
which steps served each internal id, the manifest position and the hook fires in that window.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from servewitness_probe import layout as L

from servewitness.evidence.bindings_reader import BindingsReader, ExternalId, RequestSpan
from servewitness.evidence.counters import read_counters
from servewitness.evidence.probe_reader import read_probe_dir
from servewitness.evidence.process import read_tree
from servewitness.evidence.procfs import ProcFS
from servewitness.testing.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

MAX_TOKENS = 8
LONG_TOKENS = 240  # about half a second on the tiny model
WAIT_S = 10.0
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@dataclass
class Seen:
    """Everything read so far from the API server's and the worker's bindings."""

    api_dir: Path
    worker_dir: Path
    engine_dir: Path
    reader: BindingsReader
    ext: list[ExternalId]
    spans: list[RequestSpan]

    def poll(self) -> None:
        _, ext = self.reader.read(self.api_dir)
        spans, _ = self.reader.read(self.worker_dir)
        self.ext += ext
        self.spans += spans

    def ext_of(self, external: str) -> list[ExternalId]:
        return [e for e in self.ext if e.external_id == external]

    def span(self, internal: str) -> RequestSpan | None:
        found = [s for s in self.spans if s.internal_id == internal]
        assert len(found) <= 1, found
        return found[0] if found else None

    def wait(self, externals: list[str], count: dict[str, int] | None = None) -> None:
        """Poll until every external id has its ext records (COUNT of them, default 1) and
        every internal id behind them its span."""
        deadline = time.monotonic() + WAIT_S
        while True:
            self.poll()
            done = all(len(self.ext_of(x)) >= (count or {}).get(x, 1) for x in externals) and all(
                self.span(e.internal_id) is not None for x in externals for e in self.ext_of(x)
            )
            if done or time.monotonic() > deadline:
                return
            time.sleep(0.2)


def _dirs(server: VllmServer) -> dict[str, Path]:
    out = {}
    for p in read_tree(ProcFS(), server.pid):
        if p.probe is not None:
            out[p.role] = Path(p.probe.directory)
    return out


def _chat(server: VllmServer, content: str, request_id: str) -> dict[str, Any]:
    body = {
        "model": str(server.model),
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "chat_template": CHAT_TEMPLATE,
    }
    req = urllib.request.Request(  # noqa: S310 - our own http URL
        server.base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": request_id},
    )
    with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - our own http URL
        out: dict[str, Any] = json.loads(r.read())
    return out


@pytest.fixture(scope="module")
def ids() -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    return {k: f"bind-{k}-{tag}" for k in ("one", "two", "chat", "long", "never")}


@pytest.fixture(scope="module")
def seen(vllm_server: VllmServer, ids: dict[str, str]) -> Seen:
    dirs = _dirs(vllm_server)
    s = Seen(dirs["api_server"], dirs["worker"], dirs["engine_core"], BindingsReader(), [], [])
    s.poll()  # what earlier tests left: not ours
    one = vllm_server.complete(
        "bindings one", max_tokens=MAX_TOKENS, headers={"X-Request-Id": ids["one"]}
    )
    assert one["id"] == f"cmpl-{ids['one']}"
    vllm_server.complete(
        "bindings two",
        max_tokens=MAX_TOKENS,
        n=2,
        temperature=0.8,  # vLLM refuses n > 1 with greedy sampling
        seed=1,
        headers={"X-Request-Id": ids["two"]},
    )
    chat = _chat(vllm_server, "bindings chat", ids["chat"])
    assert chat["id"] == f"chatcmpl-{ids['chat']}"
    s.wait(
        [f"cmpl-{ids['one']}-0", f"cmpl-{ids['two']}-0", f"chatcmpl-{ids['chat']}"],
        {f"cmpl-{ids['two']}-0": 2},
    )
    return s


def test_completion_external_id_embeds_x_request_id_and_maps_to_one_internal_id(
    seen: Seen, ids: dict[str, str]
) -> None:
    (e,) = seen.ext_of(f"cmpl-{ids['one']}-0")
    assert e.internal_id.startswith(f"cmpl-{ids['one']}-0-")
    assert e.x_request_id == ids["one"]
    assert abs(e.unix_ns - time.time_ns()) < 600 * 10**9


def test_n2_children_get_their_own_internal_ids_under_one_external_id(
    seen: Seen, ids: dict[str, str]
) -> None:
    ext = seen.ext_of(f"cmpl-{ids['two']}-0")
    internal = sorted(e.internal_id for e in ext)
    assert len(internal) == 2
    assert internal[0].startswith(f"0_cmpl-{ids['two']}-0-")
    assert internal[1].startswith(f"1_cmpl-{ids['two']}-0-")
    assert {e.x_request_id for e in ext} == {ids["two"]}
    for i in internal:
        span = seen.span(i)
        assert span is not None and span.finished
        assert span.steps >= MAX_TOKENS - 1


def test_chat_external_id_is_chatcmpl_and_the_header(seen: Seen, ids: dict[str, str]) -> None:
    (e,) = seen.ext_of(f"chatcmpl-{ids['chat']}")
    assert e.internal_id.startswith(f"chatcmpl-{ids['chat']}-")
    assert e.x_request_id == ids["chat"]
    span = seen.span(e.internal_id)
    assert span is not None and span.finished and span.steps >= MAX_TOKENS - 1


def test_worker_span_of_a_completion(seen: Seen, ids: dict[str, str]) -> None:
    (e,) = seen.ext_of(f"cmpl-{ids['one']}-0")
    span = seen.span(e.internal_id)
    assert span is not None
    assert span.finished
    assert MAX_TOKENS - 1 <= span.steps <= MAX_TOKENS + 1
    assert span.first_step <= span.last_step
    assert span.last_step - span.first_step + 1 >= span.steps
    # A prefill of the prompt plus one token per decode step.
    assert span.tokens > span.steps
    assert span.first_unix_ns <= span.last_unix_ns
    assert 0 <= span.files_first <= span.files_last
    slots = read_counters(seen.worker_dir / L.COUNTERS_FILE)
    assert slots is not None
    assert span.files_last <= slots[L.S_FILES_RECORDED]
    assert span.last_step <= slots[L.S_STEPS_TOTAL]
    journal = (seen.worker_dir / L.JOURNAL_FILE).read_bytes().splitlines()
    assert sum(1 for line in journal if b'"k":"file"' in line) >= slots[L.S_FILES_RECORDED]


def test_hook_fire_deltas_cover_declared_hooks(seen: Seen, ids: dict[str, str]) -> None:
    (e,) = seen.ext_of(f"cmpl-{ids['one']}-0")
    span = seen.span(e.internal_id)
    assert span is not None
    probe = read_probe_dir(seen.worker_dir)
    assert probe is not None
    declared = {h.name for h in probe.hooks}
    assert {"v1_step", "v2_step", "v1_sample"} <= declared
    assert set(span.hooks) == declared
    # The live V1 runner's step fires in every step that served the request; the V2 runner
    # is never instantiated on this build: zero, not missing.
    assert span.hooks["v1_step"] >= span.steps
    assert span.hooks["v1_sample"] >= span.steps
    assert span.hooks["v2_step"] == 0


def test_unknown_id_is_absent_and_only_the_worker_has_spans(
    seen: Seen, ids: dict[str, str]
) -> None:
    assert not [e for e in seen.ext if ids["never"] in e.external_id]
    assert not [s for s in seen.spans if ids["never"] in s.internal_id]
    internal = {e.internal_id for e in seen.ext}
    assert not [s for s in seen.spans if s.internal_id == ids["one"]]  # raw header: not an id
    spans, ext = BindingsReader().read(seen.engine_dir)
    assert (spans, ext) == ([], [])
    assert seen.reader.malformed == 0
    assert internal  # the API server wrote ext records; the worker spans, no ext
    assert all(s.internal_id for s in seen.spans)


def test_running_request_has_no_span_until_it_finishes(
    vllm_server: VllmServer, seen: Seen, ids: dict[str, str]
) -> None:
    body = {
        "model": str(vllm_server.model),
        "prompt": "bindings long",
        "max_tokens": LONG_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    req = urllib.request.Request(  # noqa: S310 - our own http URL
        vllm_server.base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": ids["long"]},
    )
    prefix = f"cmpl-{ids['long']}-0-"
    with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - our own http URL
        first = r.readline()  # the first token is out: the request runs
        assert first.startswith(b"data: ")
        seen.poll()
        assert not [s for s in seen.spans if s.internal_id.startswith(prefix)]
        rest = r.read()
    assert rest.rstrip().endswith(b"data: [DONE]")
    seen.wait([f"cmpl-{ids['long']}-0"])
    (e,) = seen.ext_of(f"cmpl-{ids['long']}-0")
    assert e.internal_id.startswith(prefix)
    span = seen.span(e.internal_id)
    assert span is not None and span.finished
    assert span.steps >= LONG_TOKENS - 1
