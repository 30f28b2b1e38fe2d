"""Digest one arm of bench/gpu/validate.py's output for docs/gpu-evidence/: the summary, and
for each run its verdict with every finding's id, severity, message and rank (the per-file
lines of ``provenance.origins``, which make a status about 0.8 MB, are left out).

    python3 bench/gpu/digest.py EXTRACTED_ARM_DIR OUT_DIR
    python3 bench/gpu/digest.py --smoke    # CI: a recorded arm (RECORDED), digested and printed
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def digest(arm: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = json.loads((arm / "summary.json").read_text())
    # the digest below keeps what the verdicts need; of each process, how its engine stepped
    # and its speculation totals
    summary["engines"] = [
        {
            "pid": p.get("pid"),
            "role": p.get("role"),
            "engine": p.get("engine"),
            "speculation": (p.get("steps") or {}).get("speculation"),
        }
        for p in summary.pop("processes", None) or []
        if isinstance(p, dict)
    ]
    if isinstance(summary.get("client"), dict):
        summary["client"].pop("sample", None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    verdicts: dict[str, object] = {}
    for status in sorted(arm.glob("status_*.json")):
        text = status.read_text()
        try:
            doc, _ = json.JSONDecoder().raw_decode(text)  # stderr's warning line follows
            run = doc["runs"][0]
        except (ValueError, KeyError, IndexError):
            continue
        verdicts[status.stem.removeprefix("status_")] = {
            "verdict": run.get("verdict"),
            "findings": [
                {
                    "id": f.get("id"),
                    "severity": f.get("severity"),
                    "rank": (f.get("context") or {}).get("rank"),
                    "message": f.get("message"),
                }
                for t in run.get("targets", [])
                for f in t.get("findings", [])
                if f.get("id") != "provenance.origins"
            ],
        }
    (out / "verdicts.json").write_text(json.dumps(verdicts, indent=1) + "\n")


# smoke mode's recorded input: an H200 arm of 2026-11-29 (its summary with every process, and
# each run's status as `verifier status --json` gives its run)
RECORDED = Path(__file__).resolve().parents[2] / "docs/gpu-evidence/gate-v2"


def smoke() -> None:
    """Digest RECORDED, laid out as validate.py leaves an arm (each status file the whole
    `status --json` document, stderr's warning line after it), and print the digest."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import _smoke

    _smoke.begin(f"the digest of a recorded arm ({RECORDED.relative_to(_smoke.REPO)})")
    with tempfile.TemporaryDirectory() as tmp:
        arm, out = Path(tmp) / "arm", Path(tmp) / "out"
        arm.mkdir()
        (arm / "summary.json").write_text((RECORDED / "summary.json").read_text())
        for status in sorted(RECORDED.glob("status_*.json")):
            run = json.loads(status.read_text())
            doc = json.dumps({"runs": [run]}, indent=1)
            (arm / status.name).write_text(doc + "\nverifier: warning: INSECURE mode\n")
        digest(arm, out)
        for name in ("summary.json", "verdicts.json"):
            print(f"{name}:\n{(out / name).read_text()}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--smoke"]:
        smoke()
    elif len(sys.argv) == 3:
        digest(Path(sys.argv[1]), Path(sys.argv[2]))
    else:
        raise SystemExit(f"usage: {Path(__file__).name} EXTRACTED_ARM_DIR OUT_DIR | --smoke")
