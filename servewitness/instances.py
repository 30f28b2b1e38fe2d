"""Target instances: one target per serving pod or container, named ``FAMILY/INSTANCE``.

A Deployment of N vLLM pods reports as N targets, ``vllm/<pod name>`` each (the agent's
``--instance``), so that no replica's evidence merges into another's. The family is what the
other parts name:

* a credential for target ``vllm`` (a certificate's ``verifier:target:vllm``, a token's or a
  local agent's ``targets``) may report for ``vllm`` and for every ``vllm/<instance>``
  (``covered``): the replicas of one Deployment share one Secret, so one credential speaks
  for all of them; a credential naming one instance (``vllm/pod-a``) speaks for that one only;
* a policy's ``[targets] replicas_of = ["vllm"]`` selects every instance of the family, and
  ``min_targets`` counts them (``policy/loader.py``);
* a ``[targets.containers]`` binding of the family applies to each of its instances.

A name is an instance only when what follows its first ``/`` is an instance name
(``is_instance``); any other name with a ``/`` (``</script>``, ``a/b/c``) stays the plain
target name it always was.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SEPARATOR = "/"
# An instance name: a pod name (a DNS subdomain, at most 253 characters) or a container id.
INSTANCE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")


def instance_family(target: str) -> str | None:
    """The family of TARGET when it names an instance (a family, ``/``, and an instance name:
    ``INSTANCE``); None for any other name, ``/`` in it or not: a plain target name, as it
    always was."""
    fam, sep, name = target.partition(SEPARATOR)
    return fam if fam and sep and INSTANCE.fullmatch(name) is not None else None


def is_instance(target: str) -> bool:
    """Whether TARGET names an instance (``instance_family``)."""
    return instance_family(target) is not None


def family(target: str) -> str:
    """The family of TARGET when it names an instance, else TARGET."""
    return instance_family(target) or target


def instance_of(target: str, name: str) -> str:
    """The target that instance NAME of family TARGET reports as. Raises ValueError when
    TARGET already names an instance or NAME is not an instance name (``INSTANCE``)."""
    if SEPARATOR in target:
        raise ValueError(f"target {target!r} already names an instance")
    if INSTANCE.fullmatch(name) is None:
        raise ValueError(
            f"instance {name!r} is not a pod name or container id (letters, digits, '.', '_' "
            "and '-', at most 253, starting and ending with a letter or digit)"
        )
    return f"{target}{SEPARATOR}{name}"


def covered(allowed: Iterable[str], target: str) -> bool:
    """Whether a credential naming the targets ALLOWED may report for TARGET: it names TARGET,
    or TARGET is an instance of a family it names."""
    names = set(allowed)
    return target in names or instance_family(target) in names
