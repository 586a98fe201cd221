#!/usr/bin/env bash
# spill serve and llama-server side by side on spill-tiny, on this CPU, with the same prompts
# (same seed, same tokenizer), then `spill bench --compare`. Writes next to this script.
#   docs/perf/2026-12-01-bench-cpu-spill-tiny/run.sh [build/spill] [llama-server] [spill-tiny GGUF]
set -euo pipefail
SPILL="${1:-build/spill}"
LLAMA_SERVER="${2:-/work/llama-cpu-build/bin/llama-server}"
GGUF="${3:-/work/gguf/spill-tiny-bf16.gguf}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
THREADS=2
BENCH=(--scenario tiny --repeats 3 --tokenizer "$ROOT/models/spill-tiny" --max-model-len 2048 --seed 1 --no-progress)

wait_healthy() {
  for _ in $(seq 1 600); do
    if curl -sf "$1/health" > /dev/null; then return 0; fi
    sleep 0.5
  done
  echo "server at $1 did not become healthy" >&2
  return 1
}

# spill: one engine, up to 64 sequences batched; the bundled model in BF16 safetensors.
"$SPILL" serve --port 18500 --threads "$THREADS" > /dev/null 2> "$HERE/spill-serve.log" &
SPILL_PID=$!
trap 'kill $SPILL_PID 2> /dev/null || true' EXIT
wait_healthy http://127.0.0.1:18500
"$SPILL" bench http://127.0.0.1:18500 "${BENCH[@]}" --label "spill serve (BF16 safetensors)" --out "$HERE/spill" > /dev/null
kill $SPILL_PID
wait $SPILL_PID 2> /dev/null || true

# llama-server: 4 slots of 2048 tokens (the tiny scenarios run at most 4 streams), the model's own
# chat template (--jinja), prompt caching on (its default), metrics on.
"$LLAMA_SERVER" -m "$GGUF" --port 18501 -t "$THREADS" -c 8192 -np 4 --jinja --metrics > /dev/null 2> "$HERE/llama-server.log" &
LLAMA_PID=$!
trap 'kill $LLAMA_PID 2> /dev/null || true' EXIT
wait_healthy http://127.0.0.1:18501
"$SPILL" bench http://127.0.0.1:18501 "${BENCH[@]}" --label "llama-server (BF16 GGUF)" --out "$HERE/llama-server" > /dev/null
kill $LLAMA_PID
wait $LLAMA_PID 2> /dev/null || true

"$SPILL" bench --compare "$HERE/spill" "$HERE/llama-server" --out "$HERE" > /dev/null
echo "wrote $HERE/compare.md and compare.html"
