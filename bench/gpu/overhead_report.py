"""Summarise bench/gpu/overhead.py's rows (overhead.jsonl): per arm, and probe over none.

    python3 bench/gpu/overhead_report.py overhead.jsonl
    python3 bench/gpu/overhead_report.py --smoke    # CI: the recorded H200 rows (RECORDED)

For each metric (tokens/s, mean inter-token latency, mean request latency): every boot's value
in the order they ran, each arm's mean and spread, the ratio of the arms' means, and the noise
floor: the largest relative difference between two boots of the same arm. A ratio whose
distance from 1 is inside the floor is not a measured difference. Stdlib only.
"""

from __future__ import annotations

import json
import sys
from itertools import combinations
from pathlib import Path

METRICS = ("tokens_per_s", "itl_ms", "e2e_ms")


def rows(path: Path) -> list[dict[str, object]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if isinstance(row, dict):
                out.append(row)
    return out


def floor(values: list[float]) -> float | None:
    """The largest |a - b| / mean(a, b) between two boots of one arm (None under two boots)."""
    pairs = [abs(a - b) / ((a + b) / 2) for a, b in combinations(values, 2) if a + b > 0]
    return max(pairs) if pairs else None


def report(data: list[dict[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {"boots": [(r.get("label"), r.get("probe")) for r in data]}
    for metric in METRICS:
        arms: dict[str, list[float]] = {"probe": [], "none": []}
        for r in data:
            v = r.get(metric)
            if isinstance(v, int | float) and not r.get("error"):
                arms["probe" if r.get("probe") else "none"].append(float(v))
        m: dict[str, object] = {k: v for k, v in arms.items()}
        means = {k: sum(v) / len(v) for k, v in arms.items() if v}
        m["means"] = {k: round(v, 4) for k, v in means.items()}
        floors = {k: floor(v) for k, v in arms.items()}
        m["noise_floor"] = {k: None if v is None else round(v, 4) for k, v in floors.items()}
        if len(means) == 2 and means["none"]:
            ratio = means["probe"] / means["none"]
            m["ratio_probe_over_none"] = round(ratio, 4)
            known = [f for f in floors.values() if f is not None]
            if known:
                m["within_floor"] = abs(ratio - 1) <= max(known)
            else:
                m["within_floor"] = "unknown: one boot per arm"
        out[metric] = m
    return out


# smoke mode's recorded input: the rows of the H200 run that BENCHMARKS.md reports
RECORDED = (
    Path(__file__).resolve().parents[2] / "docs/gpu-evidence/session-2/overhead/overhead.jsonl"
)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--smoke"]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import _smoke

        _smoke.begin(f"the report of recorded rows ({RECORDED.relative_to(_smoke.REPO)})")
        argv = [str(RECORDED)]
    if len(argv) != 1:
        raise SystemExit(f"usage: {Path(__file__).name} OVERHEAD_JSONL | --smoke")
    print(json.dumps(report(rows(Path(argv[0]))), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
