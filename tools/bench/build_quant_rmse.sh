#!/bin/sh
# Builds tools/bench/quant_rmse against spill's library (build/) and ggml's base library from a
# llama.cpp build. Usage: tools/bench/build_quant_rmse.sh LLAMA_SRC LLAMA_BUILD [OUT]
#   LLAMA_SRC:   an extracted llama.cpp source tree (for ggml's headers)
#   LLAMA_BUILD: its cmake build folder, with the ggml-base target built (static, or shared: then
#                the binary finds it through an rpath to that folder)
set -e
src=$1 bld=$2 out=${3:-build/quant_rmse}
[ -n "$src" ] && [ -n "$bld" ] || { echo "usage: $0 LLAMA_SRC LLAMA_BUILD [OUT]" >&2; exit 2; }
lib=$(find "$bld" -name 'libggml-base.a' | head -n1)
[ -n "$lib" ] || lib=$(find "$bld" -name 'libggml-base.so' | head -n1)
[ -n "$lib" ] || { echo "no libggml-base.a or .so under $bld: build the ggml-base target first" >&2; exit 1; }
case $lib in *.so) lib="$lib -Wl,-rpath,$(dirname "$lib")" ;; esac
c++ -std=c++20 -O2 -Wall -Wextra -mavx2 -mfma -mf16c -I src -I "$src/ggml/include" tools/bench/quant_rmse.cpp \
  ${SPILL_LIB:-build/libspill_lib.a} $lib -lfmt -lpthread -lm -o "$out"
echo "built $out"
