#!/usr/bin/env bash
# Copies a local CUDA build of spill (configured with -DCMAKE_CUDA_ARCHITECTURES=90) and the shared
# libraries it links that the GPU machine's image lacks into .carry/ (ignored by git) for a device
# call with carry [".carry/bin", ".carry/lib"]. glibc, libstdc++ and the CUDA runtime are the machine's own.
#   usage: tools/gpu/pack_spill.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build}"
rm -rf .carry/bin .carry/lib && mkdir -p .carry/bin .carry/lib
strip -o .carry/bin/spill "$BUILD/spill"
ldd "$BUILD/spill" | awk '/=> \//{print $1, $3}' | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libstdc++*|libgcc_s*|libpthread*|libdl.so*|librt.so*|ld-linux*|libcudart*|libcuda.so*) ;;
    *) cp -L "$path" .carry/lib/ ;;
  esac
done
du -sh .carry/bin .carry/lib
