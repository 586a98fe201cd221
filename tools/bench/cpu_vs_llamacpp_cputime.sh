#!/usr/bin/env bash
# Single-thread decode of spill (int8 and f32 activations) and llama.cpp on the same GGUF files, by
# CPU time rather than wall time, for a loaded machine: user+sys seconds of a 257-token
# `spill generate` minus a 1-token one, and of `llama-bench -t 1 --no-warmup -n 256` minus `-n 1`
# (best of 3 each; /usr/bin/time's 10 ms resolution makes each figure good to a few percent).
#   usage: tools/bench/cpu_vs_llamacpp_cputime.sh SPILL LLAMA_BENCH FILE.gguf...
set -euo pipefail
S="$1"; L="$2"; shift 2
tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
best() {
  local b=999 t
  for _ in 1 2 3; do
    /usr/bin/time -o "$tmp" -f "%U %S" "$@" >/dev/null 2>&1
    t=$(awk '{print $1 + $2}' "$tmp"); b=$(awk -v a="$b" -v c="$t" 'BEGIN {print (c < a) ? c : a}')
  done
  echo "$b"
}
rate() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN {printf "%.0f", n / (a - b)}'; }
echo "| file | spill q8 tok/CPU-s | spill f32 tok/CPU-s | llama.cpp tok/CPU-s |"
echo "|---|---|---|---|"
for f in "$@"; do
  row="| $(basename "$f") |"
  for mode in q8 f32; do
    a=$(SPILL_CPU_ACTIVATIONS=$mode best "$S" generate --model "$f" --prompt-ids 100 -n 257 --ignore-eos --print-ids --threads 1)
    b=$(SPILL_CPU_ACTIVATIONS=$mode best "$S" generate --model "$f" --prompt-ids 100 -n 1 --ignore-eos --print-ids --threads 1)
    row="$row $(rate "$a" "$b" 256) |"
  done
  a=$(best "$L" -m "$f" -t 1 -r 1 --no-warmup -p 0 -n 256); b=$(best "$L" -m "$f" -t 1 -r 1 --no-warmup -p 0 -n 1)
  echo "$row $(rate "$a" "$b" 255) |"
done
