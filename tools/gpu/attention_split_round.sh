#!/usr/bin/env bash
# Device round for the attention split at short contexts: an 8-layer S30 decode at contexts 512 and
# 4096 under partitions of at least SPILL_CUDA_ATTN_MIN_PART positions (default 128; 512 makes a
# 512-token context one partition, no merge kernel), the default first and last; then the attention
# and runner tests under the longest and shortest partitions. Runs the build packed by pack_spill.sh --tests.
#   usage (repo root, device): tools/gpu/attention_split_round.sh   carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
VARIANTS=${VARIANTS:-"default: part512:512 part64:64 default2:"}
for ctx in 512 4096; do
  for v in $VARIANTS; do
    IFS=: read -r name part <<< "$v"
    export SPILL_CUDA_ATTN_MIN_PART="$part"
    timeout $(budget 30) $B/cuda_decode_bench --shape tests/data/shapes/s30.json --layers 8 --batches 1,8 \
      --context $ctx --steps 30 > "$OUT/attn-$ctx-$name.txt" 2>&1
    echo "== context $ctx, $name (min partition '${part}'): rc=$?"
    grep -E "^ +[0-9]+ " "$OUT/attn-$ctx-$name.txt" | head -2
  done
  echo "   ($(( $(date +%s) - T0 )) s)"
done
for part in 512 32; do
  SPILL_CUDA_ATTN_MIN_PART=$part timeout $(budget 90) $B/spill_tests \
    --gtest_filter='CudaOps.*Attention*:CudaOps.Fp8*:CudaRunnerTest.*:CudaRunnerModels.SpillTiny*:CudaRunnerModels.Fp8*' \
    > "$OUT/attn-tests-$part.txt" 2>&1
  echo "== attention and runner tests, min partition $part: rc=$?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) " "$OUT/attn-tests-$part.txt" | head -6
  grep -B2 -A8 "Failure" "$OUT/attn-tests-$part.txt" | head -20
done
echo "   ($(( $(date +%s) - T0 )) s)"
