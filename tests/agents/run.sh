#!/usr/bin/env bash
# Black-box tests with real coding agents: installs them from npm (versions pinned in
# package.json / package-lock.json) into tests/agents/node_modules, then runs each against the
# real `spill serve` inside a network namespace with only loopback (needs root; each test skips,
# saying why, where a namespace cannot be made).
#
# Usage: tests/agents/run.sh path/to/spill [file.test.mjs ...]
# Environment: SPILL_TEST_MODEL, SPILL_AGENT_VERBOSE=1, SPILL_TEST_SKIP_INSTALL=1 (reuse node_modules),
# SPILL_AGENT_TESTS=all (accepted; every agent runs by default).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 path/to/spill [file.test.mjs ...]" >&2
  exit 2
fi
BIN="$(realpath "$1")"
shift
if [ ! -x "$BIN" ]; then
  echo "agent tests: $BIN is not an executable; build spill first" >&2
  exit 2
fi
if [ -n "${SPILL_TEST_MODEL:-}" ]; then
  SPILL_TEST_MODEL="$(realpath "$SPILL_TEST_MODEL")"
  export SPILL_TEST_MODEL
fi
FILES=()
for f in "$@"; do FILES+=("$(realpath "$f")"); done
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "agent tests: node and npm are needed (Node.js 20 or newer)" >&2
  exit 2
fi
if [ "${SPILL_TEST_SKIP_INSTALL:-0}" != 1 ] || [ ! -d node_modules ]; then
  # `npm install` honours the lock file (versions pinned) where `npm ci` refuses it: npm 11 wants
  # every platform's optional binary in the lock, and the registry here does not serve them.
  npm install --no-audit --no-fund --loglevel=error
fi
if [ ${#FILES[@]} -eq 0 ]; then
  # Every agent: each passes end to end on a loaded 2-core CPU (tests/agents/README.md has the
  # wall times). SPILL_AGENT_TESTS=all, once needed for the slow ones, means the same.
  FILES=(./*.test.mjs)
fi
export SPILL_BIN="$BIN"
# One agent at a time: each has its own server and namespace, and the CPU is small.
exec node --test --test-concurrency=1 --test-reporter=spec "${FILES[@]}"
