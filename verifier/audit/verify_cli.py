"""Offline verification of an export bundle, for ``verifier audit verify BUNDLE --key PUB``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from verifier.audit.bundle import check_bundle
from verifier.audit.errors import BundleCorrupt, BundleMissing, WrongKey
from verifier.audit.keys import load_public_key
from verifier.audit.statement import rfc3339


def run_offline_verify(bundle_path: str, key_path: str, as_json: bool) -> int:
    """Verify the bundle at BUNDLE_PATH with the public key at KEY_PATH; print what was checked
    (JSON with AS_JSON, also on failure). 0 when it verifies; raises :class:`BundleCorrupt`
    (exit 7), :class:`WrongKey` (8), or a key or file error (3)."""
    key = load_public_key(Path(key_path))
    path = Path(bundle_path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BundleMissing(f"{path}: no such bundle file") from None
    except OSError as e:
        raise BundleMissing(f"{path}: cannot read the bundle: {e.strerror}") from None
    r = check_bundle(data, key)
    if as_json:
        print(json.dumps(r.to_json(), indent=2))
    else:
        for line in r.checks:
            print(f"ok    {line}")
        if r.ok:
            print(
                f"bundle verifies: ledger of {r.size} entries at {rfc3339(r.at_unix)} "
                f"(verifier {r.verifier_id}), root {r.root}, head {r.head}"
            )
    sys.stdout.flush()
    if r.ok:
        return 0
    problem, location = r.problem or "does not verify", r.location or ""
    if r.exit_code == WrongKey.exit_code:
        raise WrongKey(problem, f"{path}: {location}" if location else str(path))
    raise BundleCorrupt(problem, f"{path}: {location}" if location else str(path))
