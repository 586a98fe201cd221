#!/usr/bin/env bash
# Device round for the Q8_0 row kernel of the dense GEMV (gemv.cu): the CUDA tests, memcheck and
# racecheck on the GEMV tests, the GEMV table of cuda_moe_bench with the row kernel off and on
# (SPILL_GEMV_ROW_KERNEL, same binary), then S30 decode in graphs alternating three settings of one
# binary: the router as two launches and the staged GEMV (split), the fused router (row0), and the
# fused router with the row kernel (row1): 8 layers at batches 1-16, then all 48 layers at batch 1
# and 8. split against row0 measures the fused router; row0 against row1, the row kernel. Logs under $OUT.
#   usage (repo root, device): tools/gpu/gemv_rows_round.sh   carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
timeout $(budget 150) $B/spill_tests --gtest_filter="${TESTS:-*Cuda*:Fp8*:-*Collectives*}" > "$OUT/tests.txt" 2>&1
echo "== tests rc=$?"; stamp
grep -E "^\[  (FAILED|PASSED|SKIPPED) " "$OUT/tests.txt" | head -20; grep -B2 -A8 "Failure" "$OUT/tests.txt" | head -30
timeout $(budget 60) compute-sanitizer --tool memcheck --error-exitcode 9 $B/spill_tests \
  --gtest_filter='*CudaGemv*:CudaOps.FusedRouter*' > "$OUT/memcheck.txt" 2>&1
echo "== memcheck rc=$?: $(grep 'ERROR SUMMARY' "$OUT/memcheck.txt" | tail -1)"; stamp
timeout $(budget 60) compute-sanitizer --tool racecheck --error-exitcode 9 $B/spill_tests \
  --gtest_filter='*CudaGemv*:CudaOps.FusedRouter*' > "$OUT/racecheck.txt" 2>&1
echo "== racecheck rc=$?: $(grep 'RACECHECK SUMMARY' "$OUT/racecheck.txt" | tail -1)"; stamp
for k in 0 1; do
  SPILL_GEMV_ROW_KERNEL=$k timeout $(budget 40) $B/cuda_moe_bench --shape none --reps 200 > "$OUT/gemv-row$k.txt" 2>&1
  echo "== GEMV table, row kernel $k: rc=$?"; grep -E "^[0-9]+ -> " "$OUT/gemv-row$k.txt" | awk '$2==1 || $2==8'
done
stamp
run() {  # name router-fused row-kernel layers batches
  SPILL_ROUTER_FUSED=$2 SPILL_GEMV_ROW_KERNEL=$3 timeout $(budget 60) $B/cuda_decode_bench --shape tests/data/shapes/s30.json --layers $4 --batches $5 \
    --context 512 --steps 30 > "$OUT/$1.txt" 2>&1
  echo "== $1: rc=$?"; grep -E "^ +[0-9]+ " "$OUT/$1.txt" | head -5
}
for rep in $(seq 1 ${REPS:-2}); do
  run "split-8-r$rep" 0 0 8 1,4,8,16
  run "row0-8-r$rep" 1 0 8 1,4,8,16
  run "row1-8-r$rep" 1 1 8 1,4,8,16
  stamp
done
run "split-48" 0 0 48 1,8
run "row0-48" 1 0 48 1,8
run "row1-48" 1 1 48 1,8
stamp
