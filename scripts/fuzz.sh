#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cpp) with clang, ASan and UBSan, and runs each
# for SECONDS (default 60), SPILL_JOBS of them at a time (default: the number of CPUs), on a copy
# of its seed corpus (tests/fuzz/corpus/<name>, which stays as committed). A crash, leak, sanitizer
# report or timeout leaves its input in BUILD/fuzz-findings and fails the script.
# Usage: scripts/fuzz.sh [seconds] [build-dir]
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
# Targets run JOBS at a time (each libFuzzer process is single-threaded), every one for SECONDS.
run_target() {
  local name="$1" short="${1#fuzz_}"
  local work="$BUILD/fuzz-corpus/$short" findings="$BUILD/fuzz-findings/$short"
  mkdir -p "$work" "$findings"
  local seeds=()
  if [ -d "tests/fuzz/corpus/$short" ]; then seeds=("tests/fuzz/corpus/$short"); fi
  # New inputs go to $work; the committed seeds are only read. -timeout: one input taking longer
  # than 10 s is a hang (renders and encodes are bounded well below that). Leaks are reported.
  local status=0
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$BUILD/$name" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$findings/" "$work" "${seeds[@]}" >"$BUILD/fuzz-$short.log" 2>&1 || status=$?
  {
    echo "fuzz: $name for ${SECONDS_EACH}s: $([ $status -eq 0 ] && echo ok || echo FAILED)"
    if [ $status -ne 0 ]; then tail -n 40 "$BUILD/fuzz-$short.log"; fi
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$BUILD/fuzz-$short.log" | tr '\n' ' ' || true
    echo
  } >"$BUILD/fuzz-$short.summary"
  return $status
}
rm -f "$BUILD"/fuzz-*.summary "$BUILD"/fuzz-*.failed
names=()
for src in tests/fuzz/fuzz_*.cpp; do names+=("$(basename "$src" .cpp)"); done
for name in "${names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  (run_target "$name" || touch "$BUILD/fuzz-${name#fuzz_}.failed") &
done
wait
failed=()
for name in "${names[@]}"; do
  cat "$BUILD/fuzz-${name#fuzz_}.summary"
  if [ -f "$BUILD/fuzz-${name#fuzz_}.failed" ]; then failed+=("$name"); fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $BUILD/fuzz-findings)" >&2
  exit 1
fi
echo "fuzz: all targets ran ${SECONDS_EACH}s without a finding"
