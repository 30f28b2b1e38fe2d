#!/usr/bin/env bash
# Generate servewitness/api/v1/verifier_pb2{.py,.pyi,_grpc.py} from proto/verifier/api/v1/*.proto
# with the protoc bundled in the grpcio-tools pinned in requirements/proto.txt.
#
#   scripts/gen_proto.sh            write into the repository (what `make proto` runs)
#   scripts/gen_proto.sh OUTDIR     write into OUTDIR/servewitness/api/v1/ instead
#   scripts/gen_proto.sh --check    generate into a temporary directory and fail with a diff
#                                   if the checked-in files differ (what `make proto-check` runs)
#
# grpcio-tools is installed once into its own virtualenv under .cache/proto-tools/<key>/, keyed
# on requirements/proto.txt and the interpreter, never into .venv; once it exists nothing is
# downloaded, so reruns work offline. PYTHON chooses the interpreter (default python3).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
mode=write
out=$repo
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  -*) echo "usage: $0 [OUTDIR | --check]" >&2; exit 2 ;;
  *) mkdir -p "$1"; out=$(cd "$1" && pwd) ;;
esac
cd "$repo"

PYTHON=${PYTHON:-python3}
key=$({ cat requirements/proto.txt; "$PYTHON" -c 'import sys, sysconfig; print(sys.version, sysconfig.get_platform())'; } | sha256sum | cut -c1-16)
tools=.cache/proto-tools/$key

if [ ! -f "$tools/.installed" ]; then
  mkdir -p .cache/proto-tools
  (
    # One installer at a time (make proto-check and the drift test may run together).
    if command -v flock >/dev/null; then flock 9; fi
    if [ ! -f "$tools/.installed" ]; then
      echo "gen_proto: installing requirements/proto.txt into $tools (once)" >&2
      rm -rf "$tools"
      "$PYTHON" -m venv "$tools"
      # This machine's pip configuration may name an absent extra index folder; drop that noise.
      "$tools/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        -r requirements/proto.txt 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
      touch "$tools/.installed"
    fi
  ) 9>.cache/proto-tools/.lock
fi

generate() {  # generate DIR: the one pinned generation command, into DIR/servewitness/api/v1
  # The proto package stays verifier.api.v1 (the wire's names: a rename would break every peer);
  # protoc names the Python modules after the .proto path, so they are moved under the import
  # package servewitness and their imports of each other rewritten to match.
  local raw
  raw=$(mktemp -d)
  "$tools/bin/python" -m grpc_tools.protoc --proto_path=proto \
    --python_out="$raw" --pyi_out="$raw" --grpc_python_out="$raw" \
    proto/verifier/api/v1/*.proto
  mkdir -p "$1/servewitness/api/v1"
  for f in "$raw"/verifier/api/v1/*; do
    sed -e 's/^from verifier\.api\.v1 import/from servewitness.api.v1 import/' \
      -e "s/'verifier\.api\.v1\.\([a-z_]*_pb2\)'/'servewitness.api.v1.\1'/" \
      "$f" >"$1/servewitness/api/v1/$(basename "$f")"
  done
  rm -rf "$raw"
}

generated() {  # generated DIR: the generated files under DIR, relative to it, sorted
  (cd "$1" && find servewitness/api -type f \( -name '*_pb2.py' -o -name '*_pb2.pyi' \
    -o -name '*_pb2_grpc.py' \) | LC_ALL=C sort)
}

if [ "$mode" = write ]; then
  generate "$out"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generate "$tmp"
status=0
if ! diff -u --label checked-in --label generated <(generated "$repo") <(generated "$tmp") >"$tmp/files.diff"; then
  echo "gen_proto: the set of generated files differs (- checked in, + generated):" >&2
  cat "$tmp/files.diff" >&2
  status=1
fi
while read -r f; do
  if [ -f "$repo/$f" ] && ! diff -u "$repo/$f" "$tmp/$f" >&2; then
    status=1
  fi
done < <(generated "$tmp")
if [ "$status" != 0 ]; then
  echo "gen_proto: checked-in generated code is stale: run 'make proto' and check it in" >&2
fi
exit "$status"
