#!/usr/bin/env bash
# Single-thread decode of spill and llama.cpp on the same GGUF files, by CPU time rather than wall
# time, for a loaded machine: the task-clock (CPU seconds, from `perf stat`) of an (N+1)-token
# `spill generate` minus a 1-token one, and of `llama-bench -t 1 --no-warmup -n N` minus `-n 1`
# (best of 3 each, the engines' runs interleaved).
#   usage: tools/bench/cpu_vs_llamacpp_cputime.sh SPILL LLAMA_BENCH FILE.gguf...
# Environment: N (decoded tokens, default 256); MODES (spill's CPU activations to run, default
# "q8 f32"); BASE (a second spill binary, e.g. an older build, measured in q8 beside the first).
set -euo pipefail
S="$1"; L="$2"; shift 2
N="${N:-256}"; MODES="${MODES:-q8 f32}"; BASE="${BASE:-}"
tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
cpu() { perf stat -x, -e task-clock -o "$tmp" "$@" >/dev/null 2>&1; awk -F, '/task-clock/ {print $1 / 1000}' "$tmp"; }
min() { sort -g | head -1; }
rate() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN {printf "%.0f", n / (a - b)}'; }
gen() { SPILL_CPU_ACTIVATIONS=$2 cpu "$1" generate --model "$f" --prompt-ids 100 -n "$3" --ignore-eos --print-ids --threads 1; }
header="| file |"; sep="|---|"
for mode in $MODES; do header="$header spill $mode tok/CPU-s |"; sep="$sep---|"; done
[ -n "$BASE" ] && { header="$header base spill q8 tok/CPU-s |"; sep="$sep---|"; }
echo "$header llama.cpp tok/CPU-s | load before / after |"; echo "$sep---|---|"
for f in "$@"; do
  before=$(awk '{print $1}' /proc/loadavg)
  declare -A long=() short=(); ll=(); ls=()
  for _ in 1 2 3; do
    for mode in $MODES; do long[$mode]+=" $(gen "$S" "$mode" $((N + 1)))"; short[$mode]+=" $(gen "$S" "$mode" 1)"; done
    if [ -n "$BASE" ]; then long[base]+=" $(gen "$BASE" q8 $((N + 1)))"; short[base]+=" $(gen "$BASE" q8 1)"; fi
    ll+=("$(cpu "$L" -m "$f" -t 1 -r 1 --no-warmup -p 0 -n "$N")"); ls+=("$(cpu "$L" -m "$f" -t 1 -r 1 --no-warmup -p 0 -n 1)")
  done
  row="| $(basename "$f") |"
  for key in $MODES ${BASE:+base}; do
    a=$(tr ' ' '\n' <<<"${long[$key]}" | grep . | min); b=$(tr ' ' '\n' <<<"${short[$key]}" | grep . | min)
    row="$row $(rate "$a" "$b" "$N") |"
  done
  a=$(printf '%s\n' "${ll[@]}" | min); b=$(printf '%s\n' "${ls[@]}" | min)
  echo "$row $(rate "$a" "$b" $((N - 1))) | $before / $(awk '{print $1}' /proc/loadavg) |"
  unset long short
done
