"""The noise floor, demonstrated: replicate boots of the tiny CPU server, compared.

BOOTS boots of the same configuration, alternating between two arms "A" and "A'" that differ
in nothing but the boot; each boot is sampled (`verifier sample`, from the probe's counters)
under one client and under four concurrent clients. Then `verifier compare`:
  1. A vs A' at one client: the same configuration: the difference must be within the floor;
  2. one client vs four clients over all boots: a real difference, priced against the floor;
  3. one boot per arm: the floor is unknown and is reported as such.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke

from servewitness.testing.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[1]
BOOTS = 4
SECONDS = "6"
IN_PROCESS = False  # smoke mode: the CLI runs in this process (no start-up per call)
PAUSE_S = 0.0  # each client's pause between requests (smoke mode: the sampler gets the CPU)


def cli_in_process(*args: str) -> str:
    """`verifier ARGS` called in this process: its stdout (SystemExit on a failure)."""
    from servewitness._cli.main import main as verifier_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = verifier_main(list(args))
    if code != 0:
        raise SystemExit(f"verifier {' '.join(args)}: exit {code}: {err.getvalue()}")
    return out.getvalue()


def cli(*args: str) -> str:
    if IN_PROCESS:
        return cli_in_process(*args)
    out = subprocess.run(
        [sys.executable, "-m", "servewitness", *args], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"verifier {' '.join(args)}: {out.stderr}")
    return out.stdout


def sample(server: VllmServer | _smoke.Attached, clients: int, out: Path) -> None:
    stop = threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            server.complete(f"bench {i}", max_tokens=32)
            stop.wait(PAUSE_S)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        print(
            cli("sample", "--pid", str(server.pid), "--seconds", SECONDS, "--out", str(out)), end=""
        )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)


def sample_boot(
    server: VllmServer | _smoke.Attached, boot: int, d: Path, clients: tuple[int, ...] = (1, 4)
) -> None:
    """BOOT's samples (arms alternate between boots) under each number of CLIENTS."""
    arm = "A" if boot % 2 == 0 else "A2"
    server.complete("warm", max_tokens=2)
    for n in clients:
        sample(server, n, d / f"{arm}-b{boot}-c{n}.json")


def main() -> None:
    global SECONDS, IN_PROCESS, PAUSE_S
    args = _smoke.parse(__doc__, live=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if args.smoke:
            _smoke.begin(
                "the samples and the three comparisons: three 1 s samples of a running server "
                "(one client in 'boot' 0 and 1, four clients in 'boot' 0), the CLI in-process",
                [
                    "booting: both 'boots' are the one running server (one boot id), so "
                    "compare sees one boot per arm where the benchmark has two; the floor "
                    "between boots is computed from real boots only in the full run",
                    "the CLI's process start-up (it runs in this process), and a saturating "
                    "load: each client pauses 0.5 s between requests, so that the sampler's "
                    "journal reads get the CPU (under full load a sample took ~10 s here)",
                ],
            )
            SECONDS, IN_PROCESS, PAUSE_S = "1", True, 0.5
            server = _smoke.Attached(args.url, args.pid)
            sample_boot(server, 0, d)
            sample_boot(server, 1, d, clients=(1,))
        for boot in range(0 if args.smoke else BOOTS):
            with VllmServer(REPO / ".cache" / "tiny-llama", scratch_parent=REPO / ".scratch") as s:
                sample_boot(s, boot, d)
        a = sorted(str(p) for p in d.glob("A-*-c1.json"))
        a2 = sorted(str(p) for p in d.glob("A2-*-c1.json"))
        c1 = sorted(str(p) for p in d.glob("*-c1.json"))
        c4 = sorted(str(p) for p in d.glob("*-c4.json"))
        print(f"\n1. the same configuration, {len(a)} + {len(a2)} boots (one client):")
        print(cli("compare", *a, "--vs", *a2), end="")
        print(f"\n2. one client vs four clients, {len(c1)} boots each:")
        print(cli("compare", *c1, "--vs", *c4), end="")
        print("\n3. one boot per arm:")
        print(cli("compare", a[0], "--vs", c4[0], "--metric", "tokens_per_s"), end="")


if __name__ == "__main__":
    main()
