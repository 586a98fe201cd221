#!/usr/bin/env bash
# Device round for the KV cache formats (BF16, FP8): the CUDA tests this change touches, compute-sanitizer
# on the FP8 write and attention tests, decode per format (an 8-layer copy of S30, contexts 4K and
# 32K), and the FP8 cache's KL divergence against the BF16 one on spill-tiny over held-out text. Runs the spill build made here for sm_90, packed with its
# libraries by `tools/gpu/pack_spill.sh --tests` (unpacked here first). Logs under $OUT. ROUND_SECONDS
# (default 590) bounds the call: a stage that would run past it is cut short.
#   usage (repo root, device): tools/gpu/kv_format_round.sh [tests|bench|all]   carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
MODE="${1:-all}"
CONTEXTS="4096 32768"

if [ "$MODE" != bench ]; then
gpu_tests "${TESTS:-CudaOps.*:CudaRunnerTest.*:CudaRunnerModels.Fp8*:CudaRunnerModels.SpillTiny*:CudaRunnerModels.ExpertsInHostRam*:Fp8*}" 240
sanitize memcheck 'CudaOps.E4m3*:CudaOps.Fp8*:CudaRunnerModels.Fp8*' 90

fi

if [ "$MODE" != tests ]; then
# Decode per KV format on an 8-layer copy of S30 (every layer as S30's; the LM head as S30's).
for ctx in $CONTEXTS; do
  for f in bf16 fp8; do
    batches=1; [ "$ctx" -le 4096 ] && batches=1,8
    timeout $(budget 45) $B/cuda_decode_bench --shape tests/data/shapes/s30.json --layers 8 \
      --batches $batches --context $ctx --steps 20 --prefill-chunk 4096 --kv-format $f > "$OUT/bench-$ctx-$f.txt" 2>&1
    echo "== 8 layers, context $ctx, $f KV: rc=$?"
    grep -E "^ +[0-9]+ |prefill of" "$OUT/bench-$ctx-$f.txt" | head -3
  done
  stamp
done

for f in bf16 fp8; do
  timeout $(budget 60) $B/spill eval --model models/spill-tiny --reference models/spill-tiny --text tests/data/eval/heldout-python.txt \
    --ctx 512 --device cuda --kv-format $f --json "$OUT/eval-$f.json" > "$OUT/eval-$f.txt" 2>&1
  echo "== spill-tiny eval, $f KV against bf16: rc=$?"; tail -4 "$OUT/eval-$f.txt"; stamp
done
fi

if [ "$MODE" != bench ]; then
sanitize racecheck 'CudaOps.Fp8KvWrite*:CudaOps.Fp8Attention*' 90
fi
