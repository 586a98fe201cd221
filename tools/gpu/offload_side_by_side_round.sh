#!/usr/bin/env bash
# One device call that checks a new build and compares it with llama.cpp with experts in host RAM:
#  1. in the background, llama.cpp (CUDA) is built from .carry/fin/llama-src.tar.xz and the random-weight S30 GGUF
#     made (.carry/fin/make_gguf.py: experts Q4_K, the rest Q8_0);
#  2. meanwhile the CUDA tests, memcheck, racecheck and the GEMV/MoE tables of the new build against the base
#     (tools/gpu/variants_round.sh with DECODE=none; its logs in $OUT/checks/logs.tar.gz);
#  3. on a quiet host: llama-bench (-ncmoe 0 and NCMOE, default 14: the experts of the first 14 of 48 layers on
#     its CPU) and llama-batched-bench at 1/4/8 streams with NCMOE; spill (base and new builds) on the same GGUF
#     with the same experts in host RAM read in place by the GPU (--host-layers NCMOE), spill's own uniform plan
#     (--host-share 0.29) and all in VRAM; then S30 48-layer decode base against new on the synthetic model.
# Packed with tools/gpu/pack_spill.sh --tests (BASE_BENCH, BASE_MOE_BENCH); .carry/fin holds llama-src.tar.xz
# (../shared/peers/llamacpp/llama-src.tar.gz recompressed, to stay within the carry limit) and make_gguf.py.
#   usage (repo root, device): bash tools/gpu/offload_side_by_side_round.sh   carry: [".carry/pack.tar.xz", ".carry/fin"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
NCMOE="${NCMOE:-14}"
F=.carry/fin
. tools/gpu/llama_peer.sh
llama_peer_start $F/llama-src.tar.xz $F/make_gguf.py "$OUT"
echo "== checks (while llama.cpp builds)"
OUT="$OUT/checks" ROUND_SECONDS=$(budget 330) DECODE=none bash tools/gpu/variants_round.sh
checks_rc=$?; stamp
[ $checks_rc -ne 0 ] && { echo "checks failed: no comparisons"; exit 1; }
while [ ! -f /tmp/gguf.rc ] || [ ! -f /tmp/llama-build.rc ]; do
  [ $(( $(date +%s) - T0 )) -gt 420 ] && break; sleep 2; done
echo "== gguf rc=$(cat /tmp/gguf.rc 2>/dev/null || echo unfinished), llama build rc=$(cat /tmp/llama-build.rc 2>/dev/null || echo unfinished)"; stamp
L=/tmp/llama-build/bin
if [ -x $L/llama-bench ] && [ -f /tmp/s30.gguf ]; then
  timeout $(budget 60) $L/llama-bench -m /tmp/s30.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 -ncmoe 0,$NCMOE > "$OUT/llama-bench.txt" 2>&1
  echo "== llama-bench rc=$?"; grep -E "\| " "$OUT/llama-bench.txt"; stamp
fi
if [ -x $L/llama-batched-bench ] && [ -f /tmp/s30.gguf ]; then
  timeout $(budget 45) $L/llama-batched-bench -m /tmp/s30.gguf -ngl 99 -fa on -c 16384 -b 2048 -ub 512 -npp 256 -ntg 64 \
    -npl 1,4,8 --n-cpu-moe $NCMOE > "$OUT/llama-batched-ncmoe$NCMOE.txt" 2>&1
  echo "== llama-batched-bench --n-cpu-moe $NCMOE rc=$?"; grep -E "^\|" "$OUT/llama-batched-ncmoe$NCMOE.txt"; stamp
fi
spill_gguf() {  # name binary, then cuda_decode_bench's placement flags and batches
  local name=$1 bin=$2; shift 2
  [ -f /tmp/s30.gguf ] || return
  timeout $(budget 60) $B/$bin --model /tmp/s30.gguf --context 512 --steps 32 "$@" > "$OUT/spill-$name.txt" 2>&1
  echo "== spill on the GGUF, $name: rc=$?"; grep -E "^ +[0-9]+ " "$OUT/spill-$name.txt" | head -4
}
spill_gguf host-layers-new cuda_decode_bench --host-layers $NCMOE --batches 1,4,8
spill_gguf host-layers-base cuda_decode_bench_base --host-layers $NCMOE --batches 1
spill_gguf vram-new cuda_decode_bench --batches 1,4,8
spill_gguf vram-base cuda_decode_bench_base --batches 1,4,8
spill_gguf host-share-new cuda_decode_bench --host-share 0.29 --batches 1
stamp
for v in cuda_decode_bench_base cuda_decode_bench; do
  timeout $(budget 40) $B/$v --shape tests/data/shapes/s30.json --batches 1,8 --context 512 --steps 30 > "$OUT/$v-48.txt" 2>&1
  echo "== $v 48 layers: rc=$?"; grep -E "^ +[0-9]+ " "$OUT/$v-48.txt" | head -2
done
stamp
# The attention's prompt build at long prompts (8 layers: prefill of 32K tokens in chunks of 4096, then decode).
for v in cuda_decode_bench_base cuda_decode_bench; do
  timeout $(budget 40) $B/$v --shape tests/data/shapes/s30.json --layers 8 --batches 1 --context 32768 --steps 20 \
    --prefill-chunk 4096 > "$OUT/$v-32k.txt" 2>&1
  echo "== $v 8 layers, 32K: rc=$?"; grep -E "^ +[0-9]+ |prefill of" "$OUT/$v-32k.txt" | head -2
done
stamp
