"""Call 3, before serve.sh: copy into whl-extra/ each carried wheel in maybe/ whose package the
device image lacks or has older than the carried one (so the image's own versions are kept
where they are new enough). Prints what it chose. Stdlib only."""

import shutil
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

here = Path(__file__).resolve().parent
dst = Path(sys.argv[1])  # .gpu/call2/whl-extra of the checkout
dst.mkdir(exist_ok=True)


def key(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


for whl in sorted((here / "maybe").glob("*.whl")):
    name, carried = whl.name.split("-")[:2]
    dist = name.replace("_", "-")
    try:
        have = version(dist)
    except PackageNotFoundError:
        have = None
    take = have is None or key(have) < key(carried)
    print(f"extra {dist}: image {have}, carried {carried}: {'TAKEN' if take else 'kept image'}")
    if take:
        shutil.copy2(whl, dst / whl.name)  # a copy: a second call on the machine needs it too
sys.exit(0)
