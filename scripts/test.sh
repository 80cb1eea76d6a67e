#!/usr/bin/env bash
# The test command: provision what the tests need, then run pytest with these arguments.
#   scripts/test.sh [PYTEST ARGS...]        (run it where `pip install -e '.[test]'` installed)
# - llama-server (the supervisor tests): $LLAMA_SERVER, else built once and cached by
#   scripts/install-llama-server.sh (6-26 min on 2 cores; its progress on stderr). A failed
#   build fails this command: the suite is not run without its llama-server tests.
# - Prometheus + promtool (the exporter tests): installed with apt-get when missing and we are
#   root; otherwise those tests skip.
# The inner loop needs neither: python -m pytest -m "not slow and not llama" (docs/testing.md)
# pytest runs on workers (pyproject's addopts); it ends with the run's wall time and how busy the CPUs were, and this
# script with its own total, provisioning included.
set -euo pipefail
started_s=$SECONDS
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"  # a venv's `python`, else python3

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test.sh: installing prometheus (apt-get)" >&2
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; } >&2 \
      || echo "test.sh: apt-get could not install prometheus: the exporter tests skip" >&2
  else
    echo "test.sh: prometheus/promtool not found and cannot install them here: the exporter tests skip" >&2
  fi
fi

if [ -z "${LLAMA_SERVER:-}" ]; then
  echo "test.sh: llama-server: the cached build, or building it now" >&2
  LLAMA_SERVER="$(bash scripts/install-llama-server.sh)" \
    || { echo "test.sh: could not provision llama-server (see above); set LLAMA_SERVER to one" >&2; exit 1; }
  export LLAMA_SERVER
fi
echo "test.sh: llama-server: $LLAMA_SERVER" >&2

rc=0
"$PYTHON" -m pytest "$@" || rc=$?
echo "test.sh: $((SECONDS - started_s)) s in all, exit $rc" >&2
exit "$rc"
