"""Device-side hook counters in a real process with torch (CPU): the count a tensor op keeps,
read by the probe outside the hooked code, next to the Python fire count. Under CUDA graphs
only the device count advances on replays (exercised on the GPU); on the CPU both run eagerly,
so they must agree, and a counter incremented without any Python fire shows exactly that."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import hook_by_name, inspect_json, probe_env, verifier_cli, wait_ready

SCRIPT = """\
import sys, time, torch
from servewitness_probe import hook
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
        wait_ready(proc, ready, 120)
        [p] = inspect_json(proc.pid)
        text = verifier_cli("inspect", "--pid", str(proc.pid)).stdout
    finally:
        proc.kill()
        proc.wait()
    # the text view puts the device count beside the steps it is read against (none here)
    assert "dev: device counter on cpu: 5 (0 productive steps); no base yet" in text
    assert "api_dev: device counter on cpu: 3 (0 productive steps)" in text
    dev = hook_by_name(p, "dev")
    assert (dev["fired"], dev["device_fired"], dev["device"]) == (5, 5, "cpu")
    api = hook_by_name(p, "api_dev")
    assert (api["fired"], api["device_fired"]) == (0, 3)  # counted on the device only
    none = hook_by_name(p, "no_torch_device")
    assert none["device_fired"] is None  # no device: no counter, and no crash
    assert ready.read_text() == "None"


COMPILED = """\
import sys, time, torch
import devmod
net = devmod.Net()
compiled = torch.compile(net, fullgraph=True, backend=sys.argv[2])
with torch.inference_mode():  # as vLLM runs its model
    for _ in range(4):
        compiled(torch.ones(2))  # traced once, then the compiled call: no Python fire
    for _ in range(2):
        net(torch.ones(2))  # eager calls: counted by Python and on the device
time.sleep(2.5)
open(sys.argv[1], "w").write("ok")
time.sleep(600)
"""


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_calls_count_on_the_device_only(tmp_path: Path, backend: str) -> None:
    """Seen on the H200 (vLLM 0.26, CUDA graphs): Dynamo traced the hook's wrapper into the
    compiled model, could not trace the probe's counters (a memoryview) and, vLLM compiling
    with fullgraph=True, the engine did not start. The wrapper now leaves its Python fire out
    of what torch.compile traces (compiled calls are not counted in Python) and traces its
    device increment in as the ``verifier_probe::tick`` op instead: every compiled call counts
    on the device, through Dynamo alone, AOTAutograd and Inductor, which would drop an op
    without outputs as dead code if it were not registered as side-effecting. Under CUDA
    graphs the op's increment is captured, so replays count (exercised on the GPU)."""
    (tmp_path / "devmod.py").write_text(MODULE)
    ready = tmp_path / "ready"
    env = probe_env(
        tmp_path / "probe",
        VERIFIER_PROBE_EARLY="1",
        VERIFIER_HOOKS="fwd=devmod:Net.forward,fwd_dev=devmod:Net.forward@device",
        PYTHONPATH=str(tmp_path),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    argv = [sys.executable, "-c", COMPILED, str(ready), backend]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    try:
        wait_ready(proc, ready, 300)
        [p] = inspect_json(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert hook_by_name(p, "fwd")["fired"] == 2  # the eager calls only
    dev = hook_by_name(p, "fwd_dev")
    assert dev["fired"] == 2  # Python: the eager calls only
    assert dev["device_fired"] == 6  # the device: 4 compiled calls and 2 eager ones
    assert not p.get("errors"), p.get("errors")
