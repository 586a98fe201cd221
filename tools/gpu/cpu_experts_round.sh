#!/usr/bin/env bash
# Device round for host experts computed by the CPU (offload/cpu_experts.h):
#  1. in the background, llama.cpp (CUDA) built and the random-weight S30 GGUF made (tools/gpu/llama_peer.sh);
#  2. meanwhile the CPU-experts tests, the CUDA runner and MoE tests, memcheck and racecheck on the CPU-experts test;
#  3. on a quiet host, side by side on the same GGUF with the experts of the first NCMOE (default 14) of 48 layers
#     in host RAM: llama-bench -ncmoe NCMOE (tg128) and llama-batched-bench at 1/4/8 streams; spill reading them all
#     over PCIe, then with the CPU computing a share of them (--cpu-experts auto, and each of SHARES).
# Packed with tools/gpu/pack_spill.sh --tests; .carry/fin holds llama-src.tar.xz and make_gguf.py.
#   usage (repo root, device): bash tools/gpu/cpu_experts_round.sh   carry: [".carry/pack.tar.xz", ".carry/fin"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
NCMOE="${NCMOE:-14}"
SHARES="${SHARES:-0.5 0.7}"
F=.carry/fin
. tools/gpu/llama_peer.sh
llama_peer_start $F/llama-src.tar.xz $F/make_gguf.py "$OUT"
echo "== checks (while llama.cpp builds)"
gpu_tests 'CpuExperts*:CudaRunnerModels.*:CudaMoe*:CudaOffload*' 300
tests_rc=$?
sanitize memcheck 'CudaRunnerModels.CpuExperts*' 120
sanitize racecheck 'CudaRunnerModels.CpuExperts*' 120
[ $tests_rc -ne 0 ] && echo "tests failed (benchmarks run anyway)"
while [ ! -f /tmp/gguf.rc ] || [ ! -f /tmp/llama-build.rc ]; do
  [ $(( $(date +%s) - T0 )) -gt 400 ] && break; sleep 2; done
echo "== gguf rc=$(cat /tmp/gguf.rc 2>/dev/null || echo unfinished), llama build rc=$(cat /tmp/llama-build.rc 2>/dev/null || echo unfinished)"; stamp
L=/tmp/llama-build/bin
if [ -x $L/llama-bench ] && [ -f /tmp/s30.gguf ]; then
  timeout $(budget 60) $L/llama-bench -m /tmp/s30.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -ncmoe $NCMOE > "$OUT/llama-bench.txt" 2>&1
  echo "== llama-bench rc=$?"; grep -E "\| " "$OUT/llama-bench.txt"; stamp
fi
if [ -x $L/llama-batched-bench ] && [ -f /tmp/s30.gguf ]; then
  timeout $(budget 45) $L/llama-batched-bench -m /tmp/s30.gguf -ngl 99 -fa on -c 16384 -b 2048 -ub 512 -npp 256 -ntg 64 \
    -npl 1,4,8 --n-cpu-moe $NCMOE > "$OUT/llama-batched.txt" 2>&1
  echo "== llama-batched-bench --n-cpu-moe $NCMOE rc=$?"; grep -E "^\|" "$OUT/llama-batched.txt"; stamp
fi
spill_gguf() {  # name, then cuda_decode_bench's flags
  local name=$1; shift
  [ -f /tmp/s30.gguf ] || return
  timeout $(budget 60) $B/cuda_decode_bench --model /tmp/s30.gguf --context 512 --steps 32 --host-layers $NCMOE "$@" \
    > "$OUT/spill-$name.txt" 2>&1
  echo "== spill, $name: rc=$?"; grep -E "^ +[0-9]+ |CPU experts|cuda:0" "$OUT/spill-$name.txt" | head -8
}
spill_gguf pcie --batches 1,4,8
spill_gguf cpu-auto --batches 1,4,8 --cpu-experts auto
for s in $SHARES; do spill_gguf cpu-$s --batches 1,4,8 --cpu-experts $s; done
stamp
