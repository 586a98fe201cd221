#!/usr/bin/env bash
# Device round comparing builds of spill that give the same bits (packed beside the new one by
# tools/gpu/pack_spill.sh: BASE_BENCH, BASE_MOE_BENCH, EXTRA_BINS): racecheck on the attention, MoE and
# GEMV tests, the GEMV and S30 MoE tables of cuda_moe_bench for base and new, then S30 decode in graphs
# alternating the cuda_decode_bench builds named in VARIANTS (default: base, new): 8 layers at context
# 512, batches 1, 4, 8, REPS times; then all 48 layers at batch 1 and 8. Logs under $OUT.
#   usage (repo root, device): VARIANTS="cuda_decode_bench_base cuda_decode_bench_mid cuda_decode_bench" \
#                              tools/gpu/variants_round.sh      carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
VARIANTS="${VARIANTS:-cuda_decode_bench_base cuda_decode_bench}"
SAN="${SAN:-CudaOps.AttentionDecodeAndPrefillMatchTheTwin:CudaOps.TensorCore*:CudaMoe.MatchesCpuTwinOverBatchesAndFormats:CudaGemvTest.*}"
timeout $(budget 150) compute-sanitizer --tool racecheck --error-exitcode 9 $B/spill_tests --gtest_filter="$SAN" \
  > "$OUT/racecheck.txt" 2>&1
echo "== racecheck rc=$?: $(grep 'RACECHECK SUMMARY' "$OUT/racecheck.txt" | tail -1)"; stamp
for b in cuda_moe_bench_base cuda_moe_bench; do
  timeout $(budget 40) $B/$b --shape s30 --no-host --reps 200 > "$OUT/moe-$b.txt" 2>&1
  echo "== GEMV and MoE tables, $b: rc=$?"
  grep -E "^S30" "$OUT/moe-$b.txt" | awk '$7==1 || $7==4 || $7==8'
  grep -E "^[0-9]+ -> " "$OUT/moe-$b.txt" | awk '$4==1 || $4==8'
done
stamp
run() {  # name binary layers batches
  timeout $(budget 40) $B/$2 --shape tests/data/shapes/s30.json --layers $3 --batches $4 --context 512 --steps 30 \
    > "$OUT/$1.txt" 2>&1
  echo "== $1: rc=$?"; grep -E "^ +[0-9]+ " "$OUT/$1.txt" | head -3
}
for rep in $(seq 1 ${REPS:-2}); do
  for v in $VARIANTS; do run "$v-8-r$rep" $v 8 1,4,8; done
  stamp
done
for v in $VARIANTS; do run "$v-48" $v 48 1,8; done
stamp
