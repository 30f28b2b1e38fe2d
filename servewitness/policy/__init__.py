"""Policies: TOML pre-registration of what a run must show, and the engine that judges it.

``load_policy`` reads a policy (errors name the line and key), ``policy_digest`` pins its text,
``Policy.evaluate_target`` and ``evaluate_run`` turn evidence into verdicts with findings;
``weakest_point`` says what a PASS under a policy rests on, ``unsafe_flags`` which
weakenings it accepts; ``refused_run`` is the verdict on a run whose stored policy no longer
loads (``WeakPolicyError``: a weak one, naming its unsafe keys).
The finding ids, the schema and the verdict rules are in ``docs/policy.md``.
"""

from servewitness.policy.engine import Policy, evaluate_run, policy_digest, refused_run
from servewitness.policy.interface import PolicyError, TargetSnapshot, WeakPolicyError
from servewitness.policy.loader import load_policy
from servewitness.policy.strength import weakest_point
from servewitness.policy.unsafe import unsafe_flags

__all__ = [
    "Policy",
    "PolicyError",
    "TargetSnapshot",
    "WeakPolicyError",
    "evaluate_run",
    "load_policy",
    "policy_digest",
    "refused_run",
    "unsafe_flags",
    "weakest_point",
]
