#!/usr/bin/env bash
# Decode and prefill speed of `spill generate` on the CPU backend, for a ~34M-parameter random
# Qwen3-MoE (16 experts, top-2; 9.1M active per token) with spill-tiny's tokenizer. Prints a table.
#   usage: tools/bench/bench_generate.sh [path/to/spill] [runs]
set -euo pipefail
cd "$(dirname "$0")/../.."
SPILL="${1:-build/spill}"
RUNS="${2:-5}"
MODEL=/tmp/spill-bench-34m
[ -f "$MODEL/config.json" ] || python3 tools/bench/make_random_model.py --out "$MODEL" --tokenizer models/spill-tiny/tokenizer.json >/dev/null
python3 tools/bench/make_random_model.py --help >/dev/null
printf "%-8s %-5s %8s %8s %14s %14s\n" threads run prompt gen "prefill tok/s" "decode tok/s"
for threads in 1 2; do
  decodes=()
  for run in $(seq 1 "$RUNS"); do
    line=$("$SPILL" generate --model "$MODEL" --prompt "def fibonacci(n):
    \"\"\"Return the n-th Fibonacci number.\"\"\"" -n 128 --temperature 0 --ignore-eos --threads "$threads" 2>&1 >/dev/null | grep '^\[spill\]')
    prompt=$(sed -E 's/.*prompt ([0-9]+) tokens.*/\1/' <<<"$line")
    prefill=$(sed -E 's/.*s \(([0-9.]+) tok\/s\).*/\1/' <<<"$line")
    gen=$(sed -E 's/.*generated ([0-9]+) tokens.*/\1/' <<<"$line")
    decode=$(sed -E 's/.*decode ([0-9.]+) tok\/s.*/\1/' <<<"$line")
    decodes+=("$decode")
    printf "%-8s %-5s %8s %8s %14s %14s\n" "$threads" "$run" "$prompt" "$gen" "$prefill" "$decode"
  done
  median=$(printf "%s\n" "${decodes[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf "%-8s %-5s %8s %8s %14s %14s\n" "$threads" median "" "" "" "$median"
done
