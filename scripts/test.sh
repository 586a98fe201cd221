#!/usr/bin/env bash
# Builds spill and runs the whole test suite: unit, parity, engine and HTTP black-box tests.
# GPU tests skip (and say so) when no GPU is present. Usage: scripts/test.sh [build-dir]
#   SPILL_CUDA_ARCHITECTURES=90  compile CUDA code for these architectures only (CI builds for
#                                the H200 it tests on; release builds keep CMakeLists' list)
# Builds go through ccache when it is installed (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
scripts/setup.sh
CONFIG=(-DCMAKE_BUILD_TYPE=Release)
if command -v ccache >/dev/null 2>&1; then
  # Paths relative to the checkout, so a fresh clone elsewhere hits the same cache entries.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=true
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
  CONFIG+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [ -n "${SPILL_CUDA_ARCHITECTURES:-}" ]; then CONFIG+=(-DCMAKE_CUDA_ARCHITECTURES="$SPILL_CUDA_ARCHITECTURES"); fi
cmake -S . -B "$BUILD" "${CONFIG[@]}" ${SPILL_CMAKE_ARGS:-}
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
