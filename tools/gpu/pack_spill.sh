#!/usr/bin/env bash
# Copies a local CUDA build of spill (configured with -DCMAKE_CUDA_ARCHITECTURES=90) and the shared
# libraries it links that the GPU machine's image lacks into .carry/ (ignored by git) for a device
# call with carry [".carry/bin", ".carry/lib"]. glibc, libstdc++ and the CUDA runtime are the machine's own.
# With --tests, spill_tests, cuda_decode_bench and cuda_moe_bench go too, and everything is packed into
# .carry/pack.tar.xz (about 10 MB instead of 75: the working tree and the carry travel within 64 MiB);
# carry [".carry/pack.tar.xz"] then, and the device scripts unpack it (tools/gpu/kv_format_round.sh).
#   usage: tools/gpu/pack_spill.sh [--tests] [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
TESTS=0
if [ "${1:-}" = --tests ]; then TESTS=1; shift; fi
BUILD="${1:-build}"
rm -rf .carry/bin .carry/lib .carry/pack.tar.xz && mkdir -p .carry/bin .carry/lib
BINS=(spill)
if [ $TESTS -eq 1 ]; then BINS+=(spill_tests cuda_decode_bench cuda_moe_bench); fi
for b in "${BINS[@]}"; do
  strip -o ".carry/bin/$b" "$BUILD/$b"
  ldd "$BUILD/$b" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libstdc++*|libgcc_s*|libpthread*|libdl.so*|librt.so*|ld-linux*|libcudart*|libcuda.so*) ;;
      *) cp -L "$path" .carry/lib/ ;;
    esac
  done
done
# BASE_BENCH=path: a cuda_decode_bench built from the base commit goes too, as cuda_decode_bench_base,
# for rounds that alternate base and new in one call (tools/gpu/attention_rows_round.sh).
if [ $TESTS -eq 1 ] && [ -n "${BASE_BENCH:-}" ]; then strip -o .carry/bin/cuda_decode_bench_base "$BASE_BENCH"; fi
# BASE_MOE_BENCH=path: the base commit's cuda_moe_bench, as cuda_moe_bench_base (tools/gpu/variants_round.sh).
if [ $TESTS -eq 1 ] && [ -n "${BASE_MOE_BENCH:-}" ]; then strip -o .carry/bin/cuda_moe_bench_base "$BASE_MOE_BENCH"; fi
# EXTRA_BINS="name=path ...": more builds to compare (e.g. cuda_decode_bench_mid=/tmp/wt/build/cuda_decode_bench).
for pair in ${EXTRA_BINS:-}; do strip -o ".carry/bin/${pair%%=*}" "${pair#*=}"; done
if [ $TESTS -eq 1 ]; then
  # xz -9: a 64 MiB dictionary spans the binaries, whose device code is mostly the same bytes (23 -> 10 MB)
  tar -C .carry -cf - bin lib | xz -9 -T2 > .carry/pack.tar.xz
  du -sh .carry/pack.tar.xz
else
  du -sh .carry/bin .carry/lib
fi
