"""Digest one arm of bench/gpu/validate.py's output for docs/gpu-evidence/: the summary, and
for each run its verdict with every finding's id, severity, message and rank (the per-file
lines of ``provenance.origins``, which make a status about 0.8 MB, are left out).

    python3 bench/gpu/digest.py EXTRACTED_ARM_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
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


if __name__ == "__main__":
    digest(Path(sys.argv[1]), Path(sys.argv[2]))
