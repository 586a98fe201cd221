#!/bin/bash
# One device call: llama.cpp (CUDA, built here from the peer tarball) and spill on the same random-weight
# S30 GGUF (../shared/peers/llamacpp/make_gguf.py: experts Q4_K, the rest Q8_0), all in VRAM and with the
# experts of the first NCMOE (default 14) of 48 layers in host RAM (llama.cpp's --n-cpu-moe: its CPU computes
# them; spill's GPU reads them in place over PCIe), plus spill's own uniform plan with the same share of
# experts on host (--host-share 0.29), and spill's time per output token by context on the synthetic S30.
# Copy into .carry/fin/ with: llama-src.tar.gz and make_gguf.py (../shared/peers/llamacpp/), s30.json
# (../shared/shapes/), a stripped gzipped cuda_decode_bench built for sm_90; the server's libraries in
# .carry/lib2. Run as `bash .carry/fin/side_by_side_llamacpp.sh` with carry [".carry/fin", ".carry/lib2"];
# results under $OUT. The runs that are compared run after the llama.cpp build has finished, so nothing
# shares the host with them; the spill runs during the build are marked so.
cd "$(dirname "$0")/../.."
D=.carry/fin; O="${OUT:-/tmp/out}"; mkdir -p "$O"
NCMOE="${NCMOE:-14}"
gunzip -f $D/cuda_decode_bench.gz; chmod +x $D/cuda_decode_bench
export LD_LIBRARY_PATH="$PWD/.carry/lib2"
T0=$(date +%s); el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee "$O/env.txt"
. tools/gpu/llama_peer.sh
llama_peer_start $D/llama-src.tar.gz $D/make_gguf.py "$O"
for ctx in ${TPOT_CONTEXTS:-4096 32768}; do
  timeout 170 $D/cuda_decode_bench --shape $D/s30.json --batches 1 --context $ctx --steps 16 > "$O/tpot_$ctx.txt" 2>&1
  echo "== spill TPOT ctx $ctx rc=$? ($(el)) (the llama.cpp build shares the host)"; grep -E "^ +1 |prefill of" "$O/tpot_$ctx.txt"
done
while [ ! -f /tmp/gguf.rc ]; do sleep 2; done; echo "== gguf rc=$(cat /tmp/gguf.rc) ($(el))"
spill_gguf() {  # name, then cuda_decode_bench's placement flags and batches
  local name=$1; shift
  timeout 120 $D/cuda_decode_bench --model /tmp/s30.gguf --context 512 --steps 32 "$@" > "$O/spill_$name.txt" 2>&1
  echo "== spill on the GGUF, $name: rc=$? ($(el))"; grep -E "^ +[0-9]+ " "$O/spill_$name.txt" | head -6
}
# The host-RAM placements first, while the build runs (repeated below on a quiet host at batch 1).
spill_gguf host_layers_build --host-layers $NCMOE --batches 1,4,8
spill_gguf host_share_build --host-share 0.29 --batches 1,4,8
while [ ! -f /tmp/llama-build.rc ] && [ $(( $(date +%s)-T0 )) -lt 440 ]; do sleep 3; done
echo "== llama build rc=$(cat /tmp/llama-build.rc 2>/dev/null || echo unfinished) ($(el))"
B=/tmp/llama-build/bin
if [ -x $B/llama-bench ]; then
  timeout 90 $B/llama-bench -m /tmp/s30.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 -ncmoe 0,$NCMOE > "$O/llama-bench.txt" 2>&1
  echo "== llama-bench rc=$? ($(el))"; grep -E "\| " "$O/llama-bench.txt"
fi
if [ -x $B/llama-batched-bench ]; then
  for n in 0 $NCMOE; do
    timeout 60 $B/llama-batched-bench -m /tmp/s30.gguf -ngl 99 -fa on -c 16384 -b 2048 -ub 512 -npp 256 -ntg 64 \
      -npl 1,2,4,8 --n-cpu-moe $n > "$O/llama-batched-ncmoe$n.txt" 2>&1
    echo "== llama-batched-bench --n-cpu-moe $n rc=$? ($(el))"; grep -E "^\|" "$O/llama-batched-ncmoe$n.txt"
  done
fi
spill_gguf vram --batches 1,2,4,8
spill_gguf host_layers --host-layers $NCMOE --batches 1,4,8
spill_gguf host_share --host-share 0.29 --batches 1
echo "total $(el)"
