#!/usr/bin/env bash
# CPU decode and prefill, spill beside llama.cpp's llama-bench, on the same GGUF files, in one run.
# tg128: 128 tokens decoded after a 1-token prompt (llama-bench's -n 128 starts from an empty context);
# pp512: a 512-token prompt. Both engines get the same thread count. Prints a markdown table.
#   usage: tools/bench/cpu_vs_llamacpp.sh SPILL LLAMA_BENCH THREADS RUNS FILE.gguf...
# The two engines' runs are interleaved (spill, llama.cpp, spill, ...; RUNS of each), so a shared
# machine's load falls on both alike; the table gives each engine's median and the range, and the
# load average (uptime) before and after each file.
# PREFILL=0 skips the pp512 columns (decode only, for a quick run on a loaded machine). spill runs with
# its default CPU activations (int8 for block formats, as llama.cpp); SPILL_CPU_ACTIVATIONS=f32 in the
# environment measures the exact f32-activation path instead.
set -euo pipefail
SPILL="$1"; LLAMA_BENCH="$2"; THREADS="$3"; RUNS="$4"; shift 4
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
range() { sort -n | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%s-%s", lo, hi}'; }
load() { awk '{print $1}' /proc/loadavg; }
ids() { seq -s, 100 $((99 + $1)); }  # token ids 100.. (inside every vocabulary here)
spill_once() {  # file, prompt tokens, generated tokens, field (prefill|decode)
  "$SPILL" generate --model "$1" --prompt-ids "$(ids "$2")" -n "$3" --ignore-eos --print-ids --threads "$THREADS" \
    2>&1 >/dev/null | grep '^\[spill\]' |
    if [ "$4" = prefill ]; then sed -E 's/.*s \(([0-9.]+) tok\/s\).*/\1/'; else sed -E 's/.*decode ([0-9.]+) tok\/s.*/\1/'; fi
}
llama_once() {  # file, test (pp512|tg128)
  local args=(-p 0 -n 128); [ "$2" = pp512 ] && args=(-p 512 -n 0)
  "$LLAMA_BENCH" -m "$1" -t "$THREADS" -r 1 -o csv "${args[@]}" 2>/dev/null | tail -1 |
    awk -F, '{gsub(/"/, "", $0); printf "%.1f\n", $(NF-1)}'  # avg_ts
}
both() {  # file, spill prompt, spill generated, spill field, llama test -> "spill_median spill_range llama_median llama_range"
  local s=() l=()
  for _ in $(seq 1 "$RUNS"); do
    s+=("$(spill_once "$1" "$2" "$3" "$4")"); l+=("$(llama_once "$1" "$5")")
  done
  echo "$(printf '%s\n' "${s[@]}" | median) $(printf '%s\n' "${s[@]}" | range)" \
       "$(printf '%s\n' "${l[@]}" | median) $(printf '%s\n' "${l[@]}" | range)"
}
echo "| file | size | spill tg128 tok/s (range) | llama.cpp tg128 tok/s (range) | spill / llama.cpp | spill pp512 tok/s | llama.cpp pp512 tok/s | load before / after |"
echo "|---|---|---|---|---|---|---|---|"
for f in "$@"; do
  before=$(load)
  read -r s_tg s_tgr l_tg l_tgr <<<"$(both "$f" 1 128 decode tg128)"
  s_pp=-; l_pp=-
  if [ "${PREFILL:-1}" != 0 ]; then
    read -r s_pp s_ppr l_pp l_ppr <<<"$(both "$f" 512 1 prefill pp512)"
    s_pp="$s_pp ($s_ppr)"; l_pp="$l_pp ($l_ppr)"
  fi
  ratio=$(awk -v a="$s_tg" -v b="$l_tg" 'BEGIN {printf "%.2f", a / b}')
  echo "| $(basename "$f") | $(du -h "$f" | cut -f1) | $s_tg ($s_tgr) | $l_tg ($l_tgr) | $ratio | $s_pp | $l_pp | $before / $(load) |"
done
