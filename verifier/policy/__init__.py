"""Policies: TOML pre-registration of what a run must show, and the engine that judges it.

``load_policy`` reads a policy (errors name the line and key), ``policy_digest`` pins its text,
``Policy.evaluate_target`` and ``evaluate_run`` turn evidence into verdicts with findings.
The finding ids, the schema and the verdict rules are in ``docs/policy.md``.
"""

from verifier.policy.engine import Policy, evaluate_run, policy_digest
from verifier.policy.interface import PolicyError, TargetSnapshot
from verifier.policy.loader import load_policy
from verifier.policy.unsafe import unsafe_flags

__all__ = [
    "Policy",
    "PolicyError",
    "TargetSnapshot",
    "evaluate_run",
    "load_policy",
    "policy_digest",
    "unsafe_flags",
]
