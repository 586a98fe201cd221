#!/usr/bin/env bash
# One call on the GPU machine (torch, transformers, tokenizers, jinja2 installed; no internet):
# makes every reference fixture, trains spill-tiny, and packs the results into $OUT.
# Each step runs even if an earlier one failed; the summary at the end says which failed.
#   usage (from the repo root): tools/gpu/make_fixtures_and_train.sh [train-seconds]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/spill-out}"
mkdir -p "$OUT"
TRAIN_SECONDS="${1:-240}"
declare -A status
step() {
  local name="$1"; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > >(tee "$OUT/$name.log") 2>&1
  local rc=$?
  status[$name]="rc=$rc $((SECONDS - t0))s"
}
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "cuda", torch.cuda.is_available())'
step parity python3 tools/fixtures/make_parity_fixtures.py --out tests/data/parity
step tokenizer python3 tools/fixtures/make_tokenizer_fixtures.py --out tests/data/tokenizer
step chat_templates python3 tools/fixtures/make_chat_template_fixtures.py
step train python3 tools/train/train_spill_tiny.py --out models/spill-tiny --fixture-out tests/data/spill-tiny --train-seconds "$TRAIN_SECONDS"
# Files come back at most 16 MiB each: pack, then split.
tar czf /tmp/results.tgz tests/data/parity tests/data/tokenizer tests/data/chat_templates tests/data/spill-tiny models/spill-tiny 2>/dev/null
split -b 15m -d /tmp/results.tgz "$OUT/results.tgz.part"
ls -la "$OUT"
echo "=== summary"
for k in parity tokenizer chat_templates train; do echo "$k: ${status[$k]:-not run}"; done
