"""The pytest plugin (servewitness.client.pytest_plugin) in a real inner pytest session (pytester,
in a subprocess) against a real verifier, a real agent and the session's vLLM server: a gated
test passes and its seal verifies offline; a gate that cannot pass fails the inner test with
the verifier's reason and never runs the block; the plugin is opt-in."""

from __future__ import annotations

import json
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest

from servewitness.client.window import seal_content
from servewitness.testing.vllm_server import VllmServer
from tests.helpers import REPO, verifier_cli
from tests.test_gate_e2e import Local, hook, local_verifier, policy

pytest_plugins = ["pytester"]

PLUGIN = "servewitness.client.pytest_plugin"

INNER = """
import json
import urllib.request
from pathlib import Path

import pytest

URL, MODEL, OUT = {url!r}, {model!r}, Path({out!r})


def complete(i):
    body = {{"model": MODEL, "prompt": f"plugin {{i}}", "max_tokens": 4, "ignore_eos": True}}
    req = urllib.request.Request(URL + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={{"Content-Type": "application/json"}})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200


def test_live(gated_measurement):
    results = OUT / "live.json"
    with gated_measurement("live", results=results) as m:
        for i in range(3):
            complete(i)
        results.write_text(json.dumps({{"tokens": 12}}))
    assert m.summary["held"] is True
    (OUT / "live.summary.json").write_text(json.dumps(m.summary))


def test_dead(gated_measurement):
    with gated_measurement("dead", results=OUT / "dead.json"):
        (OUT / "dead.block-ran").write_text("the block ran")
        (OUT / "dead.json").write_text("{{}}")


def test_own_error(gated_measurement):
    with gated_measurement("live", results=OUT / "own.json"):
        raise ValueError("the benchmark's own failure")
"""


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer) -> Iterator[Local]:
    """A real verifier with an agent on the session's vLLM server (target cpu-0); run "live"
    (the V1 step hook, which fires on every step there) and run "dead" (a hook that the probe
    was never told about: FAIL once steps ran)."""
    d = tmp_path_factory.mktemp("plugin")
    with local_verifier(d) as v:
        v.agent("cpu-0", vllm_server.pid)
        for name, text in (("live", policy(hook("v1_step"))), ("dead", policy(hook("never")))):
            (d / f"{name}.toml").write_text(text)
            out = verifier_cli("run", "register", name, "--policy", str(d / f"{name}.toml"),
                               "--verifier", v.addr)  # fmt: skip
            assert out.returncode == 0, out.stderr
        vllm_server.complete("a step before the gate", max_tokens=2)  # min_steps = 1
        yield v


@pytest.mark.vllm  # the shared vLLM server: in the second phase, not a boot of its own
def test_a_gated_test_passes_its_seal_verifies_and_a_failing_gate_fails_the_test_with_why(
    pytester: pytest.Pytester, verifier: Local, vllm_server: VllmServer
) -> None:
    out = pytester.path / "out"
    out.mkdir()
    pytester.makepyfile(
        test_bench=INNER.format(
            url=vllm_server.base_url, model=str(vllm_server.model), out=str(out)
        )
    )
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        "-p", PLUGIN, "-p", "no:cacheprovider", "--verifier-address", verifier.addr,
        "--verifier-timeout", "60", f"--junitxml={junit}", "-rA",
    )  # fmt: skip
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, text + verifier.logs()
    report = ET.parse(junit).getroot()  # noqa: S314 - the inner session's own report
    outcomes = {c.get("name"): c for c in report.iter("testcase")}

    def failures(name: str) -> list[ET.Element]:
        return [e for e in outcomes[name] if e.tag in ("failure", "error")]

    # test_live: passed, the window held, the seal is the verifier's and verifies offline.
    assert failures("test_live") == [], text + verifier.logs()
    summary = json.loads((out / "live.summary.json").read_text())
    seal = out / "live.json.seal.json"
    assert summary["held"] is True and summary["statement"] == str(seal)
    content = seal_content(seal.read_text())
    assert content["held"] is True and content["findings"] == [], content["findings"]
    check = verifier_cli("audit", "verify-seal", str(seal), "--key",
                         str(verifier.db) + ".signing.key.pub", "--results",
                         str(out / "live.json"))  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    props = {p.get("name"): p.get("value") for p in outcomes["test_live"].iter("property")}
    assert props == {
        "verifier_run": "live",
        "verifier_window": summary["window_id"],
        "verifier_held": "True",
        "verifier_seal": str(seal),
        "verifier_seal_signature": "not checked",  # no --verifier-key
    }

    # test_dead: failed with the verifier's reason, no plugin traceback; the block never ran
    # and nothing was sealed.
    (failure,) = failures("test_dead")
    assert failure.tag == "failure"
    message = failure.get("message", "")
    assert message.startswith("Failed: verifier gate on run dead: "), message
    assert "liveness.hook.not_declared: hook never is not declared" in message, message
    assert "pytest_plugin.py" not in (failure.text or ""), failure.text
    assert "another exception occurred" not in (failure.text or ""), failure.text
    assert not (out / "dead.block-ran").exists()
    assert not (out / "dead.json.seal.json").exists()

    # test_own_error: the block's own exception, unchanged.
    (own,) = failures("test_own_error")
    assert "ValueError: the benchmark's own failure" in (own.text or ""), own.text
    assert "verifier gate" not in own.get("message", "")


def test_the_plugin_is_opt_in(pytester: pytest.Pytester) -> None:
    """Without -p the fixture does not exist (nothing registers it under pytest11); a gate
    without a run name fails the test saying so, before any verifier is called."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "pytest11" not in project.get("entry-points", {})
    pytester.makepyfile(
        test_x="def test_x(gated_measurement):\n    with gated_measurement():\n        pass\n"
    )
    without = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert without.ret == pytest.ExitCode.TESTS_FAILED
    without.stdout.fnmatch_lines(["*fixture 'gated_measurement' not found*"])
    with_plugin = pytester.runpytest_subprocess(
        "-p", PLUGIN, "-p", "no:cacheprovider", "--verifier-address", "unix:/nonexistent"
    )
    assert with_plugin.ret == pytest.ExitCode.TESTS_FAILED
    with_plugin.stdout.fnmatch_lines(["*gated_measurement: name the run*--verifier-run*"])
