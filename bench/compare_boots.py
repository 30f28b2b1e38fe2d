"""The noise floor, demonstrated: replicate boots of the tiny CPU server, compared.

BOOTS boots of the same configuration, alternating between two arms "A" and "A'" that differ
in nothing but the boot; each boot is sampled (`verifier sample`, from the probe's counters)
under one client and under four concurrent clients. Then `verifier compare`:
  1. A vs A' at one client: the same configuration: the difference must be within the floor;
  2. one client vs four clients over all boots: a real difference, priced against the floor;
  3. one boot per arm: the floor is unknown and is reported as such.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from verifier.testing.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[1]
BOOTS = 4
SECONDS = "6"


def cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "verifier", *args], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"verifier {' '.join(args)}: {out.stderr}")
    return out.stdout


def sample(server: VllmServer, clients: int, out: Path) -> None:
    stop = threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            server.complete(f"bench {i}", max_tokens=32)

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


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for boot in range(BOOTS):
            arm = "A" if boot % 2 == 0 else "A2"
            with VllmServer(REPO / ".cache" / "tiny-llama", scratch_parent=REPO / ".scratch") as s:
                s.complete("warm", max_tokens=2)
                sample(s, 1, d / f"{arm}-b{boot}-c1.json")
                sample(s, 4, d / f"{arm}-b{boot}-c4.json")
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
