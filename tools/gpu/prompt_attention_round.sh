#!/usr/bin/env bash
# Device round for the prompt builds of the tensor-core attention (AttentionArgs::prompt_warps,
# SPILL_CUDA_ATTN_PROMPT_WARPS 0 / 4 / 8): the tests named in TESTS (default the attention and runner
# tests; none to skip) and the runner's tests under the 8-wide build; prompts timed under each build of
# WIDTHS, alternating them in one call (PROMPTS picks among S30, 48 layers, at 512, 4K and 32K tokens,
# and 8 of S235's 94 layers, which any card holds, at 32K); memcheck and racecheck on SAN (default the
# prompt-bits test; none to skip); last the whole S235 at 32K under the builds named in FULL (default
# "8 0") when the card holds it (the H200) and the round's time (ROUND_SECONDS) allows. Logs under
# $OUT (logs.tar.gz); each prefill line is printed as its run ends.
#   usage (repo root, device): WIDTHS="0 4 8" tools/gpu/prompt_attention_round.sh      carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.." || exit 1
. tools/gpu/round_common.sh
WIDTHS="${WIDTHS:-0 4 8}"
SAN="${SAN:-CudaOps.TensorCoreAttentionOfAPromptGivesEachTokenItsDecodeBits}"
if [ "${TESTS:-}" != none ]; then
  gpu_tests "${TESTS:-CudaOps.*Attention*:CudaRunner*}" 150 || [ "${KEEP_GOING:-0}" = 1 ] || exit 1
  # The runner's tests again with the 8-wide build on for every prompt (its chunks split from the
  # step's decodes): prefill against decode, chunked against whole, batched against alone.
  SPILL_CUDA_ATTN_PROMPT_WARPS=8 timeout $(budget 90) $B/spill_tests --gtest_filter="CudaRunner*" > "$OUT/tests-runner-w8.txt" 2>&1
  echo "== runner tests with the 8-wide prompt build: rc=$?"; grep -E "^\[  (FAILED|PASSED) " "$OUT/tests-runner-w8.txt" | head -10
fi
# prompt NAME SHAPE LAYERS CONTEXT CHUNK WIDTH [BATCHES]: a prefill per entry of BATCHES (default 1; 1,1
# times a second, warm one) and 2 decode steps, under prompt build WIDTH.
prompt() {
  timeout $(budget 150) env SPILL_CUDA_ATTN_PROMPT_WARPS=$6 $B/cuda_decode_bench --shape tests/data/shapes/$2.json \
    --layers $3 --batches ${7:-1} --context $4 --prefill-chunk $5 --steps 2 --warmup 0 > "$OUT/$1-w$6.txt" 2>&1
  echo "== $1 build $6: rc=$? $(grep -E 'prefill of' "$OUT/$1-w$6.txt" | head -1)"
}
# PROMPTS: which of the timed prompts run, in this order (default all four).
for p in ${PROMPTS:-s30-512 s30-4k s235x8-32k s30-32k}; do
  for w in $WIDTHS; do
    case $p in
      s30-512) prompt s30-512 s30 48 512 512 $w 1,1 ;;
      s30-4k) prompt s30-4k s30 48 4096 4096 $w 1,1 ;;
      s235x8-32k) prompt s235x8-32k s235 8 32768 4096 $w ;;
      s30-32k) prompt s30-32k s30 48 32768 4096 $w ;;
    esac
  done
  stamp
done
# The sanitizers after the timings, so that a slow racecheck cuts them and not the timings.
if [ "$SAN" != none ]; then
  sanitize memcheck "$SAN" 90
  sanitize racecheck "$SAN" 120
fi
mem_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print int($1 / 1024)}')
if [ "$mem_gib" -ge 120 ]; then
  for w in ${FULL:-8 0}; do prompt s235-32k s235 94 32768 4096 $w; stamp; done
else
  echo "== S235 whole: skipped, the card has $mem_gib GiB"
fi
