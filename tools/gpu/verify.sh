#!/usr/bin/env bash
# One call on the GPU machine that checks what a change to the GPU path must prove there: the kernel
# library's tests (CUDA ops against their CPU twins, the CPU block-format kernels on this host's widest
# vector path), compute-sanitizer memcheck and racecheck, the kernel benchmark, and `spill topo`
# (HBM and in-place host read bandwidth). The server's packages are missing there, so `spill` itself
# is built here (sm_90) and carried with the libraries it links: tools/gpu/pack_spill.sh.
#   usage (repo root, device): tools/gpu/verify.sh      carry: [".carry/bin", ".carry/lib"]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'); vector extensions: $(grep -o 'avx512[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
tools/gpu/cuda_kernels.sh 2>&1 | tee "$OUT/kernels.txt" | tail -40
echo "== quant kernels on this CPU"
build-kernels/spill_kernel_tests --gtest_filter='*EveryKernelPath*:*Dequant*:*Quantiz*' 2>&1 | grep -E '^\[  (PASSED|FAILED)|FAILED ' | head
echo "== spill topo"
if [ -x .carry/bin/spill ]; then
  LD_LIBRARY_PATH="$PWD/.carry/lib" .carry/bin/spill topo --json "$OUT/topo-h200.json" 2>&1 | tee "$OUT/topo.txt"
else
  echo "no carried spill binary (.carry/bin/spill): run tools/gpu/pack_spill.sh here first"
fi
