# Sourced by the device scripts that run llama.cpp beside spill (side_by_side_llamacpp.sh,
# offload_side_by_side_round.sh). llama_peer_start SRC MAKE_GGUF LOGDIR starts two background jobs:
# llama.cpp (CUDA, sm_90) built from the source tarball SRC into /tmp/llama-build (llama-bench and
# llama-batched-bench), and the random-weight S30 GGUF /tmp/s30.gguf made by MAKE_GGUF (experts Q4_K, the rest
# Q8_0). Each writes its exit code to /tmp/llama-build.rc and /tmp/gguf.rc when done; logs go to LOGDIR.
# Both run niced, so that spill's checks running meanwhile keep the host's attention.
llama_peer_start() {
  local src=$1 make_gguf=$2 logs=$3
  mkdir -p /tmp/llama && tar -xf "$src" -C /tmp/llama
  ( cmake -S /tmp/llama -B /tmp/llama-build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_MTMD=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > "$logs/llama-cmake.txt" 2>&1 &&
    nice -n 10 cmake --build /tmp/llama-build -j13 --target llama-bench llama-batched-bench > "$logs/llama-build.txt" 2>&1
    echo $? > /tmp/llama-build.rc ) &
  ( PYTHONPATH=/tmp/llama/gguf-py nice -n 10 python3 "$make_gguf" /tmp/s30.gguf s30 > "$logs/make_gguf.txt" 2>&1
    echo $? > /tmp/gguf.rc ) &
}
