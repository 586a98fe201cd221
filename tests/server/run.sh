#!/usr/bin/env bash
# Black-box HTTP tests: starts the real `spill serve` on the bundled tiny model (or $SPILL_TEST_MODEL)
# and talks to it with the official openai and @anthropic-ai/sdk clients and raw HTTP.
#
# Usage: tests/server/run.sh path/to/spill [file.test.mjs ...]
#   e.g. tests/server/run.sh build/spill
#        tests/server/run.sh build/spill tests/server/anthropic.test.mjs
# Environment: see tests/server/helpers.mjs (SPILL_TEST_MODEL, SPILL_TEST_SERVER_ARGS,
# SPILL_TEST_STARTUP_TIMEOUT_MS, SPILL_TEST_VERBOSE=1); SPILL_TEST_SKIP_INSTALL=1 reuses node_modules.
# SPILL_TEST_FAMILY=gpt_oss|deepseek_v3|glm4_moe: serve that family's tiny random model instead
# (random_model.mjs; tests that need a trained model's answers are skipped, each saying so).
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 path/to/spill [file.test.mjs ...]" >&2
  exit 2
fi
BIN="$(realpath "$1")"
shift
if [ ! -x "$BIN" ]; then
  echo "server tests: $BIN is not an executable; build spill first (cmake --build build)" >&2
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
  echo "server tests: node and npm are needed (Node.js 20 or newer); scripts/setup.sh installs them" >&2
  exit 2
fi
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$NODE_MAJOR" -lt 20 ]; then
  echo "server tests: Node.js $(node --version) is too old; the openai SDK and node --test need Node.js 20 or newer" >&2
  exit 2
fi

if [ -n "${SPILL_TEST_FAMILY:-}" ]; then
  if [ -n "${SPILL_TEST_MODEL:-}" ]; then
    echo "server tests: give SPILL_TEST_MODEL or SPILL_TEST_FAMILY, not both" >&2
    exit 2
  fi
  RANDOM_MODEL_DIR="$(mktemp -d "${TMPDIR:-/tmp}/spill-random-${SPILL_TEST_FAMILY}-XXXXXX")"
  trap 'rm -rf "$RANDOM_MODEL_DIR"' EXIT
  node random_model.mjs "$SPILL_TEST_FAMILY" "$RANDOM_MODEL_DIR/model" >/dev/null
  export SPILL_TEST_MODEL="$RANDOM_MODEL_DIR/model" SPILL_TEST_RANDOM_MODEL=1
fi

if [ "${SPILL_TEST_SKIP_INSTALL:-0}" != 1 ] || [ ! -d node_modules ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi

if [ ${#FILES[@]} -eq 0 ]; then
  FILES=(./*.test.mjs)
fi

export SPILL_BIN="$BIN"
# One file at a time: each file starts its own server, and the timing tests need the CPU to themselves.
# Not exec: the random model's folder is removed on exit.
node --test --test-concurrency=1 --test-reporter=spec "${FILES[@]}"
