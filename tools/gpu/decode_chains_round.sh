#!/usr/bin/env bash
# Device round for decode kernel changes that keep the bits and shorten a warp's chain (attention's slot
# lookups by shuffle, short rows spread over the warp in the MoE/GEMV dot): the CUDA tests, memcheck and
# racecheck on the attention, MoE and GEMV tests, the MoE tables of cuda_moe_bench for the base build
# (.carry/bin/cuda_moe_bench_base) and the new one, then S30 decode in graphs alternating base and new:
# 8 layers at contexts 512 and 4096 (batches 1, 4, 8), context 32768 at batch 1, all 48 layers at batch
# 1 and 8. Logs under $OUT.
#   usage (repo root, device): tools/gpu/decode_chains_round.sh   carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
timeout $(budget 120) $B/spill_tests --gtest_filter="${TESTS:-*Cuda*:Fp8*:-*Collectives*}" > "$OUT/tests.txt" 2>&1
echo "== tests rc=$?"; stamp
grep -E "^\[  (FAILED|PASSED) " "$OUT/tests.txt" | head -20; grep -B2 -A8 "Failure" "$OUT/tests.txt" | head -30
SAN='CudaOps.*Attention*:CudaMoe.*:CudaGemv*'
timeout $(budget 90) compute-sanitizer --tool memcheck --error-exitcode 9 $B/spill_tests --gtest_filter="$SAN" \
  > "$OUT/memcheck.txt" 2>&1
echo "== memcheck rc=$?: $(grep 'ERROR SUMMARY' "$OUT/memcheck.txt" | tail -1)"; stamp
timeout $(budget 120) compute-sanitizer --tool racecheck --error-exitcode 9 $B/spill_tests --gtest_filter="$SAN" \
  > "$OUT/racecheck.txt" 2>&1
echo "== racecheck rc=$?: $(grep 'RACECHECK SUMMARY' "$OUT/racecheck.txt" | tail -1)"; stamp
for b in cuda_moe_bench_base cuda_moe_bench; do
  timeout $(budget 40) $B/$b --shape s30 --no-gemv --reps 200 > "$OUT/moe-$b.txt" 2>&1
  echo "== MoE table, $b: rc=$?"; grep -E "^S30" "$OUT/moe-$b.txt" | head -8
done
stamp
run() {  # name binary layers context batches
  timeout $(budget 40) $B/$2 --shape tests/data/shapes/s30.json --layers $3 --batches $5 --context $4 --steps 30 \
    --prefill-chunk 4096 > "$OUT/$1.txt" 2>&1
  echo "== $1: rc=$?"; grep -E "^ +[0-9]+ " "$OUT/$1.txt" | head -3
}
for rep in $(seq 1 ${REPS:-2}); do
  for ctx in 512 4096; do
    run "base-$ctx-r$rep" cuda_decode_bench_base 8 $ctx 1,4,8
    run "new-$ctx-r$rep" cuda_decode_bench 8 $ctx 1,4,8
  done
  stamp
done
run "base-32768" cuda_decode_bench_base 8 32768 1
run "new-32768" cuda_decode_bench 8 32768 1
run "base-48" cuda_decode_bench_base 48 512 1,8
run "new-48" cuda_decode_bench 48 512 1,8
stamp
