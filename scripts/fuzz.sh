#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cpp) with clang, ASan and UBSan, and runs each
# for SECONDS (default 60) on a copy of its seed corpus (tests/fuzz/corpus/<name>, which stays as
# committed). A crash, leak, sanitizer report or timeout leaves its input in BUILD/fuzz-findings
# and fails the script. Usage: scripts/fuzz.sh [seconds] [build-dir]
# Reproduce a finding: BUILD/fuzz_<name> BUILD/fuzz-findings/<name>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
BUILD="${2:-build-fuzz}"
JOBS="${SPILL_JOBS:-$(nproc)}"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  LAUNCHER=()
  if command -v ccache >/dev/null 2>&1; then LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPILL_FUZZ=ON -DSPILL_CUDA=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${LAUNCHER[@]}"
fi
cmake --build "$BUILD" -j"$JOBS" --target fuzz_targets
failed=()
for src in tests/fuzz/fuzz_*.cpp; do
  name="$(basename "$src" .cpp)"
  short="${name#fuzz_}"
  work="$BUILD/fuzz-corpus/$short"
  findings="$BUILD/fuzz-findings/$short"
  mkdir -p "$work" "$findings"
  seeds=()
  if [ -d "tests/fuzz/corpus/$short" ]; then seeds=("tests/fuzz/corpus/$short"); fi
  echo "fuzz: $name for ${SECONDS_EACH}s"
  # New inputs go to $work; the committed seeds are only read. -timeout: one input taking longer
  # than 10 s is a hang (renders and encodes are bounded well below that). Leaks are reported.
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$BUILD/$name" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$findings/" "$work" "${seeds[@]}" >"$BUILD/fuzz-$short.log" 2>&1; then
    failed+=("$name")
    tail -n 40 "$BUILD/fuzz-$short.log"
  fi
  grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$BUILD/fuzz-$short.log" | tr '\n' ' ' || true
  echo
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $BUILD/fuzz-findings)" >&2
  exit 1
fi
echo "fuzz: all targets ran ${SECONDS_EACH}s without a finding"
