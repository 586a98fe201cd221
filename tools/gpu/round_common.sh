# Sourced by the device rounds (tools/gpu/*_round.sh) from the repository root on the GPU machine: unpacks
# the build that `tools/gpu/pack_spill.sh --tests` packed (once per machine), sets B (its binaries) and
# the libraries' path, and gives stamp (seconds since the start) and budget N (seconds a stage may take:
# N, or what is left of ROUND_SECONDS, default 590, so that a stage is cut rather than the call).
# On exit the logs under $OUT go into one $OUT/logs.tar.gz: a device call brings back only a few
# files, and a round writes dozens (tar -xzf logs.tar.gz where they land).
set -uo pipefail
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
bundle_logs() { (cd "$OUT" && ls ./*.txt > /dev/null 2>&1 && tar -czf logs.tar.gz ./*.txt && rm -f ./*.txt); }
trap bundle_logs EXIT
[ -x .carry/bin/spill_tests ] || { [ -f .carry/pack.tar.xz ] && tar -C .carry -xJf .carry/pack.tar.xz; }
B=.carry/bin
export LD_LIBRARY_PATH="$PWD/.carry/lib:${LD_LIBRARY_PATH:-}"
export SPILL_TINY_DIR="$PWD/models/spill-tiny"
T0=$(date +%s)
stamp() { echo "   ($(( $(date +%s) - T0 )) s)"; }
budget() { local left=$(( ${ROUND_SECONDS:-590} - ($(date +%s) - T0) )); [ "$left" -lt "$1" ] && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee "$OUT/env.txt"
ldd $B/spill_tests | grep "not found"
# gpu_tests FILTER SECONDS: spill_tests on FILTER into $OUT/tests.txt; prints the rc, the summary and any
# failure's context; returns the rc.
gpu_tests() {
  timeout $(budget $2) $B/spill_tests --gtest_filter="$1" > "$OUT/tests.txt" 2>&1
  local rc=$?; echo "== tests rc=$rc"; stamp
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |measure \]" "$OUT/tests.txt" | head -40
  grep -B2 -A8 "Failure" "$OUT/tests.txt" | head -40
  return $rc
}
# sanitize TOOL FILTER SECONDS: compute-sanitizer's TOOL (memcheck, racecheck) over the tests FILTER into
# $OUT/TOOL.txt; prints the rc and the tool's summary line; returns the rc.
sanitize() {
  timeout $(budget $3) compute-sanitizer --tool $1 --error-exitcode 9 $B/spill_tests --gtest_filter="$2" > "$OUT/$1.txt" 2>&1
  local rc=$?; echo "== $1 rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$1.txt" | tail -1)"; stamp
  return $rc
}
