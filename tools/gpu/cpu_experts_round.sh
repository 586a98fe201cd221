#!/usr/bin/env bash
# Device round for host experts computed by the CPU (offload/cpu_experts.h):
#  1. in the background, llama.cpp (CUDA) built and the random-weight S30 GGUF made (tools/gpu/llama_peer.sh);
#  2. meanwhile the CPU-experts tests, the CUDA runner and MoE tests, memcheck and racecheck on the CPU-experts test;
#  3. on a quiet host, side by side on the same GGUF with the experts of the first NCMOE (default 14) of 48 layers
#     in host RAM: llama-bench -ncmoe NCMOE (tg128) and llama-batched-bench at 1/4/8 streams; spill reading them all
#     over PCIe, then with the CPU computing a share of them (--cpu-experts auto, and each of SHARES).
# Packed with tools/gpu/pack_spill.sh --tests; .carry/fin holds llama-src.tar.xz and make_gguf.py.
#   usage (repo root, device): bash tools/gpu/cpu_experts_round.sh   carry: [".carry/pack.tar.xz", ".carry/fin"]
# MODE=sweep instead: no llama.cpp (TESTS=1: the tests and sanitizers first); the host's CPU, then the synthetic S30
# with the experts of NCMOE layers in host RAM: PCIe only, the CPU only (--cpu-experts 1), auto, each of SHARES,
# auto at each of THREADS threads, with PROFILE=1 per-op device times (eager launches), and handoff_probe if packed.
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
NCMOE="${NCMOE:-14}"
if [ "${MODE:-}" = sweep ]; then
  if [ "${TESTS:-0}" = 1 ]; then  # the CPU-experts, quant (the AVX-512 kernels) and MoE tests first
    gpu_tests 'CpuExperts*:CudaRunnerModels.CpuExperts*:CudaRunnerModels.ExpertsInHostRam*:CudaMoe*:*DotQ8*:DotTokens*:Dot.*' 150
    sanitize memcheck 'CudaRunnerModels.CpuExperts*' 90
    sanitize racecheck 'CudaRunnerModels.CpuExperts*' 90
  fi
  (lscpu; numactl --hardware 2>/dev/null; cat /sys/kernel/mm/transparent_hugepage/enabled) > "$OUT/cpu.txt" 2>&1
  grep -E "^(Model name|Thread|Core|Socket|NUMA node|Flags)" "$OUT/cpu.txt" | sed 's/^Flags:.*\(avx512[a-z_]*\).*/Flags: has \1/' | head -12
  grep -o -E "avx512_vnni|avx_vnni|amx_int8|avx512bw" "$OUT/cpu.txt" | sort -u | tr '\n' ' '; echo
  syn() {  # name, then flags
    local name=$1; shift
    timeout $(budget 60) $B/cuda_decode_bench --shape tests/data/shapes/s30.json --context 512 --steps 24 \
      --host-layers $NCMOE "$@" > "$OUT/syn-$name.txt" 2>&1
    echo "== $name: rc=$?"; grep -E "^ +[0-9]+ |CPU experts:|device time by op" "$OUT/syn-$name.txt" | cut -c1-400 | head -9
  }
  syn pcie --batches 1,4,8
  syn cpu-all --batches 1,4,8 --cpu-experts 1
  syn auto --batches 1,4,8 --cpu-experts auto
  for s in ${SHARES:-}; do syn cpu-$s --batches 1,4,8 --cpu-experts $s; done
  for t in ${THREADS:-}; do syn auto-t$t --batches 1,8 --cpu-experts auto --cpu-expert-threads $t; done
  if [ "${PROFILE:-0}" = 1 ]; then
    syn auto-profile --batches 1 --cpu-experts auto --profile --no-graphs
    syn pcie-profile --batches 1 --profile --no-graphs
  fi
  stamp
  if [ "${HANDOFF:-0}" = 1 ] && [ -x $B/handoff_probe ]; then
    timeout $(budget 120) $B/handoff_probe --phases 384 --reps 7 > "$OUT/handoff.txt" 2>&1; echo "== handoff rc=$?"
    tail -30 "$OUT/handoff.txt"; stamp
  fi
  exit 0
fi
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
