#!/bin/bash
# Device round for the CUDA runner: op + end-to-end tests, memcheck on the op tests, decode bench.
# Kept in the repository as tools/gpu/cuda_runner_round.sh: copy it with the stripped cuda_runner_tests
# (the CUDA op and runner tests) and cuda_decode_bench into .carry/runner/ and run it there.
cd "$(dirname "$0")/../.."
D=.carry/runner
OUT="${OUT:-/tmp/out}"; L="$OUT/runner"; mkdir -p "$L"
export LD_LIBRARY_PATH="$PWD/$D/lib:$PWD/.carry/lib:$LD_LIBRARY_PATH"
export SPILL_TINY_DIR="$PWD/models/spill-tiny" SPILL_GGUF_DIR="$PWD/$D/none"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
ldd $D/cuda_runner_tests | grep "not found"
T0=$(date +%s)
timeout 30 $D/cuda_runner_tests > "$L/tests.txt" 2>&1; rc=$?; echo "== tests rc=$rc ($(( $(date +%s) - T0 )) s)"
grep -E "^\[  (FAILED|PASSED) |measure \]" "$L/tests.txt" | head -20
grep -A4 "Failure" "$L/tests.txt" | head -24
if [ $rc -ne 0 ]; then
  SPILL_CUDA_PDL=0 timeout 15 $D/cuda_runner_tests --gtest_filter='CudaRunnerTest.*:CudaOps.Attention*' > "$L/tests_nopdl.txt" 2>&1
  echo "== tests without PDL rc=$?"; grep -E "^\[  (FAILED|PASSED) " "$L/tests_nopdl.txt" | head -8
fi
T1=$(date +%s)
if command -v compute-sanitizer >/dev/null; then
  timeout 15 compute-sanitizer --tool memcheck --error-exitcode 9 $D/cuda_runner_tests \
    --gtest_filter='CudaOps.*:-CudaOps.FloatExperts*:CudaOps.AttentionOverSeveral*' > "$L/memcheck.txt" 2>&1
  echo "== memcheck rc=$? ($(( $(date +%s) - T1 )) s)"; grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$L/memcheck.txt" | head -6
else echo "== no compute-sanitizer"; fi
T2=$(date +%s)
timeout 10 $D/cuda_decode_bench --shape $D/s30.json --layers 4 --batches 1,8 --context 512 --steps 10 > "$L/bench_l4.txt" 2>&1
echo "== bench 4 layers rc=$? ($(( $(date +%s) - T2 )) s)"; tail -6 "$L/bench_l4.txt"
timeout 10 $D/cuda_decode_bench --shape $D/s30.json --layers 4 --batches 1,8 --context 512 --steps 5 --profile > "$L/bench_l4_profile.txt" 2>&1
echo "== same, op profile rc=$?"; grep -E "^ +[0-9]+ |device time" "$L/bench_l4_profile.txt" | cut -c1-400
timeout 10 $D/cuda_decode_bench --shape $D/s30.json --layers 4 --batches 1 --context 4096 --steps 10 > "$L/bench_l4_ctx4k.txt" 2>&1
echo "== 4 layers, context 4096 rc=$?"; grep -E "^ +1 |prefill of" "$L/bench_l4_ctx4k.txt"
SPILL_CUDA_PDL=0 timeout 8 $D/cuda_decode_bench --shape $D/s30.json --layers 4 --batches 1,8 --context 512 --steps 10 > "$L/bench_l4_nopdl.txt" 2>&1
echo "== 4 layers, no PDL rc=$?"; grep -E "^ +[0-9]+ " "$L/bench_l4_nopdl.txt"
T3=$(date +%s)
LEFT=$(( 100 - (T3 - T0) - 2 )); [ $LEFT -lt 5 ] && LEFT=5
timeout $LEFT $D/cuda_decode_bench --shape $D/s30.json --batches 1,4,8 --context 512 --steps 8 > "$L/bench.txt" 2>&1
echo "== bench S30 rc=$? ($(( $(date +%s) - T3 )) s)"; tail -9 "$L/bench.txt"
