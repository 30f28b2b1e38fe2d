"""Device-side hook counters in a real process with torch (CPU): the count a tensor op keeps,
read by the probe outside the hooked code, next to the Python fire count. Under CUDA graphs
only the device count advances on replays (exercised on the GPU); on the CPU both run eagerly,
so they must agree, and a counter incremented without any Python fire shows exactly that."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import hook_by_name, inspect_json, probe_env

SCRIPT = """\
import sys, time, torch
from verifier.probe import hook
import devmod
net = devmod.Net()
for _ in range(5):
    net(torch.ones(2))
counter = hook.device_counter("api_dev", torch.zeros(1))
counter.add_(3)  # what a captured graph's replays do: no Python runs, the tensor counts
nothing = hook.device_counter("no_torch_device", object())
time.sleep(2.5)  # the sweeper reads CPU counters of a process that runs no steps
open(sys.argv[1], "w").write(repr(nothing))
time.sleep(600)
"""

MODULE = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, x):
        return x * self.w
"""


def test_device_counter_counts_with_and_without_python_fires(tmp_path: Path) -> None:
    (tmp_path / "devmod.py").write_text(MODULE)
    ready = tmp_path / "ready"
    env = probe_env(
        tmp_path / "probe",
        VERIFIER_PROBE_EARLY="1",
        VERIFIER_HOOKS="dev=devmod:Net.forward@device",
        PYTHONPATH=str(tmp_path),
    )
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ready)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        [p] = inspect_json(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    dev = hook_by_name(p, "dev")
    assert (dev["fired"], dev["device_fired"], dev["device"]) == (5, 5, "cpu")
    api = hook_by_name(p, "api_dev")
    assert (api["fired"], api["device_fired"]) == (0, 3)  # counted on the device only
    none = hook_by_name(p, "no_torch_device")
    assert none["device_fired"] is None  # no device: no counter, and no crash
    assert ready.read_text() == "None"
