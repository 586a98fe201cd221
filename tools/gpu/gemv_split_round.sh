#!/usr/bin/env bash
# Device round for the dense GEMV's K-split policy: the GEMV table of cuda_moe_bench and an 8-layer
# S30 decode (cuda_moe_bench, cuda_decode_bench) under the policy's constants as set through
# SPILL_GEMV_TARGET_BLOCKS / SPILL_GEMV_MAX_SEGMENT, the default first and last (the spread of the
# same code), then the CUDA GEMV and runner tests under the fewest splits (a token's bits must not
# depend on its batch under any policy). Runs the build packed by `tools/gpu/pack_spill.sh --tests`.
#   usage (repo root, device): tools/gpu/gemv_split_round.sh   carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
VARIANTS=${VARIANTS:-"default:: fewest:1: fewest-whole-rows:1:4352 half:512: default2::"}
for v in $VARIANTS; do
  IFS=: read -r name tb seg <<< "$v"
  export SPILL_GEMV_TARGET_BLOCKS="$tb" SPILL_GEMV_MAX_SEGMENT="$seg"
  timeout $(budget 40) $B/cuda_moe_bench --shape none --reps 200 > "$OUT/gemv-$name.txt" 2>&1
  echo "== GEMV table, $name (target blocks '${tb}', max segment '${seg}'): rc=$?"
  grep -E "^[0-9]+ -> " "$OUT/gemv-$name.txt" | awk '$2==1 || $2==8'
  timeout $(budget 45) $B/cuda_decode_bench --shape tests/data/shapes/s30.json --layers 8 --batches 1,4,8 \
    --context 512 --steps 30 > "$OUT/decode-$name.txt" 2>&1
  echo "== 8-layer S30 decode, context 512, $name: rc=$?"; grep -E "^ +[0-9]+ " "$OUT/decode-$name.txt" | head -3
  if [ "$name" = default ] || [ "$name" = fewest-whole-rows ]; then
    timeout $(budget 30) $B/cuda_decode_bench --shape tests/data/shapes/s30.json --layers 8 --batches 1 \
      --context 512 --steps 5 --profile > "$OUT/profile-$name.txt" 2>&1
    echo "== op profile (eager, events), $name: rc=$?"; grep -E "device time by op, last step" "$OUT/profile-$name.txt" | cut -c1-600
  fi
  echo "   ($(( $(date +%s) - T0 )) s)"
done
export SPILL_GEMV_TARGET_BLOCKS=1 SPILL_GEMV_MAX_SEGMENT=4352
timeout $(budget 150) $B/spill_tests --gtest_filter='*CudaGemv*:CudaRunnerTest.*:CudaRunnerModels.SpillTiny*' \
  > "$OUT/tests-fewest.txt" 2>&1
echo "== GEMV and runner tests under the fewest splits: rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) " "$OUT/tests-fewest.txt" | head; grep -B2 -A8 "Failure" "$OUT/tests-fewest.txt" | head -30
echo "   ($(( $(date +%s) - T0 )) s)"
