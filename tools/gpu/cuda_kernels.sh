#!/usr/bin/env bash
# On the GPU machine: builds the kernel library (no server dependencies), runs the CUDA kernel
# tests, compute-sanitizer memcheck and racecheck on them, and the benchmark; logs under $OUT
# (or ./gpu-out), the short table last.
# Usage: tools/gpu/cuda_kernels.sh [--no-sanitize] [--no-bench] [--ncu]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
SANITIZE=1 BENCH=1 NCU=0
for a in "$@"; do
  case "$a" in
    --no-sanitize) SANITIZE=0 ;;
    --no-bench) BENCH=0 ;;
    --ncu) NCU=1 ;;
  esac
done
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  dpkg -l 2>/dev/null | grep -E 'pcre2|utf8proc|httplib' | awk '{print $2, $3}'
} | tee "$OUT/env.txt"
BUILD=build-kernels
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILL_KERNELS_ONLY=ON -DSPILL_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 &&
  cmake --build "$BUILD" -j16 --target spill_kernel_tests cuda_moe_bench >> "$OUT/build.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then tail -50 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; fi
echo "build ok"
# Local-memory traffic (spills) in the kernels' machine code: LDL/STL per kernel.
for o in $(find "$BUILD" -name 'moe.cu.o' -o -name 'gemv.cu.o'); do
  cuobjdump -sass "$o" | awk '/Function :/{f=$3} /LDL|STL/{n[f]++} END{for (k in n) print "  spill ops", n[k], k}' 
done > "$OUT/sass-spills.txt" 2>&1
head -20 "$OUT/sass-spills.txt"

"$BUILD/spill_kernel_tests" 2>&1 | tee "$OUT/tests.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED)|FAILED|Failure' | head -40
tests_rc=${PIPESTATUS[0]}

san_summary=""
if [ $SANITIZE -eq 1 ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 3 "$BUILD/spill_kernel_tests" \
      --gtest_filter='CudaMoe.*:*TokenAlone*:*Twin*/Q3_K:*Twin*/Q8_0' > "$OUT/sanitizer-$tool.log" 2>&1
    src=$?
    san_summary+="$tool rc=$src: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool.log" | tail -1); "
  done
fi

if [ $NCU -eq 1 ]; then
  ncu --clock-control none --kernel-name regex:moe_ --launch-skip 40 --launch-count 4 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats "$BUILD/cuda_moe_bench" --reps 3 > "$OUT/ncu.txt" 2>&1
  grep -E 'moe_|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Compute \(SM\)|Registers|Stall' "$OUT/ncu.txt" | head -60
fi

if [ $BENCH -eq 1 ]; then
  "$BUILD/cuda_moe_bench" 2>&1 | tee "$OUT/bench.txt"
fi
echo "tests rc=$tests_rc; $san_summary"
