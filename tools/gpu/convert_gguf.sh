#!/usr/bin/env bash
# On the GPU machine (torch is there, not here): llama.cpp's converter turns spill-tiny and the
# random GGUF test models (tools/fixtures/make_gguf_test_models.py) into BF16 GGUF files, as users make
# them. Needs .carry/llama-convert.tar.gz. Files come back at most 16 MiB each, so big ones are split.
#   usage (repo root): tools/gpu/convert_gguf.sh MODEL... (spill-tiny, qwen3_moe, mixtral, olmoe, qwen3, llama)
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/spill-out}"
mkdir -p "$OUT" /tmp/conv
tar -xzf .carry/llama-convert.tar.gz -C /tmp/conv
python3 tools/fixtures/make_gguf_test_models.py --tokenizer models/spill-tiny --out /tmp/hf | tee "$OUT/sha256.txt"
for m in "$@"; do
  src=/tmp/hf/$m
  [ "$m" = spill-tiny ] && src=models/spill-tiny
  python3 tools/fixtures/convert_with_pre.py /tmp/conv "$src" --outtype bf16 --outfile "/tmp/$m-bf16.gguf" > "/tmp/$m.log" 2>&1 \
    || { tail -30 "/tmp/$m.log"; exit 1; }
  size=$(stat -c %s "/tmp/$m-bf16.gguf")
  echo "$m: $size bytes $(sha256sum "/tmp/$m-bf16.gguf" | cut -c1-16)"
  if [ "$size" -gt 16000000 ]; then split -b 15m -d "/tmp/$m-bf16.gguf" "$OUT/$m-bf16.gguf.part"; else cp "/tmp/$m-bf16.gguf" "$OUT/"; fi
done
ls -la "$OUT"
