#!/usr/bin/env bash
# Builds spill and runs the whole test suite: unit, parity, engine and HTTP black-box tests.
# GPU tests skip (and say so) when no GPU is present. Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
scripts/setup.sh
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)"
if [ -d tests/server ]; then
  tests/server/run.sh "$BUILD/spill"
fi
# Real coding agents from npm, each in a loopback-only network namespace (skips, saying why,
# without root or ip netns). SPILL_SKIP_AGENT_TESTS=1 leaves them out.
if [ -d tests/agents ] && [ "${SPILL_SKIP_AGENT_TESTS:-0}" != 1 ]; then
  tests/agents/run.sh "$BUILD/spill"
fi
