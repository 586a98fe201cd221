#!/usr/bin/env bash
# CPU decode and prefill, spill beside llama.cpp's llama-bench, on the same GGUF files, in one run.
# tg128: 128 tokens decoded after a 1-token prompt (llama-bench's -n 128 starts from an empty context);
# pp512: a 512-token prompt. Both engines get the same thread count. Prints a markdown table.
#   usage: tools/bench/cpu_vs_llamacpp.sh SPILL LLAMA_BENCH THREADS RUNS FILE.gguf...
# PREFILL=0 skips the pp512 columns (decode only, for a quick run on a loaded machine). spill runs with
# its default CPU activations (int8 for block formats, as llama.cpp); SPILL_CPU_ACTIVATIONS=f32 in the
# environment measures the exact f32-activation path instead.
set -euo pipefail
SPILL="$1"; LLAMA_BENCH="$2"; THREADS="$3"; RUNS="$4"; shift 4
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ids() { seq -s, 100 $((99 + $1)); }  # token ids 100.. (inside every vocabulary here)
spill_rate() {  # file, prompt tokens, generated tokens, field (prefill|decode)
  for _ in $(seq 1 "$RUNS"); do
    "$SPILL" generate --model "$1" --prompt-ids "$(ids "$2")" -n "$3" --ignore-eos --print-ids --threads "$THREADS" \
      2>&1 >/dev/null | grep '^\[spill\]' |
      if [ "$4" = prefill ]; then sed -E 's/.*s \(([0-9.]+) tok\/s\).*/\1/'; else sed -E 's/.*decode ([0-9.]+) tok\/s.*/\1/'; fi
  done | median
}
llama_rate() {  # file, test (pp512|tg128)
  local args=(-p 0 -n 128); [ "$2" = pp512 ] && args=(-p 512 -n 0)
  "$LLAMA_BENCH" -m "$1" -t "$THREADS" -r "$RUNS" -o csv "${args[@]}" 2>/dev/null | tail -1 |
    awk -F, '{gsub(/"/, "", $0); print $(NF-1)}'  # avg_ts
}
echo "| file | size | spill tg128 tok/s | llama.cpp tg128 tok/s | spill / llama.cpp | spill pp512 tok/s | llama.cpp pp512 tok/s |"
echo "|---|---|---|---|---|---|---|"
for f in "$@"; do
  s_tg=$(spill_rate "$f" 1 128 decode); l_tg=$(llama_rate "$f" tg128)
  s_pp=-; l_pp=-
  if [ "${PREFILL:-1}" != 0 ]; then s_pp=$(spill_rate "$f" 512 1 prefill); l_pp=$(llama_rate "$f" pp512); fi
  ratio=$(awk -v a="$s_tg" -v b="$l_tg" 'BEGIN {printf "%.2f", a / b}')
  echo "| $(basename "$f") | $(du -h "$f" | cut -f1) | $s_tg | $l_tg | $ratio | $s_pp | $l_pp |"
done
