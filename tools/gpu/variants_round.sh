#!/usr/bin/env bash
# Device round comparing builds of spill that give the same bits (packed beside the new one by
# tools/gpu/pack_spill.sh: BASE_BENCH, BASE_MOE_BENCH, EXTRA_BINS): the CUDA tests and memcheck (skipped with
# TESTS=none), racecheck on the attention, MoE and GEMV tests, the GEMV and S30 MoE tables of cuda_moe_bench
# for base and new (when the base's is packed), then S30 decode in graphs alternating the cuda_decode_bench
# builds named in VARIANTS (default: base, new): 8 layers at each of CONTEXTS (default 512) at batches 1, 4,
# 8, REPS times; 8 layers at context LONG (default 32768, none to skip) at batch 1; all 48 layers at batch
# 1 and 8. Logs under $OUT (logs.tar.gz). A variant may set the environment of its run: NAME=VALUE+binary
# (e.g. SPILL_GEMV_BULK=0,SPILL_MOE_BULK=0+cuda_decode_bench); MOE_VARIANTS (default: cuda_moe_bench_base cuda_moe_bench)
# names the cuda_moe_bench runs the same way. DECODE=none skips the decode runs, and TESTS=none plus
# SAN=none the checks, so that one round's checks and another's timings fit the per-call limit. BENCH_ARGS
# goes to every decode run (e.g. "--host-layers 14" for experts in host RAM).
#   usage (repo root, device): VARIANTS="cuda_decode_bench_base cuda_decode_bench_mid cuda_decode_bench" \
#                              CONTEXTS="512 4096" tools/gpu/variants_round.sh      carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
VARIANTS="${VARIANTS:-cuda_decode_bench_base cuda_decode_bench}"
SAN="${SAN:-CudaOps.AttentionDecodeAndPrefillMatchTheTwin:CudaOps.TensorCore*:CudaMoe.MatchesCpuTwinOverBatchesAndFormats:CudaGemvTest.*}"
if [ "${TESTS:-}" != none ]; then
  # A failing (or hanging) build would spend the rest of the call on sanitizers and timings of wrong code.
  # (KEEP_GOING=1: time the variants anyway, e.g. when a variant switches the failing path off.)
  gpu_tests "${TESTS:-*Cuda*:Fp8*:-*Collectives*}" 120 || [ "${KEEP_GOING:-0}" = 1 ] || exit 1
  sanitize memcheck "$SAN" 90
fi
[ "$SAN" != none ] && sanitize racecheck "$SAN" 150
# variant_cmd V: the command line of variant V (NAME=VALUE+binary: the binary under that environment).
variant_cmd() { case "$1" in *+*) echo "env $(echo "${1%%+*}" | tr ',' ' ') $B/${1#*+}" ;; *) echo "$B/$1" ;; esac; }
variant_tag() { echo "$1" | tr '=+,' '-__'; }
for b in ${MOE_VARIANTS:-cuda_moe_bench_base cuda_moe_bench}; do
  [ -x $B/${b#*+} ] || continue
  timeout $(budget 40) $(variant_cmd $b) --shape s30 --no-host --reps 200 > "$OUT/moe-$(variant_tag $b).txt" 2>&1
  echo "== GEMV and MoE tables, $b: rc=$?"
  grep -E "^S30" "$OUT/moe-$(variant_tag $b).txt" | awk '$7==1 || $7==4 || $7==8'
  grep -E "^[0-9]+ -> " "$OUT/moe-$(variant_tag $b).txt" | awk '$4==1 || $4==8'
done
stamp
[ "${DECODE:-}" = none ] && exit 0
run() {  # name variant layers context batches
  timeout $(budget 40) $(variant_cmd $2) --shape tests/data/shapes/s30.json --layers $3 --batches $5 --context $4 \
    --steps 30 --prefill-chunk 4096 ${BENCH_ARGS:-} > "$OUT/$(variant_tag $1).txt" 2>&1
  echo "== $1: rc=$?"; grep -E "^ +[0-9]+ |prefill of" "$OUT/$(variant_tag $1).txt" | head -4
}
for rep in $(seq 1 ${REPS:-2}); do
  for ctx in ${CONTEXTS:-512}; do
    for v in $VARIANTS; do run "$v-$ctx-r$rep" $v 8 $ctx 1,4,8; done
  done
  stamp
done
if [ "${LONG:-32768}" != none ]; then
  for v in $VARIANTS; do run "$v-${LONG:-32768}" $v 8 ${LONG:-32768} 1; done
fi
for v in $VARIANTS; do run "$v-48" $v 48 512 1,8; done
stamp
