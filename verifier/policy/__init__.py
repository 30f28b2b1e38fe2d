"""Policies: TOML pre-registration of what a run must show, and the engine that judges it.

``load_policy`` reads a policy (errors name the line and key), ``policy_digest`` pins its text,
``Policy.evaluate_target`` and ``evaluate_run`` turn evidence into verdicts with findings;
``weakest_point`` says what a PASS under a policy rests on, ``Policy.unsafe_flags`` which
weakenings it accepts.
The finding ids, the schema and the verdict rules are in ``docs/policy.md``.
"""

from verifier.policy.engine import Policy, evaluate_run, policy_digest
from verifier.policy.interface import PolicyError, TargetSnapshot
from verifier.policy.loader import load_policy
from verifier.policy.strength import weakest_point

__all__ = [
    "Policy",
    "PolicyError",
    "TargetSnapshot",
    "evaluate_run",
    "load_policy",
    "policy_digest",
    "weakest_point",
]
