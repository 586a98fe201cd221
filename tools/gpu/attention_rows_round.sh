#!/usr/bin/env bash
# Device round for an attention kernel change that keeps the bits: the CUDA attention, KV-format,
# GEMV and runner tests, memcheck on the attention tests, then an 8-layer S30 decode
# alternating the base build (.carry/bin/cuda_decode_bench_base, packed beside the new one) and the
# new one at contexts 512, 4096 and 32768 (BF16 and FP8 caches at 32768), racecheck last. Logs under $OUT.
#   usage (repo root, device): tools/gpu/attention_rows_round.sh   carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
gpu_tests "${TESTS:-CudaOps.*:*CudaGemv*:CudaRunnerTest.*:CudaRunnerModels.*:Fp8*}" 100
sanitize memcheck 'CudaOps.*Attention*:CudaOps.Fp8*:CudaRunnerModels.Fp8*' 60
run() {  # name binary context batches format
  timeout $(budget 40) $B/$2 --shape tests/data/shapes/s30.json --layers 8 --batches $4 --context $3 --steps 30 \
    --prefill-chunk 4096 --kv-format $5 > "$OUT/$1.txt" 2>&1
  echo "== $1: rc=$?"; grep -E "^ +[0-9]+ " "$OUT/$1.txt" | head -2
}
for rep in $(seq 1 ${REPS:-2}); do
  for ctx in 512 4096; do
    run "base-$ctx-r$rep" cuda_decode_bench_base $ctx 1,8 bf16
    run "new-$ctx-r$rep" cuda_decode_bench $ctx 1,8 bf16
  done
  stamp
done
for f in bf16 fp8; do
  run "base-32768-$f" cuda_decode_bench_base 32768 1 $f
  run "new-32768-$f" cuda_decode_bench 32768 1 $f
done
stamp
sanitize racecheck 'CudaOps.*Attention*:CudaOps.Fp8Attention*' 60
